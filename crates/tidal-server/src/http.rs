//! The HTTP API, served by axum. [`ROUTES`] lists every route with who may call it and where it
//! is served; the request and reply bodies are tidal-types' API models.
//!
//! Every handler validates its whole input before anything is submitted, so a 4xx means nothing was
//! or will be written. Bodies are read with an explicit size limit and parsed by hand (not axum's
//! `Json` extractor) so every failure maps to a contract error code. Reads report the applied frontier
//! in `Tidal-Applied-Seqno` and honour `min_seqno` (read-your-writes).

use crate::auth::{AuthError, Principal, Scope, Tokens};
use crate::error::ApiError;
use crate::metrics::{render_histogram, render_single};
use crate::node::Node;
use axum::extract::{MatchedPath, Path, RawQuery, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, MethodRouter};
use axum::{Extension, Json, Router};
use serde::de::DeserializeOwned;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tidal_core::Records;
use tidal_types::{
    parse_canonical_u64, Accepted, CatchupView, ClusterStatus, DigestView, EmbeddingView, ErrorCode,
    HealView, ItemView, MembersView, NegativeAdd, NegativesView, NodeStatus, PositionView, PromoteView,
    RankedItem, RankedList, ReconcilePeerView, ReconcileView, WriteReply, RESERVED_PREFIX,
    SIGNAL_TS_AHEAD_MAX_MS, SIGNAL_WEIGHT_MAX, USER_BYTES_MAX,
};

mod backup;
pub mod decode;
mod forward;
mod guard;
pub mod history;
pub mod inboxes;
pub mod link;
pub mod openapi;
mod rejections;
mod streams;
mod tx;
mod ui;

/// Largest metadata document, in bytes: metadata is a catalogue entry, not a blob store.
const METADATA_BYTES_MAX: usize = 1024 * 1024;
/// Largest `limit` on ranked reads.
const LIMIT_MAX: usize = 1000;
/// Most ids in a feed's `exclude` list.
const EXCLUDE_MAX: usize = 10_000;
/// Longest Idempotency-Key.
const IDEMPOTENCY_KEY_BYTES_MAX: usize = 256;
/// Accepted signal time range: 1970 .. year 2200 in unix ms; anything else is a unit mistake.
const SIGNAL_TS_MAX_MS: i64 = 7_258_118_400_000;

/// Shared state of the HTTP layer.
pub struct AppState {
    /// The node.
    pub node: Arc<Node>,
    /// Accepted tokens; `None` means an open node.
    pub tokens: Option<Tokens>,
    /// HTTP metrics.
    pub metrics: crate::metrics::HttpMetrics,
    /// Where a follower forwards writes.
    pub forward: Forwarder,
    /// Live stream subscriptions.
    pub streams: streams::Subscriptions,
    /// Receivers waiting on inboxes, and the inbox counters.
    pub inboxes: Arc<inboxes::Inboxes>,
    /// The ports' connection tables and the in-flight body budget.
    pub net: Arc<crate::transport::NetState>,
    /// Recent status samples and events (`GET /cluster/history`, the `/ui` page).
    pub history: Arc<history::History>,
    /// Open write links (`GET /v1/link`).
    pub links: Arc<link::Links>,
}

/// Forwards writes from a follower to the leader, carrying the caller's own credential (there are
/// no unauthenticated inter-node writes).
pub struct Forwarder {
    replica: Option<Arc<tidal_cluster::Replica>>,
    conns: forward::LeaderConns,
}

impl Forwarder {
    /// A forwarder for `node`: forwards only while the node is a follower that knows its leader;
    /// over HTTPS verified by `tls` (the cluster CA) when the nodes serve TLS.
    pub fn new(node: &Node, tls: Option<rustls::ClientConfig>) -> Forwarder {
        let replica = node.replica().filter(|_| node.config().io.forward_writes).cloned();
        Forwarder { replica, conns: forward::LeaderConns::new(tls) }
    }

    /// Where writes go now: the leader's HTTP address (`host:port`), or None to handle them here
    /// (this node leads, takes office, or knows no leader: the write path answers 503 `not_ready`
    /// then).
    fn leader(&self) -> Option<String> {
        let replica = self.replica.as_ref()?;
        if replica.is_leader() {
            return None;
        }
        let leader = replica.leader().filter(|leader| *leader != replica.me())?;
        replica.members().nodes.get(&leader).map(|node| node.http.clone())
    }
}

/// Who may call a route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Anyone, token or not: the probes a supervisor or load balancer polls.
    Open,
    /// A token with this scope (when the node has a token file; an open node lets everyone in).
    Needs(Scope),
}

/// Where a route is served when the request reaches a follower.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Serve {
    /// On the node it reaches: local reads, status, hard negatives (a CRDT outside the log).
    Anywhere,
    /// On the leader, a follower forwards it: log writes and the verbs only a leader performs.
    Leader,
    /// On the leader when asked with `consistency=linearizable` (ReadIndex), else anywhere.
    LeaderIfLinearizable,
    /// On the leader, which may take up to `catch_up_s` to answer (a learner catching up).
    LeaderMemberChange,
    /// On the leader, which may wait up to a minute for something to answer (an inbox receive).
    LeaderLongPoll,
}

impl Serve {
    /// Whether a follower forwards a request with this query to the leader.
    fn on_leader(self, query: Option<&str>) -> bool {
        match self {
            Serve::Anywhere => false,
            Serve::Leader | Serve::LeaderMemberChange | Serve::LeaderLongPoll => true,
            Serve::LeaderIfLinearizable => {
                query.is_some_and(|q| q.split('&').any(|pair| pair == "consistency=linearizable"))
            }
        }
    }
}

/// The handler of a route, for the methods given (axum's `on`).
type Handler = fn(MethodFilter) -> MethodRouter<Arc<AppState>>;

/// One route of the API: its methods, path, handler, who may call it and where it is served.
pub struct Route {
    /// The methods it answers (a `GET` route answers `HEAD` too).
    pub methods: MethodFilter,
    /// The axum path pattern.
    pub path: &'static str,
    handler: Handler,
    /// Who may call it.
    pub access: Access,
    /// Where it is served.
    pub serve: Serve,
}

/// A route-table entry; `handler` is a handler function of this module.
macro_rules! route {
    ($methods:expr, $path:literal, $handler:path, $access:expr, $serve:expr) => {
        Route {
            methods: $methods,
            path: $path,
            handler: |methods| axum::routing::on(methods, $handler),
            access: $access,
            serve: $serve,
        }
    };
}

/// Every route of the API: the router and the authentication and forwarding middleware are all
/// built from this table, so a route's policy is declared once, beside its handler.
pub static ROUTES: &[Route] = {
    use Serve::{
        Anywhere, Leader, LeaderIfLinearizable as LeaderIfAsked, LeaderLongPoll, LeaderMemberChange,
    };
    const READ: Access = Access::Needs(Scope::Read);
    const WRITE: Access = Access::Needs(Scope::Write);
    const ADMIN: Access = Access::Needs(Scope::Admin);
    const RECEIVE: Access = Access::Needs(Scope::Receive);
    const INBOX_ADMIN: Access = Access::Needs(Scope::InboxAdmin);
    const GET: MethodFilter = MethodFilter::GET;
    const PUT: MethodFilter = MethodFilter::PUT;
    const POST: MethodFilter = MethodFilter::POST;
    const DELETE: MethodFilter = MethodFilter::DELETE;
    &[
        route!(POST, "/v1/signals", post_signals, WRITE, Leader),
        route!(PUT, "/v1/items/{id}", put_item, WRITE, Leader),
        route!(GET, "/v1/items/{id}", get_item, READ, LeaderIfAsked),
        route!(DELETE, "/v1/items/{id}", delete_item, WRITE, Leader),
        route!(PUT, "/v1/items/{id}/embedding", put_embedding, WRITE, Leader),
        route!(GET, "/v1/items/{id}/embedding", get_embedding, READ, LeaderIfAsked),
        route!(GET, "/v1/items/{id}/similar", get_similar, READ, LeaderIfAsked),
        route!(GET, "/v1/users/{user}/feed", get_feed, READ, LeaderIfAsked),
        route!(GET, "/v1/trending", get_trending, READ, LeaderIfAsked),
        route!(POST, "/v1/users/{user}/negatives", post_negative, WRITE, Anywhere),
        route!(GET, "/v1/users/{user}/negatives", get_negatives, READ, Anywhere),
        route!(DELETE, "/v1/users/{user}/negatives/{item}", delete_negative, WRITE, Anywhere),
        route!(GET, "/v1/streams", streams::list, READ, LeaderIfAsked),
        route!(POST, "/v1/streams/{stream}/events", streams::publish, WRITE, Leader),
        route!(GET, "/v1/streams/{stream}/events", streams::read, READ, LeaderIfAsked),
        route!(GET, "/v1/streams/{stream}/subscribe", streams::subscribe, READ, Anywhere),
        route!(PUT, "/v1/streams/{stream}/consumers/{name}", streams::put_consumer, WRITE, Leader),
        route!(GET, "/v1/streams/{stream}/consumers/{name}", streams::get_consumer, READ, LeaderIfAsked),
        route!(POST, "/v1/streams/{stream}/trim", streams::trim, WRITE, Leader),
        route!(POST, "/v1/tx", tx::post_tx, WRITE, Leader),
        // Not forwarded (an upgraded connection cannot be): on a follower each write is refused
        // with not_leader, as a client should connect to the leader.
        route!(GET, "/v1/link", link::open, WRITE, Anywhere),
        route!(POST, "/v1/inboxes/{owner}/messages", inboxes::send, WRITE, Leader),
        route!(POST, "/v1/inboxes/{owner}/receive", inboxes::receive, RECEIVE, LeaderLongPoll),
        route!(POST, "/v1/inboxes/{owner}/ack", inboxes::ack, RECEIVE, Leader),
        route!(POST, "/v1/inboxes/{owner}/discard", inboxes::discard, INBOX_ADMIN, Leader),
        route!(DELETE, "/v1/inboxes/{owner}", inboxes::close, INBOX_ADMIN, Leader),
        route!(GET, "/v1/inboxes/{owner}", inboxes::show, READ, LeaderIfAsked),
        route!(GET, "/cluster/status", get_status, ADMIN, Anywhere),
        route!(GET, "/cluster/digest", get_digest, ADMIN, Anywhere),
        route!(POST, "/cluster/heal", post_heal, ADMIN, Leader),
        route!(POST, "/cluster/catchup", post_catchup, ADMIN, Anywhere),
        route!(POST, "/cluster/promote", post_promote, ADMIN, Leader),
        route!(POST, "/cluster/reconcile", post_reconcile, ADMIN, Anywhere),
        route!(GET, "/cluster/backup", backup::get_backup, ADMIN, Anywhere),
        route!(POST, "/cluster/members/{id}", post_member, ADMIN, LeaderMemberChange),
        route!(DELETE, "/cluster/members/{id}", delete_member, ADMIN, LeaderMemberChange),
        route!(GET, "/healthz", healthz, Access::Open, Anywhere),
        route!(GET, "/readyz", readyz, Access::Open, Anywhere),
        route!(GET, "/metrics", metrics, READ, Anywhere),
        route!(GET, "/openapi.json", openapi::get, Access::Open, Anywhere),
        // The live page holds no data: it reads the admin routes with the token typed into it.
        route!(GET, "/ui", ui::page, Access::Open, Anywhere),
        // The leader's view (a follower forwards it): the page's member table and lag chart.
        route!(GET, "/cluster/history", history::get, ADMIN, Leader),
    ]
};

