//! Bounded simulation runs for `make test`: a few fixed seeds, one per scenario family, each must
//! keep every invariant. `TIDAL_SIM_SEED` replaces the fixed seeds (replay). The 32-seed
//! determinism measurement is `#[ignore]`d (minutes): `make sim-determinism`.

use tidal_sim::{run, Scenario};

fn seeds(fixed: &[u64]) -> Vec<u64> {
    match std::env::var("TIDAL_SIM_SEED").ok().and_then(|value| value.parse().ok()) {
        Some(seed) => vec![seed],
        None => fixed.to_vec(),
    }
}

fn check(scenario: &str, fixed: &[u64]) {
    let scenario = Scenario::named(scenario).expect("scenario exists");
    for seed in seeds(fixed) {
        let outcome = run(seed, &scenario).expect("the simulation runs");
        println!("{}", outcome.summary());
        assert!(
            outcome.passed(),
            "seed {seed} scenario {} broke invariants (replay: TIDAL_SIM_SEED={seed} cargo nextest run -p tidal-sim --test sim {}):\n{}",
            scenario.name,
            scenario.name,
            outcome.violations.join("\n")
        );
        assert!(outcome.stats.acked > 0, "seed {seed}: no write was acknowledged");
    }
}

#[test]
fn steady() {
    check("steady", &[1]);
}

#[test]
fn network() {
    check("network", &[1, 2, 3]);
}

#[test]
fn crash() {
    check("crash", &[1, 2, 3]);
}

/// Seeds 3 and 120 once broke log matching (two leaders in one term: openraft's default vote
/// order; docs/decisions/008-simulation.md); they stay in the set.
#[test]
fn chaos() {
    check("chaos", &[1, 2, 3, 120]);
}

/// 32 seeds, each run twice: the fault plan must be the same (it is drawn from the seed alone);
/// the trace hash (faults as applied, acknowledgements with their seqnos, the final digest) is
/// compared and the figure printed. Exact replay is not asserted: the node's real threads (WAL
/// writer, applier, fjall) race the simulated clock (docs/decisions/008-simulation.md).
#[test]
#[ignore = "minutes: make sim-determinism"]
fn determinism() {
    let scenario_name = std::env::var("TIDAL_SIM_SCENARIO").unwrap_or_else(|_| "chaos".into());
    let scenario = Scenario::named(&scenario_name).expect("scenario exists");
    let mut same = 0;
    let mut failed = Vec::new();
    for seed in 1..=32 {
        let first = run(seed, &scenario).expect("the simulation runs");
        let second = run(seed, &scenario).expect("the simulation runs");
        assert_eq!(first.plan_hash, second.plan_hash, "seed {seed}: the fault plan differs between replays");
        let equal = first.trace_hash == second.trace_hash;
        same += u32::from(equal);
        println!(
            "seed {seed}: trace {} / {} {}",
            first.trace_hash,
            second.trace_hash,
            if equal { "same" } else { "DIFFERENT" }
        );
        for outcome in [&first, &second] {
            if !outcome.passed() {
                failed.push(format!("seed {seed}: {}", outcome.violations.join("; ")));
            }
        }
    }
    println!("determinism ({scenario_name}): {same}/32 seeds replayed to the same trace hash");
    assert!(failed.is_empty(), "runs broke invariants:\n{}", failed.join("\n"));
}
