//! HTTP API models (the contract in docs/API.md). Requests reject unknown fields so a typo is a 400,
//! never a silently ignored option.

use serde::{Deserialize, Serialize};

/// Longest user name the API accepts (bytes); also the bound on names a peer sends in
/// hard-negatives anti-entropy.
pub const USER_BYTES_MAX: usize = 256;

/// Largest `|weight|` of a signal (and of a signal kind's configured weight). Trending scores and
/// profiles are sums of weights: a bound keeps any realistic sum far from f64's range (the fold also
/// saturates, for logs written before the bound), and a million is far above any weight a ranking
/// needs (the defaults are 1 to 5).
pub const SIGNAL_WEIGHT_MAX: f64 = 1e6;

/// How far past the node's clock a signal's `ts` may be, in ms. A score is never decayed before its
/// reference time, so an event from the future would keep its item's score undecayed until then,
/// and decay every earlier event of the item as late; an hour covers clients' clock skew.
pub const SIGNAL_TS_AHEAD_MAX_MS: i64 = 3_600_000;

/// Parses an id the API takes as a u64 (an item id in a path, a query parameter, a header) in its
/// canonical decimal form only: ASCII digits, no sign, no leading zero (`0` itself is canonical),
/// no spaces, no fraction or exponent, at most `u64::MAX`. Anything else is `None`, so `+1`, `01`
/// and ` 1` never alias item 1. (Rust's `u64::from_str` takes `+1` and `0001`.)
pub fn parse_canonical_u64(raw: &str) -> Option<u64> {
    let bytes = raw.as_bytes();
    let digits = !bytes.is_empty() && bytes.iter().all(u8::is_ascii_digit);
    let canonical = digits && (bytes[0] != b'0' || bytes.len() == 1);
    canonical.then(|| raw.parse::<u64>().ok()).flatten()
}

/// Error codes of the contract. The string form is what clients match on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// Body is not valid JSON or does not have the expected shape.
    MalformedJson,
    /// A field has a value outside its domain (id out of range, limit out of range...).
    InvalidArgument,
    /// A stream, consumer or event key name that is empty, too long, reserved or has control
    /// characters.
    InvalidName,
    /// An offset past the stream's last offset.
    InvalidOffset,
    /// Unknown signal kind.
    UnknownSignalKind,
    /// Embedding has the wrong dimension.
    DimensionMismatch,
    /// Embedding holds NaN or infinity.
    InvalidVector,
    /// A number that must be finite is not.
    NonFiniteNumber,
    /// Body over the size limit.
    PayloadTooLarge,
    /// No such item / resource.
    NotFound,
    /// The path exists but does not answer this method (405).
    MethodNotAllowed,
    /// Missing or bad bearer token.
    Unauthorized,
    /// Token lacks the scope the route needs.
    Forbidden,
    /// The node cannot take writes right now (retryable).
    NotReady,
    /// The write queue is full (retryable, back off).
    Overloaded,
    /// A read with `min_seqno` waited too long (retryable).
    NotCaughtUp,
    /// An idempotency key was reused with a different request.
    IdempotencyConflict,
    /// The route exists in the contract but this build does not serve it yet.
    NotImplemented,
    /// Something failed inside the node; the outcome of a write is unknown.
    Internal,
    /// An inbox topic holds its backlog cap of unconsumed messages (retryable once it drains).
    InboxFull,
    /// The inbox already has its cap of live topics; a known topic is never refused for it.
    TooManyTopics,
    /// The inbox was closed; nothing more is accepted or delivered.
    InboxClosed,
    /// An ack names a receive this inbox does not remember.
    UnknownReceive,
    /// An ack came after the lease ran out and the message went to another receive.
    LeaseLost,
    /// A request body that is not declared `application/json` (415).
    UnsupportedMediaType,
    /// A new embedding would take the ranking index past the node's `embeddings_max` (507);
    /// replacing an embedding the item has is never refused for it.
    IndexFull,
}

