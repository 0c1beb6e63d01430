//! Hostile pass 28, the targets re-tried through the binary (issue 42): the reserved slot for
//! `off` waited on each client past the 16 slots in turn (up to 500 ms each), so a queue of
//! slow local clients (256 through the binary) held `ctl off` past ctl's 15 s deadline ("no
//! answer"), and the off then landed later, unsaid. Needs root (cgroups); prints SKIP
//! otherwise.

use crate::live;

use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::time::Duration;

use headroom_agent::publish::control::{request, Request};
use headroom_agent::runtime::Agent;

const OFF: &str = "off_is_answered_past_a_queue_of_slow_ctl_clients";

#[test]
fn off_is_answered_past_a_queue_of_slow_ctl_clients() {
    if !live::is_root() {
        return eprintln!("SKIP {OFF}: needs root (cgroups)");
    }
    let dir = tempfile::tempdir().unwrap();
    let lc = live::Children::sleepers(1);
    let top = format!("t28off{}", std::process::id());
    let sock = dir.path().join("ctl.sock");
    let text = live::agent_config(
        &format!("{top}/lc"),
        &format!("{top}/be"),
        &format!("pids = [{}]", lc.pid(0)),
        &dir.path().join("state.json"),
        &sock,
    );
    let agent = match Agent::start(live::options(&text, Duration::from_secs(20))) {
        Ok(a) => a,
        Err(e) => return eprintln!("SKIP {OFF}: the agent does not start here: {e}"),
    };
    let runner = std::thread::spawn(move || agent.run());
    assert!(
        live::eventually(Duration::from_secs(5), || request(&sock, &Request::Status)
            .is_ok()),
        "the agent answers"
    );
    // 300 local clients that connect and send nothing: 16 take the slots, the rest queue for
    // the reserved one (each connect on its own thread: a full backlog blocks it).
    let (held_tx, held) = mpsc::channel::<UnixStream>();
    let connectors: Vec<_> = (0..300)
        .map(|_| {
            let (sock, tx) = (sock.clone(), held_tx.clone());
            std::thread::spawn(move || {
                if let Ok(s) = UnixStream::connect(&sock) {
                    let _ = tx.send(s);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let answer = request(&sock, &Request::Off);
    // The clients gone and the agent ended (its restore run) before any assert.
    drop(held);
    for c in connectors {
        let _ = c.join();
    }
    let _ = runner.join();
    let answer = match answer {
        Ok(r) => r,
        Err(e) => panic!("`off` was not answered past the slow clients: {e}"),
    };
    assert!(answer.ok, "`off` refused: {}", answer.message);
    assert!(answer.message.contains("off"), "{}", answer.message);
}
