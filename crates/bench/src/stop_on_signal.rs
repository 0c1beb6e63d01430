//! A bench or the demo stopped from outside — SIGTERM (a `timeout`), SIGINT (Ctrl-C sent to it
//! alone, or `kill -INT`), SIGHUP (a closed terminal) — skips every drop: its children (the LC,
//! the BE work, load generators, agents) ran on as orphans, an agent confining BE with nobody
//! left to stop it (seen 2026-11-29 with `bench advertise`: memcached, the spinner, the agent and
//! the load generator all kept running). One watcher per process takes those signals, stops
//! every process this one started (SIGTERM first, so an agent restores what it changed; SIGKILL
//! for whatever is left after the grace), then runs the clean-ups the tools registered with
//! [`on_stop`] (the groups they made) and exits with 128 + the signal. A SIGKILL cannot be
//! caught: what it leaves, the next run of the tool removes where it can.

use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use headroom_host::process::{exists, send_signal, Signal};

/// Set when a signal was taken: the process is being stopped by the watcher, which exits it.
static STOPPING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the watcher is stopping the process. The main thread must then not end the process
/// itself (its children failing under the SIGTERM look like errors): it waits for the watcher's
/// exit ([`wait_if_stopping`]).
pub fn stopping() -> bool {
    STOPPING.load(std::sync::atomic::Ordering::SeqCst)
}

/// Blocks for good while the watcher stops the process (it exits with 128 + the signal).
pub fn wait_if_stopping() {
    while stopping() {
        std::thread::park();
    }
}

/// How long the children get to stop on SIGTERM (an agent restores every group it changed).
const GRACE: Duration = Duration::from_secs(20);

type Hook = Box<dyn FnOnce() + Send>;

/// The registered clean-ups, by id (a tool cancels its own when it cleans up by itself).
static HOOKS: Mutex<Vec<(u64, Hook)>> = Mutex::new(Vec::new());
static NEXT_ID: Mutex<u64> = Mutex::new(0);

fn hooks() -> std::sync::MutexGuard<'static, Vec<(u64, Hook)>> {
    HOOKS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Starts the watcher (once per process; later calls do nothing).
pub fn install() -> std::io::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    static STARTED: std::sync::Once = std::sync::Once::new();
    let mut result = Ok(());
    STARTED.call_once(|| match signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP]) {
        Ok(mut signals) => {
            std::thread::spawn(move || {
                if let Some(sig) = signals.forever().next() {
                    STOPPING.store(true, std::sync::atomic::Ordering::SeqCst);
                    let stopped = stop_tree(std::process::id(), GRACE);
                    let hooks: Vec<(u64, Hook)> = std::mem::take(&mut *hooks());
                    for (_, hook) in hooks {
                        hook();
                    }
                    eprintln!(
                        "headroom: stopped by signal {sig}; stopped {stopped} process(es) it had started"
                    );
                    std::process::exit(128 + sig);
                }
            });
        }
        Err(e) => result = Err(e),
    });
    result
}

/// A clean-up to run if the process is stopped by a signal; the id cancels it.
pub fn on_stop(hook: impl FnOnce() + Send + 'static) -> u64 {
    let mut next = NEXT_ID.lock().unwrap_or_else(|p| p.into_inner());
    *next += 1;
    let id = *next;
    hooks().push((id, Box::new(hook)));
    id
}

/// Cancels the clean-up `id` (its owner did it, or no longer needs it).
pub fn cancel(id: u64) {
    hooks().retain(|(h, _)| *h != id);
}

/// Every process `root` started, and theirs (not `root`): SIGTERM, up to `grace` for them to
/// exit, then SIGKILL. Returns how many there were.
pub fn stop_tree(root: u32, grace: Duration) -> usize {
    let proc_root = Path::new("/");
    let living = |pids: &[u32]| -> Vec<u32> {
        pids.iter()
            .copied()
            .filter(|&p| exists(p as i32) && !headroom_host::pids::is_zombie(proc_root, p))
            .collect()
    };
    let tree: Vec<u32> = headroom_host::pids::descendants(proc_root, root)
        .into_iter()
        .filter(|&p| p != root)
        .collect();
    for &pid in &tree {
        let _ = send_signal(pid as i32, Signal::SIGTERM);
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline && !living(&tree).is_empty() {
        std::thread::sleep(Duration::from_millis(50));
    }
    for pid in living(&tree) {
        let _ = send_signal(pid as i32, Signal::SIGKILL);
    }
    tree.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_are_stopped_gently_then_for_good_and_hooks_run_once() {
        // A shell (the root, left alone) with two children: a sleep that exits on SIGTERM and
        // one that ignores it (an ignored signal stays ignored across exec). Only this tree is
        // stopped: the test binary's other tests have children of their own.
        let mut root = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & (trap '' TERM; exec sleep 30) & wait"])
            .spawn()
            .expect("sh");
        let pid = root.id();
        let start = Instant::now();
        while headroom_host::pids::descendants(Path::new("/"), pid).len() < 3
            && start.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        let started = Instant::now();
        let n = stop_tree(pid, Duration::from_millis(500));
        assert_eq!(n, 2, "the two sleeps");
        // Both gone: the shell's wait returns and it exits.
        assert!(root.wait().expect("reaped").success());
        // Bounded by the grace, not by the stubborn child's 30 s.
        assert!(started.elapsed() < Duration::from_secs(20));

        let ran = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let r = ran.clone();
        let kept = on_stop(move || {
            r.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        let dropped = on_stop(|| panic!("cancelled hooks do not run"));
        cancel(dropped);
        for (_, hook) in std::mem::take(&mut *hooks()) {
            hook();
        }
        assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 1);
        cancel(kept);
    }
}
