//! The eleventh hostile pass, Kubernetes side (issue 42, docs/safety-hostile-pass-11-kube.md):
//! the `headroom` binary against hostile API servers on 127.0.0.1.
//!
//! - `headroom kube-discover --once --for-s S` against a server that never gave a whole pod
//!   list (hanging, 500s) printed nothing and exited 0 at the deadline: a script took that for
//!   "no LC pod on this node". Now it exits 1 saying no complete list came (and without
//!   `--once`, says the same on stderr).
//! - kube-rs's client logged every failed request again (ERROR) and every answer it could not
//!   parse whole, body included (WARN), at each retry: an 8 MB non-JSON answer made 40 MB of
//!   stderr in 6 s, under the discovery's own warning that says each kind of error once. Now
//!   kube-rs's client is muted unless `HEADROOM_LOG` names it.
#![cfg(feature = "kube")]

use std::io::BufReader;
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use headroom_hostile_server::{answer_json, hold, kubeconfig, read_request, serve, Server};

const BIN: &str = env!("CARGO_BIN_EXE_headroom");

#[derive(Clone, Copy)]
enum Hostile {
    /// Reads the request and never answers (until the test drops the server, at most 30 s).
    Hangs,
    /// Answers every request `500` with a Status.
    Fails,
    /// Answers every request 200 with this many bytes that are not JSON.
    Garbage(usize),
}

fn serve_how(how: Hostile) -> Server {
    serve(64, (), move |conn, stop, _| answer(conn, how, stop))
}

fn answer(conn: TcpStream, how: Hostile, stop: &AtomicBool) {
    let mut r = BufReader::new(conn.try_clone().unwrap());
    let mut w = conn;
    for _ in 0..64 {
        if read_request(&mut r).is_none() {
            return;
        }
        match how {
            Hostile::Hangs => {
                hold(stop, Duration::from_secs(30));
                return;
            }
            Hostile::Fails | Hostile::Garbage(_) => {
                let (status, body) = match how {
                    Hostile::Garbage(n) => ("200 OK", format!("{{{}", "x".repeat(n))),
                    _ => ("500 Internal Server Error", r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"etcd down","code":500}"#.to_string()),
                };
                if answer_json(&mut w, status, &body).is_err() {
                    return;
                }
            }
        }
    }
}

/// Runs `headroom kube-discover --node node-p11k --kubeconfig K` with `extra`; its exit code,
/// stdout and stderr. A hang detector kills it after 60 s (`--for-s` is at most a few here).
fn kube_discover(port: u16, extra: &[&str]) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let kc = kubeconfig(dir.path(), port);
    let mut child = Command::new(BIN)
        .args(["kube-discover", "--node", "node-p11k", "--kubeconfig"])
        .arg(&kc)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let end = Instant::now() + Duration::from_secs(60);
    while Instant::now() < end {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if child.try_wait().unwrap().is_none() {
        let _ = child.kill();
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn once_with_no_pod_list_by_the_deadline_exits_1_saying_so() {
    for how in [Hostile::Hangs, Hostile::Fails] {
        let server = serve_how(how);
        let (code, stdout, stderr) = kube_discover(server.port, &["--once", "--for-s", "2"]);
        // The code before: Some(0), nothing on stdout, and (before the 10 s warning) nothing on
        // stderr either for a hanging server.
        assert_eq!(code, Some(1), "stdout {stdout}\nstderr {stderr}");
        assert!(
            stderr.contains("no complete pod list of node node-p11k"),
            "one clear message: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
        if matches!(how, Hostile::Fails) {
            let said = stderr.lines().filter(|l| l.contains("etcd down")).count();
            assert_eq!(said, 1, "the 500 said once, not at each retry: {stderr}");
            // The code before: kube-rs's "failed with status 500" at ERROR, at each retry.
            assert!(!stderr.contains("kube_client"), "{stderr}");
        }
    }
    // An answer of 1 MB that is not JSON, at each retry: said once, short (the code before
    // echoed the whole body at each retry, 1 MB a line).
    let server = serve_how(Hostile::Garbage(1 << 20));
    let (code, _, stderr) = kube_discover(server.port, &["--once", "--for-s", "3"]);
    assert_eq!(code, Some(1));
    assert!(
        stderr.len() < 64 << 10,
        "{} bytes of stderr for a 1 MB answer: {}",
        stderr.len(),
        &stderr[..stderr.len().min(2000)]
    );
    // Without --once the deadline is the run's end (exit 0), but it says no list came.
    let server = serve_how(Hostile::Hangs);
    let (code, stdout, stderr) = kube_discover(server.port, &["--for-s", "2"]);
    assert_eq!(code, Some(0), "stdout {stdout}\nstderr {stderr}");
    assert!(
        stderr.contains("no complete pod list of node node-p11k"),
        "{stderr}"
    );
}
