//! Reading a request and writing an answer against one deadline for the whole exchange. A
//! per-read timeout resets with every byte, so a client sending one byte a second holds its
//! slot for ever; here each read waits only for what is left of the deadline.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// A stream whose reads and writes can be given a timeout (TCP and Unix sockets).
pub trait Timed: Read + Write {
    fn read_timeout_to(&self, t: Duration) -> io::Result<()>;
    fn write_timeout_to(&self, t: Duration) -> io::Result<()>;
}

impl Timed for UnixStream {
    fn read_timeout_to(&self, t: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(t))
    }
    fn write_timeout_to(&self, t: Duration) -> io::Result<()> {
        self.set_write_timeout(Some(t))
    }
}

impl Timed for std::net::TcpStream {
    fn read_timeout_to(&self, t: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(t))
    }
    fn write_timeout_to(&self, t: Duration) -> io::Result<()> {
        self.set_write_timeout(Some(t))
    }
}

fn left(deadline: Instant) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the request did not arrive whole in time",
        ));
    }
    Ok(left)
}

/// Reads until `done(bytes so far)`, the peer closes, `max` bytes, or `deadline` (an error).
/// Returns what was read (at most `max + 1` bytes, so a caller can tell "too long").
pub fn read_until<S: Timed>(
    stream: &mut S,
    deadline: Instant,
    max: usize,
    done: impl Fn(&[u8]) -> bool,
) -> io::Result<Vec<u8>> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !done(&got) && got.len() <= max {
        stream.read_timeout_to(left(deadline)?)?;
        let want = buf.len().min(max + 1 - got.len());
        match stream.read(&mut buf[..want]) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                // the socket timeout ran out: so did the deadline (give the exact error)
                left(deadline)?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Writes all of `bytes` by `deadline` (a client that does not read cannot hold the writer).
pub fn write_all_by<S: Timed>(stream: &mut S, bytes: &[u8], deadline: Instant) -> io::Result<()> {
    let mut rest = bytes;
    while !rest.is_empty() {
        stream.write_timeout_to(left(deadline)?)?;
        match stream.write(rest) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => rest = &rest[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                left(deadline)?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
