//! Replies of the operator verbs (`POST /cluster/...`, `/cluster/members/{id}`): what was done, or
//! with `dry_run=true` what would be done, with the figures behind the decision.

use serde::{Deserialize, Serialize};

/// A log position on the wire.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct PositionView {
    /// Term.
    pub term: u64,
    /// Seqno.
    pub seqno: u64,
}

/// `POST /cluster/heal?node=N`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct HealView {
    /// The node healed.
    pub node: u64,
    /// The last position it matched in this leader's log.
    pub matched: PositionView,
    /// Its applied frontier.
    pub applied_seqno: u64,
    /// Whether nothing was changed.
    pub dry_run: bool,
    /// What was (or would be) done, in words.
    pub action: String,
}

/// `POST /cluster/promote?node=N`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct PromoteView {
    /// The leader that hands over.
    pub from: u64,
    /// The node asked to take over.
    pub to: u64,
    /// The term before the transfer.
    pub term: u64,
    /// How many seqnos the target's durable frontier was behind the leader's.
    pub behind_seqnos: u64,
    /// Who leads after the transfer (null for a dry run, or if none was known by the deadline).
    pub new_leader: Option<u64>,
    /// Request to new leader known, in ms (0 for a dry run).
    pub elapsed_ms: u64,
    /// Whether nothing was changed.
    pub dry_run: bool,
    /// What was (or would be) done, in words.
    pub action: String,
}

/// `POST` and `DELETE /cluster/members/{id}`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct MembersView {
    /// The leader's term.
    pub term: u64,
    /// Voters before the change.
    pub voters_before: Vec<u64>,
    /// Voters after it.
    pub voters_after: Vec<u64>,
    /// Learners after it.
    pub learners_after: Vec<u64>,
    /// Time the change took, in ms.
    pub elapsed_ms: u64,
    /// Whether nothing was changed.
    pub dry_run: bool,
    /// What was (or would be) done, in words.
    pub action: String,
}

/// One peer in [`ReconcileView`].
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct ReconcilePeerView {
    /// The peer.
    pub node: u64,
    /// Whether its hard-negatives digest differed from this node's.
    pub differed: bool,
    /// Users whose negatives were merged.
    pub merged_users: u64,
    /// Entries refused as malformed.
    pub refused: u64,
    /// What happened, in words.
    pub outcome: String,
}

/// `POST /cluster/reconcile`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct ReconcileView {
    /// The node that reconciled.
    pub node: u64,
    /// Whether nothing was changed.
    pub dry_run: bool,
    /// Each peer asked.
    pub peers: Vec<ReconcilePeerView>,
}

/// `POST /cluster/catchup`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct CatchupView {
    /// The node asked.
    pub node: u64,
    /// The leader it pulls from, if known.
    pub leader: Option<u64>,
    /// Whether this request started a pull.
    pub pull_started: bool,
    /// What happened, in words.
    pub note: String,
}
