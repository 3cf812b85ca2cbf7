//! Membership: what this node knows of the members, and the leader's `members add/remove` verbs
//! (PROTOCOL.md, "Membership changes").
//!
//! openraft records the membership (voters, learners, their addresses) in its control log; every
//! node adopts the membership its openraft reports ([`Replica::adopt_membership`]): its peers (who
//! it probes, ships to, pulls from) and the voter sets commit is counted against. The cluster file
//! only seeds the first membership.
//!
//! Adding a node: openraft makes it a learner; the leader ships to it like to any follower, so it
//! pulls the history it lacks (or installs a snapshot); once it has matched the commit frontier IN
//! THIS TERM the leader counts commit against both the old and the new voter set, waits until a
//! majority of the new set has matched the frontier, and only then asks openraft for the new
//! configuration. Removing a voter is the same dual count without the catch-up. Delicate:
//! - the data path counts against the configuration the change code chose (pinned), not openraft's
//!   metrics, which arrive late; the pin is released once openraft has committed the new one;
//! - a learner is promoted on its `matched` (verified by the leader), never on a reported frontier;
//! - the leader does not remove itself: an operator promotes another node first.

use super::Replica;
use crate::control::NodeInfo;
use crate::error::{Error, Result};
use crate::spec::{ClusterSpec, NodeSpec};
use openraft::ChangeMembers;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tidal_protocol::{plan_member_change, Addresses, MemberPlan, MemberRequest, MemberView, Quorum};
use tokio::sync::watch;
// tokio's clock, not std's: the same instant in production (tokio reads std's clock), and the
// simulated clock under turmoil, so heartbeat pacing, pull and install rate limits and the
// promote/membership deadlines follow simulated time there (decisions/008, "Determinism").
use tidal_net::Peer;
use tidal_types::{NodeId, Seqno, Term};
use tokio::time::Instant;

/// Poll step while waiting for a learner to catch up or for the new voter set to match (re-checks
/// observable state each step; the deadline bounds it).
const CHANGE_POLL: Duration = Duration::from_millis(10);
/// How long, once the dual count has started, a majority of the new voter set may take to match.
const NEW_SET_DEADLINE: Duration = Duration::from_secs(10);
/// Progress is logged this often while a learner catches up.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Who the members are: peer handles and the voter sets, as openraft last reported them, and the
/// single-flight lock and quorum pin of a change in progress.
pub(super) struct Membership {
    /// Every other member (voters and learners), as openraft's membership says.
    peers: RwLock<BTreeMap<NodeId, Peer>>,
    /// The membership this node knows (openraft's, once its metrics arrive; the cluster file before).
    members: watch::Sender<Members>,
    /// Held while this leader changes the membership (single flight).
    changing_members: tokio::sync::Mutex<()>,
    /// Set while a membership change counts commit against a configuration openraft has not reported
    /// yet: metrics do not overwrite the commit quorum meanwhile.
    quorum_pinned: AtomicBool,
}

impl Membership {
    /// The first membership (the cluster file's) and a peer handle for every other member.
    pub(super) fn new(members: Members, peers: BTreeMap<NodeId, Peer>) -> Membership {
        Membership {
            peers: RwLock::new(peers),
            members: watch::channel(members).0,
            changing_members: tokio::sync::Mutex::new(()),
            quorum_pinned: AtomicBool::new(false),
        }
    }
}

/// The membership as this node knows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Members {
    /// Voter sets: one, or two while a joint configuration is in force.
    pub voter_sets: Vec<BTreeSet<NodeId>>,
    /// Every member, voters and learners, with its addresses.
    pub nodes: BTreeMap<NodeId, NodeSpec>,
}

impl Members {
    /// The first membership: every node of the cluster file is a voter.
    pub fn from_spec(spec: &ClusterSpec) -> Members {
        Members {
            voter_sets: vec![spec.nodes.iter().map(|node| node.id).collect()],
            nodes: spec.nodes.iter().map(|node| (node.id, node.clone())).collect(),
        }
    }

    /// The membership openraft reports (None while it reports no voter: a node waiting to join).
    pub fn from_openraft(membership: &openraft::Membership<u64, NodeInfo>) -> Option<Members> {
        let voter_sets: Vec<BTreeSet<NodeId>> = membership
            .get_joint_config()
            .iter()
            .map(|set| set.iter().copied().map(NodeId).collect())
            .filter(|set: &BTreeSet<NodeId>| !set.is_empty())
            .collect();
        if voter_sets.is_empty() {
            return None;
        }
        let nodes = membership
            .nodes()
            .map(|(&id, info)| {
                (NodeId(id), NodeSpec { id: NodeId(id), http: info.http.clone(), rpc: info.rpc.clone() })
            })
            .collect();
        Some(Members { voter_sets, nodes })
    }

