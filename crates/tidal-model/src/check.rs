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
    /// Breadth first without symmetry reduction, every path of at most this many steps: exhaustive
    /// up to that depth (for bounds too large to explore completely).
    Steps(usize),
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
        // stateright counts the initial state as depth 1.
        Search::Steps(steps) => Box::new(builder.target_max_depth(steps + 1).spawn_bfs().join()),
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
/// profile (opt-level 1) on a slow machine. Followers pull from their leader in one of them only:
/// a single pull multiplies the states by about twenty.
pub fn bounded() -> Vec<(&'static str, ReplicationModel)> {
    vec![
        // A leader ships its LeaderStart unsynced, the leader of term 2 opens without it, and a
        // follower that holds it is told Diverged and quarantines it.
        (
            "3 nodes, quorum, 2 terms, LeaderStarts only, no crash",
            ReplicationModel { max_crashes: 0, ..ReplicationModel::three(2, 0, Mode::Quorum) }
                .without_leader_pulls(),
        ),
        // A one-batch tail: the LeaderStart falls off the front at the first write, and a follower
        // that lacks it is nudged to pull; a crashed leader is put back in office and hands over.
        (
            "3 nodes, quorum, 1 term, 1 write, 1 crash, one-batch tail",
            ReplicationModel::three(1, 1, Mode::Quorum).with_tail(1).without_leader_pulls(),
        ),
        (
            "3 nodes, quorum, 1 term, LeaderStart only, 1 crash, 1 follower pull",
            ReplicationModel::three(1, 0, Mode::Quorum),
        ),
        (
            "3 nodes, leader, 1 term, 1 write, 1 crash",
            ReplicationModel::three(1, 1, Mode::Leader).without_leader_pulls(),
        ),
        (
            "3 nodes, quorum, 1 term, 1 write, no crash, commit notices",
            ReplicationModel { max_crashes: 0, ..ReplicationModel::three(1, 1, Mode::Quorum) }
                .with_notices()
                .without_leader_pulls(),
        ),
    ]
}

/// The deep check run by `make model-check` (release build).
pub fn deep() -> Vec<(&'static str, ReplicationModel, Search)> {
    vec![
        (
            "3 nodes, quorum, 2 terms, 1 write, 1 crash",
            ReplicationModel::three(2, 1, Mode::Quorum).without_leader_pulls(),
            Search::Deep,
        ),
        (
            "3 nodes, quorum, 2 terms, LeaderStarts only, no crash, 1 follower pull",
            ReplicationModel { max_crashes: 0, ..ReplicationModel::three(2, 0, Mode::Quorum) },
            Search::Deep,
        ),
        // Three terms with a crash, complete: the planted ShipFollowerPrev and ResumeLostLeaderStart
        // are found in these bounds too (depth first, in 10 and 22 s).
        (
            "3 nodes, quorum, 3 terms, LeaderStarts only, 1 crash, terms spread by votes only",
            ReplicationModel { learn_terms: false, ..ReplicationModel::three(3, 0, Mode::Quorum) }
                .without_leader_pulls(),
            Search::Deep,
        ),
        // Issue 37, finding 1's bounds with today's rules: three terms, a one-batch tail.
        (
            "3 nodes, quorum, 3 terms, LeaderStarts only, no crash, terms spread by votes only, one-batch tail",
            planted(Bug::ShipFollowerPrev).0.with_bugs(Bugs::default()),
            Search::Deep,
        ),
        // Issue 37, finding 2's bounds with today's rules: three terms won by n1, n3, n1, a follower
        // pull; every history of up to 24 steps (the finding's is 20).
        (
            "3 nodes, quorum, 3 terms won by n1, n3, n1, LeaderStarts only, no crash, 1 follower pull (every path of up to 24 steps)",
            planted(Bug::PullCheckThenRead).0.with_bugs(Bugs::default()),
            Search::Steps(24),
        ),
        // Issue 37's bounds: three terms, two restarts, a partition (any message may be lost), a
        // one-batch tail, a follower pull.
        (
            "3 nodes, quorum, 3 terms, LeaderStarts only, 2 crashes, 1 follower pull, one-batch tail (capped at 30M generated states)",
            ReplicationModel { max_crashes: 2, ..ReplicationModel::three(3, 0, Mode::Quorum) }.with_tail(1),
            Search::DeepCapped(30_000_000),
        ),
        (
            "3 nodes, quorum, 2 terms, 1 write, 1 crash, commit notices (capped at 8M generated states)",
            ReplicationModel::three(2, 1, Mode::Quorum).with_notices().without_leader_pulls(),
            Search::DeepCapped(8_000_000),
        ),
        (
            "3 nodes, leader, 2 terms, 1 write, no crash",
            ReplicationModel { max_crashes: 0, ..ReplicationModel::three(2, 1, Mode::Leader) }.without_leader_pulls(),
            Search::Deep,
        ),
        (
            "5 nodes + membership change, quorum, 2 terms, LeaderStarts only, no crash (capped at 3M generated states)",
            ReplicationModel { max_crashes: 0, ..ReplicationModel::five(2, 0, Mode::Quorum) }.without_leader_pulls(),
            Search::DeepCapped(3_000_000),
        ),
    ]
}

