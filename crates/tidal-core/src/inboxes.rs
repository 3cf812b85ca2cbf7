//! Inboxes in the engine: the keys and values of the `inboxes` keyspace, and the reads that merge
//! the overlays over fjall. What a send, a receive, an ack, a discard and a close decide is in
//! [`fold`].
//!
//! ```text
//! key (O = len u8 | owner, T = len u8 | topic)       value
//! 0x01 | O                        inbox meta         closed u8 | live topics u32 | dedupe u64 |
//!                                                    receipts u64 | consumed u64
//! 0x02 | O | topic                topic meta         head | floor | backlog | bytes | cursor (u64s)
//! 0x03 | O | T | seq BE           message            created_ms u64 | lease_until_ms u64 | sender str16
//!                                                    | message_id str16 | holder str16 | payload
//! 0x04 | O | sender str16 | id    dedupe entry       inbox_seq u64 | time_ms u64
//! 0x05 | O | seq BE               dedupe order       the dedupe entry's key
//! 0x06 | O | receive_id           receipt            seqno u64 | time_ms u64 | lease_until_ms u64 |
//!                                                    acked u8 | count u32 | messages
//! 0x07 | O | seq BE               receipt order      the receipt's key
//! ```
//!
//! Delicate:
//! - Everything here is log-derived and in the digest: decisions read only the applied state and
//!   the record, "now" is the logged time, and every limit comes from the record.
//! - A message's sequence is the seqno of its send: messages of a topic are keyed in send order,
//!   so the oldest unconsumed one is the first key above the topic's floor (every sequence at or
//!   below the floor is consumed or dropped). Consumed messages are deleted, so storage holds the
//!   backlog, not the history.
//! - A topic is live while it holds unconsumed messages (leased ones included); its meta is
//!   deleted when it drains, so an owner cycling through topics never accumulates them.

use std::collections::BTreeMap;
use std::ops::Bound;

use crate::error::Error;
use crate::layers::{for_each_merged, Layer};
use crate::overlay::OverlayView;
use crate::stores::Stores;

pub(crate) mod fold;

pub(crate) use fold::At;
pub use fold::InboxOutcome;

const TAG_INBOX: u8 = 0x01;
const TAG_TOPIC: u8 = 0x02;
const TAG_MESSAGE: u8 = 0x03;
const TAG_DEDUPE: u8 = 0x04;
const TAG_DEDUPE_ORDER: u8 = 0x05;
const TAG_RECEIPT: u8 = 0x06;
const TAG_RECEIPT_ORDER: u8 = 0x07;
const INBOX_META_LEN: usize = 1 + 4 + 8 + 8 + 8;
const TOPIC_META_LEN: usize = 5 * 8;

/// What an inbox's meta holds. Log-derived.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InboxMeta {
    /// Closed: sends and receives are refused.
    pub closed: bool,
    /// Topics holding unconsumed messages.
    pub live_topics: u32,
    /// Entries in the dedupe window.
    pub dedupe: u64,
    /// Receipts kept.
    pub receipts: u64,
    /// Messages consumed over the inbox's life.
    pub consumed: u64,
}

impl InboxMeta {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(INBOX_META_LEN);
        out.push(u8::from(self.closed));
        out.extend_from_slice(&self.live_topics.to_le_bytes());
        for n in [self.dedupe, self.receipts, self.consumed] {
            out.extend_from_slice(&n.to_le_bytes());
        }
        out
    }

    fn decode(value: &[u8]) -> Result<InboxMeta, Error> {
        if value.len() != INBOX_META_LEN || value[0] > 1 {
            return Err(corrupt(format!("inbox meta of {} bytes", value.len())));
        }
        let n = |at: usize| u64::from_le_bytes(value[at..at + 8].try_into().expect("8 bytes"));
        Ok(InboxMeta {
            closed: value[0] == 1,
            live_topics: u32::from_le_bytes(value[1..5].try_into().expect("4 bytes")),
            dedupe: n(5),
            receipts: n(13),
            consumed: n(21),
        })
    }
}

