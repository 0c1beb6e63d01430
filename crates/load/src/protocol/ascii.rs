//! memcached text protocol: `get <key>\r\n` → `VALUE <key> <flags> <bytes>[ <cas>]\r\n<data>\r\nEND\r\n`
//! or `END\r\n`; `set <key> 0 0 <bytes>\r\n<data>\r\n` → `STORED\r\n` (or `NOT_STORED`, `EXISTS`,
//! `NOT_FOUND`); any command → `ERROR`, `CLIENT_ERROR <msg>`, `SERVER_ERROR <msg>`.

use super::{
    could_begin_with, find_crlf, parse_decimal, push_decimal, push_filler, Op, Protocol,
    ProtocolError, Reply, MAX_LINE, MAX_VALUE_LEN,
};

const P: Protocol = Protocol::MemcacheAscii;
const END: &[u8] = b"END\r\n";

pub(super) fn encode(op: Op, key: &[u8], value_len: usize, out: &mut Vec<u8>) {
    match op {
        Op::Get => {
            out.extend_from_slice(b"get ");
            out.extend_from_slice(key);
            out.extend_from_slice(b"\r\n");
        }
        Op::Set => {
            out.extend_from_slice(b"set ");
            out.extend_from_slice(key);
            out.extend_from_slice(b" 0 0 ");
            push_decimal(out, value_len as u64);
            out.extend_from_slice(b"\r\n");
            push_filler(out, value_len);
            out.extend_from_slice(b"\r\n");
        }
    }
}

/// Error replies any command may get.
fn error_reply(op: Op, line: &[u8], consumed: usize) -> Option<ProtocolError> {
    let is_error = line == b"ERROR"
        || line.starts_with(b"ERROR ")
        || line.starts_with(b"CLIENT_ERROR")
        || line.starts_with(b"SERVER_ERROR");
    is_error.then(|| ProtocolError::Server {
        protocol: P,
        op,
        message: String::from_utf8_lossy(line).into_owned(),
        consumed,
    })
}

pub(super) fn parse(op: Op, buf: &[u8]) -> Result<Option<Reply>, ProtocolError> {
    let starts: &[&[u8]] = match op {
        Op::Get => &[
            b"VALUE ",
            b"END\r\n",
            b"ERROR",
            b"CLIENT_ERROR",
            b"SERVER_ERROR",
        ],
        Op::Set => &[
            b"STORED\r\n",
            b"NOT_STORED\r\n",
            b"EXISTS\r\n",
            b"NOT_FOUND\r\n",
            b"ERROR",
            b"CLIENT_ERROR",
            b"SERVER_ERROR",
        ],
    };
    let common: &[u8] = match op {
        Op::Get => b"VALUE ",
        Op::Set => b"STORED\r\n",
    };
    if !buf.starts_with(common) && !could_begin_with(buf, starts) {
        return Err(ProtocolError::malformed(
            P,
            op,
            format!("expected a reply starting with one of {}", list(starts)),
            buf,
        ));
    }
    let Some(eol) = find_crlf(buf) else {
        if buf.len() > MAX_LINE {
            return Err(ProtocolError::malformed(
                P,
                op,
                format!("no line end within {MAX_LINE} bytes"),
                buf,
            ));
        }
        return Ok(None);
    };
    let line = &buf[..eol];
    let after_line = eol + 2;
    if let Some(err) = error_reply(op, line, after_line) {
        return Err(err);
    }
    match op {
        Op::Set => match line {
            b"STORED" => Ok(Some(Reply {
                consumed: after_line,
                hit: true,
            })),
            b"NOT_STORED" | b"EXISTS" | b"NOT_FOUND" => Ok(Some(Reply {
                consumed: after_line,
                hit: false,
            })),
            _ => Err(ProtocolError::malformed(
                P,
                op,
                "expected STORED, NOT_STORED, EXISTS or NOT_FOUND",
                buf,
            )),
        },
        Op::Get => {
            if line == b"END" {
                return Ok(Some(Reply {
                    consumed: after_line,
                    hit: false,
                }));
            }
            let Some(fields) = line.strip_prefix(b"VALUE ") else {
                return Err(ProtocolError::malformed(
                    P,
                    op,
                    "expected \"VALUE <key> <flags> <bytes>\" or \"END\"",
                    buf,
                ));
            };
            // "<key> <flags> <bytes>[ <cas>]", no allocation: this is the hot path.
            let mut parts = fields.split(|&b| b == b' ');
            let (key, flags, bytes) = (parts.next(), parts.next(), parts.next());
            let cas = parts.next();
            let valid = key.is_some_and(|k| !k.is_empty())
                && flags
                    .and_then(parse_decimal)
                    .is_some_and(|f| f <= u64::from(u32::MAX))
                && cas.is_none_or(|c| parse_decimal(c).is_some())
                && parts.next().is_none();
            let len = bytes
                .and_then(parse_decimal)
                .filter(|&n| n as usize <= MAX_VALUE_LEN);
            let (true, Some(len)) = (valid, len) else {
                return Err(ProtocolError::malformed(
                    P,
                    op,
                    format!(
                        "expected \"VALUE <key> <flags> <bytes>[ <cas>]\" with bytes <= {MAX_VALUE_LEN}"
                    ),
                    buf,
                ));
            };
            let data_end = after_line + len as usize;
            let total = data_end + 2 + END.len();
            // Check the trailer bytes already here, so a short value is caught early.
            let trailer = b"\r\nEND\r\n";
            let have = &buf[data_end.min(buf.len())..total.min(buf.len())];
            if have != &trailer[..have.len()] {
                return Err(ProtocolError::malformed(
                    P,
                    op,
                    format!("expected \"\\r\\nEND\\r\\n\" after the {len}-byte value"),
                    buf,
                ));
            }
            if buf.len() < total {
                return Ok(None);
            }
            Ok(Some(Reply {
                consumed: total,
                hit: true,
            }))
        }
    }
}

fn list(starts: &[&[u8]]) -> String {
    starts
        .iter()
        .map(|s| s.trim_ascii_end().escape_ascii().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
