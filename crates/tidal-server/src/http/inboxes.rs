//! The inbox routes: send, receive (with a wait), ack, discard, close and show.
//!
//! Every decision is the engine's, in apply (kinds 7 and 8): a route writes its record, waits for
//! the leader to apply it, and answers with what the apply decided (`TidalDb::inbox_outcome`), so
//! what a client is told is what every node holds.
//!
//! Delicate:
//! - A receive registers with the owner's waiter BEFORE it looks for a message, then waits on it:
//!   a send applied after the look wakes it, one applied before is seen by it (the engine calls
//!   its listener after the apply is visible). No wakeup is lost and a wake with nothing to take
//!   (another receiver won) just looks again.
//! - A receive answers only after its consumption is applied on the leader (committed by a
//!   majority): a crash before that loses nothing, and the client's retry with the same
//!   `receive_id` is answered from the receipt the first attempt left, if it got that far.
//! - A receive that found nothing writes an empty receipt for its id before it answers 204: an
//!   earlier attempt of the same id still in flight (its answer lost, its leader stalled) would
//!   otherwise take a message later that no client hears of. Found by the simulation (a partition
//!   with the receiver's first attempt on the isolated leader).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use tidal_core::{InboxConsume, InboxOutcome, InboxSend, Receipt, ReceiveLimits, Records, SendLimits};
use tidal_types::{
    ErrorCode, InboxAck, InboxAcked, InboxClosed, InboxDiscard, InboxDiscarded, InboxReceive, InboxSent,
    InboxTopicCount, InboxTopicView, InboxView, INBOX_ID_BYTES_MAX,
};
use tokio::sync::Notify;

use super::decode::Limits;
use super::streams::check_stream_name;
use super::{idempotency_key, json_body, read_barrier, read_body, with_applied, AppResult, AppState};
use crate::auth::Principal;
use crate::error::ApiError;

/// Longest wait of a receive.
pub const RECEIVE_WAIT_MS_MAX: u64 = 60_000;
/// Most topics one receive waits on.
const RECEIVE_TOPICS_MAX: usize = 64;
/// Most messages one receive takes.
const RECEIVE_MAX: u32 = 1_000;
/// Most payload bytes one receive takes (it takes one message whatever its size).
const RECEIVE_BYTES_MAX: u32 = 4 * 1024 * 1024;
/// Shortest and longest lease.
const LEASE_MS: std::ops::RangeInclusive<u64> = 100..=3_600_000;

/// Where a receive stops for a [`ReceiveProbe`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReceiveStep {
    /// Registered with the owner's waiter; nothing looked at yet.
    Registered,
    /// Looked and found nothing to take; not waiting yet.
    FoundNothing,
}

/// A test probe awaited at each [`ReceiveStep`] of every receive, so a test can put a send at an
/// exact point of a receive (the lost-wakeup interleavings); `None` in production.
pub type ReceiveProbe =
    Arc<dyn Fn(ReceiveStep) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send + Sync>;

/// Receivers parked per owner, and the inbox counters.
#[derive(Default)]
pub struct Inboxes {
    waiters: Mutex<HashMap<String, Arc<OwnerWaiters>>>,
    parks: AtomicU64,
    wakes: AtomicU64,
    early_takes: AtomicU64,
    sent: AtomicU64,
    received: AtomicU64,
}

/// What the receivers parked on one owner share: the wake-up, and how many sends to each topic
/// were handed to the WAL since the first of them registered.
#[derive(Default)]
struct OwnerWaiters {
    notify: Notify,
    submitted: Mutex<HashMap<String, u64>>,
}

impl Inboxes {
    /// Wakes the receivers parked on `owner` (the engine's listener: an inbox record applied).
    pub fn changed(&self, owner: &str) {
        let waiters = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(owner) = waiters.get(owner) {
            owner.notify.notify_waiters();
        }
    }

    /// A send to `owner`'s `topic` was handed to the WAL: wakes the receivers parked on the owner,
    /// which may write their receive right behind it (it is sequenced after the send, so its apply
    /// sees the message) instead of waiting for the send's commit and apply.
    fn submitted(&self, owner: &str, topic: &str) {
        let waiters = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(owner) = waiters.get(owner) {
            *owner
                .submitted
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(topic.to_string())
                .or_default() += 1;
            owner.notify.notify_waiters();
        }
    }

