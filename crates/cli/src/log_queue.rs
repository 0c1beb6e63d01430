//! Log lines reach stderr through a bounded queue and a thread of their own, so no thread that
//! logs waits on whoever reads stderr. Hostile pass 38: with the agent's stderr a pipe nobody
//! drained, every thread that logged blocked in `write`; `ctl off` and the freeze on an SLO
//! violation waited 10 s and more, and SIGTERM did not end the agent. A full queue drops the
//! line and counts it; the count is said once the writer gets through again.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Lines held for the writer at most (~a few MiB at typical line lengths).
const QUEUE_LINES: usize = 16_384;

/// The queue's sending side, handed to `tracing_subscriber` as its writer.
#[derive(Clone)]
pub struct QueuedStderr {
    tx: SyncSender<Vec<u8>>,
    dropped: Arc<AtomicU64>,
}

/// What [`flush`] waits on: lines queued and lines written so far.
struct Progress {
    queued: AtomicU64,
    written: AtomicU64,
}

static PROGRESS: OnceLock<Arc<Progress>> = OnceLock::new();
static QUEUE: OnceLock<QueuedStderr> = OnceLock::new();

/// Starts the writer thread; the returned writer queues each log event as one line.
pub fn start() -> QueuedStderr {
    let (tx, rx) = mpsc::sync_channel::<Vec<u8>>(QUEUE_LINES);
    let dropped = Arc::new(AtomicU64::new(0));
    let progress = Arc::new(Progress {
        queued: AtomicU64::new(0),
        written: AtomicU64::new(0),
    });
    let _ = PROGRESS.set(progress.clone());
    let counted = dropped.clone();
    // Without the thread (none could be made) lines wait in the queue, then are dropped.
    let _ = std::thread::Builder::new()
        .name("log-writer".into())
        .spawn(move || write_lines(&rx, &counted, &progress));
    let queue = QueuedStderr { tx, dropped };
    let _ = QUEUE.set(queue.clone());
    queue
}

fn write_lines(rx: &Receiver<Vec<u8>>, dropped: &AtomicU64, progress: &Progress) {
    let mut said = 0;
    while let Ok(line) = rx.recv() {
        let mut stderr = std::io::stderr().lock();
        let now = dropped.load(Ordering::Relaxed);
        if now > said {
            let _ = writeln!(
                stderr,
                "headroom: {} log line(s) dropped: stderr was not read fast enough",
                now - said
            );
            said = now;
        }
        let _ = stderr.write_all(&line);
        progress.written.fetch_add(1, Ordering::Release);
    }
}

/// Queues `text` as a line of its own (the agent's closing summary): written like a log line,
/// never waited on.
pub fn say(text: &str) {
    if let Some(queue) = QUEUE.get() {
        let mut w = LineWriter {
            line: format!("{text}\n").into_bytes(),
            queue: queue.clone(),
        };
        let _ = w.flush();
    } else {
        eprintln!("{text}");
    }
}

/// Waits up to `within` for the queued lines to be written (at exit: the last lines say what
/// the exit did; a stderr nobody reads does not hold the exit longer than that).
pub fn flush(within: Duration) {
    let Some(progress) = PROGRESS.get() else {
        return;
    };
    let target = progress.queued.load(Ordering::Acquire);
    let end = Instant::now() + within;
    while progress.written.load(Ordering::Acquire) < target && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for QueuedStderr {
    type Writer = LineWriter;

    fn make_writer(&'a self) -> LineWriter {
        LineWriter {
            line: Vec::new(),
            queue: self.clone(),
        }
    }
}

/// One event's text, queued whole when the event is written (dropped).
pub struct LineWriter {
    line: Vec<u8>,
    queue: QueuedStderr,
}

impl Write for LineWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.line.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LineWriter {
    fn drop(&mut self) {
        if self.line.is_empty() {
            return;
        }
        match self.queue.tx.try_send(std::mem::take(&mut self.line)) {
            Ok(()) => {
                if let Some(p) = PROGRESS.get() {
                    p.queued.fetch_add(1, Ordering::Release);
                }
            }
            Err(TrySendError::Full(_)) => {
                self.queue.dropped.fetch_add(1, Ordering::Relaxed);
            }
            Err(TrySendError::Disconnected(_)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::fmt::MakeWriter;

    /// A queue nobody drains: a write never blocks, and lines past the bound are counted as
    /// dropped, not waited on.
    #[test]
    fn a_full_queue_drops_and_counts_instead_of_blocking() {
        let (tx, rx) = mpsc::sync_channel::<Vec<u8>>(2);
        let queue = QueuedStderr {
            tx,
            dropped: Arc::new(AtomicU64::new(0)),
        };
        for i in 0..5 {
            let mut w = queue.make_writer();
            writeln!(w, "line {i}").unwrap();
        }
        assert_eq!(queue.dropped.load(Ordering::Relaxed), 3);
        assert_eq!(rx.try_recv().unwrap(), b"line 0\n");
        assert_eq!(rx.try_recv().unwrap(), b"line 1\n");
        assert!(rx.try_recv().is_err());
    }
}