/// What a live topic's meta holds. Log-derived.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TopicMeta {
    /// Sequence of the last message sent.
    pub head: u64,
    /// Every sequence at or below this is consumed or dropped.
    pub floor: u64,
    /// Unconsumed messages (leased ones included).
    pub backlog: u64,
    /// Their payload bytes.
    pub bytes: u64,
    /// Sequence of the last message consumed or dropped (0: none since the topic went live).
    pub cursor: u64,
}

impl TopicMeta {
    fn encode(&self) -> Vec<u8> {
        [self.head, self.floor, self.backlog, self.bytes, self.cursor]
            .iter()
            .flat_map(|n| n.to_le_bytes())
            .collect()
    }

    fn decode(value: &[u8]) -> Result<TopicMeta, Error> {
        if value.len() != TOPIC_META_LEN {
            return Err(corrupt(format!("topic meta of {} bytes", value.len())));
        }
        let n = |i: usize| u64::from_le_bytes(value[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        Ok(TopicMeta { head: n(0), floor: n(1), backlog: n(2), bytes: n(3), cursor: n(4) })
    }
}

/// One message, as stored and as receipts copy it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredMessage {
    /// Its topic.
    pub topic: String,
    /// Its sequence: the seqno of its send.
    pub inbox_seq: u64,
    /// The logged time of its send (unix ms).
    pub created_ms: u64,
    /// The principal that sent it.
    pub sender: String,
    /// The sender's id for it.
    pub message_id: String,
    /// JSON text.
    pub payload: Vec<u8>,
    /// A lease holds it for `holder` until this logged time (0: not leased).
    pub lease_until_ms: u64,
    /// The receive holding the lease (empty: none).
    pub holder: String,
}

impl StoredMessage {
    fn encode_value(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(16 + 6 + self.sender.len() + self.message_id.len() + self.payload.len());
        out.extend_from_slice(&self.created_ms.to_le_bytes());
        out.extend_from_slice(&self.lease_until_ms.to_le_bytes());
        for text in [&self.sender, &self.message_id, &self.holder] {
            put_str16(&mut out, text);
        }
        out.extend_from_slice(&self.payload);
        out
    }

    fn decode_value(topic: &str, inbox_seq: u64, value: &[u8]) -> Result<StoredMessage, Error> {
        let mut reader = Cursor { buf: value, at: 0 };
        let created_ms = reader.u64()?;
        let lease_until_ms = reader.u64()?;
        let (sender, message_id, holder) = (reader.str16()?, reader.str16()?, reader.str16()?);
        let payload = value[reader.at..].to_vec();
        Ok(StoredMessage {
            topic: topic.to_string(),
            inbox_seq,
            created_ms,
            sender,
            message_id,
            payload,
            lease_until_ms,
            holder,
        })
    }

    /// Whether a receive at logged time `now_ms` may take it.
    pub fn available(&self, now_ms: u64) -> bool {
        self.lease_until_ms <= now_ms
    }
}

/// What a receive took, kept under its receive_id so a retry is answered the same.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Receipt {
    /// The receive's seqno.
    pub seqno: u64,
    /// Its logged time.
    pub time_ms: u64,
    /// Lease mode: the messages are held until this logged time (0: consumed at the receive).
    pub lease_until_ms: u64,
    /// Lease mode: an ack consumed them.
    pub acked: bool,
    /// The messages, in the order taken.
    pub messages: Vec<StoredMessage>,
}

