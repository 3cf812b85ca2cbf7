//! Issue 37's histories replayed step by step in the model. Every step must be one the model
//! offers (an action of `actions`, which changes the state), named by its printed form, so each
//! history reads as the checker prints it. With the finding's planted bug the history breaks a
//! safety property; as production now decides, the same steps break none. The checker finds these
//! histories on its own (t20, `make model-check`); these tests pin them in milliseconds.
#![allow(clippy::unwrap_used)]

use stateright::Model;
use tidal_model::properties::{
    LEADER_HOLDS_PREV, LOG_MATCHING, NO_HALT_ON_STALE_CHUNK, SAFETY, SOMETIMES_STALE_CHUNK_REFUSED,
};
use tidal_model::state::{Message, ModelState};
use tidal_model::{Bug, Bugs, Mode, ReplicationModel};
use tidal_types::{Seqno, Term, TermSeqno};

/// Replays `steps` from the initial state: each step is the first offered action whose printed form
/// starts with it and that changes the state. Returns every state, or which step failed.
fn replay(model: &ReplicationModel, steps: &[&str]) -> Vec<ModelState> {
    let mut states = vec![model.init_states().remove(0)];
    for (n, step) in steps.iter().enumerate() {
        let state = states.last().unwrap().clone();
        let mut actions = Vec::new();
        model.actions(&state, &mut actions);
        let next = actions
            .iter()
            .filter(|action| action.to_string().starts_with(step))
            .find_map(|action| model.next_state(&state, action.clone()));
        let Some(next) = next else {
            let offered: Vec<String> = actions.iter().map(|a| format!("      {a}")).collect();
            panic!(
                "step {} ({step}) is not offered or changes nothing; from\n{}offered:\n{}",
                n + 1,
                tidal_model::history::state_summary(&state),
                offered.join("\n")
            );
        };
        println!("{:>3}. {step}", n + 1);
        print!("{}", tidal_model::history::state_summary(&next));
        states.push(next);
    }
    states
}

/// The safety properties `state` breaks.
fn broken(model: &ReplicationModel, state: &ModelState) -> Vec<&'static str> {
    model
        .properties()
        .into_iter()
        .filter(|p| SAFETY.contains(&p.name) && !(p.condition)(model, state))
        .map(|p| p.name)
        .collect()
}

fn at(term: u64, seqno: u64) -> TermSeqno {
    TermSeqno { term: Term(term), seqno: Seqno(seqno) }
}

/// The ship in flight from `from` to `to`, as (prev, last batch seqno).
fn ship_prev(state: &ModelState, from: u64, to: u64) -> Option<TermSeqno> {
    state.network.messages().find_map(|m| match m {
        Message::Ship { from: f, to: t, prev, pull: false, .. } if f.0 == from && t.0 == to => Some(*prev),
        _ => None,
    })
}

/// Finding 1: n1 led term 1 alone (its LeaderStart (t1,1) is on n1 only); n2 leads terms 2 and 3
/// (LeaderStarts (t2,1), (t3,2)), and its one-batch tail rotates to the base (t2,1). n1 answers the
/// first heartbeat with Gap{(t1,1)}, which lines up with the tail's front.
#[test]
fn finding_1_a_gap_answer_lined_up_with_the_tail_front() {
    let model = ReplicationModel {
        max_crashes: 0,
        learn_terms: false,
        ..ReplicationModel::three(3, 0, Mode::Quorum)
    }
    .with_tail(1)
    .without_leader_pulls();
    let steps = [
        "n1: elected, votes {n1,n2}",
        "n1: probes n2",
        "n2: elected, votes {n2,n3}",
        "n2: probes n3",
        "n2: elected, votes {n2,n1}",
        "n2: fsync done",
        "n2: probes n1",
        "n2: its ShipQueue for n1 ships",
        "n1: gets ship {t3, prev (t3, 2), []",
        "n2: its ShipQueue for n1 ships",
        "n1: gets ship {t3, prev (t",
    ];
    let planted = model.clone().with_bugs(Bugs::one(Bug::ShipFollowerPrev));
    let states = replay(&planted, &steps);
    assert_eq!(ship_prev(&states[10], 2, 1), Some(at(1, 1)), "a57b07b ships after the follower's own last");
    assert_eq!(broken(&planted, &states[10]), vec![LEADER_HOLDS_PREV]);
    assert!(broken(&planted, &states[11]).contains(&LOG_MATCHING), "n1 holds [t1 t3], n2 [t2 t3]");

    let states = replay(&model, &steps);
    assert_eq!(ship_prev(&states[10], 2, 1), Some(at(2, 1)), "resumed from n2's own log");
    assert!(states.iter().all(|s| broken(&model, s).is_empty()), "n1 answers Diverged");
}

