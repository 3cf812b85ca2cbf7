//! A connection to one peer: ship, pull, nudge, each with a deadline (every RPC has one: a lost
//! message must not hang a queue).

use crate::auth::SecretAttach;
use crate::connector::{Connector, ControlTap, ShipTap};
use crate::control::{check_raft_payload, Probe, ProbeReply, RaftCall};
use crate::message::{Chunk, Pull, Ship, ShipAnswer, WireError, MESSAGE_BATCH_BYTES_MAX};
use crate::pb;
use crate::pb::replication_client::ReplicationClient;
use crate::ship_link::Linked;
use crate::snapshot_message::{SnapshotChunk, SnapshotRequest};
use crate::stream_path::{Exchanged, NotSent, OneWayPath, StreamPath};
use std::time::Duration;
use tidal_types::{NodeId, Seqno, Term};
use tokio_stream::{Stream, StreamExt};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

/// Deadline of a ship: generous for a 64 MiB batch on a slow link, short enough that a dead peer
/// is noticed within seconds.
pub const SHIP_TIMEOUT: Duration = Duration::from_secs(10);
/// Decoded pull chunks held ahead of the caller (each at most one chunk's bytes, 4 MiB by default).
pub const PULL_PREFETCH_CHUNKS: usize = 2;
/// HTTP/2 receive windows and the largest DATA frame we accept, on both ends of every peer
/// connection. The defaults (16 KiB frames; 1-2 MiB stream windows) cut a 4 MiB pull chunk into
/// 256 frames and make the sender wait for window updates within each chunk. The connection
/// window bounds what a peer may send ahead of our reading (experiments/041): a puller reads
/// through [`PULL_PREFETCH_CHUNKS`] chunks, and a ship is one message of at most 4 MiB.
pub const H2_STREAM_WINDOW: u32 = 8 * 1024 * 1024;
/// See [`H2_STREAM_WINDOW`].
pub const H2_CONNECTION_WINDOW: u32 = 16 * 1024 * 1024;
/// See [`H2_STREAM_WINDOW`].
pub const H2_FRAME_SIZE_MAX: u32 = 1024 * 1024;
/// Bound on establishing a connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How often an HTTP/2 ping checks a peer connection.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(2);
/// A connection whose ping is not answered within this is dropped (the channel reconnects).
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(3);