impl Route {
    /// Whether this route answers `method` (`HEAD` is answered by the `GET` handler).
    fn answers(&self, method: &Method) -> bool {
        let method = if method == Method::HEAD { Method::GET } else { method.clone() };
        MethodFilter::try_from(method).is_ok_and(|filter| self.methods.or(filter) == self.methods)
    }

    /// The table's own `&'static` path for a matched `path` (None: no route has it).
    fn template(path: &str) -> Option<&'static str> {
        ROUTES.iter().find(|route| route.path == path).map(|route| route.path)
    }

    /// The table's route for a request that axum matched to `path` (None: no route takes it).
    fn find(method: &Method, path: Option<&str>) -> Option<&'static Route> {
        let path = path?;
        ROUTES.iter().find(|route| route.path == path && route.answers(method))
    }
}

/// What [`admit`] applies to one request: its route's, or for a request no route takes (a
/// 404 or 405 to come) a token with the scope its method implies, so a caller without one learns
/// nothing of which routes exist; such a request is answered where it arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Policy {
    access: Access,
    serve: Serve,
}

impl Policy {
    fn of(method: &Method, matched: Option<&str>) -> Policy {
        match Route::find(method, matched) {
            Some(route) => Policy { access: route.access, serve: route.serve },
            None if method == Method::GET || method == Method::HEAD => {
                Policy { access: Access::Needs(Scope::Read), serve: Serve::Anywhere }
            }
            None => Policy { access: Access::Needs(Scope::Write), serve: Serve::Anywhere },
        }
    }
}

/// A router serving `ROUTES`, each with the handler `handler` gives it.
fn table_router<S: Clone + Send + Sync + 'static>(
    handler: impl Fn(&'static Route) -> MethodRouter<S>,
) -> Router<S> {
    ROUTES.iter().fold(Router::new(), |router, route| router.route(route.path, handler(route)))
}

/// Builds the router: every route, and the one layer every request passes ([`admit`]).
pub fn router(state: Arc<AppState>) -> Router {
    table_router(|route| (route.handler)(route.methods))
        .fallback(fallback)
        .layer(axum::middleware::from_fn_with_state(state.clone(), admit))
        .with_state(state)
}

/// Every request's way to its route, in one layer: [`authenticate`], [`body_first`],
/// [`refuse_browsers`], then [`forward_to_leader`] or the route; its metrics; and last, every 4xx
/// given the JSON error body, including the ones axum makes before a handler runs (405, a path that
/// is not UTF-8). One layer rather than one per step: each layer cost every request a clone of the
/// route's service, a boxed future and their drops (docs/measurements.md, 2026-12-06 18:34–).
async fn admit(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let seen = Seen::of(&request);
    let response = match authenticate(&state, request, &seen) {
        Err(refused) => refused.into_response(),
        Ok((request, principal)) => admitted(&state, request, next, &seen, &principal).await,
    };
    let status = response.status().as_u16();
    state.metrics.record(seen.method.as_str(), seen.route, status, started.elapsed().as_secs_f64());
    rejections::as_json(response).await
}

/// An authenticated request (by `principal`): its body read, its headers checked against what a
/// browser could send, then forwarded or served.
async fn admitted(state: &AppState, request: Request, next: Next, seen: &Seen, principal: &str) -> Response {
    let read = body_first(state, request).await;
    let response = match read.and_then(|(parts, body)| refuse_browsers(state, &parts).map(|()| (parts, body)))
    {
        Ok((parts, body)) => forward_to_leader(state, parts, body, seen.policy.serve, next).await,
        Err(refused) => refused.into_response(),
    };
    let status = response.status();
    if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
        // The route itself refused (an inbox owner the token may not reach), or the leader did,
        // for a forwarded request.
        log_refusal(state, seen.route, seen.remote, Some(principal), status, "refused by the route");
    }
    response
}

/// Refuses what a web page could make a browser send ([`guard`]), before anything is forwarded.
fn refuse_browsers(state: &AppState, parts: &axum::http::request::Parts) -> AppResult<()> {
    let open = state.tokens.is_none() && !state.node.config().insecure;
    match guard::check(&parts.method, &parts.headers, open) {
        Ok(()) => Ok(()),
        Err(refusal) => {
            let code = match refusal {
                guard::Refusal::NotJson => ErrorCode::UnsupportedMediaType,
                _ => ErrorCode::Forbidden,
            };
            Err(ApiError::new(refusal.status(), code, refusal.message()))
        }
    }
}

/// Reads an authenticated request's whole body (within `body_bytes_max`, else 413) before any
/// handler runs. A handler that refuses a request without reading its body (a bad id, a route that
/// takes none, a 405) would otherwise answer with the body still unread in the socket, and the reset
/// that follows the close can discard the answer before the client reads it (see [`read_body`]):
/// the client saw a broken connection instead of its 4xx. Handlers read the buffered body as before;
/// a forwarded request sends these bytes on.
async fn body_first(
    state: &AppState,
    request: Request,
) -> AppResult<(axum::http::request::Parts, axum::body::Bytes)> {
    let (parts, body) = request.into_parts();
    Ok((parts, read_body(state, body).await?))
}

/// On a follower that knows its leader, sends a request its route serves on the leader there,
/// with the caller's own credential (there are no unauthenticated inter-node writes).
async fn forward_to_leader(
    state: &AppState,
    parts: axum::http::request::Parts,
    body: axum::body::Bytes,
    serve: Serve,
    next: Next,
) -> Response {
    let leader = state.forward.leader().filter(|_| serve.on_leader(parts.uri.query()));
    let Some(leader) = leader else {
        return next.run(Request::from_parts(parts, axum::body::Body::from(body))).await;
    };
    let path = parts.uri.path();
    let path_and_query = parts.uri.path_and_query().map_or(path, |pq| pq.as_str()).to_string();
    let timeout = match serve {
        // The leader may wait for a learner to catch up (`catch_up_s`).
        Serve::LeaderMemberChange => Duration::from_secs(MEMBER_CATCH_UP_MAX_S + 60),
        Serve::LeaderLongPoll => Duration::from_millis(inboxes::RECEIVE_WAIT_MS_MAX + 30_000),
        _ => FORWARD_TIMEOUT,
    };
    let forwarded = forward::Forwarded { method: parts.method, path_and_query, headers: parts.headers, body };
    match state.forward.conns.send(&leader, forwarded, timeout).await {
        Ok(reply) => {
            let mut response = (reply.status, reply.body).into_response();
            for (name, value) in reply.headers {
                response.headers_mut().insert(name, value);
            }
            response
        }
        Err(error) => ApiError::unavailable(
            ErrorCode::NotReady,
            format!("cannot reach the leader at {}://{leader}: {error}", state.forward.conns.scheme()),
        )
        .into_response(),
    }
}

/// How long a forwarded request may take, connecting included (longer for the routes above).
const FORWARD_TIMEOUT: Duration = Duration::from_secs(30);

type AppResult<T> = Result<T, ApiError>;

