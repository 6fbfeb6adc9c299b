//! Unit tests of the `:authority` fix (rpc/src/authority.rs): real captured client bytes, the
//! rewrite of refused authorities, and everything it passes through untouched.

use super::*;

/// What grpc-python 1.85 (gRPC C core) sent to `unix:/tmp/cap/x y/agent.sock` with default
/// channel options: the preface, SETTINGS, WINDOW_UPDATE, then two concurrent Health.Check
/// calls, the second one's header block referencing the first one's dynamic-table entries
/// (among them `:authority: tmp%2Fcap%2Fx%20y%2Fagent.sock`). Captured by a listener that
/// answered an empty SETTINGS and logged what it read.
const PYTHON_DEFAULT: &[u8] = include_bytes!("testdata/grpc-python-unix-default-authority.bin");
/// The same calls with `grpc.default_authority=localhost`.
const PYTHON_LOCALHOST: &[u8] = include_bytes!("testdata/grpc-python-unix-authority-localhost.bin");

fn rewrite_all(input: &[u8]) -> (Vec<u8>, u64) {
    let mut r = Rewriter::default();
    r.feed(input);
    let mut out = Vec::new();
    r.take(&mut out, usize::MAX);
    (out, r.rewritten)
}

fn rewrite_bytewise(input: &[u8]) -> Vec<u8> {
    let mut r = Rewriter::default();
    let mut out = Vec::new();
    for b in input {
        r.feed(std::slice::from_ref(b));
        r.take(&mut out, 7);
    }
    r.take(&mut out, usize::MAX);
    out
}

/// A frame as (type, flags, stream, payload).
type Frame = (u8, u8, u32, Vec<u8>);

fn frames(bytes: &[u8]) -> Vec<Frame> {
    let mut rest = bytes.strip_prefix(PREFACE).expect("preface");
    let mut out = Vec::new();
    while !rest.is_empty() {
        let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
        let stream = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]);
        out.push((rest[3], rest[4], stream, rest[9..9 + len].to_vec()));
        rest = &rest[9 + len..];
    }
    out
}

/// Decodes every header block as h2 would (one decoder for the connection), after
/// stripping padding and priority; returns (stream, fields) per block.
fn header_lists(bytes: &[u8]) -> Vec<(u32, Vec<(String, String)>)> {
    let mut dec = loona_hpack::Decoder::new();
    let mut out = Vec::new();
    let mut block: Option<(u32, Vec<u8>)> = None;
    for (kind, flags, stream, payload) in frames(bytes) {
        let frag = match kind {
            HEADERS => {
                let mut p = &payload[..];
                if flags & PADDED != 0 {
                    let pad = usize::from(p[0]);
                    p = &p[1..p.len() - pad];
                }
                if flags & PRIORITY != 0 {
                    p = &p[5..];
                }
                block = Some((stream, Vec::new()));
                p.to_vec()
            }
            CONTINUATION => payload,
            _ => continue,
        };
        let b = block.as_mut().expect("a block");
        assert_eq!(b.0, stream);
        b.1.extend(frag);
        if flags & END_HEADERS != 0 {
            let (s, frag) = block.take().expect("block");
            let fields = dec
                .decode(&frag)
                .expect("decodes")
                .into_iter()
                .map(|(n, v)| (String::from_utf8_lossy(&n).into(), String::from_utf8_lossy(&v).into()))
                .collect();
            out.push((s, fields));
        }
    }
    out
}

#[test]
fn h2_refuses_what_grpc_c_core_sends_for_a_unix_socket() {
    assert!(h2_refuses(b"tmp%2Fcap%2Fx%20y%2Fagent.sock"));
    assert!(h2_refuses(b"agent.sock/x"));
    for ok in ["localhost", "localhost:50051", "127.0.0.1:7443", "[::1]:7443", "[fe80::1%25eth0]:7443"] {
        assert!(!h2_refuses(ok.as_bytes()), "{ok}");
    }
}

