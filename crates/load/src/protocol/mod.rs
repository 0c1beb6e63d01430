//! Wire protocols of the load generator: memcached ASCII, memcached binary and RESP (redis), GET
//! and SET only.
//!
//! [`Protocol::encode`] appends one request to a reused buffer; [`Protocol::parse`] reads the
//! reply at the start of a receive buffer incrementally: `Ok(None)` while the buffer holds only
//! part of it (split anywhere), `Ok(Some(Reply))` with the bytes it used, or a
//! [`ProtocolError`]. Replies arrive in request order, so the caller passes the op of its oldest
//! outstanding request.

mod ascii;
mod binary;
mod resp;

use std::fmt;

/// Longest reply header line we wait for before calling the stream malformed (a desynchronised
/// stream would otherwise grow the receive buffer forever).
pub const MAX_LINE: usize = 4096;
/// Largest value length a reply may announce: memcached's default item size limit (`-I 1m`).
/// The value is buffered until it is whole, so a larger announcement (a desynchronised stream,
/// or a server that is not memcached) is refused at once instead of growing the buffer to it.
pub const MAX_VALUE_LEN: usize = 1 << 20;

/// A wire protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// memcached text protocol: `get k` / `set k 0 0 n`.
    MemcacheAscii,
    /// memcached binary protocol: 24-byte headers, opcodes GET 0x00 and SET 0x01.
    MemcacheBinary,
    /// Redis serialization protocol: `GET k` / `SET k v` as arrays of bulk strings.
    Resp,
}

/// A request kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Get,
    Set,
}

/// One complete reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    /// Bytes of the receive buffer this reply used.
    pub consumed: usize,
    /// GET: the key was found. SET: the value was stored (false for NOT_STORED and the like).
    pub hit: bool,
}

/// A reply that is not what the protocol allows, or a well-formed error reply from the server.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// The bytes do not follow the protocol: the stream is out of step; reopen the connection.
    #[error("malformed {protocol} reply to {op}: {what}; received {bytes}")]
    Malformed {
        protocol: Protocol,
        op: Op,
        /// What was expected and what is wrong.
        what: String,
        /// The start of the offending bytes, escaped.
        bytes: String,
    },
    /// The server answered with an error (`ERROR`, `CLIENT_ERROR …`, `SERVER_ERROR …`, a binary
    /// status other than success/not-found/not-stored, `-ERR …`). The reply was well framed:
    /// `consumed` bytes may be dropped and the connection used on.
    #[error("{protocol} server error in reply to {op}: {message}")]
    Server {
        protocol: Protocol,
        op: Op,
        /// The server's error text (or status code and text for the binary protocol).
        message: String,
        /// Length of the error reply.
        consumed: usize,
    },
}

impl ProtocolError {
    /// Bytes to drop to go on with the same connection: `Some` for a well-framed server error,
    /// `None` for a malformed stream (reopen the connection).
    pub fn consumed(&self) -> Option<usize> {
        match self {
            ProtocolError::Server { consumed, .. } => Some(*consumed),
            ProtocolError::Malformed { .. } => None,
        }
    }

    pub(crate) fn malformed(
        protocol: Protocol,
        op: Op,
        what: impl Into<String>,
        buf: &[u8],
    ) -> Self {
        ProtocolError::Malformed {
            protocol,
            op,
            what: what.into(),
            bytes: describe_bytes(buf),
        }
    }
}

/// The first bytes of `buf`, escaped, with the total length: `"VALUE k 0 x\r\n…" (312 bytes)`.
pub fn describe_bytes(buf: &[u8]) -> String {
    const SHOWN: usize = 64;
    let head: String = buf[..buf.len().min(SHOWN)].escape_ascii().to_string();
    let more = if buf.len() > SHOWN { "…" } else { "" };
    format!("\"{head}{more}\" ({} bytes)", buf.len())
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::MemcacheAscii => "memcached ASCII",
            Protocol::MemcacheBinary => "memcached binary",
            Protocol::Resp => "RESP",
        })
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::Get => "GET",
            Op::Set => "SET",
        })
    }
}

/// The bytes sent as values: printable filler (the content does not matter to the servers).
const FILLER: &[u8; 64] = b"headroom-load-value-filler-0123456789-abcdefghijklmnopqrstuvwxyz";

/// Appends `len` filler bytes.
pub(crate) fn push_filler(out: &mut Vec<u8>, len: usize) {
    out.reserve(len);
    let mut left = len;
    while left > 0 {
        let n = left.min(FILLER.len());
        out.extend_from_slice(&FILLER[..n]);
        left -= n;
    }
}

/// Appends the decimal digits of `v`.
pub(crate) fn push_decimal(out: &mut Vec<u8>, mut v: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// Position of the first `\r\n` in `buf`, looking at most [`MAX_LINE`] bytes in.
pub(crate) fn find_crlf(buf: &[u8]) -> Option<usize> {
    let limit = buf.len().min(MAX_LINE + 2);
    let mut from = 1;
    while from < limit {
        let lf = from + memchr::memchr(b'\n', &buf[from..limit])?;
        if buf[lf - 1] == b'\r' {
            return Some(lf - 1);
        }
        from = lf + 1;
    }
    None
}

/// Parses unsigned decimal digits (no sign, no spaces, no overflow).
pub(crate) fn parse_decimal(text: &[u8]) -> Option<u64> {
    if text.is_empty() || text.len() > 19 || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(
        text.iter()
            .fold(0u64, |acc, d| acc * 10 + u64::from(d - b'0')),
    )
}

/// True when `buf` could still grow into one of `starts` (or already begins with one).
pub(crate) fn could_begin_with(buf: &[u8], starts: &[&[u8]]) -> bool {
    starts.iter().any(|s| {
        let n = buf.len().min(s.len());
        buf[..n] == s[..n]
    })
}

impl Protocol {
    /// Appends the request for `op` on `key` to `out` (SET carries `value_len` filler bytes; GET
    /// ignores `value_len`). Keys are sent as given: memcached keys must be 1–250 bytes without
    /// spaces or control characters (what [`crate::dist::KeyGenerator`] makes).
    pub fn encode(&self, op: Op, key: &[u8], value_len: usize, out: &mut Vec<u8>) {
        match self {
            Protocol::MemcacheAscii => ascii::encode(op, key, value_len, out),
            Protocol::MemcacheBinary => binary::encode(op, key, value_len, out),
            Protocol::Resp => resp::encode(op, key, value_len, out),
        }
    }

    /// Reads the reply to `op` at the start of `buf`: `Ok(None)` = need more bytes.
    pub fn parse(&self, op: Op, buf: &[u8]) -> Result<Option<Reply>, ProtocolError> {
        match self {
            Protocol::MemcacheAscii => ascii::parse(op, buf),
            Protocol::MemcacheBinary => binary::parse(op, buf),
            Protocol::Resp => resp::parse(op, buf),
        }
    }

    /// The default server port of the protocol.
    pub fn default_port(&self) -> u16 {
        match self {
            Protocol::MemcacheAscii | Protocol::MemcacheBinary => 11211,
            Protocol::Resp => 6379,
        }
    }
}

#[cfg(test)]
mod tests;
