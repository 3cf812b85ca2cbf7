//! The payload codec: envelope + records of one WAL batch, encoded by the server and decoded by
//! every node.
//!
//! ```text
//! envelope: time_ms u64 | principal: u16 len + UTF-8 | idempotency_key: u16 len + UTF-8 (may be empty)
//! kind 0 Signal:        count u32, then per event:
//!                       user u16 len + UTF-8 | item u64 | kind-name u8 len + UTF-8 | weight f64 | ts_ms i64
//! kind 1 ItemMetadata:  item u64 | metadata (compact JSON text, the rest of the payload)
//! kind 2 ItemEmbedding: item u64 | dim u32 | f32 x dim
//! kind 3 ItemDelete:    item u64
//! kind 4 Control:       tag u8 (1 = LeaderStart: term u64 | leader u64 | baseline u64)
//! kind 5 StreamEvents:  stream u16 len + UTF-8 | count u32, then per event:
//!                       key tag u8 (0 = none, 1 = key u16 len + UTF-8) | payload u32 len + JSON text
//! kind 6 StreamControl: tag u8, then
//!                       1 = SaveOffset: stream u16 len + UTF-8 | consumer u16 len + UTF-8 | offset u64
//!                       2 = Trim:       stream u16 len + UTF-8 | through u64
//! kind 7 InboxSend:     owner u16 len + UTF-8 | topic u16 len + UTF-8 | message_id u16 len + UTF-8 |
//!                       backlog_max u32 | topics_max u32 | dedupe_max u32 | dedupe_age_s u32 |
//!                       payload u32 len + JSON text                  (the sender is the principal)
//! kind 8 InboxConsume:  tag u8, then
//!                       1 = Receive: owner | receive_id | topic count u8 (>= 1) + topics (u16 len
//!                           + UTF-8 each) | lease_ms u32 | max u32 | bytes_max u32 |
//!                           receipts_max u32 | receipt_age_s u32
//!                       2 = Ack:     owner | receive_id
//!                       3 = Discard: owner | topic | through u64 | reason u8 (0 operator, 1 expired)
//!                       4 = Close:   owner
//! kind 9 Tx:            count u32, then per op: kind u8 (one of TX_OP_KINDS) | len u32 | the
//!                       records of that kind as above, without an envelope (exactly len bytes)
//! ```
//!
//! All integers and floats are little-endian.
//!
//! Delicate:
//! - `time_ms` MUST stay at bytes 0..8: the WAL writer overwrites that slot with the logged time when
//!   it sequences the batch ([`ENVELOPE_TIME_RANGE`]).
//! - Decoding takes untrusted bytes and never panics: every length is checked before it is used,
//!   counts are checked against the bytes left before anything is allocated, trailing bytes, bad
//!   UTF-8 and non-finite floats are errors.
//! - `ts_ms == i64::MIN` means "absent" on the wire; [`SignalEvent::ts_ms`] is `None` then. An event
//!   whose own `ts_ms` is `i64::MIN` cannot be expressed, which the API never needs.
//! - This format is binding across nodes and versions: changing it needs a decision record.

use tidal_types::{NodeId, RecordKind, Seqno, Term};

use crate::fast_hash::FastMap;
use crate::record_error::RecordError;

mod inbox;

pub use inbox::{
    InboxConsume, InboxSend, ReceiveLimits, SendLimits, INBOX_NAME_BYTES_MAX, INBOX_TAG_ACK, INBOX_TAG_CLOSE,
    INBOX_TAG_DISCARD, INBOX_TAG_RECEIVE,
};

/// Byte range of the envelope time inside every payload; the WAL writer stamps it.
pub const ENVELOPE_TIME_RANGE: std::ops::Range<usize> = 0..8;
/// Longest principal, idempotency key or user id: the wire length field is a u16.
pub const STRING_LEN_MAX: usize = u16::MAX as usize;
/// Longest signal kind name: the wire length field is a u8.
pub const SIGNAL_KIND_LEN_MAX: usize = u8::MAX as usize;
/// Wire value of an absent signal timestamp.
pub const TS_ABSENT: i64 = i64::MIN;
/// Control tag of [`ControlRecord::LeaderStart`].
pub const CONTROL_TAG_LEADER_START: u8 = 1;
/// Stream control tag of [`StreamControl::SaveOffset`].
pub const STREAM_TAG_SAVE_OFFSET: u8 = 1;
/// Stream control tag of [`StreamControl::Trim`].
pub const STREAM_TAG_TRIM: u8 = 2;
/// Largest stream event payload the codec can carry (its length field is a u32); the API's limit is
/// far lower.
pub const STREAM_PAYLOAD_LEN_MAX: usize = u32::MAX as usize;

/// Smallest encoded signal event (empty user and kind): lets the decoder reject an impossible count
/// before allocating for it.
const SIGNAL_EVENT_LEN_MIN: usize = 2 + 8 + 1 + 8 + 8;
/// Smallest encoded stream event (no key, empty payload), for the same check.
const STREAM_EVENT_LEN_MIN: usize = 1 + 4;

/// The head of every payload.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Envelope {
    /// Logged time (unix ms); the WAL writer overwrites it when it sequences the batch.
    pub time_ms: u64,
    /// Who wrote the batch.
    pub principal: String,
    /// The Idempotency-Key of the write; empty when none.
    pub idempotency_key: String,
}

/// One user–item interaction.
#[derive(Clone, Debug, PartialEq)]
pub struct SignalEvent {
    /// User id.
    pub user: String,
    /// Item id.
    pub item: u64,
    /// Signal kind name (view, click...).
    pub kind: String,
    /// Weight; finite.
    pub weight: f64,
    /// Event time (unix ms); `None` means the envelope time.
    pub ts_ms: Option<i64>,
}

/// A control marker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControlRecord {
    /// First batch of a term: the leader took office.
    LeaderStart {
        /// The new term.
        term: Term,
        /// The leader's node id.
        leader: NodeId,
        /// Stream baseline B(term): the seqno after which this leader writes.
        baseline: Seqno,
    },
}

/// One event of a stream publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublishEvent {
    /// Carried metadata: `None`, or a non-empty string. It buys no ordering.
    pub key: Option<String>,
    /// The event's payload: compact JSON text.
    pub payload: Vec<u8>,
}

/// A stream control record (kind 6).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamControl {
    /// Moves a consumer's saved offset forward (never back).
    SaveOffset {
        /// The stream.
        stream: String,
        /// The consumer's name.
        consumer: String,
        /// The offset to save.
        offset: u64,
    },
    /// Deletes the stream's events with offsets at or below `through`.
    Trim {
        /// The stream.
        stream: String,
        /// The last offset to delete.
        through: u64,
    },
}

