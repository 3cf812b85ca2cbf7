//! Why a payload does not decode: [`RecordError`].
//!
//! Every variant is loud. A payload that fails to decode is never skipped: the apply path stops on
//! it, because skipping would make this node's state diverge from the others'.

/// Why the bytes of a payload are not a valid envelope + records of their kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The payload ends before a field that must be there.
    #[error("payload truncated reading {field}: need {needed} bytes at offset {offset}, have {available}")]
    Truncated {
        /// What was being read.
        field: &'static str,
        /// Offset where the field starts.
        offset: usize,
        /// Bytes the field needs.
        needed: usize,
        /// Bytes left.
        available: usize,
    },
    /// Bytes are left after the last record.
    #[error("{count} trailing bytes after the records")]
    TrailingBytes {
        /// How many.
        count: usize,
    },
    /// A string field is not UTF-8.
    #[error("{field} is not valid UTF-8")]
    NotUtf8 {
        /// Which field.
        field: &'static str,
    },
    /// A float field holds NaN or an infinity.
    #[error("{field} is not a finite number")]
    NonFinite {
        /// Which field.
        field: &'static str,
    },
    /// Item metadata is not JSON text.
    #[error("item metadata is not valid JSON: {reason}")]
    BadMetadata {
        /// The JSON parser's message.
        reason: String,
    },
    /// A signal or stream batch with zero events.
    #[error("payload has zero events")]
    NoEvents,
    /// A stream event payload is not JSON text.
    #[error("{field} is not valid JSON: {reason}")]
    BadJson {
        /// Which field.
        field: &'static str,
        /// The JSON parser's message.
        reason: String,
    },
    /// A name that must not be empty is (a stream, a consumer, an event key).
    #[error("{field} is empty")]
    EmptyName {
        /// Which field.
        field: &'static str,
    },
    /// A tag byte this build does not know.
    #[error("unknown {field} {tag}")]
    UnknownTag {
        /// Which tag.
        field: &'static str,
        /// Its value.
        tag: u8,
    },
    /// A control record tag this build does not know.
    #[error("unknown control record tag {0}")]
    UnknownControlTag(u8),
    /// A name or id longer than its field allows.
    #[error("{field} of {len} bytes is longer than {max}")]
    TooLong {
        /// Which field.
        field: &'static str,
        /// Its length.
        len: usize,
        /// The most it may be.
        max: usize,
    },
}
