//! The open-loop engine: one thread per core, each with its own event loop over its own
//! connections (io_uring, [`uring`], where the kernel allows it; epoll, [`epoll`], otherwise:
//! the choice is [`EngineKind`], probed by [`choose_engine`]). Each connection draws its send times ahead (absolute, from the inter-arrival
//! distribution at its share of the rate); a request due while the connection is at its depth cap
//! waits, is counted late and keeps its scheduled time, so its latency includes the wait
//! (coordinated-omission corrected). Threads share nothing mutable; they hand back their
//! histograms at the end and one interval histogram per second (off the hot path).
//!
//! **Whose time is whose.** A request is timed from the kernel's transmit stamp of its bytes
//! ([`tx_stamp`]) to the kernel's receive stamp of its reply: the service's
//! latency, whatever the client's thread was doing around them. The wait before the send is split:
//! from the scheduled time to when the server let it go (its connection and every other one it
//! may take at the depth cap, or closed: the time the reply or reconnect that made room came,
//! less the client's lateness in sending that reply's request) is the server's, and is added
//! back (the coordinated-omission correction); from when it could go to the transmit stamp is
//! the thread's own lateness (a late wake-up, a busy CPU), the send lag, measured and bounded by
//! a self-check but never charged to the server.

mod choice;
mod conn;
mod epoll;
mod issue;
mod plan;
pub mod poll_budget;
mod pool;
mod replies;
mod tx_stamp;
mod uring;

pub use tx_stamp::SIMULATE_ENV as TX_STAMP_SIMULATE_ENV;

/// Test hook: µs the thread sleeps between making a send and handing it to the kernel (a late
/// client, on demand: the tests' ground truth for what the transmit stamp leaves out).
pub const SEND_DELAY_SIMULATE_ENV: &str = "HEADROOM_LOAD_SIMULATE_SEND_DELAY_US";

fn simulated_send_delay() -> Option<Duration> {
    static DELAY: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    *DELAY.get_or_init(|| {
        std::env::var(SEND_DELAY_SIMULATE_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|us| *us > 0)
            .map(Duration::from_micros)
    })
}

pub use choice::{choose_engine, EngineChoice, EngineKind, EngineSelection};
pub use plan::{ConnPlan, IntervalMsg, SavedSample, WorkerOut, WorkerPlan, WorkerShared};

use conn::{Conn, Inflight, Room};

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::Duration;

use mio::net::TcpStream;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::clock::{now_ns, tighten_timer_slack, WakeLead};
use crate::error::LoadError;
use crate::protocol::{Op, MAX_VALUE_LEN};
use crate::results::MAX_IA_SAMPLES;
use crate::stats::LatencyHist;
use headroom_host::sched::pin_this_thread;

/// Length of one progress interval.
pub const INTERVAL_NS: u64 = 1_000_000_000;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// `-S`: skip when this far behind, down to [`SKIP_TO_NS`] behind (mutilate: 5 ms, 4 ms).
const SKIP_BEHIND_NS: u64 = 5_000_000;
const SKIP_TO_NS: u64 = 4_000_000;
/// `--moderate`: least gap between a reply and the next send on a connection (mutilate: 0.25 ms).
const MODERATE_NS: u64 = 250_000;

struct Worker<'a> {
    id: usize,
    shared: &'a WorkerShared,
    io: Io,
    conns: Vec<Conn>,
    rng: SmallRng,
    out: WorkerOut,
    key: Vec<u8>,
    interval: LatencyHist,
    interval_actual_send: LatencyHist,
    interval_send_lag: LatencyHist,
    /// CLOCK_REALTIME − CLOCK_MONOTONIC (ns), to map kernel stamps onto our clock.
    realtime_offset_ns: i64,
    interval_completed: u64,
    interval_index: u64,
    interval_tx: mpsc::Sender<IntervalMsg>,
    ia_seen: u64,
    lead: WakeLead,
    /// Under SCHED_FIFO/RR: polling stops while the thread nears the kernel's real-time budget.
    poll_budget: poll_budget::PollBudget,
    /// The earliest due time the last [`Worker::step`] found: handling a batch of replies
    /// yields to a send that falls due (io_uring), so the send does not wait behind the batch.
    due_at: u64,
    /// Connections with a schedule (the plan's, at the front of `conns`; grown ones follow).
    scheduled: usize,
    /// `-c auto`: the load connections a send may take when its own is at the depth cap.
    pool: pool::ConnPool,
    /// `-c auto`: no connection is opened before this (a connect that timed out pauses growth).
    grow_paused_until: u64,
}

