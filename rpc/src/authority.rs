//! Lets any client's `:authority` through to h2 (issue 13).
//!
//! gRPC's C core (Python, C++, Ruby, PHP) connecting to `unix:/run/x/agent.sock` sends the
//! socket path, percent-encoded, as the HTTP/2 `:authority` (`run%2Fx%2Fagent.sock`): a valid
//! RFC 3986 reg-name, but h2 0.4.20 (the newest release) parses `:authority` with
//! `http::uri::Authority`, which refuses a `%` outside the userinfo (bar an IPv6 zone id), and
//! resets every such stream with `PROTOCOL_ERROR` (hyperium/h2#487) before tonic sees it. Any
//! client may send such a name over TCP too (a target's host part is its authority), so both
//! listeners get the fix.
//!
//! The fix is this adapter around each accepted connection (unix socket and TLS alike), below
//! h2: it follows the client's frames and, in a request's header block whose `:authority`
//! `http::uri::Authority` (h2's own check) refuses, drops that one field. The agent never reads
//! the authority (it authenticates by `SO_PEERCRED` or the client certificate and routes by
//! `:path`), HTTP/2 makes it optional (RFC 9113 §8.3.1), and inventing a host in its place would
//! put a false name in traces. Chosen over a vendored, patched h2 (`[patch.crates-io]` would pin
//! us to a fork of a security-relevant crate), and no h2 release fixes it.
//!
//! How: the client's HPACK encoder keeps a dynamic table, so every header block is decoded with
//! a decoder that mirrors it (`loona-hpack`, honouring the client's table-size updates, bounded
//! by the 4,096 bytes h2 advertises). Blocks pass through byte for byte until the first one that
//! needs a change; from then on h2's table no longer matches the client's, so that block and
//! every later one is re-encoded with literal never-indexed fields only, which reference no
//! dynamic table and are valid under any table size. Well-formed connections are untouched.
//!
//! Anything the adapter cannot follow (a wrong preface, a bad padding length, a CONTINUATION
//! out of place, a HEADERS frame over h2's 16 KiB frame limit, a header block over 64 KiB or
//! decoding to over 1 MiB, an HPACK error) switches it to passing every byte through from that
//! point on, so h2 itself reports the protocol error to the client. Only the client-to-server
//! direction is read; DATA and other frames stream through without being buffered.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};
use tonic::transport::server::Connected;

/// The client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// h2's SETTINGS_MAX_FRAME_SIZE (its default; the agent's servers keep it): larger HEADERS or
/// CONTINUATION frames are h2's to refuse. Re-encoded blocks are framed within it.
const MAX_FRAME: usize = 16_384;
/// h2's SETTINGS_HEADER_TABLE_SIZE (its default): the most a client may size its table to.
const MAX_TABLE: usize = 4_096;
/// The largest encoded header block followed (h2 refuses header lists over 16 KiB anyway).
const MAX_BLOCK: usize = 64 << 10;
/// The most a header block may decode to before the adapter stops following.
const MAX_DECODED: usize = 1 << 20;

const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// A header block being assembled from HEADERS and CONTINUATION frames.
struct Block {
    stream: u32,
    /// The HEADERS frame's END_STREAM and PRIORITY flags.
    flags: u8,
    /// The HEADERS frame's priority fields (exclusive bit, dependency, weight).
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
    /// The frames as received, passed on when the block needs no change.
    original: Vec<u8>,
}

/// What became of a header frame.
enum Step {
    Followed,
    /// The adapter stops following; the frame is either in the pending block or still in the
    /// input.
    Stop {
        frame_in_block: bool,
    },
}

enum Phase {
    /// Matching the client preface; the count of bytes matched so far.
    Preface(usize),
    Frames,
    /// Passing every byte through from here on.
    Opaque,
}

/// The client-to-server byte rewriter, free of I/O: bytes in with [`Rewriter::feed`], bytes out
/// with [`Rewriter::take`].
pub struct Rewriter {
    phase: Phase,
    input: Vec<u8>,
    output: VecDeque<u8>,
    /// Payload bytes of a non-header frame still to pass through.
    data_left: usize,
    block: Option<Block>,
    decoder: loona_hpack::Decoder<'static>,
    /// True once a block was changed: every later block is re-encoded.
    reencoding: bool,
    /// How many header blocks had their `:authority` dropped.
    pub rewritten: u64,
}

impl Default for Rewriter {
    fn default() -> Self {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(MAX_TABLE);
        Self {
            phase: Phase::Preface(0),
            input: Vec::new(),
            output: VecDeque::new(),
            data_left: 0,
            block: None,
            decoder,
            reencoding: false,
            rewritten: 0,
        }
    }
}

