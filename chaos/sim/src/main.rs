//! `tidal-sim`: runs seeded simulation scenarios and prints one line per run and a summary.
//!
//! - `tidal-sim --seed S [--scenario NAME]` replays one run (every scenario, or the one named);
//!   `TIDAL_SIM_SEED` sets `--seed`.
//! - `tidal-sim --seeds N [--first S] [--scenario NAME[,NAME..]]` sweeps seeds S..S+N over every
//!   scenario (or those named). The last line is `sim: <runs> runs, <failed> failed, <violations>
//!   violations`.
//! - `--chaos` (what `make chaos` runs): the regressions file is replayed first (its closed
//!   entries), then the sweep; progress lines, a summary table (runs, faults injected by class,
//!   violations, by scenario), and the last line exactly `chaos: <runs> runs, <violations> violations`.
//! - `--regressions` replays only the regressions file (`--open` adds its open entries).
//! - `--jobs J` runs J simulations at once (default 1). With J > 1 each run is a child process of
//!   its own (`--report-json`), so that runs do not share tokio's process-wide task numbers and
//!   every run replays alone exactly as it ran in the sweep (decisions/052).
//! - `--crash-sweep [--ks 1,2,4] [--seed S] [--jobs J]` (what `make crash-sweep` runs): the
//!   crash-point sweep (every durability boundary x k x lost/torn, one run each; `crashpoint.rs`).
//!   With J > 1 each run is a child process (`--point I --report-json`), as for the seeds. The last line is
//!   `crash-points: <covered>/<total> points, <runs> runs, <lost> acknowledged writes lost, <v> violations`.
//!   It exits non-zero on a violation and on a point not reached.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tidal_sim::{regressions, run, Outcome, Scenario};

fn usage() -> ! {
    eprintln!(
        "usage: tidal-sim [--seed S | --seeds N [--first S]] [--scenario {}[,..]] [--chaos] [--regressions [--open]] [--jobs J] | --crash-sweep [--ks 1,2,..] [--seed S] [--jobs J] [--point I --report-json]",
        Scenario::names().join("|")
    );
    std::process::exit(2)
}

/// What the sweep keeps of one run; a child process (`--report-json`) prints it as one JSON line
/// after [`REPORT_PREFIX`].
#[derive(serde::Serialize, serde::Deserialize)]
struct Report {
    summary: String,
    acked: u64,
    counters: BTreeMap<String, u64>,
    violations: Vec<tidal_sim::violation::Violation>,
    story: Vec<String>,
}

const REPORT_PREFIX: &str = "REPORT ";

impl Report {
    fn of(outcome: &Outcome) -> Report {
        Report {
            summary: outcome.summary(),
            acked: outcome.stats.acked,
            counters: outcome.counters.0.iter().map(|(class, count)| (class.to_string(), *count)).collect(),
            violations: outcome.violations.clone(),
            story: outcome.story.clone(),
        }
    }
}

/// Runs this binary with `args` (which end in `--report-json`) and reads the report the child
/// prints after [`REPORT_PREFIX`]; `what` names the run in an error.
fn child_report<T: serde::de::DeserializeOwned>(args: &[String], what: &str) -> anyhow::Result<T> {
    let output = std::process::Command::new(std::env::current_exe()?)
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .find_map(|line| line.strip_prefix(REPORT_PREFIX))
        .ok_or_else(|| anyhow::anyhow!("{what}: the child ended ({}) without a report", output.status))?;
    Ok(serde_json::from_str(line)?)
}

/// Runs `seed` of `scenario` in a child process of this binary and reads its report.
fn run_in_child(seed: u64, scenario: &Scenario) -> anyhow::Result<Report> {
    let args = ["--seed", &seed.to_string(), "--scenario", scenario.name, "--report-json"].map(String::from);
    child_report(&args, &format!("seed {seed} of {}", scenario.name))
}

/// Runs point `index` of the crash-point sweep over `ks` in a child process and reads its report.
fn point_in_child(seed: u64, ks: &[u64], index: usize) -> anyhow::Result<tidal_sim::PointRun> {
    let ks: Vec<String> = ks.iter().map(u64::to_string).collect();
    let args = [
        "--crash-sweep",
        "--seed",
        &seed.to_string(),
        "--ks",
        &ks.join(","),
        "--point",
        &index.to_string(),
        "--report-json",
    ]
    .map(String::from);
    child_report(&args, &format!("crash-sweep run {index}"))
}

/// Fault counts by class, summed over runs.
#[derive(Default)]
struct Counts(BTreeMap<String, u64>);

impl Counts {
    fn add(&mut self, counts: &BTreeMap<String, u64>) {
        for (class, count) in counts {
            *self.0.entry(class.clone()).or_default() += count;
        }
    }
}

