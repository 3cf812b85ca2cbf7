//! The streams routes: publish, read, consumer offsets, trim, the list, and live subscribe (SSE).
//!
//! An event's offset is its seqno. A publish is one batch (all its events or none); a consumer
//! offset and a trim are one record each, decided in apply (monotone, clamped) so every node agrees.
//! Reads and subscribers read the engine, never the WAL.
//!
//! Delicate:
//! - A subscriber marks the applied frontier seen BEFORE it reads, then waits for it to change: an
//!   apply that lands between the read and the wait still wakes it (no lost wakeup); a wake with
//!   nothing new reads an empty page and waits again (spurious wakes are harmless).
//! - A subscriber reads at its own pace into a bounded channel; the applier never waits for it. One
//!   whose client stops reading is ended, and told so after its buffered events (`event: lagging`,
//!   with its last offset); it resumes with `Last-Event-ID`. A node that stops ends every
//!   subscription the same way (`event: closing`).
//! - Payloads are stored as the client's JSON with the whitespace outside strings removed, byte for
//!   byte otherwise (numbers keep their digits), and written back into replies as they are.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use tidal_core::{Records, StoredEvent, StreamControl, STREAM_NAME_BYTES_MAX};
use tidal_types::{
    ConsumerOffset, ConsumerView, ErrorCode, Published, StreamList, StreamView, Trimmed, RESERVED_PREFIX,
};

use super::decode::Limits;
use super::{
    idempotency_key, json_body, query_param, query_u64, read_barrier, read_body, with_applied, AppResult,
    AppState,
};
use crate::auth::Principal;
use crate::error::ApiError;

/// Longest event key, in bytes.
pub const STREAM_KEY_BYTES_MAX: usize = 1024;
/// Largest `limit` of a stream read.
const READ_LIMIT_MAX: usize = 10_000;
/// Events a subscriber reads from the engine at a time.
const SUBSCRIBE_PAGE: usize = 256;
/// Events a subscriber holds for its client beyond what the socket takes.
const SUBSCRIBE_BUFFER: usize = 512;
/// How long a subscriber waits for its client to take an event before it is told it lags.
const SUBSCRIBER_STALL: Duration = Duration::from_secs(30);
/// Comment lines on an idle subscription, so proxies and clients know it is alive.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Live subscriptions: how many, and the signal that ends them all when the node stops.
pub struct Subscriptions {
    active: AtomicUsize,
    closing: tokio::sync::watch::Sender<bool>,
    pub(super) published: std::sync::atomic::AtomicU64,
    trims: std::sync::atomic::AtomicU64,
}

impl Default for Subscriptions {
    fn default() -> Subscriptions {
        Subscriptions {
            active: AtomicUsize::new(0),
            closing: tokio::sync::watch::channel(false).0,
            published: Default::default(),
            trims: Default::default(),
        }
    }
}

impl Subscriptions {
    /// Ends every subscription (the node is stopping): each stream ends cleanly.
    pub fn close(&self) {
        self.closing.send_replace(true);
    }

    /// Live subscriptions now.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// Events published through this node's API (leader side), and trims.
    pub fn counts(&self) -> (u64, u64) {
        (self.published.load(Ordering::Relaxed), self.trims.load(Ordering::Relaxed))
    }
}

/// Holds one subscription's place in [`Subscriptions::active`].
struct Admitted(Arc<AppState>);

impl Drop for Admitted {
    fn drop(&mut self) {
        self.0.streams.active.fetch_sub(1, Ordering::Relaxed);
    }
}

fn invalid_name(message: String) -> ApiError {
    ApiError::bad_request(ErrorCode::InvalidName, message)
}

/// A stream or consumer name: non-empty, at most [`STREAM_NAME_BYTES_MAX`] bytes, not reserved, no
/// control characters.
pub fn check_stream_name(what: &str, name: &str) -> AppResult<()> {
    if name.is_empty() {
        return Err(invalid_name(format!("{what} name must not be empty")));
    }
    if name.len() > STREAM_NAME_BYTES_MAX {
        return Err(invalid_name(format!("{what} name is longer than {STREAM_NAME_BYTES_MAX} bytes")));
    }
    if name.starts_with(RESERVED_PREFIX) {
        return Err(invalid_name(format!("{what} name {name:?} uses the reserved prefix {RESERVED_PREFIX}")));
    }
    if name.chars().any(char::is_control) {
        return Err(invalid_name(format!("{what} name contains control characters")));
    }
    Ok(())
}

