//! Thirteenth hostile pass (issue 42): the feed socket serves root and the agent's user only.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use headroom_agent::sensors::feed::{self, FeedCells};
use headroom_agent::sensors::lc_signal::SignalCell;

/// A feed line of 1000 samples of 1 µs at `qps`.
fn line(qps: f64) -> String {
    let mut hist = headroom_load::stats::LatencyHist::new();
    for _ in 0..1000 {
        hist.record_ns(1_000);
    }
    serde_json::json!({
        "version": 1, "t_unix_ms": headroom_load::clock::unix_ms(),
        "interval_s": 1.0, "qps": qps, "hist": hist.to_base64()})
    .to_string()
}

/// Connects to `sock` and writes `text` from a thread whose credentials alone are `uid`'s (the
/// raw setresuid changes the calling thread only; the test's other threads stay root), and keeps
/// the connection until `qps` shows the line's rate (taken) or 5 s have passed (a hang bound).
fn send_as(
    uid: u32,
    sock: &std::path::Path,
    rate: f64,
    qps: Arc<SignalCell>,
) -> std::io::Result<()> {
    let sock = sock.to_path_buf();
    std::thread::spawn(move || {
        // SAFETY: a raw syscall on this thread's own credentials; no memory is involved.
        let rc = unsafe { libc::syscall(libc::SYS_setresuid, uid, uid, uid) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut s = std::os::unix::net::UnixStream::connect(&sock)?;
        // A refused peer finds the connection closed (EPIPE): its line is not taken either.
        let _ = writeln!(s, "{}", line(rate));
        let start = Instant::now();
        while qps.latest().is_none_or(|r| r.value != rate)
            && start.elapsed() < Duration::from_secs(5)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    })
    .join()
    .expect("sender thread")
}

/// The socket is 0600 only from the chmod after bind(2): under a umask that lets others write
/// (`UMask=0000`), another user connecting in between stayed connected and its lines were
/// taken as the LC's latency and load (a low latency grows BE). Here the socket's mode is
/// opened to all after the spawn, as that window is: a stranger's line must not be taken, root's
/// still is.
#[test]
fn a_feed_line_from_another_user_is_not_taken() {
    if headroom_host::process::effective_uid() != 0 {
        eprintln!("SKIP a_feed_line_from_another_user_is_not_taken: needs root (setresuid)");
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("hostile-pass13-feed")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let sock = dir.path().join("feed.sock");
    let stop = Arc::new(AtomicBool::new(false));
    let cells = FeedCells {
        latency: SignalCell::new(),
        qps: SignalCell::new(),
    };
    let handle = feed::spawn(&sock, 99.0, 1.0, 1, cells.clone(), stop.clone()).unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();

    send_as(65534, &sock, 4242.0, cells.qps.clone()).expect("nobody connects (mode 0666)");
    assert_eq!(
        cells.qps.latest().map(|r| r.value),
        None,
        "another user's feed line was taken as the LC's load (and latency)"
    );
    // The feed still serves root.
    send_as(0, &sock, 1111.0, cells.qps.clone()).expect("root connects");
    assert_eq!(
        cells.qps.latest().map(|r| r.value),
        Some(1111.0),
        "root's line is taken"
    );
    stop.store(true, Ordering::SeqCst);
    handle.join().unwrap();
}

/// The decision log in a directory others can write is opened without following links (tenth
/// pass), but a FIFO there was opened and written: another user's FIFO at the log's path took
/// the agent's lines until its pipe (64 KiB) was full, then every write blocked the control
/// loop for good: `ctl status` unanswered, SIGTERM too, BE left as last set with no exit action
/// (live, 04:04, a `blind` agent at 10 ms and a FIFO of uid 65534's). It is refused now.
#[test]
fn a_fifo_at_the_decision_log_in_a_directory_others_can_write_is_refused() {
    use headroom_agent::runtime::DecisionLog;
    let d = tempfile::Builder::new()
        .prefix("hostile-pass13-dlog")
        .tempdir()
        .unwrap();
    let public = d.path().join("pub");
    std::fs::create_dir(&public).unwrap();
    // Others may write it (a directory another user made, or a shared one): no sticky bit.
    std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o777)).unwrap();
    let fifo = public.join("d.log");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0, "mkfifo");
    match DecisionLog::open(&fifo, 1 << 20) {
        Ok(_) => panic!("a FIFO in a directory others can write was opened as the decision log"),
        Err(e) => assert!(
            e.to_string().contains("not a regular file"),
            "refused for another reason: {e}"
        ),
    }
    // A regular file there still opens (the guarded open is no refusal of the directory).
    let mut log = DecisionLog::open(&public.join("ok.log"), 1 << 20).expect("a regular file");
    log.write_line("{\"event\":\"x\"}");
    log.flush();
    assert_eq!(
        std::fs::read_to_string(public.join("ok.log")).unwrap(),
        "{\"event\":\"x\"}\n"
    );
}
