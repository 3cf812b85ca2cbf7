//! Batch framing: the 64-byte header, the BLAKE3 seal, and decoding from untrusted bytes.
//!
//! ```text
//! offset size field
//!      0    4 magic "TDLW"
//!      4    1 format version (1)
//!      5    1 kind byte (tidal_types::RecordKind)
//!      6    2 reserved, zero
//!      8    8 term            u64 LE
//!     16    8 first_seqno     u64 LE
//!     24    4 event_count     u32 LE (>= 1)
//!     28    4 payload_len     u32 LE (<= PAYLOAD_LEN_MAX)
//!     32   32 BLAKE3(header[0..32] ++ payload)
//! ```
//!
//! Framing treats the payload as opaque bytes; the kind byte is checked to be a known kind so a
//! batch of a kind nobody can apply is refused where it is decoded, never skipped. Decoding never
//! panics on any input: every length is checked before it is used.

use tidal_types::{RecordKind, Seqno, Term};

/// Size of the batch header.
pub const HEADER_LEN: usize = 64;
/// Magic at the start of every batch.
pub const MAGIC: [u8; 4] = *b"TDLW";
/// Current format version.
pub const FORMAT_VERSION: u8 = 1;
/// Largest payload a batch may carry (64 MiB): bounds every buffer a reader allocates.
pub const PAYLOAD_LEN_MAX: u32 = 64 * 1024 * 1024;

/// The decoded fields of a batch header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchHeader {
    /// What the payload holds.
    pub kind: RecordKind,
    /// Term of the leader that wrote the batch.
    pub term: Term,
    /// Seqno of the first event.
    pub first_seqno: Seqno,
    /// Number of events (seqnos) the batch consumes; at least 1.
    pub event_count: u32,
    /// Payload length in bytes.
    pub payload_len: u32,
    /// BLAKE3 over header bytes 0..32 and the payload.
    pub hash: [u8; 32],
}

impl BatchHeader {
    /// Seqno of the last event (inclusive).
    pub fn last_seqno(&self) -> Seqno {
        self.first_seqno.add(u64::from(self.event_count) - 1)
    }

    /// Total encoded length: header plus payload.
    pub fn encoded_len(&self) -> usize {
        HEADER_LEN + self.payload_len as usize
    }
}

/// Why bytes are not a valid batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Fewer bytes than the header, or than header + payload_len. At the tail of the last segment this
    /// is a torn write.
    #[error("truncated batch: need {needed} bytes, have {available}")]
    Truncated {
        /// Bytes the batch needs.
        needed: usize,
        /// Bytes available.
        available: usize,
    },
    /// The first four bytes are not the magic.
    #[error("bad magic {found:02x?}")]
    BadMagic {
        /// What was found.
        found: [u8; 4],
    },
    /// A format version this build does not read.
    #[error("unsupported format version {0}")]
    UnsupportedVersion(u8),
    /// A kind byte that names no record kind.
    #[error("unknown record kind byte {0}")]
    UnknownKind(u8),
    /// Reserved bytes are not zero.
    #[error("reserved header bytes are not zero")]
    ReservedNotZero,
    /// `event_count` is zero.
    #[error("batch has zero events")]
    ZeroEvents,
    /// `first_seqno` is zero or the last seqno overflows.
    #[error("seqno range starting at {first} with {count} events is invalid")]
    BadSeqnoRange {
        /// first_seqno field.
        first: u64,
        /// event_count field.
        count: u32,
    },
    /// `payload_len` over [`PAYLOAD_LEN_MAX`].
    #[error("payload length {0} exceeds the maximum {PAYLOAD_LEN_MAX}")]
    PayloadTooLarge(u32),
    /// The BLAKE3 seal does not match the content.
    #[error("checksum mismatch")]
    ChecksumMismatch,
}

