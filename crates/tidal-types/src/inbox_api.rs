//! HTTP API models of the inbox routes (docs/API.md, "Inboxes").
//!
//! An inbox belongs to an owner and holds messages on named topics, FIFO per topic. A message's
//! `inbox_seq` is the seqno of the send that stored it: global, never renumbered.

use serde::{Deserialize, Serialize};

/// Longest `message_id` or `receive_id`, in bytes.
pub const INBOX_ID_BYTES_MAX: usize = 256;

/// Body of `POST /v1/inboxes/{owner}/messages`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InboxSend {
    /// The topic (a name: non-empty, at most 255 bytes, not reserved).
    pub topic: String,
    /// Any JSON but null.
    pub payload: serde_json::Value,
    /// The sender's idempotency key for this message (1..=256 bytes): a resend with the same id
    /// from the same sender inside the dedupe window is answered as the first and stores nothing.
    pub message_id: String,
}

/// Reply to `POST /v1/inboxes/{owner}/messages`.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct InboxSent {
    /// The message's sequence: the seqno of the send that stored it.
    pub inbox_seq: u64,
    /// True when this send was a resend of a message already accepted (nothing new was stored).
    pub duplicate: bool,
}

/// Body of `POST /v1/inboxes/{owner}/receive`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InboxReceive {
    /// The topics to take from (1..=64 distinct names): the oldest available message across them.
    pub topics: Vec<String>,
    /// How long to wait for a message when none is available (0..=60000; default 0).
    #[serde(default)]
    pub wait_ms: u64,
    /// The receiver's id for this attempt (1..=256 bytes): a retry with the same id returns what
    /// the first attempt took, so an answer lost on the way costs nothing.
    pub receive_id: String,
    /// Lease mode: the message is delivered now but consumed only by an ack; unacked for this long
    /// (100..=3600000 ms), it is delivered again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<u64>,
    /// Take up to this many messages (1..=1000) in one journaled receive; the reply then lists them
    /// all in `messages`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u32>,
}

/// One delivered message.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct InboxMessageView {
    /// Its topic.
    pub topic: String,
    /// Its sequence (the seqno of its send).
    pub inbox_seq: u64,
    /// The sender's id for it.
    pub message_id: String,
    /// The principal that sent it.
    pub sender: String,
    /// What was sent.
    pub payload: serde_json::Value,
    /// The leader's logged time of the send (unix ms).
    pub created_at_ms: u64,
}

/// Reply to `POST /v1/inboxes/{owner}/receive` (204 with no body when nothing came in time): the
/// first message taken, flattened, with the receive's id.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct InboxReceived {
    /// The receive this delivery is bound to.
    pub receive_id: String,
    /// The (first) message.
    #[serde(flatten)]
    pub message: InboxMessageView,
    /// Lease mode: the logged time (unix ms) until which the message is held for this receive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_until_ms: Option<u64>,
    /// Every message taken, in order, when the request gave `max`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<InboxMessageView>>,
    /// The seqno of the receive that took them.
    pub seqno: u64,
}

/// Body of `POST /v1/inboxes/{owner}/ack`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InboxAck {
    /// The receive whose leased messages are done.
    pub receive_id: String,
}

/// Reply to `POST /v1/inboxes/{owner}/ack`.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct InboxAcked {
    /// Messages this ack consumed (0 when they already were).
    pub acked: u64,
    /// The ack's seqno.
    pub seqno: u64,
}

/// Body of `POST /v1/inboxes/{owner}/discard`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InboxDiscard {
    /// The topic.
    pub topic: String,
    /// Unconsumed messages of the topic with `inbox_seq` at or below this are dropped.
    pub through: u64,
}

/// Reply to `POST /v1/inboxes/{owner}/discard`.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct InboxDiscarded {
    /// Messages dropped.
    pub discarded: u64,
    /// The discard's seqno.
    pub seqno: u64,
}

/// Reply to `DELETE /v1/inboxes/{owner}`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct InboxClosed {
    /// Messages that were never consumed, by topic (dropped with the inbox).
    pub unconsumed: Vec<InboxTopicCount>,
    /// The close's seqno.
    pub seqno: u64,
}

/// A topic and a count.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct InboxTopicCount {
    /// The topic.
    pub topic: String,
    /// The count.
    pub count: u64,
}

/// One live topic of `GET /v1/inboxes/{owner}`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct InboxTopicView {
    /// The topic.
    pub topic: String,
    /// Messages not consumed yet (leased ones included).
    pub backlog: u64,
    /// Of those, messages held by an unexpired lease.
    pub leased: u64,
    /// Payload bytes of the backlog.
    pub bytes: u64,
    /// The oldest unconsumed message's sequence.
    pub oldest_seq: Option<u64>,
    /// Its age (ms) against the node's applied logged time.
    pub oldest_age_ms: Option<u64>,
    /// The sequence of the last message consumed (0: none since the topic went live).
    pub cursor: u64,
    /// The sequence of the last message sent.
    pub head: u64,
}

/// Reply to `GET /v1/inboxes/{owner}`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct InboxView {
    /// The owner.
    pub owner: String,
    /// Whether the inbox was closed.
    pub closed: bool,
    /// Topics with unconsumed messages, by name.
    pub topics: Vec<InboxTopicView>,
    /// Messages consumed over the inbox's life.
    pub consumed: u64,
    /// The node's applied seqno when it read.
    pub applied_seqno: u64,
}
