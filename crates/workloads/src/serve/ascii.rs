//! memcached's ASCII protocol: parse one command from the connection's input, execute it against
//! the store, append the reply. Replies and error strings are memcached 1.6's.

use std::io::Write as _;

use super::stats::Counters;
use super::store::{expiry_from_exptime, ArithOutcome, StoreMode, StoreOutcome, KEY_MAX_LEN};
use super::{Ctx, Step};

/// Longest command line accepted (multi-get lines can be long); longer input closes the
/// connection after `CLIENT_ERROR line too long`.
pub const MAX_LINE: usize = 64 * 1024;

const BAD_FORMAT: &[u8] = b"CLIENT_ERROR bad command line format\r\n";

fn done(consumed: usize) -> Step {
    Step::Done {
        consumed,
        swallow: 0,
        close: false,
    }
}

/// Parses and executes one command at the start of `input`.
pub(crate) fn step(input: &[u8], out: &mut Vec<u8>, ctx: &mut Ctx<'_>) -> Step {
    let Some(nl) = input.iter().position(|&b| b == b'\n') else {
        if input.len() > MAX_LINE {
            out.extend_from_slice(b"CLIENT_ERROR line too long\r\n");
            return Step::Done {
                consumed: input.len(),
                swallow: 0,
                close: true,
            };
        }
        return Step::NeedMore;
    };
    let line_end = if nl > 0 && input[nl - 1] == b'\r' {
        nl - 1
    } else {
        nl
    };
    let line = &input[..line_end];
    let after = nl + 1;
    let tokens: Vec<&[u8]> = line
        .split(|&b| b == b' ')
        .filter(|t| !t.is_empty())
        .collect();
    let Some(&cmd) = tokens.first() else {
        out.extend_from_slice(b"ERROR\r\n");
        return done(after);
    };
    let step = match cmd {
        b"get" => retrieve(&tokens[1..], false, None, out, ctx, after),
        b"gets" => retrieve(&tokens[1..], true, None, out, ctx, after),
        b"gat" | b"gats" => {
            if tokens.len() < 3 {
                out.extend_from_slice(b"ERROR\r\n");
                return done(after);
            }
            let Some(exptime) = parse_num::<i64>(tokens[1]) else {
                out.extend_from_slice(b"CLIENT_ERROR invalid exptime argument\r\n");
                return done(after);
            };
            Counters::add(&ctx.shared.counters.cmd_touch, (tokens.len() - 2) as u64);
            retrieve(&tokens[2..], cmd == b"gats", Some(exptime), out, ctx, after)
        }
        b"set" => storage(StoreMode::Set, false, &tokens, input, after, out, ctx),
        b"add" => storage(StoreMode::Add, false, &tokens, input, after, out, ctx),
        b"replace" => storage(StoreMode::Replace, false, &tokens, input, after, out, ctx),
        b"append" => storage(StoreMode::Append, false, &tokens, input, after, out, ctx),
        b"prepend" => storage(StoreMode::Prepend, false, &tokens, input, after, out, ctx),
        b"cas" => storage(StoreMode::Set, true, &tokens, input, after, out, ctx),
        b"delete" => delete(&tokens, out, ctx, after),
        b"incr" => arith(true, &tokens, out, ctx, after),
        b"decr" => arith(false, &tokens, out, ctx, after),
        b"touch" => touch(&tokens, out, ctx, after),
        b"flush_all" => flush_all(&tokens, out, ctx, after),
        b"stats" => stats(&tokens, out, ctx, after),
        b"version" => {
            // memcached 1.6 ignores extra arguments here.
            let _ = write!(out, "VERSION {}\r\n", super::VERSION);
            done(after)
        }
        b"verbosity" => verbosity(&tokens, out, after),
        b"quit" => Step::Done {
            consumed: after,
            swallow: 0,
            close: true,
        },
        _ => {
            out.extend_from_slice(b"ERROR\r\n");
            done(after)
        }
    };
    if matches!(step, Step::Done { .. }) && cmd != b"quit" {
        ctx.request_done();
    }
    step
}

