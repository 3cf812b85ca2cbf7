//! The replication service: decodes and checks requests, hands domain messages to a [`Handler`]
//! (tidal-cluster implements it), and encodes the answers.
//!
//! The server takes an incoming connection stream and a shutdown future, never binds a socket
//! itself, so the simulation can run it over simulated TCP. Every call must carry the cluster secret
//! ([`crate::auth`]) and name this cluster; anything else is refused before the handler sees it.

use crate::auth::SecretCheck;
use crate::control::{check_raft_payload, Probe, ProbeReply, RaftCall};
use crate::message::{Chunk, Pull, Ship, ShipAnswer, MESSAGE_BATCH_BYTES_MAX};
use crate::pb;
use crate::pb::replication_server::{Replication, ReplicationServer};
use crate::snapshot_message::{SnapshotChunk, SnapshotRequest};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tidal_types::{NodeId, Seqno, Term};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

/// A stream of pull chunks.
pub type ChunkStream = Pin<Box<dyn Stream<Item = Result<Chunk, ServiceError>> + Send + 'static>>;
/// A stream of snapshot chunks.
pub type SnapshotStream = Pin<Box<dyn Stream<Item = Result<SnapshotChunk, ServiceError>> + Send + 'static>>;

/// A node's answer to a request to stand for election (leadership transfer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Election {
    /// It started an election.
    Started,
    /// It did not, and says why (a stale request, a sender that does not lead its term).
    Refused(String),
}

/// What a request to stand for election asks of a voter (decisions/068).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElectMode {
    /// Stand in the next term, once the leases allow.
    Stand,
    /// The asker is the restarted leader of the term and will never serve it again: give up the
    /// lease granted to it by campaigning now in the next term.
    Release,
    /// Release this node's own lease, then stand in the term after that, above the campaigns of
    /// the voters that released theirs.
    StandPastReleased,
}

impl ElectMode {
    pub(crate) fn to_wire(self) -> pb::ElectMode {
        match self {
            ElectMode::Stand => pb::ElectMode::Stand,
            ElectMode::Release => pb::ElectMode::Release,
            ElectMode::StandPastReleased => pb::ElectMode::StandPastReleased,
        }
    }

    /// An unknown value (a newer sender) is refused by the service, not guessed at.
    pub(crate) fn from_wire(value: i32) -> Option<ElectMode> {
        match pb::ElectMode::try_from(value).ok()? {
            pb::ElectMode::Stand => Some(ElectMode::Stand),
            pb::ElectMode::Release => Some(ElectMode::Release),
            pb::ElectMode::StandPastReleased => Some(ElectMode::StandPastReleased),
        }
    }
}

/// Why a node did not serve a replication call at all (a refusal of a ship is an answer, not this).
/// The service turns it into the RPC's status, so a [`Handler`] never names the transport's types.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ServiceError {
    /// The caller may not make this call (it is not a member).
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// The call is malformed.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Not now: retry later (say the control plane has not started yet).
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// Too many such calls run already.
    #[error("resource exhausted: {0}")]
    ResourceExhausted(String),
    /// This node does not serve this call.
    #[error("unimplemented: {0}")]
    Unimplemented(String),
    /// Serving it failed here (a read error, say).
    #[error("internal: {0}")]
    Internal(String),
}

impl From<ServiceError> for Status {
    fn from(error: ServiceError) -> Status {
        match error {
            ServiceError::PermissionDenied(why) => Status::permission_denied(why),
            ServiceError::InvalidArgument(why) => Status::invalid_argument(why),
            ServiceError::Unavailable(why) => Status::unavailable(why),
            ServiceError::ResourceExhausted(why) => Status::resource_exhausted(why),
            ServiceError::Unimplemented(why) => Status::unimplemented(why),
            ServiceError::Internal(why) => Status::internal(why),
        }
    }
}

/// Most users' states in one hard-negatives page.
pub const NEGATIVES_PAGE_MAX: u32 = 1024;

/// A page of hard-negatives states: the serving node's negatives digest and `(user, encoded
/// state)` pairs.
pub type NegativesPage = (Vec<u8>, Vec<(String, Vec<u8>)>);