impl ErrorCode {
    /// Every code, in declaration order.
    pub const ALL: [ErrorCode; 26] = [
        ErrorCode::MalformedJson,
        ErrorCode::InvalidArgument,
        ErrorCode::InvalidName,
        ErrorCode::InvalidOffset,
        ErrorCode::UnknownSignalKind,
        ErrorCode::DimensionMismatch,
        ErrorCode::InvalidVector,
        ErrorCode::NonFiniteNumber,
        ErrorCode::PayloadTooLarge,
        ErrorCode::NotFound,
        ErrorCode::MethodNotAllowed,
        ErrorCode::Unauthorized,
        ErrorCode::Forbidden,
        ErrorCode::NotReady,
        ErrorCode::Overloaded,
        ErrorCode::NotCaughtUp,
        ErrorCode::IdempotencyConflict,
        ErrorCode::NotImplemented,
        ErrorCode::Internal,
        ErrorCode::InboxFull,
        ErrorCode::TooManyTopics,
        ErrorCode::InboxClosed,
        ErrorCode::UnknownReceive,
        ErrorCode::LeaseLost,
        ErrorCode::UnsupportedMediaType,
        ErrorCode::IndexFull,
    ];

    /// The HTTP status the contract pairs with the code. One exception: a body that did not arrive
    /// within the body timeout is 408 with `invalid_argument`.
    pub fn status(self) -> u16 {
        use ErrorCode::*;
        match self {
            MalformedJson | InvalidArgument | InvalidName | InvalidOffset | UnknownSignalKind
            | DimensionMismatch | InvalidVector | NonFiniteNumber => 400,
            Unauthorized => 401,
            Forbidden => 403,
            NotFound | UnknownReceive => 404,
            MethodNotAllowed => 405,
            LeaseLost => 409,
            InboxClosed => 410,
            PayloadTooLarge => 413,
            UnsupportedMediaType => 415,
            IdempotencyConflict => 422,
            InboxFull | TooManyTopics => 429,
            Internal => 500,
            NotImplemented => 501,
            NotReady | Overloaded => 503,
            NotCaughtUp => 504,
            IndexFull => 507,
        }
    }

    /// The wire string.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::MalformedJson => "malformed_json",
            ErrorCode::InvalidArgument => "invalid_argument",
            ErrorCode::InvalidName => "invalid_name",
            ErrorCode::InvalidOffset => "invalid_offset",
            ErrorCode::UnknownSignalKind => "unknown_signal_kind",
            ErrorCode::DimensionMismatch => "dimension_mismatch",
            ErrorCode::InvalidVector => "invalid_vector",
            ErrorCode::NonFiniteNumber => "non_finite_number",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::NotReady => "not_ready",
            ErrorCode::Overloaded => "overloaded",
            ErrorCode::NotCaughtUp => "not_caught_up",
            ErrorCode::IdempotencyConflict => "idempotency_conflict",
            ErrorCode::NotImplemented => "not_implemented",
            ErrorCode::Internal => "internal",
            ErrorCode::InboxFull => "inbox_full",
            ErrorCode::TooManyTopics => "too_many_topics",
            ErrorCode::InboxClosed => "inbox_closed",
            ErrorCode::UnknownReceive => "unknown_receive",
            ErrorCode::LeaseLost => "lease_lost",
            ErrorCode::UnsupportedMediaType => "unsupported_media_type",
            ErrorCode::IndexFull => "index_full",
        }
    }
}

/// `{"error": {"code", "message"}}`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// The inside of [`ErrorBody`].
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct ErrorDetail {
    /// One of [`ErrorCode`]'s strings.
    pub code: String,
    /// Human-readable explanation.
    pub message: String,
}

/// One signal in `POST /v1/signals`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalIn {
    /// User id (non-empty, not reserved).
    pub user: String,
    /// Item id.
    pub item: u64,
    /// Signal kind, one of the configured kinds.
    pub kind: String,
    /// Weight; defaults to the kind's configured weight. At most [`SIGNAL_WEIGHT_MAX`] in absolute
    /// value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<f64>,
    /// Event time (unix ms); defaults to the batch's logged time. At most
    /// [`SIGNAL_TS_AHEAD_MAX_MS`] past the node's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ts: Option<i64>,
}