    /// Whether `node` votes (in any voter set).
    pub fn is_voter(&self, node: NodeId) -> bool {
        self.voter_sets.iter().any(|set| set.contains(&node))
    }

    /// Every voter (the union of the voter sets).
    pub fn voters(&self) -> BTreeSet<NodeId> {
        self.voter_sets.iter().flatten().copied().collect()
    }

    /// Members that do not vote.
    pub fn learners(&self) -> BTreeSet<NodeId> {
        self.nodes.keys().copied().filter(|id| !self.is_voter(*id)).collect()
    }

    /// Whether a joint configuration is in force.
    pub fn is_joint(&self) -> bool {
        self.voter_sets.len() > 1
    }

    /// The commit quorum of this membership.
    pub fn quorum(&self) -> Quorum {
        Quorum { voter_sets: self.voter_sets.iter().map(|set| set.iter().copied().collect()).collect() }
    }
}

impl Members {
    /// The membership as the decision core sees it.
    pub fn view(&self) -> MemberView {
        MemberView {
            voter_sets: self.voter_sets.clone(),
            nodes: self
                .nodes
                .iter()
                .map(|(id, node)| (*id, Addresses { http: node.http.clone(), rpc: node.rpc.clone() }))
                .collect(),
        }
    }
}

impl MemberChange {
    /// The request as the decision core sees it.
    pub fn request(&self) -> MemberRequest {
        match self {
            MemberChange::Add { node, catch_up } => MemberRequest::Add {
                node: node.id,
                addresses: Addresses { http: node.http.clone(), rpc: node.rpc.clone() },
                catch_up_secs: catch_up.as_secs(),
            },
            MemberChange::Remove { node } => MemberRequest::Remove { node: *node },
        }
    }
}

/// A membership change an operator asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberChange {
    /// Add `node` (a learner until it has caught up, then a voter).
    Add {
        /// The new member and its addresses.
        node: NodeSpec,
        /// How long the learner may take to catch up before the verb gives up (it stays a learner;
        /// running the verb again resumes).
        catch_up: Duration,
    },
    /// Remove `node` (a voter or a learner).
    Remove {
        /// The member to remove.
        node: NodeId,
    },
}

/// What a membership change did (or, with `dry_run`, would do).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberReport {
    /// Voters before.
    pub voters_before: BTreeSet<NodeId>,
    /// Voters after (as planned for a dry run).
    pub voters_after: BTreeSet<NodeId>,
    /// Learners after.
    pub learners_after: BTreeSet<NodeId>,
    /// The term the leader changed it in.
    pub term: Term,
    /// How long it took (zero for a dry run).
    pub elapsed: Duration,
    /// What was done, in words.
    pub action: String,
}

/// A peer handle for `node`, through this node's dial override if it has one.
pub(super) fn connect(spec: &ClusterSpec, node: &NodeSpec, connector: &tidal_net::Connector) -> Result<Peer> {
    Peer::connect_lazy_with(spec.dial_address(node), &spec.secret, &spec.cluster_id, connector)
        .map_err(|e| Error::Spec(format!("node {}: {e}", node.id)))
}

/// Releases the quorum pin when a change ends, however it ends, and puts back the quorum of the
/// membership this node knows (openraft's, which by then holds the change if it was committed).
struct QuorumPin<'a>(&'a Replica);

impl Drop for QuorumPin<'_> {
    fn drop(&mut self) {
        self.0.membership.quorum_pinned.store(false, Ordering::SeqCst);
        let members = self.0.membership.members.borrow().clone();
        self.0.commit.set_quorum(members.quorum());
    }
}

impl Replica {
    /// The membership this node knows.
    pub fn members(&self) -> Members {
        self.membership.members.borrow().clone()
    }

    /// Whether any voter other than this node counts (a single-voter cluster ships to no one).
    pub(super) fn has_other_voters(&self) -> bool {
        self.membership.members.borrow().voters().iter().any(|voter| *voter != self.me)
    }

    /// The membership, watched (it changes when openraft reports a new one).
    pub(super) fn watch_members(&self) -> watch::Receiver<Members> {
        self.membership.members.subscribe()
    }

    /// The peer handle of another member.
    pub(super) fn peer(&self, node: NodeId) -> Option<Peer> {
        self.membership.peers.read().expect("peers lock is never held across a panic").get(&node).cloned()
    }

