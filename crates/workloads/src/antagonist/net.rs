//! Network antagonist: TCP flows of fixed-size messages (many "mice" or few "elephants",
//! Heracles §3.2) to a sink that discards them. Only loopback or addresses of local interfaces
//! (e.g. a network namespace's veth) are allowed.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};

use super::{AntagonistError, RunState, Workload};

/// Whether `ip` is loopback or assigned to one of this host's (this namespace's) interfaces.
pub fn is_local_address(ip: IpAddr) -> bool {
    if ip.is_loopback() {
        return true;
    }
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return false;
    };
    addrs.into_iter().any(|ifa| {
        let Some(a) = ifa.address else { return false };
        if let Some(v4) = a.as_sockaddr_in() {
            IpAddr::V4(v4.ip()) == ip
        } else if let Some(v6) = a.as_sockaddr_in6() {
            IpAddr::V6(v6.ip()) == ip
        } else {
            false
        }
    })
}

fn check_local(addr: SocketAddr) -> Result<(), AntagonistError> {
    if is_local_address(addr.ip()) {
        Ok(())
    } else {
        Err(AntagonistError::Usage(format!(
            "{addr}: the net antagonist only targets loopback or an address of a local interface \
             (e.g. a network namespace's veth), never another host"
        )))
    }
}

const LISTENER: u64 = u64::MAX;

