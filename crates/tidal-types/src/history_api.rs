//! `GET /cluster/history`: a node's recent views of the cluster, sampled once a second, and the
//! events read off consecutive samples (the `/ui` page draws its lag chart and event list from it).

use crate::ClusterStatus;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Reply to `GET /cluster/history`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct ClusterHistory {
    /// The node that took the samples (the leader, when a follower forwarded the request).
    pub node_id: u64,
    /// Time between samples.
    pub interval_ms: u64,
    /// A member whose last answer is older than this (or that never answered) counts as
    /// unreachable, in the events and on the page.
    pub unreachable_after_ms: u64,
    /// Samples taken after the request's `since_ms`, oldest first.
    pub samples: Vec<StatusSample>,
    /// Events after the request's `since_ms`, oldest first.
    pub events: Vec<ClusterEvent>,
}

/// One sample: the node's `GET /cluster/status` answer and its replication counters at `at_ms`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct StatusSample {
    /// Unix time of the sample on the sampling node's clock, in ms.
    pub at_ms: u64,
    /// What `GET /cluster/status` answered then.
    pub status: ClusterStatus,
    /// Replication input this node refused since it started, by reason (the
    /// `tidal_replication_refusals_total` series).
    pub refusals: BTreeMap<String, u64>,
    /// Pulls this node ran to their end since it started.
    pub pulls: u64,
    /// Snapshots this node installed since it started.
    pub snapshot_installs: u64,
    /// Snapshot fetches or installs that failed on this node since it started.
    pub snapshot_install_failures: u64,
}

/// Something that changed between two consecutive samples.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct ClusterEvent {
    /// Unix time of the sample that showed it, in ms.
    pub at_ms: u64,
    /// What happened.
    pub kind: ClusterEventKind,
    /// The member it is about, if one.
    pub node: Option<u64>,
    /// One line for a person.
    pub message: String,
}

/// The kinds of [`ClusterEvent`].
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ClusterEventKind {
    /// The sampling node names another leader, or the term changed.
    Leader,
    /// A member stopped answering the sampling node (or was never heard).
    Unreachable,
    /// A member answers again.
    Answering,
    /// The leader sees a member catching up by pull.
    PullStarted,
    /// That pull ended.
    PullEnded,
    /// A member is being healed by a snapshot.
    SnapshotStarted,
    /// That heal ended.
    SnapshotEnded,
    /// The sampling node refused replication input.
    Refused,
    /// Files appeared in the sampling node's WAL quarantine.
    Quarantined,
}