#[test]
fn grpc_python_default_authority_is_dropped_and_the_rest_kept() {
    let (out, rewritten) = rewrite_all(PYTHON_DEFAULT);
    assert_eq!(rewritten, 2, "both calls carried the socket path as authority");
    let before = header_lists(PYTHON_DEFAULT);
    let after = header_lists(&out);
    assert_eq!(before.len(), 2);
    assert_eq!(after.len(), 2);
    for ((s0, f0), (s1, f1)) in before.iter().zip(&after) {
        assert_eq!(s0, s1);
        let authority = f0.iter().find(|(n, _)| n == ":authority").expect("client sent one");
        assert_eq!(authority.1, "tmp%2Fcap%2Fx%20y%2Fagent.sock");
        let want: Vec<_> = f0.iter().filter(|(n, _)| n != ":authority").cloned().collect();
        assert_eq!(f1, &want, "every other field, in order");
        assert!(f0.iter().any(|(n, v)| n == ":path" && v == "/grpc.health.v1.Health/Check"));
    }
    // Every frame but the HEADERS is passed on as it came, in the same order.
    let keep = |b: &[u8]| frames(b).into_iter().filter(|f| f.0 != HEADERS).collect::<Vec<_>>();
    assert_eq!(keep(PYTHON_DEFAULT), keep(&out));
    let kinds = |b: &[u8]| frames(b).into_iter().map(|f| (f.0, f.1, f.2)).collect::<Vec<_>>();
    assert_eq!(kinds(PYTHON_DEFAULT), kinds(&out), "same frames, flags and streams");
    // Fed a byte at a time, the same bytes come out.
    assert_eq!(rewrite_bytewise(PYTHON_DEFAULT), out);
}

#[test]
fn well_formed_authorities_pass_byte_for_byte() {
    let (out, rewritten) = rewrite_all(PYTHON_LOCALHOST);
    assert_eq!(rewritten, 0);
    assert_eq!(out, PYTHON_LOCALHOST);
    assert_eq!(rewrite_bytewise(PYTHON_LOCALHOST), PYTHON_LOCALHOST);
    let lists = header_lists(&out);
    assert!(lists.iter().all(|(_, f)| f.iter().any(|(n, v)| n == ":authority" && v == "localhost")));
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let l = (payload.len() as u32).to_be_bytes();
    let mut f = vec![l[1], l[2], l[3], kind, flags];
    f.extend(stream.to_be_bytes());
    f.extend(payload);
    f
}

fn block(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut enc = loona_hpack::Encoder::new();
    enc.encode(fields.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())))
}

#[test]
fn padding_priority_and_continuation_are_handled() {
    let fields = [(":method", "POST"), (":authority", "run%2Fagent.sock"), (":path", "/a.B/C")];
    let hb = block(&fields);
    let (a, b) = hb.split_at(5);
    // HEADERS with 3 bytes of padding and a priority, then a CONTINUATION, then DATA.
    let mut payload = vec![3];
    payload.extend([0x80, 0, 0, 0, 7]);
    payload.extend(a);
    payload.extend([0, 0, 0]);
    let mut input = PREFACE.to_vec();
    input.extend(frame(HEADERS, PADDED | PRIORITY | END_STREAM, 1, &payload));
    input.extend(frame(CONTINUATION, END_HEADERS, 1, b));
    input.extend(frame(0x0, END_STREAM, 1, b"hello"));
    let (out, rewritten) = rewrite_all(&input);
    assert_eq!(rewritten, 1);
    let f = frames(&out);
    assert_eq!(f.len(), 2, "{f:?}");
    assert_eq!((f[0].0, f[0].1), (HEADERS, PRIORITY | END_STREAM | END_HEADERS), "padding dropped");
    assert_eq!(&f[0].3[..5], &[0x80, 0, 0, 0, 7, 15][..5], "priority kept");
    assert_eq!(f[1], (0x0, END_STREAM, 1, b"hello".to_vec()));
    let lists = header_lists(&out);
    let want: Vec<(String, String)> = [(":method", "POST"), (":path", "/a.B/C")]
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    assert_eq!(lists, vec![(1, want)]);
}

