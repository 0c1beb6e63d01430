//! memcached's binary protocol: 24-byte headers, quiet variants, CAS in every reply.

use super::stats::Counters;
use super::store::{expiry_from_exptime, ArithOutcome, StoreMode, StoreOutcome, KEY_MAX_LEN};
use super::{Ctx, Step};

pub const REQUEST_MAGIC: u8 = 0x80;
pub const RESPONSE_MAGIC: u8 = 0x81;
pub const HEADER_LEN: usize = 24;

/// Opcodes (memcached `protocol_binary.h`).
pub mod op {
    pub const GET: u8 = 0x00;
    pub const SET: u8 = 0x01;
    pub const ADD: u8 = 0x02;
    pub const REPLACE: u8 = 0x03;
    pub const DELETE: u8 = 0x04;
    pub const INCREMENT: u8 = 0x05;
    pub const DECREMENT: u8 = 0x06;
    pub const QUIT: u8 = 0x07;
    pub const FLUSH: u8 = 0x08;
    pub const GETQ: u8 = 0x09;
    pub const NOOP: u8 = 0x0a;
    pub const VERSION: u8 = 0x0b;
    pub const GETK: u8 = 0x0c;
    pub const GETKQ: u8 = 0x0d;
    pub const APPEND: u8 = 0x0e;
    pub const PREPEND: u8 = 0x0f;
    pub const STAT: u8 = 0x10;
    pub const SETQ: u8 = 0x11;
    pub const ADDQ: u8 = 0x12;
    pub const REPLACEQ: u8 = 0x13;
    pub const DELETEQ: u8 = 0x14;
    pub const INCREMENTQ: u8 = 0x15;
    pub const DECREMENTQ: u8 = 0x16;
    pub const QUITQ: u8 = 0x17;
    pub const FLUSHQ: u8 = 0x18;
    pub const APPENDQ: u8 = 0x19;
    pub const PREPENDQ: u8 = 0x1a;
    pub const VERBOSITY: u8 = 0x1b;
    pub const TOUCH: u8 = 0x1c;
    pub const GAT: u8 = 0x1d;
    pub const GATQ: u8 = 0x1e;
    pub const GATK: u8 = 0x23;
    pub const GATKQ: u8 = 0x24;
}

/// Response statuses.
pub mod status {
    pub const SUCCESS: u16 = 0x00;
    pub const KEY_ENOENT: u16 = 0x01;
    pub const KEY_EEXISTS: u16 = 0x02;
    pub const E2BIG: u16 = 0x03;
    pub const EINVAL: u16 = 0x04;
    pub const NOT_STORED: u16 = 0x05;
    pub const DELTA_BADVAL: u16 = 0x06;
    pub const UNKNOWN_COMMAND: u16 = 0x81;
}

fn status_message(status: u16) -> &'static [u8] {
    match status {
        status::KEY_ENOENT => b"Not found",
        status::KEY_EEXISTS => b"Data exists for key.",
        status::E2BIG => b"Too large.",
        status::EINVAL => b"Invalid arguments",
        status::NOT_STORED => b"Not stored.",
        status::DELTA_BADVAL => b"Non-numeric server-side value for incr or decr",
        status::UNKNOWN_COMMAND => b"Unknown command",
        _ => b"",
    }
}

/// The request header fields we use.
#[derive(Debug, Clone, Copy)]
struct Header {
    opcode: u8,
    keylen: usize,
    extlen: usize,
    bodylen: usize,
    opaque: [u8; 4],
    cas: u64,
}

fn parse_header(h: &[u8]) -> Header {
    Header {
        opcode: h[1],
        keylen: u16::from_be_bytes([h[2], h[3]]) as usize,
        extlen: h[4] as usize,
        bodylen: u32::from_be_bytes([h[8], h[9], h[10], h[11]]) as usize,
        opaque: [h[12], h[13], h[14], h[15]],
        cas: u64::from_be_bytes(h[16..24].try_into().expect("8 bytes")),
    }
}