/// Checks the caller's token against the route's access and puts the principal on the request (for
/// the routes that check ownership); the principal's name comes back for the log.
/// Refusals (401, 403) are logged, rate limited ([`log_refusal`]).
fn authenticate(state: &AppState, mut request: Request, seen: &Seen) -> AppResult<(Request, String)> {
    let principal: Result<Principal, AuthError> = match (&state.tokens, seen.policy.access) {
        (None, _) | (_, Access::Open) => Ok(Principal::anonymous()),
        (Some(tokens), Access::Needs(scope)) => {
            let header =
                request.headers().get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok());
            tokens.check(header, scope)
        }
    };
    match principal {
        Ok(principal) => {
            let name = principal.name.clone();
            request.extensions_mut().insert(principal);
            Ok((request, name))
        }
        Err(refusal) => {
            let (status, code, message) = if refusal.unauthorized() {
                (StatusCode::UNAUTHORIZED, ErrorCode::Unauthorized, "missing or unknown bearer token")
            } else {
                (StatusCode::FORBIDDEN, ErrorCode::Forbidden, "token lacks the scope for this route")
            };
            log_refusal(state, seen.route, seen.remote, refusal.token_name(), status, &refusal.reason());
            Err(ApiError::new(status, code, message))
        }
    }
}

/// What [`admit`] notes of a request before it goes on: its route's policy, and for its metrics
/// and refusal log lines its method, route label and remote address.
struct Seen {
    method: Method,
    policy: Policy,
    /// A label from the route table, never the request's own text (its cardinality is bounded).
    route: &'static str,
    remote: Option<std::net::SocketAddr>,
}

impl Seen {
    fn of(request: &Request) -> Seen {
        let matched = request.extensions().get::<MatchedPath>().map(MatchedPath::as_str);
        let route = matched.and_then(Route::template).unwrap_or(UNMATCHED_ROUTE);
        let remote =
            request.extensions().get::<axum::extract::ConnectInfo<std::net::SocketAddr>>().map(|info| info.0);
        let method = request.method().clone();
        Seen { policy: Policy::of(&method, matched), method, route, remote }
    }
}

/// The route label of a request no route takes.
const UNMATCHED_ROUTE: &str = "unmatched";

/// Logs a refused request at WARN: route template, remote address, token name (never its value)
/// and reason, at most [`crate::auth::REFUSAL_LINES_PER_SECOND`] lines a second; each line says how
/// many refusals went unlogged before it.
fn log_refusal(
    state: &AppState,
    route: &str,
    remote: Option<std::net::SocketAddr>,
    token: Option<&str>,
    status: StatusCode,
    reason: &str,
) {
    let Some(tokens) = &state.tokens else { return };
    let Some(suppressed) = tokens.refusals.admit(Instant::now()) else { return };
    let remote = remote.map_or_else(|| "unknown".to_string(), |address| address.to_string());
    tracing::warn!(
        status = status.as_u16(),
        route,
        remote = %remote,
        token = token.unwrap_or("-"),
        reason,
        suppressed,
        "request refused"
    );
}

/// Reads and parses a JSON body with the node's size limit, mapping every failure to a contract code.
async fn json_body<T: DeserializeOwned>(state: &AppState, body: axum::body::Body) -> AppResult<T> {
    parse_json(&read_body(state, body).await?)
}

/// Reads a request body of at most `body_bytes_max` bytes, within the node's body timeout and its
/// budget of body bytes in flight (503 `overloaded` when a body would pass it: half-sent bodies
/// must not pile up memory without a bound).
///
/// A body over the limit is still read to its end (and dropped) as long as it stays within
/// [`BODY_DRAIN_MAX`] past the limit, before the 413 goes out: a server that answers and closes with
/// unread bytes in its socket makes the kernel send a reset, which can discard the answer the client
/// has not read yet (the client sees a broken connection instead of `payload_too_large`). A body
/// declared (or found) larger than that is refused without reading it all.
async fn read_body(state: &AppState, body: axum::body::Body) -> AppResult<axum::body::Bytes> {
    read_body_within(state, body, state.node.config().body_bytes_max).await
}

/// [`read_body`] with a route's own, smaller limit: a route whose body is parsed into a tree
/// (metadata) refuses a body larger than it can use before parsing it, so parsing never costs a
/// multiple of a body the node would refuse anyway.
async fn read_body_within(
    state: &AppState,
    body: axum::body::Body,
    limit: usize,
) -> AppResult<axum::body::Bytes> {
    let timeout = state.net.body_timeout;
    let limit = limit.min(state.node.config().body_bytes_max);
    tokio::time::timeout(timeout, read_body_untimed(state, body, limit)).await.unwrap_or_else(|_| {
        Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            ErrorCode::InvalidArgument,
            format!("the request body did not arrive within {} ms", timeout.as_millis()),
        ))
    })
}

async fn read_body_untimed(
    state: &AppState,
    body: axum::body::Body,
    limit: usize,
) -> AppResult<axum::body::Bytes> {
    use tokio_stream::StreamExt as _;
    let too_large = || ApiError::too_large(format!("request body over {limit} bytes"));
    let drain_max = limit.saturating_add(BODY_DRAIN_MAX);
    if axum::body::HttpBody::size_hint(&body).lower() > drain_max as u64 {
        return Err(too_large());
    }
    let mut budget = BodyBudget::new(&state.net);
    let mut stream = body.into_data_stream();
    let mut chunks: Vec<axum::body::Bytes> = Vec::new();
    let mut total = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| ApiError::invalid(format!("could not read the request body: {e}")))?;
        total = total.saturating_add(chunk.len());
        if total <= limit {
            budget.take(chunk.len())?;
            chunks.push(chunk);
        } else if total > drain_max {
            break;
        } else {
            chunks.clear();
            budget.release();
        }
    }
    if total > limit {
        return Err(too_large());
    }
    Ok(match chunks.len() {
        1 => chunks.pop().unwrap_or_default(),
        _ => chunks.concat().into(),
    })
}

/// The share of the node's in-flight body budget one request holds while its body is read.
struct BodyBudget<'a> {
    net: &'a crate::transport::NetState,
    held: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl<'a> BodyBudget<'a> {
    fn new(net: &'a crate::transport::NetState) -> BodyBudget<'a> {
        BodyBudget { net, held: None }
    }

    fn take(&mut self, bytes: usize) -> AppResult<()> {
        let Ok(bytes) = u32::try_from(bytes) else {
            return Err(ApiError::too_large("a request body chunk over 4 GiB"));
        };
        let permit = self.net.body_budget.clone().try_acquire_many_owned(bytes).map_err(|_| {
            ApiError::unavailable(
                ErrorCode::Overloaded,
                format!(
                    "the node is reading {} bytes of request bodies already (inflight_body_bytes_max); retry",
                    self.net.body_budget_max
                ),
            )
        })?;
        match &mut self.held {
            Some(held) => held.merge(permit),
            None => self.held = Some(permit),
        }
        Ok(())
    }

    fn release(&mut self) {
        self.held = None;
    }
}

/// How far past `body_bytes_max` an oversize body is still read (and dropped) so that its 413
/// reaches the client; see [`read_body`].
const BODY_DRAIN_MAX: usize = 16 * 1024 * 1024;

fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> AppResult<T> {
    serde_json::from_slice(bytes).map_err(json_error)
}

/// Shape errors (wrong types, unknown fields, ids out of range) are `invalid_argument`; syntax errors
/// are `malformed_json`.
fn json_error(error: serde_json::Error) -> ApiError {
    match error.classify() {
        serde_json::error::Category::Data => ApiError::invalid(format!("invalid request: {error}")),
        _ => ApiError::bad_request(ErrorCode::MalformedJson, format!("malformed JSON: {error}")),
    }
}

fn query_param<'a>(query: &'a Option<String>, name: &str) -> Option<&'a str> {
    query.as_deref()?.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (key == name).then_some(value)
    })
}

/// An unsigned query parameter, in canonical decimal only (see [`parse_canonical_u64`]).
fn query_u64(query: &Option<String>, name: &str) -> AppResult<Option<u64>> {
    query_param(query, name)
        .map(|value| {
            parse_canonical_u64(value).ok_or_else(|| {
                ApiError::invalid(format!("{name} must be an unsigned integer in canonical decimal"))
            })
        })
        .transpose()
}

fn query_limit(query: &Option<String>, default: usize) -> AppResult<usize> {
    let limit = query_u64(query, "limit")?.map(|n| n as usize).unwrap_or(default);
    if limit == 0 || limit > LIMIT_MAX {
        return Err(ApiError::invalid(format!("limit must be 1..={LIMIT_MAX}")));
    }
    Ok(limit)
}

/// Honours `min_seqno`: waits (bounded) until the node has applied it. Returns the applied seqno.
async fn read_barrier(state: &AppState, query: &Option<String>) -> AppResult<u64> {
    let node = &state.node;
    let timeout = Duration::from_millis(node.config().read_wait_ms_max);
    match query_param(query, "consistency") {
        None | Some("applied") => {}
        Some("linearizable") => {
            // ReadIndex (PROTOCOL.md, "Reads"): a follower forwarded this read to the leader already;
            // here the leader confirms it still leads and waits until it has applied the read index.
            let index = match node.replica() {
                Some(replica) => replica
                    .read_index()
                    .await
                    .map_err(|why| {
                        ApiError::unavailable(ErrorCode::NotReady, format!("linearizable read: {why}; retry"))
                    })?
                    .get(),
                None => node.wal().durable_seqno().get(),
            };
            node.wait_applied(index, Some(timeout)).await?;
        }
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "consistency must be applied or linearizable, not {other:?}"
            )))
        }
    }
    if let Some(min) = query_u64(query, "min_seqno")? {
        node.wait_applied(min, Some(timeout)).await?;
    }
    Ok(node.applied_seqno())
}

fn with_applied<T: IntoResponse>(applied: u64, body: T) -> Response {
    let mut response = body.into_response();
    response.headers_mut().insert("Tidal-Applied-Seqno", HeaderValue::from(applied));
    response
}