/// The worker's event loop and what it owns.
enum Io {
    Epoll(epoll::EpollIo),
    Uring(Box<uring::UringIo>),
}

/// Opens a blocking connection with a timeout and makes it non-blocking (TCP_NODELAY as asked).
/// Whether a failed read or send is the server hanging up: a reset (RST: a server that crashed,
/// or closed with requests unread) is the server closing the connection as much as an EOF. Only
/// the EOF was counted until hostile pass 31, and a resetting server was blamed on the
/// connections.
fn server_hung_up(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset};
    matches!(e.kind(), ConnectionReset | ConnectionAborted | BrokenPipe)
}

pub fn connect(addr: SocketAddr, nodelay: bool) -> Result<TcpStream, LoadError> {
    connect_within(addr, nodelay, CONNECT_TIMEOUT)
}

/// [`connect`] with its own timeout.
fn connect_within(
    addr: SocketAddr,
    nodelay: bool,
    timeout: Duration,
) -> Result<TcpStream, LoadError> {
    let std_stream = std::net::TcpStream::connect_timeout(&addr, timeout).map_err(|source| {
        LoadError::Connect {
            addr: addr.to_string(),
            source,
        }
    })?;
    let _ = std_stream.set_nodelay(nodelay);
    std_stream
        .set_nonblocking(true)
        .map_err(|e| LoadError::system(format!("making the socket to {addr} non-blocking"), e))?;
    Ok(TcpStream::from_std(std_stream))
}

/// Runs one worker to the end of the drain. `id` tags its interval messages.
pub fn run_worker(
    id: usize,
    plan: WorkerPlan,
    shared: &WorkerShared,
    interval_tx: mpsc::Sender<IntervalMsg>,
) -> Result<WorkerOut, LoadError> {
    tighten_timer_slack();
    let sched = crate::sched::settle(shared.fifo);
    if let Some(cpu) = plan.cpu {
        if let Err(e) = pin_this_thread(cpu) {
            tracing::warn!("pinning load thread {id} to CPU {cpu}: {e}");
        }
    }
    // The busy-poll window starts from this thread's measured wake-up error (on its CPU, in its
    // class) and follows it during the run.
    let lead = WakeLead::calibrated();
    let poll_budget = poll_budget::PollBudget::for_current_thread();
    let io = match shared.engine {
        EngineKind::Epoll => Io::Epoll(epoll::EpollIo::new()?),
        EngineKind::IoUring => {
            // Room in the queues for every connection the run may grow to, not only the first.
            let mut servers: Vec<SocketAddr> = plan.conns.iter().map(|c| c.addr).collect();
            servers.sort();
            servers.dedup();
            let most = plan.conns.len()
                + if shared.grow {
                    shared.grow_cap.saturating_mul(servers.len())
                } else {
                    0
                };
            Io::Uring(Box::new(uring::UringIo::new(most)?))
        }
    };
    let mut rng = SmallRng::seed_from_u64(plan.seed);
    let mut conns = Vec::with_capacity(plan.conns.len());
    for cp in plan.conns {
        let stream = connect(cp.addr, shared.nodelay)?;
        // A random first gap spreads connections over the first interval instead of a burst.
        let first = match &cp.ia {
            Some(ia) => shared.t0 + secs_to_ns(ia.sample(&mut rng)),
            None => shared.t0,
        };
        conns.push(Conn::new(cp, stream, first, false));
    }
    let mut w = Worker {
        id,
        shared,
        io,
        conns,
        rng,
        out: WorkerOut {
            sched,
            ..WorkerOut::default()
        },
        key: Vec::with_capacity(256),
        interval: LatencyHist::new(),
        interval_actual_send: LatencyHist::new(),
        interval_send_lag: LatencyHist::new(),
        realtime_offset_ns: headroom_host::net::timestamps::realtime_offset_ns(),
        interval_completed: 0,
        interval_index: 0,
        interval_tx,
        ia_seen: 0,
        lead,
        poll_budget,
        due_at: u64::MAX,
        scheduled: 0,
        pool: pool::ConnPool::default(),
        grow_paused_until: 0,
    };
    w.scheduled = w.conns.len();
    if shared.grow {
        w.open_pool()?;
    }
    for i in 0..w.conns.len() {
        w.attach(i).map_err(|e| {
            LoadError::system(
                format!("watching the socket to {}", w.conns[i].plan.addr),
                e,
            )
        })?;
    }
    match w.io {
        Io::Epoll(_) => w.epoll_loop()?,
        Io::Uring(_) => w.uring_loop()?,
    }
    w.finish();
    w.out.stamps_refused = w.conns.iter().find_map(|c| c.stamps_refused.clone());
    if w.poll_budget.stopped_ticks > 0 {
        w.out.sched.reason = format!(
            "{}; no early wake-up to poll for the send time in {} of its 10 ms ticks (its CPU share neared the kernel's real-time budget, which throttles the thread for the rest of the period)",
            w.out.sched.reason, w.poll_budget.stopped_ticks
        );
    }
    Ok(w.out)
}