/// True when h2 would refuse this `:authority` (it parses it exactly so).
pub fn h2_refuses(authority: &[u8]) -> bool {
    http::uri::Authority::try_from(authority).is_err()
}

impl Rewriter {
    /// Takes bytes the client sent.
    pub fn feed(&mut self, bytes: &[u8]) {
        if matches!(self.phase, Phase::Opaque) {
            self.output.extend(bytes);
            return;
        }
        self.input.extend_from_slice(bytes);
        self.process();
    }

    /// True when bytes are ready for h2.
    pub fn has_output(&self) -> bool {
        !self.output.is_empty()
    }

    /// Moves up to `max` ready bytes into `out`.
    pub fn take(&mut self, out: &mut Vec<u8>, max: usize) {
        let n = max.min(self.output.len());
        out.extend(self.output.drain(..n));
    }

    fn opaque(&mut self) {
        if let Some(b) = self.block.take() {
            self.output.extend(&b.original);
        }
        self.output.extend(self.input.drain(..));
        self.phase = Phase::Opaque;
    }

    fn process(&mut self) {
        let mut pos = 0;
        loop {
            match self.phase {
                Phase::Opaque => {
                    self.output.extend(&self.input[pos..]);
                    self.input.clear();
                    return;
                }
                Phase::Preface(matched) => {
                    let n = (PREFACE.len() - matched).min(self.input.len() - pos);
                    if self.input[pos..pos + n] != PREFACE[matched..matched + n] {
                        self.input.drain(..pos);
                        return self.opaque();
                    }
                    self.output.extend(&self.input[pos..pos + n]);
                    pos += n;
                    if matched + n < PREFACE.len() {
                        self.phase = Phase::Preface(matched + n);
                        break;
                    }
                    self.phase = Phase::Frames;
                }
                Phase::Frames => {
                    let avail = self.input.len() - pos;
                    if self.data_left > 0 {
                        let n = self.data_left.min(avail);
                        self.output.extend(&self.input[pos..pos + n]);
                        self.data_left -= n;
                        pos += n;
                        if self.data_left > 0 {
                            break;
                        }
                        continue;
                    }
                    if avail < 9 {
                        break;
                    }
                    let h = &self.input[pos..pos + 9];
                    let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                    let (kind, flags) = (h[3], h[4]);
                    let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
                    let header_frame = kind == HEADERS || kind == CONTINUATION;
                    if !header_frame && self.block.is_none() {
                        self.output.extend(&self.input[pos..pos + 9]);
                        pos += 9;
                        self.data_left = len;
                        continue;
                    }
                    if !header_frame || len > MAX_FRAME {
                        // A frame inside a header block, or too large: h2's to refuse.
                        self.input.drain(..pos);
                        return self.opaque();
                    }
                    if avail < 9 + len {
                        break;
                    }
                    let frame = pos..pos + 9 + len;
                    match self.header_frame(kind, flags, stream, frame) {
                        Step::Followed => pos += 9 + len,
                        // The frame went into the block that `opaque` passes on first.
                        Step::Stop { frame_in_block: true } => {
                            self.input.drain(..pos + 9 + len);
                            return self.opaque();
                        }
                        Step::Stop { frame_in_block: false } => {
                            self.input.drain(..pos);
                            return self.opaque();
                        }
                    }
                }
            }
        }
        self.input.drain(..pos);
    }

    /// Takes one whole HEADERS or CONTINUATION frame.
    fn header_frame(&mut self, kind: u8, flags: u8, stream: u32, frame: std::ops::Range<usize>) -> Step {
        let bytes = &self.input[frame];
        let payload = &bytes[9..];
        if kind == HEADERS {
            if self.block.is_some() {
                return Step::Stop { frame_in_block: false };
            }
            let mut start = 0;
            let mut end = payload.len();
            if flags & PADDED != 0 {
                let Some(&pad) = payload.first() else {
                    return Step::Stop { frame_in_block: false };
                };
                start = 1;
                end = match end.checked_sub(usize::from(pad)) {
                    Some(e) if e >= start => e,
                    _ => {
                        return Step::Stop { frame_in_block: false };
                    }
                };
            }
            let mut priority = None;
            if flags & PRIORITY != 0 {
                let Some(p) = payload.get(start..start + 5).filter(|_| start + 5 <= end) else {
                    return Step::Stop { frame_in_block: false };
                };
                priority = p.try_into().ok();
                start += 5;
            }
            self.block = Some(Block {
                stream,
                flags: flags & (END_STREAM | PRIORITY),
                priority,
                fragment: payload[start..end].to_vec(),
                original: bytes.to_vec(),
            });
        } else {
            let Some(b) = self.block.as_mut().filter(|b| b.stream == stream) else {
                return Step::Stop { frame_in_block: false };
            };
            b.fragment.extend_from_slice(payload);
            b.original.extend_from_slice(bytes);
            if b.original.len() > MAX_BLOCK {
                return Step::Stop { frame_in_block: true };
            }
        }
        if flags & END_HEADERS == 0 {
            return Step::Followed;
        }
        if self.finish_block() {
            Step::Followed
        } else {
            Step::Stop { frame_in_block: true }
        }
    }