/// What a node does with replication requests. Refusals are answers (in [`ShipAnswer`]), not
/// errors; an `Err` is for requests the node cannot serve at all.
#[tonic::async_trait]
pub trait Handler: Send + Sync + 'static {
    /// The cluster this node belongs to.
    fn cluster_id(&self) -> &str;
    /// A request refused before the handler saw it, for metrics. The service logs it.
    fn refused(&self, _why: ServiceRefusal) {}
    /// A ship (or heartbeat) from the leader.
    async fn ship(&self, ship: Ship) -> Result<ShipAnswer, ServiceError>;
    /// A commit notice from the leader of `term` (sent while a ship to us is in flight): apply what
    /// we hold of its log up to `commit`. Returns our term. Advisory: the default ignores it (the
    /// next ship carries the frontier too).
    async fn commit(&self, term: Term, _leader: NodeId, _commit: Seqno) -> Result<Term, ServiceError> {
        Ok(term)
    }
    /// A pull from a follower: batches after `pull.from`.
    async fn pull(&self, pull: Pull) -> Result<ChunkStream, ServiceError>;
    /// The catch-up nudge: pull now. Returns whether a pull was started.
    async fn nudge(&self, reason: String) -> Result<bool, ServiceError>;
    /// A probe from a node taking office.
    async fn probe(&self, _probe: Probe) -> Result<ProbeReply, ServiceError> {
        Err(ServiceError::Unimplemented("this node does not answer probes".into()))
    }
    /// An openraft RPC; returns the encoded response.
    async fn raft(&self, _call: RaftCall) -> Result<Vec<u8>, ServiceError> {
        Err(ServiceError::Unimplemented("this node runs no control plane".into()))
    }
    /// The leader asks this node to stand for election (leadership transfer, a restored office's
    /// hand-over), no sooner than `not_before` from now, or to release the lease it granted (`mode`).
    async fn elect(
        &self,
        _term: u64,
        _leader: u64,
        _not_before: Duration,
        _mode: ElectMode,
    ) -> Result<Election, ServiceError> {
        Err(ServiceError::Unimplemented("this node runs no control plane".into()))
    }
    /// A page of hard-negatives states for anti-entropy: `(digest, [(user, encoded state)])`.
    async fn negatives(&self, _after_user: String, _limit: u32) -> Result<NegativesPage, ServiceError> {
        Err(ServiceError::Unimplemented("this node serves no hard negatives".into()))
    }
    /// A snapshot request from a follower behind our purge point: the chunks of a snapshot of our
    /// state (tidal-cluster's `SnapshotSource::serve`). A node that serves none keeps the default.
    async fn snapshot(&self, _request: SnapshotRequest) -> Result<SnapshotStream, ServiceError> {
        Err(ServiceError::Unimplemented("this node serves no snapshots".into()))
    }
}

/// Adapts a [`Handler`] to the generated service.
pub struct Service<H> {
    handler: Arc<H>,
    /// Turns true when the server starts shutting down: the long-lived streams end then, since a
    /// graceful shutdown waits for every open call and the leader never ends its streams itself.
    closing: tokio::sync::watch::Receiver<bool>,
}

fn invalid(error: impl std::fmt::Display) -> Status {
    Status::invalid_argument(error.to_string())
}

/// Why the service itself refused a request, before its handler saw it ([`Handler::refused`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceRefusal {
    /// The call did not carry the cluster secret.
    WrongSecret,
    /// The request names another cluster.
    WrongCluster,
    /// The request could not be decoded, or is too large.
    Malformed,
}

impl<H: Handler> Service<H> {
    fn check_cluster(&self, cluster_id: &str) -> Result<(), Status> {
        if cluster_id == self.handler.cluster_id() {
            Ok(())
        } else {
            let reason = format!(
                "request for cluster {cluster_id:?}, this node belongs to {:?}",
                self.handler.cluster_id()
            );
            tracing::warn!("refused an RPC: {reason}");
            self.handler.refused(ServiceRefusal::WrongCluster);
            Err(Status::permission_denied(reason))
        }
    }

    /// Answers `requests` one at a time, in order, with `answer`; the stream ends at the first
    /// error or when the server starts closing.
    fn in_order<Req, Rep, Answer, Answering>(
        &self,
        requests: tonic::Streaming<Req>,
        answer: Answer,
    ) -> Outgoing<Rep>
    where
        Req: Send + 'static,
        Rep: Send + 'static,
        Answer: Fn(Arc<Service<H>>, Req) -> Answering + Send + 'static,
        Answering: std::future::Future<Output = Result<Rep, Status>> + Send + 'static,
    {
        let service = Arc::new(Service { handler: self.handler.clone(), closing: self.closing.clone() });
        let replies = requests.then(move |request| {
            let answering = request.map(|request| answer(service.clone(), request));
            async move { answering?.await }
        });
        Box::pin(UntilClosing::new(Box::pin(replies), self.closing.clone()))
    }