/// `TIDAL_MODEL_SEARCH` (`shortest`, `deep`, `deep:<generated states>`, `steps:<n>`): overrides
/// how a planted bug is searched (for tuning).
fn search_override() -> Option<Search> {
    let value = std::env::var("TIDAL_MODEL_SEARCH").ok()?;
    let number = |prefix: &str| value.strip_prefix(prefix).and_then(|n| n.parse().ok());
    match value.as_str() {
        "shortest" => Some(Search::Shortest),
        "deep" => Some(Search::Deep),
        _ => number("deep:").map(Search::DeepCapped).or_else(|| number("steps:").map(Search::Steps)),
    }
}

/// Each planted bug with the smallest model that exposes it, and how to search it.
pub fn planted(bug: Bug) -> (ReplicationModel, Search) {
    let model = match bug {
        // Figure 8 of the Raft paper needs four terms: LeaderStarts are the only batches it needs,
        // and its schedule (n1, n2, n1, n2 win terms 1-4). With ships on write every ship ends
        // with the leader's own LeaderStart, so every ack names a batch of its term and the
        // relabelling never applies (that schedule explored completely: no violation); with ships
        // of the durable log only (as before decisions/027; the model's `with_durable_ships`) a follower
        // acks an older-term batch.
        Bug::CountOlderTerm => ReplicationModel {
            max_crashes: 0,
            learn_terms: false,
            ..ReplicationModel::three(4, 0, Mode::Quorum)
        }
        .with_durable_ships()
        .with_winners(&[1, 2, 1, 2]),
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
        // Issue 37, finding 1, with a one-batch tail: n3 led term 1 alone ((t1,1) on n3 only); n1
        // leads terms 2 and 3 (LeaderStarts (t2,1), (t3,2)); its tail rotates to base (t2,1). n3
        // answers Gap with (t1,1), which lines up with the front.
        Bug::ShipFollowerPrev => ReplicationModel {
            max_crashes: 0,
            learn_terms: false,
            ..ReplicationModel::three(3, 0, Mode::Quorum)
        }
        .with_tail(1)
        .without_leader_pulls(),
        // Issue 37, finding 2: n1 and n2 hold (t1,1), n3 (t2,1); n1, elected in term 3, passes
        // n2's pull check, adopts n3's log ((t2,1), then its LeaderStart (t3,2)), and the reader
        // opens after that. Twenty steps over three terms: too deep for a breadth-first search
        // over every election, so the history's schedule is fixed (n1, n3, n1 win terms 1-3).
        Bug::PullCheckThenRead => {
            ReplicationModel { max_crashes: 0, ..ReplicationModel::three(3, 0, Mode::Quorum) }
                .with_winners(&[1, 3, 1])
        }
        // Issue 37, finding 3: ResumeAfterRestart's history; the guard of a57b07b does not stop it
        // because the crash took the LeaderStart (`write_leader_start` is true).
        Bug::ResumeLostLeaderStart => {
            ReplicationModel { learn_terms: false, ..ReplicationModel::three(1, 0, Mode::Quorum) }
                .without_leader_pulls()
        }
        // The model's own finding after issue 37's: n1 (t1) and n2 (t2) each hold their LeaderStart
        // at 1; n1 wins term 3 and, while it takes office, serves n2's pull of its old (t1,1); n2
        // commits n1's adopted log first, then the chunk arrives. The schedule is fixed (n1, n2, n1
        // win terms 1-3), as for PullCheckThenRead.
        Bug::HaltOnStaleChunk => {
            ReplicationModel { max_crashes: 0, ..ReplicationModel::three(3, 0, Mode::Quorum) }
                .with_winners(&[1, 2, 1])
        }
        Bug::AckBeforeFsync
        | Bug::NoTermRecheck
        | Bug::AcceptLowerTerm
        | Bug::ServeBeforeLeaderStart
        | Bug::ChooseByCommit => ReplicationModel::three(2, 1, Mode::Quorum),
    };
    // Breadth first: the counterexample printed is a shortest one. Follower pulls multiply the
    // messages in flight: depth first finds that one sooner.
    let search = if bug == Bug::StalePullReplaces { Search::Deep } else { Search::Shortest };
    // Followers pulling from their leader matter to finding 2 only; the other planted bugs are
    // searched without them (smaller models).
    let pulls = matches!(bug, Bug::PullCheckThenRead | Bug::HaltOnStaleChunk);
    let model = if pulls { model } else { model.without_leader_pulls() };
    (model.with_bugs(Bugs::one(bug)), search_override().unwrap_or(search))
}