    /// Every other member with its peer handle.
    pub(super) fn peer_list(&self) -> Vec<(NodeId, Peer)> {
        let peers = self.membership.peers.read().expect("peers lock is never held across a panic");
        peers.iter().map(|(id, peer)| (*id, peer.clone())).collect()
    }

    /// Adopts the membership openraft reports: peers for new members (their ShipQueues start if this
    /// node leads), none for removed ones, and the voter sets commit counts against (unless a change
    /// on this leader has pinned them).
    pub(super) fn adopt_membership(&self, membership: &openraft::Membership<u64, NodeInfo>) {
        let Some(members) = Members::from_openraft(membership) else { return };
        if *self.membership.members.borrow() == members {
            return;
        }
        {
            let mut peers = self.membership.peers.write().expect("peers lock is never held across a panic");
            peers.retain(|id, _| members.nodes.contains_key(id));
            for (id, node) in &members.nodes {
                if *id == self.me || peers.contains_key(id) {
                    continue;
                }
                match connect(&self.spec, node, &self.connector) {
                    Ok(peer) => {
                        peers.insert(*id, peer);
                    }
                    Err(why) => {
                        tracing::error!(node = %id, "cannot reach the new member at {}: {why}", node.rpc)
                    }
                }
            }
        }
        self.forget_progress_except(&members);
        tracing::info!(
            voters = ?members.voter_sets, learners = ?members.learners(), "membership adopted"
        );
        // Members first, then the pin: a change ending meanwhile (QuorumPin's drop clears the pin,
        // then reads the members) or this adoption sets the quorum from the new membership.
        let quorum = members.quorum();
        self.membership.members.send_replace(members);
        if !self.membership.quorum_pinned.load(Ordering::SeqCst) {
            self.commit.set_quorum(quorum);
        }
    }

    /// Operator `members add` / `members remove`, on the serving leader. The plan comes from
    /// [`plan_member_change`]; a dry run reports it, a real run executes that same plan.
    pub async fn change_members(
        self: &Arc<Self>,
        change: MemberChange,
        dry_run: bool,
    ) -> Result<MemberReport, Error> {
        use Error::{Invalid, Unavailable};
        let started = Instant::now();
        let (control, term) = self.leading_control()?;
        let Ok(_single) = self.membership.changing_members.try_lock() else {
            return Err(Unavailable(
                "another membership change is running on this leader; retry when it ends".into(),
            ));
        };
        let before = self.members();
        let plan = plan_member_change(self.me, &before.view(), &change.request())
            .map_err(|refusal| Invalid(refusal.to_string()))?;
        let mut report = MemberReport {
            voters_before: before.voters(),
            voters_after: before.voters(),
            learners_after: before.learners(),
            term,
            elapsed: Duration::ZERO,
            action: String::new(),
        };
        match &plan {
            MemberPlan::AddVoter { node, voters_after, .. }
            | MemberPlan::RemoveVoter { node, voters_after } => {
                report.voters_after = voters_after.clone();
                report.learners_after.remove(node);
            }
            MemberPlan::RemoveLearner { node } => {
                report.learners_after.remove(node);
            }
            MemberPlan::AlreadyVoter { .. } => {}
        }
        if dry_run || matches!(plan, MemberPlan::AlreadyVoter { .. }) {
            report.action = match plan {
                MemberPlan::AlreadyVoter { .. } => plan.describe(),
                _ => format!("would {}", plan.describe()),
            };
            return Ok(report);
        }
        if before.is_joint() {
            tracing::warn!(voters = ?before.voter_sets, "a joint configuration is in force (an earlier change was cut short): this change finishes it");
        }
        tracing::info!(plan = %plan.describe(), %term, "membership change");
        report.action = self.execute_member_plan(&control, term, &before, plan).await?;
        self.adopt_membership(control.raft().metrics().borrow().membership_config.membership());
        report.elapsed = started.elapsed();
        Ok(report)
    }

