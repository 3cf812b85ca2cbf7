//! Running the checker: the bounded check, the deep check and the planted bugs.

use std::time::{Duration, Instant};

use stateright::{Checker, HasDiscoveries, Model};

use crate::history::worked_history;
use crate::model::{Action, Bug, Bugs, Mode, ReplicationModel};
use crate::properties::SAFETY;
use crate::state::ModelState;
use crate::symmetry::representative;

/// What one run of the checker found.
#[derive(Debug)]
pub struct CheckReport {
    /// What was checked.
    pub name: String,
    /// Unique states explored.
    pub states: usize,
    /// Deepest path explored.
    pub max_depth: usize,
    /// Wall time.
    pub elapsed: Duration,
    /// Safety properties with a counterexample, each with its worked history.
    pub violations: Vec<(String, String)>,
    /// `sometimes` properties reached.
    pub reached: Vec<String>,
}

impl CheckReport {
    /// One line: name, states, depth, time, violations.
    pub fn line(&self) -> String {
        format!(
            "{}: {} states, depth {}, {:.1} s, {} violations",
            self.name,
            self.states,
            self.max_depth,
            self.elapsed.as_secs_f64(),
            self.violations.len()
        )
    }
}

/// How to explore.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Search {
    /// Breadth first without symmetry reduction: counterexamples are shortest.
    Shortest,
    /// Depth first with symmetry reduction: the fewest states for a complete check.
    Deep,
    /// Depth first with symmetry reduction, stopping after this many generated states (repeats
    /// included): not exhaustive.
    DeepCapped(usize),
}

/// Explores every state of `model` (within the bounds of `search`). With `stop_at_violation`
/// (planted bugs), stops at the first safety violation.
pub fn check(name: &str, model: ReplicationModel, search: Search, stop_at_violation: bool) -> CheckReport {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(2));
    let started = Instant::now();
    let mut builder = model.clone().checker().threads(threads);
    if let Some(seconds) = std::env::var("TIDAL_MODEL_TIMEOUT_S").ok().and_then(|s| s.parse().ok()) {
        builder = builder.timeout(Duration::from_secs(seconds));
    }
    if stop_at_violation {
        builder = builder.finish_when(HasDiscoveries::AnyFailures);
    }
    let checker: Box<dyn Checker<ReplicationModel>> = match search {
        Search::Shortest => Box::new(builder.spawn_bfs().join()),
        Search::Deep => Box::new(builder.symmetry_fn(representative).spawn_dfs().join()),
        Search::DeepCapped(states) => {
            Box::new(builder.symmetry_fn(representative).target_state_count(states).spawn_dfs().join())
        }
    };
    let elapsed = started.elapsed();
    let mut violations = Vec::new();
    let mut reached = Vec::new();
    let mut discoveries: Vec<_> = checker.discoveries().into_iter().collect();
    discoveries.sort_by_key(|(name, _)| *name);
    for (property, path) in discoveries {
        if SAFETY.contains(&property) {
            let steps = up_to_first_violation(&model, path.into_vec(), property);
            violations.push((property.to_string(), worked_history(&model, &steps, property)));
        } else {
            reached.push(property.to_string());
        }
    }
    CheckReport {
        name: name.to_string(),
        states: checker.unique_state_count(),
        max_depth: checker.max_depth(),
        elapsed,
        violations,
        reached,
    }
}

/// `steps` cut at the first state that breaks `property`. The checker records the LAST violating
/// path it met before it stopped (stateright overwrites a discovery while a block of states is
/// being explored), which may carry steps after the violation; they are dropped.
fn up_to_first_violation(
    model: &ReplicationModel,
    mut steps: Vec<(ModelState, Option<Action>)>,
    property: &str,
) -> Vec<(ModelState, Option<Action>)> {
    let Some(condition) = model.properties().into_iter().find(|p| p.name == property).map(|p| p.condition)
    else {
        return steps;
    };
    if let Some(first) = steps.iter().position(|(state, _)| !condition(model, state)) {
        steps.truncate(first + 1);
    }
    steps
}

/// The bounded check run by `make test`: both durability modes on 3 nodes, small enough for the test
/// profile (opt-level 1) on a slow machine.
pub fn bounded() -> Vec<(&'static str, ReplicationModel)> {
    vec![
        // With a crash: a leader ships its LeaderStart unsynced, a follower keeps it, the leader's
        // crash loses it, and the leader of term 2 meets it (decisions/023).
        ("3 nodes, quorum, 2 terms, LeaderStarts only, 1 crash", ReplicationModel::three(2, 0, Mode::Quorum)),
        ("3 nodes, quorum, 1 term, 1 write, 1 crash", ReplicationModel::three(1, 1, Mode::Quorum)),
        ("3 nodes, leader, 1 term, 1 write, 1 crash", ReplicationModel::three(1, 1, Mode::Leader)),
        (
            "3 nodes, quorum, 1 term, 1 write, 1 crash, commit notices",
            ReplicationModel::three(1, 1, Mode::Quorum).with_notices(),
        ),
    ]
}

