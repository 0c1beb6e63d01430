//! Test servers for the engine tests: a memcached-ASCII responder with an injected behaviour
//! (fixed delay, a periodic stall, malformed replies), and a real memcached on a free port.
//! Both stop when dropped, even when the test fails.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How the fake server misbehaves.
#[derive(Clone, Copy, Debug)]
pub enum Behaviour {
    /// Answer at once.
    Prompt,
    /// Answer each request this long after it arrived.
    Delay(Duration),
    /// Answer each request this long after it arrived, however many are in flight (a steady
    /// server whose round trip does not queue; `Delay` answers one at a time).
    Latency(Duration),
    /// Hold every reply due in the first `stall` of each `period` until the stall ends.
    Stall { period: Duration, stall: Duration },
    /// Hold every reply due between `at` and `at + stall` after the server started until then.
    StallOnce { at: Duration, stall: Duration },
    /// Every `every`-th GET gets a garbage line instead of a reply.
    Malformed { every: u64 },
    /// Once `n` requests were answered (all connections together), every connection is reset
    /// (RST, as a server that crashed with requests unread) when a request arrives.
    ResetAfter { n: u64 },
}

pub struct TestServer {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    pub requests: Arc<AtomicU64>,
}

fn sleep_until(deadline: Instant) {
    loop {
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        let left = deadline - now;
        if left > Duration::from_micros(200) {
            std::thread::sleep(left - Duration::from_micros(150));
        } else {
            std::hint::spin_loop();
        }
    }
}

impl TestServer {
    pub fn start(behaviour: Behaviour) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(AtomicU64::new(0));
        let (stop2, req2) = (stop.clone(), requests.clone());
        let epoch = Instant::now();
        let accept = std::thread::spawn(move || {
            let mut workers = Vec::new();
            for conn in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let (stop3, req3) = (stop2.clone(), req2.clone());
                workers.push(std::thread::spawn(move || {
                    serve_conn(conn, behaviour, epoch, &stop3, &req3)
                }));
            }
            for w in workers {
                let _ = w.join();
            }
        });
        TestServer {
            addr,
            stop,
            accept: Some(accept),
            requests,
        }
    }

    pub fn spec(&self) -> String {
        self.addr.to_string()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn serve_conn(
    conn: TcpStream,
    behaviour: Behaviour,
    epoch: Instant,
    stop: &AtomicBool,
    requests: &AtomicU64,
) {
    let _ = conn.set_nodelay(true);
    let _ = conn.set_read_timeout(Some(Duration::from_millis(50)));
    let mut writer = conn.try_clone().unwrap();
    let mut reader = BufReader::new(conn);
    let mut line = String::new();
    let mut gets = 0u64;
    // `Latency`: a thread of its own writes each reply when due (ends when the reader does).
    let delayed = if let Behaviour::Latency(d) = behaviour {
        let mut w = writer.try_clone().unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
        std::thread::spawn(move || {
            for (at, reply) in rx {
                sleep_until(at);
                if w.write_all(&reply).is_err() {
                    return;
                }
            }
        });
        Some((tx, d))
    } else {
        None
    };
    while !stop.load(Ordering::SeqCst) {
        match reader.read_line(&mut line) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                // A partial line may already be in `line`; keep reading it next round.
                continue;
            }
            Err(_) => return,
        }
        if !line.ends_with('\n') {
            continue;
        }
        if let Behaviour::ResetAfter { n } = behaviour {
            if requests.load(Ordering::Relaxed) >= n {
                return reset(writer);
            }
        }
        let arrived = Instant::now();
        let request = std::mem::take(&mut line);
        let mut words = request.split_whitespace();
        let reply: Vec<u8> = match words.next() {
            Some("get") => {
                gets += 1;
                let key = words.next().unwrap_or("");
                if let Behaviour::Malformed { every } = behaviour {
                    if gets.is_multiple_of(every) {
                        let _ = writer.write_all(b"GARBAGE this is not memcached\r\n");
                        requests.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                }
                format!("VALUE {key} 0 5\r\nhello\r\nEND\r\n").into_bytes()
            }
            Some("set") => {
                let bytes: usize = request
                    .split_whitespace()
                    .nth(4)
                    .and_then(|b| b.parse().ok())
                    .unwrap_or(0);
                let mut data = vec![0u8; bytes + 2];
                if std::io::Read::read_exact(&mut reader, &mut data).is_err() {
                    return;
                }
                b"STORED\r\n".to_vec()
            }
            _ => b"ERROR\r\n".to_vec(),
        };
        requests.fetch_add(1, Ordering::Relaxed);
        if let Some((tx, d)) = &delayed {
            if tx.send((arrived + *d, reply)).is_err() {
                return;
            }
            continue;
        }
        match behaviour {
            Behaviour::Delay(d) => sleep_until(arrived + d),
            Behaviour::Stall { period, stall } => {
                let since = arrived - epoch;
                let phase = Duration::from_nanos((since.as_nanos() % period.as_nanos()) as u64);
                if phase < stall {
                    sleep_until(arrived + (stall - phase));
                }
            }
            Behaviour::StallOnce { at, stall } => {
                let since = arrived - epoch;
                if since >= at && since < at + stall {
                    sleep_until(epoch + at + stall);
                }
            }
            _ => {}
        }
        if writer.write_all(&reply).is_err() {
            return;
        }
    }
}

/// Closes `conn` with an RST (SO_LINGER 0) instead of a FIN.
fn reset(conn: TcpStream) {
    use std::os::fd::AsRawFd;
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket and a linger struct of the size given.
    unsafe {
        libc::setsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&raw const linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

/// A real memcached on a free loopback port, killed on drop.
pub struct Memcached {
    pub addr: SocketAddr,
    child: Child,
}

impl Memcached {
    /// None (with the reason printed) when memcached is not installed.
    pub fn start(test: &str) -> Option<Memcached> {
        let Ok(path) = which("memcached") else {
            eprintln!("SKIP {test}: memcached is not installed (apt-get install memcached)");
            return None;
        };
        // Ready only when *our* memcached answers `stats` with its pid: a port that accepts a
        // connection may be another test's memcached, which goes away when that test ends.
        let started = headroom_load::readiness::spawn_memcache_server(
            |port| {
                let mut c = Command::new(&path);
                c.args(["-l", "127.0.0.1", "-p", &port.to_string(), "-U", "0"])
                    .args(["-t", "1", "-m", "64", "-u", "root"])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null());
                c
            },
            5,
            Duration::from_secs(5),
        );
        match started {
            Ok((child, addr)) => Some(Memcached { addr, child }),
            Err(e) => panic!("{test}: memcached did not start: {e}"),
        }
    }

    pub fn spec(&self) -> String {
        self.addr.to_string()
    }
}

impl Drop for Memcached {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn which(name: &str) -> Result<std::path::PathBuf, ()> {
    let path = std::env::var_os("PATH").ok_or(())?;
    for dir in std::env::split_paths(&path).chain(["/usr/bin".into(), "/usr/sbin".into()]) {
        let p = dir.join(name);
        if p.is_file() {
            return Ok(p);
        }
    }
    Err(())
}