/// Body of `POST /v1/signals`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalsRequest {
    /// The signals; one request is one batch.
    pub signals: Vec<SignalIn>,
}

/// Body of `PUT /v1/items/{id}`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ItemPut {
    /// Arbitrary JSON metadata.
    pub metadata: serde_json::Value,
}

/// Body of `PUT /v1/items/{id}/embedding`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingPut {
    /// The vector; must have the database's dimension and be finite.
    pub vector: Vec<f64>,
}

/// Reply to every write: the last seqno it consumed.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct WriteReply {
    /// Last seqno the write consumed.
    pub seqno: u64,
}

/// `GET /v1/items/{id}`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct ItemView {
    /// Item id.
    pub id: u64,
    /// Metadata as stored.
    pub metadata: serde_json::Value,
    /// Whether an embedding is stored.
    pub has_embedding: bool,
    /// Seqno of the write that last changed the metadata.
    pub seqno: u64,
}

/// `GET /v1/items/{id}/embedding`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct EmbeddingView {
    /// Item id.
    pub id: u64,
    /// The vector.
    pub vector: Vec<f32>,
    /// Seqno of the write that stored it.
    pub seqno: u64,
}

/// One entry of a ranked list (feed, similar, trending).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct RankedItem {
    /// Item id.
    pub item: u64,
    /// Combined score.
    pub score: f64,
    /// Cosine similarity part.
    pub similarity: f64,
    /// Trending part.
    pub trending: f64,
}

/// A ranked list with the applied frontier it was computed at.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct RankedList {
    /// Items, best first; ties broken by item id.
    pub items: Vec<RankedItem>,
    /// Applied seqno of the state that produced the list.
    pub applied_seqno: u64,
}

/// Body of `POST /v1/users/{user}/negatives`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NegativeAdd {
    /// Item the user is not interested in.
    pub item: u64,
}

/// Reply of the negatives writes.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct Accepted {
    /// Always true.
    pub accepted: bool,
}

/// `GET /v1/users/{user}/negatives`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct NegativesView {
    /// User id.
    pub user: String,
    /// Items, ascending.
    pub items: Vec<u64>,
}

/// `GET /cluster/digest`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct DigestView {
    /// Node id.
    pub node_id: u64,
    /// Applied frontier the digest was taken at.
    pub applied_seqno: u64,
    /// Hex BLAKE3 of the log-derived state.
    pub digest: String,
    /// Hex BLAKE3 of the hard negatives.
    pub negatives_digest: String,
}

/// One node in `GET /cluster/status`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct NodeStatus {
    /// Node id.
    pub id: u64,
    /// `leader`, `follower`, `candidate` or `learner` (a member that does not vote yet).
    pub role: String,
    /// A member that does not vote (it catches up before `members add` makes it a voter).
    #[serde(default)]
    pub learner: bool,
    /// HTTP address.
    pub http: String,
    /// Durable frontier.
    pub durable_seqno: u64,
    /// Applied frontier.
    pub applied_seqno: u64,
    /// Milliseconds since this member last answered the node that reports (0 for the reporting
    /// node itself). `null` when unknown: it never answered this node in this process (a follower
    /// tracks no other member; a leader has not heard this one yet).
    #[serde(default)]
    pub lag_ms: Option<u64>,
    /// Last position matched in the current term (leader's view; 0 when unknown).
    #[serde(default)]
    pub matched_seqno: u64,
    /// Whether the leader sees it catching up by pull (its ship tail no longer covers it).
    #[serde(default)]
    pub pulling: bool,
    /// Whether it is being healed by a snapshot of the leader's state (it fell behind the WAL
    /// retention budget); true until it has caught up on the log after the install.
    #[serde(default)]
    pub snapshot: bool,
}

