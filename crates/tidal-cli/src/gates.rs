//! `tidal gates`: the exit gates, measured on a local cluster of real `tidal serve` processes.
//!
//! Each gate prints exactly one line on stdout, `gate <name>: <figure> (goal <goal>) PASS` (or
//! `FAIL`), then one summary line; progress goes to stderr. The command exits non-zero when any
//! gate fails. A gate that cannot be measured (a node does not come up, Redis cannot be run) FAILS
//! and says why in its figure; it never prints a made-up number.
//!
//! The gates reuse the other commands' code: the cluster is started, killed and restarted with
//! `cluster_cmd`, load and latency come from `bench::measure`, failover rounds from
//! `ops::failover_rounds`. The Redis anchor is the peer script in `bench/peers`, run from a
//! writable copy in the same sitting.
//!
//! Delicate: the gates time real processes on a shared machine, so their figures are noisy; compare
//! figures taken in the same run. Every wait polls observable state (readiness, frontiers, digests)
//! with a deadline; the only timed pause is the follower's down window of the heal gate, which is
//! the scenario itself.

use crate::bench::{self, BenchArgs, Workload};
use crate::cluster_cmd;
use anyhow::Context;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tidal_client::Client;

/// Every gate, in the order they run.
pub const GATE_NAMES: [&str; 4] = ["read-anywhere", "replication-lag", "heal-100k", "failover"];
/// Goal of the read-anywhere gate: p99 from a write's ack until every node serves it.
const READ_ANYWHERE_P99_GOAL_MS: f64 = 100.0;
/// Goal of the failover gate: p99 from the leader's SIGKILL to the next acknowledged write.
const FAILOVER_P99_GOAL: Duration = Duration::from_secs(2);
/// First item ids of each gate's writes: disjoint ranges, so no gate overwrites another's items.
const READ_ANYWHERE_ID_BASE: u64 = 1_000_000_000;
const RATE_PROBE_ID_BASE: u64 = 2_000_000_000;
const LAG_LOAD_ID_BASE: u64 = 3_000_000_000;
const LAG_SAMPLE_ID_BASE: u64 = 4_000_000_000;
const HEAL_ID_BASE: u64 = 5_000_000_000;
/// How long a restarted follower may take to converge before the heal gate gives up.
const HEAL_CONVERGE_TIMEOUT: Duration = Duration::from_secs(900);
/// How often convergence is polled (the resolution of the heal duration).
const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// heal-100k: how long the other nodes may take to apply and flush the writes before the restart.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(120);

/// `tidal gates` options; every knob also reads a `GATE_*` environment variable.
#[derive(Clone, Debug, clap::Args)]
pub struct GatesArgs {
    /// Run only these gates (comma separated): read-anywhere, replication-lag, heal-100k, failover.
    #[arg(long, value_delimiter = ',', env = "GATES")]
    pub only: Vec<String>,
    /// Parent folder of the cluster's temporary folder (data dirs, logs, cluster file).
    #[arg(long, env = "GATE_TMP")]
    pub tmp: Option<PathBuf>,
    /// Keep the cluster folder afterwards (for reading the node logs).
    #[arg(long, env = "GATE_KEEP")]
    pub keep: bool,
    /// HTTP port of node 1 (RPC ports are 100 higher); if any is taken, the next free base 1000 up.
    #[arg(long, env = "GATE_PORT_BASE", default_value_t = 25070)]
    pub port_base: u16,
    /// read-anywhere: writes measured (each read back on every node).
    #[arg(long, env = "GATE_SAMPLES", default_value_t = 2000)]
    pub samples: u64,
    /// replication-lag: seconds of the maximum-rate probe.
    #[arg(long, env = "GATE_RATE_SECONDS", default_value_t = 10)]
    pub rate_seconds: u64,
    /// replication-lag: lag samples (sequential writes, as the Redis script's LAG_WRITES).
    #[arg(long, env = "GATE_LAG_SAMPLES", default_value_t = 1000)]
    pub lag_samples: u64,
    /// replication-lag: bound in seconds on the lag phase.
    #[arg(long, env = "GATE_LAG_SECONDS", default_value_t = 60)]
    pub lag_seconds: u64,
    /// replication-lag: the peer scripts folder, bench/peers (read only; a writable copy is made
    /// under --anchors-work). Without it the gate fails: there is nothing to compare with.
    #[arg(long, env = "GATE_ANCHORS")]
    pub anchors: Option<PathBuf>,
    /// Where the writable copy of the anchors lives (kept, so their setup runs once).
    #[arg(long, env = "GATE_ANCHORS_WORK", default_value = "target/anchors-work")]
    pub anchors_work: PathBuf,
    /// heal-100k: seconds the follower stays down while the items are written.
    #[arg(long, env = "GATE_DOWN_SECONDS", default_value_t = 600)]
    pub down_seconds: u64,
    /// heal-100k: items written while the follower is down.
    #[arg(long, env = "GATE_HEAL_ITEMS", default_value_t = 100_000)]
    pub heal_items: u64,
    /// heal-100k: write each item's 128-dim embedding instead of its metadata (the catch-up
    /// bandwidth case: about 590 WAL bytes per write instead of about 100).
    #[arg(long, env = "GATE_HEAL_EMBEDDINGS")]
    pub heal_embeddings: bool,
    /// failover: SIGKILL rounds.
    #[arg(long, env = "GATE_FAILOVER_ROUNDS", default_value_t = 20)]
    pub failover_rounds: u32,
    /// Also write each gate's figures as `key=value` lines to this file (for the bench report).
    #[arg(long, env = "GATE_RESULTS")]
    pub results: Option<PathBuf>,
}

