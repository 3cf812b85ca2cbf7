//! Membership changes (PROTOCOL.md, "Membership changes"): whether an operator's `members add` or
//! `members remove` may run against the membership the leader knows, and what it will do.
//!
//! The plan is computed once and both printed and executed: a dry run prints exactly the plan the
//! runtime would carry out ([`MemberPlan::describe`]), and the runtime executes the variant it was
//! handed, so the two cannot drift apart.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use tidal_types::NodeId;

/// A member's addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Addresses {
    /// Its HTTP address (clients).
    pub http: String,
    /// Its replication RPC address (peers).
    pub rpc: String,
}

/// The membership as the leader knows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemberView {
    /// Voter sets: one, or two while a joint configuration is in force.
    pub voter_sets: Vec<BTreeSet<NodeId>>,
    /// Every member, voters and learners, with its addresses.
    pub nodes: BTreeMap<NodeId, Addresses>,
}

impl MemberView {
    fn voters(&self) -> BTreeSet<NodeId> {
        self.voter_sets.iter().flatten().copied().collect()
    }

    fn is_joint(&self) -> bool {
        self.voter_sets.len() > 1
    }
}

/// What an operator asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberRequest {
    /// Add `node` at `addresses` (a learner until it has caught up, then a voter).
    Add {
        /// The new member.
        node: NodeId,
        /// Its addresses.
        addresses: Addresses,
        /// How long the learner may take to catch up, in seconds.
        catch_up_secs: u64,
    },
    /// Remove `node`.
    Remove {
        /// The member to remove.
        node: NodeId,
    },
}

/// What a membership change will do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberPlan {
    /// The node is already a voter and no joint configuration waits to be finished.
    AlreadyVoter {
        /// The node.
        node: NodeId,
    },
    /// Add `node` as a learner (unless it is one already), wait until it has matched the commit
    /// frontier, count commit against both voter sets, then make `voters_after` the voters.
    AddVoter {
        /// The node.
        node: NodeId,
        /// Its addresses.
        addresses: Addresses,
        /// Whether openraft must add it as a learner first (it is not a member yet).
        new_learner: bool,
        /// How long it may take to catch up, in seconds.
        catch_up_secs: u64,
        /// The voters once the change is committed.
        voters_after: BTreeSet<NodeId>,
    },
    /// Count commit against both voter sets, then make `voters_after` the voters.
    RemoveVoter {
        /// The node.
        node: NodeId,
        /// The voters once the change is committed.
        voters_after: BTreeSet<NodeId>,
    },
    /// Remove a member that does not vote.
    RemoveLearner {
        /// The node.
        node: NodeId,
    },
}

impl MemberPlan {
    /// The plan in words, as a dry run prints it and the runtime logs it before it acts.
    pub fn describe(&self) -> String {
        match self {
            MemberPlan::AlreadyVoter { node } => format!("node {node} is already a voter; nothing to do"),
            MemberPlan::AddVoter { node, addresses, new_learner, catch_up_secs, .. } => format!(
                "{}wait up to {catch_up_secs} s for node {node} to match the commit frontier, then make it a voter",
                if *new_learner {
                    format!("add node {node} (http {}, rpc {}) as a learner, ", addresses.http, addresses.rpc)
                } else {
                    String::new()
                }
            ),
            MemberPlan::RemoveVoter { node, .. } => {
                format!("count commit against both voter sets, then remove voter {node}")
            }
            MemberPlan::RemoveLearner { node } => format!("remove learner {node}"),
        }
    }
}

/// Why a membership change cannot run as asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberRefusal {
    /// Node ids start at 1.
    ZeroId,
    /// A new member needs both addresses.
    MissingAddresses,
    /// Another member already uses one of the addresses.
    AddressInUse {
        /// That member.
        by: NodeId,
    },
    /// The node is a member with other addresses.
    OtherAddresses {
        /// The node.
        node: NodeId,
        /// Its addresses as the membership has them.
        known: Addresses,
    },
    /// The leader does not remove itself.
    RemovesLeader {
        /// The leader (this node).
        node: NodeId,
    },
    /// The node is not a member.
    NotAMember {
        /// The node.
        node: NodeId,
    },
    /// The change would leave no voter.
    NoVoterLeft,
}