impl Receipt {
    fn encode(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(64 + self.messages.iter().map(|m| 64 + m.payload.len()).sum::<usize>());
        for n in [self.seqno, self.time_ms, self.lease_until_ms] {
            out.extend_from_slice(&n.to_le_bytes());
        }
        out.push(u8::from(self.acked));
        out.extend_from_slice(&(self.messages.len() as u32).to_le_bytes());
        for message in &self.messages {
            put_str16(&mut out, &message.topic);
            out.extend_from_slice(&message.inbox_seq.to_le_bytes());
            out.extend_from_slice(&message.created_ms.to_le_bytes());
            put_str16(&mut out, &message.sender);
            put_str16(&mut out, &message.message_id);
            out.extend_from_slice(&(message.payload.len() as u32).to_le_bytes());
            out.extend_from_slice(&message.payload);
        }
        out
    }

    fn decode(value: &[u8]) -> Result<Receipt, Error> {
        let mut reader = Cursor { buf: value, at: 0 };
        let (seqno, time_ms, lease_until_ms) = (reader.u64()?, reader.u64()?, reader.u64()?);
        let acked = reader.take(1)?[0] == 1;
        let count = u32::from_le_bytes(reader.take(4)?.try_into().expect("4 bytes"));
        let mut messages = Vec::new();
        for _ in 0..count {
            let topic = reader.str16()?;
            let (inbox_seq, created_ms) = (reader.u64()?, reader.u64()?);
            let (sender, message_id) = (reader.str16()?, reader.str16()?);
            let len = u32::from_le_bytes(reader.take(4)?.try_into().expect("4 bytes")) as usize;
            let payload = reader.take(len)?.to_vec();
            let holder = String::new();
            messages.push(StoredMessage {
                topic,
                inbox_seq,
                created_ms,
                sender,
                message_id,
                payload,
                lease_until_ms,
                holder,
            });
        }
        if reader.at != value.len() {
            return Err(corrupt("receipt has trailing bytes".into()));
        }
        Ok(Receipt { seqno, time_ms, lease_until_ms, acked, messages })
    }
}

/// A live topic as `GET /v1/inboxes/{owner}` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicInfo {
    /// The topic.
    pub topic: String,
    /// Its meta.
    pub meta: TopicMeta,
    /// The oldest unconsumed message's sequence and logged time.
    pub oldest: Option<(u64, u64)>,
    /// Messages held by an unexpired lease at the applied logged time (counted up to a bound).
    pub leased: u64,
}

/// What a receiver waiting on some topics can expect, at a logged time: whether a message is
/// available now, else when the earliest lease among the topics runs out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Availability {
    /// A receive now would take something.
    pub now: bool,
    /// The earliest lease expiry among the waiting messages.
    pub lease_ends_ms: Option<u64>,
}

/// Messages a lease check looks at per topic before it gives up (a waiting receiver then just
/// polls on its timer).
const LEASE_SCAN_MAX: usize = 1024;

fn owner_prefix(tag: u8, owner: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(2 + owner.len() + 32);
    key.push(tag);
    key.push(u8::try_from(owner.len()).expect("owner names are checked to fit a byte"));
    key.extend_from_slice(owner.as_bytes());
    key
}

pub(crate) fn inbox_key(owner: &str) -> Vec<u8> {
    owner_prefix(TAG_INBOX, owner)
}

pub(crate) fn topic_key(owner: &str, topic: &str) -> Vec<u8> {
    let mut key = owner_prefix(TAG_TOPIC, owner);
    key.extend_from_slice(topic.as_bytes());
    key
}

fn message_prefix(owner: &str, topic: &str) -> Vec<u8> {
    let mut key = owner_prefix(TAG_MESSAGE, owner);
    key.push(u8::try_from(topic.len()).expect("topic names are checked to fit a byte"));
    key.extend_from_slice(topic.as_bytes());
    key
}

fn with_seq(mut prefix: Vec<u8>, seq: u64) -> Vec<u8> {
    prefix.extend_from_slice(&seq.to_be_bytes());
    prefix
}

fn dedupe_key(owner: &str, sender: &str, message_id: &str) -> Vec<u8> {
    let mut key = owner_prefix(TAG_DEDUPE, owner);
    put_str16(&mut key, sender);
    key.extend_from_slice(message_id.as_bytes());
    key
}

