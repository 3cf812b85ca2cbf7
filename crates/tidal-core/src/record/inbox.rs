//! The inbox records, kinds 7 and 8 (the layout is in the parent module's table).
//!
//! The limits an apply judges by (backlog and topic caps, the dedupe and receipt windows, how
//! much one receive may take) travel in the records: the leader writes its configuration into
//! each record, so every node decides the same whatever its own configuration says, and a limit
//! changed later applies from the records written after the change.

use super::{name16, put_str16, Reader, Records};
use crate::record_error::RecordError;

/// Inbox control tag of [`InboxConsume::Receive`].
pub const INBOX_TAG_RECEIVE: u8 = 1;
/// Inbox control tag of [`InboxConsume::Ack`].
pub const INBOX_TAG_ACK: u8 = 2;
/// Inbox control tag of [`InboxConsume::Discard`].
pub const INBOX_TAG_DISCARD: u8 = 3;
/// Inbox control tag of [`InboxConsume::Close`].
pub const INBOX_TAG_CLOSE: u8 = 4;
/// Longest owner or topic name: its length is one byte in the inbox keys.
pub const INBOX_NAME_BYTES_MAX: usize = u8::MAX as usize;

/// The limits a send is judged by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendLimits {
    /// Most unconsumed messages one topic holds; a send past it is refused (inbox_full).
    pub backlog_max: u32,
    /// Most live topics (with unconsumed messages) per owner; a send opening one more is refused.
    pub topics_max: u32,
    /// Most (sender, message_id) entries the owner's dedupe window keeps.
    pub dedupe_max: u32,
    /// Oldest entry (seconds, by logged time) the dedupe window keeps.
    pub dedupe_age_s: u32,
}

/// Kind 7: one message for one owner's topic. The sender is the batch's principal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InboxSend {
    /// The inbox's owner.
    pub owner: String,
    /// The topic.
    pub topic: String,
    /// The sender's id for the message (its dedupe key with the sender).
    pub message_id: String,
    /// Compact JSON text.
    pub payload: Vec<u8>,
    /// What the apply judges the send by.
    pub limits: SendLimits,
}

/// The limits a receive is judged by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReceiveLimits {
    /// Most messages the receive takes; 0 takes none and binds the receive id to nothing (a
    /// receive that found nothing in its wait closes its id so).
    pub max: u32,
    /// Most payload bytes it takes (it takes at least one message whatever its size).
    pub bytes_max: u32,
    /// Most receipts (receive_id → what it took) the owner keeps.
    pub receipts_max: u32,
    /// Oldest receipt (seconds, by logged time) the owner keeps.
    pub receipt_age_s: u32,
}

/// Kind 8: a consumption, an ack, a discard or a close.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InboxConsume {
    /// Takes the oldest available messages across `topics`, bound to `receive_id`.
    Receive {
        /// The inbox's owner.
        owner: String,
        /// The receiver's id for this attempt.
        receive_id: String,
        /// Distinct topics, at least one.
        topics: Vec<String>,
        /// 0: consumed now; else held for this receive this long and consumed by an ack.
        lease_ms: u32,
        /// What the apply judges the receive by.
        limits: ReceiveLimits,
    },
    /// Consumes the messages a leased receive holds.
    Ack {
        /// The inbox's owner.
        owner: String,
        /// The receive.
        receive_id: String,
    },
    /// Drops a topic's unconsumed messages with sequences at or below `through`.
    Discard {
        /// The inbox's owner.
        owner: String,
        /// The topic.
        topic: String,
        /// The last sequence to drop.
        through: u64,
        /// True when the leader's TTL expiry wrote it, false for an operator's discard.
        expired: bool,
    },
    /// Closes the inbox: its unconsumed messages are dropped, later sends refused.
    Close {
        /// The inbox's owner.
        owner: String,
    },
}

impl InboxConsume {
    /// The owner the record is about.
    pub fn owner(&self) -> &str {
        match self {
            InboxConsume::Receive { owner, .. }
            | InboxConsume::Ack { owner, .. }
            | InboxConsume::Discard { owner, .. }
            | InboxConsume::Close { owner } => owner,
        }
    }
}

pub(super) fn put_send(out: &mut Vec<u8>, send: &InboxSend) {
    put_str16(out, &send.owner);
    put_str16(out, &send.topic);
    put_str16(out, &send.message_id);
    let SendLimits { backlog_max, topics_max, dedupe_max, dedupe_age_s } = send.limits;
    for n in [backlog_max, topics_max, dedupe_max, dedupe_age_s] {
        out.extend_from_slice(&n.to_le_bytes());
    }
    let len = u32::try_from(send.payload.len()).expect("payload size checked by the API");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&send.payload);
}