/// Why a call failed. The outcome of a ship that failed with `Transport` is unknown.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// The peer answered with an error status.
    #[error("peer answered {0}")]
    Status(#[from] tonic::Status),
    /// The peer's answer does not decode.
    #[error("peer sent a bad answer: {0}")]
    Wire(#[from] WireError),
    /// Bad address or secret.
    #[error("{0}")]
    Config(String),
}

type Client = ReplicationClient<InterceptedService<Channel, SecretAttach>>;

/// A lazily connected peer.
#[derive(Clone)]
pub struct Peer {
    client: Client,
    cluster_id: String,
    address: String,
    /// Ships, on a connection of their own shared by clones (decisions/071).
    link: std::sync::Arc<crate::ship_link::ShipLink>,
    /// Ships to a peer that has no ship link, on one stream shared by clones (decisions/026).
    ships: std::sync::Arc<StreamPath<pb::ShipRequest, pb::ShipReply>>,
    /// Commit notices, on another.
    notices: std::sync::Arc<StreamPath<pb::CommitRequest, pb::CommitReply>>,
    /// Quiet commit notices (no reply), on a third (decisions/027).
    quiet_notices: std::sync::Arc<OneWayPath<pb::CommitRequest>>,
    /// The connector's ship tap (simulation only; `None` in production).
    ship_tap: Option<std::sync::Arc<dyn ShipTap>>,
    /// The connector's control tap (simulation only; `None` in production).
    control_tap: Option<std::sync::Arc<dyn ControlTap>>,
}

impl Peer {
    /// A peer at `address` (`host:port`) over the OS's TCP, connected on first use.
    pub fn connect_lazy(address: &str, secret: &str, cluster_id: &str) -> Result<Peer, NetError> {
        Peer::connect_lazy_with(address, secret, cluster_id, &Connector::tcp())
    }

    /// A peer at `address` (`host:port`) reached through `connector`, connected on first use.
    pub fn connect_lazy_with(
        address: &str,
        secret: &str,
        cluster_id: &str,
        connector: &Connector,
    ) -> Result<Peer, NetError> {
        let endpoint = Endpoint::from_shared(format!("http://{address}"))
            .map_err(|error| NetError::Config(format!("bad peer address {address:?}: {error}")))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            // A connection whose peer vanished without a reset (power loss, a silently dropped
            // segment) would otherwise hang every later call until its deadline, forever: HTTP/2
            // pings detect it and the channel reconnects (found by chaos/sim, decisions/008).
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true)
            .initial_stream_window_size(H2_STREAM_WINDOW)
            .initial_connection_window_size(H2_CONNECTION_WINDOW)
            .max_frame_size(H2_FRAME_SIZE_MAX);
        let attach = SecretAttach::new(secret)?;
        let channel = match connector.custom() {
            None => endpoint.connect_lazy(),
            Some(service) => endpoint.connect_with_connector_lazy(service),
        };
        let client = ReplicationClient::with_interceptor(channel, attach)
            .max_decoding_message_size(MESSAGE_BATCH_BYTES_MAX + 1024 * 1024)
            .max_encoding_message_size(MESSAGE_BATCH_BYTES_MAX + 1024 * 1024);
        Ok(Peer {
            client,
            link: std::sync::Arc::new(crate::ship_link::ShipLink::new(
                address,
                secret,
                connector.connect_fn(),
            )),
            cluster_id: cluster_id.to_string(),
            address: address.to_string(),
            ships: std::sync::Arc::new(StreamPath::new()),
            notices: std::sync::Arc::new(StreamPath::new()),
            quiet_notices: std::sync::Arc::new(OneWayPath::new()),
            ship_tap: connector.ship_tap(),
            control_tap: connector.control_tap(),
        })
    }

    /// The peer's address.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Sends a ship and waits for the answer (bounded by [`SHIP_TIMEOUT`]).
    pub async fn ship(&self, ship: &Ship) -> Result<ShipAnswer, NetError> {
        let answer = self.ship_once(ship).await;
        if let Some(tap) = &self.ship_tap {
            let untapped = Peer { ship_tap: None, ..self.clone() };
            tap.shipped(&untapped, ship);
        }
        answer
    }

    async fn ship_once(&self, ship: &Ship) -> Result<ShipAnswer, NetError> {
        let request = pb::ShipRequest::from(ship);
        if let Linked::Reply(reply) = self.link.exchange(&request, SHIP_TIMEOUT).await? {
            return Ok(ShipAnswer::try_from(reply)?);
        }
        if self.ships.unary() {
            return self.ship_unary(request).await;
        }
        let client = self.client.clone();
        let open = move |requests| async move { client.clone().ship_stream(requests).await };
        match self.ships.exchange(request.clone(), SHIP_TIMEOUT, open).await? {
            Exchanged::Reply(reply) => Ok(ShipAnswer::try_from(reply)?),
            Exchanged::Unary => self.ship_unary(request).await,
        }
    }

    async fn ship_unary(&self, request: pb::ShipRequest) -> Result<ShipAnswer, NetError> {
        let mut request = tonic::Request::new(request);
        request.set_timeout(SHIP_TIMEOUT);
        let reply = self.client.clone().ship_segment(request).await?.into_inner();
        Ok(ShipAnswer::try_from(reply)?)
    }

    /// Sends a commit notice (the leader of `term` committed through `commit`); returns the peer's
    /// term. Bounded by `timeout`: a notice is only worth anything while it is fresh.
    pub async fn commit(
        &self,
        term: Term,
        leader: NodeId,
        commit: Seqno,
        timeout: Duration,
    ) -> Result<Term, NetError> {
        let notice = || self.notice(term, leader, commit, false);
        let client = self.client.clone();
        let open = move |requests| async move { client.clone().commit_stream(requests).await };
        let reply = match self.notices.exchange(notice(), timeout, open).await? {
            Exchanged::Reply(reply) => reply,
            Exchanged::Unary => {
                let mut request = tonic::Request::new(notice());
                request.set_timeout(timeout);
                self.client.clone().commit(request).await?.into_inner()
            }
        };
        Ok(Term(reply.term))
    }

    /// Sends a quiet commit notice: queued on a stream whose replies nobody reads, never waited
    /// for, best effort (decisions/027). `Err(Unavailable)`: the peer takes no quiet notices (an
    /// older version, or streams are off): send the commit some other way.
    pub fn commit_quiet(&self, term: Term, leader: NodeId, commit: Seqno) -> Result<(), NotSent> {
        let client = self.client.clone();
        let open = move |requests| async move { client.clone().commit_stream(requests).await };
        self.quiet_notices.send(self.notice(term, leader, commit, true), open)
    }

    fn notice(&self, term: Term, leader: NodeId, commit: Seqno, quiet: bool) -> pb::CommitRequest {
        pb::CommitRequest {
            cluster_id: self.cluster_id.clone(),
            term: term.0,
            leader_id: leader.0,
            commit_seqno: commit.0,
            quiet,
        }
    }

    /// Starts a pull; the stream ends when the server has sent what it holds, or fails. With a
    /// [`ShipTap`] (simulation only) each chunk goes through [`ShipTap::pulled`].
    pub async fn pull(
        &self,
        pull: &Pull,
        idle_timeout: Duration,
    ) -> Result<impl Stream<Item = Result<Chunk, NetError>>, NetError> {
        let mut request = tonic::Request::new(pb::PullRequest::from(pull));
        request.set_timeout(idle_timeout);
        let stream = self.client.clone().stream_segments(request).await?.into_inner();
        let mut chunks = Tapped {
            inner: stream.map(|chunk| Ok(Chunk::try_from(chunk?)?)),
            tap: self.ship_tap.clone(),
            address: self.address.clone(),
            pending: std::collections::VecDeque::new(),
        };
        // Receive, decode and verify the next chunks while the caller appends this one, so their
        // BLAKE3 checks overlap its fsync. At most PULL_PREFETCH_CHUNKS decoded chunks wait here.
        let (tx, rx) = tokio::sync::mpsc::channel(PULL_PREFETCH_CHUNKS);
        tokio::spawn(async move {
            while let Some(chunk) = chunks.next().await {
                let failed = chunk.is_err();
                // A caller that stopped reading dropped the receiver: the pull is over.
                if tx.send(chunk).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(tokio_stream::wrappers::ReceiverStream::new(rx))
    }

    /// Asks the peer for its snapshot. The whole transfer must end within `deadline`; the caller
    /// bounds the wait for each chunk (a stalled stream must not hang an install).
    pub async fn snapshot(
        &self,
        node: NodeId,
        deadline: Duration,
    ) -> Result<impl Stream<Item = Result<SnapshotChunk, NetError>>, NetError> {
        let request = SnapshotRequest { cluster_id: self.cluster_id.clone(), node };
        let mut request = tonic::Request::new(pb::SnapshotRequest::from(&request));
        request.set_timeout(deadline);
        let stream = self.client.clone().snapshot(request).await?.into_inner();
        Ok(stream.map(|chunk| Ok(SnapshotChunk::try_from(chunk?)?)))
    }

    /// Asks the peer to pull now.
    pub async fn nudge(&self, reason: &str) -> Result<bool, NetError> {
        let mut request = tonic::Request::new(pb::NudgeRequest {
            cluster_id: self.cluster_id.clone(),
            reason: reason.to_string(),
        });
        request.set_timeout(SHIP_TIMEOUT);
        Ok(self.client.clone().nudge(request).await?.into_inner().started)
    }

    /// Asks the peer to stand for election, no sooner than `not_before` from now (zero: as soon as
    /// the lease it grants allows), or to release the lease it granted `leader` in `term` (`mode`).
    pub async fn elect(
        &self,
        term: u64,
        leader: u64,
        not_before: Duration,
        mode: crate::ElectMode,
    ) -> Result<crate::Election, NetError> {
        let not_before_us = u64::try_from(not_before.as_micros()).unwrap_or(u64::MAX);
        let request = pb::ElectRequest {
            cluster_id: self.cluster_id.clone(),
            term,
            leader,
            not_before_us,
            mode: mode.to_wire().into(),
        };
        let mut request = tonic::Request::new(request);
        request.set_timeout(SHIP_TIMEOUT);
        let reply = self.client.clone().elect(request).await?.into_inner();
        Ok(if reply.started { crate::Election::Started } else { crate::Election::Refused(reply.reason) })
    }

    /// A page of the peer's hard-negatives states after `after_user` (`limit` 0: only its digest).
    pub async fn negatives(
        &self,
        after_user: &str,
        limit: u32,
    ) -> Result<crate::server::NegativesPage, NetError> {
        let mut request = tonic::Request::new(pb::NegativesRequest {
            cluster_id: self.cluster_id.clone(),
            after_user: after_user.to_string(),
            limit,
        });
        request.set_timeout(SHIP_TIMEOUT);
        let reply = self.client.clone().negatives(request).await?.into_inner();
        Ok((reply.digest, reply.entries.into_iter().map(|e| (e.user, e.state)).collect()))
    }

    /// Probes the peer for its last durable position in `probe.term`.
    pub async fn probe(&self, probe: &Probe, timeout: Duration) -> Result<ProbeReply, NetError> {
        let answer = self.probe_once(probe, timeout).await;
        if let Some(tap) = &self.control_tap {
            let untapped = Peer { control_tap: None, ..self.clone() };
            tap.probed(&untapped, probe, timeout);
        }
        answer
    }

    async fn probe_once(&self, probe: &Probe, timeout: Duration) -> Result<ProbeReply, NetError> {
        let mut request = tonic::Request::new(pb::ProbeRequest::from(probe));
        request.set_timeout(timeout);
        let reply = self.client.clone().probe(request).await?.into_inner();
        Ok(ProbeReply::try_from(reply)?)
    }

    /// Sends one openraft RPC and returns the encoded response.
    pub async fn raft(&self, call: RaftCall, timeout: Duration) -> Result<Vec<u8>, NetError> {
        let Some(tap) = &self.control_tap else {
            return self.raft_once(call, timeout).await;
        };
        let copy = call.clone();
        let answer = self.raft_once(call, timeout).await;
        let untapped = Peer { control_tap: None, ..self.clone() };
        tap.raft_sent(&untapped, &copy, timeout);
        answer
    }

    async fn raft_once(&self, call: RaftCall, timeout: Duration) -> Result<Vec<u8>, NetError> {
        check_raft_payload(&call.payload)?;
        let mut request = tonic::Request::new(pb::RaftRequest {
            cluster_id: self.cluster_id.clone(),
            kind: call.kind,
            payload: call.payload,
        });
        request.set_timeout(timeout);
        let reply = self.client.clone().raft(request).await?.into_inner();
        check_raft_payload(&reply.payload)?;
        Ok(reply.payload)
    }
}

/// A pull's chunks, each handed to the tap (if any) and replaced by what it returns.
struct Tapped<S> {
    inner: S,
    tap: Option<std::sync::Arc<dyn ShipTap>>,
    address: String,
    pending: std::collections::VecDeque<Chunk>,
}

impl<S> Stream for Tapped<S>
where
    S: Stream<Item = Result<Chunk, NetError>> + Unpin,
{
    type Item = Result<Chunk, NetError>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(chunk) = this.pending.pop_front() {
            return std::task::Poll::Ready(Some(Ok(chunk)));
        }
        match std::pin::Pin::new(&mut this.inner).poll_next(cx) {
            std::task::Poll::Ready(Some(Ok(chunk))) => match &this.tap {
                None => std::task::Poll::Ready(Some(Ok(chunk))),
                Some(tap) => {
                    this.pending.extend(tap.pulled(&this.address, chunk));
                    match this.pending.pop_front() {
                        Some(chunk) => std::task::Poll::Ready(Some(Ok(chunk))),
                        // A tap must hand over the chunk itself; if it did not, the stream goes on.
                        None => {
                            cx.waker().wake_by_ref();
                            std::task::Poll::Pending
                        }
                    }
                }
            },
            other => other,
        }
    }
}
