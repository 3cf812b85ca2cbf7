//! Tidal replication.
//!
//! This stage holds the I/O-free decision core (`decide`): the follower's acceptance rules and the
//! leader's commit rule from PROTOCOL.md, as functions from state and message to a verdict. The
//! receiver, ShipQueue and leader runtime (next stage) call these functions and only perform what they
//! decide (append, fsync, send, apply); the model check drives the same functions.
#![deny(missing_docs)]

pub mod applier;
pub mod commit_state;
pub mod decide;
pub mod replica;
pub mod ship_feed;
pub mod snapshot;
pub mod spec;

pub use applier::{Applier, ApplierInput, ApplierSender, CommitOnFlush};
pub use commit_state::CommitState;
pub use replica::{FollowerProgress, Replica, ReplicaHook, ReplicaService};
pub use ship_feed::{ShipFeed, TailRead};
pub use snapshot::{
    install_snapshot, resume_pending_install, snapshot_needed, InstallError, InstallOutcome, InstallProgress,
    InstallReport, SnapshotPin, SnapshotPins, SnapshotSource,
};
pub use spec::{ClusterSpec, Durability, NodeSpec, STATIC_TERM};
