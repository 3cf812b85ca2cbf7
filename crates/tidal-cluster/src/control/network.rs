//! openraft's network over the replication transport (tidal-net's `Raft` RPC): each request is
//! serialized with serde_json into a [`RaftCall`]; the answer carries openraft's own
//! `Result<Response, RaftError>`, so remote refusals come back as openraft errors.

// openraft's trait signatures fix the error types; they are large by its design.
#![allow(clippy::result_large_err)]

use super::types::{NodeInfo, TypeConfig};
use crate::spec::ClusterSpec;
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tidal_net::{NetError, Peer, RaftCall};
use tidal_protocol::speaks_for_a_restored_term;
use tidal_types::{NodeId, Term};

/// How long an openraft RPC may go on after openraft stopped waiting for it. openraft 0.9 gives an
/// AppendEntries exactly one heartbeat interval and then drops the call; dropping it reset the
/// HTTP/2 stream, so a heartbeat that would have reached a busy follower a little late never did
/// (and after 20 such resets h2's rapid-reset guard closed the whole connection). Each call now
/// runs in its own task with this deadline: late is not lost, and a late heartbeat still resets
/// the follower's election timer (decisions/012). A call openraft gives longer keeps its own time.
const RPC_DEADLINE: Duration = Duration::from_secs(2);

/// Calls to one target that may be in flight at once (late ones included); past it a call fails
/// at once as unreachable, which is what it is.
const RPC_IN_FLIGHT_MAX: usize = 32;

/// Whether the connection to a target has stalled and must be dialed again: calls are waiting, and
/// nothing came back on it for `redial_after` since it was dialed or last answered.
///
/// Why: a connection whose packets were lost (a short partition, a peer that restarted without a
/// reset, a NAT that forgot it) hangs every call until HTTP/2's keepalive gives up, up to 5 s. The
/// target hears no heartbeat meanwhile, its election timer fires, and its higher term deposes a
/// healthy leader although the data path reaches it (simulation seed 47, partition-heal). A new
/// connection restores heartbeats within a fraction of the election timeout (decisions/012).
pub fn redial_due(
    heard: tokio::time::Instant,
    waiting: bool,
    now: tokio::time::Instant,
    redial_after: Duration,
) -> bool {
    waiting && now.saturating_duration_since(heard) >= redial_after
}

/// RPC kinds.
pub const KIND_APPEND: &str = "append";
/// Vote RPC.
pub const KIND_VOTE: &str = "vote";
/// Snapshot RPC.
pub const KIND_SNAPSHOT: &str = "snapshot";

/// Makes one [`PeerNetwork`] per target.
#[derive(Clone)]
pub struct NetworkFactory {
    /// How long calls may wait with nothing answered before the connection is dialed again
    /// ([`redial_due`]): half the shortest election timeout.
    pub redial_after: Duration,
    /// Cluster secret.
    pub secret: String,
    /// Cluster id.
    pub cluster_id: String,
    /// How peers are reached.
    pub connector: tidal_net::Connector,
    /// This node's dial overrides ([`ClusterSpec::dial`]): openraft hands us the membership's
    /// `NodeInfo.rpc`, which is the same on every node; the override is this node's own route.
    pub dial: BTreeMap<u64, String>,
    /// This node.
    pub me: NodeId,
    /// The persisted vote's term when this process started: appends and snapshots this node would
    /// send as leader of a term at or below it stay home ([`speaks_for_a_restored_term`]) until
    /// `keep_home_until`.
    pub boot_term: Term,
    /// One lease after this process started openraft: by then the restored office has been handed
    /// over if a hand-over can work without those calls. Past it they go out again: a voter that
    /// lacks entries of the restored leader's openraft log (an uncommitted LeaderStart, say) can only
    /// get them that way, and without them the restored leader refuses it its vote, which a cluster
    /// with another voter down needs (t55's restart of two of three nodes).
    pub keep_home_until: tokio::time::Instant,
}

impl NetworkFactory {
    /// The factory for a member of `spec`, reaching peers through `connector`.
    pub fn new(
        spec: &ClusterSpec,
        connector: tidal_net::Connector,
        timing: super::ControlTiming,
        (me, boot_term): (NodeId, Term),
    ) -> NetworkFactory {
        NetworkFactory {
            redial_after: timing.election_min / 2,
            secret: spec.secret.clone(),
            cluster_id: spec.cluster_id.clone(),
            connector,
            dial: spec.dial.iter().map(|(id, address)| (id.0, address.clone())).collect(),
            me,
            boot_term,
            keep_home_until: tokio::time::Instant::now() + timing.voters_lease(),
        }
    }
}

