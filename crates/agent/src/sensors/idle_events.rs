//! The sensors as the event loop's idle source: a wait on the BPF tracker's ring, what woke it
//! (a CPU going idle or busy), and the loop's schedule of reads.

use super::idle_wake::{self, Drained, Fall, IdleEventSource, Woken};
use super::{IdleSource, Sensors};

impl IdleEventSource for Sensors {
    fn wait(&mut self, timeout: std::time::Duration) -> Woken {
        let Some(IdleSource::Bpf(s)) = self.idle.as_ref() else {
            std::thread::sleep(timeout);
            return Woken::default();
        };
        let expires = headroom_host::idle_bpf::monotonic_ns() + timeout.as_nanos() as u64;
        let ready = s.tracker().wait_any(Some(timeout));
        self.last_wait_ns = Some((expires, headroom_host::idle_bpf::monotonic_ns()));
        match ready {
            // A timer wake-up on an idle CPU writes its crossing before the loop runs: read it
            // now, while the wait it happened in is known, even when epoll said "timeout".
            Ok(ready) => Woken {
                event: ready.ring || s.tracker().pending(),
                request: ready.watched,
            },
            Err(e) => {
                // epoll failing is not expected; count it and sleep the period rather than spin
                self.count_error("idle_events", &e);
                std::thread::sleep(timeout);
                Woken::default()
            }
        }
    }

    fn drain(&mut self) -> Drained {
        let Some(IdleSource::Bpf(s)) = self.idle.as_mut() else {
            return Drained::default();
        };
        let here = headroom_host::sched::current_cpu();
        let timer = self.last_wait_ns;
        let low = s.tracker().program().thresholds().map(|(low, _)| low);
        let mut d = Drained::default();
        let mut last_count = None;
        // whether the last event read was the agent's own wake-up (the side is then "below"
        // with no fall to answer)
        let mut last_own = false;
        let mut last_low = false;
        s.tracker_mut().program_mut().ring().drain(|e| {
            let fall = Fall {
                ktime_ns: e.ktime_ns,
                cpu: e.cpu as usize,
                idle_count: e.idle_count,
            };
            let low_side = e.direction == headroom_host::idle_bpf::Direction::Low;
            if low_side && low.is_some_and(|l| idle_wake::is_own_wake(fall, here, timer, l)) {
                d.own_wakes += 1;
                last_own = true;
                return;
            }
            last_own = false;
            last_low = low_side;
            d.events += 1;
            d.first_ktime_ns.get_or_insert(e.ktime_ns);
            if low_side {
                d.first_low_ktime_ns.get_or_insert(e.ktime_ns);
            }
            last_count = Some(e.idle_count);
        });
        let p = s.tracker().program();
        self.own_wakes += d.own_wakes as u64;
        if let (true, Some(low)) = (last_own, low) {
            // Back above, so the next real fall is an event; a fall that came meanwhile (no
            // event: the side was below) is answered now.
            let count = p.rearm_above();
            if count < low {
                p.mark_below();
                d.events += 1;
                last_count = Some(count);
            }
        }
        if let (true, Some(low), Some(_)) = (last_low, low, last_count) {
            // A fall that is over already (kernel housekeeping waking every CPU at one tick
            // for tens of µs: ~20 a second on the idle VM) needs no shrink: the count now,
            // with the agent's own CPU still counted busy, is not below `low`.
            let now = p.idle_count();
            if now >= low {
                last_count = Some(now);
            }
        }
        let overruns = p.counters().overruns;
        if overruns != self.idle_overruns {
            self.idle_overruns = overruns;
            d.overrun = true;
            // the full re-read: the count now, and the thresholds' side from it
            last_count = Some(p.idle_count());
            if let Some((low, high)) = p.thresholds() {
                p.set_thresholds(low, high);
            }
        }
        if last_count.is_some() {
            self.idle_event_count = last_count;
        }
        d
    }
}
