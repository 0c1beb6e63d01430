//! `headroom serve` as a process: memcached's own conformance tool (memccapable) against it,
//! clean shutdown on SIGTERM/SIGINT, and bad flags.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_headroom");

/// A `headroom serve` child, killed on drop even when the test fails.
struct ServeProcess {
    child: Child,
    addr: SocketAddr,
}

impl ServeProcess {
    fn start(extra: &[&str]) -> ServeProcess {
        let mut child = Command::new(BIN)
            .args(["serve", "--port", "0"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn headroom serve");
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read the listening line");
        // "headroom serve: listening on 127.0.0.1:PORT (threads …)"
        let addr = line
            .split_whitespace()
            .find_map(|w| w.parse::<SocketAddr>().ok())
            .unwrap_or_else(|| panic!("no address in {line:?}"));
        ServeProcess { child, addr }
    }

    fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2) on our own child's pid.
        let rc = unsafe { libc::kill(self.child.id() as i32, sig) };
        assert_eq!(rc, 0);
    }

    fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let t = Instant::now();
        while t.elapsed() < within {
            if let Some(st) = self.child.try_wait().unwrap() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

#[test]
fn memccapable_passes_against_serve() {
    if !have("memccapable") {
        eprintln!("SKIP memccapable_passes_against_serve: memccapable not installed (Debian package libmemcached-tools)");
        return;
    }
    for dispatch in ["static", "shared"] {
        let server = ServeProcess::start(&["--threads", "2", "--dispatch", dispatch]);
        // -a: the ASCII suite, -b: the binary suite (run separately for clearer reports).
        for suite in ["-a", "-b"] {
            let out = Command::new("memccapable")
                .args([
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &server.addr.port().to_string(),
                    "-t",
                    "5",
                    suite,
                ])
                .output()
                .expect("run memccapable");
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success() && stdout.contains("All tests passed"),
                "memccapable {suite} against --dispatch {dispatch} failed:\n{stdout}\n{stderr}"
            );
            let passed = stdout.matches("[pass]").count();
            assert!(passed >= 27, "only {passed} sub-tests ran:\n{stdout}");
        }
    }
}

#[test]
fn sigterm_and_sigint_stop_it_cleanly() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let mut server = ServeProcess::start(&["--threads", "2", "--dispatch", "shared", "--pin"]);
        let mut c = TcpStream::connect(server.addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.write_all(b"set k 0 0 1\r\nv\r\n").unwrap();
        let mut b = [0u8; 8];
        c.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"STORED\r\n");
        server.signal(sig);
        let status = server
            .wait_exit(Duration::from_secs(5))
            .expect("exits within 5 s");
        assert!(
            status.success(),
            "exit status {status:?} after signal {sig}"
        );
        let mut stderr = String::new();
        server
            .child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        assert!(stderr.contains("stopped after"), "stderr: {stderr}");
        // Its connections are closed.
        assert!(matches!(c.read(&mut b), Ok(0) | Err(_)));
    }
}

#[test]
fn bad_flags_exit_2() {
    for args in [
        &["serve", "--dispatch", "fancy"][..],
        &["serve", "--threads", "0"],
        &["serve", "--listen", "not-an-ip"],
        &["serve", "--service-time", "nonsense:3"],
        &["serve", "-m", "0"],
        &["serve", "--max-item-size", "huge"],
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("error"), "{args:?}: {stderr}");
    }
}
