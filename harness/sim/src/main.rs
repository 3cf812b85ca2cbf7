//! `tidal-sim`: runs seeded simulation scenarios and prints one summary line per run and totals.
//!
//! `tidal-sim --seed S [--scenario NAME]` replays one run; `tidal-sim --seeds N [--first S]
//! [--scenario NAME]` sweeps seeds S..S+N over every scenario (or the one named). `TIDAL_SIM_SEED`
//! sets `--seed`. The last line is `sim: <runs> runs, <failed> failed, <violations> violations`.

use std::time::Instant;
use tidal_sim::faults::Counters;
use tidal_sim::{run, Scenario};

fn usage() -> ! {
    eprintln!("usage: tidal-sim [--seed S | --seeds N [--first S]] [--scenario steady|network|crash|chaos]");
    std::process::exit(2)
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TIDAL_SIM_LOG").unwrap_or_else(|_| "off".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut args = std::env::args().skip(1);
    let mut seed: Option<u64> = std::env::var("TIDAL_SIM_SEED").ok().and_then(|value| value.parse().ok());
    let mut seeds: Option<u64> = None;
    let mut first: u64 = 1;
    let mut scenario: Option<String> = None;
    while let Some(arg) = args.next() {
        let value = args.next().unwrap_or_else(|| usage());
        match arg.as_str() {
            "--seed" => seed = Some(value.parse().unwrap_or_else(|_| usage())),
            "--seeds" => seeds = Some(value.parse().unwrap_or_else(|_| usage())),
            "--first" => first = value.parse().unwrap_or_else(|_| usage()),
            "--scenario" => scenario = Some(value),
            _ => usage(),
        }
    }
    let scenarios = match &scenario {
        Some(name) => vec![Scenario::named(name).unwrap_or_else(|| usage())],
        None => Scenario::all(),
    };
    let runs: Vec<(u64, Scenario)> = match (seed, seeds) {
        (Some(seed), _) => scenarios.iter().map(|scenario| (seed, scenario.clone())).collect(),
        (None, count) => {
            let count = count.unwrap_or(4);
            (first..first + count)
                .flat_map(|seed| scenarios.iter().map(move |scenario| (seed, scenario.clone())))
                .collect()
        }
    };
    let started = Instant::now();
    let mut totals = Counters::default();
    let (mut failed, mut violations) = (0u64, 0u64);
    for (seed, scenario) in &runs {
        let run_started = Instant::now();
        let outcome = run(*seed, scenario)?;
        println!("{} | wall {:.1}s", outcome.summary(), run_started.elapsed().as_secs_f64());
        if !outcome.passed() {
            failed += 1;
            violations += outcome.violations.len() as u64;
            for violation in &outcome.violations {
                println!("    violation: {violation}");
            }
            println!(
                "    replay: cargo run --profile test -p tidal-sim -- --seed {seed} --scenario {}",
                scenario.name
            );
        }
        totals.add(&outcome.counters);
    }
    println!("faults injected: {totals}");
    println!("wall time: {:.1}s", started.elapsed().as_secs_f64());
    println!("sim: {} runs, {failed} failed, {violations} violations", runs.len());
    if failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}
