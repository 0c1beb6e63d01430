//! `headroom serve` in-process: ASCII and binary protocol behaviour, LRU eviction, slow clients,
//! both dispatch modes, shutdown.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use headroom_workloads::serve::{Dispatch, ServeConfig, Server, ServerHandle, ServiceTime};

fn start(dispatch: Dispatch, threads: usize, memory_mb: usize) -> ServerHandle {
    Server::start(ServeConfig {
        port: 0,
        threads,
        dispatch,
        memory_mb,
        ..ServeConfig::default()
    })
    .expect("server starts")
}

struct Client {
    s: TcpStream,
}

impl Client {
    fn connect(addr: SocketAddr) -> Client {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.set_nodelay(true).unwrap();
        Client { s }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).expect("send");
    }

    fn read_exact(&mut self, n: usize) -> Vec<u8> {
        let mut buf = vec![0u8; n];
        self.s.read_exact(&mut buf).expect("read reply");
        buf
    }

    /// Sends `cmd` and checks the reply is exactly `reply`.
    fn expect(&mut self, cmd: &str, reply: &str) {
        self.send(cmd.as_bytes());
        let got = self.read_exact(reply.len());
        assert_eq!(String::from_utf8_lossy(&got), reply, "reply to {cmd:?}");
    }

    /// Reads until the buffer ends with `end`.
    fn read_until(&mut self, end: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut b = [0u8; 4096];
        while !out.ends_with(end) {
            let n = self.s.read(&mut b).expect("read");
            assert!(
                n > 0,
                "connection closed; got {:?}",
                String::from_utf8_lossy(&out)
            );
            out.extend_from_slice(&b[..n]);
        }
        out
    }

    fn stats(&mut self) -> Vec<(String, String)> {
        self.send(b"stats\r\n");
        let text = String::from_utf8(self.read_until(b"END\r\n")).unwrap();
        text.lines()
            .filter_map(|l| l.strip_prefix("STAT "))
            .map(|l| {
                let (k, v) = l.split_once(' ').unwrap();
                (k.to_string(), v.to_string())
            })
            .collect()
    }

    fn stat(&mut self, name: &str) -> u64 {
        self.stats()
            .into_iter()
            .find(|(k, _)| k == name)
            .unwrap_or_else(|| panic!("no stat {name}"))
            .1
            .parse()
            .unwrap()
    }
}

