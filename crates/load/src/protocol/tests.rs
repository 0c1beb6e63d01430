use super::*;
use proptest::prelude::*;

const ALL: [Protocol; 3] = [
    Protocol::MemcacheAscii,
    Protocol::MemcacheBinary,
    Protocol::Resp,
];

fn encoded(p: Protocol, op: Op, key: &[u8], value_len: usize) -> Vec<u8> {
    let mut out = Vec::new();
    p.encode(op, key, value_len, &mut out);
    out
}

/// A binary-protocol reply.
fn bin_reply(opcode: u8, status: u16, extras: &[u8], key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut r = vec![0x81, opcode];
    r.extend_from_slice(&(key.len() as u16).to_be_bytes());
    r.push(extras.len() as u8);
    r.push(0);
    r.extend_from_slice(&status.to_be_bytes());
    r.extend_from_slice(&((extras.len() + key.len() + value.len()) as u32).to_be_bytes());
    r.extend_from_slice(&[0; 12]);
    r.extend_from_slice(extras);
    r.extend_from_slice(key);
    r.extend_from_slice(value);
    r
}

fn value_reply(len: usize) -> Vec<u8> {
    let mut r = format!("VALUE key123 0 {len}\r\n").into_bytes();
    r.extend(std::iter::repeat_n(b'v', len));
    r.extend_from_slice(b"\r\nEND\r\n");
    r
}

fn bulk_reply(len: usize) -> Vec<u8> {
    let mut r = format!("${len}\r\n").into_bytes();
    r.extend(std::iter::repeat_n(b'\n', len)); // data may hold CR/LF: it is length-prefixed
    r.extend_from_slice(b"\r\n");
    r
}

/// A complete reply and what it must parse to: Ok(hit) or Err(()) for a server error.
type Case = (Protocol, Op, Vec<u8>, Result<bool, ()>);

fn good_replies() -> Vec<Case> {
    use Op::{Get, Set};
    use Protocol::{MemcacheAscii as A, MemcacheBinary as B, Resp as R};
    vec![
        (A, Get, value_reply(0), Ok(true)),
        (A, Get, value_reply(200), Ok(true)),
        (
            A,
            Get,
            b"VALUE k 4294967295 3 77\r\nEND\r\nEND\r\n".to_vec(),
            Ok(true),
        ),
        (A, Get, b"END\r\n".to_vec(), Ok(false)),
        (A, Get, b"ERROR\r\n".to_vec(), Err(())),
        (
            A,
            Get,
            b"CLIENT_ERROR bad command line format\r\n".to_vec(),
            Err(()),
        ),
        (A, Get, b"SERVER_ERROR out of memory\r\n".to_vec(), Err(())),
        (A, Set, b"STORED\r\n".to_vec(), Ok(true)),
        (A, Set, b"NOT_STORED\r\n".to_vec(), Ok(false)),
        (
            A,
            Set,
            b"SERVER_ERROR object too large for cache\r\n".to_vec(),
            Err(()),
        ),
        (A, Set, b"ERROR\r\n".to_vec(), Err(())),
        (
            B,
            Get,
            bin_reply(0x00, 0, &[0, 0, 0, 0], b"", &[7; 100]),
            Ok(true),
        ),
        (
            B,
            Get,
            bin_reply(0x00, 0, &[0, 0, 0, 0], b"", b""),
            Ok(true),
        ),
        (
            B,
            Get,
            bin_reply(0x00, 1, b"", b"", b"Not found"),
            Ok(false),
        ),
        (
            B,
            Get,
            bin_reply(0x00, 0x84, b"", b"", b"Internal error"),
            Err(()),
        ),
        (B, Set, bin_reply(0x01, 0, b"", b"", b""), Ok(true)),
        (
            B,
            Set,
            bin_reply(0x01, 5, b"", b"", b"Not stored."),
            Ok(false),
        ),
        (B, Set, bin_reply(0x01, 3, b"", b"", b"Too large."), Err(())),
        (R, Get, bulk_reply(0), Ok(true)),
        (R, Get, bulk_reply(300), Ok(true)),
        (R, Get, b"$-1\r\n".to_vec(), Ok(false)),
        (R, Get, b"_\r\n".to_vec(), Ok(false)),
        (
            R,
            Get,
            b"-ERR wrong number of arguments\r\n".to_vec(),
            Err(()),
        ),
        (R, Set, b"+OK\r\n".to_vec(), Ok(true)),
        (R, Set, b"$-1\r\n".to_vec(), Ok(false)),
        (R, Set, b"-OOM command not allowed\r\n".to_vec(), Err(())),
    ]
}

