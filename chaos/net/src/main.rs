//! `tidal-netchaos`: network chaos against the real `tidal` binary. Three nodes, each in its own
//! network namespace behind a veth on a bridge; faults made with `ip link` and `tc` (partitions
//! full and partial, one-way cuts, asymmetric loss, latency, a flapping link) and with signals
//! (SIGKILL + restart, SIGSTOP/SIGCONT), while writers put unique items through every node. Every
//! fault is healed and checked; the run ends with one digest across all nodes and every
//! acknowledged write read back from every node. chaos/README.md ("Network chaos") tells how to
//! run it and read its report.

mod cluster;
mod drop_filter;
mod fault;
mod load;
mod report;
mod run;
mod topology;

use anyhow::Context;
use clap::Parser;
use fault::{FaultClass, Schedule, SplitMix64};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// The environment variable under which a machine that cannot run the harness is a failure, not a
/// skip (`.ci/run` sets it when it has made sure the machine can).
const REQUIRED_ENV: &str = "TIDAL_NETCHAOS_REQUIRED";

#[derive(Parser, Debug)]
#[command(
    name = "tidal-netchaos",
    about = "Network chaos in network namespaces against the real tidal binary"
)]
struct Args {
    /// The `tidal` binary (default: the one beside this binary, i.e. the same cargo profile).
    #[arg(long)]
    tidal: Option<PathBuf>,
    /// Soak: draw random faults from --seed for this many minutes (default: one pass over every class).
    #[arg(long)]
    soak_minutes: Option<u64>,
    /// The soak schedule's seed (printed; the same seed replays the same schedule). Default: the clock.
    #[arg(long)]
    seed: Option<u64>,
    /// Only these classes (comma list; names as the report prints them).
    #[arg(long, value_delimiter = ',')]
    class: Vec<String>,
    /// How long each fault of a pass lasts, in seconds.
    #[arg(long, default_value_t = 6)]
    hold_seconds: u64,
    /// Concurrent writers.
    #[arg(long, default_value_t = 3)]
    writers: usize,
    /// Keep the data dirs and node logs even when the run passes.
    #[arg(long)]
    keep: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(why) = topology::unavailable_because() {
        println!("skipped: {why}");
        if std::env::var_os(REQUIRED_ENV).is_some() {
            eprintln!("{REQUIRED_ENV} is set: this machine must run network chaos");
            return ExitCode::FAILURE;
        }
        return ExitCode::SUCCESS;
    }
    match run_or_interrupt(args).await {
        Ok(passed) if passed => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("netchaos: harness error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs, unless Ctrl-C or SIGTERM comes first: then the run is dropped, which kills the nodes
/// and removes the namespaces, links and bridge.
async fn run_or_interrupt(args: Args) -> anyhow::Result<bool> {
    let stale = topology::remove_stale();
    if stale > 0 {
        println!("removed {stale} namespaces left by earlier runs that were killed");
    }
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("install SIGTERM handler")?;
    tokio::select! {
        outcome = run_and_report(args) => outcome,
        _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted (Ctrl-C); namespaces removed"),
        _ = terminate.recv() => anyhow::bail!("terminated (SIGTERM); namespaces removed"),
    }
}

async fn run_and_report(args: Args) -> anyhow::Result<bool> {
    let binary = match args.tidal {
        Some(binary) => binary,
        None => std::env::current_exe().context("locate this binary")?.with_file_name("tidal"),
    };
    anyhow::ensure!(binary.exists(), "no tidal binary at {} (build it, or pass --tidal)", binary.display());
    let classes = if args.class.is_empty() {
        FaultClass::ALL.to_vec()
    } else {
        args.class
            .iter()
            .map(|name| FaultClass::parse(name).with_context(|| format!("no fault class {name}")))
            .collect::<anyhow::Result<_>>()?
    };
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_secs())
    });
    let (schedule, budget) = match args.soak_minutes {
        Some(minutes) => {
            let only = if args.class.is_empty() {
                String::new()
            } else {
                format!(" --class {}", args.class.join(","))
            };
            println!(
                "soak: {minutes} minutes, seed {seed} (replay: --soak-minutes {minutes} --seed {seed}{only})"
            );
            let schedule = Schedule::Random { classes, hold_range: (3, 15), rng: SplitMix64(seed) };
            (schedule, Some(Duration::from_secs(60 * minutes)))
        }
        None => (Schedule::Pass { classes, hold: Duration::from_secs(args.hold_seconds), next: 0 }, None),
    };
    let root = tempfile::Builder::new().prefix("tidal-netchaos-").tempdir().context("make data dir")?;
    // A private copy: every start and restart of the run execs the same build, even if cargo
    // rebuilds the original meanwhile (a soak lasts long enough for that to happen).
    let copy = root.path().join("tidal");
    std::fs::copy(&binary, &copy).with_context(|| format!("copy {} into the run dir", binary.display()))?;
    println!("data dirs and node logs: {}; binary {} (copied)", root.path().display(), binary.display());
    let binary = copy;
    let options =
        run::Options { binary, root: root.path().to_path_buf(), writers: args.writers, schedule, budget };
    let outcome = run::run(options).await;
    let passed = outcome.as_ref().is_ok_and(|report| report.violations.is_empty() && report.lost() == 0);
    if !passed || args.keep {
        println!("kept: {}", root.keep().display());
    }
    let report = outcome?;
    println!("{}", report.render());
    Ok(passed)
}
