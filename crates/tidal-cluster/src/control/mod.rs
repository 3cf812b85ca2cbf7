//! The control plane: openraft decides terms and membership (PROTOCOL.md, "Taking office").
//!
//! openraft's log holds only control entries (membership, `LeaderStart`); the data rides the WAL.
//! Its storage is the node's fjall `raft` keyspace ([`store`]), its network the replication
//! transport's `Raft` RPC ([`network`]). The openraft leader is the data leader; the replica watches
//! openraft's metrics to take and leave office (see `crate::replica`).

pub mod campaign;
pub mod lease;
pub mod network;
pub mod runtime;
pub mod store;
pub mod types;

pub use network::caller_of;
pub use runtime::{seed_thread_rng, TidalRuntime};
pub use store::{ControlState, LeaderStartRecord, LogStore, StateMachine, TermGate};
pub use types::{ControlCmd, NodeInfo, TypeConfig};

use crate::error::{Error, Result};
use crate::spec::ClusterSpec;
use openraft::{Config, Raft, SnapshotPolicy};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tidal_core::RaftStore;
use tidal_net::RaftCall;
use tidal_types::{NodeId, Term};

/// Added to openraft's leader lease (`election_max`) wherever Tidal counts on it having run out: a
/// transfer's wait, a timed campaign, a restored office's hand-over and its calls kept home
/// (decisions/068).
pub const LEASE_MARGIN: Duration = Duration::from_millis(50);

/// Election and heartbeat timing (decisions/012). A follower campaigns once it has heard no
/// heartbeat for openraft's leader lease (= `election_max`) plus its election timeout, checked on
/// openraft's tick (1.5 heartbeats): failover takes `election_max` + [`election_min`,
/// `election_max`) + up to one tick, plus a vote, a probe round and the LeaderStart commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControlTiming {
    /// openraft heartbeat interval.
    pub heartbeat: Duration,
    /// Election timeout, lower bound (randomized up to `election_max`).
    pub election_min: Duration,
    /// Election timeout, upper bound.
    pub election_max: Duration,
}

impl Default for ControlTiming {
    fn default() -> ControlTiming {
        ControlTiming {
            heartbeat: Duration::from_millis(50),
            election_min: Duration::from_millis(300),
            election_max: Duration::from_millis(600),
        }
    }
}

impl ControlTiming {
    /// The leader lease a voter grants, as Tidal counts on it having run out: openraft's
    /// (`election_max`) plus [`LEASE_MARGIN`].
    pub fn voters_lease(&self) -> Duration {
        self.election_max + LEASE_MARGIN
    }

    /// A leader-mode leader's lease (PROTOCOL.md, "Committing and acknowledging"): nine tenths of
    /// the minimum election timeout, so it runs out before any other node can be elected.
    pub fn lease(&self) -> Duration {
        self.election_min * 9 / 10
    }

    /// How recently a leader must have heard from a majority to call itself ready: two of the
    /// longest election timeouts (a leader cut off longer than that is, or will soon be, replaced).
    pub fn ready_contact(&self) -> Duration {
        self.election_max * 2
    }
}

/// A node's openraft instance and its state machine.
pub struct ControlPlane {
    raft: Raft<TypeConfig>,
    state: StateMachine,
    leases: lease::LeaseClock,
}

impl ControlPlane {
    /// Starts openraft over `store`. A node with nothing stored initializes the membership from the
    /// cluster file when `initialize` (every founding member writes the same first entry, so any of
    /// them may do it); a joining node (`initialize` false) waits for the leader to add it. A vote
    /// the store cannot persist raises `fatal`. `boot_term` is the persisted vote's term when this
    /// process started: openraft calls for a restored office of it stay home (decisions/068).
    #[allow(clippy::too_many_arguments)]
    pub async fn start(
        me: u64,
        spec: &ClusterSpec,
        timing: ControlTiming,
        store: RaftStore,
        gate: Arc<TermGate>,
        connector: tidal_net::Connector,
        initialize: bool,
        fatal: crate::fatal::Fatal,
        boot_term: Term,
    ) -> Result<ControlPlane> {
        let config = Config {
            cluster_name: spec.cluster_id.clone(),
            heartbeat_interval: millis(timing.heartbeat),
            election_timeout_min: millis(timing.election_min),
            election_timeout_max: millis(timing.election_max),
            snapshot_policy: SnapshotPolicy::LogsSinceLast(1000),
            max_in_snapshot_log_to_keep: 100,
            ..Config::default()
        }
        .validate()
        .map_err(|e| Error::Control(format!("control-plane timing: {e}")))?;
        let fresh = LogStore::is_fresh(&store)?;
        let state = StateMachine::open(store.clone())?;
        let network = network::NetworkFactory::new(spec, connector, timing, (NodeId(me), boot_term));
        // openraft restores a persisted vote with a lease that starts now (it refuses votes for it).
        let leases = lease::LeaseClock::starting(boot_term.get());
        let raft = Raft::new(me, Arc::new(config), network, LogStore::new(store, gate, fatal), state.clone())
            .await
            .map_err(|e| Error::Control(format!("start openraft: {e}")))?;
        tokio::spawn(campaign::spread_campaigns(raft.clone(), timing));
        if fresh && !initialize {
            tracing::info!("joining: waiting to be added by the leader (tidal members add)");
        }
        if fresh && initialize {
            let members: BTreeMap<u64, NodeInfo> = spec
                .nodes
                .iter()
                .map(|node| (node.id.0, NodeInfo { http: node.http.clone(), rpc: node.rpc.clone() }))
                .collect();
            if let Err(error) = raft.initialize(members).await {
                // Another member's first entry reached us first: the same membership, nothing to do.
                tracing::info!("control plane already initialized: {error}");
            }
        }
        Ok(ControlPlane { raft, state, leases })
    }

    /// The openraft handle.
    pub fn raft(&self) -> &Raft<TypeConfig> {
        &self.raft
    }

    /// The applied control state (membership, LeaderStarts).
    pub fn state(&self) -> ControlState {
        self.state.state()
    }

    /// Serves one openraft RPC from a peer.
    pub async fn serve(&self, call: RaftCall) -> Result<Vec<u8>, tidal_net::ServiceError> {
        network::serve_call(&self.raft, &self.leases, call).await
    }

    /// How long the leader lease this node granted to the leader of `term` runs on
    /// ([`lease::lease_left`], `lease` long from the last append of `term` served here).
    pub fn lease_left(&self, term: Term, lease: Duration) -> Duration {
        self.leases.left(term.get(), lease)
    }

    /// Stops openraft.
    pub async fn shutdown(&self) {
        if let Err(error) = self.raft.shutdown().await {
            tracing::warn!("openraft did not shut down cleanly: {error}");
        }
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