/// The records of one payload, by kind.
#[derive(Clone, Debug, PartialEq)]
pub enum Records {
    /// Kind 0: signal events (at least one).
    Signals(Vec<SignalEvent>),
    /// Kind 1: item metadata upsert.
    ItemMetadata {
        /// Item id.
        item: u64,
        /// Compact JSON text.
        metadata: Vec<u8>,
    },
    /// Kind 2: item embedding upsert.
    ItemEmbedding {
        /// Item id.
        item: u64,
        /// The vector; finite.
        vector: Vec<f32>,
    },
    /// Kind 3: item delete.
    ItemDelete {
        /// Item id.
        item: u64,
    },
    /// Kind 4: control marker.
    Control(ControlRecord),
    /// Kind 5: events published to one stream (at least one); event i gets seqno first + i.
    StreamEvents {
        /// The stream.
        stream: String,
        /// The events, in order.
        events: Vec<PublishEvent>,
    },
    /// Kind 6: a consumer offset or a trim.
    StreamControl(StreamControl),
    /// Kind 7: one inbox message.
    InboxSend(InboxSend),
    /// Kind 8: an inbox consumption, ack, discard or close.
    InboxConsume(InboxConsume),
    /// Kind 9: records of kinds [`TX_OP_KINDS`] written as one batch, applied in order, all or
    /// nothing; op i's first seqno follows the seqnos of the ops before it.
    Tx(Vec<Records>),
}

/// The kinds a tx may hold.
pub const TX_OP_KINDS: [RecordKind; 6] = [
    RecordKind::Signal,
    RecordKind::ItemMetadata,
    RecordKind::ItemEmbedding,
    RecordKind::ItemDelete,
    RecordKind::StreamEvents,
    RecordKind::StreamControl,
];

impl Records {
    /// The record kind these records are logged as.
    pub fn kind(&self) -> RecordKind {
        match self {
            Records::Signals(_) => RecordKind::Signal,
            Records::ItemMetadata { .. } => RecordKind::ItemMetadata,
            Records::ItemEmbedding { .. } => RecordKind::ItemEmbedding,
            Records::ItemDelete { .. } => RecordKind::ItemDelete,
            Records::Control(_) => RecordKind::Control,
            Records::StreamEvents { .. } => RecordKind::StreamEvents,
            Records::StreamControl(_) => RecordKind::StreamControl,
            Records::InboxSend(_) => RecordKind::InboxSend,
            Records::InboxConsume(_) => RecordKind::InboxConsume,
            Records::Tx(_) => RecordKind::Tx,
        }
    }

    /// Seqnos the records consume: one per signal or stream event, one for any other kind.
    pub fn event_count(&self) -> u64 {
        match self {
            Records::Signals(events) => events.len() as u64,
            Records::StreamEvents { events, .. } => events.len() as u64,
            Records::Tx(ops) => ops.iter().map(Records::event_count).sum(),
            _ => 1,
        }
    }
}

/// What [`encode_payload`] returns: everything needed to build the batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EncodedPayload {
    /// Kind byte of the batch.
    pub kind: RecordKind,
    /// Seqnos the batch consumes.
    pub event_count: u32,
    /// The payload bytes.
    pub payload: Vec<u8>,
}

/// Encodes an envelope and its records.
///
/// Panics if a string is longer than its length field ([`STRING_LEN_MAX`], [`SIGNAL_KIND_LEN_MAX`]),
/// if a signal or stream batch is empty or holds more than `u32::MAX` events, or if an embedding or a
/// stream payload is longer than `u32::MAX`: the API validates client input against these limits
/// long before.
pub fn encode_payload(envelope: &Envelope, records: &Records) -> EncodedPayload {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&envelope.time_ms.to_le_bytes());
    put_str16(&mut out, &envelope.principal);
    put_str16(&mut out, &envelope.idempotency_key);
    let event_count = encode_records(&mut out, records);
    EncodedPayload { kind: records.kind(), event_count, payload: out }
}

/// Appends `records` (what follows the envelope) to `out`; returns the seqnos they consume.
fn encode_records(out: &mut Vec<u8>, records: &Records) -> u32 {
    match records {
        Records::Signals(events) => {
            assert!(!events.is_empty(), "a signal batch holds at least one event");
            let count = u32::try_from(events.len()).expect("signal count checked by the API");
            out.extend_from_slice(&count.to_le_bytes());
            for event in events {
                put_event(out, event);
            }
            count
        }
        Records::ItemMetadata { item, metadata } => {
            out.extend_from_slice(&item.to_le_bytes());
            out.extend_from_slice(metadata);
            1
        }
        Records::ItemEmbedding { item, vector } => {
            out.extend_from_slice(&item.to_le_bytes());
            let dim = u32::try_from(vector.len()).expect("dimension checked by the API");
            out.extend_from_slice(&dim.to_le_bytes());
            crate::keys::f32s_to_bytes(vector, out);
            1
        }
        Records::ItemDelete { item } => {
            out.extend_from_slice(&item.to_le_bytes());
            1
        }
        Records::Control(ControlRecord::LeaderStart { term, leader, baseline }) => {
            out.push(CONTROL_TAG_LEADER_START);
            out.extend_from_slice(&term.0.to_le_bytes());
            out.extend_from_slice(&leader.0.to_le_bytes());
            out.extend_from_slice(&baseline.0.to_le_bytes());
            1
        }
        Records::StreamEvents { stream, events } => put_stream_events(out, stream, events),
        Records::StreamControl(control) => {
            put_stream_control(out, control);
            1
        }
        Records::InboxSend(send) => {
            inbox::put_send(out, send);
            1
        }
        Records::InboxConsume(consume) => {
            inbox::put_consume(out, consume);
            1
        }
        Records::Tx(ops) => put_tx(out, ops),
    }
}

fn put_tx(out: &mut Vec<u8>, ops: &[Records]) -> u32 {
    assert!(!ops.is_empty(), "a tx holds at least one op");
    let count = u32::try_from(ops.len()).expect("op count checked by the API");
    out.extend_from_slice(&count.to_le_bytes());
    let mut events = 0u32;
    for op in ops {
        assert!(TX_OP_KINDS.contains(&op.kind()), "a tx cannot hold a {} record", op.kind());
        out.push(op.kind().byte());
        let len_at = out.len();
        out.extend_from_slice(&[0; 4]);
        events = events.checked_add(encode_records(out, op)).expect("tx size checked by the API");
        let len = u32::try_from(out.len() - len_at - 4).expect("tx size checked by the API");
        out[len_at..len_at + 4].copy_from_slice(&len.to_le_bytes());
    }
    events
}

