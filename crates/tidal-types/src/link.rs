//! The write link's frames (decisions/073): a client that writes one record at a time upgrades an
//! HTTP connection (`GET /v1/link`, `Upgrade: tidal-link/1`) and then sends many writes on it
//! without waiting, each a frame naming the HTTP route it stands for, and reads the node's replies
//! in whatever order the writes commit.
//!
//! Every frame is a big-endian `u32` length and that many bytes. A request is
//! `u64 id | u8 op | u16 key length | Idempotency-Key | u16 argument length | argument | body`, where
//! the argument is the route's path parameter (an item id, a stream name; empty for signals) and
//! the body is the route's own JSON body. A reply is `u64 id | u16 HTTP status | body`: the route's
//! JSON reply or the contract's error body. Id 0 is the node's: a reply with id 0 answers no
//! request and says why the node is closing the link.
//!
//! The codec here is pure (no I/O), so the node and the clients share it and its tests cover every
//! malformed frame the network can deliver.

/// The `Upgrade` token of the link.
pub const LINK_PROTOCOL: &str = "tidal-link/1";

/// The route a client upgrades.
pub const LINK_PATH: &str = "/v1/link";

/// Bytes of a frame's length prefix.
pub const FRAME_PREFIX_BYTES: usize = 4;

/// The id of the node's own replies (a link error), never a request's.
pub const NODE_REPLY_ID: u64 = 0;

/// The fixed bytes of a request: id, op and the two length fields.
const REQUEST_FIXED_BYTES: usize = 8 + 1 + 2 + 2;

/// The fixed bytes of a reply: id and status.
const REPLY_FIXED_BYTES: usize = 8 + 2;

/// Which HTTP route a request stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkOp {
    /// `PUT /v1/items/{id}`: the argument is the item id.
    PutItem,
    /// `POST /v1/signals`: no argument.
    PostSignals,
    /// `POST /v1/streams/{stream}/events`: the argument is the stream name.
    Publish,
}

impl LinkOp {
    /// The op's byte on the wire.
    pub fn code(self) -> u8 {
        match self {
            LinkOp::PutItem => 1,
            LinkOp::PostSignals => 2,
            LinkOp::Publish => 3,
        }
    }

    /// The op of a byte from the wire.
    pub fn of(code: u8) -> Option<LinkOp> {
        match code {
            1 => Some(LinkOp::PutItem),
            2 => Some(LinkOp::PostSignals),
            3 => Some(LinkOp::Publish),
            _ => None,
        }
    }
}

/// One write on the link, borrowed from its frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkRequest<'a> {
    /// The client's id for the write, echoed in its reply; never [`NODE_REPLY_ID`].
    pub id: u64,
    /// The route it stands for.
    pub op: LinkOp,
    /// The write's Idempotency-Key, if it has one.
    pub idempotency_key: Option<&'a str>,
    /// The route's path parameter ("" for none).
    pub argument: &'a str,
    /// The route's JSON body.
    pub body: &'a [u8],
}

/// One reply on the link, borrowed from its frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkReply<'a> {
    /// The request it answers, or [`NODE_REPLY_ID`].
    pub id: u64,
    /// The HTTP status the route would have answered.
    pub status: u16,
    /// The route's JSON reply or error body.
    pub body: &'a [u8],
}

/// Why a frame cannot be read. Every one ends the link: after a bad frame the stream's framing
/// cannot be trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkError {
    /// A frame's length prefix is over the link's bound.
    TooLarge {
        /// The length the prefix gives.
        length: u64,
        /// The bound.
        max: u64,
    },
    /// A frame ends before its fields do.
    Truncated {
        /// The field that is cut short.
        field: &'static str,
    },
    /// Fields that read but break a rule (a request with id [`NODE_REPLY_ID`]).
    Malformed(&'static str),
    /// An op byte no route has.
    UnknownOp(u8),
    /// The key or the argument is not UTF-8.
    NotUtf8(&'static str),
}

impl std::fmt::Display for LinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkError::TooLarge { length, max } => write!(f, "a link frame of {length} bytes, over {max}"),
            LinkError::Truncated { field } => write!(f, "a link frame ends inside its {field}"),
            LinkError::Malformed(what) => write!(f, "a malformed link frame: {what}"),
            LinkError::UnknownOp(op) => write!(f, "unknown link op {op}"),
            LinkError::NotUtf8(field) => write!(f, "a link frame's {field} is not UTF-8"),
        }
    }
}

