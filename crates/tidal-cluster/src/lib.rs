//! Tidal replication.
//!
//! The decisions are not here: they are pure functions in `tidal-protocol` (the follower's
//! acceptance rules, the leader's commit rule, taking office, what a ShipQueue sends next). The
//! receiver, ShipQueues and the office runtime of this crate call them and only perform what they
//! decide (append, fsync, send, apply); the model check (crates/tidal-model) drives the same ones.
//! - `control`: openraft (terms, votes, membership) over fjall and the replication transport.
//! - `replica`: one node's replication side (ShipQueues, receiver, pull, office).
#![deny(missing_docs)]

pub mod applier;
pub mod backup;
pub mod blocking;
pub mod commit_state;
pub mod control;
pub mod error;
pub mod fatal;
pub mod files;
pub mod refusal;
pub mod replica;
pub mod ship_feed;
pub mod snapshot;
pub mod spec;

pub use applier::{
    AppliedWaiter, AppliedWaiters, Applier, ApplierInput, ApplierSender, ApplyPoint, ApplyProbe,
    CommitOnFlush, DurableFrontier, Reached,
};
pub use commit_state::CommitState;
pub use control::{ControlPlane, ControlTiming, TermGate};
pub use error::Error;
pub use fatal::{Fatal, FatalReason, FatalSource};
pub use refusal::Refusal;
pub use replica::{
    commit_hint, FollowerProgress, HealReport, InstallStats, MemberChange, MemberReport, Members,
    NoticeStats, PeerReconcile, PromoteReport, PullStats, Replica, ReplicaHook, ReplicaParts, ReplicaService,
    Role,
};
pub use ship_feed::{ShipFeed, TailRead};
pub use snapshot::{
    fetch_snapshot, install_fetched, install_snapshot, pending_install_position, resume_pending_install,
    snapshot_needed, FetchOutcome, FetchedSnapshot, InstallError, InstallOutcome, InstallProgress,
    InstallReport, SnapshotPin, SnapshotPins, SnapshotSource,
};
pub use spec::{ClusterSpec, Durability, NodeSpec};
