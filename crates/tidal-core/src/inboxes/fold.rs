//! What each inbox record decides, as functions of the applied state and the record: the same on
//! every node, at every replay. Each builds its change in [`InboxState::pending`] and returns the
//! [`InboxOutcome`] the writer of the record is answered with.

use std::collections::BTreeMap;
use std::ops::Bound;

use super::{
    dedupe_key, inbox_key, message_prefix, owner_prefix, receipt_key, seq_of, topic_key, with_seq, InboxMeta,
    InboxState, Receipt, StoredMessage, TopicMeta, TAG_DEDUPE, TAG_DEDUPE_ORDER, TAG_RECEIPT,
    TAG_RECEIPT_ORDER,
};
use crate::error::Error;
use crate::record::{InboxConsume, InboxSend, ReceiveLimits};

/// Most dedupe entries, and most receipts, one apply evicts: each apply adds at most one of each,
/// so a few per apply keep both windows at their bounds while every apply's work stays bounded.
pub const PRUNE_PER_APPLY: usize = 16;

/// What an inbox record did, for the request that wrote it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InboxOutcome {
    /// A send stored its message, or was a resend of one already accepted.
    Sent {
        /// The message's sequence (the first send's, for a resend).
        inbox_seq: u64,
        /// A resend inside the dedupe window: nothing new was stored.
        duplicate: bool,
    },
    /// A send was refused: its topic holds the backlog cap.
    Full {
        /// The topic's backlog.
        backlog: u64,
    },
    /// A send was refused: it would open a topic past the cap of live topics.
    TooManyTopics {
        /// Live topics.
        live: u32,
    },
    /// The inbox is closed: nothing was done.
    Closed,
    /// A receive took messages (its receipt holds them).
    Received {
        /// How many.
        count: u32,
    },
    /// A receive's id already has a receipt: nothing new was taken.
    AlreadyBound,
    /// A receive found nothing to take.
    Empty,
    /// An ack consumed what its receive still held.
    Acked {
        /// Messages consumed.
        acked: u64,
        /// Messages the receive no longer held (their lease ran out and another receive took
        /// them, or a discard dropped them).
        lost: u64,
    },
    /// An ack named a receive with no receipt.
    UnknownReceive,
    /// A discard dropped messages.
    Discarded {
        /// How many.
        count: u64,
    },
    /// A close closed the inbox.
    ClosedNow {
        /// Unconsumed messages dropped, by topic.
        unconsumed: Vec<(String, u64)>,
    },
}

/// Where in the log a record sits.
#[derive(Clone, Copy, Debug)]
pub(crate) struct At<'r> {
    /// The record's seqno.
    pub seqno: u64,
    /// The logged time the decisions use (never behind the last applied batch's).
    pub now_ms: u64,
    /// The batch's principal: a send's sender.
    pub principal: &'r str,
}

/// Topic metas a record changed, written back (or deleted when drained) at its end.
type Touched = BTreeMap<String, TopicMeta>;