/// Decodes a payload of `kind`. Never panics; see the module docs for what is checked.
pub fn decode_payload(kind: RecordKind, payload: &[u8]) -> Result<(Envelope, Records), RecordError> {
    let mut reader = Reader { buf: payload, at: 0 };
    let envelope = decode_envelope(&mut reader)?;
    let records = match kind {
        RecordKind::Signal => decode_signals(&mut reader)?,
        kind => decode_other(&mut reader, kind)?,
    };
    reader.finish()?;
    Ok((envelope, records))
}

/// Records as the engine folds them: signals as [`SignalColumns`], every other kind as
/// [`Records`]. Decoded by [`decode_for_apply`], with the same reader and checks as
/// [`decode_payload`].
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum FoldRecords {
    /// Kind 0: signal events (at least one).
    Signals(SignalColumns),
    /// Kind 9: the ops, each as the engine folds it.
    Tx(Vec<FoldRecords>),
    /// Any other kind.
    Other(Records),
}

impl FoldRecords {
    /// Seqnos the records consume: one per signal event, one for any other kind.
    pub fn event_count(&self) -> u64 {
        match self {
            FoldRecords::Signals(signals) => signals.len() as u64,
            FoldRecords::Tx(ops) => ops.iter().map(FoldRecords::event_count).sum(),
            FoldRecords::Other(records) => records.event_count(),
        }
    }
}

/// [`decode_payload`] for the apply path: the same checks and errors, but signal events land in
/// [`SignalColumns`] (two allocations per batch, not two per event).
pub(crate) fn decode_for_apply(
    kind: RecordKind,
    payload: &[u8],
) -> Result<(Envelope, FoldRecords), RecordError> {
    let mut reader = Reader { buf: payload, at: 0 };
    let envelope = decode_envelope(&mut reader)?;
    let records = decode_fold_records(&mut reader, kind)?;
    reader.finish()?;
    Ok((envelope, records))
}

fn decode_fold_records(reader: &mut Reader<'_>, kind: RecordKind) -> Result<FoldRecords, RecordError> {
    Ok(match kind {
        RecordKind::Signal => FoldRecords::Signals(decode_signal_columns(reader)?),
        RecordKind::Tx => {
            FoldRecords::Tx(decode_tx(reader, |kind, reader| decode_fold_records(reader, kind))?)
        }
        kind => FoldRecords::Other(decode_other(reader, kind)?),
    })
}

/// Smallest encoded tx op: kind byte and body length.
const TX_OP_LEN_MIN: usize = 1 + 4;

/// The ops of a tx, each decoded by `op` from exactly its body's bytes.
fn decode_tx<T>(
    reader: &mut Reader<'_>,
    op: impl Fn(RecordKind, &mut Reader<'_>) -> Result<T, RecordError>,
) -> Result<Vec<T>, RecordError> {
    let count = reader.count(("tx op count", "tx ops"), TX_OP_LEN_MIN)?;
    let mut ops = Vec::with_capacity(count);
    for _ in 0..count {
        let byte = reader.u8("tx op kind")?;
        let kind = RecordKind::from_byte(byte)
            .filter(|kind| TX_OP_KINDS.contains(kind))
            .ok_or(RecordError::UnknownTag { field: "tx op kind", tag: byte })?;
        let len = reader.u32("tx op length")? as usize;
        let mut body = Reader { buf: reader.take("tx op", len)?, at: 0 };
        ops.push(op(kind, &mut body)?);
        body.finish()?;
    }
    Ok(ops)
}

/// The signal events of one batch, packed for the fold: every user name in one string, every
/// distinct kind name once. Built only by [`decode_for_apply`] from a payload's bytes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SignalColumns {
    /// The user names of the events, one after the other.
    users: String,
    /// The distinct kind names of the batch, in first-seen order.
    kinds: Vec<Box<str>>,
    events: Vec<PackedSignal>,
}

/// One event of [`SignalColumns`].
#[derive(Clone, Copy, Debug, PartialEq)]
struct PackedSignal {
    /// End of the user name in `users` (it starts where the previous event's ends).
    user_end: usize,
    item: u64,
    /// Index in `kinds`.
    kind: u32,
    weight: f64,
    ts_ms: Option<i64>,
}

/// One event of [`SignalColumns`], borrowed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SignalRef<'a> {
    /// User id.
    pub user: &'a str,
    /// Item id.
    pub item: u64,
    /// Index of the kind name in [`SignalColumns::kinds`].
    pub kind: u32,
    /// Weight; finite.
    pub weight: f64,
    /// Event time (unix ms); `None` means the envelope time.
    pub ts_ms: Option<i64>,
}

impl SignalColumns {
    /// Number of events.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether there are no events (never, for a decoded batch).
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The distinct kind names, indexed by [`SignalRef::kind`].
    pub fn kinds(&self) -> &[Box<str>] {
        &self.kinds
    }

    /// The events in log order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = SignalRef<'_>> + '_ {
        let mut start = 0;
        self.events.iter().map(move |event| {
            let user = &self.users[start..event.user_end];
            start = event.user_end;
            SignalRef { user, item: event.item, kind: event.kind, weight: event.weight, ts_ms: event.ts_ms }
        })
    }

    /// The events' item ids in log order.
    pub fn items(&self) -> impl ExactSizeIterator<Item = u64> + '_ {
        self.events.iter().map(|event| event.item)
    }

    /// The events as [`SignalEvent`]s (allocates), for tests and tools.
    pub fn to_events(&self) -> Vec<SignalEvent> {
        self.iter()
            .map(|event| SignalEvent {
                user: event.user.to_owned(),
                item: event.item,
                kind: self.kinds[event.kind as usize].to_string(),
                weight: event.weight,
                ts_ms: event.ts_ms,
            })
            .collect()
    }
}