    fn waiter(self: &Arc<Self>, owner: &str) -> Waiter {
        let mut waiters = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        let shared = waiters.entry(owner.to_string()).or_default().clone();
        Waiter { inboxes: self.clone(), owner: owner.to_string(), shared }
    }
}

/// One receive's place among an owner's waiters; the entry goes when its last waiter does.
struct Waiter {
    inboxes: Arc<Inboxes>,
    owner: String,
    shared: Arc<OwnerWaiters>,
}

impl Waiter {
    /// Sends to any of `topics` handed to the WAL so far (while someone waited on the owner).
    fn submitted_to(&self, topics: &[String]) -> u64 {
        let submitted = self.shared.submitted.lock().unwrap_or_else(PoisonError::into_inner);
        topics.iter().filter_map(|topic| submitted.get(topic)).sum()
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut waiters = self.inboxes.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        // The map's handle and this one: nobody else waits on the owner.
        if Arc::strong_count(&self.shared) == 2 {
            waiters.remove(&self.owner);
        }
    }
}

fn check_owner(principal: &Principal, owner: &str) -> AppResult<()> {
    check_stream_name("owner", owner)?;
    if !principal.may_use_inbox(owner) {
        let message = format!("token {:?} may not use inbox {owner:?}", principal.name);
        return Err(ApiError::new(StatusCode::FORBIDDEN, ErrorCode::Forbidden, message));
    }
    Ok(())
}

pub(super) fn check_id(what: &str, id: &str) -> AppResult<()> {
    if id.is_empty() || id.len() > INBOX_ID_BYTES_MAX {
        return Err(ApiError::invalid(format!("{what} must be 1..={INBOX_ID_BYTES_MAX} bytes")));
    }
    Ok(())
}

/// What the apply of the inbox record at `seqno` decided. The engine keeps the last 65,536; one
/// older than that was pushed out while this request was being woken.
fn outcome(state: &AppState, seqno: u64) -> AppResult<InboxOutcome> {
    state.node.db().inbox_outcome(seqno).ok_or_else(|| {
        let message = format!("the outcome of the inbox write at seqno {seqno} is no longer known: retry it");
        ApiError::unavailable(ErrorCode::NotReady, message)
    })
}

fn closed(owner: &str) -> ApiError {
    ApiError::new(StatusCode::GONE, ErrorCode::InboxClosed, format!("inbox {owner:?} is closed"))
}

fn unexpected(outcome: InboxOutcome) -> ApiError {
    ApiError::internal(format!("an inbox record had an outcome its route does not expect: {outcome:?}"))
}

/// `POST /v1/inboxes/{owner}/messages`.
pub async fn send(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    Path(owner): Path<String>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> AppResult<Json<InboxSent>> {
    check_owner(&principal, &owner)?;
    let key = idempotency_key(&headers)?;
    let message =
        super::decode::inbox_send(&read_body(&state, body).await?, &Limits::of(state.node.config()))?;
    let config = &state.node.config().inbox;
    let limits = SendLimits {
        backlog_max: config.backlog_max,
        topics_max: config.topics_max,
        dedupe_max: config.dedupe_max,
        dedupe_age_s: config.dedupe_age_s,
    };
    let topic = message.topic;
    let send = InboxSend {
        owner: owner.clone(),
        topic: topic.clone(),
        message_id: message.message_id,
        payload: message.payload,
        limits,
    };
    let inboxes = state.inboxes.clone();
    let (o, t) = (owner.clone(), topic.clone());
    let submitted: crate::node::Submitted = Box::new(move || inboxes.submitted(&o, &t));
    let seqno = state.node.write_then(&principal, key, Records::InboxSend(send), Some(submitted)).await?;
    match outcome(&state, seqno)? {
        InboxOutcome::Sent { inbox_seq, duplicate } => {
            state.inboxes.sent.fetch_add(u64::from(!duplicate), Ordering::Relaxed);
            Ok(Json(InboxSent { inbox_seq, duplicate }))
        }
        InboxOutcome::Full { backlog } => Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::InboxFull,
            format!("topic {topic:?} of inbox {owner:?} holds {backlog} unconsumed messages, its cap; retry once it drains"),
        )),
        InboxOutcome::TooManyTopics { live } => Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::TooManyTopics,
            format!("inbox {owner:?} has {live} topics with unconsumed messages, its cap; topic {topic:?} would be one more"),
        )),
        InboxOutcome::Closed => Err(closed(&owner)),
        other => Err(unexpected(other)),
    }
}