impl DecodeError {
    /// Whether this error can be a torn tail write (an incomplete batch), as opposed to corruption of
    /// complete bytes.
    pub fn is_truncation(&self) -> bool {
        matches!(self, DecodeError::Truncated { .. })
    }
}

/// Encodes one batch: header then payload, sealed with BLAKE3.
///
/// Panics if the arguments break the format's limits: callers validate client input long before.
pub fn encode_batch(
    kind: RecordKind,
    term: Term,
    first_seqno: Seqno,
    event_count: u32,
    payload: &[u8],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    encode_batch_into(&mut out, kind, term, first_seqno, event_count, payload);
    out
}

/// Like [`encode_batch`], appending to `out`.
pub fn encode_batch_into(
    out: &mut Vec<u8>,
    kind: RecordKind,
    term: Term,
    first_seqno: Seqno,
    event_count: u32,
    payload: &[u8],
) {
    assert!(event_count >= 1, "a batch consumes at least one seqno");
    assert!(first_seqno > Seqno::ZERO, "seqno 0 means no record");
    let payload_len = u32::try_from(payload.len())
        .ok()
        .filter(|len| *len <= PAYLOAD_LEN_MAX)
        .unwrap_or_else(|| panic!("payload of {} bytes over the limit", payload.len()));
    let mut head = [0u8; 32];
    head[0..4].copy_from_slice(&MAGIC);
    head[4] = FORMAT_VERSION;
    head[5] = kind.byte();
    head[8..16].copy_from_slice(&term.0.to_le_bytes());
    head[16..24].copy_from_slice(&first_seqno.0.to_le_bytes());
    head[24..28].copy_from_slice(&event_count.to_le_bytes());
    head[28..32].copy_from_slice(&payload_len.to_le_bytes());
    let hash = seal(&head, payload);
    out.extend_from_slice(&head);
    out.extend_from_slice(&hash);
    out.extend_from_slice(payload);
}

fn seal(head: &[u8; 32], payload: &[u8]) -> [u8; 32] {
    let mut hasher = blake3::Hasher::new();
    hasher.update(head);
    hasher.update(payload);
    *hasher.finalize().as_bytes()
}

fn u32_at(buf: &[u8], at: usize) -> u32 {
    let mut bytes = [0u8; 4];
    bytes.copy_from_slice(&buf[at..at + 4]);
    u32::from_le_bytes(bytes)
}

fn u64_at(buf: &[u8], at: usize) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&buf[at..at + 8]);
    u64::from_le_bytes(bytes)
}

/// Decodes and checks the header fields (not the seal) from the first 64 bytes of `buf`.
pub fn decode_header(buf: &[u8]) -> Result<BatchHeader, DecodeError> {
    if buf.len() < HEADER_LEN {
        return Err(DecodeError::Truncated { needed: HEADER_LEN, available: buf.len() });
    }
    let mut magic = [0u8; 4];
    magic.copy_from_slice(&buf[0..4]);
    if magic != MAGIC {
        return Err(DecodeError::BadMagic { found: magic });
    }
    if buf[4] != FORMAT_VERSION {
        return Err(DecodeError::UnsupportedVersion(buf[4]));
    }
    let kind = RecordKind::from_byte(buf[5]).ok_or(DecodeError::UnknownKind(buf[5]))?;
    if buf[6] != 0 || buf[7] != 0 {
        return Err(DecodeError::ReservedNotZero);
    }
    let term = Term(u64_at(buf, 8));
    let first = u64_at(buf, 16);
    let event_count = u32_at(buf, 24);
    let payload_len = u32_at(buf, 28);
    if event_count == 0 {
        return Err(DecodeError::ZeroEvents);
    }
    if first == 0 || first.checked_add(u64::from(event_count) - 1).is_none() {
        return Err(DecodeError::BadSeqnoRange { first, count: event_count });
    }
    if payload_len > PAYLOAD_LEN_MAX {
        return Err(DecodeError::PayloadTooLarge(payload_len));
    }
    let mut hash = [0u8; 32];
    hash.copy_from_slice(&buf[32..64]);
    Ok(BatchHeader { kind, term, first_seqno: Seqno(first), event_count, payload_len, hash })
}