impl std::fmt::Display for Counts {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        tidal_sim::faults::write_counts(formatter, self.0.iter())
    }
}

/// Per-scenario totals of a sweep.
#[derive(Default)]
struct Row {
    runs: u64,
    failed: u64,
    violations: u64,
    acked: u64,
    wall: Duration,
    faults: Counts,
}

/// Log lines carry the simulated time (the host's clock), so two replays' logs can be diffed.
/// Lines from outside a host (the nodes' own threads) carry `-`.
struct SimTime;

impl tracing_subscriber::fmt::time::FormatTime for SimTime {
    fn format_time(&self, writer: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        match turmoil::sim_elapsed() {
            Some(elapsed) => write!(writer, "{:>10.6}", elapsed.as_secs_f64()),
            None => write!(writer, "{:>10}", "-"),
        }
    }
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TIDAL_SIM_LOG").unwrap_or_else(|_| "off".into()),
        )
        .with_writer(std::io::stderr)
        .with_timer(SimTime)
        .with_thread_ids(false)
        .init();
    let mut args = std::env::args().skip(1);
    let mut seed: Option<u64> = std::env::var("TIDAL_SIM_SEED").ok().and_then(|value| value.parse().ok());
    let mut seeds: Option<u64> = None;
    let mut first: u64 = 1;
    let mut scenario: Option<String> = None;
    let (mut chaos, mut only_regressions, mut open) = (false, false, false);
    let mut report_json = false;
    let mut crash_sweep = false;
    let mut ks: Vec<u64> = vec![1, 2, 3, 5, 8];
    let mut jobs = 1usize;
    let mut point: Option<usize> = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--chaos" => chaos = true,
            "--crash-sweep" => crash_sweep = true,
            "--regressions" => only_regressions = true,
            "--open" => open = true,
            "--report-json" => report_json = true,
            flag => {
                let value = args.next().unwrap_or_else(|| usage());
                match flag {
                    "--seed" => seed = Some(value.parse().unwrap_or_else(|_| usage())),
                    "--seeds" => seeds = Some(value.parse().unwrap_or_else(|_| usage())),
                    "--first" => first = value.parse().unwrap_or_else(|_| usage()),
                    "--scenario" => scenario = Some(value),
                    "--jobs" => jobs = value.parse().unwrap_or_else(|_| usage()),
                    "--point" => point = Some(value.parse().unwrap_or_else(|_| usage())),
                    "--ks" => {
                        ks = value.split(',').map(|k| k.parse().unwrap_or_else(|_| usage())).collect();
                    }
                    _ => usage(),
                }
            }
        }
    }
    if crash_sweep {
        let seed = seed.unwrap_or(1);
        if report_json {
            // A child of a crash-point sweep with `--jobs` > 1: one run, one report line.
            let index =
                point.ok_or_else(|| anyhow::anyhow!("--crash-sweep --report-json needs --point I"))?;
            let run = tidal_sim::crash_point_run(seed, &ks, index)?;
            println!("{REPORT_PREFIX}{}", serde_json::to_string(&run)?);
            return Ok(());
        }
        let started = Instant::now();
        let progress = |line: &str| println!("{line}");
        let totals = if jobs > 1 {
            // Each run in a child process, as the seed sweep's (decisions/052): a failing point then
            // replays alone exactly as it ran here.
            tidal_sim::crash_sweep_with(&ks, jobs, &progress, &|index| point_in_child(seed, &ks, index))?
        } else {
            tidal_sim::crash_sweep(seed, &ks, 1, &progress)?
        };
        println!();
        for (label, lines) in &totals.failures {
            println!("FAIL {label}");
            for line in lines {
                println!("    {line}");
            }
        }
        println!(
            "not covered: {}",
            if totals.missed.is_empty() { "none".into() } else { totals.missed.join(", ") }
        );
        println!("wall time: {:.1}s ({} jobs)", started.elapsed().as_secs_f64(), jobs.max(1));
        println!("{}", totals.line());
        // A point not reached is a hole in the proof, not a pass: the sweep fails on it too (14
        // points at k=8 went unreached for days while it passed; docs/measurements.md,
        // 2026-12-03).
        if !totals.failures.is_empty() || !totals.missed.is_empty() {
            std::process::exit(1);
        }
        return Ok(());
    }
    let scenarios: Vec<Scenario> = match &scenario {
        Some(names) => {
            names.split(',').map(|name| Scenario::named(name).unwrap_or_else(|| usage())).collect()
        }
        None => Scenario::all(),
    };
    let mut runs: Vec<(u64, Scenario, &'static str)> = Vec::new();
    if chaos || only_regressions {
        for entry in regressions::entries()? {
            let selected = scenarios.iter().any(|scenario| scenario.name == entry.scenario);
            if selected && (open || !entry.open) {
                let scenario = Scenario::named(&entry.scenario).ok_or_else(|| {
                    anyhow::anyhow!("regressions.txt names unknown scenario {}", entry.scenario)
                })?;
                runs.push((entry.seed, scenario, "regression"));
            }
        }
    }
    if !only_regressions {
        match (seed, seeds) {
            (Some(seed), _) => runs.extend(scenarios.iter().map(|scenario| (seed, scenario.clone(), "seed"))),
            (None, count) => {
                let count = count.unwrap_or(4);
                for seed in first..first + count {
                    runs.extend(scenarios.iter().map(|scenario| (seed, scenario.clone(), "sweep")));
                }
            }
        }
    }
    if report_json {
        // A child of a sweep with `--jobs` > 1: one run, one report line.
        let [(seed, scenario, _)] = runs.as_slice() else {
            anyhow::bail!("--report-json runs exactly one seed of one scenario");
        };
        let outcome = run(*seed, scenario)?;
        println!("{REPORT_PREFIX}{}", serde_json::to_string(&Report::of(&outcome))?);
        return Ok(());
    }
    let started = Instant::now();
    let total = runs.len();
    let isolated = jobs > 1;
    let next = AtomicUsize::new(0);
    let (sender, receiver) = mpsc::channel::<(usize, anyhow::Result<Report>, Duration)>();
    let mut rows: BTreeMap<&'static str, Row> = BTreeMap::new();
    let mut totals = Counts::default();
    let (mut failed, mut violations, mut done) = (0u64, 0u64, 0usize);
    std::thread::scope(|scope| -> anyhow::Result<()> {
        for _ in 0..jobs.max(1) {
            let sender = sender.clone();
            let (runs, next) = (&runs, &next);
            scope.spawn(move || loop {
                let index = next.fetch_add(1, Ordering::SeqCst);
                let Some((seed, scenario, _)) = runs.get(index) else { return };
                let run_started = Instant::now();
                let outcome = if isolated {
                    run_in_child(*seed, scenario)
                } else {
                    run(*seed, scenario).map(|outcome| Report::of(&outcome))
                };
                if sender.send((index, outcome, run_started.elapsed())).is_err() {
                    return;
                }
            });
        }
        drop(sender);
        for (index, outcome, wall) in receiver {
            let (seed, scenario, origin) = &runs[index];
            let outcome = outcome?;
            done += 1;
            println!(
                "[{done}/{total}] {} | wall {:.1}s{}",
                outcome.summary,
                wall.as_secs_f64(),
                match *origin {
                    "regression" => " | regression",
                    _ => "",
                }
            );
            if outcome.violations.is_empty() && std::env::var_os("TIDAL_SIM_STORY").is_some() {
                // `TIDAL_SIM_STORY=1`: what the driver did, in passing runs too.
                for line in &outcome.story {
                    println!("    trace: {line}");
                }
            }
            let row = rows.entry(scenario.name).or_default();
            row.runs += 1;
            row.acked += outcome.acked;
            row.wall += wall;
            row.faults.add(&outcome.counters);
            if !outcome.violations.is_empty() {
                failed += 1;
                row.failed += 1;
                row.violations += outcome.violations.len() as u64;
                violations += outcome.violations.len() as u64;
                for violation in &outcome.violations {
                    println!("    violation: {violation}");
                }
                for line in &outcome.story {
                    println!("    trace: {line}");
                }
                println!(
                    "    replay: cargo run --profile test -p tidal-sim -- --seed {seed} --scenario {}",
                    scenario.name
                );
            }
            totals.add(&outcome.counters);
        }
        Ok(())
    })?;
    let wall = started.elapsed();
    println!();
    println!(
        "{:<16} {:>5} {:>6} {:>10} {:>7} {:>9}  faults",
        "scenario", "runs", "failed", "violations", "acked", "wall/run"
    );
    for (name, row) in &rows {
        println!(
            "{:<16} {:>5} {:>6} {:>10} {:>7} {:>8.1}s  {}",
            name,
            row.runs,
            row.failed,
            row.violations,
            row.acked,
            row.wall.as_secs_f64() / row.runs.max(1) as f64,
            row.faults
        );
    }
    println!();
    println!("faults injected by class:");
    for (class, count) in &totals.0 {
        println!("  {class:<24} {count}");
    }
    println!("wall time: {:.1}s ({} jobs)", wall.as_secs_f64(), jobs.max(1));
    if chaos {
        println!("chaos: {total} runs, {violations} violations");
    } else {
        println!("sim: {total} runs, {failed} failed, {violations} violations");
    }
    if failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}