/// A receive's request, checked.
struct ReceiveRequest {
    topics: Vec<String>,
    wait: Duration,
    receive_id: String,
    lease_ms: u32,
    max: Option<u32>,
}

fn receive_request(body: InboxReceive) -> AppResult<ReceiveRequest> {
    if body.topics.is_empty() || body.topics.len() > RECEIVE_TOPICS_MAX {
        return Err(ApiError::invalid(format!("topics must list 1..={RECEIVE_TOPICS_MAX} topics")));
    }
    for (i, topic) in body.topics.iter().enumerate() {
        check_stream_name("topic", topic)?;
        if body.topics[..i].contains(topic) {
            return Err(ApiError::invalid(format!("topic {topic:?} is listed twice")));
        }
    }
    check_id("receive_id", &body.receive_id)?;
    if body.wait_ms > RECEIVE_WAIT_MS_MAX {
        return Err(ApiError::invalid(format!("wait_ms must be 0..={RECEIVE_WAIT_MS_MAX}")));
    }
    let lease_ms = match body.lease_ms {
        None => 0,
        Some(ms) if LEASE_MS.contains(&ms) => ms as u32,
        Some(_) => {
            return Err(ApiError::invalid(format!(
                "lease_ms must be {}..={}",
                LEASE_MS.start(),
                LEASE_MS.end()
            )))
        }
    };
    if body.max.is_some_and(|max| !(1..=RECEIVE_MAX).contains(&max)) {
        return Err(ApiError::invalid(format!("max must be 1..={RECEIVE_MAX}")));
    }
    let wait = Duration::from_millis(body.wait_ms);
    Ok(ReceiveRequest { topics: body.topics, wait, receive_id: body.receive_id, lease_ms, max: body.max })
}

/// `POST /v1/inboxes/{owner}/receive`: the oldest available message across the topics, its
/// consumption applied before the answer; 204 when nothing came within `wait_ms`.
pub async fn receive(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    Path(owner): Path<String>,
    body: axum::body::Body,
) -> AppResult<Response> {
    check_owner(&principal, &owner)?;
    let request = receive_request(json_body(&state, body).await?)?;
    let deadline = tokio::time::Instant::now() + request.wait;
    let db = state.node.db();
    let mut sends_seen = None;
    // Held for the whole receive: the owner's count of sends handed to the WAL lives while
    // someone waits on it.
    let waiter = state.inboxes.waiter(&owner);
    loop {
        // Registered before looking: a send applied (or handed to the WAL) from here on wakes it.
        let notified = waiter.shared.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        probe(&state, ReceiveStep::Registered).await;
        if let Some(receipt) = db.inbox_receipt(&owner, &request.receive_id)? {
            return delivered(&state, &request, receipt);
        }
        if db.inbox_meta(&owner)?.is_some_and(|meta| meta.closed) {
            return Err(closed(&owner));
        }
        let availability = db.inbox_availability(&owner, &request.topics, wall_ms())?;
        // A send to these topics handed to the WAL since the last look, not applied yet: a receive
        // written now is sequenced after it and takes it at its apply (or finds it taken).
        let sends = waiter.submitted_to(&request.topics);
        let early = sends_seen.is_some_and(|seen| sends > seen);
        sends_seen = Some(sends);
        if availability.now || early {
            state.inboxes.early_takes.fetch_add(u64::from(!availability.now), Ordering::Relaxed);
            match take(&state, &principal, &owner, &request, request.max.unwrap_or(1)).await? {
                Some(receipt) => return delivered(&state, &request, receipt),
                None => continue,
            }
        }
        probe(&state, ReceiveStep::FoundNothing).await;
        if tokio::time::Instant::now() >= deadline {
            // The id is closed in the log before the empty answer: an earlier attempt of it still
            // in flight (a lost answer, a stalled leader) then takes nothing, and if one already
            // took something, that is the answer.
            let receipt = take(&state, &principal, &owner, &request, 0).await?;
            let receipt =
                receipt.ok_or_else(|| ApiError::internal("a receive of nothing left no receipt"))?;
            return delivered(&state, &request, receipt);
        }
        let until = match availability.lease_ends_ms {
            Some(ends) => deadline
                .min(tokio::time::Instant::now() + Duration::from_millis(ends.saturating_sub(wall_ms()))),
            None => deadline,
        };
        state.inboxes.parks.fetch_add(1, Ordering::Relaxed);
        tokio::select! {
            () = &mut notified => { state.inboxes.wakes.fetch_add(1, Ordering::Relaxed); }
            () = tokio::time::sleep_until(until) => {}
        }
    }
}