/// The deep check run by `make model-check` (release build).
pub fn deep() -> Vec<(&'static str, ReplicationModel, Search)> {
    vec![
        (
            "3 nodes, quorum, 2 terms, 1 write, 1 crash",
            ReplicationModel::three(2, 1, Mode::Quorum),
            Search::Deep,
        ),
        (
            "3 nodes, quorum, 3 terms, LeaderStarts only, no crash (capped at 8M generated states)",
            ReplicationModel { max_crashes: 0, ..ReplicationModel::three(3, 0, Mode::Quorum) },
            Search::DeepCapped(8_000_000),
        ),
        (
            "3 nodes, quorum, 2 terms, 1 write, 1 crash, commit notices (capped at 8M generated states)",
            ReplicationModel::three(2, 1, Mode::Quorum).with_notices(),
            Search::DeepCapped(8_000_000),
        ),
        (
            "3 nodes, leader, 2 terms, 1 write, no crash",
            ReplicationModel { max_crashes: 0, ..ReplicationModel::three(2, 1, Mode::Leader) },
            Search::Deep,
        ),
        (
            "5 nodes + membership change, quorum, 2 terms, LeaderStarts only, no crash (capped at 3M generated states)",
            ReplicationModel { max_crashes: 0, ..ReplicationModel::five(2, 0, Mode::Quorum) },
            Search::DeepCapped(3_000_000),
        ),
    ]
}

/// Each planted bug with the smallest model that exposes it, and how to search it.
pub fn planted(bug: Bug) -> (ReplicationModel, Search) {
    let model = match bug {
        // Figure 8 of the Raft paper needs four terms: LeaderStarts are the only batches it needs.
        Bug::CountOlderTerm => ReplicationModel {
            max_crashes: 0,
            learn_terms: false,
            ..ReplicationModel::three(4, 0, Mode::Quorum)
        },
        Bug::SkipDualCount => {
            ReplicationModel { max_crashes: 0, ..ReplicationModel::five(2, 1, Mode::Quorum) }
        }
        Bug::ApplyPastCommit => ReplicationModel::three(1, 1, Mode::Quorum),
        Bug::NoticePastMatched => ReplicationModel::three(1, 1, Mode::Quorum).with_notices(),
        // Two terms of LeaderStarts: n1's uncommitted start of term 1 survives on n1 into term 2.
        Bug::StalePullReplaces => {
            ReplicationModel { max_crashes: 0, ..ReplicationModel::three(2, 0, Mode::Quorum) }
                .with_notices()
                .with_follower_pulls()
        }
        // One term of LeaderStart: both followers (one learns the term from a heartbeat) fsync and
        // ack it before the leader's own fsync.
        Bug::CommitPastOwnDurable => {
            ReplicationModel { max_crashes: 0, ..ReplicationModel::three(1, 0, Mode::Quorum) }
        }
        // One term, one crash: the leader ships its LeaderStart unsynced, a follower fsyncs it, the
        // leader's crash loses it; back in office in the same term, it writes a second LeaderStart
        // at the same (term, seqno).
        Bug::ResumeAfterRestart => {
            ReplicationModel { learn_terms: false, ..ReplicationModel::three(1, 0, Mode::Quorum) }
        }
        // One term, one write, notices: a ship of [1] is delivered after a notice of commit 2
        // reached the follower; taking the notice uncapped at write time commits past its log.
        Bug::NoticePastWritten => {
            ReplicationModel { max_crashes: 0, ..ReplicationModel::three(1, 1, Mode::Quorum) }.with_notices()
        }
        // One term of LeaderStart, one crash: a follower writes the committed LeaderStart, applies it
        // before its fsync, crashes, and keeps the applied frontier the WAL lost.
        Bug::PersistPastDurable => ReplicationModel::three(1, 0, Mode::Quorum),
        Bug::AckBeforeFsync
        | Bug::NoTermRecheck
        | Bug::AcceptLowerTerm
        | Bug::ServeBeforeLeaderStart
        | Bug::ChooseByCommit => ReplicationModel::three(2, 1, Mode::Quorum),
    };
    // Breadth first: the counterexample printed is a shortest one. Follower pulls multiply the
    // messages in flight: depth first finds that one sooner.
    let search = if bug == Bug::StalePullReplaces { Search::Deep } else { Search::Shortest };
    (model.with_bugs(Bugs::one(bug)), search)
}
