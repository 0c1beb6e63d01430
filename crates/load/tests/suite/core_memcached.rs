//! The protocol encoders and parsers against a real memcached (ASCII and binary): hits, misses,
//! pipelining, and a server error the connection survives. SKIPs when memcached is not installed.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use headroom_load::protocol::{Op, Protocol, ProtocolError, Reply};

/// memcached on a free loopback port, killed when dropped.
struct Memcached {
    child: Child,
    port: u16,
}

impl Drop for Memcached {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_memcached(test: &str) -> Option<Memcached> {
    let Ok(path) = which("memcached") else {
        eprintln!("SKIP {test}: memcached not found in PATH");
        return None;
    };
    // Ready when *our* memcached answers `stats` with its pid (another test's may hold a port).
    let (child, addr) = headroom_load::readiness::spawn_memcache_server(
        |port| {
            let mut c = Command::new(&path);
            c.args(["-l", "127.0.0.1", "-p", &port.to_string(), "-U", "0"])
                .args(["-t", "1", "-m", "64", "-u", "root"])
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            c
        },
        5,
        Duration::from_secs(10),
    )
    .unwrap_or_else(|e| panic!("{test}: memcached did not start: {e}"));
    Some(Memcached {
        child,
        port: addr.port(),
    })
}

fn which(name: &str) -> Result<std::path::PathBuf, ()> {
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        })
        .ok_or(())
}

/// A connection that sends encoded requests and reads replies with `Protocol::parse`.
struct Conn {
    stream: TcpStream,
    protocol: Protocol,
    buf: Vec<u8>,
}

impl Conn {
    fn open(port: u16, protocol: Protocol) -> Conn {
        let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        Conn {
            stream,
            protocol,
            buf: Vec::new(),
        }
    }

    fn send(&mut self, ops: &[(Op, &[u8], usize)]) {
        let mut out = Vec::new();
        for &(op, key, len) in ops {
            self.protocol.encode(op, key, len, &mut out);
        }
        self.stream.write_all(&out).unwrap();
    }

    /// The next reply (reading more bytes while the parser needs them).
    fn reply(&mut self, op: Op) -> Result<Reply, ProtocolError> {
        let mut chunk = [0u8; 64 * 1024];
        loop {
            match self.protocol.parse(op, &self.buf) {
                Ok(Some(r)) => {
                    self.buf.drain(..r.consumed);
                    return Ok(r);
                }
                Ok(None) => {
                    let n = self.stream.read(&mut chunk).expect("reading a reply");
                    assert!(n > 0, "memcached closed the connection");
                    self.buf.extend_from_slice(&chunk[..n]);
                }
                Err(e) => {
                    if let Some(c) = e.consumed() {
                        self.buf.drain(..c);
                    }
                    return Err(e);
                }
            }
        }
    }
}

#[test]
fn ascii_and_binary_against_real_memcached() {
    let Some(server) = start_memcached("ascii_and_binary_against_real_memcached") else {
        return;
    };
    for protocol in [Protocol::MemcacheAscii, Protocol::MemcacheBinary] {
        let mut c = Conn::open(server.port, protocol);
        let key = format!("{protocol:?}-key").into_bytes();
        c.send(&[(Op::Get, &key, 0)]);
        assert!(
            !c.reply(Op::Get).unwrap().hit,
            "{protocol}: fresh key must miss"
        );
        for len in [0usize, 1, 100, 5000, 500_000] {
            c.send(&[(Op::Set, &key, len), (Op::Get, &key, 0)]);
            assert!(
                c.reply(Op::Set).unwrap().hit,
                "{protocol}: SET {len} stored"
            );
            assert!(
                c.reply(Op::Get).unwrap().hit,
                "{protocol}: GET after SET {len}"
            );
        }
        // A pipeline of 200 mixed requests, replies in order.
        let keys: Vec<Vec<u8>> = (0..100)
            .map(|i| format!("{protocol:?}-{i:05}").into_bytes())
            .collect();
        let mut ops: Vec<(Op, &[u8], usize)> = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            if i % 2 == 0 {
                ops.push((Op::Set, k, 64));
            }
            ops.push((Op::Get, k, 0));
        }
        c.send(&ops);
        for (i, &(op, _, _)) in ops.iter().enumerate() {
            let r = c.reply(op).unwrap();
            let key_index = keys.iter().position(|k| *k == ops[i].1).unwrap();
            assert_eq!(
                r.hit,
                op == Op::Set || key_index % 2 == 0,
                "{protocol} op {i}"
            );
        }
        // A value over memcached's 1 MiB item limit: a server error, and the connection goes on.
        c.send(&[(Op::Set, &key, 2 << 20), (Op::Get, &keys[0], 0)]);
        match c.reply(Op::Set) {
            Err(e @ ProtocolError::Server { .. }) => assert!(e.consumed().is_some(), "{e}"),
            other => panic!("{protocol}: oversized SET gave {other:?}"),
        }
        assert!(
            c.reply(Op::Get).unwrap().hit,
            "{protocol}: connection usable after the error"
        );
    }
}