/// The connection to one target.
pub struct PeerNetwork {
    target: u64,
    /// The target's address, and how to dial it again ([`redial_due`]).
    address: String,
    factory: NetworkFactory,
    /// The peer handle, or why it could not be made (every call then fails with it).
    peer: Result<Peer, NetError>,
    in_flight: Arc<tokio::sync::Semaphore>,
    /// When the current connection was dialed or last answered a call.
    heard: Arc<std::sync::Mutex<tokio::time::Instant>>,
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerNetwork;

    async fn new_client(&mut self, target: u64, node: &NodeInfo) -> PeerNetwork {
        let address = self.dial.get(&target).map_or(node.rpc.as_str(), String::as_str).to_string();
        let peer = Peer::connect_lazy_with(&address, &self.secret, &self.cluster_id, &self.connector);
        PeerNetwork {
            target,
            address,
            factory: self.clone(),
            peer,
            in_flight: Arc::new(tokio::sync::Semaphore::new(RPC_IN_FLIGHT_MAX)),
            heard: Arc::new(std::sync::Mutex::new(tokio::time::Instant::now())),
        }
    }
}

impl PeerNetwork {
    /// Dials the target again when its connection stalled ([`redial_due`]); calls still waiting on
    /// the old connection go on until their deadlines.
    fn redial_if_stalled(&mut self) {
        let now = tokio::time::Instant::now();
        let waiting = self.in_flight.available_permits() < RPC_IN_FLIGHT_MAX;
        let mut heard = self.heard.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.peer.is_err() || !redial_due(*heard, waiting, now, self.factory.redial_after) {
            return;
        }
        tracing::debug!(
            target = self.target,
            silent_ms = now.saturating_duration_since(*heard).as_millis() as u64,
            "openraft calls stalled: dialing the target again"
        );
        let factory = &self.factory;
        self.peer =
            Peer::connect_lazy_with(&self.address, &factory.secret, &factory.cluster_id, &factory.connector);
        *heard = now;
    }

    async fn call<Req, Resp, E>(
        &mut self,
        kind: &str,
        request: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<u64, NodeInfo, RaftError<u64, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        self.redial_if_stalled();
        let peer = self
            .peer
            .as_ref()
            .map_err(|why| RPCError::Unreachable(Unreachable::new(&NetError::Config(why.to_string()))))?;
        let payload = serde_json::to_vec(request).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let call = RaftCall { kind: kind.to_string(), payload };
        let permit = self.in_flight.clone().try_acquire_owned().map_err(|_| {
            RPCError::Unreachable(Unreachable::new(&NetError::Config(format!(
                "{RPC_IN_FLIGHT_MAX} calls to node {} still in flight",
                self.target
            ))))
        })?;
        let (answer, answered) = tokio::sync::oneshot::channel();
        let peer = peer.clone();
        let deadline = std::cmp::max(RPC_DEADLINE, option.hard_ttl());
        let heard = self.heard.clone();
        tokio::spawn(async move {
            let reply = peer.raft(call, deadline).await;
            if reply.is_ok() {
                *heard.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
                    tokio::time::Instant::now();
            }
            let _ = answer.send(reply);
            drop(permit);
        });
        let reply = match tokio::time::timeout(option.hard_ttl(), answered).await {
            Ok(Ok(reply)) => reply.map_err(|error| RPCError::Unreachable(Unreachable::new(&error)))?,
            Ok(Err(_)) => {
                return Err(RPCError::Unreachable(Unreachable::new(&NetError::Config(
                    "the call's task ended without an answer".into(),
                ))))
            }
            Err(_) => {
                return Err(RPCError::Unreachable(Unreachable::new(&NetError::Config(format!(
                    "no answer within {:?} (the call goes on in the background)",
                    option.hard_ttl()
                )))))
            }
        };
        let answer: Result<Resp, RaftError<u64, E>> =
            serde_json::from_slice(&reply).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        answer.map_err(|error| RPCError::RemoteError(RemoteError::new(self.target, error)))
    }
}

/// Retry interval after an unreachable peer. openraft's default (500 ms) would let a restarted
/// follower's election timer (500 ms and up) fire before the leader's heartbeats resume, and its
/// higher term would then depose a healthy leader.
const UNREACHABLE_RETRY: std::time::Duration = std::time::Duration::from_millis(50);

