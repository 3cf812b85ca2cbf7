//! `GET /v1/link`: the write link (decisions/073). A client upgrades an authenticated HTTP/1.1
//! connection and then sends single-record writes as frames ([`tidal_types::link`]) without waiting
//! for each answer; every frame runs the same code as its HTTP route, with the principal the upgrade
//! authenticated, and its reply goes back as soon as the write commits. Replies that are ready
//! together leave in one socket write.
//!
//! Bounds: a frame is at most `body_bytes_max` plus its header; its bytes come out of the node's
//! in-flight body budget until it is answered; at most [`IN_FLIGHT_MAX`] writes per link wait at
//! once (the link stops reading beyond that, so TCP pushes back on the client); a link with
//! nothing in flight that sends nothing for the HTTP port's idle timeout is closed. A malformed
//! frame ends the link with a reply of id 0 saying why; a write's own refusal is that write's reply
//! and the link goes on.

use super::{check_idempotency_key, parse_item_id, streams, AppResult, AppState};
use crate::auth::Principal;
use crate::error::ApiError;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use std::sync::Arc;
use std::time::Instant;
use tidal_types::link::{self, LinkError, LinkOp, LinkRequest};
use tidal_types::{ErrorBody, ErrorCode, ErrorDetail};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

/// Writes one link may have waiting for their commit at once.
pub const IN_FLIGHT_MAX: usize = 1024;

/// Bytes a frame may have beyond its body: id, op, the two lengths, the longest key and argument.
const FRAME_HEADER_MAX: usize = 8 + 1 + 2 + 256 + 2 + 1024;

/// What the transport puts on an upgrade request so the link keeps its connection counted (in the
/// port's cap, and busy, never evicted as idle) for as long as it runs.
#[derive(Clone)]
pub struct ConnHold(pub Arc<dyn Send + Sync>);

/// Answers the upgrade (101) and runs the link on the upgraded connection.
pub async fn open(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    mut request: Request,
) -> AppResult<Response> {
    let asked = request.headers().get(header::UPGRADE).and_then(|value| value.to_str().ok());
    if !asked.is_some_and(|asked| asked.eq_ignore_ascii_case(link::LINK_PROTOCOL)) {
        let expected = format!("{} is opened with `Upgrade: {}`", link::LINK_PATH, link::LINK_PROTOCOL);
        return Err(ApiError::invalid(expected));
    }
    let hold = request.extensions_mut().remove::<ConnHold>();
    let upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        match upgrade.await {
            Ok(upgraded) => {
                let io = hyper_util::rt::TokioIo::new(upgraded);
                run(state, principal, io).await;
            }
            Err(error) => tracing::debug!("write link upgrade failed: {error}"),
        }
        drop(hold);
    });
    let mut response = StatusCode::SWITCHING_PROTOCOLS.into_response();
    response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    response.headers_mut().insert(header::UPGRADE, HeaderValue::from_static(link::LINK_PROTOCOL));
    Ok(response)
}

/// One reply ready to leave, with what it holds until it has.
struct Outgoing {
    id: u64,
    status: u16,
    body: Vec<u8>,
    _held: Option<(OwnedSemaphorePermit, OwnedSemaphorePermit)>,
}

/// Reads frames until the client closes, a frame is malformed, the link idles out or the node
/// stops; then waits for the writes in flight and sends their replies.
async fn run<IO>(state: Arc<AppState>, principal: Principal, io: IO)
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let (read, write) = tokio::io::split(io);
    let (replies, outgoing) = mpsc::unbounded_channel();
    let writer = tokio::spawn(write_replies(write, outgoing));
    let principal = Arc::new(principal);
    let end = read_frames(&state, &principal, read, &replies).await;
    if let Some(error) = end {
        // After a bad frame the rest of the stream cannot be framed: say why, and stop.
        let body = error_body(&ApiError::invalid(error.to_string()));
        let _ = replies.send(Outgoing { id: link::NODE_REPLY_ID, status: 400, body, _held: None });
    }
    drop(replies);
    let mut writer = writer;
    if tokio::time::timeout(DRAIN_MAX, &mut writer).await.is_err() {
        // A client that does not read its replies cannot hold the link (and the node it holds).
        writer.abort();
    }
}

/// How long a link that stopped reading may take to send the replies of its writes in flight;
/// a reply not sent by then is dropped with the connection (its write's outcome unknown to the
/// client, as after any lost connection).
const DRAIN_MAX: std::time::Duration = std::time::Duration::from_secs(10);