/// A verified batch borrowed from a buffer.
#[derive(Clone, Copy, Debug)]
pub struct BatchRef<'a> {
    /// The header.
    pub header: BatchHeader,
    /// The payload bytes.
    pub payload: &'a [u8],
    /// The whole encoded batch (header + payload), byte-identical to the WAL.
    pub encoded: &'a [u8],
}

/// Decodes and verifies the batch at the start of `buf`. Returns it and its encoded length.
pub fn decode_batch(buf: &[u8]) -> Result<BatchRef<'_>, DecodeError> {
    let batch = decode_batch_unsealed(buf)?;
    check_seal(&batch)?;
    Ok(batch)
}

/// Checks a batch's BLAKE3 seal over its header fields and payload.
#[inline]
pub(crate) fn check_seal(batch: &BatchRef<'_>) -> Result<(), DecodeError> {
    let mut head = [0u8; 32];
    head.copy_from_slice(&batch.encoded[0..32]);
    if seal(&head, batch.payload) != batch.header.hash {
        return Err(DecodeError::ChecksumMismatch);
    }
    Ok(())
}

/// Whether `bytes`, a header and everything after it, verify as one batch once the header's
/// payload length is taken to be `bytes.len() - HEADER_LEN`: a complete batch whose length field
/// alone is damaged (recovery's test for a last batch that seems to run past the end of its file).
pub(crate) fn seals_as_whole(bytes: &[u8]) -> bool {
    let Some(payload_len) = bytes
        .len()
        .checked_sub(HEADER_LEN)
        .and_then(|len| u32::try_from(len).ok())
        .filter(|len| *len <= PAYLOAD_LEN_MAX)
    else {
        return false;
    };
    let mut head = [0u8; 32];
    head.copy_from_slice(&bytes[0..32]);
    head[28..32].copy_from_slice(&payload_len.to_le_bytes());
    seal(&head, &bytes[HEADER_LEN..]) == bytes[32..HEADER_LEN]
}

/// [`decode_batch`] without the seal: the header fields and the length are checked, the BLAKE3 hash
/// is not. Only for bytes whose seal this process has already checked (recovery's scan at open).
#[inline]
pub(crate) fn decode_batch_unsealed(buf: &[u8]) -> Result<BatchRef<'_>, DecodeError> {
    let header = decode_header(buf)?;
    let len = header.encoded_len();
    if buf.len() < len {
        return Err(DecodeError::Truncated { needed: len, available: buf.len() });
    }
    Ok(BatchRef { header, payload: &buf[HEADER_LEN..len], encoded: &buf[..len] })
}

/// An owned, verified batch (header + encoded bytes), cheap to clone and hand across threads.
///
/// The bytes are a [`bytes::Bytes`]: a batch received in a message is a slice of the message's
/// buffer, not a copy of its own (one allocation and one copy fewer per batch on a follower).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    header: BatchHeader,
    encoded: bytes::Bytes,
}

impl Batch {
    /// Decodes and verifies exactly one batch occupying all of `encoded`.
    pub fn from_encoded(encoded: impl Into<bytes::Bytes>) -> Result<Batch, DecodeError> {
        let encoded: bytes::Bytes = encoded.into();
        let batch = decode_batch(&encoded)?;
        let header = batch.header;
        if header.encoded_len() != encoded.len() {
            return Err(DecodeError::Truncated { needed: header.encoded_len(), available: encoded.len() });
        }
        Ok(Batch { header, encoded })
    }