#[test]
fn every_reply_parses_whole_and_waits_when_split_anywhere() {
    for (p, op, reply, want) in good_replies() {
        // Every strict prefix (0 bytes included) is incomplete, never an error.
        for cut in 0..reply.len() {
            assert_eq!(
                p.parse(op, &reply[..cut]),
                Ok(None),
                "{p} {op} {:?} cut at {cut}",
                reply.escape_ascii().to_string()
            );
        }
        // Whole, and with the start of the next reply behind it.
        let mut two = reply.clone();
        two.extend_from_slice(&reply[..reply.len() / 2]);
        for buf in [&reply[..], &two[..]] {
            match (p.parse(op, buf), want) {
                (Ok(Some(r)), Ok(hit)) => {
                    assert_eq!(
                        r,
                        Reply {
                            consumed: reply.len(),
                            hit
                        },
                        "{p} {op}"
                    )
                }
                (Err(e @ ProtocolError::Server { .. }), Err(())) => {
                    assert_eq!(e.consumed(), Some(reply.len()), "{p} {op}: {e}")
                }
                (got, _) => panic!("{p} {op} {:?}: {got:?}", reply.escape_ascii().to_string()),
            }
        }
    }
}

#[test]
fn pipelined_replies_parse_in_order() {
    let p = Protocol::MemcacheAscii;
    let mut buf = value_reply(10);
    buf.extend_from_slice(b"END\r\n");
    buf.extend_from_slice(&value_reply(3));
    let mut hits = Vec::new();
    let mut at = 0;
    while let Some(r) = p.parse(Op::Get, &buf[at..]).unwrap() {
        hits.push(r.hit);
        at += r.consumed;
    }
    assert_eq!(hits, [true, false, true]);
    assert_eq!(at, buf.len());
}