#[test]
fn ascii_storage_retrieval_and_errors() {
    for dispatch in [Dispatch::Static, Dispatch::Shared] {
        let server = start(dispatch, 2, 64);
        let mut c = Client::connect(server.addr());
        c.expect("set a 5 0 3\r\nabc\r\n", "STORED\r\n");
        c.expect("get a\r\n", "VALUE a 5 3\r\nabc\r\nEND\r\n");
        c.expect(
            "set b 0 0 2 noreply\r\nxy\r\nget a b missing\r\n",
            "VALUE a 5 3\r\nabc\r\nVALUE b 0 2\r\nxy\r\nEND\r\n",
        );
        c.expect("add a 0 0 1\r\nz\r\n", "NOT_STORED\r\n");
        c.expect("replace nope 0 0 1\r\nz\r\n", "NOT_STORED\r\n");
        c.expect("append a 0 0 2\r\nde\r\n", "STORED\r\n");
        c.expect("prepend a 0 0 2\r\n01\r\n", "STORED\r\n");
        c.expect("get a\r\n", "VALUE a 5 7\r\n01abcde\r\nEND\r\n");
        // gets → cas
        c.send(b"gets a\r\n");
        let line = String::from_utf8(c.read_until(b"END\r\n")).unwrap();
        let cas: u64 = line
            .lines()
            .next()
            .unwrap()
            .split(' ')
            .nth(4)
            .unwrap()
            .parse()
            .unwrap();
        c.expect(
            &format!("cas a 0 0 1 {}\r\nq\r\n", cas + 1000),
            "EXISTS\r\n",
        );
        c.expect(&format!("cas a 0 0 1 {cas}\r\nq\r\n"), "STORED\r\n");
        c.expect("cas nope 0 0 1 5\r\nq\r\n", "NOT_FOUND\r\n");
        c.expect("set n 0 0 2\r\n10\r\nincr n 5\r\n", "STORED\r\n15\r\n");
        c.expect("decr n 100\r\n", "0\r\n");
        c.expect(
            "incr a 1\r\n",
            "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
        );
        c.expect(
            "incr n x\r\n",
            "CLIENT_ERROR invalid numeric delta argument\r\n",
        );
        c.expect("incr nope 1\r\n", "NOT_FOUND\r\n");
        c.expect("touch n 100\r\n", "TOUCHED\r\n");
        c.expect("touch nope 100\r\n", "NOT_FOUND\r\n");
        c.expect("delete n\r\n", "DELETED\r\n");
        c.expect("delete n\r\n", "NOT_FOUND\r\n");
        c.expect(
            "delete a 5\r\n",
            "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n",
        );
        // A negative exptime stores an already-expired item.
        c.expect("set gone 0 -1 1\r\nx\r\nget gone\r\n", "STORED\r\nEND\r\n");
        c.expect("gat 100 b\r\n", "VALUE b 0 2\r\nxy\r\nEND\r\n");
        // Errors as memcached answers them.
        c.expect("bogus\r\n", "ERROR\r\n");
        c.expect("\r\n", "ERROR\r\n");
        c.expect("get\r\n", "ERROR\r\n");
        c.expect("set k 0 0\r\n", "ERROR\r\n");
        c.expect(
            "set k x 0 1\r\n",
            "CLIENT_ERROR bad command line format\r\n",
        );
        c.expect(
            "set k 0 0 -1\r\n",
            "CLIENT_ERROR bad command line format\r\n",
        );
        let long_key = "k".repeat(251);
        c.expect(
            &format!("get {long_key}\r\n"),
            "CLIENT_ERROR bad command line format\r\n",
        );
        // memcached reads exactly <bytes>+2: the rest of the line is then parsed as a command.
        c.expect(
            "set k 0 0 3\r\nabcde\r\n",
            "CLIENT_ERROR bad data chunk\r\nERROR\r\n",
        );
        // An oversized value is refused and its data swallowed: the next command still works.
        let big = vec![b'v'; (1 << 20) + 10];
        c.send(b"set big 0 0 1048586\r\n");
        c.send(&big);
        c.send(b"\r\n");
        c.expect(
            "get big\r\n",
            "SERVER_ERROR object too large for cache\r\nEND\r\n",
        );
        c.expect("version\r\n", "VERSION 1.6.0-headroom\r\n");
        c.expect("verbosity 1\r\n", "OK\r\n");
        c.expect("flush_all\r\n", "OK\r\n");
        c.expect("get b\r\n", "END\r\n");
        c.expect("stats reset\r\n", "RESET\r\n");
        c.expect("stats nonsense\r\n", "ERROR\r\n");
        c.expect("quit\r\n", "");
        let mut b = [0u8; 1];
        assert_eq!(c.s.read(&mut b).unwrap(), 0, "quit closes the connection");
    }
}

#[test]
fn stats_report_memcached_counters() {
    let server = start(Dispatch::Static, 3, 64);
    let mut c = Client::connect(server.addr());
    let _other = Client::connect(server.addr());
    c.expect(
        "set a 0 0 1\r\n1\r\nget a\r\nget zz\r\n",
        "STORED\r\nVALUE a 0 1\r\n1\r\nEND\r\nEND\r\n",
    );
    let stats = c.stats();
    let get = |n: &str| {
        stats
            .iter()
            .find(|(k, _)| k == n)
            .unwrap_or_else(|| panic!("stat {n} missing"))
            .1
            .clone()
    };
    assert_eq!(get("cmd_get"), "2");
    assert_eq!(get("cmd_set"), "1");
    assert_eq!(get("get_hits"), "1");
    assert_eq!(get("get_misses"), "1");
    assert_eq!(get("curr_items"), "1");
    assert_eq!(get("threads"), "3");
    assert_eq!(get("pid"), std::process::id().to_string());
    assert_eq!(get("total_connections"), "2");
    assert_eq!(get("curr_connections"), "2");
    for name in [
        "uptime",
        "bytes",
        "evictions",
        "limit_maxbytes",
        "version",
        "bytes_read",
        "bytes_written",
    ] {
        get(name);
    }
    // The in-process view agrees.
    let snap = server.stats();
    assert!(snap.pairs.iter().any(|(k, v)| *k == "cmd_set" && v == "1"));
}