async fn probe(state: &AppState, step: ReceiveStep) {
    if let Some(probe) = &state.node.config().io.receive_probe {
        probe(step).await;
    }
}

/// Writes the receive (taking up to `max` messages; 0 closes the id with nothing) and reads what it
/// took: `None` when another receive took everything first.
async fn take(
    state: &AppState,
    principal: &Principal,
    owner: &str,
    request: &ReceiveRequest,
    max: u32,
) -> AppResult<Option<Receipt>> {
    let config = &state.node.config().inbox;
    let limits = ReceiveLimits {
        max,
        bytes_max: RECEIVE_BYTES_MAX,
        receipts_max: config.receipts_max,
        receipt_age_s: config.receipt_age_s,
    };
    let receive = InboxConsume::Receive {
        owner: owner.to_string(),
        receive_id: request.receive_id.clone(),
        topics: request.topics.clone(),
        lease_ms: request.lease_ms,
        limits,
    };
    let seqno = state.node.write(principal, None, Records::InboxConsume(receive)).await?;
    match outcome(state, seqno)? {
        InboxOutcome::Received { .. } | InboxOutcome::AlreadyBound => {
            Ok(state.node.db().inbox_receipt(owner, &request.receive_id)?)
        }
        InboxOutcome::Empty => Ok(None),
        InboxOutcome::Closed => Err(closed(owner)),
        other => Err(unexpected(other)),
    }
}