/// `GET /cluster/status`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct ClusterStatus {
    /// This node.
    pub node_id: u64,
    /// This node's role.
    pub role: String,
    /// Current term.
    pub term: u64,
    /// Leader, if known.
    pub leader_id: Option<u64>,
    /// Durable frontier.
    pub durable_seqno: u64,
    /// Commit frontier.
    pub commit_seqno: u64,
    /// Applied frontier.
    pub applied_seqno: u64,
    /// Stream baseline `(T, B(T))` of this node's last office: the term it led, and the last seqno
    /// before that term's LeaderStart (0 if it never led).
    #[serde(default)]
    pub baseline_term: u64,
    /// See `baseline_term`.
    #[serde(default)]
    pub baseline_seqno: u64,
    /// Files in this node's WAL quarantine directory.
    #[serde(default)]
    pub quarantine_files: u64,
    /// Seqnos those files hold.
    #[serde(default)]
    pub quarantined_seqnos: u64,
    /// Every node.
    pub nodes: Vec<NodeStatus>,
}

/// Reply to `POST /v1/streams/{stream}/events`: each event's offset (its seqno), and the write's
/// last seqno.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct Published {
    /// The events' offsets, in the order sent.
    pub offsets: Vec<u64>,
    /// Last seqno the write consumed (the last offset).
    pub seqno: u64,
}

/// A stream event as reads and subscriptions return it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct StreamEventView {
    /// The event's seqno: global, never renumbered.
    pub offset: u64,
    /// The stream.
    pub stream: String,
    /// Carried metadata.
    pub key: Option<String>,
    /// What was published.
    pub payload: serde_json::Value,
    /// The leader's logged time of the publish, unix seconds (informational, not an order).
    pub created_at: i64,
}

/// Reply to `GET /v1/streams/{stream}/events`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct StreamEvents {
    /// Events after the requested offset, ascending.
    pub events: Vec<StreamEventView>,
    /// The node's applied seqno when it read.
    pub applied_seqno: u64,
}

/// A consumer's offset: the reply to `GET` and `PUT /v1/streams/{stream}/consumers/{name}` (a
/// save also gives its seqno).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct ConsumerOffset {
    /// The saved offset.
    pub offset: u64,
    /// The save's seqno (a save only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seqno: Option<u64>,
}

/// Reply to `POST /v1/streams/{stream}/trim`.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct Trimmed {
    /// The trim's seqno.
    pub seqno: u64,
    /// Every offset at or below this is gone.
    pub horizon: u64,
}

/// One stream of `GET /v1/streams`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct StreamView {
    /// The stream's name.
    pub stream: String,
    /// The first event still stored.
    pub first_offset: Option<u64>,
    /// The last event ever published (0 before the first).
    pub last_offset: u64,
    /// Every offset at or below this was trimmed.
    pub trimmed_through: u64,
    /// Events stored.
    pub events: u64,
    /// Their payload bytes.
    pub bytes: u64,
    /// Consumers with their saved offsets, by name.
    pub consumers: Vec<ConsumerView>,
}

/// A consumer in [`StreamView`].
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct ConsumerView {
    /// Its name.
    pub name: String,
    /// Its saved offset.
    pub offset: u64,
}

/// Reply to `GET /v1/streams`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct StreamList {
    /// Streams by name.
    pub streams: Vec<StreamView>,
    /// The node's applied seqno when it read.
    pub applied_seqno: u64,
}

/// Reply to `POST /v1/tx`: the last seqno the tx consumed, and the offsets of the events it
/// published, in op order.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct TxReply {
    /// Last seqno the tx consumed.
    pub seqno: u64,
    /// Offsets of its published events.
    pub offsets: Vec<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_canonical_decimal_u64_parses() {
        for (raw, value) in [("0", 0), ("1", 1), ("42", 42), ("18446744073709551615", u64::MAX)] {
            assert_eq!(parse_canonical_u64(raw), Some(value), "{raw:?}");
        }
        for raw in [
            "",
            "+1",
            "-1",
            "-0",
            "01",
            "0001",
            "00",
            " 1",
            "1 ",
            "1.0",
            "1e3",
            "0x1",
            "1_000",
            "١",
            "18446744073709551616",
            "99999999999999999999999",
            "１",
        ] {
            assert_eq!(parse_canonical_u64(raw), None, "{raw:?}");
        }
    }
}
