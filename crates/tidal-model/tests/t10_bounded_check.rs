//! The bounded model check run by `make test`: every state of the bounded models, no violation, and
//! the interesting states reached.
#![allow(clippy::unwrap_used)]

use tidal_model::check::{bounded, check, Search};
use tidal_model::properties::{
    SOMETIMES_ACKED, SOMETIMES_FOLLOWER_APPLIED_PAST_DURABLE, SOMETIMES_HANDED_OVER, SOMETIMES_LEADER_CHANGE,
    SOMETIMES_QUARANTINE,
};

#[test]
fn bounded_models_have_no_violation_and_reach_the_interesting_states() {
    let mut reached = Vec::new();
    let mut states = 0;
    for (name, model) in bounded() {
        let report = check(name, model, Search::Deep, false);
        println!("{}", report.line());
        for (_, history) in &report.violations {
            println!("{history}");
        }
        assert!(report.violations.is_empty(), "{name}: {} violations", report.violations.len());
        assert!(report.states > 1_000, "{name}: only {} states", report.states);
        states += report.states;
        reached.extend(report.reached);
    }
    println!("bounded check: {states} states");
    for expected in [
        SOMETIMES_ACKED,
        SOMETIMES_LEADER_CHANGE,
        SOMETIMES_QUARANTINE,
        SOMETIMES_FOLLOWER_APPLIED_PAST_DURABLE,
        SOMETIMES_HANDED_OVER,
    ] {
        assert!(reached.iter().any(|r| r == expected), "never reached \"{expected}\"");
    }
}