impl std::error::Error for LinkError {}

/// The length of the frame whose prefix is `prefix`, if it is within `max`.
pub fn frame_length(prefix: [u8; FRAME_PREFIX_BYTES], max: usize) -> Result<usize, LinkError> {
    let length = u32::from_be_bytes(prefix);
    if length as u64 > max as u64 {
        return Err(LinkError::TooLarge { length: length.into(), max: max as u64 });
    }
    Ok(length as usize)
}

/// Appends `request` to `out` as one frame, prefix included.
///
/// Panics (a caller's bug, not input) when the key or the argument is over 65,535 bytes or the
/// frame over 4 GiB.
pub fn encode_request(request: &LinkRequest<'_>, out: &mut Vec<u8>) {
    let key = request.idempotency_key.unwrap_or("").as_bytes();
    let argument = request.argument.as_bytes();
    let length = REQUEST_FIXED_BYTES + key.len() + argument.len() + request.body.len();
    out.reserve(FRAME_PREFIX_BYTES + length);
    out.extend_from_slice(&frame_prefix(length));
    out.extend_from_slice(&request.id.to_be_bytes());
    out.push(request.op.code());
    out.extend_from_slice(&short_length(key.len(), "an idempotency key"));
    out.extend_from_slice(key);
    out.extend_from_slice(&short_length(argument.len(), "an argument"));
    out.extend_from_slice(argument);
    out.extend_from_slice(request.body);
}

/// Reads a request from a frame's bytes (after its prefix).
pub fn decode_request(frame: &[u8]) -> Result<LinkRequest<'_>, LinkError> {
    let mut reader = Reader(frame);
    let id = u64::from_be_bytes(reader.take("id")?);
    if id == NODE_REPLY_ID {
        return Err(LinkError::Malformed("request id 0 is the node's"));
    }
    let [op] = reader.take("op")?;
    let op = LinkOp::of(op).ok_or(LinkError::UnknownOp(op))?;
    let key = reader.text("idempotency key")?;
    let argument = reader.text("argument")?;
    let idempotency_key = (!key.is_empty()).then_some(key);
    Ok(LinkRequest { id, op, idempotency_key, argument, body: reader.0 })
}

/// Appends a reply to `out` as one frame, prefix included.
pub fn encode_reply(id: u64, status: u16, body: &[u8], out: &mut Vec<u8>) {
    let length = REPLY_FIXED_BYTES + body.len();
    out.reserve(FRAME_PREFIX_BYTES + length);
    out.extend_from_slice(&frame_prefix(length));
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&status.to_be_bytes());
    out.extend_from_slice(body);
}

/// Reads a reply from a frame's bytes (after its prefix).
pub fn decode_reply(frame: &[u8]) -> Result<LinkReply<'_>, LinkError> {
    let mut reader = Reader(frame);
    let id = u64::from_be_bytes(reader.take("id")?);
    let status = u16::from_be_bytes(reader.take("status")?);
    Ok(LinkReply { id, status, body: reader.0 })
}

fn frame_prefix(length: usize) -> [u8; FRAME_PREFIX_BYTES] {
    let length = u32::try_from(length).unwrap_or_else(|_| panic!("a link frame of {length} bytes"));
    length.to_be_bytes()
}

fn short_length(length: usize, what: &str) -> [u8; 2] {
    let length = u16::try_from(length).unwrap_or_else(|_| panic!("{what} of {length} bytes on the link"));
    length.to_be_bytes()
}