/// How an event loop waits for the next thing due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wait {
    /// Poll (no sleep) until it is due.
    Poll,
    /// Sleep until this time, then poll the rest.
    SleepUntil(u64),
}

/// The wait from `now` to `wake`: polled for the last `lead` (the timer wakes that late), and
/// polled outright when it is shorter than what a sleep and wake-up cost in CPU (`sleep_cpu`):
/// such a sleep would cost more than the wait, and it would wake late besides. Every send still
/// goes out at or after its scheduled time; only the waiting changes.
fn wait_for(now: u64, wake: u64, lead: u64, sleep_cpu: u64) -> Wait {
    let left = wake.saturating_sub(now);
    if left <= lead.max(sleep_cpu) {
        Wait::Poll
    } else {
        Wait::SleepUntil(wake - lead)
    }
}

#[inline]
fn secs_to_ns(s: f64) -> u64 {
    if s.is_finite() && s > 0.0 {
        (s * 1e9) as u64
    } else {
        0
    }
}

impl Worker<'_> {
    /// Watches connection `i`'s (new) socket.
    fn attach(&mut self, i: usize) -> std::io::Result<()> {
        match self.io {
            Io::Epoll(_) => self.epoll_attach(i),
            Io::Uring(_) => self.uring_attach(i),
        }
    }

    /// Sends what is buffered for connection `i` (at once with epoll; queued for the next
    /// submission with io_uring).
    fn flush(&mut self, i: usize, now: u64) {
        if let Some(d) = simulated_send_delay() {
            std::thread::sleep(d);
        }
        match self.io {
            Io::Epoll(_) => self.epoll_write(i, now),
            Io::Uring(_) => self.uring_queue_send(i),
        }
    }

    /// What every loop does before it waits: intervals, reconnects, due sends. None when the run
    /// is over, else the earliest time something falls due.
    fn step(&mut self, now: u64) -> Option<u64> {
        self.flush_interval_if_due(now);
        self.reconnect_due(now);
        // Grown connections have no schedule: nothing of theirs falls due.
        for i in 0..self.scheduled {
            self.pump(i, now);
        }
        let sending = self.conns.iter().any(|c| !c.done_sending);
        let waiting = self.conns.iter().any(|c| !c.inflight.is_empty());
        if (!sending && !waiting) || now >= self.shared.drain_end {
            return None;
        }
        Some(self.next_wake(now))
    }

    /// How long before a due time the loop stops sleeping and busy-polls: the timer's measured
    /// lateness (unless `--sleep-only`), at least `spin_us`.
    fn lead_ns(&self) -> u64 {
        if self.shared.adaptive_lead {
            self.shared.spin_ns.max(self.lead.ns())
        } else {
            self.shared.spin_ns
        }
    }

    /// How the loop waits from `now` for what is due at `wake` (see [`wait_for`]); without the
    /// early wake-up while a real-time thread is over its CPU budget ([`poll_budget`]).
    fn wait_plan(&mut self, now: u64, wake: u64) -> Wait {
        self.poll_budget.tick(now);
        if self.poll_budget.allowed() {
            wait_for(now, wake, self.lead_ns(), self.lead.sleep_cpu_ns())
        } else {
            // no lead: the timer's lateness is taken as send lag; a wait shorter than a sleep's
            // own CPU is still polled (sleeping it would cost the budget more)
            wait_for(now, wake, 0, self.lead.sleep_cpu_ns())
        }
    }

    /// After the loop: requests due but never sent, and replies that never came.
    fn finish(&mut self) {
        // Requests still due but never sent (a backlog at the end) were scheduled all the same.
        // `next_sched` is the first unsent: a backlog's connection is `done_sending` too (it
        // stopped at the end, not after its last request), and was skipped until hostile
        // pass 32, so a warmup backlog that outlasted the run scheduled nothing.
        for i in 0..self.conns.len() {
            let c = &mut self.conns[i];
            if let Some(ia) = &c.plan.ia {
                let mut t = c.next_sched;
                while t < self.shared.end {
                    if t >= self.shared.warm_end {
                        self.out.counters.scheduled += 1;
                    }
                    t += secs_to_ns(ia.sample(&mut self.rng)).max(1);
                }
            }
        }
        // Whatever is still outstanding after the drain is lost.
        let now = now_ns();
        for i in 0..self.conns.len() {
            let lost = self.conns[i]
                .inflight
                .iter()
                .filter(|r| r.sched >= self.shared.warm_end)
                .count() as u64;
            self.out.counters.errors += lost;
            self.out.counters.stalled += lost;
        }
        self.flush_interval(now, true);
    }

    /// Earliest time something is due: a send, a reconnect, an interval boundary, the end.
    fn next_wake(&self, now: u64) -> u64 {
        let mut wake = self.shared.drain_end;
        let boundary = self.shared.t0 + (self.interval_index + 1) * INTERVAL_NS;
        wake = wake.min(boundary);
        for c in &self.conns[..self.scheduled] {
            if c.stream.is_none() {
                wake = wake.min(c.reconnect_at);
                continue;
            }
            if c.done_sending || c.plan.ia.is_none() {
                continue;
            }
            // At the depth cap a send waits for a reply, unless `-c auto` can send it on another
            // connection (once it found them all full too, it waits for a reply as well).
            let pooled = self.shared.grow && !c.plan.measure && !c.late_marked;
            if c.inflight.len() >= c.plan.depth && !pooled {
                continue;
            }
            let due = if self.shared.moderate {
                c.next_sched.max(c.last_rx + MODERATE_NS)
            } else {
                c.next_sched
            };
            wake = wake.min(due);
        }
        wake.max(now)
    }

    fn flush_interval_if_due(&mut self, now: u64) {
        if now >= self.shared.t0 + (self.interval_index + 1) * INTERVAL_NS {
            self.flush_interval(now, false);
        }
    }

    fn flush_interval(&mut self, now: u64, last: bool) {
        // Kernel stamps are on the realtime clock: follow its slewing once a second.
        self.realtime_offset_ns = headroom_host::net::timestamps::realtime_offset_ns();
        if last && self.interval_completed == 0 && self.interval.count() == 0 {
            return;
        }
        let hist = std::mem::take(&mut self.interval);
        let actual_send = std::mem::take(&mut self.interval_actual_send);
        let send_lag = std::mem::take(&mut self.interval_send_lag);
        let msg = IntervalMsg {
            worker: self.id,
            index: self.interval_index,
            hist,
            actual_send,
            send_lag,
            completed: self.interval_completed,
        };
        // The receiver may be gone (a caller that stopped listening); results still count.
        let _ = self.interval_tx.send(msg);
        self.interval_completed = 0;
        if !last {
            self.interval_index = now.saturating_sub(self.shared.t0) / INTERVAL_NS;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{wait_for, Wait};

    #[test]
    fn a_wait_shorter_than_a_sleep_costs_is_polled() {
        // Sleeping costs 20 µs of CPU: a 15 µs wait is polled, a 50 µs one slept, with or
        // without a lead.
        assert_eq!(wait_for(1_000, 16_000, 0, 20_000), Wait::Poll);
        assert_eq!(wait_for(1_000, 21_000, 0, 20_000), Wait::Poll);
        assert_eq!(wait_for(1_000, 51_000, 0, 20_000), Wait::SleepUntil(51_000));
        assert_eq!(
            wait_for(1_000, 51_000, 10_000, 20_000),
            Wait::SleepUntil(41_000)
        );
    }

    #[test]
    fn the_lead_is_polled_and_a_free_sleep_is_taken() {
        // The lead (timer lateness) is polled whatever a sleep costs.
        assert_eq!(wait_for(0, 40_000, 40_000, 0), Wait::Poll);
        assert_eq!(wait_for(0, 40_001, 40_000, 0), Wait::SleepUntil(1));
        // Nothing measured (sleep cost 0, no lead): sleep to the due time itself.
        assert_eq!(wait_for(5, 6, 0, 0), Wait::SleepUntil(6));
        // Already due: poll (the loop sends at once).
        assert_eq!(wait_for(10, 10, 0, 0), Wait::Poll);
        assert_eq!(wait_for(10, 3, 0, 20_000), Wait::Poll);
    }
}
