//! The record kinds of the log. The kind byte sits at offset 5 of every WAL batch header.

use std::fmt;

/// What a WAL batch holds. Framing treats payloads as opaque; only encoders and appliers know kinds.
///
/// An unknown kind byte is an error wherever it is met, never skipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum RecordKind {
    /// Signal events (many per batch).
    Signal = 0,
    /// Item metadata: one record `item_id u64 LE | metadata bytes`.
    ItemMetadata = 1,
    /// Item embedding: one record `item_id u64 LE | dim u32 LE | f32 x dim LE`.
    ItemEmbedding = 2,
    /// Item delete.
    ItemDelete = 3,
    /// Control markers (LeaderStart and others).
    Control = 4,
    /// Stream events.
    StreamEvents = 5,
    /// Stream control (consumer offset, trim).
    StreamControl = 6,
    /// Inbox send.
    InboxSend = 7,
    /// Inbox consume / discard / close.
    InboxConsume = 8,
    /// An atomic multi-write: records of several kinds (0, 1, 2, 3, 5, 6) in one batch.
    Tx = 9,
}

impl RecordKind {
    /// Every kind, in byte order.
    pub const ALL: [RecordKind; 10] = [
        RecordKind::Signal,
        RecordKind::ItemMetadata,
        RecordKind::ItemEmbedding,
        RecordKind::ItemDelete,
        RecordKind::Control,
        RecordKind::StreamEvents,
        RecordKind::StreamControl,
        RecordKind::InboxSend,
        RecordKind::InboxConsume,
        RecordKind::Tx,
    ];

    /// The kind for a header byte, or `None` for a byte no kind uses.
    pub fn from_byte(byte: u8) -> Option<RecordKind> {
        RecordKind::ALL.get(usize::from(byte)).copied()
    }

    /// The header byte.
    pub fn byte(self) -> u8 {
        self as u8
    }

    /// A short lowercase name for logs and metrics.
    pub fn name(self) -> &'static str {
        match self {
            RecordKind::Signal => "signal",
            RecordKind::ItemMetadata => "item_metadata",
            RecordKind::ItemEmbedding => "item_embedding",
            RecordKind::ItemDelete => "item_delete",
            RecordKind::Control => "control",
            RecordKind::StreamEvents => "stream_events",
            RecordKind::StreamControl => "stream_control",
            RecordKind::InboxSend => "inbox_send",
            RecordKind::InboxConsume => "inbox_consume",
            RecordKind::Tx => "tx",
        }
    }
}

impl fmt::Display for RecordKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_and_unknown_bytes_are_none() {
        for kind in RecordKind::ALL {
            assert_eq!(RecordKind::from_byte(kind.byte()), Some(kind));
        }
        for byte in 10..=255u8 {
            assert_eq!(RecordKind::from_byte(byte), None);
        }
    }
}