/// The unread rest of a frame.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], LinkError> {
        let bytes = self.bytes(N, field)?;
        Ok(bytes.try_into().expect("bytes() returns exactly N bytes"))
    }

    fn bytes(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], LinkError> {
        if self.0.len() < n {
            return Err(LinkError::Truncated { field });
        }
        let (taken, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(taken)
    }

    /// A `u16`-length-prefixed UTF-8 field.
    fn text(&mut self, field: &'static str) -> Result<&'a str, LinkError> {
        let length = u16::from_be_bytes(self.take(field)?) as usize;
        std::str::from_utf8(self.bytes(length, field)?).map_err(|_| LinkError::NotUtf8(field))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(body: &[u8]) -> LinkRequest<'_> {
        LinkRequest { id: 7, op: LinkOp::PutItem, idempotency_key: Some("k-1"), argument: "42", body }
    }

    /// The bytes after the prefix of the one frame in `encoded`.
    fn frame(encoded: &[u8]) -> &[u8] {
        let prefix: [u8; 4] = encoded[..4].try_into().expect("a prefix");
        let length = frame_length(prefix, usize::MAX).expect("within bound");
        assert_eq!(length, encoded.len() - 4, "the prefix counts the frame's bytes");
        &encoded[4..]
    }

    #[test]
    fn requests_and_replies_round_trip() {
        let mut out = Vec::new();
        encode_request(&request(br#"{"metadata":{}}"#), &mut out);
        assert_eq!(decode_request(frame(&out)), Ok(request(br#"{"metadata":{}}"#)));
        for op in [LinkOp::PutItem, LinkOp::PostSignals, LinkOp::Publish] {
            assert_eq!(LinkOp::of(op.code()), Some(op));
            let plain = LinkRequest { id: u64::MAX, op, idempotency_key: None, argument: "", body: b"" };
            out.clear();
            encode_request(&plain, &mut out);
            assert_eq!(decode_request(frame(&out)), Ok(plain));
        }
        out.clear();
        encode_reply(9, 503, br#"{"error":{}}"#, &mut out);
        assert_eq!(decode_reply(frame(&out)), Ok(LinkReply { id: 9, status: 503, body: br#"{"error":{}}"# }));
    }

    #[test]
    fn every_truncation_of_a_request_is_refused_or_reads_a_shorter_body() {
        let mut out = Vec::new();
        encode_request(&request(b"{}"), &mut out);
        let whole = frame(&out);
        let fields_end = whole.len() - 2;
        for cut in 0..whole.len() {
            match decode_request(&whole[..cut]) {
                Err(LinkError::Truncated { .. }) => assert!(cut < fields_end, "cut {cut} refused"),
                Ok(read) => {
                    assert!(cut >= fields_end, "cut {cut} read as {read:?}");
                    assert_eq!(read.body, &b"{}"[..cut - fields_end]);
                }
                Err(other) => panic!("cut {cut}: {other}"),
            }
        }
        for cut in 0..10 {
            let mut reply = Vec::new();
            encode_reply(1, 200, b"", &mut reply);
            assert!(matches!(decode_reply(&frame(&reply)[..cut]), Err(LinkError::Truncated { .. })));
        }
    }

    #[test]
    fn garbage_is_refused_with_what_is_wrong() {
        let mut zero_id = Vec::new();
        encode_request(&LinkRequest { id: 0, ..request(b"") }, &mut zero_id);
        assert!(matches!(decode_request(frame(&zero_id)), Err(LinkError::Malformed(_))));
        let mut bad_op = Vec::new();
        encode_request(&request(b""), &mut bad_op);
        bad_op[4 + 8] = 200;
        assert_eq!(decode_request(frame(&bad_op)), Err(LinkError::UnknownOp(200)));
        let mut bad_key = Vec::new();
        encode_request(&LinkRequest { idempotency_key: Some("ab"), ..request(b"") }, &mut bad_key);
        bad_key[4 + 8 + 1 + 2] = 0xff;
        assert_eq!(decode_request(frame(&bad_key)), Err(LinkError::NotUtf8("idempotency key")));
        // A key length that runs past the frame.
        let mut long_key = Vec::new();
        encode_request(&request(b""), &mut long_key);
        long_key[4 + 8 + 1] = 0xff;
        assert!(matches!(decode_request(frame(&long_key)), Err(LinkError::Truncated { .. })));
        // Bytes that are no frame at all: every prefix of a fixed pseudo-random stream is refused
        // or read, never a panic.
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let noise: Vec<u8> = (0..512)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        for end in 0..noise.len() {
            let _ = decode_request(&noise[..end]);
            let _ = decode_reply(&noise[..end]);
        }
    }

    #[test]
    fn a_prefix_over_the_bound_is_refused_before_anything_is_read() {
        assert_eq!(frame_length(100u32.to_be_bytes(), 100), Ok(100));
        assert_eq!(
            frame_length(101u32.to_be_bytes(), 100),
            Err(LinkError::TooLarge { length: 101, max: 100 })
        );
        assert_eq!(
            frame_length(u32::MAX.to_be_bytes(), 1 << 20),
            Err(LinkError::TooLarge { length: u32::MAX.into(), max: 1 << 20 })
        );
    }
}