impl InboxState<'_> {
    /// Applies a send.
    pub(crate) fn fold_send(&mut self, at: At<'_>, send: &InboxSend) -> Result<InboxOutcome, Error> {
        let InboxSend { owner, topic, message_id, payload, limits } = send;
        let mut meta = self.inbox_meta(owner)?.unwrap_or_default();
        if meta.closed {
            return Ok(InboxOutcome::Closed);
        }
        let key = dedupe_key(owner, at.principal, message_id);
        let age_ms = u64::from(limits.dedupe_age_s) * 1000;
        let known = self.get(&key)?.map(|value| decode_pair(&value)).transpose()?;
        if let Some((inbox_seq, time_ms)) = known {
            if at.now_ms.saturating_sub(time_ms) <= age_ms {
                return Ok(InboxOutcome::Sent { inbox_seq, duplicate: true });
            }
        }
        let topic_meta = self.topic_meta(owner, topic)?;
        match topic_meta {
            None if meta.live_topics >= limits.topics_max => {
                return Ok(InboxOutcome::TooManyTopics { live: meta.live_topics })
            }
            Some(t) if t.backlog >= u64::from(limits.backlog_max) => {
                return Ok(InboxOutcome::Full { backlog: t.backlog })
            }
            _ => {}
        }
        let mut t = topic_meta.unwrap_or(TopicMeta { floor: at.seqno - 1, ..TopicMeta::default() });
        meta.live_topics += u32::from(topic_meta.is_none());
        t.head = at.seqno;
        t.backlog += 1;
        t.bytes += payload.len() as u64;
        let message = StoredMessage {
            topic: topic.clone(),
            inbox_seq: at.seqno,
            created_ms: at.now_ms,
            sender: at.principal.to_string(),
            message_id: message_id.clone(),
            payload: payload.clone(),
            lease_until_ms: 0,
            holder: String::new(),
        };
        self.put(with_seq(message_prefix(owner, topic), at.seqno), message.encode_value());
        self.put(topic_key(owner, topic), t.encode());
        // A key past its age is replaced: its old place in the eviction order goes with it.
        match known {
            Some((old_seq, _)) => self.delete(with_seq(owner_prefix(TAG_DEDUPE_ORDER, owner), old_seq)),
            None => meta.dedupe += 1,
        }
        self.put(key.clone(), encode_pair(at.seqno, at.now_ms));
        self.put(with_seq(owner_prefix(TAG_DEDUPE_ORDER, owner), at.seqno), key);
        let window = Window { order_tag: TAG_DEDUPE_ORDER, max: u64::from(limits.dedupe_max), age_ms };
        let (count, floor) = (&mut meta.dedupe, &mut meta.dedupe_floor);
        self.prune(owner, window, at, (count, floor))?;
        self.put(inbox_key(owner), meta.encode());
        Ok(InboxOutcome::Sent { inbox_seq: at.seqno, duplicate: false })
    }

    /// Applies a receive, an ack, a discard or a close.
    pub(crate) fn fold_consume(&mut self, at: At<'_>, consume: &InboxConsume) -> Result<InboxOutcome, Error> {
        let owner = consume.owner();
        let meta = self.inbox_meta(owner)?;
        if meta.is_some_and(|meta| meta.closed) {
            return Ok(InboxOutcome::Closed);
        }
        if let InboxConsume::Close { owner } = consume {
            return self.close(owner, meta.unwrap_or_default());
        }
        // A receive may close its id on an inbox nothing was sent to yet: that creates the inbox.
        let Some(mut meta) =
            meta.or_else(|| matches!(consume, InboxConsume::Receive { .. }).then(InboxMeta::default))
        else {
            return Ok(match consume {
                InboxConsume::Ack { .. } => InboxOutcome::UnknownReceive,
                _ => InboxOutcome::Discarded { count: 0 },
            });
        };
        let mut touched = Touched::new();
        let outcome = match consume {
            InboxConsume::Receive { owner, receive_id, topics, lease_ms, limits } => {
                let lease_ms = u64::from(*lease_ms);
                self.receive(at, owner, receive_id, topics, (lease_ms, *limits), &mut meta, &mut touched)?
            }
            InboxConsume::Ack { owner, receive_id } => {
                self.ack(owner, receive_id, &mut meta, &mut touched)?
            }
            InboxConsume::Discard { owner, topic, through, .. } => {
                self.discard(owner, topic, *through, &mut touched)?
            }
            InboxConsume::Close { .. } => unreachable!("a close returned above"),
        };
        if outcome == InboxOutcome::Empty {
            // Nothing taken, nothing written (not even the inbox it would have created).
            return Ok(outcome);
        }
        self.settle(owner, touched, &mut meta)?;
        self.put(inbox_key(owner), meta.encode());
        Ok(outcome)
    }

    #[allow(clippy::too_many_arguments)]
    fn receive(
        &mut self,
        at: At<'_>,
        owner: &str,
        receive_id: &str,
        topics: &[String],
        (lease_ms, limits): (u64, ReceiveLimits),
        meta: &mut InboxMeta,
        touched: &mut Touched,
    ) -> Result<InboxOutcome, Error> {
        if self.receipt(owner, receive_id)?.is_some() {
            return Ok(InboxOutcome::AlreadyBound);
        }
        // `max` 0 closes the id with nothing: an earlier attempt of it still in flight then takes
        // nothing either, so the empty answer its client got stays true.
        let taken = if limits.max == 0 { Vec::new() } else { self.select(owner, topics, at.now_ms, limits)? };
        if taken.is_empty() && limits.max > 0 {
            return Ok(InboxOutcome::Empty);
        }
        let lease_until_ms = if lease_ms == 0 { 0 } else { at.now_ms + lease_ms };
        for message in &taken {
            if lease_ms == 0 {
                self.consume(owner, message, meta, touched)?;
            } else {
                let held =
                    StoredMessage { lease_until_ms, holder: receive_id.to_string(), ..message.clone() };
                self.put(
                    with_seq(message_prefix(owner, &message.topic), message.inbox_seq),
                    held.encode_value(),
                );
            }
        }
        let count = taken.len() as u32;
        let receipt =
            Receipt { seqno: at.seqno, time_ms: at.now_ms, lease_until_ms, acked: false, messages: taken };
        let key = receipt_key(owner, receive_id);
        self.put(key.clone(), receipt.encode());
        self.put(with_seq(owner_prefix(TAG_RECEIPT_ORDER, owner), at.seqno), key);
        meta.receipts += 1;
        let age_ms = u64::from(limits.receipt_age_s) * 1000;
        let window = Window { order_tag: TAG_RECEIPT_ORDER, max: u64::from(limits.receipts_max), age_ms };
        self.prune(owner, window, at, (&mut meta.receipts, &mut meta.receipts_floor))?;
        Ok(InboxOutcome::Received { count })
    }

    /// The oldest messages available at `now_ms` across `topics`, in sequence order, within the
    /// receive's limits (at least one, whatever its size).
    fn select(
        &self,
        owner: &str,
        topics: &[String],
        now_ms: u64,
        limits: ReceiveLimits,
    ) -> Result<Vec<StoredMessage>, Error> {
        let max = limits.max as usize;
        let mut candidates = Vec::new();
        let mut seen_topics: Vec<&String> = Vec::with_capacity(topics.len());
        for topic in topics {
            if seen_topics.contains(&topic) {
                continue;
            }
            seen_topics.push(topic);
            let Some(t) = self.topic_meta(owner, topic)? else { continue };
            let mut found = 0;
            self.for_each_message(owner, topic, t.floor, t.head, |message| {
                if message.available(now_ms) {
                    candidates.push(message);
                    found += 1;
                }
                Ok(found < max)
            })?;
        }
        candidates.sort_by_key(|message| message.inbox_seq);
        let (mut taken, mut bytes) = (Vec::new(), 0u64);
        for message in candidates.into_iter().take(max) {
            bytes += message.payload.len() as u64;
            if !taken.is_empty() && bytes > u64::from(limits.bytes_max) {
                break;
            }
            taken.push(message);
        }
        Ok(taken)
    }

    fn ack(
        &mut self,
        owner: &str,
        receive_id: &str,
        meta: &mut InboxMeta,
        touched: &mut Touched,
    ) -> Result<InboxOutcome, Error> {
        let Some(mut receipt) = self.receipt(owner, receive_id)? else {
            return Ok(InboxOutcome::UnknownReceive);
        };
        if receipt.lease_until_ms == 0 || receipt.acked {
            return Ok(InboxOutcome::Acked { acked: 0, lost: 0 });
        }
        let (mut acked, mut lost) = (0, 0);
        for message in &receipt.messages {
            match self.message(owner, &message.topic, message.inbox_seq)? {
                Some(stored) if stored.holder == receive_id => {
                    self.consume(owner, &stored, meta, touched)?;
                    acked += 1;
                }
                _ => lost += 1,
            }
        }
        // An ack that lost everything stays unacked, so its retry is told the same.
        if acked > 0 || lost == 0 {
            receipt.acked = true;
            self.put(receipt_key(owner, receive_id), receipt.encode());
        }
        Ok(InboxOutcome::Acked { acked, lost })
    }

    fn discard(
        &mut self,
        owner: &str,
        topic: &str,
        through: u64,
        touched: &mut Touched,
    ) -> Result<InboxOutcome, Error> {
        let Some(mut t) = self.topic_meta(owner, topic)? else {
            return Ok(InboxOutcome::Discarded { count: 0 });
        };
        // Later sends get later seqnos: clamping to the head keeps the discard about what exists.
        let through = through.min(t.head);
        let mut dropped = Vec::new();
        self.for_each_message(owner, topic, t.floor, through, |message| {
            dropped.push((message.inbox_seq, message.payload.len() as u64));
            Ok(true)
        })?;
        for (seq, bytes) in &dropped {
            self.delete(with_seq(message_prefix(owner, topic), *seq));
            t.backlog -= 1;
            t.bytes -= bytes;
        }
        t.cursor = t.cursor.max(through);
        touched.insert(topic.to_string(), t);
        Ok(InboxOutcome::Discarded { count: dropped.len() as u64 })
    }

    fn close(&mut self, owner: &str, meta: InboxMeta) -> Result<InboxOutcome, Error> {
        let mut unconsumed = Vec::new();
        for (topic, t) in self.live_topics(owner)? {
            unconsumed.push((topic.clone(), t.backlog));
            self.delete(topic_key(owner, &topic));
        }
        for tag in [super::TAG_MESSAGE, TAG_DEDUPE, TAG_DEDUPE_ORDER, TAG_RECEIPT, TAG_RECEIPT_ORDER] {
            let mut keys = Vec::new();
            self.scan_prefix(&owner_prefix(tag, owner), |key, _| {
                keys.push(key.to_vec());
                Ok(true)
            })?;
            for key in keys {
                self.delete(key);
            }
        }
        let closed = InboxMeta { closed: true, consumed: meta.consumed, ..InboxMeta::default() };
        self.put(inbox_key(owner), closed.encode());
        Ok(InboxOutcome::ClosedNow { unconsumed })
    }

    /// Deletes a consumed message and counts it in its topic (loaded into `touched` once).
    fn consume(
        &mut self,
        owner: &str,
        message: &StoredMessage,
        meta: &mut InboxMeta,
        touched: &mut Touched,
    ) -> Result<(), Error> {
        let topic = &message.topic;
        if !touched.contains_key(topic) {
            let t = self.topic_meta(owner, topic)?.ok_or_else(|| Error::Corrupt {
                keyspace: "inboxes",
                reason: format!("message {} has no topic", message.inbox_seq),
            })?;
            touched.insert(topic.clone(), t);
        }
        let t = touched.get_mut(topic).expect("loaded above");
        self.delete(with_seq(message_prefix(owner, topic), message.inbox_seq));
        t.backlog -= 1;
        t.bytes -= message.payload.len() as u64;
        t.cursor = t.cursor.max(message.inbox_seq);
        meta.consumed += 1;
        Ok(())
    }

    /// Writes back the topics a record changed: a drained topic is no longer live; another's floor
    /// moves up to just below its first stored message.
    fn settle(&mut self, owner: &str, touched: Touched, meta: &mut InboxMeta) -> Result<(), Error> {
        for (topic, mut t) in touched {
            if t.backlog == 0 {
                self.delete(topic_key(owner, &topic));
                meta.live_topics -= 1;
                continue;
            }
            let mut first = None;
            self.for_each_message(owner, &topic, t.floor, t.head, |message| {
                first = Some(message.inbox_seq);
                Ok(false)
            })?;
            t.floor = first.map_or(t.head, |seq| seq - 1);
            self.put(topic_key(owner, &topic), t.encode());
        }
        Ok(())
    }

    /// Evicts the oldest entries of a window (dedupe or receipts) while it holds more than its
    /// `max` or they are older than its age, at most [`PRUNE_PER_APPLY`], never the entry this
    /// record wrote; lowers `count` and raises `floor` past what it evicted. The scan starts above
    /// the floor: the deletes of earlier evictions stay in the overlay until a flush, and a scan
    /// from the window's start would walk them all at every apply.
    fn prune(
        &mut self,
        owner: &str,
        window: Window,
        at: At<'_>,
        (count, floor): (&mut u64, &mut u64),
    ) -> Result<(), Error> {
        if *floor + 1 >= at.seqno {
            return Ok(());
        }
        let prefix = owner_prefix(window.order_tag, owner);
        let from = with_seq(prefix.clone(), *floor + 1);
        let to = with_seq(prefix, at.seqno.saturating_sub(1));
        let mut evict = Vec::new();
        self.scan((Bound::Included(from), Bound::Included(to)), |key, target| {
            evict.push((key.to_vec(), target.to_vec()));
            Ok(evict.len() < PRUNE_PER_APPLY)
        })?;
        for (order_key, target) in evict {
            let time_ms = match self.get(&target)? {
                Some(value) if value.len() >= 16 => decode_pair(&value[..16])?.1,
                _ => 0,
            };
            if *count <= window.max && at.now_ms.saturating_sub(time_ms) <= window.age_ms {
                break;
            }
            *floor = seq_of(&order_key)?;
            self.delete(order_key);
            self.delete(target);
            *count -= 1;
        }
        Ok(())
    }
}

/// A window of remembered ids, evicted oldest first.
#[derive(Clone, Copy)]
struct Window {
    order_tag: u8,
    max: u64,
    age_ms: u64,
}

/// Both window kinds store their entry's sequence and logged time first.
fn encode_pair(seq: u64, time_ms: u64) -> Vec<u8> {
    [seq, time_ms].iter().flat_map(|n| n.to_le_bytes()).collect()
}

fn decode_pair(value: &[u8]) -> Result<(u64, u64), Error> {
    if value.len() != 16 {
        return Err(Error::Corrupt {
            keyspace: "inboxes",
            reason: format!("an entry of {} bytes, not 16", value.len()),
        });
    }
    let n = |at: usize| u64::from_le_bytes(value[at..at + 8].try_into().expect("8 bytes"));
    Ok((n(0), n(8)))
}
