//! The cluster's shape: who the members are and how durable a write must be before it is
//! acknowledged. Who leads, and in which term, is openraft's decision ([`crate::control`]).

use crate::error::{Error, Result};
use std::collections::BTreeMap;
use tidal_types::NodeId;

/// When a write is acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Once a majority of voters has fsynced it (and the leader applied it): no acknowledged write is
    /// lost when a minority fails.
    Quorum,
    /// Once the leader has fsynced and applied it: a failover can lose acknowledged writes.
    Leader,
}

/// One member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSpec {
    /// Its id.
    pub id: NodeId,
    /// Its HTTP address (`host:port`).
    pub http: String,
    /// Its replication RPC address (`host:port`).
    pub rpc: String,
}

/// The cluster, as every member's cluster file says. Its `Debug` leaves the secret out (a config
/// printed in a log or a failed assertion must not carry it).
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterSpec {
    /// Cluster id: RPCs naming another cluster are refused.
    pub cluster_id: String,
    /// Shared secret every RPC carries.
    pub secret: String,
    /// Durability mode.
    pub durability: Durability,
    /// Members (voters), any order.
    pub nodes: Vec<NodeSpec>,
    /// Node-local dial overrides: the address THIS node dials to reach a member's RPC server instead
    /// of the member's `rpc` (`tidal serve --dial ID=ADDR`: a relay, NAT, this node's own view of the
    /// network). Not part of the shared cluster file: the membership openraft records keeps `rpc`.
    pub dial: BTreeMap<NodeId, String>,
}

impl std::fmt::Debug for ClusterSpec {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ClusterSpec")
            .field("cluster_id", &self.cluster_id)
            .field("secret", &"<redacted>")
            .field("durability", &self.durability)
            .field("nodes", &self.nodes)
            .field("dial", &self.dial)
            .finish()
    }
}

impl ClusterSpec {
    /// A member by id.
    pub fn node(&self, id: NodeId) -> Option<&NodeSpec> {
        self.nodes.iter().find(|node| node.id == id)
    }

    /// The address this node dials to reach `node`'s RPC server: its dial override, else its `rpc`.
    pub fn dial_address<'a>(&'a self, node: &'a NodeSpec) -> &'a str {
        self.dial.get(&node.id).map_or(node.rpc.as_str(), String::as_str)
    }

    /// Checks the spec: at least one node, unique ids and addresses, a non-empty secret and id, and
    /// dial overrides only for members, never empty.
    pub fn validate(&self) -> Result<()> {
        for (id, address) in &self.dial {
            if self.node(*id).is_none() {
                return Err(Error::Spec(format!("dial override for node {id}, which is not a member")));
            }
            if address.trim().is_empty() {
                return Err(Error::Spec(format!("dial override for node {id} is empty")));
            }
        }
        if self.nodes.is_empty() {
            return Err(Error::Spec("a cluster needs at least one [[node]]".into()));
        }
        if self.cluster_id.is_empty() {
            return Err(Error::Spec("cluster_id must not be empty".into()));
        }
        if self.secret.len() < 16 {
            return Err(Error::Spec("the cluster secret must be at least 16 bytes".into()));
        }
        let mut ids: Vec<_> = self.nodes.iter().map(|n| n.id).collect();
        ids.sort();
        ids.dedup();
        if ids.len() != self.nodes.len() {
            return Err(Error::Spec("node ids must be unique".into()));
        }
        let mut addresses: Vec<_> =
            self.nodes.iter().flat_map(|n| [n.http.as_str(), n.rpc.as_str()]).collect();
        addresses.sort();
        addresses.dedup();
        if addresses.len() != self.nodes.len() * 2 {
            return Err(Error::Spec("every http and rpc address must be distinct".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_leaves_the_secret_out() {
        let spec = ClusterSpec {
            cluster_id: "c".into(),
            secret: "do-not-print-this-secret".into(),
            durability: Durability::Quorum,
            nodes: vec![NodeSpec { id: NodeId(1), http: "127.0.0.1:1".into(), rpc: "127.0.0.1:2".into() }],
            dial: BTreeMap::new(),
        };
        let printed = format!("{spec:?} {spec:#?}");
        assert!(!printed.contains("do-not-print"), "{printed}");
        assert!(printed.contains("<redacted>"), "{printed}");
    }
}