fn receipt_key(owner: &str, receive_id: &str) -> Vec<u8> {
    let mut key = owner_prefix(TAG_RECEIPT, owner);
    key.extend_from_slice(receive_id.as_bytes());
    key
}

/// The smallest key above every key that starts with `prefix` (`None`: there is none).
fn successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

fn seq_of(key: &[u8]) -> Result<u64, Error> {
    let at = key.len().checked_sub(8).ok_or_else(|| corrupt("short inbox key".into()))?;
    Ok(u64::from_be_bytes(key[at..].try_into().expect("8 bytes")))
}

fn put_str16(out: &mut Vec<u8>, text: &str) {
    let len = u16::try_from(text.len()).expect("inbox strings are checked to fit a u16");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(text.as_bytes());
}

fn corrupt(reason: String) -> Error {
    Error::Corrupt { keyspace: "inboxes", reason }
}

/// A reader of stored values; every read checks the length first.
struct Cursor<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, len: usize) -> Result<&'a [u8], Error> {
        let end = self.at.checked_add(len).filter(|end| *end <= self.buf.len());
        let end = end.ok_or_else(|| corrupt("inbox value is truncated".into()))?;
        let bytes = &self.buf[self.at..end];
        self.at = end;
        Ok(bytes)
    }

    fn u64(&mut self) -> Result<u64, Error> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    fn str16(&mut self) -> Result<String, Error> {
        let len = u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes"));
        String::from_utf8(self.take(usize::from(len))?.to_vec())
            .map_err(|_| corrupt("inbox text is not UTF-8".into()))
    }
}

/// The applied state of the `inboxes` keyspace with a change being built over it: reads see the
/// change first, then the overlays, then fjall.
pub(crate) struct InboxState<'a> {
    view: OverlayView<'a>,
    stores: &'a Stores,
    /// The change so far: values, or `None` for deletes.
    pub(crate) pending: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

