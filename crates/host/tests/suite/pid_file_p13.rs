//! Thirteenth hostile pass (issue 42): the LC's pid file is its user's to replace; a FIFO or a
//! device there must not block or grow the agent.

use std::os::unix::fs::symlink;
use std::sync::mpsc;
use std::time::Duration;

/// A FIFO at the pid file's path blocked `from_pid_file` in open(2) for good (no writer): the
/// agent's loop, which reads it to follow an LC restart, hung with `ctl` and SIGTERM unanswered
/// (live, 04:06). A link to `/dev/zero` was read without end. Both are no pid now; a pid file
/// naming a live process still gives it.
#[test]
fn a_fifo_or_a_device_at_the_pid_file_is_no_pid_and_never_blocks() {
    let root = tempfile::Builder::new()
        .prefix("host-p13-pidfile")
        .tempdir()
        .unwrap();
    let me = std::process::id();
    std::fs::create_dir_all(root.path().join(format!("proc/{me}"))).unwrap();
    std::fs::write(root.path().join("good.pid"), format!("{me}\n")).unwrap();
    let fifo = root.path().join("fifo.pid");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
    symlink("/dev/zero", root.path().join("zero.pid")).unwrap();

    let dir = root.path().to_path_buf();
    let (tx, rx) = mpsc::channel();
    // In a thread: on the code before, the FIFO's open never returns (the bound below is only
    // a hang detector; the thread is then left blocked).
    std::thread::spawn(move || {
        let got: Vec<Option<u32>> = ["good.pid", "fifo.pid", "zero.pid"]
            .iter()
            .map(|f| headroom_host::pids::from_pid_file(&dir, f))
            .collect();
        let _ = tx.send(got);
    });
    let got = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("from_pid_file blocked on a FIFO (or read /dev/zero without end)");
    assert_eq!(got, vec![Some(me), None, None]);
}