#[test]
fn lru_evicts_under_the_memory_limit() {
    let server = start(Dispatch::Static, 1, 1);
    let mut c = Client::connect(server.addr());
    let value = "v".repeat(10_000);
    c.expect(
        &format!("set first 0 0 {}\r\n{value}\r\n", value.len()),
        "STORED\r\n",
    );
    c.expect(
        &format!("set hot 0 0 {}\r\n{value}\r\n", value.len()),
        "STORED\r\n",
    );
    // 300 × 10 KB = 3 MB through a 1 MiB cache; `hot` is read after every set so it stays
    // recently used, `first` never is.
    for i in 0..300 {
        c.expect(
            &format!("set k{i} 0 0 {}\r\n{value}\r\n", value.len()),
            "STORED\r\n",
        );
        c.send(b"get hot\r\n");
        let r = c.read_until(b"END\r\n");
        assert!(r.starts_with(b"VALUE hot"), "hot was evicted at i={i}");
    }
    c.expect("get first\r\n", "END\r\n");
    assert!(c.stat("evictions") > 0);
    assert!(c.stat("bytes") <= 1 << 20, "bytes over the limit");
    c.expect(
        "get k299\r\n",
        &format!("VALUE k299 0 {}\r\n{value}\r\nEND\r\n", value.len()),
    );
}

#[test]
fn a_slow_client_does_not_block_others() {
    for dispatch in [Dispatch::Static, Dispatch::Shared] {
        // One worker thread: the slow client shares it with everyone.
        let server = start(dispatch, 1, 64);
        let mut setup = Client::connect(server.addr());
        let value = "x".repeat(100_000);
        setup.expect(
            &format!("set big 0 0 {}\r\n{value}\r\n", value.len()),
            "STORED\r\n",
        );
        // The slow client asks for ~100 MB of replies and reads none of them.
        let mut slow = Client::connect(server.addr());
        let burst: String = "get big\r\n".repeat(1000);
        slow.send(burst.as_bytes());
        // An idle client holding a half-sent command.
        let mut idle = Client::connect(server.addr());
        idle.send(b"set half 0 0 10\r\nabc");
        std::thread::sleep(Duration::from_millis(100));
        let t = Instant::now();
        let mut fast = Client::connect(server.addr());
        for _ in 0..50 {
            fast.expect(
                "set f 0 0 1\r\n1\r\nget f\r\n",
                "STORED\r\nVALUE f 0 1\r\n1\r\nEND\r\n",
            );
        }
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "fast client took {:?} ({dispatch})",
            t.elapsed()
        );
        // The slow client still gets its replies once it reads.
        let mut got = 0usize;
        let mut b = vec![0u8; 1 << 16];
        while got < 1000 * (value.len() + 20) {
            let n = slow
                .s
                .read(&mut b)
                .unwrap_or_else(|e| panic!("slow reads after {got} bytes ({dispatch}): {e}"));
            assert!(n > 0);
            got += n;
        }
        idle.expect("defghij\r\n", "STORED\r\n");
    }
}

