//! memcached binary protocol: 24-byte header (magic, opcode, key length, extras length, data type,
//! vbucket/status, total body length, opaque, CAS), then extras, key and value. Requests use magic
//! 0x80, replies 0x81; GET is opcode 0x00, SET 0x01 (8 bytes of extras: flags and expiry).

use super::{describe_bytes, Op, Protocol, ProtocolError, Reply, MAX_VALUE_LEN};

const P: Protocol = Protocol::MemcacheBinary;
/// Header length.
pub const HEADER_LEN: usize = 24;
const REQUEST_MAGIC: u8 = 0x80;
const RESPONSE_MAGIC: u8 = 0x81;
const OPCODE_GET: u8 = 0x00;
const OPCODE_SET: u8 = 0x01;
const STATUS_OK: u16 = 0x0000;
const STATUS_KEY_NOT_FOUND: u16 = 0x0001;
const STATUS_KEY_EXISTS: u16 = 0x0002;
const STATUS_NOT_STORED: u16 = 0x0005;
/// Longest body a reply may announce: the largest value plus room for key and extras.
const MAX_BODY: usize = MAX_VALUE_LEN + 64 * 1024;

fn opcode(op: Op) -> u8 {
    match op {
        Op::Get => OPCODE_GET,
        Op::Set => OPCODE_SET,
    }
}

fn header(out: &mut Vec<u8>, op: Op, key_len: u16, extras_len: u8, body_len: u32) {
    out.push(REQUEST_MAGIC);
    out.push(opcode(op));
    out.extend_from_slice(&key_len.to_be_bytes());
    out.push(extras_len);
    out.push(0); // data type: raw bytes
    out.extend_from_slice(&0u16.to_be_bytes()); // vbucket
    out.extend_from_slice(&body_len.to_be_bytes());
    out.extend_from_slice(&0u32.to_be_bytes()); // opaque
    out.extend_from_slice(&0u64.to_be_bytes()); // CAS
}

pub(super) fn encode(op: Op, key: &[u8], value_len: usize, out: &mut Vec<u8>) {
    // memcached keys are at most 250 bytes; the header's 16-bit field cannot say more.
    let key = &key[..key.len().min(usize::from(u16::MAX))];
    let key_len = key.len() as u16;
    match op {
        Op::Get => {
            header(out, op, key_len, 0, u32::from(key_len));
            out.extend_from_slice(key);
        }
        Op::Set => {
            let value_len = value_len.min(MAX_VALUE_LEN);
            header(out, op, key_len, 8, (8 + key.len() + value_len) as u32);
            out.extend_from_slice(&0u32.to_be_bytes()); // flags
            out.extend_from_slice(&0u32.to_be_bytes()); // expiry: never
            out.extend_from_slice(key);
            super::push_filler(out, value_len);
        }
    }
}

fn status_name(status: u16) -> &'static str {
    match status {
        0x0002 => "key exists",
        0x0003 => "value too large",
        0x0004 => "invalid arguments",
        0x0005 => "item not stored",
        0x0006 => "incr/decr on non-numeric value",
        0x0007 => "vbucket belongs to another server",
        0x0008 => "authentication error",
        0x0009 => "authentication continue",
        0x0081 => "unknown command",
        0x0082 => "out of memory",
        0x0083 => "not supported",
        0x0084 => "internal error",
        0x0085 => "busy",
        0x0086 => "temporary failure",
        _ => "unknown status",
    }
}

pub(super) fn parse(op: Op, buf: &[u8]) -> Result<Option<Reply>, ProtocolError> {
    if let Some(&magic) = buf.first() {
        if magic != RESPONSE_MAGIC {
            return Err(ProtocolError::malformed(
                P,
                op,
                format!("expected response magic 0x81, got 0x{magic:02x}"),
                buf,
            ));
        }
    }
    if let Some(&code) = buf.get(1) {
        if code != opcode(op) {
            return Err(ProtocolError::malformed(
                P,
                op,
                format!("expected opcode 0x{:02x}, got 0x{code:02x}", opcode(op)),
                buf,
            ));
        }
    }
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let key_len = usize::from(u16::from_be_bytes([buf[2], buf[3]]));
    let extras_len = usize::from(buf[4]);
    let status = u16::from_be_bytes([buf[6], buf[7]]);
    let body_len = u32::from_be_bytes([buf[8], buf[9], buf[10], buf[11]]) as usize;
    if body_len > MAX_BODY || key_len + extras_len > body_len {
        return Err(ProtocolError::malformed(
            P,
            op,
            format!(
                "body length {body_len} is inconsistent (key {key_len} + extras {extras_len}, \
                 at most {MAX_BODY})"
            ),
            buf,
        ));
    }
    let total = HEADER_LEN + body_len;
    if buf.len() < total {
        return Ok(None);
    }
    let hit = match status {
        STATUS_OK => true,
        STATUS_KEY_NOT_FOUND | STATUS_KEY_EXISTS | STATUS_NOT_STORED => false,
        other => {
            let text = &buf[HEADER_LEN + extras_len + key_len..total];
            return Err(ProtocolError::Server {
                protocol: P,
                op,
                message: format!(
                    "status 0x{other:04x} ({}): {}",
                    status_name(other),
                    describe_bytes(text)
                ),
                consumed: total,
            });
        }
    };
    Ok(Some(Reply {
        consumed: total,
        hit,
    }))
}