pub(super) fn put_consume(out: &mut Vec<u8>, consume: &InboxConsume) {
    match consume {
        InboxConsume::Receive { owner, receive_id, topics, lease_ms, limits } => {
            out.push(INBOX_TAG_RECEIVE);
            put_str16(out, owner);
            put_str16(out, receive_id);
            assert!(!topics.is_empty(), "a receive names at least one topic");
            out.push(u8::try_from(topics.len()).expect("topic count checked by the API"));
            for topic in topics {
                put_str16(out, topic);
            }
            let ReceiveLimits { max, bytes_max, receipts_max, receipt_age_s } = *limits;
            for n in [*lease_ms, max, bytes_max, receipts_max, receipt_age_s] {
                out.extend_from_slice(&n.to_le_bytes());
            }
        }
        InboxConsume::Ack { owner, receive_id } => {
            out.push(INBOX_TAG_ACK);
            put_str16(out, owner);
            put_str16(out, receive_id);
        }
        InboxConsume::Discard { owner, topic, through, expired } => {
            out.push(INBOX_TAG_DISCARD);
            put_str16(out, owner);
            put_str16(out, topic);
            out.extend_from_slice(&through.to_le_bytes());
            out.push(u8::from(*expired));
        }
        InboxConsume::Close { owner } => {
            out.push(INBOX_TAG_CLOSE);
            put_str16(out, owner);
        }
    }
}

/// An owner or topic: not empty, at most [`INBOX_NAME_BYTES_MAX`] bytes (it goes into keys).
fn key_name(reader: &mut Reader<'_>, field: &'static str) -> Result<String, RecordError> {
    let name = name16(reader, field)?;
    if name.len() > INBOX_NAME_BYTES_MAX {
        return Err(RecordError::TooLong { field, len: name.len(), max: INBOX_NAME_BYTES_MAX });
    }
    Ok(name)
}

/// A message or receive id: not empty, at most 256 bytes.
fn id_name(reader: &mut Reader<'_>, field: &'static str) -> Result<String, RecordError> {
    let id = name16(reader, field)?;
    let max = tidal_types::INBOX_ID_BYTES_MAX;
    if id.len() > max {
        return Err(RecordError::TooLong { field, len: id.len(), max });
    }
    Ok(id)
}

pub(super) fn decode_send(reader: &mut Reader<'_>) -> Result<Records, RecordError> {
    let owner = key_name(reader, "inbox owner")?;
    let topic = key_name(reader, "inbox topic")?;
    let message_id = id_name(reader, "message id")?;
    let limits = SendLimits {
        backlog_max: reader.u32("backlog max")?,
        topics_max: reader.u32("topics max")?,
        dedupe_max: reader.u32("dedupe max")?,
        dedupe_age_s: reader.u32("dedupe age")?,
    };
    let len = reader.u32("message payload length")? as usize;
    let payload = reader.take("message payload", len)?;
    if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(payload) {
        return Err(RecordError::BadJson { field: "message payload", reason: e.to_string() });
    }
    let payload = payload.to_vec();
    Ok(Records::InboxSend(InboxSend { owner, topic, message_id, payload, limits }))
}

pub(super) fn decode_consume(reader: &mut Reader<'_>) -> Result<Records, RecordError> {
    let consume = match reader.u8("inbox control tag")? {
        INBOX_TAG_RECEIVE => {
            let owner = key_name(reader, "inbox owner")?;
            let receive_id = id_name(reader, "receive id")?;
            let count = reader.u8("receive topic count")?;
            if count == 0 {
                return Err(RecordError::EmptyName { field: "receive topics" });
            }
            let topics =
                (0..count).map(|_| key_name(reader, "inbox topic")).collect::<Result<Vec<_>, _>>()?;
            let lease_ms = reader.u32("lease ms")?;
            let limits = ReceiveLimits {
                max: reader.u32("receive max")?,
                bytes_max: reader.u32("receive bytes max")?,
                receipts_max: reader.u32("receipts max")?,
                receipt_age_s: reader.u32("receipt age")?,
            };
            InboxConsume::Receive { owner, receive_id, topics, lease_ms, limits }
        }
        INBOX_TAG_ACK => InboxConsume::Ack {
            owner: key_name(reader, "inbox owner")?,
            receive_id: id_name(reader, "receive id")?,
        },
        INBOX_TAG_DISCARD => InboxConsume::Discard {
            owner: key_name(reader, "inbox owner")?,
            topic: key_name(reader, "inbox topic")?,
            through: reader.u64("discard through")?,
            expired: match reader.u8("discard reason")? {
                0 => false,
                1 => true,
                tag => return Err(RecordError::UnknownTag { field: "discard reason", tag }),
            },
        },
        INBOX_TAG_CLOSE => InboxConsume::Close { owner: key_name(reader, "inbox owner")? },
        tag => return Err(RecordError::UnknownTag { field: "inbox control tag", tag }),
    };
    Ok(Records::InboxConsume(consume))
}