/// An item id from a path or a query, in canonical decimal only: `+1`, `01` or `1.0` is refused,
/// never taken as item 1.
fn parse_item_id(raw: &str) -> AppResult<u64> {
    parse_canonical_u64(raw).ok_or_else(|| {
        ApiError::invalid(format!("item id {raw:?} is not an unsigned 64-bit integer in canonical decimal"))
    })
}

fn check_name(what: &str, name: &str, max: usize) -> AppResult<()> {
    if name.is_empty() {
        return Err(ApiError::invalid(format!("{what} must not be empty")));
    }
    if name.len() > max {
        return Err(ApiError::invalid(format!("{what} is longer than {max} bytes")));
    }
    if name.starts_with(RESERVED_PREFIX) {
        return Err(ApiError::invalid(format!("{what} {name:?} uses the reserved prefix {RESERVED_PREFIX}")));
    }
    if name.chars().any(char::is_control) {
        return Err(ApiError::invalid(format!("{what} contains control characters")));
    }
    Ok(())
}

fn idempotency_key(headers: &HeaderMap) -> AppResult<Option<String>> {
    let Some(value) = headers.get("Idempotency-Key") else {
        return Ok(None);
    };
    let key = value.to_str().map_err(|_| ApiError::invalid("Idempotency-Key must be visible ASCII"))?;
    check_idempotency_key(key).map(Some)
}

/// An Idempotency-Key as a header may carry it (visible ASCII, spaces and tabs) and within
/// [`IDEMPOTENCY_KEY_BYTES_MAX`]: the same rule for a header and for a write link's frame.
fn check_idempotency_key(key: &str) -> AppResult<String> {
    if !key.bytes().all(|b| b == b'\t' || (0x20..0x7f).contains(&b)) {
        return Err(ApiError::invalid("Idempotency-Key must be visible ASCII"));
    }
    if key.is_empty() || key.len() > IDEMPOTENCY_KEY_BYTES_MAX {
        return Err(ApiError::invalid(format!(
            "Idempotency-Key must be 1..={IDEMPOTENCY_KEY_BYTES_MAX} bytes"
        )));
    }
    Ok(key.to_string())
}

