//! Symmetry reduction: nodes in the same role of the configuration are interchangeable (ids only
//! name them), so states that differ by a renaming of such nodes are explored once.
//!
//! The representative of a state is the renaming with the smallest fingerprint (a fixed-key hash), so
//! every state of one orbit maps to the same representative.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{DefaultHasher, Hash, Hasher};

use tidal_protocol::ProbeAnswer;
use tidal_types::NodeId;

use crate::state::{index, Acked, Broken, Config, Message, ModelState, Network, NodeState, PendingAck, Role};

/// The representative of `state` under renamings of its nodes. Only for a static configuration.
///
/// Nodes are sorted by a fingerprint of what they hold without naming other nodes (term, WAL,
/// frontiers, role and its term); ties keep their order. Symmetric states whose nodes all differ map
/// to the same representative; a tie only costs some reduction, never soundness (the representative
/// is always a renaming of the state). A batch's writer is a process number of its term's leader,
/// not a node id, so WALs and shipped batches are renamed as they are; a node's `incarnation` moves
/// with the node.
pub fn representative(state: &ModelState) -> ModelState {
    let mut permutation: Vec<usize> = (0..state.nodes.len()).collect();
    for class in classes(state) {
        let mut order: Vec<(u64, usize)> =
            class.iter().map(|i| (local_fingerprint(&state.nodes[*i]), *i)).collect();
        order.sort_unstable();
        for (slot, (_, old_index)) in class.iter().zip(&order) {
            permutation[*old_index] = *slot;
        }
    }
    if permutation.iter().enumerate().all(|(i, p)| i == *p) {
        return state.clone();
    }
    rename(state, &permutation)
}

/// Interchangeable nodes: all of them with one static voter set; with the membership change (old
/// {n1, n2, n3}, new {n1, n4, n5}), n2 with n3 and n4 with n5.
fn classes(state: &ModelState) -> Vec<Vec<usize>> {
    match state.config {
        Config::Static => vec![(0..state.nodes.len()).collect()],
        Config::Old | Config::Deciding { .. } | Config::New => vec![vec![1, 2], vec![3, 4]],
    }
}

fn local_fingerprint(node: &NodeState) -> u64 {
    let mut hasher = DefaultHasher::new();
    (node.term, node.elected, node.incarnation, &node.wal, node.durable, node.commit, node.applied)
        .hash(&mut hasher);
    (node.tail_base, node.boot_term, node.opened).hash(&mut hasher);
    std::mem::discriminant(&node.role).hash(&mut hasher);
    node.office_term().hash(&mut hasher);
    node.unsynced.len().hash(&mut hasher);
    hasher.finish()
}

fn rename(state: &ModelState, permutation: &[usize]) -> ModelState {
    let map =
        |node: NodeId| -> NodeId { permutation.get(index(node)).map_or(node, |i| crate::state::id(*i)) };
    let mut nodes = vec![NodeState::new(); state.nodes.len()];
    for (i, node) in state.nodes.iter().enumerate() {
        nodes[permutation[i]] = rename_node(node, &map);
    }
    let mut network = Network::default();
    for message in state.network.messages() {
        network.send(rename_message(message, &map));
    }
    let mut history = state.history.clone();
    history.acked = state.history.acked.iter().map(|a| Acked { by: map(a.by), ..*a }).collect();
    history.served_by = state.history.served_by.iter().map(|n| map(*n)).collect();
    history.broken = state
        .history
        .broken
        .iter()
        .map(|b| match *b {
            Broken::CommitDecreased(n) => Broken::CommitDecreased(map(n)),
            Broken::QuarantinedCommitted(n, p) => Broken::QuarantinedCommitted(map(n), p),
            Broken::Halted(n) => Broken::Halted(map(n)),
            Broken::UnheldPrev(n) => Broken::UnheldPrev(map(n)),
            Broken::HaltedOnChunk(n) => Broken::HaltedOnChunk(map(n)),
        })
        .collect();
    ModelState { nodes, network, history, ..state.clone() }
}

fn rename_node(node: &NodeState, map: &impl Fn(NodeId) -> NodeId) -> NodeState {
    let role = match &node.role {
        Role::Follower => Role::Follower,
        Role::Probing { term, answers, commits } => Role::Probing {
            term: *term,
            answers: answers.iter().map(|(k, v): (&NodeId, &ProbeAnswer)| (map(*k), v.clone())).collect(),
            commits: rename_keys(commits, map),
        },
        Role::Syncing { term, source, target } => {
            Role::Syncing { term: *term, source: map(*source), target: *target }
        }
        Role::Leader { term, start, serving, matched, waiting, after } => Role::Leader {
            term: *term,
            start: *start,
            serving: *serving,
            matched: rename_keys(matched, map),
            waiting: waiting.clone(),
            after: rename_keys(after, map),
        },
    };
    let unsynced: BTreeSet<PendingAck> =
        node.unsynced.iter().map(|p| PendingAck { to: p.to.map(map), ..p.clone() }).collect();
    NodeState { role, unsynced, ..node.clone() }
}

fn rename_message(message: &Message, map: &impl Fn(NodeId) -> NodeId) -> Message {
    match message.clone() {
        Message::Ship { from, to, term, prev, batches, commit, pull, leader } => {
            Message::Ship { from: map(from), to: map(to), term, prev, batches, commit, pull, leader }
        }
        Message::Pull { source, to, term, prev, commit, leader } => {
            Message::Pull { source: map(source), to: map(to), term, prev, commit, leader }
        }
        Message::Ack { from, to, term, matched } => {
            Message::Ack { from: map(from), to: map(to), term, matched }
        }
        Message::Commit { from, to, term, commit } => {
            Message::Commit { from: map(from), to: map(to), term, commit }
        }
    }
}

fn rename_keys<V: Copy>(m: &BTreeMap<NodeId, V>, map: &impl Fn(NodeId) -> NodeId) -> BTreeMap<NodeId, V> {
    m.iter().map(|(k, v)| (map(*k), *v)).collect()
}