pub(super) fn check_key(key: &Option<String>) -> AppResult<()> {
    match key {
        None => Ok(()),
        Some(key) if key.is_empty() => Err(invalid_name("key must be null or a non-empty string".into())),
        Some(key) if key.len() > STREAM_KEY_BYTES_MAX => {
            Err(invalid_name(format!("key is longer than {STREAM_KEY_BYTES_MAX} bytes")))
        }
        Some(_) => Ok(()),
    }
}

/// The JSON text `raw` without the whitespace between tokens; strings are kept byte for byte.
pub fn compact_json(raw: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len());
    let (mut in_string, mut escaped) = (false, false);
    for &byte in raw.as_bytes() {
        if in_string {
            out.push(byte);
            match (escaped, byte) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
        } else if !matches!(byte, b' ' | b'\t' | b'\n' | b'\r') {
            in_string = byte == b'"';
            out.push(byte);
        }
    }
    out
}

/// Refuses a consumer offset past the stream's last offset. Every offset a client was answered is
/// applied on the leader, which applies before it answers.
pub(super) fn check_consumer_offset(state: &AppState, stream: &str, offset: u64) -> AppResult<()> {
    let last = state.node.db().stream_meta(stream)?.map_or(0, |meta| meta.last_offset);
    if offset > last {
        let message = format!("offset {offset} is past stream {stream:?}'s last offset {last}");
        return Err(ApiError::bad_request(ErrorCode::InvalidOffset, message));
    }
    Ok(())
}