#[test]
fn malformed_replies_are_errors_that_show_the_bytes() {
    use Op::{Get, Set};
    use Protocol::{MemcacheAscii as A, MemcacheBinary as B, Resp as R};
    let mut long_line = b"VALUE ".to_vec();
    long_line.extend(std::iter::repeat_n(b'k', MAX_LINE + 10));
    let cases: Vec<(Protocol, Op, Vec<u8>)> = vec![
        (A, Get, b"STORED\r\n".to_vec()),
        (A, Get, b"HELLO".to_vec()),
        (A, Get, b"VALUE k 0\r\n".to_vec()),
        (A, Get, b"VALUE k x 3\r\nabc\r\nEND\r\n".to_vec()),
        (A, Get, b"VALUE k 0 -3\r\n".to_vec()),
        (A, Get, b"VALUE k 0 3 1 2\r\n".to_vec()),
        (A, Get, b"VALUE k 0 3\r\nabcd\r\nEND\r\n".to_vec()), // value longer than announced
        (A, Get, b"VALUE k 0 3\r\nabc\r\nEMD".to_vec()),
        (A, Get, b"VALUE k 0 99999999999999999999\r\n".to_vec()),
        // a value past memcached's item limit is refused from its header, never buffered
        (A, Get, b"VALUE k 0 1000000000\r\n".to_vec()),
        (R, Get, b"$1000000000\r\n".to_vec()),
        (A, Get, b"VALUE k 0 3\r\nabc\r\nEND\n".to_vec()),
        (A, Get, long_line),
        (A, Get, b"ENDX\r\n".to_vec()),
        (A, Set, b"END\r\n".to_vec()),
        (A, Set, b"STOREDX\r\n".to_vec()),
        (B, Get, vec![0x80]),
        (B, Get, vec![0x81, 0x01]),
        (B, Set, bin_reply(0x00, 0, b"", b"", b"")),
        (B, Get, {
            let mut r = bin_reply(0x00, 0, &[0; 4], b"kk", b"");
            r[8..12].copy_from_slice(&1u32.to_be_bytes()); // body shorter than key + extras
            r
        }),
        (B, Get, {
            let mut r = bin_reply(0x00, 0, b"", b"", b"");
            r[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
            r
        }),
        (R, Get, b"+OK\r\n".to_vec()),
        (R, Get, b":1\r\n".to_vec()),
        (R, Get, b"$abc\r\n".to_vec()),
        (R, Get, b"$-2\r\n".to_vec()),
        (R, Get, b"$3\r\nabcd\r\n".to_vec()),
        (R, Get, b"_x\r\n".to_vec()),
        (R, Set, b"+QUEUED\r\n".to_vec()),
        (R, Set, b"$3\r\nabc\r\n".to_vec()),
        (R, Set, b"*1\r\n".to_vec()),
    ];
    for (p, op, bytes) in cases {
        match p.parse(op, &bytes) {
            Err(e @ ProtocolError::Malformed { .. }) => {
                assert_eq!(e.consumed(), None);
                let msg = e.to_string();
                assert!(msg.contains("bytes)"), "{msg}");
                assert!(msg.contains(&p.to_string()), "{msg}");
            }
            other => panic!(
                "{p} {op} {:?}: expected malformed, got {other:?}",
                bytes.escape_ascii().to_string()
            ),
        }
    }
}

#[test]
fn requests_are_encoded_exactly() {
    use Protocol::{MemcacheAscii as A, MemcacheBinary as B, Resp as R};
    assert_eq!(encoded(A, Op::Get, b"k1", 99), b"get k1\r\n");
    let set = encoded(A, Op::Set, b"k1", 5);
    assert_eq!(&set[..14], b"set k1 0 0 5\r\n");
    assert_eq!(set.len(), 14 + 5 + 2);
    assert!(set.ends_with(b"\r\n"));
    assert_eq!(
        encoded(R, Op::Get, b"abc", 0),
        b"*2\r\n$3\r\nGET\r\n$3\r\nabc\r\n"
    );
    let set = encoded(R, Op::Set, b"abc", 100);
    assert!(set.starts_with(b"*3\r\n$3\r\nSET\r\n$3\r\nabc\r\n$100\r\n"));
    assert_eq!(set.len(), 28 + 100 + 2);
    let get = encoded(B, Op::Get, b"abc", 0);
    assert_eq!(get.len(), 24 + 3);
    assert_eq!(&get[..12], &[0x80, 0x00, 0, 3, 0, 0, 0, 0, 0, 0, 0, 3]);
    assert_eq!(&get[24..], b"abc");
    let set = encoded(B, Op::Set, b"abc", 1000);
    assert_eq!(&set[..8], &[0x80, 0x01, 0, 3, 8, 0, 0, 0]);
    assert_eq!(
        u32::from_be_bytes(set[8..12].try_into().unwrap()),
        8 + 3 + 1000
    );
    assert_eq!(set.len(), 24 + 8 + 3 + 1000);
    assert_eq!(&set[32..35], b"abc");
    // encode appends (the caller reuses and clears its buffer).
    let mut out = b"prefix".to_vec();
    A.encode(Op::Get, b"x", 0, &mut out);
    assert_eq!(out, b"prefixget x\r\n");
    // Large values are written whole.
    assert_eq!(
        encoded(A, Op::Set, b"k", 1 << 20).len(),
        "set k 0 0 1048576\r\n".len() + (1 << 20) + 2
    );
}

#[test]
fn describe_bytes_escapes_and_truncates() {
    assert_eq!(describe_bytes(b"A\r\n\x00"), "\"A\\r\\n\\x00\" (4 bytes)");
    let long = vec![b'x'; 100];
    let d = describe_bytes(&long);
    assert!(d.ends_with("…\" (100 bytes)"), "{d}");
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![Just(Op::Get), Just(Op::Set)]
}

fn arb_protocol() -> impl Strategy<Value = Protocol> {
    prop_oneof![
        Just(Protocol::MemcacheAscii),
        Just(Protocol::MemcacheBinary),
        Just(Protocol::Resp)
    ]
}

/// Bytes that look like replies often enough to reach the deep branches.
fn arb_reply_bytes() -> impl Strategy<Value = Vec<u8>> {
    let tokens = prop_oneof![
        Just(b"VALUE k 0 3\r\n".to_vec()),
        Just(b"END\r\n".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"$3\r\n".to_vec()),
        Just(b"$-1\r\n".to_vec()),
        Just(b"+OK\r\n".to_vec()),
        Just(b"-ERR x\r\n".to_vec()),
        Just(b"STORED\r\n".to_vec()),
        Just(vec![0x81, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4]),
        Just(vec![0x81, 0x01, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]),
        proptest::collection::vec(any::<u8>(), 0..40),
    ];
    proptest::collection::vec(tokens, 0..6).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn parsers_never_panic_and_stay_in_bounds(
        p in arb_protocol(),
        op in arb_op(),
        bytes in prop_oneof![proptest::collection::vec(any::<u8>(), 0..300), arb_reply_bytes()],
    ) {
        match p.parse(op, &bytes) {
            Ok(Some(r)) => prop_assert!(r.consumed > 0 && r.consumed <= bytes.len()),
            Ok(None) => {}
            Err(e) => {
                if let Some(c) = e.consumed() {
                    prop_assert!(c > 0 && c <= bytes.len());
                }
                prop_assert!(!e.to_string().is_empty());
            }
        }
    }

    #[test]
    fn hit_replies_of_any_size_parse_at_any_split(len in 0usize..5000, cut_frac in 0.0f64..1.0) {
        for (p, reply) in [
            (Protocol::MemcacheAscii, value_reply(len)),
            (Protocol::MemcacheBinary, bin_reply(0, 0, &[0; 4], b"", &vec![0x81; len])),
            (Protocol::Resp, bulk_reply(len)),
        ] {
            let cut = ((reply.len() as f64) * cut_frac) as usize;
            prop_assert_eq!(p.parse(Op::Get, &reply[..cut]), Ok(None));
            prop_assert_eq!(
                p.parse(Op::Get, &reply),
                Ok(Some(Reply { consumed: reply.len(), hit: true }))
            );
        }
    }

    #[test]
    fn encoded_sets_have_consistent_lengths(
        p in arb_protocol(),
        key in "[0-9a-z]{1,250}",
        value_len in 0usize..10_000,
    ) {
        let out = encoded(p, Op::Set, key.as_bytes(), value_len);
        let overhead = match p {
            Protocol::MemcacheAscii => format!("set {key} 0 0 {value_len}\r\n\r\n").len(),
            Protocol::MemcacheBinary => 24 + 8 + key.len(),
            Protocol::Resp => format!("*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${value_len}\r\n\r\n", key.len()).len(),
        };
        prop_assert_eq!(out.len(), overhead + value_len);
        for p2 in ALL {
            // A request is never mistaken for a complete reply.
            prop_assert!(!matches!(p2.parse(Op::Get, &out), Ok(Some(_))));
        }
    }
}