    /// One ship, from either RPC.
    async fn ship_one(&self, request: pb::ShipRequest) -> Result<pb::ShipReply, Status> {
        self.check_cluster(&request.cluster_id)?;
        let ship = Ship::try_from(request).map_err(|e| self.malformed("ship", e))?;
        let answer = self.handler.ship(ship).await?;
        Ok(pb::ShipReply::from(&answer))
    }

    /// One commit notice, from either RPC.
    async fn commit_one(&self, request: pb::CommitRequest) -> Result<pb::CommitReply, Status> {
        self.check_cluster(&request.cluster_id)?;
        let term = self
            .handler
            .commit(Term(request.term), NodeId(request.leader_id), Seqno(request.commit_seqno))
            .await?;
        Ok(pb::CommitReply { term: term.0 })
    }

    /// A request that did not decode (corrupt batch, bad field, oversize): logged and counted.
    fn malformed(&self, call: &str, error: impl std::fmt::Display) -> Status {
        tracing::warn!("refused a malformed {call} RPC: {error}");
        self.handler.refused(ServiceRefusal::Malformed);
        invalid(error)
    }
}

type Outgoing<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl<H: Handler> Replication for Service<H> {
    async fn ship_segment(
        &self,
        request: Request<pb::ShipRequest>,
    ) -> Result<Response<pb::ShipReply>, Status> {
        Ok(Response::new(self.ship_one(request.into_inner()).await?))
    }

    type ShipStreamStream = Outgoing<pb::ShipReply>;

    /// Each request is decided as a [`Replication::ship_segment`] call would be, one at a time and
    /// in order: the next request is read only once this one's reply is out. The first error ends
    /// the stream with its status (the leader opens another).
    async fn ship_stream(
        &self,
        request: Request<tonic::Streaming<pb::ShipRequest>>,
    ) -> Result<Response<Self::ShipStreamStream>, Status> {
        Ok(Response::new(self.in_order(request.into_inner(), |service, request| async move {
            service.ship_one(request).await
        })))
    }

    async fn commit(&self, request: Request<pb::CommitRequest>) -> Result<Response<pb::CommitReply>, Status> {
        Ok(Response::new(self.commit_one(request.into_inner()).await?))
    }

    type CommitStreamStream = Outgoing<pb::CommitReply>;

    /// Commit notices on one stream, each handled as a [`Replication::commit`] call would be, one
    /// at a time and in order; a quiet one is answered with nothing (its error still ends the
    /// stream).
    async fn commit_stream(
        &self,
        request: Request<tonic::Streaming<pb::CommitRequest>>,
    ) -> Result<Response<Self::CommitStreamStream>, Status> {
        // A quiet notice's sender reads no reply (decisions/027): it gets none.
        let replies = self.in_order(request.into_inner(), |service, request| async move {
            let quiet = request.quiet;
            let reply = service.commit_one(request).await?;
            Ok((!quiet).then_some(reply))
        });
        Ok(Response::new(Box::pin(
            replies.filter_map(|reply: Result<Option<pb::CommitReply>, Status>| reply.transpose()),
        )))
    }

    type StreamSegmentsStream = Outgoing<pb::PullChunk>;

    async fn stream_segments(
        &self,
        request: Request<pb::PullRequest>,
    ) -> Result<Response<Self::StreamSegmentsStream>, Status> {
        let request = request.into_inner();
        self.check_cluster(&request.cluster_id)?;
        let pull = Pull::try_from(request).map_err(|e| self.malformed("pull", e))?;
        let chunks = self.handler.pull(pull).await?;
        let encoded = chunks.map(|chunk| chunk.map(pb::PullChunk::from).map_err(Status::from));
        Ok(Response::new(Box::pin(encoded)))
    }

    async fn probe(&self, request: Request<pb::ProbeRequest>) -> Result<Response<pb::ProbeReply>, Status> {
        let request = request.into_inner();
        self.check_cluster(&request.cluster_id)?;
        let reply = self.handler.probe(Probe::from(request)).await?;
        Ok(Response::new(pb::ProbeReply::from(&reply)))
    }

    type SnapshotStream = Outgoing<pb::SnapshotChunk>;

    async fn snapshot(
        &self,
        request: Request<pb::SnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        let request = SnapshotRequest::from(request.into_inner());
        self.check_cluster(&request.cluster_id)?;
        let chunks = self.handler.snapshot(request).await?;
        let encoded = chunks.map(|chunk| chunk.map(pb::SnapshotChunk::from).map_err(Status::from));
        Ok(Response::new(Box::pin(encoded)))
    }

    async fn nudge(&self, request: Request<pb::NudgeRequest>) -> Result<Response<pb::NudgeReply>, Status> {
        let request = request.into_inner();
        self.check_cluster(&request.cluster_id)?;
        let started = self.handler.nudge(request.reason).await?;
        Ok(Response::new(pb::NudgeReply { started }))
    }

    async fn elect(&self, request: Request<pb::ElectRequest>) -> Result<Response<pb::ElectReply>, Status> {
        let request = request.into_inner();
        self.check_cluster(&request.cluster_id)?;
        let not_before = Duration::from_micros(request.not_before_us);
        let Some(mode) = ElectMode::from_wire(request.mode) else {
            return Err(Status::invalid_argument(format!("unknown election mode {}", request.mode)));
        };
        let reply = match self.handler.elect(request.term, request.leader, not_before, mode).await? {
            Election::Started => pb::ElectReply { started: true, reason: String::new() },
            Election::Refused(reason) => pb::ElectReply { started: false, reason },
        };
        Ok(Response::new(reply))
    }

    async fn negatives(
        &self,
        request: Request<pb::NegativesRequest>,
    ) -> Result<Response<pb::NegativesReply>, Status> {
        let request = request.into_inner();
        self.check_cluster(&request.cluster_id)?;
        if request.limit > NEGATIVES_PAGE_MAX {
            return Err(self
                .malformed("negatives", format!("page limit {} over {NEGATIVES_PAGE_MAX}", request.limit)));
        }
        let (digest, entries) = self.handler.negatives(request.after_user, request.limit).await?;
        let entries = entries.into_iter().map(|(user, state)| pb::NegativesEntry { user, state }).collect();
        Ok(Response::new(pb::NegativesReply { entries, digest }))
    }

    async fn raft(&self, request: Request<pb::RaftRequest>) -> Result<Response<pb::RaftReply>, Status> {
        let request = request.into_inner();
        self.check_cluster(&request.cluster_id)?;
        check_raft_payload(&request.payload).map_err(|e| self.malformed("raft", e))?;
        let payload = self.handler.raft(RaftCall { kind: request.kind, payload: request.payload }).await?;
        Ok(Response::new(pb::RaftReply { payload }))
    }
}