    /// Decodes the finished block and passes it on, unchanged or re-encoded.
    fn finish_block(&mut self) -> bool {
        let Some(block) = self.block.take() else { return true };
        let mut fields: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut decoded = 0usize;
        let mut refused = false;
        let result = self.decoder.decode_with_cb(&block.fragment, |name, value| {
            decoded = decoded.saturating_add(name.len() + value.len() + 32);
            if decoded > MAX_DECODED {
                return;
            }
            if &*name == b":authority" && h2_refuses(&value) {
                refused = true;
                return;
            }
            fields.push((name.into_owned(), value.into_owned()));
        });
        if result.is_err() || decoded > MAX_DECODED {
            self.block = Some(block);
            return false;
        }
        if !refused && !self.reencoding {
            self.output.extend(&block.original);
            return true;
        }
        if refused {
            self.rewritten += 1;
        }
        self.reencoding = true;
        let mut encoded = Vec::with_capacity(block.fragment.len() + 64);
        for (name, value) in &fields {
            encode_never_indexed(name, value, &mut encoded);
        }
        self.frame_block(&block, &encoded);
        true
    }

    /// Writes `encoded` as a HEADERS frame and as many CONTINUATION frames as it needs.
    fn frame_block(&mut self, block: &Block, encoded: &[u8]) {
        let prio_len = if block.priority.is_some() { 5 } else { 0 };
        let first = encoded.len().min(MAX_FRAME - prio_len);
        let (head, mut rest) = encoded.split_at(first);
        let flags = block.flags | if rest.is_empty() { END_HEADERS } else { 0 };
        self.frame_header(head.len() + prio_len, HEADERS, flags, block.stream);
        if let Some(p) = block.priority {
            self.output.extend(p);
        }
        self.output.extend(head);
        while !rest.is_empty() {
            let (chunk, tail) = rest.split_at(rest.len().min(MAX_FRAME));
            let flags = if tail.is_empty() { END_HEADERS } else { 0 };
            self.frame_header(chunk.len(), CONTINUATION, flags, block.stream);
            self.output.extend(chunk);
            rest = tail;
        }
    }

    fn frame_header(&mut self, len: usize, kind: u8, flags: u8, stream: u32) {
        let l = (len as u32).to_be_bytes();
        self.output.extend([l[1], l[2], l[3], kind, flags]);
        self.output.extend(stream.to_be_bytes());
    }
}

/// One field as a literal never indexed, with a literal name and no Huffman coding
/// (RFC 7541 §6.2.3): it neither references nor changes any dynamic table.
fn encode_never_indexed(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.push(0x10);
    for s in [name, value] {
        // A Vec never fails to take the bytes.
        let _ = loona_hpack::encoder::encode_integer_into(s.len(), 7, 0, out);
        out.extend_from_slice(s);
    }
}

/// An accepted connection whose client-to-server bytes pass through a [`Rewriter`].
pub struct AuthorityFix<S> {
    inner: S,
    rewriter: Rewriter,
    scratch: Vec<u8>,
    eof: bool,
}

impl<S> AuthorityFix<S> {
    pub fn new(inner: S) -> Self {
        Self { inner, rewriter: Rewriter::default(), scratch: Vec::new(), eof: false }
    }
}

impl<S: Connected> Connected for AuthorityFix<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.rewriter.has_output() {
                this.scratch.clear();
                this.rewriter.take(&mut this.scratch, buf.remaining());
                buf.put_slice(&this.scratch);
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                // Bytes of an unfinished frame at EOF: h2 would see a truncated frame either way.
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 16 << 10];
            let mut rb = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) => {
                    if rb.filled().is_empty() {
                        this.eof = true;
                    } else {
                        this.rewriter.feed(rb.filled());
                    }
                }
                other => return other,
            }
        }
    }
}

write_through!(AuthorityFix<S>, S);

#[cfg(test)]
#[path = "authority_tests.rs"]
mod tests;