    /// Carries out a plan of [`plan_member_change`]; returns what was done, in words.
    async fn execute_member_plan(
        self: &Arc<Self>,
        control: &crate::control::ControlPlane,
        term: Term,
        before: &Members,
        plan: MemberPlan,
    ) -> Result<String, Error> {
        use Error::Unavailable;
        match plan {
            MemberPlan::AlreadyVoter { node } => Ok(format!("node {node} is already a voter; nothing to do")),
            MemberPlan::AddVoter { node, addresses, new_learner, catch_up_secs, voters_after } => {
                if new_learner {
                    let info = NodeInfo { http: addresses.http, rpc: addresses.rpc };
                    control.raft().add_learner(node.0, info, false).await.map_err(|e| {
                        Unavailable(format!("openraft did not add node {node} as a learner: {e}"))
                    })?;
                    tracing::info!(%node, "added as a learner; catching up");
                    // The ShipQueue starts once openraft reports the learner (metrics arrive late).
                    self.adopt_membership(control.raft().metrics().borrow().membership_config.membership());
                }
                self.wait_caught_up(node, term, Duration::from_secs(catch_up_secs)).await?;
                let change = ChangeMembers::AddVoterIds(BTreeSet::from([node.0]));
                self.change_voters(control, term, before, voters_after, change).await?;
                Ok(format!("node {node} caught up as a learner and is now a voter"))
            }
            MemberPlan::RemoveVoter { node, voters_after } => {
                let change = ChangeMembers::RemoveVoters(BTreeSet::from([node.0]));
                self.change_voters(control, term, before, voters_after, change).await?;
                Ok(format!("voter {node} removed"))
            }
            MemberPlan::RemoveLearner { node } => {
                control
                    .raft()
                    .change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([node.0])), false)
                    .await
                    .map_err(|e| Unavailable(format!("openraft did not remove learner {node}: {e}")))?;
                Ok(format!("learner {node} removed"))
            }
        }
    }

    /// Waits until `node` has matched, in `term`, the commit frontier as it stands at each check.
    async fn wait_caught_up(&self, node: NodeId, term: Term, within: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + within;
        let mut next_report = Instant::now() + PROGRESS_EVERY;
        loop {
            if self.serving_term()? != term {
                return Err(Error::Unavailable(
                    "leadership moved while the learner caught up; retry on the new leader".into(),
                ));
            }
            let commit = self.commit.commit();
            let matched =
                self.commit.matched().get(&node).filter(|p| p.term == term).map_or(Seqno::ZERO, |p| p.seqno);
            if matched >= commit {
                tracing::info!(%node, %matched, %commit, "learner caught up");
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::Unavailable(format!(
                    "node {node} is a learner and still catching up (matched {matched} of commit {commit}); it keeps catching up: run the same members add again to make it a voter"
                )));
            }
            if Instant::now() >= next_report {
                let pulling = self.progress().get(&node).is_some_and(|p| p.pulling);
                tracing::info!(%node, %matched, %commit, pulling, "learner catching up");
                next_report = Instant::now() + PROGRESS_EVERY;
            }
            tokio::time::sleep(CHANGE_POLL).await;
        }
    }

    /// Counts commit against both voter sets, waits until a majority of the new set has matched the
    /// frontier in `term`, then has openraft commit the new configuration.
    async fn change_voters(
        &self,
        control: &crate::control::ControlPlane,
        term: Term,
        before: &Members,
        after: BTreeSet<NodeId>,
        change: ChangeMembers<u64, NodeInfo>,
    ) -> Result<(), Error> {
        let mut joint = before.voter_sets.clone();
        joint.push(after.clone());
        self.membership.quorum_pinned.store(true, Ordering::SeqCst);
        let _pin = QuorumPin(self);
        self.commit.set_quorum(Quorum {
            voter_sets: joint.iter().map(|set| set.iter().copied().collect()).collect(),
        });
        let new_set = Quorum::single(after.iter().copied().collect());
        let deadline = Instant::now() + NEW_SET_DEADLINE;
        loop {
            if self.serving_term()? != term {
                return Err(Error::Unavailable(
                    "leadership moved during the change; nothing was changed; retry on the new leader".into(),
                ));
            }
            let commit = self.commit.commit();
            let matched = self.commit.majority_matched(&new_set);
            if matched >= commit {
                break;
            }
            if Instant::now() >= deadline {
                return Err(Error::Unavailable(format!(
                    "a majority of the new voter set {after:?} has not matched the commit frontier {commit} (it has {matched}); nothing was changed"
                )));
            }
            tokio::time::sleep(CHANGE_POLL).await;
        }
        control.raft().change_membership(change, false).await.map_err(|e| {
            Error::Unavailable(format!(
                "openraft did not commit the new configuration: {e}; `tidal status` shows where it stands, run the verb again to finish"
            ))
        })?;
        // Committed: the new set alone counts from here. The pin's drop puts back the adopted
        // membership: the new one, or still the joint one if the metrics lag (safe: both counted).
        self.adopt_membership(control.raft().metrics().borrow().membership_config.membership());
        Ok(())
    }
}

impl Replica {
    /// Whether `node` is another member of the cluster (voter or learner), as openraft's membership
    /// says. Only members may ship to us, pull from us, fetch our snapshot or ask us to stand.
    pub(crate) fn is_member(&self, node: NodeId) -> bool {
        node != self.me && self.peer(node).is_some()
    }
}