/// Appends one response packet.
#[allow(clippy::too_many_arguments)]
pub fn write_response(
    out: &mut Vec<u8>,
    opcode: u8,
    status: u16,
    opaque: [u8; 4],
    cas: u64,
    extras: &[u8],
    key: &[u8],
    value: &[u8],
) {
    let bodylen = (extras.len() + key.len() + value.len()) as u32;
    out.push(RESPONSE_MAGIC);
    out.push(opcode);
    out.extend_from_slice(&(key.len() as u16).to_be_bytes());
    out.push(extras.len() as u8);
    out.push(0); // datatype: raw bytes
    out.extend_from_slice(&status.to_be_bytes());
    out.extend_from_slice(&bodylen.to_be_bytes());
    out.extend_from_slice(&opaque);
    out.extend_from_slice(&cas.to_be_bytes());
    out.extend_from_slice(extras);
    out.extend_from_slice(key);
    out.extend_from_slice(value);
}

fn write_error(out: &mut Vec<u8>, h: &Header, status: u16) {
    write_response(
        out,
        h.opcode,
        status,
        h.opaque,
        0,
        &[],
        &[],
        status_message(status),
    );
}

/// Quiet variants suppress success replies (gets: suppress misses instead).
fn is_quiet(opcode: u8) -> bool {
    matches!(
        opcode,
        op::GETQ
            | op::GETKQ
            | op::SETQ
            | op::ADDQ
            | op::REPLACEQ
            | op::DELETEQ
            | op::INCREMENTQ
            | op::DECREMENTQ
            | op::QUITQ
            | op::FLUSHQ
            | op::APPENDQ
            | op::PREPENDQ
            | op::GATQ
            | op::GATKQ
    )
}

fn be_u32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().expect("4 bytes"))
}

fn be_u64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().expect("8 bytes"))
}

/// Parses and executes one binary request at the start of `input`.
pub(crate) fn step(input: &[u8], out: &mut Vec<u8>, ctx: &mut Ctx<'_>) -> Step {
    if input.len() < HEADER_LEN {
        return Step::NeedMore;
    }
    if input[0] != REQUEST_MAGIC {
        // A corrupt stream cannot be resynchronised: memcached closes it too.
        return Step::Done {
            consumed: input.len(),
            swallow: 0,
            close: true,
        };
    }
    let h = parse_header(&input[..HEADER_LEN]);
    let max_body = ctx.shared.max_item_bytes + 1024;
    if h.keylen + h.extlen > h.bodylen || h.keylen > KEY_MAX_LEN {
        write_error(out, &h, status::EINVAL);
        return Step::Done {
            consumed: HEADER_LEN,
            swallow: h.bodylen,
            close: false,
        };
    }
    if h.bodylen > max_body {
        write_error(out, &h, status::E2BIG);
        return Step::Done {
            consumed: HEADER_LEN,
            swallow: h.bodylen,
            close: false,
        };
    }
    let total = HEADER_LEN + h.bodylen;
    if input.len() < total {
        return Step::NeedMore;
    }
    let body = &input[HEADER_LEN..total];
    let extras = &body[..h.extlen];
    let key = &body[h.extlen..h.extlen + h.keylen];
    let value = &body[h.extlen + h.keylen..];
    let close = execute(&h, extras, key, value, out, ctx);
    ctx.request_done();
    Step::Done {
        consumed: total,
        swallow: 0,
        close,
    }
}