/// Every kind but signals: the rest of the payload after the envelope.
fn decode_other(reader: &mut Reader<'_>, kind: RecordKind) -> Result<Records, RecordError> {
    Ok(match kind {
        RecordKind::Signal => decode_signals(reader)?,
        RecordKind::ItemMetadata => {
            let item = reader.u64("item id")?;
            let metadata = reader.rest().to_vec();
            if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(&metadata) {
                return Err(RecordError::BadMetadata { reason: e.to_string() });
            }
            Records::ItemMetadata { item, metadata }
        }
        RecordKind::ItemEmbedding => {
            let item = reader.u64("item id")?;
            let dim = reader.u32("embedding dimension")? as usize;
            let bytes = reader.take("embedding values", dim.saturating_mul(4))?;
            // Convert, then check: both loops are branch-free and vectorize (an early return per
            // value kept the conversion scalar; replay decodes every embedding in the log).
            let vector: Vec<f32> =
                bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            if !crate::keys::all_finite(&vector) {
                return Err(RecordError::NonFinite { field: "embedding value" });
            }
            Records::ItemEmbedding { item, vector }
        }
        RecordKind::ItemDelete => Records::ItemDelete { item: reader.u64("item id")? },
        RecordKind::Control => decode_control(reader)?,
        RecordKind::StreamEvents => decode_stream_events(reader)?,
        RecordKind::StreamControl => decode_stream_control(reader)?,
        RecordKind::Tx => Records::Tx(decode_tx(reader, |kind, reader| match kind {
            RecordKind::Signal => decode_signals(reader),
            kind => decode_other(reader, kind),
        })?),
        RecordKind::InboxSend => inbox::decode_send(reader)?,
        RecordKind::InboxConsume => inbox::decode_consume(reader)?,
    })
}

/// BLAKE3 of the payload after the envelope: equal for two writes with the same records, whatever
/// their time, principal or key. Tells an idempotent retry from a key reused with another body.
///
/// If the envelope itself does not decode, the whole payload is hashed (callers pass payloads they
/// just encoded, so this only keeps the function total).
pub fn records_fingerprint(payload: &[u8]) -> [u8; 32] {
    let mut reader = Reader { buf: payload, at: 0 };
    let records = match decode_envelope(&mut reader) {
        Ok(_) => reader.rest(),
        Err(_) => payload,
    };
    *blake3::hash(records).as_bytes()
}

fn put_str16(out: &mut Vec<u8>, value: &str) {
    let len = u16::try_from(value.len())
        .unwrap_or_else(|_| panic!("string of {} bytes over STRING_LEN_MAX", value.len()));
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(value.as_bytes());
}

fn put_event(out: &mut Vec<u8>, event: &SignalEvent) {
    put_str16(out, &event.user);
    out.extend_from_slice(&event.item.to_le_bytes());
    let kind_len = u8::try_from(event.kind.len())
        .unwrap_or_else(|_| panic!("signal kind of {} bytes over SIGNAL_KIND_LEN_MAX", event.kind.len()));
    out.push(kind_len);
    out.extend_from_slice(event.kind.as_bytes());
    out.extend_from_slice(&event.weight.to_le_bytes());
    out.extend_from_slice(&event.ts_ms.unwrap_or(TS_ABSENT).to_le_bytes());
}

fn put_stream_events(out: &mut Vec<u8>, stream: &str, events: &[PublishEvent]) -> u32 {
    assert!(!events.is_empty(), "a stream batch holds at least one event");
    put_str16(out, stream);
    let count = u32::try_from(events.len()).expect("event count checked by the API");
    out.extend_from_slice(&count.to_le_bytes());
    for event in events {
        match &event.key {
            None => out.push(0),
            Some(key) => {
                out.push(1);
                put_str16(out, key);
            }
        }
        let len = u32::try_from(event.payload.len()).expect("payload size checked by the API");
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&event.payload);
    }
    count
}

fn put_stream_control(out: &mut Vec<u8>, control: &StreamControl) {
    match control {
        StreamControl::SaveOffset { stream, consumer, offset } => {
            out.push(STREAM_TAG_SAVE_OFFSET);
            put_str16(out, stream);
            put_str16(out, consumer);
            out.extend_from_slice(&offset.to_le_bytes());
        }
        StreamControl::Trim { stream, through } => {
            out.push(STREAM_TAG_TRIM);
            put_str16(out, stream);
            out.extend_from_slice(&through.to_le_bytes());
        }
    }
}

/// A name field that must not be empty (stream, consumer, event key).
fn name16(reader: &mut Reader<'_>, field: &'static str) -> Result<String, RecordError> {
    let name = reader.str16(field)?;
    if name.is_empty() {
        return Err(RecordError::EmptyName { field });
    }
    Ok(name)
}

fn decode_stream_events(reader: &mut Reader<'_>) -> Result<Records, RecordError> {
    let stream = name16(reader, "stream")?;
    let count = reader.count(("stream event count", "stream events"), STREAM_EVENT_LEN_MIN)?;
    let mut events = Vec::with_capacity(count);
    for _ in 0..count {
        let key = match reader.u8("stream event key tag")? {
            0 => None,
            1 => Some(name16(reader, "stream event key")?),
            tag => return Err(RecordError::UnknownTag { field: "stream event key tag", tag }),
        };
        let len = reader.u32("stream event payload length")? as usize;
        let payload = reader.take("stream event payload", len)?;
        if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(payload) {
            return Err(RecordError::BadJson { field: "stream event payload", reason: e.to_string() });
        }
        events.push(PublishEvent { key, payload: payload.to_vec() });
    }
    Ok(Records::StreamEvents { stream, events })
}

fn decode_stream_control(reader: &mut Reader<'_>) -> Result<Records, RecordError> {
    let control = match reader.u8("stream control tag")? {
        STREAM_TAG_SAVE_OFFSET => StreamControl::SaveOffset {
            stream: name16(reader, "stream")?,
            consumer: name16(reader, "consumer")?,
            offset: reader.u64("consumer offset")?,
        },
        STREAM_TAG_TRIM => {
            StreamControl::Trim { stream: name16(reader, "stream")?, through: reader.u64("trim through")? }
        }
        tag => return Err(RecordError::UnknownTag { field: "stream control tag", tag }),
    };
    Ok(Records::StreamControl(control))
}

fn decode_envelope(reader: &mut Reader<'_>) -> Result<Envelope, RecordError> {
    let time_ms = reader.u64("envelope time")?;
    let principal = reader.str16("principal")?;
    let idempotency_key = reader.str16("idempotency key")?;
    Ok(Envelope { time_ms, principal, idempotency_key })
}

/// The event count of a signal payload, checked against the bytes left before anything is
/// allocated for it.
fn signal_count(reader: &mut Reader<'_>) -> Result<usize, RecordError> {
    reader.count(("signal count", "signal events"), SIGNAL_EVENT_LEN_MIN)
}

