//! Preload: every record written once before the measured run, as mutilate's `--loadonly`.

use std::io::{Read, Write};
use std::time::Duration;

use crate::clock::now_ns;
use crate::dist::KeyGenerator;
use crate::error::LoadError;
use crate::options::{LoadOptions, Validated};
use crate::protocol::{Op, MAX_VALUE_LEN};

/// Records per server: mutilate divides `-r` by the number of servers.
pub fn records_per_server(opts: &LoadOptions) -> u64 {
    (opts.records / opts.servers.len().max(1) as u64).max(1)
}

/// How many keys were written by [`preload`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PreloadStats {
    pub servers: usize,
    pub records_per_server: u64,
    pub seconds: f64,
}

/// Pipelined SETs in flight during preload.
const PRELOAD_WINDOW: usize = 256;

/// Writes every record (`-r`, split over the servers) once, pipelined, bounded in flight.
pub fn preload(opts: &LoadOptions, v: &Validated) -> Result<PreloadStats, LoadError> {
    let started = now_ns();
    let records = records_per_server(opts);
    let keys = KeyGenerator::new(v.keysize.clone(), records);
    let protocol = opts.protocol.protocol();
    let mut rng = crate::seeded_rng(opts.seed, 0x5eed);
    for (label, addr) in &v.servers {
        let err = |reason: String| LoadError::Preload {
            addr: label.clone(),
            reason,
        };
        let mut s = std::net::TcpStream::connect_timeout(addr, Duration::from_secs(2)).map_err(
            |source| LoadError::Connect {
                addr: format!("{label} ({addr})"),
                source,
            },
        )?;
        let _ = s.set_nodelay(true);
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let mut out = Vec::with_capacity(PRELOAD_WINDOW * 300);
        let mut key = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut next = 0u64;
        while next < records {
            out.clear();
            let batch_end = (next + PRELOAD_WINDOW as u64).min(records);
            for i in next..batch_end {
                key.clear();
                keys.write_key(i, &mut key);
                let len = v
                    .valuesize
                    .sample(&mut rng)
                    .round()
                    .clamp(0.0, MAX_VALUE_LEN as f64) as usize;
                protocol.encode(Op::Set, &key, len, &mut out);
            }
            s.write_all(&out)
                .map_err(|e| err(format!("sending SETs: {e}")))?;
            let mut pending = (batch_end - next) as usize;
            let (mut start, mut end) = (0usize, 0usize);
            while pending > 0 {
                match protocol.parse(Op::Set, &buf[start..end]) {
                    Ok(Some(r)) => {
                        start += r.consumed;
                        pending -= 1;
                        continue;
                    }
                    Ok(None) => {}
                    Err(e) => return Err(err(format!("malformed reply to SET: {e}"))),
                }
                if start > 0 {
                    buf.copy_within(start..end, 0);
                    end -= start;
                    start = 0;
                }
                if end == buf.len() {
                    buf.resize(buf.len() * 2, 0);
                }
                let n = match s.read(&mut buf[end..]) {
                    Ok(n) => n,
                    // A read with a timeout returns EINTR where it would otherwise restart (the
                    // io_uring probe's ring teardown runs task work on this thread, for one).
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(err(format!("reading SET replies: {e}"))),
                };
                if n == 0 {
                    return Err(err("server closed the connection".into()));
                }
                end += n;
            }
            next = batch_end;
        }
    }
    Ok(PreloadStats {
        servers: v.servers.len(),
        records_per_server: records,
        seconds: (now_ns() - started) as f64 * 1e-9,
    })
}