/// The read half's loop; `Some` for a frame that ends the link.
async fn read_frames<R: AsyncRead + Unpin>(
    state: &Arc<AppState>,
    principal: &Arc<Principal>,
    read: R,
    replies: &mpsc::UnboundedSender<Outgoing>,
) -> Option<LinkError> {
    let mut read = tokio::io::BufReader::with_capacity(64 * 1024, read);
    let in_flight = Arc::new(Semaphore::new(IN_FLIGHT_MAX));
    let frame_max = state.node.config().body_bytes_max.saturating_add(FRAME_HEADER_MAX);
    let mut closing = state.links.subscribe();
    loop {
        let slot = tokio::select! {
            slot = in_flight.clone().acquire_owned() => slot.expect("the link's semaphore is never closed"),
            _ = closing.wait_for(|closing| *closing) => return None,
        };
        let mut prefix = [0u8; link::FRAME_PREFIX_BYTES];
        let idle = state.node.config().net.idle_timeout;
        tokio::select! {
            read = read.read_exact(&mut prefix) => if read.is_err() { return None },
            _ = closing.wait_for(|closing| *closing) => return None,
            () = tokio::time::sleep(idle), if in_flight.available_permits() == IN_FLIGHT_MAX - 1 => return None,
        }
        let length = match link::frame_length(prefix, frame_max) {
            Ok(length) => length,
            Err(error) => return Some(error),
        };
        let Some(budget) = take_budget(state, length).await else {
            let refused = ApiError::unavailable(ErrorCode::Overloaded, "in-flight body budget is spent");
            let _ = replies.send(Outgoing {
                id: link::NODE_REPLY_ID,
                status: 503,
                body: error_body(&refused),
                _held: None,
            });
            return None;
        };
        let mut frame = vec![0u8; length];
        // A frame's bytes arrive within the body timeout, as an HTTP body's must.
        match tokio::time::timeout(state.net.body_timeout, read.read_exact(&mut frame)).await {
            Ok(Ok(_)) => {}
            Ok(Err(_)) | Err(_) => return None,
        }
        if let Err(error) = link::decode_request(&frame) {
            return Some(error);
        }
        let (state, principal, replies) = (state.clone(), principal.clone(), replies.clone());
        tokio::spawn(async move {
            // Decoded again here: the borrowed request cannot cross the spawn, and decoding reads
            // four fixed fields.
            let request = link::decode_request(&frame).expect("decoded above");
            let started = Instant::now();
            let (status, body) = match serve(&state, &principal, &request).await {
                Ok(body) => (200, body),
                Err(error) => (error.status.as_u16(), error_body(&error)),
            };
            let (method, route) = route_of(request.op);
            state.metrics.record(method, route, status, started.elapsed().as_secs_f64());
            let _ = replies.send(Outgoing { id: request.id, status, body, _held: Some((slot, budget)) });
        });
    }
}

/// The frame's bytes out of the node's in-flight body budget, waiting at most the body timeout.
async fn take_budget(state: &AppState, length: usize) -> Option<OwnedSemaphorePermit> {
    let bytes = u32::try_from(length.max(1)).ok()?;
    let take = state.net.body_budget.clone().acquire_many_owned(bytes);
    tokio::time::timeout(state.net.body_timeout, take).await.ok()?.ok()
}

/// One write, as its HTTP route would serve it; the JSON reply.
async fn serve(state: &AppState, principal: &Principal, request: &LinkRequest<'_>) -> AppResult<Vec<u8>> {
    let key = request.idempotency_key.map(check_idempotency_key).transpose()?;
    match request.op {
        LinkOp::PutItem => {
            let item = parse_item_id(request.argument)?;
            Ok(json(&super::write_item(state, principal, item, key, request.body).await?))
        }
        LinkOp::PostSignals => {
            if !request.argument.is_empty() {
                return Err(ApiError::invalid("a signals write takes no argument"));
            }
            Ok(json(&super::write_signals(state, principal, key, request.body).await?))
        }
        LinkOp::Publish => {
            streams::check_stream_name("stream", request.argument)?;
            let stream = request.argument.to_string();
            Ok(json(&streams::write_publish(state, principal, stream, key, request.body).await?))
        }
    }
}

fn json<T: serde::Serialize>(reply: &T) -> Vec<u8> {
    serde_json::to_vec(reply).expect("a reply always serializes")
}

/// The HTTP route an op stands for, as its metrics label it.
fn route_of(op: LinkOp) -> (&'static str, &'static str) {
    match op {
        LinkOp::PutItem => ("PUT", "/v1/items/{id}"),
        LinkOp::PostSignals => ("POST", "/v1/signals"),
        LinkOp::Publish => ("POST", "/v1/streams/{stream}/events"),
    }
}

fn error_body(error: &ApiError) -> Vec<u8> {
    let detail = ErrorDetail { code: error.code.as_str().to_string(), message: error.message.clone() };
    serde_json::to_vec(&ErrorBody { error: detail }).expect("an error body always serializes")
}

/// Sends replies as they come; those ready together leave in one write.
async fn write_replies<W: AsyncWrite>(write: W, mut outgoing: mpsc::UnboundedReceiver<Outgoing>) {
    tokio::pin!(write);
    let mut buffer = Vec::with_capacity(16 * 1024);
    while let Some(first) = outgoing.recv().await {
        buffer.clear();
        let mut sent = Vec::new();
        let mut next = Some(first);
        while let Some(reply) = next {
            link::encode_reply(reply.id, reply.status, &reply.body, &mut buffer);
            sent.push(reply);
            next = outgoing.try_recv().ok();
        }
        if write.write_all(&buffer).await.is_err() {
            return;
        }
        // What the replies held (in-flight slots, body budget) is released once they are written.
        drop(sent);
    }
    let _ = write.shutdown().await;
}

/// The links' stop signal: every link stops reading when the node stops, and answers what it
/// has in flight.
pub struct Links {
    closing: tokio::sync::watch::Sender<bool>,
}

impl Default for Links {
    fn default() -> Links {
        Links { closing: tokio::sync::watch::channel(false).0 }
    }
}

impl Links {
    /// Stops every link's reading (the node is stopping).
    pub fn close(&self) {
        self.closing.send_replace(true);
    }

    fn subscribe(&self) -> tokio::sync::watch::Receiver<bool> {
        self.closing.subscribe()
    }
}