#[test]
fn binary_protocol_get_set() {
    let server = start(Dispatch::Shared, 2, 64);
    let mut c = Client::connect(server.addr());
    let header = |opcode: u8, keylen: u16, extlen: u8, bodylen: u32| {
        let mut h = vec![0x80, opcode];
        h.extend_from_slice(&keylen.to_be_bytes());
        h.push(extlen);
        h.push(0);
        h.extend_from_slice(&[0, 0]);
        h.extend_from_slice(&bodylen.to_be_bytes());
        h.extend_from_slice(&0xabcd_0123u32.to_be_bytes());
        h.extend_from_slice(&0u64.to_be_bytes());
        h
    };
    // SET key "k" value "hello" flags 7.
    let mut set = header(0x01, 1, 8, 8 + 1 + 5);
    set.extend_from_slice(&7u32.to_be_bytes());
    set.extend_from_slice(&0u32.to_be_bytes());
    set.extend_from_slice(b"khello");
    c.send(&set);
    let r = c.read_exact(24);
    assert_eq!(r[0], 0x81);
    assert_eq!(r[1], 0x01);
    assert_eq!(u16::from_be_bytes([r[6], r[7]]), 0, "status");
    assert_eq!(&r[12..16], &0xabcd_0123u32.to_be_bytes(), "opaque echoed");
    assert_ne!(u64::from_be_bytes(r[16..24].try_into().unwrap()), 0, "cas");
    // GET
    let mut get = header(0x00, 1, 0, 1);
    get.extend_from_slice(b"k");
    c.send(&get);
    let r = c.read_exact(24);
    let bodylen = u32::from_be_bytes(r[8..12].try_into().unwrap()) as usize;
    assert_eq!(r[4], 4, "flags extras");
    let body = c.read_exact(bodylen);
    assert_eq!(&body[..4], &7u32.to_be_bytes());
    assert_eq!(&body[4..], b"hello");
    // GET miss
    let mut miss = header(0x00, 2, 0, 2);
    miss.extend_from_slice(b"zz");
    c.send(&miss);
    let r = c.read_exact(24);
    assert_eq!(u16::from_be_bytes([r[6], r[7]]), 1, "KEY_ENOENT");
    let bodylen = u32::from_be_bytes(r[8..12].try_into().unwrap()) as usize;
    c.read_exact(bodylen);
    // Unknown opcode
    c.send(&header(0x7f, 0, 0, 0));
    let r = c.read_exact(24);
    assert_eq!(u16::from_be_bytes([r[6], r[7]]), 0x81);
}

#[test]
fn service_time_makes_requests_take_that_long() {
    let server = Server::start(ServeConfig {
        port: 0,
        threads: 1,
        service_time: Some(ServiceTime::parse("fixed:2000").expect("dist parses")),
        footprint_mb: 4,
        ..ServeConfig::default()
    })
    .unwrap();
    let mut c = Client::connect(server.addr());
    let t = Instant::now();
    for _ in 0..5 {
        c.expect("get x\r\n", "END\r\n");
    }
    // 5 requests × 2 ms of CPU work each.
    assert!(
        t.elapsed() >= Duration::from_millis(10),
        "took {:?}",
        t.elapsed()
    );
    assert!(ServiceTime::parse("nonsense:1").is_err());
    // Bounded where accepted: a thread held 10 s a request, or a negative time, is refused.
    for bad in ["fixed:1e300", "fixed:-5", "exponential:1e-300"] {
        let e = ServiceTime::parse(bad).expect_err(bad).to_string();
        assert!(e.contains("10 s"), "{bad}: {e}");
    }
    assert!(ServiceTime::parse("fixed:0").is_ok());
}

#[test]
fn stop_closes_connections_and_frees_the_port() {
    let mut server = start(Dispatch::Shared, 2, 64);
    let addr = server.addr();
    let mut c = Client::connect(addr);
    c.expect("version\r\n", "VERSION 1.6.0-headroom\r\n");
    let t = Instant::now();
    server.stop();
    assert!(t.elapsed() < Duration::from_secs(2));
    let mut b = [0u8; 16];
    assert!(
        matches!(c.s.read(&mut b), Ok(0) | Err(_)),
        "connection closed by stop"
    );
    // The port can be bound again.
    let again = Server::start(ServeConfig {
        port: addr.port(),
        threads: 1,
        ..ServeConfig::default()
    })
    .expect("rebind after stop");
    drop(again);
}

#[test]
fn bad_configuration_is_rejected() {
    for cfg in [
        ServeConfig {
            threads: 0,
            ..ServeConfig::default()
        },
        ServeConfig {
            memory_mb: 0,
            ..ServeConfig::default()
        },
        ServeConfig {
            max_item_bytes: 10,
            ..ServeConfig::default()
        },
    ] {
        let e = Server::start(ServeConfig { port: 0, ..cfg })
            .err()
            .expect("rejected");
        assert!(e.to_string().contains("invalid serve configuration"), "{e}");
    }
    assert!("fancy".parse::<Dispatch>().is_err());
}