/// One signal event with its kind name, borrowing both from the payload (`kind` of the event is
/// left 0 for the caller to set). The one parser of an event: [`decode_signals`] and
/// [`decode_signal_columns`] both call it.
fn next_signal<'a>(reader: &mut Reader<'a>) -> Result<(SignalRef<'a>, &'a str), RecordError> {
    let user = reader.str16_ref("signal user")?;
    let item = reader.u64("signal item")?;
    let kind_len = usize::from(reader.u8("signal kind length")?);
    let kind = utf8(reader.take("signal kind", kind_len)?, "signal kind")?;
    let weight = reader.f64("signal weight")?;
    if !weight.is_finite() {
        return Err(RecordError::NonFinite { field: "signal weight" });
    }
    let ts = reader.i64("signal ts")?;
    let ts_ms = (ts != TS_ABSENT).then_some(ts);
    Ok((SignalRef { user, item, kind: 0, weight, ts_ms }, kind))
}

/// Up to this many distinct kinds in a batch, a kind's index is found by comparing names.
const BATCH_KINDS_SCANNED_MAX: usize = 8;

fn decode_signal_columns(reader: &mut Reader<'_>) -> Result<SignalColumns, RecordError> {
    let count = signal_count(reader)?;
    let mut columns = SignalColumns {
        // The names are at most what is left of the payload.
        users: String::with_capacity(reader.remaining().min(count.saturating_mul(16))),
        kinds: Vec::new(),
        events: Vec::with_capacity(count),
    };
    let mut kind_ids: FastMap<&str, u32> = FastMap::default();
    for _ in 0..count {
        let (event, kind) = next_signal(reader)?;
        let known = if columns.kinds.len() <= BATCH_KINDS_SCANNED_MAX {
            columns.kinds.iter().position(|known| **known == *kind).map(|id| id as u32)
        } else {
            kind_ids.get(kind).copied()
        };
        let kind = match known {
            Some(id) => id,
            None => {
                // At most one kind per event, and a batch holds fewer than 2^32 events.
                let id = columns.kinds.len() as u32;
                columns.kinds.push(kind.into());
                kind_ids.insert(kind, id);
                id
            }
        };
        columns.users.push_str(event.user);
        columns.events.push(PackedSignal {
            user_end: columns.users.len(),
            item: event.item,
            kind,
            weight: event.weight,
            ts_ms: event.ts_ms,
        });
    }
    Ok(columns)
}

fn decode_signals(reader: &mut Reader<'_>) -> Result<Records, RecordError> {
    let count = signal_count(reader)?;
    let mut events = Vec::with_capacity(count);
    for _ in 0..count {
        let (event, kind) = next_signal(reader)?;
        events.push(SignalEvent {
            user: event.user.to_owned(),
            item: event.item,
            kind: kind.to_owned(),
            weight: event.weight,
            ts_ms: event.ts_ms,
        });
    }
    Ok(Records::Signals(events))
}

fn decode_control(reader: &mut Reader<'_>) -> Result<Records, RecordError> {
    match reader.u8("control tag")? {
        CONTROL_TAG_LEADER_START => {
            let term = Term(reader.u64("leader start term")?);
            let leader = NodeId(reader.u64("leader start leader")?);
            let baseline = Seqno(reader.u64("leader start baseline")?);
            Ok(Records::Control(ControlRecord::LeaderStart { term, leader, baseline }))
        }
        tag => Err(RecordError::UnknownControlTag(tag)),
    }
}

fn utf8<'a>(bytes: &'a [u8], field: &'static str) -> Result<&'a str, RecordError> {
    std::str::from_utf8(bytes).map_err(|_| RecordError::NotUtf8 { field })
}