fn parse_num<T: std::str::FromStr>(t: &[u8]) -> Option<T> {
    std::str::from_utf8(t).ok()?.parse().ok()
}

/// Splits a trailing `noreply` off the arguments.
fn split_noreply<'a, 'b>(tokens: &'a [&'b [u8]]) -> (&'a [&'b [u8]], bool) {
    match tokens.split_last() {
        Some((&last, rest)) if last == b"noreply" => (rest, true),
        _ => (tokens, false),
    }
}

fn reply(out: &mut Vec<u8>, noreply: bool, msg: &[u8]) {
    if !noreply {
        out.extend_from_slice(msg);
    }
}

fn retrieve(
    keys: &[&[u8]],
    with_cas: bool,
    touch_exptime: Option<i64>,
    out: &mut Vec<u8>,
    ctx: &mut Ctx<'_>,
    after: usize,
) -> Step {
    if keys.is_empty() {
        out.extend_from_slice(b"ERROR\r\n");
        return done(after);
    }
    if keys.iter().any(|k| k.len() > KEY_MAX_LEN) {
        out.extend_from_slice(BAD_FORMAT);
        return done(after);
    }
    let shared = ctx.shared;
    let now = shared.now_ms();
    let expiry = touch_exptime.map(|e| expiry_from_exptime(e, now, super::unix_now_s()));
    let (mut hits, mut misses) = (0u64, 0u64);
    {
        let mut store = shared.lock_store();
        for key in keys {
            let found = store.get(key, now, expiry, |it| {
                out.extend_from_slice(b"VALUE ");
                out.extend_from_slice(it.key);
                if with_cas {
                    let _ = write!(out, " {} {} {}\r\n", it.flags, it.value.len(), it.cas);
                } else {
                    let _ = write!(out, " {} {}\r\n", it.flags, it.value.len());
                }
                out.extend_from_slice(it.value);
                out.extend_from_slice(b"\r\n");
            });
            if found {
                hits += 1;
            } else {
                misses += 1;
            }
        }
    }
    let c = &shared.counters;
    Counters::add(&c.cmd_get, hits + misses);
    if touch_exptime.is_some() {
        Counters::add(&c.touch_hits, hits);
        Counters::add(&c.touch_misses, misses);
    }
    Counters::add(&c.get_hits, hits);
    Counters::add(&c.get_misses, misses);
    out.extend_from_slice(b"END\r\n");
    done(after)
}