/// Finding 2: n1 and n2 hold (t1,1), n3 holds (t2,1). n1, elected in term 3, passes n2's pull check
/// after (t1,1), then adopts n3's log (quarantine from 1, (t2,1), its LeaderStart (t3,2)); the
/// reader of n2's pull opens after that.
#[test]
fn finding_2_a_pull_checked_before_its_source_adopts_another_log() {
    let model = ReplicationModel { max_crashes: 0, ..ReplicationModel::three(3, 0, Mode::Quorum) };
    let steps = [
        "n1: elected, votes {n1,n2}",
        "n1: probes n2",
        "n1: its ShipQueue for n2 ships",
        "n2: gets ship",
        "n1: its ShipQueue for n2 ships",
        "n2: gets ship",
        "n3: elected, votes {n3,n2}",
        "n3: probes n2",
        "n3: fsync done",
        "n1: fsync done",
        "n2: fsync done",
        "n1: elected, votes {n1,n3}",
        "n2: learns term t3",
        "n2: pulls from n1",
        "n1: probes n3",
        "n1: pulls from n3",
        "n3: opens the reader of n1's pull",
        "n1: gets chunk",
        "n1: fsync done",
        "n1: opens the reader of n2's pull after (t1, 1)",
    ];
    let planted = model.clone().with_bugs(Bugs::one(Bug::PullCheckThenRead));
    let mut with_delivery = steps.to_vec();
    with_delivery.push("n2: gets chunk {t3, prev (t1, 1), [2:t3]");
    let states = replay(&planted, &with_delivery);
    assert_eq!(broken(&planted, &states[20]), vec![LEADER_HOLDS_PREV]);
    assert!(broken(&planted, &states[21]).contains(&LOG_MATCHING), "n2 holds [t1 t3], n1 [t2 t3]");

    let states = replay(&model, &steps);
    let last = states.last().unwrap();
    assert!(last.history.pull_prev_gone, "the reader re-checks (t1,1) and answers Diverged");
    assert!(!last.network.messages().any(|m| matches!(m, Message::Ship { pull: true, .. })), "no chunk");
    assert!(states.iter().all(|s| broken(&model, s).is_empty()));
}

/// Finding 3: n2's LeaderStart (t1,1) reaches n1, n2's crash loses it, openraft puts n2 back in
/// office in term 1; with the guard of a57b07b it writes another LeaderStart at (t1,1).
#[test]
fn finding_3_a_restored_office_whose_leader_start_was_lost() {
    let model = ReplicationModel { learn_terms: false, ..ReplicationModel::three(1, 0, Mode::Quorum) }
        .without_leader_pulls();
    let steps = [
        "n2: elected, votes {n2,n1}",
        "n2: probes n1",
        "n2: its ShipQueue for n1 ships",
        "n1: gets ship",
        "n2: its ShipQueue for n1 ships",
        "n2: crash + restart",
        "n2: back in office in the same term",
        "n2: probes n1",
    ];
    for bug in [Bug::ResumeLostLeaderStart, Bug::ResumeAfterRestart] {
        let planted = model.clone().with_bugs(Bugs::one(bug));
        let mut with_delivery = steps.to_vec();
        with_delivery.push("n1: gets ship {t1, prev (t0, 0), [1:t1]");
        let states = replay(&planted, &with_delivery);
        assert!(broken(&planted, &states[9]).contains(&LOG_MATCHING), "{bug:?}: n1 holds t1, n2 t1'");
    }
    let states = replay(&model, &steps);
    let last = states.last().unwrap();
    assert!(last.history.handed_over, "resumes_a_term: the restored term is handed over");
    assert!(last.nodes[1].wal.is_empty(), "no second LeaderStart");
    let mut with_delivery = steps.to_vec();
    with_delivery.push("n1: gets ship {t1, prev (t0, 0), [1:t1]");
    let states = replay(&model, &with_delivery);
    assert!(states.iter().all(|s| broken(&model, s).is_empty()));
}

/// A finding of this model (decisions/006): n2 pulls from n1 while n1 is taking office in term 3;
/// n1's reader serves its log of then ((t1,1)); n1 adopts n2's log, opens, and n2 commits (t3,2);
/// the stale chunk then conflicts below n2's commit. At 58e6e09 decide_ship halted n2 and
/// `append_only` kept the Halt (the planted bug HaltOnStaleChunk): quorum mode halted for good. Now
/// the chunk is refused and n2 goes on.
#[test]
fn a_chunk_from_a_node_taking_office_is_refused_by_a_follower_that_committed_since() {
    let model = ReplicationModel { max_crashes: 0, ..ReplicationModel::three(3, 0, Mode::Quorum) };
    let steps = [
        "n1: elected, votes {n1,n3}",
        "n1: probes n3",
        "n1: fsync done",
        "n2: elected, votes {n2,n3}",
        "n2: probes n3",
        "n2: fsync done",
        "n1: elected, votes {n1,n2}",
        "n2: pulls from n1",
        "n1: opens the reader of n2's pull after (t0, 0)",
        "n1: probes n2",
        "n1: pulls from n2",
        "n2: opens the reader of n1's pull",
        "n1: gets chunk",
        "n1: fsync done",
        "n1: its ShipQueue for n2 ships",
        "n2: gets ship",
        "n1: its ShipQueue for n2 ships",
        "n2: gets ship {t3, prev (t2, 1), [2:t3]",
        "n2: fsync done",
        "n1: gets ack",
        "n1: its ShipQueue for n2 ships",
        "n2: gets ship {t3, prev (t3, 2), [], commit 2}",
        "n2: gets chunk {t3, prev (t0, 0), [1:t1]",
    ];
    let planted = ReplicationModel { bugs: Bugs::one(Bug::HaltOnStaleChunk), ..model.clone() };
    let states = replay(&planted, &steps);
    assert_eq!(broken(&planted, states.last().unwrap()), vec![NO_HALT_ON_STALE_CHUNK]);
    let states = replay(&model, &steps);
    let last = states.last().unwrap();
    assert_eq!(last.nodes[1].commit, Seqno(2));
    assert!(last.history.stale_chunk_refused, "the stale chunk is refused");
    let reached = model
        .properties()
        .into_iter()
        .find(|p| p.name == SOMETIMES_STALE_CHUNK_REFUSED)
        .map(|p| (p.condition)(&model, last));
    assert_eq!(reached, Some(true));
    assert!(states.iter().all(|s| broken(&model, s).is_empty()), "no halt, no broken safety property");
}
