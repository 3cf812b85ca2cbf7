//! `tidal-model`: runs the bounded check, or with `--deep` the deep check and every planted bug.
//! The last line is `model-check: <states> states, <violations> violations, <found>/<planted> planted
//! bugs found`.
//!
//! `--bugs` runs the planted bugs only; `--bug <Name>` (repeatable) only the named ones;
//! `--durable-ships` checks every model with live ships of the durable log only (the rule before
//! decisions/023), to see which planted bugs need ships of unsynced batches; `--apply-after-fsync`
//! checks every model with followers applying only after their own fsync (the rule before
//! decisions/025); `--tail <batches>` and `--pulls <n>` set every model's ship-feed bound and
//! follower-pull budget (for tuning).

use tidal_model::check::{bounded, check, deep, planted, Search};
use tidal_model::{Bug, Bugs, Mode, ReplicationModel};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let named: Vec<&str> = args.windows(2).filter(|w| w[0] == "--bug").map(|w| w[1].as_str()).collect();
    let durable_ships = args.iter().any(|a| a == "--durable-ships");
    let apply_after_fsync = args.iter().any(|a| a == "--apply-after-fsync");
    let flag = |name: &str| args.windows(2).find(|w| w[0] == name).and_then(|w| w[1].parse::<u8>().ok());
    let (tail, pulls) = (flag("--tail"), flag("--pulls"));
    let variant = |model: ReplicationModel| {
        let model = if durable_ships { model.with_durable_ships() } else { model };
        let model = match tail {
            Some(batches) => model.with_tail(batches),
            None => model,
        };
        let model = match pulls {
            Some(max_pulls) => ReplicationModel { max_pulls, ..model },
            None => model,
        };
        if apply_after_fsync {
            model.with_apply_after_fsync()
        } else {
            model
        }
    };
    let wanted = |bug: &Bug| named.is_empty() || named.contains(&format!("{bug:?}").as_str());
    if let Some(at) = args.iter().position(|a| a == "--bounds") {
        // --bounds <nodes 3|5> <max term> <max writes> <quorum|leader> [crashes]: one run, for
        // tuning (with `--bug <Name>` planted, `--durable-ships`).
        let number = |i: usize| args.get(at + i).and_then(|a| a.parse::<u64>().ok()).unwrap_or(1);
        let mode = if args.get(at + 4).is_some_and(|a| a == "leader") { Mode::Leader } else { Mode::Quorum };
        let writes = u8::try_from(number(3)).unwrap_or(1);
        let model = if number(1) == 5 {
            ReplicationModel::five(number(2), writes, mode)
        } else {
            ReplicationModel::three(number(2), writes, mode)
        };
        let crashes = args.get(at + 5).and_then(|a| a.parse::<u8>().ok()).unwrap_or(model.max_crashes);
        let mut bugs = Bugs::default();
        for bug in Bug::ALL.iter().filter(|b| !named.is_empty() && wanted(b)) {
            bugs = bugs.with(*bug);
        }
        let model = variant(ReplicationModel { max_crashes: crashes, ..model }).with_bugs(bugs);
        let report = check("bounds", model, Search::Deep, false);
        println!("{}\n  reached: {}", report.line(), report.reached.join("; "));
        for (_, history) in &report.violations {
            println!("{history}");
        }
        return;
    }
    let deep_run = args.iter().any(|a| a == "--deep");
    let bugs_only = args.iter().any(|a| a == "--bugs") || !named.is_empty();
    let mut states = 0;
    let mut violations = 0;
    let models = if bugs_only {
        Vec::new()
    } else if deep_run {
        deep()
    } else {
        bounded().into_iter().map(|(name, model)| (name, model, Search::Deep)).collect()
    };
    for (name, model, search) in models {
        let report = check(name, variant(model), search, false);
        println!("{}", report.line());
        println!("  reached: {}", report.reached.join("; "));
        for (_, history) in &report.violations {
            println!("{history}");
        }
        states += report.states;
        violations += report.violations.len();
    }
    let mut found = 0;
    let bugs: Vec<Bug> =
        if deep_run || bugs_only { Bug::ALL.into_iter().filter(wanted).collect() } else { Vec::new() };
    for bug in &bugs {
        let (model, search) = planted(*bug);
        let report = check(&format!("planted {bug:?}"), variant(model), search, true);
        println!("{}", report.line());
        // The shortest of the counterexamples found (one per property broken).
        match report.violations.iter().min_by_key(|(_, history)| history.lines().count()) {
            Some((_, history)) => {
                found += 1;
                println!("{history}");
            }
            None => println!("  NOT FOUND"),
        }
    }
    println!(
        "model-check: {states} states, {violations} violations, {found}/{} planted bugs found",
        bugs.len()
    );
    if violations > 0 || found < bugs.len() {
        std::process::exit(1);
    }
}