/// A cursor over untrusted bytes; every read checks the length first.
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.at)
    }

    fn take(&mut self, field: &'static str, len: usize) -> Result<&'a [u8], RecordError> {
        let available = self.remaining();
        if len > available {
            return Err(RecordError::Truncated { field, offset: self.at, needed: len, available });
        }
        let bytes = &self.buf[self.at..self.at + len];
        self.at += len;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], RecordError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(field, N)?);
        Ok(out)
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, RecordError> {
        Ok(self.array::<1>(field)?[0])
    }

    fn u32(&mut self, field: &'static str) -> Result<u32, RecordError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, RecordError> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    fn i64(&mut self, field: &'static str) -> Result<i64, RecordError> {
        Ok(i64::from_le_bytes(self.array(field)?))
    }

    fn f64(&mut self, field: &'static str) -> Result<f64, RecordError> {
        Ok(f64::from_le_bytes(self.array(field)?))
    }

    /// A u32 count of items (`fields`: the count's name, the items' name) that must be at least 1
    /// and whose items, at `item_len_min` bytes or more each, fit in what is left: checked before
    /// anything is allocated for them.
    fn count(
        &mut self,
        fields: (&'static str, &'static str),
        item_len_min: usize,
    ) -> Result<usize, RecordError> {
        let count = self.u32(fields.0)? as usize;
        if count == 0 {
            return Err(RecordError::NoEvents);
        }
        let (needed, available) = (count.saturating_mul(item_len_min), self.remaining());
        if needed > available {
            return Err(RecordError::Truncated { field: fields.1, offset: self.at, needed, available });
        }
        Ok(count)
    }

    fn str16(&mut self, field: &'static str) -> Result<String, RecordError> {
        self.str16_ref(field).map(str::to_owned)
    }

    fn str16_ref(&mut self, field: &'static str) -> Result<&'a str, RecordError> {
        let len = usize::from(u16::from_le_bytes(self.array(field)?));
        utf8(self.take(field, len)?, field)
    }

    fn rest(&mut self) -> &'a [u8] {
        let rest = &self.buf[self.at.min(self.buf.len())..];
        self.at = self.buf.len();
        rest
    }

    fn finish(&self) -> Result<(), RecordError> {
        match self.remaining() {
            0 => Ok(()),
            count => Err(RecordError::TrailingBytes { count }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn envelope() -> Envelope {
        Envelope { time_ms: 1_700_000_000_000, principal: "svc".into(), idempotency_key: "k-1".into() }
    }

    /// `decode_payload`, after checking that the apply path's decoder (signal columns) gives the
    /// same records or the same error.
    fn decode_both(kind: RecordKind, payload: &[u8]) -> Result<(Envelope, Records), RecordError> {
        let plain = decode_payload(kind, payload);
        fn as_records(records: FoldRecords) -> Records {
            match records {
                FoldRecords::Signals(columns) => {
                    assert!(!columns.is_empty());
                    Records::Signals(columns.to_events())
                }
                FoldRecords::Tx(ops) => Records::Tx(ops.into_iter().map(as_records).collect()),
                FoldRecords::Other(records) => records,
            }
        }
        let for_apply =
            decode_for_apply(kind, payload).map(|(envelope, records)| (envelope, as_records(records)));
        assert_eq!(for_apply, plain, "decode_for_apply and decode_payload disagree");
        plain
    }

    #[test]
    fn signal_columns_keep_names_and_kinds_in_order() {
        // More kinds than the decoder scans before it switches to a map, repeated, and user names
        // of every length up to the field's maximum, multibyte included.
        let kinds: Vec<String> = (0..20).map(|k| format!("kind-{k}")).collect();
        let events: Vec<SignalEvent> = (0..200u64)
            .map(|i| SignalEvent {
                user: match i % 4 {
                    0 => String::new(),
                    1 => format!("user-{i}"),
                    2 => "ü".repeat(i as usize),
                    _ => "x".repeat(STRING_LEN_MAX - i as usize),
                },
                item: i * 7,
                kind: kinds[(i * 13 % 20) as usize].clone(),
                weight: i as f64 - 50.5,
                ts_ms: (i % 3 != 0).then_some(i as i64 * 1000 - 7),
            })
            .collect();
        let encoded = encode_payload(&envelope(), &Records::Signals(events.clone()));
        let (_, FoldRecords::Signals(columns)) =
            decode_for_apply(RecordKind::Signal, &encoded.payload).unwrap()
        else {
            panic!("signals decode as columns");
        };
        assert_eq!(columns.len(), 200);
        assert_eq!(columns.kinds().len(), 20, "each distinct kind once");
        assert_eq!(columns.kinds()[0].as_ref(), "kind-0", "kinds in first-seen order");
        assert_eq!(columns.kinds()[1].as_ref(), "kind-13");
        for (event, back) in events.iter().zip(columns.iter()) {
            assert_eq!(back.user, event.user);
            assert_eq!(columns.kinds()[back.kind as usize].as_ref(), event.kind);
        }
        assert_eq!(columns.to_events(), events);
        assert_eq!(decode_both(RecordKind::Signal, &encoded.payload).unwrap().1, Records::Signals(events));
    }

    #[test]
    fn time_is_at_bytes_0_to_8() {
        let encoded = encode_payload(&envelope(), &Records::ItemDelete { item: 7 });
        assert_eq!(&encoded.payload[ENVELOPE_TIME_RANGE], &1_700_000_000_000u64.to_le_bytes());
        assert_eq!(encoded.kind, RecordKind::ItemDelete);
        assert_eq!(encoded.event_count, 1);
    }

    #[test]
    fn each_kind_round_trips() {
        let all = [
            Records::Signals(vec![
                SignalEvent { user: "u1".into(), item: 1, kind: "click".into(), weight: 1.5, ts_ms: None },
                SignalEvent {
                    user: "ü".into(),
                    item: u64::MAX,
                    kind: String::new(),
                    weight: -2.0,
                    ts_ms: Some(-5),
                },
            ]),
            Records::ItemMetadata { item: 3, metadata: br#"{"a":[1,2]}"#.to_vec() },
            Records::ItemEmbedding { item: 4, vector: vec![0.5, -1.0, 3.25] },
            Records::ItemEmbedding { item: 4, vector: vec![] },
            Records::ItemDelete { item: 5 },
            Records::Control(ControlRecord::LeaderStart {
                term: Term(2),
                leader: NodeId(3),
                baseline: Seqno(100),
            }),
            inbox_send("o-1", "t", "m-1"),
            Records::InboxConsume(receive("o-1", "r-1", &["a", "b"])),
            Records::InboxConsume(InboxConsume::Ack { owner: "o".into(), receive_id: "r".into() }),
            Records::InboxConsume(InboxConsume::Discard {
                owner: "o".into(),
                topic: "t".into(),
                through: 9,
                expired: true,
            }),
            Records::InboxConsume(InboxConsume::Close { owner: "o".into() }),
        ];
        for records in all {
            let encoded = encode_payload(&envelope(), &records);
            assert_eq!(u64::from(encoded.event_count), records.event_count());
            let (env, back) = decode_payload(encoded.kind, &encoded.payload).unwrap();
            assert_eq!(env, envelope());
            assert_eq!(back, records);
        }
    }

    fn inbox_send(owner: &str, topic: &str, message_id: &str) -> Records {
        let limits = SendLimits { backlog_max: 10, topics_max: 4, dedupe_max: 100, dedupe_age_s: 60 };
        let (owner, topic, message_id) = (owner.into(), topic.into(), message_id.into());
        Records::InboxSend(InboxSend { owner, topic, message_id, payload: b"[1]".to_vec(), limits })
    }

    fn receive(owner: &str, receive_id: &str, topics: &[&str]) -> InboxConsume {
        let limits = ReceiveLimits { max: 1, bytes_max: 1 << 20, receipts_max: 8, receipt_age_s: 60 };
        InboxConsume::Receive {
            owner: owner.into(),
            receive_id: receive_id.into(),
            topics: topics.iter().map(|t| t.to_string()).collect(),
            lease_ms: 0,
            limits,
        }
    }

    /// Garbage in an inbox record is a specific error: names too long for their keys, a receive
    /// of no topic, unknown tags and reasons, a payload that is not JSON, every truncation.
    #[test]
    fn inbox_records_refuse_garbage() {
        let decode = |records: &Records| {
            let encoded = encode_payload(&envelope(), records);
            decode_both(encoded.kind, &encoded.payload)
        };
        let long = "o".repeat(INBOX_NAME_BYTES_MAX + 1);
        assert_eq!(
            decode(&inbox_send(&long, "t", "m")),
            Err(RecordError::TooLong { field: "inbox owner", len: 256, max: 255 })
        );
        assert!(matches!(
            decode(&inbox_send("o", "t", &"m".repeat(257))),
            Err(RecordError::TooLong { field: "message id", .. })
        ));
        assert_eq!(decode(&inbox_send("o", "", "m")), Err(RecordError::EmptyName { field: "inbox topic" }));
        let mut send = encode_payload(&envelope(), &inbox_send("o", "t", "m")).payload;
        let at = send.len() - 3;
        send[at..].copy_from_slice(b"[1 ");
        assert!(matches!(decode_both(RecordKind::InboxSend, &send), Err(RecordError::BadJson { .. })));
        let none = encode_payload(&envelope(), &Records::InboxConsume(receive("o", "r", &["t"])));
        let mut no_topics = none.payload.clone();
        let count_at = no_topics.len() - 5 * 4 - (2 + 1) - 1;
        assert_eq!(no_topics[count_at], 1, "the topic count byte");
        no_topics[count_at] = 0;
        assert!(decode_both(RecordKind::InboxConsume, &no_topics).is_err());
        let close =
            encode_payload(&envelope(), &Records::InboxConsume(InboxConsume::Close { owner: "o".into() }));
        let mut unknown = close.payload.clone();
        let tag_at = unknown.len() - 1 - 2 - 1;
        unknown[tag_at] = 9;
        assert_eq!(
            decode_both(RecordKind::InboxConsume, &unknown),
            Err(RecordError::UnknownTag { field: "inbox control tag", tag: 9 })
        );
        let discard =
            InboxConsume::Discard { owner: "o".into(), topic: "t".into(), through: 1, expired: false };
        let mut reason = encode_payload(&envelope(), &Records::InboxConsume(discard)).payload;
        *reason.last_mut().unwrap() = 7;
        assert_eq!(
            decode_both(RecordKind::InboxConsume, &reason),
            Err(RecordError::UnknownTag { field: "discard reason", tag: 7 })
        );
        for payload in [send, none.payload, close.payload] {
            for len in 0..payload.len() {
                assert!(decode_both(RecordKind::InboxConsume, &payload[..len]).is_err(), "cut at {len}");
                assert!(decode_both(RecordKind::InboxSend, &payload[..len]).is_err(), "cut at {len}");
            }
        }
    }

    #[test]
    fn errors_are_specific() {
        let encoded = encode_payload(&envelope(), &Records::ItemDelete { item: 5 });
        let mut longer = encoded.payload.clone();
        longer.push(0);
        assert_eq!(
            decode_payload(RecordKind::ItemDelete, &longer),
            Err(RecordError::TrailingBytes { count: 1 })
        );
        assert!(matches!(
            decode_payload(RecordKind::ItemDelete, &encoded.payload[..encoded.payload.len() - 1]),
            Err(RecordError::Truncated { .. })
        ));
        let nan = encode_payload(
            &envelope(),
            &Records::Signals(vec![SignalEvent {
                user: "u".into(),
                item: 1,
                kind: "k".into(),
                weight: f64::NAN,
                ts_ms: None,
            }]),
        );
        assert_eq!(
            decode_payload(RecordKind::Signal, &nan.payload),
            Err(RecordError::NonFinite { field: "signal weight" })
        );
        let inf =
            encode_payload(&envelope(), &Records::ItemEmbedding { item: 1, vector: vec![f32::INFINITY] });
        assert!(matches!(
            decode_payload(RecordKind::ItemEmbedding, &inf.payload),
            Err(RecordError::NonFinite { .. })
        ));
        let bad_json =
            encode_payload(&envelope(), &Records::ItemMetadata { item: 1, metadata: b"{".to_vec() });
        assert!(matches!(
            decode_payload(RecordKind::ItemMetadata, &bad_json.payload),
            Err(RecordError::BadMetadata { .. })
        ));
        let mut bad_utf8 = encode_payload(&envelope(), &Records::ItemDelete { item: 1 }).payload;
        bad_utf8[10] = 0xff; // first byte of the principal
        assert_eq!(
            decode_payload(RecordKind::ItemDelete, &bad_utf8),
            Err(RecordError::NotUtf8 { field: "principal" })
        );
        let mut bad_tag = encode_payload(
            &envelope(),
            &Records::Control(ControlRecord::LeaderStart {
                term: Term(1),
                leader: NodeId(1),
                baseline: Seqno(0),
            }),
        )
        .payload;
        let tag_at = 8 + 2 + 3 + 2 + 3;
        bad_tag[tag_at] = 9;
        assert_eq!(decode_payload(RecordKind::Control, &bad_tag), Err(RecordError::UnknownControlTag(9)));
    }

    #[test]
    fn huge_counts_are_refused_before_allocating() {
        let mut payload = encode_payload(&Envelope::default(), &Records::ItemDelete { item: 0 }).payload;
        payload.truncate(12); // time + two empty strings
        payload.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(decode_payload(RecordKind::Signal, &payload), Err(RecordError::Truncated { .. })));
        assert!(matches!(decode_for_apply(RecordKind::Signal, &payload), Err(RecordError::Truncated { .. })));
        let mut embedding = payload[..12].to_vec();
        embedding.extend_from_slice(&1u64.to_le_bytes());
        embedding.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            decode_payload(RecordKind::ItemEmbedding, &embedding),
            Err(RecordError::Truncated { .. })
        ));
    }

    #[test]
    fn fingerprint_ignores_the_envelope_only() {
        let records = Records::ItemDelete { item: 9 };
        let a = encode_payload(&envelope(), &records).payload;
        let b = encode_payload(&Envelope::default(), &records).payload;
        let c = encode_payload(&envelope(), &Records::ItemDelete { item: 10 }).payload;
        assert_eq!(records_fingerprint(&a), records_fingerprint(&b));
        assert_ne!(records_fingerprint(&a), records_fingerprint(&c));
    }

    fn any_event() -> impl Strategy<Value = SignalEvent> {
        (
            "[a-zé]{0,12}",
            any::<u64>(),
            "[a-z]{0,8}",
            -1e9f64..1e9,
            prop::option::of(any::<i64>().prop_filter("absent marker", |ts| *ts != TS_ABSENT)),
        )
            .prop_map(|(user, item, kind, weight, ts_ms)| SignalEvent {
                user,
                item,
                kind,
                weight,
                ts_ms,
            })
    }

    fn any_records() -> impl Strategy<Value = Records> {
        let tx_op = any_plain_records()
            .prop_filter("a tx holds no control record", |r| TX_OP_KINDS.contains(&r.kind()));
        prop_oneof![
            4 => any_plain_records(),
            1 => prop::collection::vec(tx_op, 1..5).prop_map(Records::Tx),
        ]
    }

    fn any_plain_records() -> impl Strategy<Value = Records> {
        prop_oneof![
            prop::collection::vec(any_event(), 1..20).prop_map(Records::Signals),
            (any::<u64>(), "[a-z0-9]{0,10}").prop_map(|(item, text)| Records::ItemMetadata {
                item,
                metadata: serde_json::to_vec(&serde_json::json!({ "t": text })).unwrap(),
            }),
            (any::<u64>(), prop::collection::vec(-1e6f32..1e6, 0..64))
                .prop_map(|(item, vector)| Records::ItemEmbedding { item, vector }),
            any::<u64>().prop_map(|item| Records::ItemDelete { item }),
            (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(t, l, b)| Records::Control(
                ControlRecord::LeaderStart { term: Term(t), leader: NodeId(l), baseline: Seqno(b) }
            )),
            ("[a-zé.]{1,12}", prop::collection::vec(any_publish(), 1..10))
                .prop_map(|(stream, events)| Records::StreamEvents { stream, events }),
            ("[a-z]{1,8}", "[a-z-]{1,8}", any::<u64>()).prop_map(|(stream, consumer, offset)| {
                Records::StreamControl(StreamControl::SaveOffset { stream, consumer, offset })
            }),
            ("[a-z]{1,8}", any::<u64>()).prop_map(|(stream, through)| Records::StreamControl(
                StreamControl::Trim { stream, through }
            )),
        ]
    }

    fn any_publish() -> impl Strategy<Value = PublishEvent> {
        (prop::option::of("[a-zü0-9]{1,6}"), any::<i64>(), "[a-z\\\"]{0,10}").prop_map(|(key, n, text)| {
            PublishEvent {
                key,
                payload: serde_json::to_vec(&serde_json::json!({ "n": n, "t": text })).unwrap(),
            }
        })
    }

    #[test]
    fn a_tx_holds_its_ops_bytes_and_refuses_what_it_cannot_hold() {
        let ops = vec![
            Records::ItemDelete { item: 3 },
            Records::StreamEvents {
                stream: "s".into(),
                events: vec![PublishEvent { key: None, payload: b"1".to_vec() }; 2],
            },
        ];
        let encoded = encode_payload(&envelope(), &Records::Tx(ops.clone()));
        assert_eq!((encoded.kind, encoded.event_count), (RecordKind::Tx, 3));
        // Each op's bytes are exactly its kind's payload after the envelope.
        let delete = encode_payload(&envelope(), &ops[0]).payload;
        let head = 8 + 2 + 3 + 2 + 3;
        assert_eq!(&encoded.payload[head + 4 + 1 + 4..head + 4 + 1 + 4 + 8], &delete[head..]);
        let mut nested = encoded.payload.clone();
        nested[head + 4] = RecordKind::Control.byte();
        assert_eq!(
            decode_both(RecordKind::Tx, &nested),
            Err(RecordError::UnknownTag { field: "tx op kind", tag: 4 })
        );
        nested[head + 4] = RecordKind::Tx.byte();
        assert!(matches!(decode_both(RecordKind::Tx, &nested), Err(RecordError::UnknownTag { tag: 9, .. })));
        let mut long = encoded.payload.clone();
        long[head + 5..head + 9].copy_from_slice(&9u32.to_le_bytes()); // the delete's body claims 9 bytes
        assert!(decode_both(RecordKind::Tx, &long).is_err());
        let mut huge = encoded.payload.clone();
        huge[head..head + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            decode_both(RecordKind::Tx, &huge),
            Err(RecordError::Truncated { field: "tx ops", .. })
        ));
        for len in 0..encoded.payload.len() {
            assert!(decode_both(RecordKind::Tx, &encoded.payload[..len]).is_err(), "cut at {len}");
        }
    }

    #[test]
    fn stream_records_refuse_what_the_api_never_writes() {
        let publish = |stream: &str, key: Option<&str>, payload: &[u8]| {
            let events = vec![PublishEvent { key: key.map(str::to_owned), payload: payload.to_vec() }];
            encode_payload(&envelope(), &Records::StreamEvents { stream: stream.into(), events }).payload
        };
        let decode = |payload: &[u8]| decode_both(RecordKind::StreamEvents, payload);
        assert_eq!(decode(&publish("", None, b"1")), Err(RecordError::EmptyName { field: "stream" }));
        assert_eq!(
            decode(&publish("s", Some(""), b"1")),
            Err(RecordError::EmptyName { field: "stream event key" })
        );
        assert!(matches!(decode(&publish("s", None, b"{")), Err(RecordError::BadJson { .. })));
        let mut bad_tag = publish("s", None, b"1");
        let tag_at = 8 + 2 + 3 + 2 + 3 + 2 + 1 + 4;
        bad_tag[tag_at] = 7;
        assert_eq!(decode(&bad_tag), Err(RecordError::UnknownTag { field: "stream event key tag", tag: 7 }));
        // A count no payload could hold is refused before anything is allocated for it.
        let mut huge = publish("s", None, b"1");
        huge[tag_at - 4..tag_at].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(decode(&huge), Err(RecordError::Truncated { field: "stream events", .. })));
        let mut zero = publish("s", None, b"1");
        zero[tag_at - 4..tag_at].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(decode(&zero), Err(RecordError::NoEvents));
        let trim = |stream: &str| {
            let control = StreamControl::Trim { stream: stream.into(), through: 5 };
            encode_payload(&envelope(), &Records::StreamControl(control)).payload
        };
        let mut unknown = trim("s");
        unknown[8 + 2 + 3 + 2 + 3] = 3;
        assert_eq!(
            decode_both(RecordKind::StreamControl, &unknown),
            Err(RecordError::UnknownTag { field: "stream control tag", tag: 3 })
        );
        assert_eq!(
            decode_both(RecordKind::StreamControl, &trim("")),
            Err(RecordError::EmptyName { field: "stream" })
        );
        let good = publish("s", Some("k"), b"[1,2]");
        for len in 0..good.len() {
            assert!(decode(&good[..len]).is_err(), "a payload cut at {len} decodes");
        }
        assert_eq!(
            encode_payload(
                &envelope(),
                &Records::StreamEvents {
                    stream: "s".into(),
                    events: vec![PublishEvent { key: None, payload: b"1".to_vec() }; 3],
                }
            )
            .event_count,
            3,
            "one seqno per event"
        );
    }

    proptest! {
        #[test]
        fn round_trip(time_ms in any::<u64>(), principal in "[a-z]{0,10}", key in "[a-z0-9-]{0,10}", records in any_records()) {
            let envelope = Envelope { time_ms, principal, idempotency_key: key };
            let encoded = encode_payload(&envelope, &records);
            let (env, back) = decode_both(encoded.kind, &encoded.payload).unwrap();
            prop_assert_eq!(env, envelope);
            prop_assert_eq!(back, records);
        }

        #[test]
        fn garbage_never_panics(kind in 0u8..10, bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let kind = RecordKind::from_byte(kind).unwrap();
            let _ = decode_both(kind, &bytes);
            let _ = records_fingerprint(&bytes);
        }

        #[test]
        fn mutated_payloads_never_panic(records in any_records(), flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8), cut in any::<prop::sample::Index>()) {
            let encoded = encode_payload(&envelope(), &records);
            let mut bytes = encoded.payload.clone();
            for (at, value) in flips {
                let i = at.index(bytes.len());
                bytes[i] = value;
            }
            let _ = decode_both(encoded.kind, &bytes);
            let len = cut.index(bytes.len() + 1);
            let _ = decode_both(encoded.kind, &bytes[..len]);
        }
    }
}