/// `POST /v1/streams/{stream}/events`.
pub async fn publish(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    Path(stream): Path<String>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> AppResult<Json<Published>> {
    check_stream_name("stream", &stream)?;
    let key = idempotency_key(&headers)?;
    let body = read_body(&state, body).await?;
    Ok(Json(write_publish(&state, &principal, stream, key, &body).await?))
}

/// A publish once its stream name is checked and its body read (for HTTP and for the write link).
pub(crate) async fn write_publish(
    state: &AppState,
    principal: &Principal,
    stream: String,
    key: Option<String>,
    body: &[u8],
) -> AppResult<Published> {
    let events = super::decode::publish(body, &Limits::of(state.node.config()))?;
    let count = events.len() as u64;
    let seqno = state.node.write(principal, key, Records::StreamEvents { stream, events }).await?;
    state.streams.published.fetch_add(count, Ordering::Relaxed);
    // One batch: its events hold consecutive seqnos ending at the write's last.
    Ok(Published { offsets: (seqno + 1 - count..=seqno).collect(), seqno })
}

/// One event as JSON text: `{"offset","stream","key","payload","created_at"}`.
fn event_json(stream: &str, event: &StoredEvent) -> String {
    let quoted = |text: &str| serde_json::to_string(text).expect("a string always serializes");
    let key = event.key.as_deref().map_or_else(|| "null".to_string(), quoted);
    // The payload was stored as checked JSON text.
    let payload = String::from_utf8_lossy(&event.payload);
    format!(
        "{{\"offset\":{},\"stream\":{},\"key\":{key},\"payload\":{payload},\"created_at\":{}}}",
        event.offset,
        quoted(stream),
        event.created_at
    )
}

/// Where a read or subscription starts. `Last-Event-ID` (a reconnecting subscriber's) wins;
/// otherwise `after` or a consumer's saved offset (not both), else the beginning.
fn start_after(
    state: &AppState,
    stream: &str,
    query: &Option<String>,
    headers: &HeaderMap,
) -> AppResult<u64> {
    if let Some(value) = headers.get("last-event-id") {
        // Whitespace around a header value is not part of it (RFC 9110, 5.5); the offset itself is
        // canonical decimal, as ids in paths are.
        let id = value.to_str().ok().and_then(|id| tidal_types::parse_canonical_u64(id.trim()));
        return id.ok_or_else(|| ApiError::invalid("Last-Event-ID must be an offset in canonical decimal"));
    }
    let after = query_u64(query, "after")?;
    let consumer = query_name(query, "consumer")?;
    match (after, consumer) {
        (Some(_), Some(_)) => Err(ApiError::invalid("give after or consumer, not both")),
        (Some(after), None) => Ok(after),
        (None, Some(consumer)) => {
            check_stream_name("consumer", &consumer)?;
            Ok(state.node.db().consumer_offset(stream, &consumer)?.unwrap_or(0))
        }
        (None, None) => Ok(0),
    }
}

/// A name in the query string, percent-decoded as names in paths are.
fn query_name(query: &Option<String>, name: &str) -> AppResult<Option<String>> {
    query_param(query, name)
        .map(|raw| {
            percent_decode(raw)
                .ok_or_else(|| invalid_name(format!("{name} is not valid percent-encoded UTF-8")))
        })
        .transpose()
}

/// `%XX` escapes (and `+` as a space, as forms send it) decoded; `None` if the result is not UTF-8
/// or an escape is malformed.
pub fn percent_decode(raw: &str) -> Option<String> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(at + 1..at + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                at += 3;
            }
            b'+' => {
                out.push(b' ');
                at += 1;
            }
            byte => {
                out.push(byte);
                at += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// `GET /v1/streams/{stream}/events?after=N&limit=L` (or `?consumer=name`).
pub async fn read(
    State(state): State<Arc<AppState>>,
    Path(stream): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> AppResult<Response> {
    check_stream_name("stream", &stream)?;
    let limit = query_u64(&query, "limit")?.unwrap_or(100);
    if !(1..=READ_LIMIT_MAX as u64).contains(&limit) {
        return Err(ApiError::invalid(format!("limit must be 1..={READ_LIMIT_MAX}")));
    }
    let applied = read_barrier(&state, &query).await?;
    let after = start_after(&state, &stream, &query, &headers)?;
    let events = state.node.db().stream_events(&stream, after, limit as usize)?;
    let mut body = String::with_capacity(64 + events.iter().map(|e| 96 + e.payload.len()).sum::<usize>());
    body.push_str("{\"events\":[");
    for (i, event) in events.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        body.push_str(&event_json(&stream, event));
    }
    body.push_str(&format!("],\"applied_seqno\":{applied}}}"));
    let response = ([(axum::http::header::CONTENT_TYPE, "application/json")], body);
    Ok(with_applied(applied, response))
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct OffsetBody {
    /// The offset consumed through.
    offset: u64,
}

/// `PUT /v1/streams/{stream}/consumers/{name}`: saves monotonically, answers the current offset.
pub async fn put_consumer(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    Path((stream, consumer)): Path<(String, String)>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> AppResult<Json<ConsumerOffset>> {
    check_stream_name("stream", &stream)?;
    check_stream_name("consumer", &consumer)?;
    let key = idempotency_key(&headers)?;
    let OffsetBody { offset } = json_body(&state, body).await?;
    check_consumer_offset(&state, &stream, offset)?;
    let control = StreamControl::SaveOffset { stream: stream.clone(), consumer: consumer.clone(), offset };
    let seqno = state.node.write(&principal, key, Records::StreamControl(control)).await?;
    let offset = state.node.db().consumer_offset(&stream, &consumer)?.unwrap_or(0);
    Ok(Json(ConsumerOffset { offset, seqno: Some(seqno) }))
}

/// `GET /v1/streams/{stream}/consumers/{name}`.
pub async fn get_consumer(
    State(state): State<Arc<AppState>>,
    Path((stream, consumer)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> AppResult<Response> {
    check_stream_name("stream", &stream)?;
    check_stream_name("consumer", &consumer)?;
    let applied = read_barrier(&state, &query).await?;
    let Some(offset) = state.node.db().consumer_offset(&stream, &consumer)? else {
        return Err(ApiError::not_found(format!("stream {stream:?} has no consumer {consumer:?}")));
    };
    Ok(with_applied(applied, Json(ConsumerOffset { offset, seqno: None })))
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct TrimBody {
    /// Delete every event at or below this offset (clamped to the last).
    through: u64,
}

/// `POST /v1/streams/{stream}/trim`: deletes offsets at or below `through` (at most the last).
pub async fn trim(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    Path(stream): Path<String>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> AppResult<Json<Trimmed>> {
    check_stream_name("stream", &stream)?;
    let key = idempotency_key(&headers)?;
    let TrimBody { through } = json_body(&state, body).await?;
    if state.node.db().stream_meta(&stream)?.is_none() {
        return Err(ApiError::not_found(format!("no stream {stream:?}")));
    }
    let control = StreamControl::Trim { stream: stream.clone(), through };
    let seqno = state.node.write(&principal, key, Records::StreamControl(control)).await?;
    state.streams.trims.fetch_add(1, Ordering::Relaxed);
    let horizon = state.node.db().stream_meta(&stream)?.map_or(0, |meta| meta.horizon);
    Ok(Json(Trimmed { seqno, horizon }))
}

/// `GET /v1/streams?after=name&limit=L`: streams by name.
pub async fn list(State(state): State<Arc<AppState>>, RawQuery(query): RawQuery) -> AppResult<Response> {
    let limit = super::query_limit(&query, 100)?;
    let after = query_name(&query, "after")?.unwrap_or_default();
    let applied = read_barrier(&state, &query).await?;
    let db = state.node.db();
    let mut streams = Vec::new();
    for info in db.streams(&after, limit)? {
        let consumers = db.consumers(&info.name)?;
        streams.push(StreamView {
            first_offset: info.first_offset,
            last_offset: info.meta.last_offset,
            trimmed_through: info.meta.horizon,
            events: info.meta.events,
            bytes: info.meta.bytes,
            consumers: consumers.into_iter().map(|(name, offset)| ConsumerView { name, offset }).collect(),
            stream: info.name,
        });
    }
    Ok(with_applied(applied, Json(StreamList { streams, applied_seqno: applied })))
}

/// Streams with their own metric series: the first ones by name (a bound on label values).
const METRIC_STREAMS_MAX: usize = 64;

/// The streams metrics: subscriptions, events published and trims through this node, and per
/// stream (the first [`METRIC_STREAMS_MAX`] by name) its stored events and bytes.
pub fn render_metrics(out: &mut String, state: &AppState) {
    use crate::metrics::render_single;
    let (published, trims) = state.streams.counts();
    let subscribers = state.streams.active() as f64;
    render_single(
        out,
        "tidal_stream_subscribers",
        "gauge",
        "Live stream subscriptions (SSE) on this node.",
        subscribers,
    );
    let help = "Stream events published through this node's API.";
    render_single(out, "tidal_stream_events_published_total", "counter", help, published as f64);
    render_single(
        out,
        "tidal_stream_trims_total",
        "counter",
        "Stream trims through this node's API.",
        trims as f64,
    );
    let Ok(streams) = state.node.db().streams("", METRIC_STREAMS_MAX) else { return };
    out.push_str(
        "# HELP tidal_stream_events Events stored per stream (the first streams by name).
",
    );
    out.push_str(
        "# TYPE tidal_stream_events gauge
",
    );
    for info in &streams {
        let name = serde_json::to_string(&info.name).unwrap_or_default();
        out.push_str(&format!("tidal_stream_events{{stream={name}}} {}\n", info.meta.events));
    }
    out.push_str(
        "# HELP tidal_stream_bytes Payload bytes stored per stream (the first streams by name).
",
    );
    out.push_str(
        "# TYPE tidal_stream_bytes gauge
",
    );
    for info in &streams {
        let name = serde_json::to_string(&info.name).unwrap_or_default();
        out.push_str(&format!("tidal_stream_bytes{{stream={name}}} {}\n", info.meta.bytes));
    }
}

/// `GET /v1/streams/{stream}/subscribe?after=N`: Server-Sent Events as this node applies.
pub async fn subscribe(
    State(state): State<Arc<AppState>>,
    Path(stream): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> AppResult<Response> {
    check_stream_name("stream", &stream)?;
    if query_param(&query, "consistency").is_some_and(|c| c != "applied") {
        return Err(ApiError::invalid("a subscription follows this node's applied state"));
    }
    read_barrier(&state, &query).await?;
    let after = start_after(&state, &stream, &query, &headers)?;
    let max = state.node.config().stream_subscribers_max;
    if state.streams.active.fetch_add(1, Ordering::Relaxed) >= max {
        state.streams.active.fetch_sub(1, Ordering::Relaxed);
        let message = format!("this node serves at most {max} subscriptions");
        return Err(ApiError::unavailable(ErrorCode::Overloaded, message));
    }
    let admitted = Admitted(state.clone());
    let (sender, receiver) = tokio::sync::mpsc::channel(SUBSCRIBE_BUFFER);
    // The last word (why the subscription ended) comes after every buffered event.
    let (notice, last_word) = tokio::sync::mpsc::channel(1);
    tokio::spawn(follow(admitted, stream, after, Outlet { sender, notice }));
    let events = tokio_stream::StreamExt::chain(
        tokio_stream::wrappers::ReceiverStream::new(receiver),
        tokio_stream::wrappers::ReceiverStream::new(last_word),
    );
    let sse = Sse::new(events).keep_alive(KeepAlive::new().interval(KEEP_ALIVE));
    Ok((StatusCode::OK, sse).into_response())
}

type SseSender = tokio::sync::mpsc::Sender<Result<Event, Infallible>>;

/// Where a subscription's events go, and its last word.
struct Outlet {
    sender: SseSender,
    notice: SseSender,
}

/// Why [`follow`] ended.
enum End {
    /// The client went away.
    Gone,
    /// The client stopped taking events.
    Lagging,
    /// The node is stopping, or its applier stopped.
    Closing,
}

/// Feeds one subscription until its client leaves, lags, or the node stops.
async fn follow(admitted: Admitted, stream: String, mut cursor: u64, outlet: Outlet) {
    let Outlet { sender, notice } = outlet;
    let state = admitted.0.clone();
    let mut applied = state.node.applied_watch();
    let mut closing = state.streams.closing.subscribe();
    let end = loop {
        // Seen before the read: an apply from here on wakes the wait below.
        applied.borrow_and_update();
        if *closing.borrow() {
            break End::Closing;
        }
        let page = match state.node.db().stream_events(&stream, cursor, SUBSCRIBE_PAGE) {
            Ok(page) => page,
            Err(error) => {
                tracing::error!("subscription to {stream:?} ends: {error:#}");
                break End::Closing;
            }
        };
        if let Err(end) = send_page(&sender, &stream, &page, &mut cursor).await {
            break end;
        }
        if page.len() == SUBSCRIBE_PAGE {
            continue;
        }
        tokio::select! {
            changed = applied.changed() => if changed.is_err() { break End::Closing },
            _ = closing.changed() => break End::Closing,
            () = sender.closed() => break End::Gone,
        }
    };
    let (event, reason) = match end {
        End::Gone => return,
        End::Lagging => ("lagging", format!("the client took no event for {}s", SUBSCRIBER_STALL.as_secs())),
        End::Closing => ("closing", "the node is stopping".to_string()),
    };
    let data = serde_json::json!({ "last_offset": cursor, "reason": reason, "resume": "Last-Event-ID" });
    drop(sender);
    let _ = notice.try_send(Ok(Event::default().event(event).data(data.to_string())));
    drop(admitted);
}

/// Sends a page's events, moving `cursor` to each one handed over; a client that takes none for
/// [`SUBSCRIBER_STALL`] lags.
async fn send_page(
    sender: &SseSender,
    stream: &str,
    page: &[StoredEvent],
    cursor: &mut u64,
) -> Result<(), End> {
    for event in page {
        let message = Event::default().id(event.offset.to_string()).data(event_json(stream, event));
        match tokio::time::timeout(SUBSCRIBER_STALL, sender.send(Ok(message))).await {
            Ok(Ok(())) => *cursor = event.offset,
            Ok(Err(_)) => return Err(End::Gone),
            Err(_) => return Err(End::Lagging),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_json_removes_whitespace_between_tokens_only() {
        let raw =
            "{ \"a b\" : [ 1 ,\n 2.50 ], \"s\": \"x \\\" y\\\\\" , \"n\" : 123456789012345678901234567890 }";
        let compact = compact_json(raw);
        assert_eq!(
            String::from_utf8(compact.clone()).unwrap(),
            "{\"a b\":[1,2.50],\"s\":\"x \\\" y\\\\\",\"n\":123456789012345678901234567890}"
        );
        let back: serde_json::Value = serde_json::from_slice(&compact).unwrap();
        assert_eq!(back, serde_json::from_str::<serde_json::Value>(raw).unwrap());
    }

    #[test]
    fn names_are_checked() {
        assert!(check_stream_name("stream", "orders.eu-1").is_ok());
        for bad in ["", "__tidal.x", "a\nb", &"x".repeat(STREAM_NAME_BYTES_MAX + 1)] {
            let error = check_stream_name("stream", bad).unwrap_err();
            assert_eq!(error.code, ErrorCode::InvalidName, "{bad:?}");
        }
        assert_eq!(check_key(&Some(String::new())).unwrap_err().code, ErrorCode::InvalidName);
        assert!(check_key(&None).is_ok());
    }

    #[test]
    fn query_names_are_percent_decoded() {
        assert_eq!(percent_decode("a%20b+c%C3%BC").as_deref(), Some("a b cü"));
        assert_eq!(percent_decode("plain").as_deref(), Some("plain"));
        for bad in ["%", "%4", "%zz", "%FF"] {
            assert_eq!(percent_decode(bad), None, "{bad}");
        }
    }
}