/// A long-lived stream of replies that ends once its server starts shutting down (an exchange in
/// progress is dropped, as when its client goes away: the leader sends it again).
struct UntilClosing<S> {
    replies: S,
    closed: Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
}

impl<S> UntilClosing<S> {
    fn new(replies: S, mut closing: tokio::sync::watch::Receiver<bool>) -> UntilClosing<S> {
        let closed = Box::pin(async move {
            // A dropped sender means the server is gone: closed too.
            let _ = closing.wait_for(|closing| *closing).await;
        });
        UntilClosing { replies, closed }
    }
}

impl<S: Stream + Unpin> Stream for UntilClosing<S> {
    type Item = S::Item;

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<S::Item>> {
        if self.closed.as_mut().poll(cx).is_ready() {
            return std::task::Poll::Ready(None);
        }
        Pin::new(&mut self.replies).poll_next(cx)
    }
}

/// What the server's ship links share (decisions/071).
struct LinkSide<H> {
    service: Arc<Service<H>>,
    check: SecretCheck,
    log_limit: Arc<tidal_types::LogLimit>,
}

impl<H> Clone for LinkSide<H> {
    fn clone(&self) -> LinkSide<H> {
        LinkSide {
            service: self.service.clone(),
            check: self.check.clone(),
            log_limit: self.log_limit.clone(),
        }
    }
}