async fn post_signals(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> AppResult<Json<WriteReply>> {
    let key = idempotency_key(&headers)?;
    Ok(Json(write_signals(&state, &principal, key, &read_body(&state, body).await?).await?))
}

/// `POST /v1/signals` once its body is read (for HTTP and for the write link).
async fn write_signals(
    state: &AppState,
    principal: &Principal,
    key: Option<String>,
    body: &[u8],
) -> AppResult<WriteReply> {
    let events = decode::signals(body, &decode::Limits::of(state.node.config()))?;
    let seqno = state.node.write(principal, key, Records::Signals(events)).await?;
    Ok(WriteReply { seqno })
}

/// A signal's weight is finite and at most [`SIGNAL_WEIGHT_MAX`] in absolute value; its `ts`, if
/// given, is a unix time in ms, not past the year 2200 nor more than [`SIGNAL_TS_AHEAD_MAX_MS`]
/// after `now_ms`.
pub(crate) fn check_signal(weight: f64, ts: Option<i64>, now_ms: i64) -> AppResult<()> {
    if !weight.is_finite() {
        return Err(ApiError::bad_request(ErrorCode::NonFiniteNumber, "weight is not finite"));
    }
    if weight.abs() > SIGNAL_WEIGHT_MAX {
        return Err(ApiError::invalid(format!(
            "weight {weight} is outside -{SIGNAL_WEIGHT_MAX}..={SIGNAL_WEIGHT_MAX}"
        )));
    }
    let Some(ts) = ts else { return Ok(()) };
    if !(0..=SIGNAL_TS_MAX_MS).contains(&ts) {
        return Err(ApiError::invalid(format!("ts {ts} is not a unix time in ms")));
    }
    let latest = now_ms.saturating_add(SIGNAL_TS_AHEAD_MAX_MS);
    if ts > latest {
        return Err(ApiError::invalid(format!(
            "ts {ts} is more than {SIGNAL_TS_AHEAD_MAX_MS} ms after the node's clock ({now_ms})"
        )));
    }
    Ok(())
}

fn prefix(mut error: ApiError, index: usize) -> ApiError {
    error.message = format!("signals[{index}]: {}", error.message);
    error
}

async fn put_item(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> AppResult<Json<WriteReply>> {
    let item = parse_item_id(&id)?;
    let key = idempotency_key(&headers)?;
    let body = read_body_within(&state, body, ITEM_BODY_BYTES_MAX).await?;
    Ok(Json(write_item(&state, &principal, item, key, &body).await?))
}

/// Compact metadata is at most [`METADATA_BYTES_MAX`]; an item's body may have as much again in
/// whitespace.
const ITEM_BODY_BYTES_MAX: usize = 2 * METADATA_BYTES_MAX + 1024;

/// `PUT /v1/items/{id}` once its body is read (for HTTP and for the write link).
async fn write_item(
    state: &AppState,
    principal: &Principal,
    item: u64,
    key: Option<String>,
    body: &[u8],
) -> AppResult<WriteReply> {
    if body.len() > ITEM_BODY_BYTES_MAX {
        return Err(ApiError::too_large(format!("request body over {ITEM_BODY_BYTES_MAX} bytes")));
    }
    let metadata = decode::item_metadata(body)?;
    let seqno = state.node.write(principal, key, Records::ItemMetadata { item, metadata }).await?;
    Ok(WriteReply { seqno })
}

/// An item's metadata as stored: compact JSON of at most [`METADATA_BYTES_MAX`] bytes.
fn metadata_bytes(metadata: &serde_json::Value) -> AppResult<Vec<u8>> {
    let metadata = serde_json::to_vec(metadata).map_err(|e| ApiError::invalid(e.to_string()))?;
    if metadata.len() > METADATA_BYTES_MAX {
        return Err(ApiError::too_large(format!("metadata over {METADATA_BYTES_MAX} bytes")));
    }
    Ok(metadata)
}

async fn get_item(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> AppResult<Response> {
    let item = parse_item_id(&id)?;
    let applied = read_barrier(&state, &query).await?;
    let Some(found) = state.node.db().get_item(item)? else {
        return Err(ApiError::not_found(format!("item {item} not found")));
    };
    let metadata: serde_json::Value = serde_json::from_slice(&found.metadata)
        .map_err(|e| ApiError::internal(format!("stored metadata of item {item} is not JSON: {e}")))?;
    let view = ItemView { id: item, metadata, has_embedding: found.has_embedding, seqno: found.seqno.get() };
    Ok(with_applied(applied, Json(view)))
}

async fn delete_item(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> AppResult<Json<WriteReply>> {
    let item = parse_item_id(&id)?;
    let key = idempotency_key(&headers)?;
    let seqno = state.node.write(&principal, key, Records::ItemDelete { item }).await?;
    Ok(Json(WriteReply { seqno }))
}

async fn put_embedding(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> AppResult<Json<WriteReply>> {
    let item = parse_item_id(&id)?;
    let key = idempotency_key(&headers)?;
    let vector = parse_vector(&state, body).await?;
    check_embedding_room(&state, item)?;
    let seqno = state.node.write(&principal, key, Records::ItemEmbedding { item, vector }).await?;
    Ok(Json(WriteReply { seqno }))
}

async fn get_embedding(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> AppResult<Response> {
    let item = parse_item_id(&id)?;
    let applied = read_barrier(&state, &query).await?;
    let Some((vector, seqno)) = state.node.db().get_embedding(item)? else {
        return Err(ApiError::not_found(format!("item {item} has no embedding")));
    };
    Ok(with_applied(applied, Json(EmbeddingView { id: item, vector, seqno: seqno.get() })))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct EmbeddingBody<'a> {
    #[serde(borrow)]
    vector: &'a serde_json::value::RawValue,
}

/// A JSON array read into at most `max` values: a longer one is refused at element `max + 1`, so a
/// huge vector body never becomes a huge tree of values.
struct BoundedArray {
    max: usize,
}

impl<'de> serde::de::DeserializeSeed<'de> for BoundedArray {
    type Value = Vec<serde_json::Value>;

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> serde::de::Visitor<'de> for BoundedArray {
    type Value = Vec<serde_json::Value>;

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(formatter, "an array of at most {} numbers", self.max)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut values = Vec::with_capacity(self.max.min(4096));
        while let Some(value) = seq.next_element::<serde_json::Value>()? {
            if values.len() == self.max {
                return Err(serde::de::Error::custom(format!("more than {} dimensions", self.max)));
            }
            values.push(value);
        }
        Ok(values)
    }
}

/// Parses an embedding body. JSON has no NaN or infinity: clients send them as `null` (JavaScript's
/// `JSON.stringify`), as strings, or as an out-of-range literal such as `1e999`; each is
/// `invalid_vector`, not a generic parse error.
/// Refuses a NEW embedding once the node holds `embeddings_max` (507 `index_full`): the ranking
/// index keeps every embedding in memory. Checked against the applied state, op by op, so writes
/// in flight can pass the cap by at most the new embeddings they carry (a tx's ops each check the
/// same applied count); an item's replacement embedding is never refused.
pub(crate) fn check_embedding_room(state: &AppState, item: u64) -> AppResult<()> {
    let cap = state.node.config().embeddings_max;
    let (embeddings, has) = state.node.db().embeddings_and_has(item);
    if has || embeddings < cap {
        return Ok(());
    }
    let dimension = state.node.config().dimension;
    Err(ApiError::new(
        StatusCode::INSUFFICIENT_STORAGE,
        ErrorCode::IndexFull,
        format!(
            "this node holds {embeddings} embeddings of {dimension} dimensions, its embeddings_max ({cap}); delete items or raise embeddings_max (memory: about {} bytes per dimension each)",
            crate::config::EMBEDDING_BYTES_PER_DIMENSION
        ),
    ))
}

async fn parse_vector(state: &AppState, body: axum::body::Body) -> AppResult<Vec<f32>> {
    let invalid = |message: String| ApiError::bad_request(ErrorCode::InvalidVector, message);
    let bytes = read_body(state, body).await?;
    let out_of_range = |error: serde_json::Error| match error.to_string().contains("number out of range") {
        true => invalid(format!("vector holds a number that is not finite: {error}")),
        false => json_error(error),
    };
    let parsed: EmbeddingBody = serde_json::from_slice(&bytes).map_err(out_of_range)?;
    let dimension = state.node.config().dimension as usize;
    let mut array = serde_json::Deserializer::from_str(parsed.vector.get());
    let values = serde::de::DeserializeSeed::deserialize(BoundedArray { max: dimension }, &mut array)
        .map_err(|error| match error.to_string().contains("dimensions") {
            true => ApiError::bad_request(
                ErrorCode::DimensionMismatch,
                format!("vector has more than {dimension} dimensions, this database has {dimension}"),
            ),
            false => out_of_range(error),
        })?;
    vector_from_values(state, &values)
}

/// An embedding from JSON values: the database's dimension, every value a finite f32.
fn vector_from_values(state: &AppState, values: &[serde_json::Value]) -> AppResult<Vec<f32>> {
    let invalid = |message: String| ApiError::bad_request(ErrorCode::InvalidVector, message);
    let dimension = state.node.config().dimension as usize;
    if values.len() != dimension {
        return Err(ApiError::bad_request(
            ErrorCode::DimensionMismatch,
            format!("vector has {} dimensions, this database has {dimension}", values.len()),
        ));
    }
    let mut vector = Vec::with_capacity(dimension);
    for (i, value) in values.iter().enumerate() {
        let number =
            value.as_f64().ok_or_else(|| invalid(format!("vector[{i}] = {value} is not a finite number")))?;
        let narrowed = number as f32;
        if !number.is_finite() || !narrowed.is_finite() {
            return Err(invalid(format!("vector[{i}] = {number} is not a finite f32")));
        }
        vector.push(narrowed);
    }
    Ok(vector)
}

fn ranked(list: tidal_core::Ranked) -> RankedList {
    RankedList {
        items: list
            .items
            .into_iter()
            .map(|entry| RankedItem {
                item: entry.item,
                score: entry.score,
                similarity: entry.similarity,
                trending: entry.trending,
            })
            .collect(),
        applied_seqno: list.applied_seqno.get(),
    }
}

async fn get_feed(
    State(state): State<Arc<AppState>>,
    Path(user): Path<String>,
    RawQuery(query): RawQuery,
) -> AppResult<Response> {
    check_name("user", &user, USER_BYTES_MAX)?;
    let limit = query_limit(&query, 20)?;
    let exclude = match query_param(&query, "exclude") {
        None | Some("") => Vec::new(),
        Some(list) => {
            list.split(',').map(parse_item_id).collect::<AppResult<Vec<u64>>>().and_then(|ids| {
                if ids.len() > EXCLUDE_MAX {
                    Err(ApiError::invalid(format!("exclude lists at most {EXCLUDE_MAX} ids")))
                } else {
                    Ok(ids)
                }
            })?
        }
    };
    let exact = query_exact(&query)?;
    let applied = read_barrier(&state, &query).await?;
    let list = state.node.db().feed_with(&user, limit, &exclude, exact)?;
    Ok(with_applied(applied, Json(ranked(list))))
}

async fn get_similar(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> AppResult<Response> {
    let item = parse_item_id(&id)?;
    let limit = query_limit(&query, 10)?;
    let exact = query_exact(&query)?;
    let applied = read_barrier(&state, &query).await?;
    let Some(list) = state.node.db().similar_with(item, limit, exact)? else {
        return Err(ApiError::not_found(format!("item {item} has no embedding")));
    };
    Ok(with_applied(applied, Json(ranked(list))))
}

/// The `exact` query parameter of the feed and similar items: `true` ranks by the exact scan of
/// every item (for audits) even where the approximate index would answer (decisions/067).
fn query_exact(query: &Option<String>) -> AppResult<bool> {
    match query_param(query, "exact") {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(ApiError::invalid(format!("exact must be true or false, got {other:?}"))),
    }
}

async fn get_trending(State(state): State<Arc<AppState>>, RawQuery(query): RawQuery) -> AppResult<Response> {
    let limit = query_limit(&query, 20)?;
    let applied = read_barrier(&state, &query).await?;
    let list = state.node.db().trending(limit)?;
    Ok(with_applied(applied, Json(ranked(list))))
}

async fn post_negative(
    State(state): State<Arc<AppState>>,
    Path(user): Path<String>,
    body: axum::body::Body,
) -> AppResult<Json<Accepted>> {
    check_name("user", &user, USER_BYTES_MAX)?;
    let request: NegativeAdd = json_body(&state, body).await?;
    state.node.db().negatives_add(&user, request.item)?;
    Ok(Json(Accepted { accepted: true }))
}

async fn delete_negative(
    State(state): State<Arc<AppState>>,
    Path((user, item)): Path<(String, String)>,
) -> AppResult<Json<Accepted>> {
    check_name("user", &user, USER_BYTES_MAX)?;
    let item = parse_item_id(&item)?;
    state.node.db().negatives_remove(&user, item)?;
    Ok(Json(Accepted { accepted: true }))
}

async fn get_negatives(
    State(state): State<Arc<AppState>>,
    Path(user): Path<String>,
    RawQuery(query): RawQuery,
) -> AppResult<Response> {
    check_name("user", &user, USER_BYTES_MAX)?;
    let applied = read_barrier(&state, &query).await?;
    let items = state.node.db().negatives(&user)?;
    Ok(with_applied(applied, Json(NegativesView { user, items })))
}

async fn get_status(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
) -> AppResult<Json<ClusterStatus>> {
    let applied = read_barrier(&state, &query).await?;
    Ok(Json(cluster_status(&state.node, applied)?))
}

/// The node's view of the cluster with `applied` as its applied frontier (`GET /cluster/status`,
/// and the samples of `GET /cluster/history`).
fn cluster_status(node: &Node, applied: u64) -> AppResult<ClusterStatus> {
    let durable = node.wal().durable_seqno().get();
    let http = node.config().http.to_string();
    let quarantine = tidal_wal::quarantine_summary(&node.config().data_dir.join("wal"))
        .map_err(|error| ApiError::internal(format!("read the quarantine directory: {error}")))?;
    let Some(replica) = node.replica() else {
        return Ok(ClusterStatus {
            node_id: 1,
            role: "leader".into(),
            term: node.wal().term().get(),
            leader_id: Some(1),
            durable_seqno: durable,
            commit_seqno: durable,
            applied_seqno: applied,
            baseline_term: 0,
            baseline_seqno: 0,
            quarantine_files: quarantine.files,
            quarantined_seqnos: quarantine.seqnos,
            nodes: vec![NodeStatus {
                id: 1,
                role: "leader".into(),
                learner: false,
                http,
                durable_seqno: durable,
                applied_seqno: applied,
                lag_ms: Some(0),
                matched_seqno: durable,
                pulling: false,
                snapshot: false,
            }],
        });
    };
    let leader = replica.leader();
    let (my_role, term) = replica.role_in_term();
    let role = |id: tidal_types::NodeId| {
        if id == replica.me() {
            my_role.as_str()
        } else if Some(id) == leader {
            "leader"
        } else {
            "follower"
        }
    };
    let progress = replica.progress();
    let members = replica.members();
    let healing: std::collections::BTreeSet<u64> =
        replica.snapshot_pins().pinned().into_iter().map(|(follower, _)| follower.0).collect();
    let nodes = members
        .nodes
        .values()
        .map(|spec| {
            let (durable_seqno, applied_seqno, lag_ms, matched_seqno, pulling) = if spec.id == replica.me() {
                (durable, applied, Some(0), durable, false)
            } else {
                let p = progress.get(&spec.id).cloned().unwrap_or_default();
                let lag = p.last_ack.map(|at| at.elapsed().as_millis() as u64);
                (p.durable.get(), p.applied.get(), lag, p.matched.seqno.get(), p.pulling)
            };
            let learner = !members.is_voter(spec.id);
            NodeStatus {
                id: spec.id.0,
                role: if learner { "learner".into() } else { role(spec.id).into() },
                learner,
                http: spec.http.clone(),
                durable_seqno,
                applied_seqno,
                lag_ms,
                matched_seqno,
                pulling,
                snapshot: healing.contains(&spec.id.0),
            }
        })
        .collect();
    Ok(ClusterStatus {
        node_id: replica.me().0,
        role: role(replica.me()).into(),
        term: term.get(),
        leader_id: leader.map(|id| id.0),
        durable_seqno: durable,
        commit_seqno: replica.commit_seqno().get(),
        applied_seqno: applied,
        baseline_term: replica.baseline().term.get(),
        baseline_seqno: replica.baseline().seqno.get(),
        quarantine_files: quarantine.files,
        quarantined_seqnos: quarantine.seqnos,
        nodes,
    })
}

fn cluster_replica(state: &AppState) -> AppResult<&Arc<tidal_cluster::Replica>> {
    state.node.replica().ok_or_else(|| {
        ApiError::bad_request(ErrorCode::InvalidArgument, "this node is not a cluster member (no --cluster)")
    })
}

async fn post_heal(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
) -> AppResult<Json<HealView>> {
    let replica = cluster_replica(&state)?;
    let node = query_u64(&query, "node")?.ok_or_else(|| ApiError::invalid("heal needs ?node=<id>"))?;
    let dry_run = query_param(&query, "dry_run") == Some("true");
    let report = replica.heal(tidal_types::NodeId(node), dry_run).map_err(ApiError::from)?;
    Ok(Json(HealView {
        node: report.node.0,
        matched: PositionView { term: report.matched.term.get(), seqno: report.matched.seqno.get() },
        applied_seqno: report.applied.get(),
        dry_run,
        action: report.action,
    }))
}

async fn post_promote(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
) -> AppResult<Json<PromoteView>> {
    let replica = cluster_replica(&state)?;
    let node = query_u64(&query, "node")?.ok_or_else(|| ApiError::invalid("promote needs ?node=<id>"))?;
    let dry_run = query_param(&query, "dry_run") == Some("true");
    let report = replica.promote(tidal_types::NodeId(node), dry_run).await?;
    Ok(Json(PromoteView {
        from: report.from.0,
        to: report.to.0,
        term: report.term.get(),
        behind_seqnos: report.behind,
        new_leader: report.new_leader.map(|id| id.0),
        elapsed_ms: report.elapsed.as_millis() as u64,
        dry_run,
        action: report.action,
    }))
}

/// Default time a new member may take to catch up as a learner (`?catch_up_s=` overrides).
const MEMBER_CATCH_UP_DEFAULT_S: u64 = 120;
/// Longest catch-up wait one request may ask for.
const MEMBER_CATCH_UP_MAX_S: u64 = 3600;

async fn post_member(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> AppResult<Json<MembersView>> {
    let replica = cluster_replica(&state)?;
    let id = member_id(&id)?;
    // Clients may percent-encode the port's colon.
    let address = |name| {
        query_param(&query, name).filter(|v| !v.is_empty()).map(|v| v.replace("%3A", ":").replace("%3a", ":"))
    };
    let (Some(http), Some(rpc)) = (address("http"), address("rpc")) else {
        return Err(ApiError::invalid(
            "members add needs ?http=HOST:PORT&rpc=HOST:PORT (the new node's addresses)",
        ));
    };
    for (name, address) in [("http", &http), ("rpc", &rpc)] {
        let valid = address.len() <= 255
            && address
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !valid {
            return Err(ApiError::invalid(format!("{name} address {address:?} is not HOST:PORT")));
        }
    }
    let catch_up_s = query_u64(&query, "catch_up_s")?.unwrap_or(MEMBER_CATCH_UP_DEFAULT_S);
    if catch_up_s == 0 || catch_up_s > MEMBER_CATCH_UP_MAX_S {
        return Err(ApiError::invalid(format!("catch_up_s must be 1..={MEMBER_CATCH_UP_MAX_S}")));
    }
    let dry_run = query_param(&query, "dry_run") == Some("true");
    let change = tidal_cluster::MemberChange::Add {
        node: tidal_cluster::NodeSpec { id, http, rpc },
        catch_up: std::time::Duration::from_secs(catch_up_s),
    };
    member_change(replica, change, dry_run).await
}

async fn delete_member(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> AppResult<Json<MembersView>> {
    let replica = cluster_replica(&state)?;
    let id = member_id(&id)?;
    let dry_run = query_param(&query, "dry_run") == Some("true");
    member_change(replica, tidal_cluster::MemberChange::Remove { node: id }, dry_run).await
}

fn member_id(id: &str) -> AppResult<tidal_types::NodeId> {
    match parse_canonical_u64(id) {
        Some(id) if id > 0 => Ok(tidal_types::NodeId(id)),
        _ => Err(ApiError::invalid(format!("member id {id:?} is not a node id (1, 2, ...)"))),
    }
}

async fn member_change(
    replica: &Arc<tidal_cluster::Replica>,
    change: tidal_cluster::MemberChange,
    dry_run: bool,
) -> AppResult<Json<MembersView>> {
    let ids =
        |set: &std::collections::BTreeSet<tidal_types::NodeId>| set.iter().map(|id| id.0).collect::<Vec<_>>();
    // In its own task: a client that hangs up does not cut a change short halfway.
    let replica = replica.clone();
    let change = tokio::spawn(async move { replica.change_members(change, dry_run).await });
    let report = change.await.map_err(|e| {
        ApiError::unavailable(ErrorCode::NotReady, format!("membership change task failed: {e}"))
    })?;
    let report = report?;
    Ok(Json(MembersView {
        term: report.term.get(),
        voters_before: ids(&report.voters_before),
        voters_after: ids(&report.voters_after),
        learners_after: ids(&report.learners_after),
        elapsed_ms: report.elapsed.as_millis() as u64,
        dry_run,
        action: report.action,
    }))
}

async fn post_reconcile(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
) -> AppResult<Json<ReconcileView>> {
    let replica = cluster_replica(&state)?;
    let dry_run = query_param(&query, "dry_run") == Some("true");
    let peers = replica
        .reconcile(dry_run)
        .await
        .into_iter()
        .map(|peer| ReconcilePeerView {
            node: peer.node.0,
            differed: peer.differed,
            merged_users: peer.merged_users,
            refused: peer.refused,
            outcome: peer.outcome,
        })
        .collect();
    Ok(Json(ReconcileView { node: replica.me().0, dry_run, peers }))
}

async fn post_catchup(State(state): State<Arc<AppState>>) -> AppResult<Json<CatchupView>> {
    let replica = cluster_replica(&state)?;
    let started = replica.catchup()?;
    let note = if started {
        "pulling from the leader now"
    } else {
        "a pull is already running or started moments ago"
    };
    Ok(Json(CatchupView {
        node: replica.me().0,
        leader: replica.leader().map(|id| id.0),
        pull_started: started,
        note: note.to_string(),
    }))
}

async fn get_digest(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
) -> AppResult<Json<DigestView>> {
    read_barrier(&state, &query).await?;
    let db = state.node.db();
    let (applied, digest) = db.digest()?;
    let negatives = db.negatives_digest()?;
    Ok(Json(DigestView {
        node_id: state.node.replica().map_or(1, |replica| replica.me().0),
        applied_seqno: applied.get(),
        digest: hex(&digest),
        negatives_digest: hex(&negatives),
    }))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Liveness: 200 `ok` while the node runs; 503 with the reason once a fatal storage fault stopped
/// it (decisions/059: it leaves office at once and exits shortly after, for a restart).
async fn healthz(State(state): State<Arc<AppState>>) -> Response {
    match state.node.fatal() {
        Some(fatal) => ApiError::unavailable(ErrorCode::NotReady, fatal.to_string()).into_response(),
        None => (StatusCode::OK, "ok\n").into_response(),
    }
}

/// Default `max_lag_ms` of `/readyz` on a follower: how long it may go without hearing its leader.
const READY_MAX_LAG_MS_DEFAULT: u64 = 5_000;

async fn readyz(State(state): State<Arc<AppState>>, RawQuery(query): RawQuery) -> Response {
    if let Some(why) = state.node.fatal() {
        return ApiError::unavailable(ErrorCode::NotReady, why.to_string()).into_response();
    }
    let max_lag_ms = match query_u64(&query, "max_lag_ms") {
        Ok(value) => value.unwrap_or(READY_MAX_LAG_MS_DEFAULT),
        Err(error) => return error.into_response(),
    };
    if let Some(replica) = state.node.replica() {
        if replica.is_leader() {
            if !replica.has_quorum_contact() {
                // A leader cut off from a majority acknowledges nothing (quorum mode) or stops at
                // its lease (leader mode): not ready, whatever openraft still says.
                let why = "leader without contact with a majority of voters";
                return ApiError::unavailable(ErrorCode::NotReady, why).into_response();
            }
            return (StatusCode::OK, "ready: leader\n").into_response();
        }
        let Some(leader) = replica.leader().filter(|leader| *leader != replica.me()) else {
            return ApiError::unavailable(
                ErrorCode::NotReady,
                "no leader is known (an election is under way)",
            )
            .into_response();
        };
        match replica.leader_silence() {
            Some(silence) if silence.as_millis() as u64 <= max_lag_ms => {}
            Some(silence) => {
                let why = format!(
                    "last heard from leader {leader} {} ms ago (max_lag_ms {max_lag_ms})",
                    silence.as_millis()
                );
                return ApiError::unavailable(ErrorCode::NotReady, why).into_response();
            }
            None => {
                let why = format!("has not heard from leader {leader} yet");
                return ApiError::unavailable(ErrorCode::NotReady, why).into_response();
            }
        }
        return (StatusCode::OK, "ready: follower\n").into_response();
    }
    (StatusCode::OK, "ready\n").into_response()
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let node = &state.node;
    let mut out = String::with_capacity(8192);
    render_wal_metrics(&mut out, node);
    render_frontier_metrics(&mut out, node);
    if let Some(replica) = node.replica() {
        render_replication_metrics(&mut out, replica);
        render_follower_metrics(&mut out, replica);
    }
    render_single(&mut out, "tidal_applied_seqno", "gauge", "Applied frontier.", node.applied_seqno() as f64);
    render_single(
        &mut out,
        "tidal_writes_waiting",
        "gauge",
        "Writes appended to the WAL and waiting for their commit and apply.",
        node.writes_waiting() as f64,
    );
    render_engine_metrics(&mut out, node);
    render_checkpoint_metrics(&mut out, node);
    render_fatal_metrics(&mut out, node);
    streams::render_metrics(&mut out, &state);
    inboxes::render_metrics(&mut out, &state);
    state.net.render(&mut out);
    render_single(
        &mut out,
        "tidal_uptime_seconds",
        "gauge",
        "Seconds since start.",
        node.uptime().as_secs_f64(),
    );
    crate::metrics::render_data_dir_space(&mut out, &node.config().data_dir);
    state.metrics.render(&mut out);
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

/// The WAL's histograms and counters.
fn render_wal_metrics(out: &mut String, node: &Node) {
    let wal = node.wal().stats();
    // The last bucket of the WAL's histogram is a catch-all (u64::MAX): Prometheus' +Inf covers it.
    let bounds_us = &tidal_wal::stats::FSYNC_LATENCY_BUCKETS_US;
    let bounds_s: Vec<f64> = bounds_us[..bounds_us.len() - 1].iter().map(|us| *us as f64 / 1e6).collect();
    render_histogram(
        out,
        "tidal_wal_fsync_seconds",
        "WAL fsync (fdatasync) latency.",
        &bounds_s,
        &wal.fsync_latency_us_buckets,
        wal.fsync_latency_us_sum as f64 / 1e6,
    );
    let drain_bounds = &tidal_wal::stats::DRAIN_REQUESTS_BUCKETS;
    let drain_bounds: Vec<f64> = drain_bounds[..drain_bounds.len() - 1].iter().map(|n| *n as f64).collect();
    render_histogram(
        out,
        "tidal_wal_drain_requests",
        "Requests covered by one WAL group commit (one drain, one fsync).",
        &drain_bounds,
        &wal.drain_requests_buckets,
        wal.drain_requests_sum as f64,
    );
    render_single(
        out,
        "tidal_wal_gathers_total",
        "counter",
        "Times the WAL writer waited (bounded) for the writers of its last large drain (experiments/021).",
        wal.gathers as f64,
    );
    render_single(
        out,
        "tidal_wal_batches_total",
        "counter",
        "Batches written to the WAL.",
        wal.batches as f64,
    );
    render_single(out, "tidal_wal_bytes_total", "counter", "Bytes written to the WAL.", wal.bytes as f64);
    render_single(out, "tidal_wal_fsyncs_total", "counter", "WAL fsyncs.", wal.fsyncs as f64);
    render_single(
        out,
        "tidal_wal_segments_prepared_total",
        "counter",
        "WAL segments prepared ahead (written with zeros and fsynced) while the writer was idle.",
        wal.segments_prepared as f64,
    );
    render_single(
        out,
        "tidal_wal_rotations_unprepared_total",
        "counter",
        "WAL rotations that found no prepared segment and started an empty one (appended to).",
        wal.rotations_unprepared as f64,
    );
    render_single(
        out,
        "tidal_wal_queue_depth",
        "gauge",
        "Writes queued for the WAL writer.",
        wal.queue_batches as f64,
    );
}

/// The purge point and the durable and commit frontiers.
fn render_frontier_metrics(out: &mut String, node: &Node) {
    let purged = node.wal().purged().seqno.get() as f64;
    render_single(
        out,
        "tidal_wal_purged_seqno",
        "gauge",
        "WAL purge point: seqnos at or below it are gone.",
        purged,
    );
    let durable = node.wal().durable_seqno().get() as f64;
    render_single(out, "tidal_durable_seqno", "gauge", "Durable frontier.", durable);
    let commit = node.replica().map_or(durable, |replica| replica.commit_seqno().get() as f64);
    render_single(out, "tidal_commit_seqno", "gauge", "Commit frontier.", commit);
}

/// A cluster node's role, snapshot installs, pulls, office handovers, refusals and commit notices.
fn render_replication_metrics(out: &mut String, replica: &tidal_cluster::Replica) {
    render_single(out, "tidal_is_leader", "gauge", "1 on the leader.", f64::from(replica.is_leader()));
    render_single(out, "tidal_term", "gauge", "Current term.", replica.term().get() as f64);
    let (tail_batches, tail_bytes) = replica.ship_tail_held();
    render_single(
        out,
        "tidal_ship_tail_batches",
        "gauge",
        "Batches in the in-memory ship tail (bound: ship_tail_batches_max).",
        tail_batches as f64,
    );
    render_single(
        out,
        "tidal_ship_tail_bytes",
        "gauge",
        "Bytes of the batches in the in-memory ship tail (bound: ship_tail_bytes_max).",
        tail_bytes as f64,
    );
    let installs = replica.install_stats();
    render_single(
        out,
        "tidal_snapshot_installs_total",
        "counter",
        "Snapshots this node installed (it was behind its source's purge point or applied a divergent suffix).",
        installs.installed as f64,
    );
    render_single(
        out,
        "tidal_snapshot_install_failures_total",
        "counter",
        "Snapshot fetches or installs on this node that failed.",
        installs.failed as f64,
    );
    let pulls = replica.pull_stats();
    render_single(
        out,
        "tidal_pulls_total",
        "counter",
        "Pulls of another node's log this node ran to their end (catch-up).",
        pulls.pulls as f64,
    );
    render_single(
        out,
        "tidal_pull_batches_total",
        "counter",
        "Batches those pulls appended to this node's WAL.",
        pulls.batches as f64,
    );
    render_single(
        out,
        "tidal_pull_bytes_total",
        "counter",
        "Encoded bytes of those batches.",
        pulls.bytes as f64,
    );
    render_single(
        out,
        "tidal_pull_seconds_total",
        "counter",
        "Wall time of those pulls, from the request to the last chunk durable here.",
        pulls.seconds,
    );
    render_single(
        out,
        "tidal_office_handovers_total",
        "counter",
        "Offices this node won but could not take within the office deadline; each time it asks the voter with the greatest log to stand and stops its heartbeats.",
        replica.handovers() as f64,
    );
    let refusals = replica.refusals();
    out.push_str(
        "# HELP tidal_replication_refusals_total Replication input this node refused, by reason (see docs/OPERATIONS.md).\n",
    );
    out.push_str("# TYPE tidal_replication_refusals_total counter\n");
    for class in tidal_cluster::Refusal::ALL {
        let count = refusals.get(&class).copied().unwrap_or(0);
        let reason = class.as_str();
        out.push_str(&format!("tidal_replication_refusals_total{{reason=\"{reason}\"}} {count}\n"));
    }
    let notices = replica.notice_stats();
    out.push_str(
        "# HELP tidal_commit_notices_total Commit notices (decisions/016): sent/failed by a leader, received/advanced (moved the commit frontier) on a follower.\n",
    );
    out.push_str("# TYPE tidal_commit_notices_total counter\n");
    for (outcome, count) in [
        ("sent", notices.sent),
        ("failed", notices.failed),
        ("received", notices.received),
        ("advanced", notices.advanced),
    ] {
        out.push_str(&format!("tidal_commit_notices_total{{outcome=\"{outcome}\"}} {count}\n"));
    }
}

/// A leader's view of its followers: snapshot heals, matched positions, last answers, pulls.
fn render_follower_metrics(out: &mut String, replica: &tidal_cluster::Replica) {
    let healing = replica.snapshot_pins().pinned();
    out.push_str("# HELP tidal_follower_snapshot 1 while a follower is healed by a snapshot (behind the WAL retention budget).\n");
    out.push_str("# TYPE tidal_follower_snapshot gauge\n");
    for (id, _) in &healing {
        out.push_str(&format!("tidal_follower_snapshot{{node=\"{}\"}} 1\n", id.0));
    }
    let progress = replica.progress();
    if !progress.is_empty() {
        out.push_str("# HELP tidal_follower_matched_seqno Last seqno each follower matched in this term.\n");
        out.push_str("# TYPE tidal_follower_matched_seqno gauge\n");
        for (id, p) in &progress {
            out.push_str(&format!(
                "tidal_follower_matched_seqno{{node=\"{}\"}} {}\n",
                id.0,
                p.matched.seqno.get()
            ));
        }
        out.push_str("# HELP tidal_follower_last_ack_seconds Seconds since each follower last answered.\n");
        out.push_str("# TYPE tidal_follower_last_ack_seconds gauge\n");
        for (id, p) in &progress {
            if let Some(at) = p.last_ack {
                let age = at.elapsed().as_secs_f64();
                out.push_str(&format!("tidal_follower_last_ack_seconds{{node=\"{}\"}} {age}\n", id.0));
            }
        }
        out.push_str("# HELP tidal_follower_pulling 1 while a follower is caught up by pull.\n");
        out.push_str("# TYPE tidal_follower_pulling gauge\n");
        for (id, p) in &progress {
            out.push_str(&format!("tidal_follower_pulling{{node=\"{}\"}} {}\n", id.0, u8::from(p.pulling)));
        }
    }
}

/// The engine's flushes and state.
fn render_engine_metrics(out: &mut String, node: &Node) {
    let engine = node.db().stats();
    let flush = &engine.flush;
    let flush_bounds_ms = &tidal_core::FLUSH_DURATION_BUCKETS_MS;
    let flush_bounds_s: Vec<f64> =
        flush_bounds_ms[..flush_bounds_ms.len() - 1].iter().map(|ms| *ms as f64 / 1e3).collect();
    render_histogram(
        out,
        "tidal_engine_flush_duration_seconds",
        "Engine overlay flush (encode + one fjall batch), off the apply path.",
        &flush_bounds_s,
        &flush.duration_ms_buckets,
        flush.duration_ms_sum as f64 / 1e3,
    );
    for (name, kind, help, value) in [
        (
            "tidal_engine_flushes_total",
            "counter",
            "Engine overlay flushes committed to fjall.",
            flush.flushes as f64,
        ),
        (
            "tidal_engine_flush_entries_total",
            "counter",
            "Keys written by engine flushes.",
            flush.entries as f64,
        ),
        (
            "tidal_engine_flush_last_seconds",
            "gauge",
            "Duration of the last engine flush.",
            flush.last_duration_ms as f64 / 1e3,
        ),
        (
            "tidal_engine_flush_max_seconds",
            "gauge",
            "Longest engine flush.",
            flush.max_duration_ms as f64 / 1e3,
        ),
        (
            "tidal_engine_apply_backpressure_waits_total",
            "counter",
            "Applies that waited for an in-flight flush (the overlay filled faster than fjall took it).",
            flush.backpressure_waits as f64,
        ),
        (
            "tidal_engine_apply_backpressure_wait_seconds_total",
            "counter",
            "Time applies spent waiting for flushes.",
            flush.backpressure_wait_ms_sum as f64 / 1e3,
        ),
        (
            "tidal_engine_seen_merges_total",
            "counter",
            "Users whose stored seen entries a flush merged into one chunk (a read found too many).",
            flush.seen_merged as f64,
        ),
        (
            "tidal_engine_flush_in_flight",
            "gauge",
            "Whether an engine flush is running.",
            f64::from(u8::from(flush.in_flight)),
        ),
        (
            "tidal_engine_flush_in_flight_seconds",
            "gauge",
            "How long the engine flush in flight has run (0: none); applies stop once the next overlay fills behind a flush that never ends.",
            flush.in_flight_ms as f64 / 1e3,
        ),
        (
            "tidal_engine_flush_failed",
            "gauge",
            "1 when an engine flush failed (fatal).",
            f64::from(u8::from(flush.failed)),
        ),
        (
            "tidal_engine_flushed_applied_seqno",
            "gauge",
            "Applied seqno fjall holds (a crash replays the WAL from here).",
            engine.flushed_applied_seqno.get() as f64,
        ),
    ] {
        render_single(out, name, kind, help, value);
    }
    render_single(
        out,
        "tidal_checkpoint_seqno",
        "gauge",
        "Engine checkpoint.",
        node.checkpoint_seqno() as f64,
    );
    render_feed_index_metrics(out, &engine);
}

/// The ranking index's memory and the approximate index's lists (decisions/067).
fn render_feed_index_metrics(out: &mut String, engine: &tidal_core::EngineStats) {
    for (name, help, value) in [
        (
            "tidal_feed_index_bytes",
            "Memory of the in-memory ranking index: embeddings and the approximate index (decisions/067).",
            engine.feed_index_bytes + engine.ann_index_bytes,
        ),
        (
            "tidal_feed_ann_index_bytes",
            "Memory of the approximate feed index (lists, centroids, trend order); 0 until it exists.",
            engine.ann_index_bytes,
        ),
        (
            "tidal_feed_ann_lists",
            "Lists of the approximate feed index; 0 until its centroids are chosen.",
            engine.ann_lists,
        ),
    ] {
        render_single(out, name, "gauge", help, value as f64);
    }
}

/// What a crash would replay past the last checkpoint, and the checkpoints taken by reason (issue 43).
fn render_checkpoint_metrics(out: &mut String, node: &Node) {
    let past = node.past_checkpoint(Duration::ZERO);
    render_single(
        out,
        "tidal_engine_memtable_bytes",
        "gauge",
        "Bytes in the engine's fjall memtables: journal entries no table holds yet, which an open after a crash replays (bound: checkpoint_engine_bytes_max).",
        past.engine_bytes as f64,
    );
    render_single(
        out,
        "tidal_wal_bytes_since_checkpoint",
        "gauge",
        "WAL bytes written since the last checkpoint began (bound: checkpoint_wal_bytes_max).",
        past.wal_bytes as f64,
    );
    out.push_str(
        "# HELP tidal_checkpoints_total Engine checkpoints since the node opened, by what called for them.\n",
    );
    out.push_str("# TYPE tidal_checkpoints_total counter\n");
    for reason in crate::node::checkpoints::CheckpointReason::ALL {
        let count = node.checkpoints().count(reason);
        out.push_str(&format!("tidal_checkpoints_total{{reason=\"{}\"}} {count}\n", reason.label()));
    }
}

/// Whether this node is healthy, and which fatal fault it raised if any.
fn render_fatal_metrics(out: &mut String, node: &Node) {
    let fatal = node.fatal();
    render_single(out, "tidal_up", "gauge", "1 while the node can take writes.", f64::from(fatal.is_none()));
    out.push_str(
        "# HELP tidal_fatal 1 once a fatal storage fault stopped the node, by source (decisions/059): it leaves office and exits.\n",
    );
    out.push_str("# TYPE tidal_fatal gauge\n");
    for source in tidal_cluster::FatalSource::ALL {
        let raised = fatal.as_ref().is_some_and(|fatal| fatal.source == source);
        out.push_str(&format!("tidal_fatal{{source=\"{source}\"}} {}\n", u8::from(raised)));
    }
}

async fn fallback() -> ApiError {
    ApiError::not_found("no such route")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tower_service::Service as _;

    /// Every method a route may name.
    const METHODS: [Method; 9] = [
        Method::CONNECT,
        Method::DELETE,
        Method::GET,
        Method::HEAD,
        Method::OPTIONS,
        Method::PATCH,
        Method::POST,
        Method::PUT,
        Method::TRACE,
    ];

    /// A concrete path the pattern matches.
    fn concrete(pattern: &str) -> String {
        pattern
            .split('/')
            .map(|part| if part.starts_with('{') { "1" } else { part })
            .collect::<Vec<_>>()
            .join("/")
    }

    fn index_of(route: &Route) -> usize {
        ROUTES.iter().position(|other| std::ptr::eq(other, route)).unwrap()
    }

    #[test]
    fn every_route_needs_a_scope_but_the_probes_and_the_page() {
        for route in ROUTES {
            // The probes, the page and the API's own description hold no data.
            let probe = ["/healthz", "/readyz", "/ui", "/openapi.json"].contains(&route.path);
            match route.access {
                Access::Open => assert!(probe, "{} is open to callers without a token", route.path),
                Access::Needs(_) => assert!(!probe, "{} must answer without a token", route.path),
            }
        }
    }

    #[test]
    fn log_writes_and_leader_verbs_are_served_on_the_leader() {
        for route in ROUTES {
            let write = route.methods.or(MethodFilter::GET) != MethodFilter::GET;
            let in_log = route.path.starts_with("/v1/") && !route.path.contains("/negatives");
            if write && in_log {
                // Always forwarded: `Leader`, or `LeaderLongPoll` for the receive that may wait.
                assert!(route.serve.on_leader(None), "{}", route.path);
                assert!(matches!(route.serve, Serve::Leader | Serve::LeaderLongPoll), "{}", route.path);
            }
        }
        assert!(Serve::LeaderIfLinearizable.on_leader(Some("min_seqno=3&consistency=linearizable")));
        assert!(!Serve::LeaderIfLinearizable.on_leader(Some("consistency=applied")));
        assert!(!Serve::Anywhere.on_leader(Some("consistency=linearizable")));
    }

    /// The router built from the table answers each route's methods with that route's handler (and
    /// the middleware's lookup finds that route), every other method of its path with 405, and any
    /// other path with 404.
    #[tokio::test]
    async fn the_router_serves_exactly_the_table() {
        let mut router = table_router(|route| {
            let own = index_of(route);
            axum::routing::on(route.methods, move |matched: MatchedPath, method: Method| async move {
                let found = Route::find(&method, Some(matched.as_str())).map(index_of);
                [("x-route", format!("{own} {found:?}"))]
            })
        });
        for route in ROUTES {
            for method in METHODS {
                let expected =
                    ROUTES.iter().position(|other| other.path == route.path && other.answers(&method));
                let request = Request::builder()
                    .method(&method)
                    .uri(concrete(route.path))
                    .body(axum::body::Body::empty())
                    .unwrap();
                let response = router.call(request).await.unwrap();
                match expected {
                    Some(index) => {
                        assert_eq!(response.status(), StatusCode::OK, "{method} {}", route.path);
                        let header = response.headers()["x-route"].to_str().unwrap().to_string();
                        assert_eq!(header, format!("{index} Some({index})"), "{method} {}", route.path);
                    }
                    None => assert_eq!(
                        response.status(),
                        StatusCode::METHOD_NOT_ALLOWED,
                        "{method} {}",
                        route.path
                    ),
                }
            }
        }
        let request = Request::builder().uri("/v2/nothing").body(axum::body::Body::empty()).unwrap();
        assert_eq!(router.call(request).await.unwrap().status(), StatusCode::NOT_FOUND);
    }

    #[test]
    fn a_request_no_route_takes_needs_the_scope_its_method_implies_and_is_answered_here() {
        assert_eq!(
            Policy::of(&Method::GET, None),
            Policy { access: Access::Needs(Scope::Read), serve: Serve::Anywhere }
        );
        assert_eq!(
            Policy::of(&Method::POST, Some("/v1/trending")),
            Policy { access: Access::Needs(Scope::Write), serve: Serve::Anywhere }
        );
        assert_eq!(Policy::of(&Method::HEAD, Some("/healthz")).access, Access::Open);
    }
}
