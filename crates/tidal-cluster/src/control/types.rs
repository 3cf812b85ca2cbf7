//! The control plane's openraft types: what its log holds and how nodes are addressed.

use serde::{Deserialize, Serialize};
use std::io::Cursor;

/// A member's addresses, as openraft's membership carries them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// HTTP address (`host:port`).
    pub http: String,
    /// Replication RPC address (`host:port`).
    pub rpc: String,
}

impl std::fmt::Display for NodeInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "http={} rpc={}", self.http, self.rpc)
    }
}

/// An entry of the control log (besides openraft's own blank and membership entries).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ControlCmd {
    /// A leader opened `term` after `baseline` (its LeaderStart batch is at `baseline + 1`).
    LeaderStart {
        /// Term.
        term: u64,
        /// Leader.
        leader: u64,
        /// Stream baseline B(term).
        baseline: u64,
    },
}

impl std::fmt::Display for ControlCmd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ControlCmd::LeaderStart { term, leader, baseline } => {
                write!(f, "LeaderStart{{term: {term}, leader: {leader}, baseline: {baseline}}}")
            }
        }
    }
}

openraft::declare_raft_types!(
    /// Tidal's openraft configuration.
    pub TypeConfig:
        D = ControlCmd,
        R = (),
        NodeId = u64,
        Node = NodeInfo,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = super::runtime::TidalRuntime,
);