fn storage(
    mode: StoreMode,
    is_cas: bool,
    tokens: &[&[u8]],
    input: &[u8],
    after: usize,
    out: &mut Vec<u8>,
    ctx: &mut Ctx<'_>,
) -> Step {
    let (args, noreply) = split_noreply(&tokens[1..]);
    let want = if is_cas { 5 } else { 4 };
    if args.len() != want {
        out.extend_from_slice(b"ERROR\r\n");
        return done(after);
    }
    let key = args[0];
    let flags = parse_num::<u32>(args[1]);
    let exptime = parse_num::<i64>(args[2]);
    let len = parse_num::<i64>(args[3]);
    let cas_in = if is_cas {
        parse_num::<u64>(args[4])
    } else {
        Some(0)
    };
    let (Some(flags), Some(exptime), Some(len), Some(cas_in)) = (flags, exptime, len, cas_in)
    else {
        out.extend_from_slice(BAD_FORMAT);
        return done(after);
    };
    if key.len() > KEY_MAX_LEN || !(0..i32::MAX as i64 - 2).contains(&len) {
        out.extend_from_slice(BAD_FORMAT);
        return done(after);
    }
    let len = len as usize;
    let shared = ctx.shared;
    if len > shared.max_value_len(key.len()) {
        // memcached swallows the data block of a refused item so the stream stays in sync.
        Counters::bump(&shared.counters.cmd_set);
        out.extend_from_slice(b"SERVER_ERROR object too large for cache\r\n");
        return Step::Done {
            consumed: after,
            swallow: len + 2,
            close: false,
        };
    }
    if input.len() < after + len + 2 {
        return Step::NeedMore;
    }
    let consumed = after + len + 2;
    if &input[after + len..consumed] != b"\r\n" {
        out.extend_from_slice(b"CLIENT_ERROR bad data chunk\r\n");
        return done(consumed);
    }
    let data = &input[after..after + len];
    let now = shared.now_ms();
    let expires = expiry_from_exptime(exptime, now, super::unix_now_s());
    // `cas` with unique 0 never matches an item (uniques start at 1).
    let cas_check = match (is_cas, cas_in) {
        (false, _) => 0,
        (true, 0) => u64::MAX,
        (true, c) => c,
    };
    let outcome = shared
        .lock_store()
        .store(mode, key, flags, expires, data, cas_check, now);
    let c = &shared.counters;
    Counters::bump(&c.cmd_set);
    if is_cas {
        match outcome {
            StoreOutcome::Stored { .. } => Counters::bump(&c.cas_hits),
            StoreOutcome::Exists => Counters::bump(&c.cas_badval),
            StoreOutcome::NotFound => Counters::bump(&c.cas_misses),
            _ => {}
        }
    }
    match outcome {
        StoreOutcome::Stored { .. } => reply(out, noreply, b"STORED\r\n"),
        StoreOutcome::NotStored => reply(out, noreply, b"NOT_STORED\r\n"),
        StoreOutcome::Exists => reply(out, noreply, b"EXISTS\r\n"),
        StoreOutcome::NotFound => reply(out, noreply, b"NOT_FOUND\r\n"),
        StoreOutcome::TooLarge => {
            out.extend_from_slice(b"SERVER_ERROR object too large for cache\r\n")
        }
    }
    done(consumed)
}

fn delete(tokens: &[&[u8]], out: &mut Vec<u8>, ctx: &mut Ctx<'_>, after: usize) -> Step {
    // delete <key> [0] [noreply]: memcached accepts a legacy hold time of exactly 0.
    let valid = match tokens.len() {
        2 => true,
        3 => tokens[2] == b"0" || tokens[2] == b"noreply",
        4 => tokens[2] == b"0" && tokens[3] == b"noreply",
        _ => false,
    };
    if tokens.len() < 2 {
        out.extend_from_slice(b"ERROR\r\n");
        return done(after);
    }
    if !valid {
        out.extend_from_slice(
            b"CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n",
        );
        return done(after);
    }
    let key = tokens[1];
    if key.len() > KEY_MAX_LEN {
        out.extend_from_slice(BAD_FORMAT);
        return done(after);
    }
    let noreply = tokens.last() == Some(&&b"noreply"[..]);
    let shared = ctx.shared;
    let now = shared.now_ms();
    let existed = shared.lock_store().delete(key, 0, now) == Ok(true);
    if existed {
        Counters::bump(&shared.counters.delete_hits);
        reply(out, noreply, b"DELETED\r\n");
    } else {
        Counters::bump(&shared.counters.delete_misses);
        reply(out, noreply, b"NOT_FOUND\r\n");
    }
    done(after)
}