impl PeerNetwork {
    /// Refuses, as unreachable, a call this node would send for a restored office during the first
    /// lease after its start (decisions/068): openraft puts a restarted leader back in office and
    /// sends appends at once, before the office can refuse the term; a voter that accepted one would
    /// renew its lease and hold the next election back by a whole lease. openraft retries a refused
    /// call as it does any unreachable peer, and the office hands the term over.
    fn keep_home<E: std::error::Error>(
        &self,
        vote: &openraft::Vote<u64>,
    ) -> Result<(), RPCError<u64, NodeInfo, E>> {
        if tokio::time::Instant::now() >= self.factory.keep_home_until {
            return Ok(());
        }
        let leader_id = vote.leader_id();
        let Some(leader) = leader_id.voted_for() else { return Ok(()) };
        let (me, boot_term) = (self.factory.me, self.factory.boot_term);
        if !speaks_for_a_restored_term(NodeId(leader), Term(leader_id.get_term()), me, boot_term) {
            return Ok(());
        }
        Err(RPCError::Unreachable(Unreachable::new(&NetError::Config(format!(
            "not sent: term {} was led by an earlier process of this node (boot vote term {boot_term}) and is never resumed",
            leader_id.get_term()
        )))))
    }
}

impl RaftNetwork<TypeConfig> for PeerNetwork {
    fn backoff(&self) -> openraft::network::Backoff {
        openraft::network::Backoff::new(std::iter::repeat(UNREACHABLE_RETRY))
    }

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, NodeInfo, RaftError<u64>>> {
        self.keep_home(&rpc.vote)?;
        self.call(KIND_APPEND, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<u64>, RPCError<u64, NodeInfo, RaftError<u64, InstallSnapshotError>>>
    {
        self.keep_home(&rpc.vote)?;
        self.call(KIND_SNAPSHOT, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, NodeInfo, RaftError<u64>>> {
        self.call(KIND_VOTE, &rpc, &option).await
    }
}

/// The node that sent an openraft call: the candidate of a vote request, the leader of an append or
/// a snapshot (every request names its sender in its `vote`). A payload that does not decode is an
/// invalid argument, as when it is served.
pub fn caller_of(call: &RaftCall) -> Result<NodeId, tidal_net::ServiceError> {
    #[derive(serde::Deserialize)]
    struct Sender {
        vote: openraft::Vote<u64>,
    }
    let sender: Sender = serde_json::from_slice(&call.payload)
        .map_err(|e| tidal_net::ServiceError::InvalidArgument(format!("bad openraft payload: {e}")))?;
    sender.vote.leader_id().voted_for().map(NodeId).ok_or_else(|| {
        tidal_net::ServiceError::InvalidArgument("an openraft call that names no sender".into())
    })
}

/// Serves one incoming openraft RPC on `raft`; the answer is the encoded `Result`. Each append's
/// arrival is noted on `leases` (the lease openraft grants on it, [`super::lease`]).
pub async fn serve_call(
    raft: &openraft::Raft<TypeConfig>,
    leases: &super::lease::LeaseClock,
    call: RaftCall,
) -> Result<Vec<u8>, tidal_net::ServiceError> {
    fn decode<T: DeserializeOwned>(payload: &[u8]) -> Result<T, tidal_net::ServiceError> {
        serde_json::from_slice(payload)
            .map_err(|e| tidal_net::ServiceError::InvalidArgument(format!("bad openraft payload: {e}")))
    }
    fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, tidal_net::ServiceError> {
        serde_json::to_vec(value).map_err(|e| tidal_net::ServiceError::Internal(e.to_string()))
    }
    match call.kind.as_str() {
        KIND_APPEND => {
            let append: AppendEntriesRequest<TypeConfig> = decode(&call.payload)?;
            leases.served(append.vote.leader_id().get_term());
            encode(&raft.append_entries(append).await)
        }
        KIND_VOTE => encode(&raft.vote(decode(&call.payload)?).await),
        KIND_SNAPSHOT => encode(&raft.install_snapshot(decode(&call.payload)?).await),
        other => Err(tidal_net::ServiceError::InvalidArgument(format!("unknown openraft call {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::redial_due;
    use std::time::Duration;
    use tokio::time::Instant;

    #[test]
    fn only_waiting_calls_on_a_silent_connection_call_for_a_redial() {
        let after = Duration::from_millis(150);
        let heard = Instant::now();
        let at = |ms| heard + Duration::from_millis(ms);
        assert!(!redial_due(heard, true, at(149), after), "silent for less than the bound");
        assert!(redial_due(heard, true, at(150), after), "silent for the bound with calls waiting");
        assert!(!redial_due(heard, false, at(10_000), after), "an idle connection is not stalled");
        // A clock that reads before the last answer (an answer recorded after `now` was read).
        assert!(!redial_due(at(200), true, at(100), after));
    }
}