/// The reply to a receive from its receipt.
fn delivered(state: &AppState, request: &ReceiveRequest, receipt: Receipt) -> AppResult<Response> {
    let Some(first) = receipt.messages.first() else {
        // The id was closed with nothing.
        return Ok(StatusCode::NO_CONTENT.into_response());
    };
    state.inboxes.received.fetch_add(receipt.messages.len() as u64, Ordering::Relaxed);
    let quoted = |text: &str| serde_json::to_string(text).expect("a string always serializes");
    let mut body = format!("{{\"receive_id\":{},", quoted(&request.receive_id));
    message_fields(&mut body, first);
    if receipt.lease_until_ms > 0 {
        body.push_str(&format!(",\"lease_until_ms\":{}", receipt.lease_until_ms));
    }
    if request.max.is_some() {
        body.push_str(",\"messages\":[");
        for (i, message) in receipt.messages.iter().enumerate() {
            body.push_str(if i == 0 { "{" } else { ",{" });
            message_fields(&mut body, message);
            body.push('}');
        }
        body.push(']');
    }
    body.push_str(&format!(",\"seqno\":{}}}", receipt.seqno));
    Ok(([(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// A message's fields, its payload as the JSON text it was sent as.
fn message_fields(out: &mut String, message: &tidal_core::StoredMessage) {
    let quoted = |text: &str| serde_json::to_string(text).expect("a string always serializes");
    out.push_str(&format!(
        "\"topic\":{},\"inbox_seq\":{},\"message_id\":{},\"sender\":{},\"payload\":{},\"created_at_ms\":{}",
        quoted(&message.topic),
        message.inbox_seq,
        quoted(&message.message_id),
        quoted(&message.sender),
        String::from_utf8_lossy(&message.payload),
        message.created_ms,
    ));
}

fn wall_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_millis() as u64)
}

/// `POST /v1/inboxes/{owner}/ack`: consumes what a leased receive holds.
pub async fn ack(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    Path(owner): Path<String>,
    body: axum::body::Body,
) -> AppResult<Json<InboxAcked>> {
    check_owner(&principal, &owner)?;
    let InboxAck { receive_id } = json_body(&state, body).await?;
    check_id("receive_id", &receive_id)?;
    let ack = InboxConsume::Ack { owner: owner.clone(), receive_id: receive_id.clone() };
    let seqno = state.node.write(&principal, None, Records::InboxConsume(ack)).await?;
    match outcome(&state, seqno)? {
        InboxOutcome::Acked { acked: 0, lost } if lost > 0 => Err(ApiError::new(
            StatusCode::CONFLICT,
            ErrorCode::LeaseLost,
            format!("receive {receive_id:?} no longer holds its messages: its lease ran out and they went to another receive"),
        )),
        InboxOutcome::Acked { acked, .. } => Ok(Json(InboxAcked { acked, seqno })),
        InboxOutcome::UnknownReceive => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            ErrorCode::UnknownReceive,
            format!("inbox {owner:?} has no receive {receive_id:?} (never made, or older than the receipt window)"),
        )),
        InboxOutcome::Closed => Err(closed(&owner)),
        other => Err(unexpected(other)),
    }
}

/// `POST /v1/inboxes/{owner}/discard`: drops a topic's unconsumed messages through a sequence.
pub async fn discard(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    Path(owner): Path<String>,
    body: axum::body::Body,
) -> AppResult<Json<InboxDiscarded>> {
    check_owner(&principal, &owner)?;
    let InboxDiscard { topic, through } = json_body(&state, body).await?;
    check_stream_name("topic", &topic)?;
    let discard = InboxConsume::Discard { owner: owner.clone(), topic, through, expired: false };
    let seqno = state.node.write(&principal, None, Records::InboxConsume(discard)).await?;
    match outcome(&state, seqno)? {
        InboxOutcome::Discarded { count } => Ok(Json(InboxDiscarded { discarded: count, seqno })),
        InboxOutcome::Closed => Err(closed(&owner)),
        other => Err(unexpected(other)),
    }
}

/// `DELETE /v1/inboxes/{owner}`: closes the inbox; answers what was never consumed. A repeat
/// answers an empty list.
pub async fn close(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    Path(owner): Path<String>,
) -> AppResult<Json<InboxClosed>> {
    check_owner(&principal, &owner)?;
    let close = InboxConsume::Close { owner: owner.clone() };
    let seqno = state.node.write(&principal, None, Records::InboxConsume(close)).await?;
    let unconsumed = match outcome(&state, seqno)? {
        InboxOutcome::ClosedNow { unconsumed } => unconsumed,
        InboxOutcome::Closed => Vec::new(),
        other => return Err(unexpected(other)),
    };
    let unconsumed = unconsumed.into_iter().map(|(topic, count)| InboxTopicCount { topic, count }).collect();
    Ok(Json(InboxClosed { unconsumed, seqno }))
}

/// `GET /v1/inboxes/{owner}`: topics, backlogs, oldest unconsumed ages, cursors.
pub async fn show(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    Path(owner): Path<String>,
    RawQuery(query): RawQuery,
) -> AppResult<Response> {
    check_owner(&principal, &owner)?;
    let applied = read_barrier(&state, &query).await?;
    let db = state.node.db();
    let Some(meta) = db.inbox_meta(&owner)? else {
        return Err(ApiError::not_found(format!("no inbox {owner:?}")));
    };
    let now_ms = db.last_applied_time_ms();
    let topics = db
        .inbox_topics(&owner)?
        .into_iter()
        .map(|info| InboxTopicView {
            topic: info.topic,
            backlog: info.meta.backlog,
            leased: info.leased,
            bytes: info.meta.bytes,
            oldest_seq: info.oldest.map(|(seq, _)| seq),
            oldest_age_ms: info.oldest.map(|(_, created)| now_ms.saturating_sub(created)),
            cursor: info.meta.cursor,
            head: info.meta.head,
        })
        .collect();
    let view =
        InboxView { owner, closed: meta.closed, topics, consumed: meta.consumed, applied_seqno: applied };
    Ok(with_applied(applied, Json(view)))
}

/// The inbox families of `/metrics`.
pub fn render_metrics(out: &mut String, state: &AppState) {
    use crate::metrics::render_single;
    let inboxes = &state.inboxes;
    let count = |counter: &AtomicU64| counter.load(Ordering::Relaxed) as f64;
    let help = "Messages sent through this node's API (resends not counted).";
    render_single(out, "tidal_inbox_messages_sent_total", "counter", help, count(&inboxes.sent));
    let help = "Messages delivered by receives answered by this node.";
    render_single(out, "tidal_inbox_messages_received_total", "counter", help, count(&inboxes.received));
    let help = "Times a receive found nothing and waited.";
    render_single(out, "tidal_inbox_receive_parks_total", "counter", help, count(&inboxes.parks));
    let help = "Times a waiting receive was woken by an inbox change.";
    render_single(out, "tidal_inbox_receive_wakes_total", "counter", help, count(&inboxes.wakes));
    let help = "Receives written right behind a send still on its way to commit (no wait for its apply).";
    render_single(out, "tidal_inbox_receive_early_takes_total", "counter", help, count(&inboxes.early_takes));
}