fn arith(incr: bool, tokens: &[&[u8]], out: &mut Vec<u8>, ctx: &mut Ctx<'_>, after: usize) -> Step {
    let (args, noreply) = split_noreply(&tokens[1..]);
    if args.len() != 2 {
        out.extend_from_slice(b"ERROR\r\n");
        return done(after);
    }
    let key = args[0];
    if key.len() > KEY_MAX_LEN {
        out.extend_from_slice(BAD_FORMAT);
        return done(after);
    }
    let Some(delta) = parse_num::<u64>(args[1]) else {
        out.extend_from_slice(b"CLIENT_ERROR invalid numeric delta argument\r\n");
        return done(after);
    };
    let shared = ctx.shared;
    let now = shared.now_ms();
    let outcome = shared.lock_store().arith(key, incr, delta, None, 0, now);
    let c = &shared.counters;
    let (hits, misses) = if incr {
        (&c.incr_hits, &c.incr_misses)
    } else {
        (&c.decr_hits, &c.decr_misses)
    };
    match outcome {
        ArithOutcome::Value { value, .. } => {
            Counters::bump(hits);
            if !noreply {
                let _ = write!(out, "{value}\r\n");
            }
        }
        ArithOutcome::NotFound => {
            Counters::bump(misses);
            reply(out, noreply, b"NOT_FOUND\r\n");
        }
        ArithOutcome::NonNumeric => out
            .extend_from_slice(b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n"),
        ArithOutcome::Exists => reply(out, noreply, b"EXISTS\r\n"),
    }
    done(after)
}

fn touch(tokens: &[&[u8]], out: &mut Vec<u8>, ctx: &mut Ctx<'_>, after: usize) -> Step {
    let (args, noreply) = split_noreply(&tokens[1..]);
    if args.len() != 2 {
        out.extend_from_slice(b"ERROR\r\n");
        return done(after);
    }
    if args[0].len() > KEY_MAX_LEN {
        out.extend_from_slice(BAD_FORMAT);
        return done(after);
    }
    let Some(exptime) = parse_num::<i64>(args[1]) else {
        out.extend_from_slice(b"CLIENT_ERROR invalid exptime argument\r\n");
        return done(after);
    };
    let shared = ctx.shared;
    let now = shared.now_ms();
    let expires = expiry_from_exptime(exptime, now, super::unix_now_s());
    let found = shared.lock_store().touch(args[0], expires, now);
    let c = &shared.counters;
    Counters::bump(&c.cmd_touch);
    if found {
        Counters::bump(&c.touch_hits);
        reply(out, noreply, b"TOUCHED\r\n");
    } else {
        Counters::bump(&c.touch_misses);
        reply(out, noreply, b"NOT_FOUND\r\n");
    }
    done(after)
}

fn flush_all(tokens: &[&[u8]], out: &mut Vec<u8>, ctx: &mut Ctx<'_>, after: usize) -> Step {
    let (args, noreply) = split_noreply(&tokens[1..]);
    if args.len() > 1 {
        out.extend_from_slice(b"ERROR\r\n");
        return done(after);
    }
    let delay_s = match args.first() {
        None => 0,
        Some(t) => match parse_num::<i64>(t) {
            Some(d) => d.max(0) as u64,
            None => {
                out.extend_from_slice(BAD_FORMAT);
                return done(after);
            }
        },
    };
    let shared = ctx.shared;
    let now = shared.now_ms();
    shared.lock_store().flush(now, delay_s * 1000);
    Counters::bump(&shared.counters.cmd_flush);
    reply(out, noreply, b"OK\r\n");
    done(after)
}

fn stats(tokens: &[&[u8]], out: &mut Vec<u8>, ctx: &mut Ctx<'_>, after: usize) -> Step {
    let shared = ctx.shared;
    match tokens.get(1).copied() {
        None => {
            for (k, v) in shared.stats_snapshot().pairs {
                let _ = write!(out, "STAT {k} {v}\r\n");
            }
            out.extend_from_slice(b"END\r\n");
        }
        Some(b"reset") if tokens.len() == 2 => {
            shared.counters.reset();
            out.extend_from_slice(b"RESET\r\n");
        }
        Some(b"settings") if tokens.len() == 2 => {
            for (k, v) in shared.settings() {
                let _ = write!(out, "STAT {k} {v}\r\n");
            }
            out.extend_from_slice(b"END\r\n");
        }
        // Other groups (items, slabs, conns, …) are not kept: memcached answers unknown ones so.
        Some(_) => out.extend_from_slice(b"ERROR\r\n"),
    }
    done(after)
}

fn verbosity(tokens: &[&[u8]], out: &mut Vec<u8>, after: usize) -> Step {
    let (args, noreply) = split_noreply(&tokens[1..]);
    match (args.len(), noreply) {
        (0, true) => {}
        (1, _) => reply(out, noreply, b"OK\r\n"),
        _ => out.extend_from_slice(b"ERROR\r\n"),
    }
    done(after)
}