/// A TCP sink: accepts any number of connections and discards what they send.
pub struct Sink {
    addr: SocketAddr,
    bytes: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Sink {
    /// Listens on `listen` (port 0 = any) and starts discarding.
    pub fn start(listen: SocketAddr) -> Result<Sink, AntagonistError> {
        check_local(listen)?;
        let listener = TcpListener::bind(listen)
            .map_err(|e| AntagonistError::io(format!("binding the sink to {listen}"), e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| AntagonistError::io("reading the sink's address", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| AntagonistError::io("making the sink listener nonblocking", e))?;
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(|e| {
            AntagonistError::io("epoll_create1 for the sink", std::io::Error::from(e))
        })?;
        epoll
            .add(
                listener.as_fd(),
                EpollEvent::new(EpollFlags::EPOLLIN, LISTENER),
            )
            .map_err(|e| {
                AntagonistError::io("registering the sink listener", std::io::Error::from(e))
            })?;
        let bytes = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (b, s) = (Arc::clone(&bytes), Arc::clone(&stop));
        let thread = std::thread::Builder::new()
            .name("net-sink".into())
            .spawn(move || sink_loop(listener, epoll, &b, &s))
            .map_err(|e| AntagonistError::io("spawning the sink thread", e))?;
        Ok(Sink {
            addr,
            bytes,
            stop,
            thread: Some(thread),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Bytes received so far.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn sink_loop(listener: TcpListener, epoll: Epoll, bytes: &AtomicU64, stop: &AtomicBool) {
    let mut conns: HashMap<u64, TcpStream> = HashMap::new();
    let mut next = 0u64;
    let mut events = [EpollEvent::empty(); 64];
    let mut buf = vec![0u8; 256 * 1024];
    while !stop.load(Ordering::Relaxed) {
        let n = match epoll.wait(&mut events, EpollTimeout::from(100u16)) {
            Ok(n) => n,
            Err(nix::Error::EINTR) => continue,
            Err(_) => return,
        };
        for ev in &events[..n] {
            let token = ev.data();
            if token == LISTENER {
                while let Ok((s, _)) = listener.accept() {
                    if s.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let ev = EpollEvent::new(EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP, next);
                    if epoll.add(s.as_fd(), ev).is_ok() {
                        conns.insert(next, s);
                        next += 1;
                    }
                }
                continue;
            }
            let mut close = false;
            if let Some(s) = conns.get_mut(&token) {
                // Bounded reads per event so one flow cannot starve the others.
                for _ in 0..16 {
                    match s.read(&mut buf) {
                        Ok(0) => {
                            close = true;
                            break;
                        }
                        Ok(k) => {
                            bytes.fetch_add(k as u64, Ordering::Relaxed);
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == ErrorKind::Interrupted => {}
                        Err(_) => {
                            close = true;
                            break;
                        }
                    }
                }
            }
            if close {
                if let Some(s) = conns.remove(&token) {
                    let _ = epoll.delete(s.as_fd());
                }
            }
        }
    }
}

/// The sending side: `flows` connections spread over the threads.
pub struct Flows {
    per_thread: Vec<Mutex<Vec<TcpStream>>>,
    size: usize,
    // Dropped after the flows (field order), so senders never write to a vanished sink.
    _sink: Option<Sink>,
}

impl Flows {
    pub fn connect(
        to: SocketAddr,
        flows: usize,
        size: usize,
        run_sink: bool,
        threads: usize,
    ) -> Result<Flows, AntagonistError> {
        check_local(to)?;
        if flows == 0 || flows > 4096 {
            return Err(AntagonistError::Usage(format!(
                "--flows must be between 1 and 4096, got {flows}"
            )));
        }
        if flows < threads {
            return Err(AntagonistError::Usage(format!(
                "--flows ({flows}) must be at least --threads ({threads}): each thread drives its own flows"
            )));
        }
        if size == 0 || size > 64 << 20 {
            return Err(AntagonistError::Usage(format!(
                "--size must be between 1 byte and 64 MiB, got {size}"
            )));
        }
        let sink = if run_sink {
            Some(Sink::start(to)?)
        } else {
            None
        };
        let target = sink.as_ref().map(|s| s.addr()).unwrap_or(to);
        let mut per_thread: Vec<Vec<TcpStream>> = (0..threads).map(|_| Vec::new()).collect();
        for i in 0..flows {
            let s = TcpStream::connect_timeout(&target, Duration::from_secs(2))
                .map_err(|e| AntagonistError::io(format!("connecting flow {i} to {target}"), e))?;
            let _ = s.set_nodelay(true);
            s.set_write_timeout(Some(Duration::from_millis(100)))
                .map_err(|e| AntagonistError::io("setting a write timeout", e))?;
            per_thread[i % threads].push(s);
        }
        Ok(Flows {
            per_thread: per_thread.into_iter().map(Mutex::new).collect(),
            size,
            _sink: sink,
        })
    }
}

impl Workload for Flows {
    fn detail(&self) -> String {
        let flows: usize = self
            .per_thread
            .iter()
            .map(|f| f.lock().map(|v| v.len()).unwrap_or(0))
            .sum();
        match &self._sink {
            Some(s) => format!(
                "{flows} flows of {}-byte messages to the in-process sink at {}",
                self.size,
                s.addr()
            ),
            None => format!("{flows} flows of {}-byte messages", self.size),
        }
    }

    fn run_thread(&self, index: usize, state: &RunState) -> Result<(), AntagonistError> {
        let mut flows = self.per_thread[index]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let msg = vec![0x5au8; self.size];
        // Bytes of the current message already sent, per flow (writes can be partial).
        let mut sent = vec![0usize; flows.len()];
        while !state.stopped() {
            for (f, s) in flows.iter_mut().enumerate() {
                if state.stopped() {
                    break;
                }
                match s.write(&msg[sent[f]..]) {
                    Ok(k) => {
                        sent[f] += k;
                        if sent[f] == msg.len() {
                            sent[f] = 0;
                            state.add(1);
                        }
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                        ) => {}
                    Err(e) => {
                        return Err(AntagonistError::io(format!("sending on flow {f}"), e));
                    }
                }
            }
        }
        Ok(())
    }
}

/// `net --sink-only`: just the sink; ops are `size`-byte messages received.
pub struct SinkOnly {
    sink: Sink,
    size: usize,
}

impl SinkOnly {
    pub fn bind(listen: SocketAddr, size: usize) -> Result<SinkOnly, AntagonistError> {
        if size == 0 {
            return Err(AntagonistError::Usage("--size must be at least 1".into()));
        }
        let sink = Sink::start(listen)?;
        eprintln!("headroom antagonist: net sink listening on {}", sink.addr());
        Ok(SinkOnly { sink, size })
    }
}

impl Workload for SinkOnly {
    fn detail(&self) -> String {
        format!(
            "sink at {} ({} bytes received)",
            self.sink.addr(),
            self.sink.bytes()
        )
    }

    fn run_thread(&self, _index: usize, state: &RunState) -> Result<(), AntagonistError> {
        let mut reported = 0u64;
        while !state.stopped() {
            std::thread::sleep(Duration::from_millis(20));
            let msgs = self.sink.bytes() / self.size as u64;
            state.add(msgs - reported);
            reported = msgs;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_local_addresses_are_allowed() {
        assert!(is_local_address("127.0.0.1".parse().unwrap()));
        assert!(is_local_address("127.3.2.1".parse().unwrap()));
        assert!(is_local_address("::1".parse().unwrap()));
        // TEST-NET-3 (RFC 5737): never assigned to a real interface.
        assert!(!is_local_address("203.0.113.7".parse().unwrap()));
        let e = Flows::connect("203.0.113.7:9".parse().unwrap(), 1, 10, false, 1)
            .err()
            .expect("refused");
        assert!(e.is_usage() && e.to_string().contains("203.0.113.7"), "{e}");
    }

    #[test]
    fn sink_counts_bytes() {
        let sink = Sink::start("127.0.0.1:0".parse().unwrap()).unwrap();
        let mut s = TcpStream::connect(sink.addr()).unwrap();
        s.write_all(&[1u8; 10_000]).unwrap();
        drop(s);
        let t = std::time::Instant::now();
        while sink.bytes() < 10_000 && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(sink.bytes(), 10_000);
    }
}
