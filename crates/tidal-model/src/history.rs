//! Counterexamples printed as worked histories in PROTOCOL.md's style: one line per step, naming the
//! node, what it did, and its state afterwards.
//!
//! A node's state reads `n2 Lt3* t3 [t1 t1 | t3] c2 a2`: role (F follower, P probing, S syncing, L leader,
//! `*` serving) with its term, the persisted term, the WAL as the term of each seqno with `|` after the
//! durable prefix, then commit and applied. A batch written by a leader process resumed in its term
//! after a restart carries a `'` per restart (`t1'`): the same `(term, seqno)`, another batch.

use std::fmt::Write as _;

use stateright::Model;
use tidal_types::NodeId;

use crate::model::{batch_label, message_label, Action, ReplicationModel};
use crate::state::{index, Message, ModelState, NodeState, Role};

/// The node an action happens on.
pub fn actor(action: &Action) -> NodeId {
    match action {
        Action::Elect { candidate, .. } => *candidate,
        Action::LearnTerm { node, .. }
        | Action::Reelect { node }
        | Action::Fsync { node }
        | Action::Restart { node }
        | Action::Pull { node, .. } => *node,
        Action::Probe { leader, .. }
        | Action::ClientWrite { leader }
        | Action::Ship { leader, .. }
        | Action::Notice { leader, .. }
        | Action::BeginChange { leader }
        | Action::FinishChange { leader } => *leader,
        Action::Deliver(Message::Ship { to, .. } | Message::Ack { to, .. } | Message::Commit { to, .. }) => {
            *to
        }
        Action::Deliver(Message::Pull { source, .. }) => *source,
    }
}

/// One node's state, compactly.
pub fn node_summary(me: NodeId, node: &NodeState) -> String {
    let role = match &node.role {
        Role::Follower => "F".to_string(),
        Role::Probing { term, .. } => format!("P{term}"),
        Role::Syncing { term, .. } => format!("S{term}"),
        Role::Leader { term, serving, .. } => format!("L{term}{}", if *serving { "*" } else { "" }),
    };
    let queues = match &node.role {
        Role::Leader { after, .. } if !after.is_empty() => {
            let after: Vec<String> = after.iter().map(|(n, p)| format!("{n}:{p}")).collect();
            format!(" tail>{} after{{{}}}", node.tail_base, after.join(" "))
        }
        _ => String::new(),
    };
    let mut wal = String::new();
    for (i, batch) in node.wal.iter().enumerate() {
        if i as u64 == node.durable.get() {
            wal.push_str("| ");
        }
        let _ = write!(wal, "{} ", batch_label(batch));
    }
    if node.durable.get() == node.wal.len() as u64 && !node.wal.is_empty() {
        wal.push('|');
    }
    format!("{me} {role} {} [{}] c{} a{}{queues}", node.term, wal.trim_end(), node.commit, node.applied)
}

/// The whole cluster, one node per line.
pub fn state_summary(state: &ModelState) -> String {
    let mut out = String::new();
    for (i, node) in state.nodes.iter().enumerate() {
        let _ = writeln!(out, "    {}", node_summary(crate::state::id(i), node));
    }
    let acked: Vec<String> = state.history.acked.iter().map(|a| format!("{} by {}", a.batch, a.by)).collect();
    let _ = writeln!(
        out,
        "    acked: [{}]; last term {}; config {:?}",
        acked.join(", "),
        state.last_term,
        state.config
    );
    out
}

/// A path as a worked history, ending with the final state and the broken property.
pub fn worked_history(
    model: &ReplicationModel,
    steps: &[(ModelState, Option<Action>)],
    property: &str,
) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "counterexample to \"{property}\" ({} steps):", steps.len().saturating_sub(1));
    for (n, window) in steps.windows(2).enumerate() {
        let (Some(action), after) = (&window[0].1, &window[1].0) else { continue };
        let node = actor(action);
        let line = model.format_action(action);
        let _ = writeln!(out, "{:>3}. {line:<72} → {}", n + 1, node_summary(node, &after.nodes[index(node)]));
        // What a ShipQueue or a pull's reader put on the network (its prev is the point).
        if matches!(action, Action::Ship { .. } | Action::Deliver(Message::Pull { .. })) {
            let before: Vec<&Message> = window[0].0.network.messages().collect();
            for message in after.network.messages().filter(|m| !before.contains(m)) {
                if let Message::Ship { to, .. } = message {
                    let _ = writeln!(out, "       sends {} to {to}", message_label(message));
                }
            }
        }
    }
    if let Some((last, _)) = steps.last() {
        let _ = writeln!(out, "  final state:");
        out.push_str(&state_summary(last));
    }
    out
}