impl<H: Handler> LinkSide<H> {
    /// Serves one ship link: its hello must carry the secret; each ship is decided as on the stream.
    async fn serve<IO>(self, io: IO)
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + tonic::transport::server::Connected + Unpin,
    {
        let info = io.connect_info();
        // The RPC port's connections carry a Proof (tidal-server protects proven ones from eviction).
        let proof = (&info as &dyn std::any::Any).downcast_ref::<crate::Proof>().cloned();
        let LinkSide { service, check, log_limit } = self;
        let server = crate::ship_link::LinkServer {
            check: |authorization: &[u8]| {
                let matches = check.matches(authorization);
                if !matches {
                    if let Some(suppressed) = log_limit.admit(std::time::Instant::now()) {
                        tracing::warn!(suppressed, "refused a ship link without the cluster secret");
                    }
                    service.handler.refused(ServiceRefusal::WrongSecret);
                }
                matches
            },
            answer: |request| service.ship_one(request),
        };
        let proven = || {
            if let Some(proof) = proof {
                proof.proven();
            }
        };
        crate::ship_link::serve_link(io, server, proven, service.closing.clone()).await;
    }
}

/// Serves `handler` on `incoming` until `shutdown` resolves.
pub async fn serve<H, I, IO, IE>(
    handler: Arc<H>,
    secret: &str,
    incoming: I,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error>
where
    H: Handler,
    I: Stream<Item = Result<IO, IE>> + Send + 'static,
    IO: tokio::io::AsyncRead
        + tokio::io::AsyncWrite
        + tonic::transport::server::Connected
        + Unpin
        + Send
        + 'static,
    IE: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    let check = SecretCheck::new(secret);
    let refusals = handler.clone();
    // Anyone who reaches the port can send refused RPCs: at most 10 log lines a second.
    let log_limit = Arc::new(tidal_types::LogLimit::new(10, std::time::Duration::from_secs(1)));
    // Tonic polls its shutdown signal only while it accepts: when `incoming` ends first (ours end
    // at the same shutdown), the signal is never polled again. So the signal that ends the streams
    // is driven here, beside the server, not by tonic.
    let (close, closing) = tokio::sync::watch::channel(false);
    let mut closed = closing.clone();
    let signal = async move {
        let _ = closed.wait_for(|closing| *closing).await;
    };
    let links = LinkSide {
        service: Arc::new(Service { handler: handler.clone(), closing: closing.clone() }),
        check: check.clone(),
        log_limit: log_limit.clone(),
    };
    let incoming = crate::ship_link::sorted(incoming, move |io: IO| links.clone().serve(io));
    let service = ReplicationServer::new(Service { handler, closing })
        .max_decoding_message_size(MESSAGE_BATCH_BYTES_MAX + 1024 * 1024)
        .max_encoding_message_size(MESSAGE_BATCH_BYTES_MAX + 1024 * 1024);
    let intercepted =
        tonic::service::interceptor::InterceptedService::new(service, move |request: tonic::Request<()>| {
            let proof = request.extensions().get::<crate::Proof>().cloned();
            let checked = check.check(request).inspect_err(|_| {
                if let Some(suppressed) = log_limit.admit(std::time::Instant::now()) {
                    tracing::warn!(suppressed, "refused an RPC without the cluster secret");
                }
                refusals.refused(ServiceRefusal::WrongSecret);
            })?;
            if let Some(proof) = proof {
                proof.proven();
            }
            Ok(checked)
        });
    let serving = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        // Calls a client gave up on (a late heartbeat under load) must not make h2's rapid-reset
        // guard close the connection every other RPC shares; the default allows 20.
        .http2_max_pending_accept_reset_streams(Some(1024))
        .initial_stream_window_size(crate::client::H2_STREAM_WINDOW)
        .initial_connection_window_size(crate::client::H2_CONNECTION_WINDOW)
        .max_frame_size(crate::client::H2_FRAME_SIZE_MAX)
        .add_service(intercepted)
        .serve_with_incoming_shutdown(incoming, signal);
    tokio::pin!(serving);
    tokio::select! {
        served = &mut serving => return served,
        () = shutdown => {
            let _ = close.send(true);
        }
    }
    serving.await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_election_mode_survives_the_wire_and_an_unknown_one_is_refused() {
        for mode in [ElectMode::Stand, ElectMode::Release, ElectMode::StandPastReleased] {
            assert_eq!(ElectMode::from_wire(mode.to_wire().into()), Some(mode));
        }
        // An older sender leaves the field out: prost reads 0, which is a plain stand.
        assert_eq!(ElectMode::from_wire(0), Some(ElectMode::Stand));
        for garbage in [3, -1, i32::MAX, i32::MIN] {
            assert_eq!(ElectMode::from_wire(garbage), None, "{garbage}");
        }
    }
}