/// One gate's verdict.
#[derive(Clone, Debug)]
pub struct Verdict {
    /// Gate name.
    pub name: &'static str,
    /// What was measured, readable.
    pub figure: String,
    /// The goal, readable.
    pub goal: String,
    /// Whether the figure meets the goal.
    pub pass: bool,
    /// The figures as `key=value` pairs, for machines.
    pub values: Vec<(String, String)>,
}

impl Verdict {
    fn failed(name: &'static str, goal: &str, why: &anyhow::Error) -> Verdict {
        let why = format!("{why:#}").replace('\n', " ");
        Verdict {
            name,
            figure: format!("not measured: {why}"),
            goal: goal.into(),
            pass: false,
            values: vec![("error".into(), format!("{why:?}"))],
        }
    }

    /// The gate's line: `gate <name>: <figure> (goal <goal>) PASS|FAIL`.
    pub fn line(&self) -> String {
        format!(
            "gate {}: {} (goal {}) {}",
            self.name,
            self.figure,
            self.goal,
            if self.pass { "PASS" } else { "FAIL" }
        )
    }
}

/// Runs the selected gates on a fresh local 3-node cluster, prints one line per gate and a summary;
/// returns whether every gate passed (an error only when the run itself could not be set up).
pub async fn run(args: GatesArgs) -> anyhow::Result<bool> {
    for name in &args.only {
        anyhow::ensure!(GATE_NAMES.contains(&name.as_str()), "unknown gate {name:?}; gates: {GATE_NAMES:?}");
    }
    let selected = |name: &str| args.only.is_empty() || args.only.iter().any(|only| only == name);
    let parent = args.tmp.clone().unwrap_or_else(std::env::temp_dir);
    let folder = tempfile::Builder::new()
        .prefix("tidal-gates")
        .tempdir_in(&parent)
        .with_context(|| format!("create a cluster folder in {}", parent.display()))?;
    let dir = folder.path().to_path_buf();
    eprintln!("gates: local cluster in {}", dir.display());
    write_back_dirty_pages().await;
    let started = Instant::now();
    let verdicts = run_on_cluster(&args, &dir, &selected).await;
    let stopped = cluster_cmd::stop(&dir, |line| eprintln!("gates: {line}"));
    if args.keep {
        eprintln!("gates: kept {}", folder.keep().display());
    }
    let verdicts = verdicts?;
    stopped?;
    if let Some(path) = &args.results {
        write_results(path, &verdicts)?;
    }
    let failed = verdicts.iter().filter(|verdict| !verdict.pass).count();
    println!(
        "gates: {} passed, {failed} failed, in {:.0} s",
        verdicts.len() - failed,
        started.elapsed().as_secs_f64()
    );
    Ok(failed == 0)
}

async fn run_on_cluster(
    args: &GatesArgs,
    dir: &Path,
    selected: &dyn Fn(&str) -> bool,
) -> anyhow::Result<Vec<Verdict>> {
    let port_base = cluster_cmd::free_port_base(args.port_base, 3)?;
    let (membership, _) = cluster_cmd::start(3, dir, port_base).await.context("start the cluster")?;
    let nodes: Vec<(u64, String)> =
        membership.spec.nodes.iter().map(|node| (node.id.0, format!("http://{}", node.http))).collect();
    let mut verdicts = Vec::new();
    let mut report = |verdict: Verdict| {
        println!("{}", verdict.line());
        let _ = std::io::stdout().flush();
        verdicts.push(verdict);
    };
    if selected("read-anywhere") {
        let goal = format!("p99 <= {READ_ANYWHERE_P99_GOAL_MS} ms");
        let verdict = read_anywhere(args, &nodes, &goal).await;
        report(verdict.unwrap_or_else(|why| Verdict::failed("read-anywhere", &goal, &why)));
    }
    if selected("replication-lag") {
        let goal = "p99 below the Redis anchor's p99 in the same run";
        let verdict = replication_lag(args, &nodes).await;
        report(verdict.unwrap_or_else(|why| Verdict::failed("replication-lag", goal, &why)));
    }
    if selected("heal-100k") {
        let goal = "converged via the stream: 0 snapshot installs, 0 heal calls, digests equal";
        let verdict = heal(args, dir, &nodes, goal).await;
        report(verdict.unwrap_or_else(|why| Verdict::failed("heal-100k", goal, &why)));
    }
    if selected("failover") {
        let goal = format!("p99 <= {} ms", FAILOVER_P99_GOAL.as_millis());
        let verdict = failover(args, dir, &goal).await;
        report(verdict.unwrap_or_else(|why| Verdict::failed("failover", &goal, &why)));
    }
    Ok(verdicts)
}

