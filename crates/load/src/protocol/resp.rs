//! RESP (redis): requests are arrays of bulk strings (`*2\r\n$3\r\nGET\r\n$<n>\r\n<key>\r\n`);
//! GET → bulk string `$<n>\r\n<data>\r\n` (hit) or null `$-1\r\n` / RESP3 `_\r\n` (miss);
//! SET → `+OK\r\n` (or null when not stored); `-<message>\r\n` is an error reply.

use super::{
    find_crlf, parse_decimal, push_decimal, push_filler, Op, Protocol, ProtocolError, Reply,
    MAX_LINE, MAX_VALUE_LEN,
};

const P: Protocol = Protocol::Resp;

fn bulk(out: &mut Vec<u8>, bytes: &[u8]) {
    out.push(b'$');
    push_decimal(out, bytes.len() as u64);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

pub(super) fn encode(op: Op, key: &[u8], value_len: usize, out: &mut Vec<u8>) {
    match op {
        Op::Get => {
            out.extend_from_slice(b"*2\r\n$3\r\nGET\r\n");
            bulk(out, key);
        }
        Op::Set => {
            out.extend_from_slice(b"*3\r\n$3\r\nSET\r\n");
            bulk(out, key);
            out.push(b'$');
            push_decimal(out, value_len as u64);
            out.extend_from_slice(b"\r\n");
            push_filler(out, value_len);
            out.extend_from_slice(b"\r\n");
        }
    }
}

pub(super) fn parse(op: Op, buf: &[u8]) -> Result<Option<Reply>, ProtocolError> {
    let Some(&kind) = buf.first() else {
        return Ok(None);
    };
    let expected = match op {
        Op::Get => "a bulk string ($), null (_) or error (-)",
        Op::Set => "+OK, null or error (-)",
    };
    let allowed: &[u8] = match op {
        Op::Get => b"$_-",
        Op::Set => b"+$_-",
    };
    if !allowed.contains(&kind) {
        return Err(ProtocolError::malformed(
            P,
            op,
            format!("expected {expected}"),
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
    let line = &buf[1..eol];
    let after_line = eol + 2;
    let reply = |consumed, hit| Ok(Some(Reply { consumed, hit }));
    match kind {
        b'-' => Err(ProtocolError::Server {
            protocol: P,
            op,
            message: String::from_utf8_lossy(line).into_owned(),
            consumed: after_line,
        }),
        b'_' if line.is_empty() => reply(after_line, false),
        b'+' if line == b"OK" => reply(after_line, true),
        b'$' if line == b"-1" => reply(after_line, false),
        b'$' if op == Op::Get => {
            let Some(len) = parse_decimal(line).filter(|&n| n as usize <= MAX_VALUE_LEN) else {
                return Err(ProtocolError::malformed(
                    P,
                    op,
                    format!("expected a bulk length -1 or 0..={MAX_VALUE_LEN}"),
                    buf,
                ));
            };
            let data_end = after_line + len as usize;
            let total = data_end + 2;
            let have = &buf[data_end.min(buf.len())..total.min(buf.len())];
            if have != &b"\r\n"[..have.len()] {
                return Err(ProtocolError::malformed(
                    P,
                    op,
                    format!("expected \"\\r\\n\" after the {len}-byte bulk string"),
                    buf,
                ));
            }
            if buf.len() < total {
                return Ok(None);
            }
            reply(total, true)
        }
        _ => Err(ProtocolError::malformed(
            P,
            op,
            format!("expected {expected}"),
            buf,
        )),
    }
}
