//! One client connection: nonblocking socket, input and output buffers, protocol detection, and
//! the drive loop that reads, executes and writes without ever blocking the worker thread.

use std::io::{self, Read, Write};
use std::net::TcpStream;

use super::stats::Counters;
use super::{ascii, binary, Ctx, Step};

/// Pending output above which the connection stops reading (a client that does not read its
/// replies only ever costs this much memory and never blocks the others).
pub const OUTPUT_HIGH_WATER: usize = 1 << 20;

const READ_CHUNK: usize = 16 * 1024;

/// Reads per readiness event before yielding to other connections (fairness).
const MAX_READS_PER_EVENT: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proto {
    Unknown,
    Ascii,
    Binary,
}

/// What the event loop must wait for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interest {
    Read,
    ReadWrite,
    /// Output is backed up (or the connection is closing): wait until it drains.
    Write,
}

/// Result of driving a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drive {
    Keep(Interest),
    Close,
}

pub struct Conn {
    pub stream: TcpStream,
    rbuf: Vec<u8>,
    rstart: usize,
    wbuf: Vec<u8>,
    wstart: usize,
    proto: Proto,
    swallow: usize,
    closing: bool,
    /// Complete requests are waiting in the input buffer (processing paused on backed-up
    /// output); they must be executed without waiting for new input.
    backlog: bool,
    /// What the poller is currently armed with (static dispatch re-arms only on change).
    pub registered: Interest,
}

impl Conn {
    pub fn new(stream: TcpStream) -> Self {
        Conn {
            stream,
            rbuf: Vec::with_capacity(READ_CHUNK),
            rstart: 0,
            wbuf: Vec::new(),
            wstart: 0,
            proto: Proto::Unknown,
            swallow: 0,
            closing: false,
            backlog: false,
            registered: Interest::Read,
        }
    }

    fn pending_output(&self) -> usize {
        self.wbuf.len() - self.wstart
    }

    /// Executes every complete request in the input buffer (until output backs up).
    fn process(&mut self, ctx: &mut Ctx<'_>) {
        self.backlog = false;
        while !self.closing {
            if self.pending_output() >= OUTPUT_HIGH_WATER {
                self.backlog = self.rbuf.len() > self.rstart;
                break;
            }
            let avail = self.rbuf.len() - self.rstart;
            if self.swallow > 0 {
                let n = self.swallow.min(avail);
                self.rstart += n;
                self.swallow -= n;
                if self.swallow > 0 {
                    break;
                }
                continue;
            }
            if avail == 0 {
                break;
            }
            if self.proto == Proto::Unknown {
                // memcached picks the protocol from a connection's first byte.
                self.proto = if self.rbuf[self.rstart] == binary::REQUEST_MAGIC {
                    Proto::Binary
                } else {
                    Proto::Ascii
                };
            }
            let input = &self.rbuf[self.rstart..];
            let step = match self.proto {
                Proto::Binary => binary::step(input, &mut self.wbuf, ctx),
                _ => ascii::step(input, &mut self.wbuf, ctx),
            };
            match step {
                Step::NeedMore => break,
                Step::Done {
                    consumed,
                    swallow,
                    close,
                } => {
                    self.rstart += consumed;
                    self.swallow = swallow;
                    self.closing |= close;
                }
            }
        }
        if self.rstart == self.rbuf.len() {
            self.rbuf.clear();
            self.rstart = 0;
        } else if self.rstart >= READ_CHUNK {
            self.rbuf.drain(..self.rstart);
            self.rstart = 0;
        }
    }

    /// Writes pending output until the socket would block.
    fn flush(&mut self, counters: &Counters) -> io::Result<()> {
        while self.wstart < self.wbuf.len() {
            match self.stream.write(&self.wbuf[self.wstart..]) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
                Ok(n) => {
                    self.wstart += n;
                    Counters::add(&counters.bytes_written, n as u64);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if self.wstart == self.wbuf.len() {
            self.wbuf.clear();
            self.wstart = 0;
        }
        Ok(())
    }

    /// Reads once; Ok(None) = would block, Ok(Some(0)) = peer closed.
    fn fill(&mut self, counters: &Counters) -> io::Result<Option<usize>> {
        let old = self.rbuf.len();
        self.rbuf.resize(old + READ_CHUNK, 0);
        let r = self.stream.read(&mut self.rbuf[old..]);
        let n = match r {
            Ok(n) => n,
            Err(e) => {
                self.rbuf.truncate(old);
                return match e.kind() {
                    io::ErrorKind::WouldBlock => Ok(None),
                    io::ErrorKind::Interrupted => Ok(Some(usize::MAX)),
                    _ => Err(e),
                };
            }
        };
        self.rbuf.truncate(old + n);
        Counters::add(&counters.bytes_read, n as u64);
        Ok(Some(n))
    }

    fn interest(&self) -> Interest {
        let pending = self.pending_output();
        if self.closing || pending >= OUTPUT_HIGH_WATER {
            Interest::Write
        } else if pending > 0 || self.backlog {
            // With a backlog, EPOLLOUT fires at once and brings us back to execute it.
            Interest::ReadWrite
        } else {
            Interest::Read
        }
    }

    /// Handles one readiness event: flush, execute buffered requests, read more, repeat a
    /// bounded number of times.
    pub fn drive(&mut self, ctx: &mut Ctx<'_>) -> Drive {
        let counters = &ctx.shared.counters;
        for _ in 0..MAX_READS_PER_EVENT {
            self.process(ctx);
            if self.flush(counters).is_err() {
                return Drive::Close;
            }
            if self.closing {
                return if self.pending_output() == 0 {
                    Drive::Close
                } else {
                    Drive::Keep(Interest::Write)
                };
            }
            if self.pending_output() >= OUTPUT_HIGH_WATER {
                return Drive::Keep(Interest::Write);
            }
            if self.backlog {
                // Output drained below the mark: execute the waiting requests before reading.
                continue;
            }
            match self.fill(counters) {
                Ok(None) => return Drive::Keep(self.interest()),
                Ok(Some(0)) => {
                    // Peer closed its side: answer what is complete, then close.
                    self.process(ctx);
                    let _ = self.flush(counters);
                    return Drive::Close;
                }
                Ok(Some(_)) => {}
                Err(_) => return Drive::Close,
            }
        }
        self.process(ctx);
        if self.flush(counters).is_err() {
            return Drive::Close;
        }
        Drive::Keep(self.interest())
    }
}