fn write_results(path: &Path, verdicts: &[Verdict]) -> anyhow::Result<()> {
    let mut text = String::new();
    for verdict in verdicts {
        text.push_str(verdict.name);
        text.push_str(&format!(" pass={}", verdict.pass));
        for (key, value) in &verdict.values {
            text.push_str(&format!(" {key}={value}"));
        }
        text.push('\n');
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("create {}", parent.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("write {}", path.display()))
}

fn value(key: &str, value: impl ToString) -> (String, String) {
    (key.to_string(), value.to_string())
}

/// A write on each node in turn (followers forward), read back with `min_seqno` on every node.
async fn read_anywhere(args: &GatesArgs, nodes: &[(u64, String)], goal: &str) -> anyhow::Result<Verdict> {
    eprintln!(
        "gates: read-anywhere: {} writes, round robin over every node, each read on every node",
        args.samples
    );
    let bench = BenchArgs {
        url: nodes[0].1.clone(),
        followers: nodes[1..].iter().map(|(_, url)| url.clone()).collect(),
        workload: Workload::ReadAnywhere,
        concurrency: 4,
        seconds: 600,
        requests_max: args.samples,
        id_base: READ_ANYWHERE_ID_BASE,
        quiet: true,
        ..Default::default()
    };
    let summary = bench::measure(&bench).await?;
    let acked = summary.requests - summary.errors;
    Ok(Verdict {
        name: "read-anywhere",
        figure: format!(
            "p99 {:.2} ms (p50 {:.2}, max {:.2}) over {acked} writes on {} nodes, {} errors",
            summary.p99_ms,
            summary.p50_ms,
            summary.max_ms,
            nodes.len(),
            summary.errors
        ),
        goal: goal.into(),
        pass: acked > 0 && summary.errors == 0 && summary.p99_ms <= READ_ANYWHERE_P99_GOAL_MS,
        values: vec![
            value("writes", acked),
            value("errors", summary.errors),
            value("p50_ms", format!("{:.3}", summary.p50_ms)),
            value("p99_ms", format!("{:.3}", summary.p99_ms)),
            value("max_ms", format!("{:.3}", summary.max_ms)),
        ],
    })
}

/// Finds the maximum sustained rate of single-item writes on the leader, then measures ack ->
/// visible on every follower under a paced background load at half that rate; then runs the Redis
/// anchor's lag measurement and compares the p99s.
async fn replication_lag(args: &GatesArgs, nodes: &[(u64, String)]) -> anyhow::Result<Verdict> {
    let leader = leader_url(nodes, Duration::from_secs(30)).await?;
    let followers: Vec<String> =
        nodes.iter().filter(|(_, url)| *url != leader).map(|(_, url)| url.clone()).collect();
    let probe = max_rate_probe(args, &leader).await?;
    let max_rate = probe.acked_per_second();
    let half_rate = (max_rate / 2.0).round().max(1.0) as u64;
    // Samples taken while the nodes still applied or flushed the probe's writes would measure the
    // probe, not the paced load (the Redis anchor's lag phase starts on a fresh primary). So far
    // they had always drained by now (experiments/041): this wait is insurance, and it is reported.
    let target = Client::new(leader.clone(), None).status().await.context("leader status")?.commit_seqno;
    let urls: Vec<String> = nodes.iter().map(|(_, url)| url.clone()).collect();
    let settled = settle(&urls, target, SETTLE_TIMEOUT).await?;
    eprintln!(
        "gates: replication-lag: max {max_rate:.0} writes/s; every node settled {:.2} s after the probe; {} lag samples under a paced load of {half_rate}/s",
        settled.as_secs_f64(),
        args.lag_samples
    );
    let (load, lag) = lag_under_load(args, &leader, followers, half_rate).await?;
    let values = vec![
        value("max_rate", format!("{max_rate:.0}")),
        value("max_rate_p50_ms", format!("{:.3}", probe.p50_ms)),
        value("max_rate_p99_ms", format!("{:.3}", probe.p99_ms)),
        value("settle_seconds", format!("{:.3}", settled.as_secs_f64())),
        value("load_rate", format!("{:.0}", load.acked_per_second())),
        value("load_errors", load.errors),
        value("samples", lag.requests),
        value("p50_ms", format!("{:.3}", lag.p50_ms)),
        value("p99_ms", format!("{:.3}", lag.p99_ms)),
        value("max_ms", format!("{:.3}", lag.max_ms)),
        value("first_follower_p50_ms", format!("{:.3}", lag.first_p50_ms)),
        value("first_follower_p99_ms", format!("{:.3}", lag.first_p99_ms)),
    ];
    let ours = format!(
        "p99 {:.2} ms (p50 {:.2}; first follower p99 {:.2}) over {} writes at {:.0} writes/s (max {max_rate:.0}/s)",
        lag.p99_ms,
        lag.p50_ms,
        lag.first_p99_ms,
        lag.requests,
        load.acked_per_second()
    );
    Ok(against_redis(args, lag.p99_ms, ours, values).await)
}

/// The most item writes per second the leader acknowledges: `--rate-seconds` of 64 concurrent
/// writers, unpaced.
async fn max_rate_probe(args: &GatesArgs, leader: &str) -> anyhow::Result<bench::Summary> {
    eprintln!(
        "gates: replication-lag: maximum rate probe, {} s of 64 concurrent item writes",
        args.rate_seconds
    );
    let probe = bench::measure(&BenchArgs {
        url: leader.to_string(),
        workload: Workload::Items,
        concurrency: 64,
        seconds: args.rate_seconds,
        id_base: RATE_PROBE_ID_BASE,
        quiet: true,
        ..Default::default()
    })
    .await?;
    anyhow::ensure!(probe.errors == 0, "{} errors during the rate probe", probe.errors);
    Ok(probe)
}

/// The lag samples (ack on the leader to visible on every follower) taken under a paced load of
/// `rate` item writes per second: the load's summary and the samples'.
async fn lag_under_load(
    args: &GatesArgs,
    leader: &str,
    followers: Vec<String>,
    rate: u64,
) -> anyhow::Result<(bench::Summary, bench::Summary)> {
    let leader = leader.to_string();
    let load = BenchArgs {
        url: leader.clone(),
        workload: Workload::Items,
        concurrency: 64,
        seconds: args.lag_seconds,
        rate,
        id_base: LAG_LOAD_ID_BASE,
        quiet: true,
        ..Default::default()
    };
    let samples = BenchArgs {
        url: leader.clone(),
        followers,
        workload: Workload::Lag,
        concurrency: 1,
        seconds: args.lag_seconds,
        requests_max: args.lag_samples,
        id_base: LAG_SAMPLE_ID_BASE,
        quiet: true,
        ..Default::default()
    };
    // The probe runs on a runtime of its own (one OS thread): on the load's runtime, each reader's
    // answer waited for a worker among 64 load tasks, and that wait was counted as lag. The Redis
    // anchor's probe is a process of its own too.
    let (load, lag) = tokio::join!(bench::measure(&load), measure_on_own_thread(samples));
    let (load, lag) = (load?, lag?);
    anyhow::ensure!(
        lag.errors == 0 && lag.requests > 0,
        "{} errors in {} lag samples",
        lag.errors,
        lag.requests
    );
    Ok((load, lag))
}

/// The replication-lag verdict: our p99 (`p99_ms`, described by `ours`) against the Redis
/// anchor's, measured now from a writable copy of the peer scripts; a FAIL that says why when
/// Redis cannot be measured.
async fn against_redis(
    args: &GatesArgs,
    p99_ms: f64,
    ours: String,
    mut values: Vec<(String, String)>,
) -> Verdict {
    let goal = "p99 below the Redis anchor's p99 in the same run".to_string();
    let redis = match &args.anchors {
        Some(anchors) => redis_lag(anchors, &args.anchors_work).await,
        None => Err(anyhow::anyhow!("no anchors folder given (--anchors or GATE_ANCHORS)")),
    };
    match redis {
        Ok(redis) => {
            values.extend([
                value("redis_p50_ms", format!("{:.3}", redis.p50_ms)),
                value("redis_p99_ms", format!("{:.3}", redis.p99_ms)),
                value("redis_load_cmds_per_s", &redis.load_cmds_per_s),
            ]);
            Verdict {
                name: "replication-lag",
                figure: format!(
                    "{ours}; Redis p99 {:.2} ms (p50 {:.2}) under {} cmds/s",
                    redis.p99_ms, redis.p50_ms, redis.load_cmds_per_s
                ),
                goal,
                pass: p99_ms < redis.p99_ms,
                values,
            }
        }
        Err(why) => {
            values.push(value("redis_error", format!("{:?}", format!("{why:#}"))));
            Verdict {
                name: "replication-lag",
                figure: format!("{ours}; Redis not measured: {}", format!("{why:#}").replace('\n', " ")),
                goal,
                pass: false,
                values,
            }
        }
    }
}

/// Runs `bench::measure(args)` on a current-thread runtime in a thread of its own, so that its
/// timings do not include waits for a worker of the caller's runtime.
async fn measure_on_own_thread(args: BenchArgs) -> anyhow::Result<bench::Summary> {
    let (sender, receiver) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("tidal-lag-probe".into())
        .spawn(move || {
            let measured = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("start the probe's runtime")
                .and_then(|runtime| runtime.block_on(bench::measure(&args)));
            // The receiver is gone only if the gate itself was dropped; nothing to report then.
            let _ = sender.send(measured);
        })
        .context("start the probe's thread")?;
    receiver.await.context("the probe's thread ended without a result")?
}

struct RedisLag {
    p50_ms: f64,
    p99_ms: f64,
    load_cmds_per_s: String,
}

/// Runs the Redis anchor's lag phase (`PHASES=lag redis/run.sh`) from a writable copy of the
/// anchors and reads its `vis_after_ack_*` figures (ack on the primary -> visible on replica 1).
async fn redis_lag(anchors: &Path, work: &Path) -> anyhow::Result<RedisLag> {
    let copy = work.join("anchors");
    if !copy.join("redis").join("run.sh").exists() {
        // The folder's contents go to `<work>/anchors`, whatever the folder is named (bench/peers).
        std::fs::create_dir_all(&copy).with_context(|| format!("create {}", copy.display()))?;
        let mut cp = std::process::Command::new("cp");
        cp.arg("-r").arg(anchors.join(".")).arg(&copy);
        let copied = output(cp).await.context("run cp")?;
        anyhow::ensure!(copied.status.success(), "cp -r {}/. {} failed", anchors.display(), copy.display());
        // The source may be read-only; the anchors write their venv, helpers and results in place.
        let mut chmod = std::process::Command::new("chmod");
        chmod.arg("-R").arg("u+w").arg(&copy);
        let writable = output(chmod).await.context("run chmod")?;
        anyhow::ensure!(writable.status.success(), "chmod -R u+w {} failed", copy.display());
        anyhow::ensure!(
            copy.join("redis").join("run.sh").exists(),
            "{} has no redis/run.sh (is it the anchors folder?)",
            anchors.display()
        );
    }
    eprintln!(
        "gates: replication-lag: Redis anchor (setup, then PHASES=lag redis/run.sh) in {}",
        copy.display()
    );
    let mut setup = std::process::Command::new("bash");
    setup.arg(copy.join("setup.sh"));
    let setup = output(setup).await.context("run setup.sh")?;
    anyhow::ensure!(
        setup.status.success(),
        "anchors setup.sh failed: {}",
        String::from_utf8_lossy(&setup.stderr).lines().last().unwrap_or("")
    );
    ensure_redis_py(&copy).await?;
    let mut run = std::process::Command::new("bash");
    run.arg(copy.join("redis").join("run.sh")).env("PHASES", "lag");
    let run = output(run).await.context("run redis/run.sh")?;
    let text = String::from_utf8_lossy(&run.stdout).into_owned();
    std::fs::write(work.join("redis-lag.txt"), &text).context("keep the Redis anchor output")?;
    anyhow::ensure!(
        run.status.success(),
        "redis/run.sh exited with {}: {}",
        run.status,
        String::from_utf8_lossy(&run.stderr).lines().last().unwrap_or("")
    );
    let line = text
        .lines()
        .find(|line| line.contains("kind=redis-lag"))
        .context("the Redis anchor printed no kind=redis-lag line")?;
    let field = |key: &str| -> anyhow::Result<String> {
        line.split_whitespace()
            .find_map(|pair| pair.strip_prefix(key).and_then(|rest| rest.strip_prefix('=')))
            .map(str::to_string)
            .with_context(|| format!("no {key} in {line:?}"))
    };
    let timeouts: u64 = field("timeouts")?.parse().context("parse timeouts")?;
    anyhow::ensure!(timeouts == 0, "the Redis anchor had {timeouts} lag timeouts");
    Ok(RedisLag {
        p50_ms: field("vis_after_ack_p50_ms")?.parse().context("parse vis_after_ack_p50_ms")?,
        p99_ms: field("vis_after_ack_p99_ms")?.parse().context("parse vis_after_ack_p99_ms")?,
        load_cmds_per_s: field("primary_cmds_per_s_during")?,
    })
}

/// Installs redis-py into the anchors' venv if it is missing. bench/peers/setup.sh installs it;
/// this guards a copy whose setup checked with `python -c 'import redis'` from inside the folder,
/// where the `redis/` script folder satisfies that import. The check here runs from `/`.
async fn ensure_redis_py(copy: &Path) -> anyhow::Result<()> {
    let venv = std::fs::canonicalize(copy.join(".venv").join("bin")).context("find the anchors' venv")?;
    let mut check = std::process::Command::new(venv.join("python"));
    check.args(["-c", "import redis.client"]).current_dir("/");
    if output(check).await.context("run the venv's python")?.status.success() {
        return Ok(());
    }
    let mut install = std::process::Command::new(venv.join("pip"));
    install.args(["install", "-q", "redis>=5,<9"]);
    let installed = output(install).await.context("run pip")?;
    anyhow::ensure!(
        installed.status.success(),
        "pip install redis failed: {}",
        String::from_utf8_lossy(&installed.stderr).lines().last().unwrap_or("")
    );
    Ok(())
}

/// Writes back the page cache's dirty pages (`sync`) before the cluster starts. What ran just
/// before (a benchmark's clusters, a build) can leave hundreds of MB of them, and their writeback
/// would share the disk with the gates' fsyncs (experiments/041: `make bench-peers` runs the gates
/// right after two benchmark clusters). Usually there is nothing to write and it takes no time. A
/// failed `sync` is reported and the gates go on.
async fn write_back_dirty_pages() {
    let started = Instant::now();
    match output(std::process::Command::new("sync")).await {
        Ok(done) if done.status.success() => {
            eprintln!("gates: wrote back dirty pages first (sync, {:.2} s)", started.elapsed().as_secs_f64())
        }
        Ok(done) => eprintln!("gates: sync failed ({}); going on", done.status),
        Err(why) => eprintln!("gates: could not run sync ({why:#}); going on"),
    }
}

/// Runs a command to completion off the async threads and collects its output.
async fn output(mut command: std::process::Command) -> anyhow::Result<std::process::Output> {
    tokio::task::spawn_blocking(move || command.output()).await.context("command task")?.map_err(Into::into)
}

/// A follower is SIGKILLed, the items are written (paced over the down window), the follower is
/// restarted; it must converge through its boot-time pull of the log.
async fn heal(args: &GatesArgs, dir: &Path, nodes: &[(u64, String)], goal: &str) -> anyhow::Result<Verdict> {
    anyhow::ensure!(args.heal_items > 0, "GATE_HEAL_ITEMS must be at least 1");
    let leader_url = leader_url(nodes, Duration::from_secs(30)).await?;
    let (follower, follower_url) =
        nodes.iter().rev().find(|(_, url)| *url != leader_url).cloned().context("no follower")?;
    let leader = Client::new(leader_url.clone(), None);
    let follower_client = Client::new(follower_url.clone(), None);
    let quarantine_before = follower_client.status().await.context("follower status")?.quarantine_files;
    let heal_calls_before = heal_calls(&leader_url).await?;
    let (load, down_for) = write_while_down(args, dir, &leader_url, follower).await?;
    let target = leader.status().await.context("leader status")?.commit_seqno;
    // On this one machine the other two nodes share the cores the follower catches up on: let them
    // finish applying and flushing what was just written first (with the follower down for minutes
    // at a bounded rate, they have long finished; with GATE_DOWN_SECONDS=0 they have not).
    let others: Vec<String> =
        nodes.iter().filter(|(id, _)| *id != follower).map(|(_, url)| url.clone()).collect();
    let settled = settle(&others, target, SETTLE_TIMEOUT).await?;
    cluster_cmd::start_node(dir, follower)?;
    let restarted = Instant::now();
    eprintln!(
        "gates: heal-100k: {} items written in {:.0} s ({:.0}/s); follower restarted after {:.0} s down; must reach seqno {target}",
        load.requests,
        load.seconds,
        load.acked_per_second(),
        down_for.as_secs_f64()
    );
    let (converged, pull_seen) =
        wait_caught_up(&leader, &follower_client, follower, target, restarted).await?;
    let (digests_equal, at) = digests_agree(&leader, &follower_client, Duration::from_secs(60)).await?;
    let metrics = crate::bench::fetch_metrics(&follower_url, None).await?;
    let quarantined =
        follower_client.status().await.context("follower status")?.quarantine_files - quarantine_before;
    let run = HealRun {
        items: load.requests - load.errors,
        embeddings: args.heal_embeddings,
        write_rate: load.acked_per_second(),
        down_for,
        settled,
        seconds: converged.as_secs_f64(),
        installs: metric(&metrics, "tidal_snapshot_installs_total").unwrap_or(f64::NAN),
        install_failures: metric(&metrics, "tidal_snapshot_install_failures_total").unwrap_or(f64::NAN),
        wal_batches: metric(&metrics, "tidal_wal_batches_total").unwrap_or(0.0),
        // The restarted process counts from zero: what its WAL took in is what it caught up on.
        wal_bytes: metric(&metrics, "tidal_wal_bytes_total").unwrap_or(0.0),
        pulled_bytes: metric(&metrics, "tidal_pull_bytes_total").unwrap_or(0.0),
        pull_seconds: metric(&metrics, "tidal_pull_seconds_total").unwrap_or(0.0),
        heal_calls: heal_calls(&leader_url).await? - heal_calls_before,
        quarantined,
        digests_equal,
        at,
        pull_seen,
    };
    Ok(run.verdict(goal))
}

/// The heal gate's down window: the follower SIGKILLed, then `--heal-items` written on the leader,
/// paced over `--down-seconds`. Returns the load's summary and how long the follower was down.
async fn write_while_down(
    args: &GatesArgs,
    dir: &Path,
    leader_url: &str,
    follower: u64,
) -> anyhow::Result<(bench::Summary, Duration)> {
    let pid = cluster_cmd::kill_node(dir, follower)?;
    let down_since = Instant::now();
    let rate = (args.heal_items as f64 / args.down_seconds.max(1) as f64).ceil().max(1.0) as u64;
    eprintln!(
        "gates: heal-100k: follower n{follower} (pid {pid}) SIGKILLed; writing {} items on the leader at up to {rate}/s for {} s",
        args.heal_items, args.down_seconds
    );
    let load = bench::measure(&BenchArgs {
        url: leader_url.to_string(),
        workload: if args.heal_embeddings { Workload::Embeddings } else { Workload::Items },
        concurrency: 32,
        // The paced schedule ends after down_seconds; the bound leaves room for a slower leader.
        seconds: args.down_seconds + 1800,
        requests_max: args.heal_items,
        rate,
        id_base: HEAL_ID_BASE,
        quiet: true,
        ..Default::default()
    })
    .await?;
    anyhow::ensure!(load.errors == 0, "{} of {} item writes failed", load.errors, load.requests);
    Ok((load, down_since.elapsed()))
}

/// Polls until the restarted follower has applied `target`: how long that took since `restarted`,
/// and whether the leader was seen reporting it pulling.
async fn wait_caught_up(
    leader: &Client,
    follower_client: &Client,
    follower: u64,
    target: u64,
    restarted: Instant,
) -> anyhow::Result<(Duration, bool)> {
    let mut pull_seen = false;
    loop {
        if let Ok(status) = follower_client.status().await {
            if status.applied_seqno >= target {
                return Ok((restarted.elapsed(), pull_seen));
            }
        }
        if let Ok(status) = leader.status().await {
            pull_seen |= status.nodes.iter().any(|node| node.id == follower && node.pulling);
        }
        anyhow::ensure!(
            restarted.elapsed() < HEAL_CONVERGE_TIMEOUT,
            "follower n{follower} did not reach seqno {target} within {HEAL_CONVERGE_TIMEOUT:?}"
        );
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// What one heal-100k run measured.
struct HealRun {
    items: u64,
    embeddings: bool,
    write_rate: f64,
    down_for: Duration,
    /// How long the other nodes took to settle before the restart.
    settled: Duration,
    /// From the restart until the follower applied the leader's commit seqno.
    seconds: f64,
    installs: f64,
    install_failures: f64,
    wal_batches: f64,
    wal_bytes: f64,
    pulled_bytes: f64,
    pull_seconds: f64,
    heal_calls: f64,
    quarantined: u64,
    digests_equal: bool,
    at: u64,
    pull_seen: bool,
}

impl HealRun {
    /// PASS when the follower caught up from the log alone (no snapshot install, no heal call, no
    /// quarantine; every missed write through its WAL) to a digest equal to the leader's.
    fn verdict(&self, goal: &str) -> Verdict {
        let Self { items, seconds, installs, heal_calls, quarantined, wal_batches, wal_bytes, .. } = *self;
        let (pulled_bytes, pull_seconds, at) = (self.pulled_bytes, self.pull_seconds, self.at);
        let pass = self.digests_equal
            && installs == 0.0
            && self.install_failures == 0.0
            && heal_calls == 0.0
            && quarantined == 0
            && wal_batches >= items as f64;
        Verdict {
            name: "heal-100k",
            figure: format!(
                "{items} {} missed over {:.0} s down; restart -> caught up in {seconds:.2} s ({:.0} items/s, {:.1} MB/s of WAL; \
                 of it the pulls {pull_seconds:.2} s, {:.1} MB/s to durable; the other nodes settled {:.2} s before the restart), \
                 {wal_batches:.0} batches through the follower's WAL, {installs} snapshot installs, {heal_calls} heal calls, \
                 {quarantined} quarantine files, digests {} at seqno {at}, pull {}",
                if self.embeddings { "embeddings" } else { "items" },
                self.down_for.as_secs_f64(),
                items as f64 / seconds.max(1e-9),
                wal_bytes / 1e6 / seconds.max(1e-9),
                pulled_bytes / 1e6 / pull_seconds.max(1e-9),
                self.settled.as_secs_f64(),
                if self.digests_equal { "equal" } else { "DIFFERENT" },
                if self.pull_seen { "seen" } else { "not seen by the poll" }
            ),
            goal: goal.into(),
            pass,
            values: vec![
                value("items", items),
                value("down_seconds", format!("{:.1}", self.down_for.as_secs_f64())),
                value("write_rate", format!("{:.0}", self.write_rate)),
                value("catchup_seconds", format!("{seconds:.3}")),
                value("items_per_s", format!("{:.0}", items as f64 / seconds.max(1e-9))),
                value("catchup_wal_bytes", format!("{wal_bytes:.0}")),
                value("catchup_mb_per_s", format!("{:.1}", wal_bytes / 1e6 / seconds.max(1e-9))),
                value("pull_seconds", format!("{pull_seconds:.3}")),
                value("pull_mb_per_s", format!("{:.1}", pulled_bytes / 1e6 / pull_seconds.max(1e-9))),
                value("settle_seconds", format!("{:.3}", self.settled.as_secs_f64())),
                value("snapshot_installs", installs),
                value("heal_calls", heal_calls),
                value("wal_batches", wal_batches),
                value("digests_equal", self.digests_equal),
            ],
        }
    }
}

/// Polls `urls` until every node has applied `target` and has no engine flush in flight; returns
/// how long that took.
async fn settle(urls: &[String], target: u64, timeout: Duration) -> anyhow::Result<Duration> {
    let started = Instant::now();
    for url in urls {
        let client = Client::new(url.clone(), None);
        loop {
            let applied = client.status().await.map(|status| status.applied_seqno).unwrap_or(0);
            if applied >= target {
                let metrics = crate::bench::fetch_metrics(url, None).await?;
                if metric(&metrics, "tidal_engine_flush_in_flight") == Some(0.0) {
                    break;
                }
            }
            anyhow::ensure!(
                started.elapsed() < timeout,
                "{url} did not apply seqno {target} and finish its engine flush within {timeout:?}"
            );
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }
    Ok(started.elapsed())
}

/// Polls both nodes until they report the same applied seqno, then compares their digests.
async fn digests_agree(a: &Client, b: &Client, timeout: Duration) -> anyhow::Result<(bool, u64)> {
    let deadline = Instant::now() + timeout;
    loop {
        let (da, db) = (a.digest().await.context("digest")?, b.digest().await.context("digest")?);
        if da.applied_seqno == db.applied_seqno {
            return Ok((da.digest == db.digest, da.applied_seqno));
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "applied seqnos still differ after {timeout:?}: {} vs {}",
            da.applied_seqno,
            db.applied_seqno
        );
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Leader SIGKILL -> first acknowledged write, over the failover benchmark's rounds.
async fn failover(args: &GatesArgs, dir: &Path, goal: &str) -> anyhow::Result<Verdict> {
    eprintln!("gates: failover: {} rounds of leader SIGKILL", args.failover_rounds);
    let mut gaps =
        crate::ops::failover_rounds(dir, args.failover_rounds, |line| eprintln!("gates: {line}")).await?;
    gaps.sort();
    let pick = |q: f64| gaps[((gaps.len() as f64 - 1.0) * q).round() as usize];
    let (p50, p99, max) = (pick(0.5), pick(0.99), gaps[gaps.len() - 1]);
    Ok(Verdict {
        name: "failover",
        figure: format!(
            "p99 {} ms (p50 {}, max {}) over {} rounds",
            p99.as_millis(),
            p50.as_millis(),
            max.as_millis(),
            gaps.len()
        ),
        goal: goal.into(),
        pass: p99 <= FAILOVER_P99_GOAL,
        values: vec![
            value("rounds", gaps.len()),
            value("p50_ms", p50.as_millis()),
            value("p99_ms", p99.as_millis()),
            value("max_ms", max.as_millis()),
        ],
    })
}

/// The URL of the node that reports itself leader, polled until `timeout`.
async fn leader_url(nodes: &[(u64, String)], timeout: Duration) -> anyhow::Result<String> {
    let deadline = Instant::now() + timeout;
    loop {
        for (_, url) in nodes {
            if let Ok(status) = Client::new(url.clone(), None).status().await {
                if status.role == "leader" {
                    return Ok(url.clone());
                }
            }
        }
        anyhow::ensure!(Instant::now() < deadline, "no leader within {timeout:?}");
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// The value of an unlabelled sample in Prometheus text.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        rest.strip_prefix(' ')?.trim().parse().ok()
    })
}

/// `POST /cluster/heal` requests a node has answered (any status), from its HTTP counters.
async fn heal_calls(url: &str) -> anyhow::Result<f64> {
    let text = crate::bench::fetch_metrics(url, None).await?;
    Ok(text
        .lines()
        .filter(|line| {
            line.starts_with("tidal_http_requests_total{") && line.contains("route=\"/cluster/heal\"")
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdict_line_has_the_contract_shape() {
        let verdict = Verdict {
            name: "failover",
            figure: "p99 1980 ms".into(),
            goal: "p99 <= 2000 ms".into(),
            pass: true,
            values: Vec::new(),
        };
        assert_eq!(verdict.line(), "gate failover: p99 1980 ms (goal p99 <= 2000 ms) PASS");
        let failed = Verdict::failed("heal-100k", "x", &anyhow::anyhow!("node 3\ndid not start"));
        assert_eq!(failed.line(), "gate heal-100k: not measured: node 3 did not start (goal x) FAIL");
    }

    #[test]
    fn reads_unlabelled_metrics_only() {
        let text = "# HELP tidal_wal_batches_total x\ntidal_wal_batches_total 12\n\
                    tidal_wal_batches_total_other 3\ntidal_snapshot_installs_total 0\n";
        assert_eq!(metric(text, "tidal_wal_batches_total"), Some(12.0));
        assert_eq!(metric(text, "tidal_snapshot_installs_total"), Some(0.0));
        assert_eq!(metric(text, "tidal_missing"), None);
    }
}