impl fmt::Display for MemberRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemberRefusal::ZeroId => f.write_str("node ids start at 1"),
            MemberRefusal::MissingAddresses => f.write_str("a new member needs its http and rpc addresses"),
            MemberRefusal::AddressInUse { by } => write!(f, "node {by} already uses one of these addresses"),
            MemberRefusal::OtherAddresses { node, known } => write!(
                f,
                "node {node} is a member with other addresses (http {}, rpc {}); remove it first",
                known.http, known.rpc
            ),
            MemberRefusal::RemovesLeader { node } => write!(
                f,
                "node {node} leads; promote another voter first (tidal promote --node N), then remove it"
            ),
            MemberRefusal::NotAMember { node } => write!(f, "node {node} is not a member"),
            MemberRefusal::NoVoterLeft => f.write_str("a cluster needs at least one voter"),
        }
    }
}

/// The plan for `request` on leader `me` with membership `view`, or why it cannot run.
pub fn plan_member_change(
    me: NodeId,
    view: &MemberView,
    request: &MemberRequest,
) -> Result<MemberPlan, MemberRefusal> {
    match request {
        MemberRequest::Add { node, addresses, catch_up_secs } => {
            check_new_member(view, *node, addresses)?;
            let voters = view.voters();
            if !view.is_joint() && voters.contains(node) {
                return Ok(MemberPlan::AlreadyVoter { node: *node });
            }
            let mut voters_after = voters;
            voters_after.insert(*node);
            Ok(MemberPlan::AddVoter {
                node: *node,
                addresses: addresses.clone(),
                new_learner: !view.nodes.contains_key(node),
                catch_up_secs: *catch_up_secs,
                voters_after,
            })
        }
        MemberRequest::Remove { node } => {
            if *node == me {
                return Err(MemberRefusal::RemovesLeader { node: *node });
            }
            if !view.nodes.contains_key(node) {
                return Err(MemberRefusal::NotAMember { node: *node });
            }
            let voters = view.voters();
            let mut voters_after = voters.clone();
            voters_after.remove(node);
            if voters_after.is_empty() {
                return Err(MemberRefusal::NoVoterLeft);
            }
            if voters.contains(node) {
                Ok(MemberPlan::RemoveVoter { node: *node, voters_after })
            } else {
                Ok(MemberPlan::RemoveLearner { node: *node })
            }
        }
    }
}

