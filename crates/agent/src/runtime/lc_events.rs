//! The discovery's LC sets on their way to one reader (the agent, or `headroom kube-discover`):
//! a cell holding the newest unread event, not a queue. Each event carries the whole set, so a
//! reader that stopped reading (`kube-discover` piped into a stalled reader) grew an unbounded
//! channel by a set at each pod event; now an unread event is replaced by the next, whose
//! changes are recomputed from the set the reader last took (nothing it needs is lost: the
//! newest set always arrives, with what changed since the reader last looked).

use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use headroom_types::discovery::{lc_changes, LcSet, LcSetEvent};

#[derive(Default)]
struct Slot {
    /// The newest event not yet taken.
    unread: Option<LcSetEvent>,
    /// The set of the last event taken (what the reader knows).
    taken: LcSet,
    /// The sending side is gone (the discovery stopped).
    closed: bool,
    /// The reading side is gone.
    dropped: bool,
}

struct Shared {
    slot: Mutex<Slot>,
    ready: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The discovery's end: [`LcEventSender::send`] never blocks and holds one event at most.
pub struct LcEventSender(Arc<Shared>);

/// The reader's end (shared so [`super::AgentOptions`] stays `Clone`; one reader reads it).
#[derive(Clone)]
pub struct LcEvents(Arc<Shared>);

/// The reader is gone: nothing sent is read any more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the LC set's reader is gone")]
pub struct ReaderGone;

impl LcEvents {
    /// A cell: its sending end (for the discovery) and its reading end.
    pub fn channel() -> (LcEventSender, LcEvents) {
        let shared = Arc::new(Shared {
            slot: Mutex::default(),
            ready: Condvar::new(),
        });
        (LcEventSender(shared.clone()), LcEvents(shared))
    }

    /// The newest event waiting, if any.
    pub fn latest(&self) -> Option<LcSetEvent> {
        let mut slot = self.0.lock();
        take(&mut slot)
    }

    /// The newest event, waiting for one up to `within`; `Disconnected` once the sender is gone
    /// and nothing is left unread.
    pub fn recv_timeout(&self, within: Duration) -> Result<LcSetEvent, RecvTimeoutError> {
        let end = Instant::now() + within;
        let mut slot = self.0.lock();
        loop {
            if let Some(ev) = take(&mut slot) {
                return Ok(ev);
            }
            if slot.closed {
                return Err(RecvTimeoutError::Disconnected);
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(RecvTimeoutError::Timeout);
            }
            slot = self
                .0
                .ready
                .wait_timeout(slot, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

fn take(slot: &mut Slot) -> Option<LcSetEvent> {
    let ev = slot.unread.take()?;
    slot.taken = ev.set.clone();
    Some(ev)
}

impl LcEventSender {
    /// Leaves `ev` for the reader, in place of an event it has not taken (whose changes `ev`'s
    /// now include: they are counted from the set the reader last took).
    pub fn send(&self, mut ev: LcSetEvent) -> Result<(), ReaderGone> {
        let mut slot = self.0.lock();
        if slot.dropped {
            return Err(ReaderGone);
        }
        if slot.unread.is_some() {
            ev.changes = lc_changes(&slot.taken, &ev.set);
        }
        slot.unread = Some(ev);
        drop(slot);
        self.0.ready.notify_all();
        Ok(())
    }
}

impl Drop for LcEventSender {
    fn drop(&mut self) {
        self.0.lock().closed = true;
        self.0.ready.notify_all();
    }
}

impl Drop for LcEvents {
    fn drop(&mut self) {
        // The last reader handle: the sender's sends are refused from now on.
        if Arc::strong_count(&self.0) <= 2 {
            self.0.lock().dropped = true;
        }
    }
}

impl std::fmt::Debug for LcEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LcEvents")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_types::discovery::{DiscoveredLc, LcChange, PodQos};
    use headroom_types::GroupPath;

    fn lc(name: &str) -> DiscoveredLc {
        DiscoveredLc {
            name: name.into(),
            uid: format!("uid-{name}"),
            qos: PodQos::Burstable,
            cgroup: GroupPath::new(&format!("kubepods/pod{name}")).unwrap(),
            target_us: 500.0,
            percentile: 99.0,
            latency_port: None,
            priority: 0,
            container_ports: Vec::new(),
        }
    }

    fn event(version: u64, names: &[&str], changes: Vec<LcChange>) -> LcSetEvent {
        LcSetEvent {
            t_unix_ms: version,
            changes,
            set: LcSet {
                version,
                node: "n".into(),
                lcs: names.iter().map(|n| lc(n)).collect(),
                synced: true,
                ..LcSet::default()
            },
        }
    }

    /// A reader that stops reading holds one event, however many are sent (the unbounded
    /// channel before held them all); the newest set arrives, with its changes counted from
    /// what the reader last took.
    #[test]
    fn an_unread_event_is_replaced_by_the_newest_with_the_changes_since_the_last_taken() {
        let (tx, rx) = LcEvents::channel();
        tx.send(event(1, &["a"], vec![LcChange::Added { lc: lc("a") }]))
            .unwrap();
        let first = rx.latest().expect("the first event");
        assert_eq!(first.set.version, 1);
        // 10 000 events unread: "b" added then removed over and over, "c" added at the end.
        for v in 2..10_002u64 {
            let names: &[&str] = if v % 2 == 0 { &["a", "b"] } else { &["a"] };
            tx.send(event(v, names, Vec::new())).unwrap();
        }
        tx.send(event(10_002, &["a", "c"], Vec::new())).unwrap();
        let strong = Arc::strong_count(&rx.0);
        assert_eq!(strong, 2, "one cell, no queue");
        let last = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("the newest set");
        assert_eq!(last.set.version, 10_002);
        assert_eq!(last.changes, vec![LcChange::Added { lc: lc("c") }]);
        // Nothing else waits: the 10 000 replaced events are gone.
        assert!(rx.latest().is_none());
        assert_eq!(
            rx.recv_timeout(Duration::from_millis(10)),
            Err(RecvTimeoutError::Timeout)
        );
        // An event read at once keeps the changes the discovery gave it.
        let given = vec![LcChange::Removed { name: "a".into() }];
        tx.send(event(10_003, &["c"], given.clone())).unwrap();
        assert_eq!(rx.latest().unwrap().changes, given);
        drop(tx);
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(5)),
            Err(RecvTimeoutError::Disconnected)
        );
    }

    #[test]
    fn a_send_after_the_reader_is_gone_is_refused() {
        let (tx, rx) = LcEvents::channel();
        let copy = rx.clone();
        drop(rx);
        tx.send(event(1, &["a"], Vec::new())).unwrap();
        assert!(copy.latest().is_some());
        drop(copy);
        assert_eq!(tx.send(event(2, &["a"], Vec::new())), Err(ReaderGone));
    }
}
