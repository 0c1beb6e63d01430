//! The twelfth hostile pass's kube lows seen from the binary (issue 42,
//! docs/safety-hostile-pass-12.md): kube-rs's watcher warned `WARN kube_runtime::watcher:
//! watcher watchevent error 403` at each watch ERROR event, past the eleventh pass's filter
//! (which muted `kube_client` only), under the discovery's own warning that says each kind once.
#![cfg(feature = "kube")]

use std::io::BufReader;
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use headroom_hostile_server::{
    answer_json, chunk, kubeconfig, read_request, serve, start_chunked, EMPTY_POD_LIST,
};

const BIN: &str = env!("CARGO_BIN_EXE_headroom");

/// Lists no pods; answers every watch with one ERROR event of Status 403, then ends it.
fn answer(conn: TcpStream, _: &AtomicBool, _: &()) {
    let mut r = BufReader::new(conn.try_clone().unwrap());
    let mut w = conn;
    for _ in 0..64 {
        let Some(req) = read_request(&mut r) else {
            return;
        };
        let sent = if req.line.contains("watch=true") || req.line.contains("watch=1") {
            let event = r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure","message":"forbidden here","reason":"Forbidden","code":403}}"#;
            start_chunked(&mut w)
                .and_then(|_| chunk(&mut w, &format!("{event}\n")))
                .and_then(|_| std::io::Write::write_all(&mut w, b"0\r\n\r\n"))
        } else {
            answer_json(&mut w, "200 OK", EMPTY_POD_LIST)
        };
        if sent.is_err() {
            return;
        }
    }
}

#[test]
fn kube_runtime_warnings_are_muted_unless_named() {
    let server = serve(64, (), answer);
    let dir = tempfile::tempdir().unwrap();
    let kc = kubeconfig(dir.path(), server.port);
    let mut child = Command::new(BIN)
        .args([
            "kube-discover",
            "--node",
            "node-l2",
            "--for-s",
            "3",
            "--kubeconfig",
        ])
        .arg(&kc)
        .env_remove("HEADROOM_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // a hang detector only
    let end = Instant::now() + Duration::from_secs(60);
    while Instant::now() < end && child.try_wait().unwrap().is_none() {
        std::thread::sleep(Duration::from_millis(50));
    }
    if child.try_wait().unwrap().is_none() {
        let _ = child.kill();
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Ours says the 403 (once per kind).
    assert!(stderr.contains("forbidden here"), "{stderr}");
    // The code before: `WARN kube_runtime::watcher: watcher watchevent error 403` at each one.
    assert!(!stderr.contains("kube_runtime"), "{stderr}");
}