#[test]
fn a_large_rewritten_block_is_split_within_the_frame_limit() {
    let big = "x".repeat(12_000);
    let fields = [(":authority", "a%2Fb"), ("x-one", big.as_str()), ("x-two", big.as_str())];
    let mut input = PREFACE.to_vec();
    let hb = block(&fields);
    let (a, b) = hb.split_at(MAX_FRAME);
    input.extend(frame(HEADERS, 0, 3, a));
    input.extend(frame(CONTINUATION, END_HEADERS, 3, b));
    let (out, rewritten) = rewrite_all(&input);
    assert_eq!(rewritten, 1);
    let f = frames(&out);
    assert!(
        f.len() >= 2 && f.iter().all(|f| f.3.len() <= MAX_FRAME),
        "{:?}",
        f.iter().map(|f| f.3.len()).collect::<Vec<_>>()
    );
    assert_eq!(f.last().map(|f| f.1 & END_HEADERS), Some(END_HEADERS));
    let lists = header_lists(&out);
    assert_eq!(lists[0].1.len(), 2);
    assert_eq!(lists[0].1[1].1.len(), 12_000);
}

#[test]
fn what_the_adapter_cannot_follow_passes_through_for_h2_to_refuse() {
    let hb = block(&[(":authority", "a%2Fb")]);
    let cases: Vec<Vec<u8>> = vec![
        // Not HTTP/2 at all.
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        // Pad length past the payload.
        [PREFACE, &frame(HEADERS, PADDED | END_HEADERS, 1, &[200, 1, 2])].concat(),
        // A CONTINUATION with no HEADERS before it.
        [PREFACE, &frame(CONTINUATION, END_HEADERS, 1, &hb)].concat(),
        // A DATA frame inside a header block.
        [PREFACE, &frame(HEADERS, 0, 1, &hb), &frame(0, 0, 1, b"x")].concat(),
        // A HEADERS frame over h2's frame size limit.
        [PREFACE, &frame(HEADERS, END_HEADERS, 1, &vec![0x82; MAX_FRAME + 1])].concat(),
        // An HPACK index that does not exist.
        [PREFACE, &frame(HEADERS, END_HEADERS, 1, &[0xff, 0x7f])].concat(),
        // A table size over what h2 allows.
        [PREFACE, &frame(HEADERS, END_HEADERS, 1, &[0x3f, 0xe1, 0x7f, 0x82])].concat(),
    ];
    for input in cases {
        let (out, rewritten) = rewrite_all(&input);
        assert_eq!(rewritten, 0);
        assert_eq!(out, input, "passed through unchanged");
        assert_eq!(rewrite_bytewise(&input), input);
    }
}

#[test]
fn arbitrary_bytes_never_panic_and_are_never_lost() {
    // A fixed pseudo-random sequence (xorshift): bytes after a valid preface and frame
    // headers of every kind, fed in uneven pieces.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..500 {
        let mut input = PREFACE.to_vec();
        for _ in 0..(next() % 6) {
            let len = (next() % 40) as usize;
            let kind = [HEADERS, CONTINUATION, 0, 4, 8][(next() % 5) as usize];
            let payload: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            input.extend(frame(kind, next() as u8, (next() % 3) as u32, &payload));
        }
        let mut r = Rewriter::default();
        let mut out = Vec::new();
        let mut rest = &input[..];
        while !rest.is_empty() {
            let n = ((next() % 17) as usize + 1).min(rest.len());
            r.feed(&rest[..n]);
            rest = &rest[n..];
            r.take(&mut out, usize::MAX);
        }
        if r.rewritten == 0 {
            // Nothing changed: whatever was complete came out as it went in.
            assert!(input.starts_with(&out));
        }
    }
}