/// Runs one request; returns whether the connection closes afterwards.
fn execute(
    h: &Header,
    extras: &[u8],
    key: &[u8],
    value: &[u8],
    out: &mut Vec<u8>,
    ctx: &mut Ctx<'_>,
) -> bool {
    let shared = ctx.shared;
    let c = &shared.counters;
    let quiet = is_quiet(h.opcode);
    let now = shared.now_ms();
    match h.opcode {
        op::GET | op::GETQ | op::GETK | op::GETKQ | op::GAT | op::GATQ | op::GATK | op::GATKQ => {
            let is_touch = matches!(h.opcode, op::GAT | op::GATQ | op::GATK | op::GATKQ);
            let with_key = matches!(h.opcode, op::GETK | op::GETKQ | op::GATK | op::GATKQ);
            let expected_extras = if is_touch { 4 } else { 0 };
            if extras.len() != expected_extras || key.is_empty() || !value.is_empty() {
                write_error(out, h, status::EINVAL);
                return false;
            }
            let expiry = is_touch
                .then(|| expiry_from_exptime(be_u32(extras) as i64, now, super::unix_now_s()));
            let found = shared.lock_store().get(key, now, expiry, |it| {
                let k: &[u8] = if with_key { it.key } else { &[] };
                write_response(
                    out,
                    h.opcode,
                    status::SUCCESS,
                    h.opaque,
                    it.cas,
                    &it.flags.to_be_bytes(),
                    k,
                    it.value,
                );
            });
            Counters::bump(&c.cmd_get);
            if is_touch {
                Counters::bump(&c.cmd_touch);
                Counters::bump(if found {
                    &c.touch_hits
                } else {
                    &c.touch_misses
                });
            }
            if found {
                Counters::bump(&c.get_hits);
            } else {
                Counters::bump(&c.get_misses);
                if !quiet {
                    if with_key {
                        write_response(
                            out,
                            h.opcode,
                            status::KEY_ENOENT,
                            h.opaque,
                            0,
                            &[],
                            key,
                            &[],
                        );
                    } else {
                        write_error(out, h, status::KEY_ENOENT);
                    }
                }
            }
            false
        }
        op::SET | op::SETQ | op::ADD | op::ADDQ | op::REPLACE | op::REPLACEQ => {
            if extras.len() != 8 || key.is_empty() {
                write_error(out, h, status::EINVAL);
                return false;
            }
            let mode = match h.opcode {
                op::SET | op::SETQ => StoreMode::Set,
                op::ADD | op::ADDQ => StoreMode::Add,
                _ => StoreMode::Replace,
            };
            let flags = be_u32(&extras[0..4]);
            let expires =
                expiry_from_exptime(be_u32(&extras[4..8]) as i64, now, super::unix_now_s());
            // add with a CAS is meaningless: memcached ignores it (the item must not exist).
            let cas_check = if mode == StoreMode::Add { 0 } else { h.cas };
            let outcome = shared
                .lock_store()
                .store(mode, key, flags, expires, value, cas_check, now);
            Counters::bump(&c.cmd_set);
            store_reply(h, mode, outcome, quiet, out);
            false
        }
        op::APPEND | op::APPENDQ | op::PREPEND | op::PREPENDQ => {
            if !extras.is_empty() || key.is_empty() {
                write_error(out, h, status::EINVAL);
                return false;
            }
            let mode = if matches!(h.opcode, op::APPEND | op::APPENDQ) {
                StoreMode::Append
            } else {
                StoreMode::Prepend
            };
            let outcome = shared
                .lock_store()
                .store(mode, key, 0, 0, value, h.cas, now);
            Counters::bump(&c.cmd_set);
            store_reply(h, mode, outcome, quiet, out);
            false
        }
        op::DELETE | op::DELETEQ => {
            if !extras.is_empty() || key.is_empty() || !value.is_empty() {
                write_error(out, h, status::EINVAL);
                return false;
            }
            match shared.lock_store().delete(key, h.cas, now) {
                Ok(true) => {
                    Counters::bump(&c.delete_hits);
                    if !quiet {
                        write_response(out, h.opcode, status::SUCCESS, h.opaque, 0, &[], &[], &[]);
                    }
                }
                Ok(false) => {
                    Counters::bump(&c.delete_misses);
                    write_error(out, h, status::KEY_ENOENT);
                }
                Err(_) => write_error(out, h, status::KEY_EEXISTS),
            }
            false
        }
        op::INCREMENT | op::INCREMENTQ | op::DECREMENT | op::DECREMENTQ => {
            if extras.len() != 20 || key.is_empty() || !value.is_empty() {
                write_error(out, h, status::EINVAL);
                return false;
            }
            let incr = matches!(h.opcode, op::INCREMENT | op::INCREMENTQ);
            let delta = be_u64(&extras[0..8]);
            let initial = be_u64(&extras[8..16]);
            let exptime = be_u32(&extras[16..20]);
            // An expiration of all ones means "do not create a missing key".
            let create = (exptime != u32::MAX).then(|| {
                (
                    initial,
                    expiry_from_exptime(exptime as i64, now, super::unix_now_s()),
                )
            });
            let outcome = shared
                .lock_store()
                .arith(key, incr, delta, create, h.cas, now);
            let (hits, misses) = if incr {
                (&c.incr_hits, &c.incr_misses)
            } else {
                (&c.decr_hits, &c.decr_misses)
            };
            match outcome {
                ArithOutcome::Value { value, cas } => {
                    Counters::bump(hits);
                    if !quiet {
                        write_response(
                            out,
                            h.opcode,
                            status::SUCCESS,
                            h.opaque,
                            cas,
                            &[],
                            &[],
                            &value.to_be_bytes(),
                        );
                    }
                }
                ArithOutcome::NotFound => {
                    Counters::bump(misses);
                    write_error(out, h, status::KEY_ENOENT);
                }
                ArithOutcome::NonNumeric => write_error(out, h, status::DELTA_BADVAL),
                ArithOutcome::Exists => write_error(out, h, status::KEY_EEXISTS),
            }
            false
        }
        op::TOUCH => {
            if extras.len() != 4 || key.is_empty() || !value.is_empty() {
                write_error(out, h, status::EINVAL);
                return false;
            }
            let expires = expiry_from_exptime(be_u32(extras) as i64, now, super::unix_now_s());
            let found = shared.lock_store().touch(key, expires, now);
            Counters::bump(&c.cmd_touch);
            if found {
                Counters::bump(&c.touch_hits);
                write_response(out, h.opcode, status::SUCCESS, h.opaque, 0, &[], &[], &[]);
            } else {
                Counters::bump(&c.touch_misses);
                write_error(out, h, status::KEY_ENOENT);
            }
            false
        }
        op::FLUSH | op::FLUSHQ => {
            if !(extras.is_empty() || extras.len() == 4) || !key.is_empty() || !value.is_empty() {
                write_error(out, h, status::EINVAL);
                return false;
            }
            let delay_s = if extras.len() == 4 {
                be_u32(extras) as u64
            } else {
                0
            };
            shared.lock_store().flush(now, delay_s * 1000);
            Counters::bump(&c.cmd_flush);
            if !quiet {
                write_response(out, h.opcode, status::SUCCESS, h.opaque, 0, &[], &[], &[]);
            }
            false
        }
        op::NOOP => {
            write_response(out, h.opcode, status::SUCCESS, h.opaque, 0, &[], &[], &[]);
            false
        }
        op::VERSION => {
            write_response(
                out,
                h.opcode,
                status::SUCCESS,
                h.opaque,
                0,
                &[],
                &[],
                super::VERSION.as_bytes(),
            );
            false
        }
        op::VERBOSITY => {
            write_response(out, h.opcode, status::SUCCESS, h.opaque, 0, &[], &[], &[]);
            false
        }
        op::QUIT | op::QUITQ => {
            if !quiet {
                write_response(out, h.opcode, status::SUCCESS, h.opaque, 0, &[], &[], &[]);
            }
            true
        }
        op::STAT => {
            let pairs: Vec<(String, String)> = match key {
                b"" => shared
                    .stats_snapshot()
                    .pairs
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect(),
                b"reset" => {
                    c.reset();
                    Vec::new()
                }
                b"settings" => shared
                    .settings()
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect(),
                _ => {
                    write_error(out, h, status::KEY_ENOENT);
                    return false;
                }
            };
            for (k, v) in pairs {
                write_response(
                    out,
                    h.opcode,
                    status::SUCCESS,
                    h.opaque,
                    0,
                    &[],
                    k.as_bytes(),
                    v.as_bytes(),
                );
            }
            write_response(out, h.opcode, status::SUCCESS, h.opaque, 0, &[], &[], &[]);
            false
        }
        _ => {
            write_error(out, h, status::UNKNOWN_COMMAND);
            false
        }
    }
}

fn store_reply(h: &Header, mode: StoreMode, outcome: StoreOutcome, quiet: bool, out: &mut Vec<u8>) {
    match outcome {
        StoreOutcome::Stored { cas } => {
            if !quiet {
                write_response(out, h.opcode, status::SUCCESS, h.opaque, cas, &[], &[], &[]);
            }
        }
        StoreOutcome::NotStored => {
            let st = match mode {
                StoreMode::Add => status::KEY_EEXISTS,
                StoreMode::Replace => status::KEY_ENOENT,
                _ => status::NOT_STORED,
            };
            write_error(out, h, st);
        }
        StoreOutcome::Exists => write_error(out, h, status::KEY_EEXISTS),
        StoreOutcome::NotFound => write_error(out, h, status::KEY_ENOENT),
        StoreOutcome::TooLarge => write_error(out, h, status::E2BIG),
    }
}