impl<'a> InboxState<'a> {
    pub(crate) fn new(view: OverlayView<'a>, stores: &'a Stores) -> InboxState<'a> {
        InboxState { view, stores, pending: BTreeMap::new() }
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        let layered =
            [Some(&self.pending), Some(&self.view.active.inboxes), self.view.frozen.map(|f| &f.inboxes)];
        for layer in layered.into_iter().flatten() {
            if let Some(value) = layer.get(key) {
                return Ok(value.clone());
            }
        }
        Ok(self.stores.inboxes.get(key)?.map(|slice| slice.to_vec()))
    }

    fn put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.pending.insert(key, Some(value));
    }

    fn delete(&mut self, key: Vec<u8>) {
        self.pending.insert(key, None);
    }

    /// Calls `visit` with each live entry whose key is in `range`, in key order, until it returns
    /// false.
    fn scan(
        &self,
        range: (Bound<Vec<u8>>, Bound<Vec<u8>>),
        visit: impl FnMut(&[u8], &[u8]) -> Result<bool, Error>,
    ) -> Result<(), Error> {
        let frozen_range = range.clone();
        let frozen = self
            .view
            .frozen
            .into_iter()
            .flat_map(move |f| f.inboxes.range::<Vec<u8>, _>(frozen_range.clone()));
        let mut layers = [
            Layer::memory_or_deleted(self.pending.range::<Vec<u8>, _>(range.clone())),
            Layer::memory_or_deleted(self.view.active.inboxes.range::<Vec<u8>, _>(range.clone())),
            Layer::memory_or_deleted(frozen),
            Layer::fjall(&self.stores.inboxes, range),
        ];
        for_each_merged(&mut layers, visit)
    }

    /// Every live entry whose key starts with `prefix`.
    fn scan_prefix(
        &self,
        prefix: &[u8],
        visit: impl FnMut(&[u8], &[u8]) -> Result<bool, Error>,
    ) -> Result<(), Error> {
        let end = match successor(prefix) {
            Some(end) => Bound::Excluded(end),
            None => Bound::Unbounded,
        };
        self.scan((Bound::Included(prefix.to_vec()), end), visit)
    }

    pub(crate) fn inbox_meta(&self, owner: &str) -> Result<Option<InboxMeta>, Error> {
        self.get(&inbox_key(owner))?.map(|value| InboxMeta::decode(&value)).transpose()
    }

    pub(crate) fn topic_meta(&self, owner: &str, topic: &str) -> Result<Option<TopicMeta>, Error> {
        self.get(&topic_key(owner, topic))?.map(|value| TopicMeta::decode(&value)).transpose()
    }

    pub(crate) fn receipt(&self, owner: &str, receive_id: &str) -> Result<Option<Receipt>, Error> {
        self.get(&receipt_key(owner, receive_id))?.map(|value| Receipt::decode(&value)).transpose()
    }

    fn message(&self, owner: &str, topic: &str, seq: u64) -> Result<Option<StoredMessage>, Error> {
        let key = with_seq(message_prefix(owner, topic), seq);
        self.get(&key)?.map(|value| StoredMessage::decode_value(topic, seq, &value)).transpose()
    }

    /// Calls `visit` with the topic's stored messages with sequences in `(after, through]`, in
    /// order, until it returns false.
    fn for_each_message(
        &self,
        owner: &str,
        topic: &str,
        after: u64,
        through: u64,
        mut visit: impl FnMut(StoredMessage) -> Result<bool, Error>,
    ) -> Result<(), Error> {
        if after >= through {
            return Ok(());
        }
        let prefix = message_prefix(owner, topic);
        let (from, to) = (with_seq(prefix.clone(), after + 1), with_seq(prefix, through));
        self.scan((Bound::Included(from), Bound::Included(to)), |key, value| {
            visit(StoredMessage::decode_value(topic, seq_of(key)?, value)?)
        })
    }

    /// The live topics of `owner`, by name.
    fn live_topics(&self, owner: &str) -> Result<Vec<(String, TopicMeta)>, Error> {
        let prefix = owner_prefix(TAG_TOPIC, owner);
        let mut topics = Vec::new();
        self.scan_prefix(&prefix, |key, value| {
            let topic =
                String::from_utf8(key[prefix.len()..].to_vec()).map_err(|_| corrupt("topic name".into()))?;
            topics.push((topic, TopicMeta::decode(value)?));
            Ok(true)
        })?;
        Ok(topics)
    }

    /// The topic's live topics with what `GET /v1/inboxes/{owner}` shows, at logged time `now_ms`.
    pub(crate) fn topic_infos(&self, owner: &str, now_ms: u64) -> Result<Vec<TopicInfo>, Error> {
        let mut infos = Vec::new();
        for (topic, meta) in self.live_topics(owner)? {
            let (mut oldest, mut leased, mut seen) = (None, 0, 0);
            self.for_each_message(owner, &topic, meta.floor, meta.head, |message| {
                oldest.get_or_insert((message.inbox_seq, message.created_ms));
                leased += u64::from(!message.available(now_ms));
                seen += 1;
                Ok(seen < LEASE_SCAN_MAX)
            })?;
            infos.push(TopicInfo { topic, meta, oldest, leased });
        }
        Ok(infos)
    }

    /// Whether a receive on `topics` at logged time `now_ms` would take a message, else when a
    /// lease among them runs out. A hint for a waiting receiver: the receive's apply decides.
    pub(crate) fn availability(
        &self,
        owner: &str,
        topics: &[String],
        now_ms: u64,
    ) -> Result<Availability, Error> {
        let mut found = Availability::default();
        for topic in topics {
            let Some(meta) = self.topic_meta(owner, topic)? else { continue };
            let mut seen = 0;
            self.for_each_message(owner, topic, meta.floor, meta.head, |message| {
                if message.available(now_ms) {
                    found.now = true;
                    return Ok(false);
                }
                let ends = found.lease_ends_ms.get_or_insert(message.lease_until_ms);
                *ends = (*ends).min(message.lease_until_ms);
                seen += 1;
                Ok(seen < LEASE_SCAN_MAX)
            })?;
            if found.now {
                break;
            }
        }
        Ok(found)
    }

    /// Every live topic of every inbox, with its oldest unconsumed message's logged time, for the
    /// leader's TTL round: `(owner, topic, meta)`, at most `limit`, after `after` (owner, topic).
    pub(crate) fn all_live_topics(
        &self,
        after: Option<(&str, &str)>,
        limit: usize,
    ) -> Result<Vec<(String, String, TopicMeta)>, Error> {
        let from = match after {
            Some((owner, topic)) => {
                let mut key = topic_key(owner, topic);
                key.push(0);
                key
            }
            None => vec![TAG_TOPIC],
        };
        let mut topics = Vec::new();
        self.scan((Bound::Included(from), Bound::Excluded(vec![TAG_TOPIC + 1])), |key, value| {
            let len = usize::from(*key.get(1).ok_or_else(|| corrupt("topic key".into()))?);
            let text =
                |bytes: &[u8]| String::from_utf8(bytes.to_vec()).map_err(|_| corrupt("topic key".into()));
            let owner = text(key.get(2..2 + len).ok_or_else(|| corrupt("topic key".into()))?)?;
            topics.push((owner, text(&key[2 + len..])?, TopicMeta::decode(value)?));
            Ok(topics.len() < limit)
        })?;
        Ok(topics)
    }

    /// The last sequence of `topic` (at most `scan_max` messages in) created before `cutoff_ms`:
    /// what a TTL expiry discards through. Stops at the first younger message, so only a prefix
    /// ever expires.
    pub(crate) fn expiry_point(
        &self,
        owner: &str,
        topic: &str,
        cutoff_ms: u64,
        scan_max: usize,
    ) -> Result<Option<u64>, Error> {
        let Some(meta) = self.topic_meta(owner, topic)? else { return Ok(None) };
        let (mut through, mut seen) = (None, 0);
        self.for_each_message(owner, topic, meta.floor, meta.head, |message| {
            if message.created_ms >= cutoff_ms || seen >= scan_max {
                return Ok(false);
            }
            through = Some(message.inbox_seq);
            seen += 1;
            Ok(true)
        })?;
        Ok(through)
    }
}