    /// Wraps bytes this crate has just encoded or verified, without hashing them again (the seal is
    /// re-checked in debug builds). Fails only on a malformed header.
    pub(crate) fn from_verified(encoded: bytes::Bytes) -> Result<Batch, DecodeError> {
        let batch = Batch::from_recovered(encoded)?;
        debug_assert!(decode_batch(&batch.encoded).is_ok(), "a batch handed out by the WAL fails its seal");
        Ok(batch)
    }

    /// A batch whose seal recovery checked when this WAL was opened
    /// ([`crate::Wal::read_recovered_from`]): the bytes are read again, so unlike
    /// [`Batch::from_verified`] there is nothing to assert about them.
    pub(crate) fn from_recovered(encoded: bytes::Bytes) -> Result<Batch, DecodeError> {
        let header = decode_header(&encoded)?;
        if header.encoded_len() != encoded.len() {
            return Err(DecodeError::Truncated { needed: header.encoded_len(), available: encoded.len() });
        }
        Ok(Batch { header, encoded })
    }

    /// Encodes a new batch.
    pub fn new(kind: RecordKind, term: Term, first_seqno: Seqno, event_count: u32, payload: &[u8]) -> Batch {
        let encoded: bytes::Bytes = encode_batch(kind, term, first_seqno, event_count, payload).into();
        let header = decode_header(&encoded).expect("a batch we just encoded decodes");
        Batch { header, encoded }
    }

    /// The header.
    pub fn header(&self) -> &BatchHeader {
        &self.header
    }

    /// Kind of the batch.
    pub fn kind(&self) -> RecordKind {
        self.header.kind
    }

    /// First seqno.
    pub fn first_seqno(&self) -> Seqno {
        self.header.first_seqno
    }

    /// Last seqno (inclusive).
    pub fn last_seqno(&self) -> Seqno {
        self.header.last_seqno()
    }

    /// Term of the writing leader.
    pub fn term(&self) -> Term {
        self.header.term
    }

    /// The payload.
    pub fn payload(&self) -> &[u8] {
        &self.encoded[HEADER_LEN..]
    }

    /// Header + payload, byte-identical to the WAL.
    pub fn encoded(&self) -> &[u8] {
        &self.encoded
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        encode_batch(RecordKind::ItemMetadata, Term(3), Seqno(10), 1, b"\x01\0\0\0\0\0\0\0{}")
    }

    #[test]
    fn kind_byte_is_at_offset_5_and_round_trips() {
        let bytes = sample();
        assert_eq!(bytes.len(), HEADER_LEN + 10);
        assert_eq!(bytes[5], RecordKind::ItemMetadata.byte());
        let batch = decode_batch(&bytes).unwrap();
        assert_eq!(batch.header.term, Term(3));
        assert_eq!(batch.header.first_seqno, Seqno(10));
        assert_eq!(batch.header.last_seqno(), Seqno(10));
        assert_eq!(batch.encoded, &bytes[..]);
    }

    #[test]
    fn every_flipped_bit_is_detected() {
        let bytes = sample();
        for bit in 0..bytes.len() * 8 {
            let mut copy = bytes.clone();
            copy[bit / 8] ^= 1 << (bit % 8);
            assert!(decode_batch(&copy).is_err(), "flip of bit {bit} went unnoticed");
        }
    }

    #[test]
    fn a_batch_seals_as_whole_only_with_its_own_length() {
        let bytes = sample();
        assert!(seals_as_whole(&bytes));
        let mut grown = bytes.clone();
        grown[28] ^= 8;
        assert!(decode_batch(&grown).is_err());
        assert!(seals_as_whole(&grown), "only the length field differs");
        for len in 0..bytes.len() {
            assert!(!seals_as_whole(&bytes[..len]), "cut to {len}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(!seals_as_whole(&longer));
    }

    #[test]
    fn every_truncation_is_reported_as_truncation() {
        let bytes = sample();
        for len in 0..bytes.len() {
            let err = decode_batch(&bytes[..len]).unwrap_err();
            assert!(err.is_truncation(), "len {len}: {err}");
        }
    }
}
