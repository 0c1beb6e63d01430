//! Waiting for a memcache-protocol server that *we* started: ready only when the server on the
//! address answers `stats` with our child's pid. A port that merely accepts a connection may
//! belong to another process (a test or bench started in parallel that was handed the same
//! "free" port), and a run against it fails later, when that other process goes away.

use crate::error::LoadError;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Child;
use std::time::{Duration, Instant};

/// Why a started server is not the one answering on its address.
#[derive(Debug, thiserror::Error)]
pub enum NotReady {
    #[error("the server exited before it answered on {addr} ({status})")]
    Exited {
        addr: SocketAddr,
        status: std::process::ExitStatus,
    },
    #[error("{addr} is answered by pid {found}, not by the server we started (pid {ours}): the port was taken")]
    Foreign {
        addr: SocketAddr,
        ours: u32,
        found: u32,
    },
    #[error("the server (pid {pid}) did not answer `stats` on {addr} within {waited:?}: {last}")]
    TimedOut {
        addr: SocketAddr,
        pid: u32,
        waited: Duration,
        last: String,
    },
}

impl NotReady {
    /// A port clash, which another port fixes; the other reasons are the server's own.
    pub fn is_port_clash(&self) -> bool {
        match self {
            NotReady::Foreign { .. } => true,
            // memcached exits at once when its port is taken (bind: address in use).
            NotReady::Exited { status, .. } => !status.success(),
            NotReady::TimedOut { .. } => false,
        }
    }
}

/// Starts a memcache-protocol server on a port the OS has just handed out and waits for *its*
/// reply; `command(port)` builds the server's command line. A port taken by another process
/// between our pick and the server's bind is tried again on a new port (up to `tries` times).
pub fn spawn_memcache_server(
    mut command: impl FnMut(u16) -> std::process::Command,
    tries: usize,
    timeout: Duration,
) -> Result<(Child, SocketAddr), SpawnError> {
    let mut last = None;
    for _ in 0..tries.max(1) {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| SpawnError::Spawn(format!("picking a loopback port: {e}")))?
            .port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut cmd = command(port);
        let mut child = cmd
            .spawn()
            .map_err(|e| SpawnError::Spawn(format!("{cmd:?}: {e}")))?;
        match await_memcache_server(&mut child, addr, timeout) {
            Ok(()) => return Ok((child, addr)),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                if !e.is_port_clash() {
                    return Err(SpawnError::NotReady(e));
                }
                last = Some(e);
            }
        }
    }
    Err(SpawnError::NotReady(last.expect("at least one try")))
}

/// Why [`spawn_memcache_server`] has no server to give.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("starting the server: {0}")]
    Spawn(String),
    #[error(transparent)]
    NotReady(NotReady),
}

/// Waits until `addr` answers a memcache `stats` with `STAT pid <child's pid>`.
pub fn await_memcache_server(
    child: &mut Child,
    addr: SocketAddr,
    timeout: Duration,
) -> Result<(), NotReady> {
    await_memcache_pid(child.id(), addr, timeout, || {
        child.try_wait().ok().flatten()
    })
}

/// [`await_memcache_server`] for a process known by its pid; `exited` says whether it has gone.
pub fn await_memcache_pid(
    pid: u32,
    addr: SocketAddr,
    timeout: Duration,
    mut exited: impl FnMut() -> Option<std::process::ExitStatus>,
) -> Result<(), NotReady> {
    let start = Instant::now();
    loop {
        if let Some(status) = exited() {
            return Err(NotReady::Exited { addr, status });
        }
        let last = match stats_pid(addr) {
            Ok(found) if found == pid => return Ok(()),
            Ok(found) => {
                return Err(NotReady::Foreign {
                    addr,
                    ours: pid,
                    found,
                })
            }
            Err(e) => e.to_string(),
        };
        if start.elapsed() >= timeout {
            return Err(NotReady::TimedOut {
                addr,
                pid,
                waited: start.elapsed(),
                last,
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The pid a memcache-protocol server reports in `stats`.
pub fn stats_pid(addr: SocketAddr) -> Result<u32, LoadError> {
    let err = |reason: String| LoadError::ServerStats {
        addr: addr.to_string(),
        reason,
    };
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500))
        .map_err(|e| err(format!("connect: {e}")))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| err(format!("set timeout: {e}")))?;
    s.write_all(b"stats\r\n")
        .map_err(|e| err(format!("send stats: {e}")))?;
    let mut reader = BufReader::new(s);
    let mut line = String::new();
    let mut pid = None;
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) => return Err(err("connection closed before END".into())),
            Ok(_) => {}
            Err(e) => return Err(err(format!("read stats: {e}"))),
        }
        let l = line.trim_end();
        if l == "END" {
            break;
        }
        if let Some(v) = l.strip_prefix("STAT pid ") {
            pid = v.trim().parse::<u32>().ok();
        }
        if l.starts_with("ERROR") || l.starts_with("SERVER_ERROR") {
            return Err(err(format!("stats refused: {l}")));
        }
    }
    pid.ok_or_else(|| err("stats had no `STAT pid`".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A server that answers `stats` with a given pid.
    fn fake(pid: u32) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            if let Ok((s, _)) = l.accept() {
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                let mut w = s;
                write!(w, "STAT pid {pid}\r\nSTAT uptime 1\r\nEND\r\n").unwrap();
            }
        });
        addr
    }

    #[test]
    fn our_pid_is_ready_and_another_is_a_port_clash() {
        let addr = fake(4242);
        assert!(await_memcache_pid(4242, addr, Duration::from_secs(2), || None).is_ok());
        let addr = fake(4243);
        let err = await_memcache_pid(4242, addr, Duration::from_secs(2), || None).unwrap_err();
        assert!(err.is_port_clash(), "{err}");
        assert!(err.to_string().contains("4243"), "{err}");
    }

    #[test]
    fn nobody_listening_times_out_naming_the_address() {
        let addr = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let err = await_memcache_pid(1, addr, Duration::from_millis(100), || None).unwrap_err();
        assert!(err.to_string().contains(&addr.to_string()), "{err}");
    }
}