/// A new member's id and addresses must be usable and not clash with another member's.
fn check_new_member(view: &MemberView, node: NodeId, addresses: &Addresses) -> Result<(), MemberRefusal> {
    if node == NodeId(0) {
        return Err(MemberRefusal::ZeroId);
    }
    if addresses.http.trim().is_empty() || addresses.rpc.trim().is_empty() {
        return Err(MemberRefusal::MissingAddresses);
    }
    let clash = view.nodes.iter().find(|(id, other)| {
        **id != node
            && [&other.http, &other.rpc]
                .iter()
                .any(|address| **address == addresses.http || **address == addresses.rpc)
    });
    if let Some((by, _)) = clash {
        return Err(MemberRefusal::AddressInUse { by: *by });
    }
    match view.nodes.get(&node) {
        Some(known) if known != addresses => {
            Err(MemberRefusal::OtherAddresses { node, known: known.clone() })
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(n: u64) -> Addresses {
        Addresses { http: format!("127.0.0.1:70{n:02}"), rpc: format!("127.0.0.1:71{n:02}") }
    }

    fn three() -> MemberView {
        MemberView {
            voter_sets: vec![[1, 2, 3].into_iter().map(NodeId).collect()],
            nodes: (1..=3).map(|n| (NodeId(n), at(n))).collect(),
        }
    }

    fn add(n: u64) -> MemberRequest {
        MemberRequest::Add { node: NodeId(n), addresses: at(n), catch_up_secs: 30 }
    }

    #[test]
    fn adding_a_new_node_makes_it_a_learner_then_a_voter() {
        let plan = plan_member_change(NodeId(1), &three(), &add(4)).expect("plan");
        let MemberPlan::AddVoter { new_learner, voters_after, .. } = &plan else { panic!("{plan:?}") };
        assert!(new_learner);
        assert_eq!(voters_after.len(), 4);
        assert!(plan.describe().starts_with("add node n4 (http 127.0.0.1:7004"), "{}", plan.describe());
    }

    #[test]
    fn a_learner_is_promoted_without_being_added_again() {
        let mut view = three();
        view.nodes.insert(NodeId(4), at(4));
        let plan = plan_member_change(NodeId(1), &view, &add(4)).expect("plan");
        assert!(matches!(plan, MemberPlan::AddVoter { new_learner: false, .. }), "{plan:?}");
    }

    #[test]
    fn a_voter_added_again_is_nothing_to_do_unless_a_joint_configuration_waits() {
        assert_eq!(
            plan_member_change(NodeId(1), &three(), &add(3)),
            Ok(MemberPlan::AlreadyVoter { node: NodeId(3) })
        );
        let mut joint = three();
        joint.voter_sets.push([1, 2].into_iter().map(NodeId).collect());
        assert!(matches!(plan_member_change(NodeId(1), &joint, &add(3)), Ok(MemberPlan::AddVoter { .. })));
    }

    #[test]
    fn bad_additions_are_refused_with_the_reason() {
        let view = three();
        let zero = MemberRequest::Add { node: NodeId(0), addresses: at(4), catch_up_secs: 1 };
        assert_eq!(plan_member_change(NodeId(1), &view, &zero), Err(MemberRefusal::ZeroId));
        let blank = MemberRequest::Add {
            node: NodeId(4),
            addresses: Addresses { http: " ".into(), rpc: "x".into() },
            catch_up_secs: 1,
        };
        assert_eq!(plan_member_change(NodeId(1), &view, &blank), Err(MemberRefusal::MissingAddresses));
        let clash = MemberRequest::Add { node: NodeId(4), addresses: at(2), catch_up_secs: 1 };
        assert_eq!(
            plan_member_change(NodeId(1), &view, &clash),
            Err(MemberRefusal::AddressInUse { by: NodeId(2) })
        );
        let moved = MemberRequest::Add {
            node: NodeId(3),
            addresses: Addresses { http: "10.0.0.3:7070".into(), rpc: "10.0.0.3:7071".into() },
            catch_up_secs: 1,
        };
        assert_eq!(
            plan_member_change(NodeId(1), &view, &moved),
            Err(MemberRefusal::OtherAddresses { node: NodeId(3), known: at(3) })
        );
    }

    #[test]
    fn removals_keep_a_voter_and_the_leader() {
        let view = three();
        let remove = |n| MemberRequest::Remove { node: NodeId(n) };
        assert_eq!(
            plan_member_change(NodeId(1), &view, &remove(1)),
            Err(MemberRefusal::RemovesLeader { node: NodeId(1) })
        );
        assert_eq!(
            plan_member_change(NodeId(1), &view, &remove(9)),
            Err(MemberRefusal::NotAMember { node: NodeId(9) })
        );
        let plan = plan_member_change(NodeId(1), &view, &remove(3)).expect("plan");
        assert_eq!(
            plan,
            MemberPlan::RemoveVoter {
                node: NodeId(3),
                voters_after: [1, 2].into_iter().map(NodeId).collect()
            }
        );
        let mut with_learner = view.clone();
        with_learner.nodes.insert(NodeId(4), at(4));
        assert_eq!(
            plan_member_change(NodeId(1), &with_learner, &remove(4)),
            Ok(MemberPlan::RemoveLearner { node: NodeId(4) })
        );
        let alone = MemberView {
            voter_sets: vec![[NodeId(2)].into()],
            nodes: [(NodeId(1), at(1)), (NodeId(2), at(2))].into(),
        };
        assert_eq!(plan_member_change(NodeId(1), &alone, &remove(2)), Err(MemberRefusal::NoVoterLeft));
    }
}