/// The shape an `inboxes` entry of a snapshot must have to load.
pub fn check_inbox_entry(key: &[u8], value: &[u8]) -> Result<(), Error> {
    let short = || corrupt("inbox key too short".into());
    let len = usize::from(*key.get(1).ok_or_else(short)?);
    let owner = key.get(2..2 + len).ok_or_else(short)?;
    std::str::from_utf8(owner).map_err(|_| corrupt("owner is not UTF-8".into()))?;
    let rest = &key[2 + len..];
    match key[0] {
        TAG_INBOX if rest.is_empty() => InboxMeta::decode(value).map(|_| ()),
        TAG_TOPIC => TopicMeta::decode(value).map(|_| ()),
        TAG_MESSAGE => {
            let topic_len = usize::from(*rest.first().ok_or_else(short)?);
            if rest.len() != 1 + topic_len + 8 {
                return Err(corrupt("malformed message key".into()));
            }
            StoredMessage::decode_value("", 0, value).map(|_| ())
        }
        TAG_DEDUPE if value.len() == 16 => Ok(()),
        TAG_DEDUPE_ORDER | TAG_RECEIPT_ORDER if rest.len() == 8 => Ok(()),
        TAG_RECEIPT => Receipt::decode(value).map(|_| ()),
        _ => Err(corrupt(format!("unknown or malformed inbox key (tag {})", key[0]))),
    }
}
