//! Operator verbs on the command line (`tidal status`, `tidal catchup`, `tidal heal`, `tidal
//! promote`) and the failover and transfer benchmarks (`tidal cluster failover-bench`,
//! `tidal cluster promote-bench`).
//!
//! The verbs are thin clients of the HTTP routes (`GET /cluster/status`, `POST /cluster/catchup`,
//! `POST /cluster/heal`, `POST /cluster/promote`): they print readable tables, and exit non-zero
//! when the node refuses.

use anyhow::Context;
use std::path::Path;
use std::time::{Duration, Instant};
use tidal_client::Client;
use tidal_types::ClusterStatus;

/// Options every verb takes.
#[derive(Clone, Debug, clap::Args)]
pub struct VerbArgs {
    /// Any node of the cluster.
    #[arg(long, default_value = "http://127.0.0.1:7070")]
    pub url: String,
    /// Admin token. Prefer the TIDAL_TOKEN environment variable: a `--token` value is in the
    /// command line, which every user of the machine can read (`ps`).
    #[arg(long, env = "TIDAL_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// CA certificate (PEM) that verifies the node's HTTPS certificate (`tidal cluster up --tls`
    /// prints it); needed for an `https://` URL.
    #[arg(long, env = "TIDAL_CA")]
    pub ca: Option<std::path::PathBuf>,
}

impl VerbArgs {
    /// A client for `url` with this token and CA; requests give up after `timeout`.
    pub fn client_with_timeout(&self, url: &str, timeout: Duration) -> anyhow::Result<Client> {
        match &self.ca {
            None => Ok(Client::with_timeout(url, self.token.clone(), timeout)),
            Some(ca) => {
                let pem =
                    std::fs::read(ca).with_context(|| format!("read CA certificate {}", ca.display()))?;
                Client::with_ca(url, self.token.clone(), timeout, &pem)
                    .with_context(|| format!("CA certificate {}", ca.display()))
            }
        }
    }

    /// A client for `--url` (30 s per request).
    pub fn client(&self) -> anyhow::Result<Client> {
        self.client_with_timeout(&self.url, Duration::from_secs(30))
    }

    /// The scheme nodes answer on: `https` with a CA, else `http`.
    pub fn scheme(&self) -> &'static str {
        if self.ca.is_some() {
            "https"
        } else {
            "http"
        }
    }
}

/// `tidal status` options.
#[derive(Clone, Debug, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    verb: VerbArgs,
    /// Refresh every SECONDS (2 when no value is given) until Ctrl-C, with rates: seqnos/s
    /// committed and applied per node. On a terminal the table is redrawn in place; into a file
    /// or pipe each refresh is appended under a time stamp.
    #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "2")]
    watch: Option<f64>,
    /// With --watch: stop after this many refreshes.
    #[arg(long, requires = "watch")]
    count: Option<u64>,
}

/// `--wait` options of the verbs whose work goes on on the server (`catchup`, `heal`).
#[derive(Clone, Debug, clap::Args)]
pub struct WaitArgs {
    /// Follow the work to its end: poll `/cluster/status` until the node has applied the commit
    /// frontier the leader had when the verb was sent, with a progress line on stderr.
    #[arg(long)]
    pub wait: bool,
    /// With --wait: give up (exit non-zero) after this many seconds; the work goes on.
    #[arg(long, default_value_t = 600)]
    pub wait_timeout_s: u64,
    /// Print progress lines on stderr even when it is not a terminal.
    #[arg(long)]
    pub progress: bool,
}

/// `tidal catchup` options.
#[derive(Clone, Debug, clap::Args)]
pub struct CatchupArgs {
    #[command(flatten)]
    verb: VerbArgs,
    #[command(flatten)]
    wait: WaitArgs,
}

/// Renders a status as a table.
pub fn status_table(status: &ClusterStatus) -> String {
    status_table_with_rates(status, None)
}

/// A status table; with `rates` (`(commit seqnos/s, node id -> applied seqnos/s)`) it has an
/// `applied/s` column and the commit rate in its first line.
pub fn status_table_with_rates(status: &ClusterStatus, rates: Option<&Rates>) -> String {
    let mut out = format!(
        "node {} ({}), term {}, leader {}, durable {}, commit {}, applied {}, baseline (t{}, {}), quarantined {} seqnos in {} files",
        status.node_id,
        status.role,
        status.term,
        status.leader_id.map_or("unknown".to_string(), |id| id.to_string()),
        status.durable_seqno,
        status.commit_seqno,
        status.applied_seqno,
        status.baseline_term,
        status.baseline_seqno,
        status.quarantined_seqnos,
        status.quarantine_files
    );
    match rates {
        // The first refresh has nothing to compare with.
        Some(rates) if rates.applied.is_empty() => out.push_str(", committing -/s"),
        Some(rates) => {
            out.push_str(&format!(", committing {}/s", crate::progress::grouped(rates.commit.round() as u64)))
        }
        None => {}
    }
    out.push_str("\n\n");
    out.push_str(&format!(
        "{:<5} {:<10} {:<22} {:>12} {:>12} {:>12} {:>10} {:>12} {:>8}",
        "id", "role", "http", "matched", "durable", "applied", "lag", "last ack", "pulling"
    ));
    out.push_str(if rates.is_some() { "   applied/s\n" } else { "\n" });
    for node in &status.nodes {
        let lag = status.commit_seqno.saturating_sub(node.applied_seqno);
        let ack = match node.lag_ms {
            _ if node.id == status.node_id => "-".to_string(),
            Some(ms) => format!("{ms} ms"),
            None => "never".to_string(),
        };
        out.push_str(&format!(
            "{:<5} {:<10} {:<22} {:>12} {:>12} {:>12} {:>10} {:>12} {:>8}",
            node.id,
            node.role,
            node.http,
            node.matched_seqno,
            node.durable_seqno,
            node.applied_seqno,
            lag,
            ack,
            if node.snapshot {
                "snapshot"
            } else if node.pulling {
                "yes"
            } else {
                "no"
            }
        ));
        match rates.map(|rates| rates.applied.get(&node.id)) {
            Some(Some(rate)) => {
                out.push_str(&format!(" {:>11}\n", crate::progress::grouped(rate.round() as u64)))
            }
            Some(None) => out.push_str(&format!(" {:>11}\n", "-")),
            None => out.push('\n'),
        }
    }
    out
}

/// Rates between two statuses: seqnos per second.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rates {
    /// The commit frontier's.
    pub commit: f64,
    /// Each node's applied frontier's (nodes in both statuses).
    pub applied: std::collections::BTreeMap<u64, f64>,
}

impl Rates {
    /// The rates from `before` to `after`, `elapsed` apart (a frontier that went down, as after a
    /// snapshot install of an earlier seqno, counts as 0).
    pub fn between(before: &ClusterStatus, after: &ClusterStatus, elapsed: Duration) -> Rates {
        let seconds = elapsed.as_secs_f64().max(1e-3);
        let rate = |from: u64, to: u64| to.saturating_sub(from) as f64 / seconds;
        let applied = after
            .nodes
            .iter()
            .filter_map(|node| {
                let earlier = before.nodes.iter().find(|earlier| earlier.id == node.id)?;
                Some((node.id, rate(earlier.applied_seqno, node.applied_seqno)))
            })
            .collect();
        Rates { commit: rate(before.commit_seqno, after.commit_seqno), applied }
    }
}

/// The status from the leader when `--url` names one it can reach (a follower only knows what the
/// leader last told it; the leader knows every follower), else from `--url`.
async fn fetch_status(args: &VerbArgs) -> anyhow::Result<ClusterStatus> {
    let client = args.client()?;
    let status = client.status().await.with_context(|| format!("GET {}/cluster/status", args.url))?;
    let status = match status.leader_id {
        Some(leader) if leader != status.node_id => {
            let leader_url = status
                .nodes
                .iter()
                .find(|n| n.id == leader)
                .map(|n| format!("{}://{}", args.scheme(), n.http));
            match leader_url {
                Some(url) => {
                    args.client_with_timeout(&url, Duration::from_secs(30))?.status().await.unwrap_or(status)
                }
                None => status,
            }
        }
        _ => status,
    };
    Ok(status)
}

/// `tidal status [--watch [SECONDS] [--count N]]`.
pub async fn status(args: StatusArgs) -> anyhow::Result<()> {
    let Some(interval) = args.watch else {
        print!("{}", status_table(&fetch_status(&args.verb).await?));
        return Ok(());
    };
    anyhow::ensure!((0.1..=3600.0).contains(&interval), "--watch takes 0.1 to 3600 seconds");
    let in_place = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let mut previous: Option<(Instant, ClusterStatus)> = None;
    let mut refresh = 0u64;
    while args.count.is_none_or(|count| refresh < count) {
        refresh += 1;
        let fetched = fetch_status(&args.verb).await;
        let now = Instant::now();
        let stamp = utc_clock();
        if in_place {
            // Home and clear: the table is redrawn where it was, as `watch` does.
            print!("\x1b[H\x1b[2J");
        }
        println!("tidal status every {interval} s, {stamp} UTC (refresh {refresh}; Ctrl-C stops)");
        match fetched {
            Ok(status) => {
                let rates = previous.as_ref().map(|(at, before)| Rates::between(before, &status, now - *at));
                print!("{}", status_table_with_rates(&status, Some(&rates.unwrap_or_default())));
                previous = Some((now, status));
            }
            // A watch goes on through a node's restart or a failover: that is what it is for.
            Err(error) => println!("no status: {error:#}"),
        }
        std::io::Write::flush(&mut std::io::stdout()).ok();
        if args.count.is_none_or(|count| refresh < count) {
            tokio::time::sleep(Duration::from_secs_f64(interval)).await;
        }
    }
    Ok(())
}

/// `HH:MM:SS` of the wall clock, UTC.
fn utc_clock() -> String {
    let seconds =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_secs());
    format!("{:02}:{:02}:{:02}", seconds / 3600 % 24, seconds / 60 % 60, seconds % 60)
}

/// How often a `--wait` looks at the status.
const WAIT_POLL: Duration = Duration::from_millis(200);

/// Follows node `node` until it has applied `target` (from the leader's status when reachable),
/// with a progress line labelled `label` counting from `start`.
async fn wait_applied(
    verb: &VerbArgs,
    wait: &WaitArgs,
    label: &str,
    node: u64,
    (start, target): (u64, u64),
) -> anyhow::Result<()> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(wait.wait_timeout_s);
    let mut progress = crate::progress::Progress::new(label, crate::progress::Unit::Seqnos, wait.progress);
    let total = target.saturating_sub(start);
    loop {
        let (applied, note) = match fetch_status(verb).await {
            Ok(status) => match status.nodes.iter().find(|n| n.id == node) {
                Some(entry) if entry.snapshot => (entry.applied_seqno, "installing a snapshot"),
                Some(entry) => (entry.applied_seqno, ""),
                None => (start, "not in the leader's membership"),
            },
            Err(_) => (start, "no status"),
        };
        let done = applied.saturating_sub(start).min(total);
        if applied >= target {
            progress.finish(done, total, "done");
            println!(
                "{label}: node {node} applied seqno {applied} (target {target}) after {:.1} s",
                started.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        progress.update(done, total, note);
        anyhow::ensure!(
            Instant::now() < deadline,
            "{label}: node {node} applied {applied} of {target} after {} s; it keeps catching up (`tidal status`)",
            wait.wait_timeout_s
        );
        tokio::time::sleep(WAIT_POLL).await;
    }
}

/// POSTs an operator verb to the node at `--url` and prints its JSON answer.
async fn post_verb(args: VerbArgs, path: &str) -> anyhow::Result<()> {
    send_verb(args.client()?, reqwest::Method::POST, path).await
}

async fn send_verb(client: Client, method: reqwest::Method, path: &str) -> anyhow::Result<()> {
    let reply: serde_json::Value =
        client.json::<(), _>(method.clone(), path, None).await.with_context(|| format!("{method} {path}"))?;
    println!("{}", serde_json::to_string_pretty(&reply)?);
    Ok(())
}

fn dry_run_query(dry_run: bool, separator: char) -> String {
    if dry_run {
        format!("{separator}dry_run=true")
    } else {
        String::new()
    }
}

/// `tidal catchup [--wait]`: the node at `--url` pulls from its leader now; with `--wait`, until it
/// has applied what the leader had committed.
pub async fn catchup(args: CatchupArgs) -> anyhow::Result<()> {
    let own = args
        .verb
        .client()?
        .status()
        .await
        .with_context(|| format!("GET {}/cluster/status", args.verb.url))?;
    let target = fetch_status(&args.verb).await?.commit_seqno;
    post_verb(args.verb.clone(), "/cluster/catchup").await?;
    if args.wait.wait {
        wait_applied(&args.verb, &args.wait, "catchup", own.node_id, (own.applied_seqno, target)).await?;
    }
    Ok(())
}

/// `tidal heal --node N [--dry-run] [--wait]`: the leader nudges follower N to pull from its last
/// matched position; with `--wait`, until N has applied what the leader had committed.
pub async fn heal(args: VerbArgs, node: u64, dry_run: bool, wait: WaitArgs) -> anyhow::Result<()> {
    let before = fetch_status(&args).await?;
    let start = before.nodes.iter().find(|n| n.id == node).map_or(0, |n| n.applied_seqno);
    post_verb(args.clone(), &format!("/cluster/heal?node={node}{}", dry_run_query(dry_run, '&'))).await?;
    if wait.wait && !dry_run {
        wait_applied(&args, &wait, "heal", node, (start, before.commit_seqno)).await?;
    }
    Ok(())
}

/// `tidal promote --node N [--dry-run]`: the leader hands leadership to node N (any node forwards
/// the request to the leader).
pub async fn promote(args: VerbArgs, node: u64, dry_run: bool) -> anyhow::Result<()> {
    post_verb(args, &format!("/cluster/promote?node={node}{}", dry_run_query(dry_run, '&'))).await
}

/// `tidal members add --node N --http H --rpc R [--catch-up-s S] [--dry-run]`: the leader adds node
/// N as a learner, waits for it to catch up, then makes it a voter.
pub async fn members_add(
    args: VerbArgs,
    node: u64,
    http: &str,
    rpc: &str,
    catch_up_s: u64,
    dry_run: bool,
) -> anyhow::Result<()> {
    let client = args.client_with_timeout(&args.url, Duration::from_secs(catch_up_s + 60))?;
    let path = format!(
        "/cluster/members/{node}?http={http}&rpc={rpc}&catch_up_s={catch_up_s}{}",
        dry_run_query(dry_run, '&')
    );
    let deadline = std::time::Duration::from_secs(2 * catch_up_s + 120);
    send_membership_verb(client, reqwest::Method::POST, &path, deadline).await
}

/// A membership change, retried while the answer is "unknown, retry" (503/504 or no answer): the
/// leader may move while it runs, and both verbs are safe to repeat (adding a voter or removing a
/// non-member is "nothing to do"; a learner that is still catching up keeps catching up). Any
/// other answer, or `deadline`, ends it.
async fn send_membership_verb(
    client: Client,
    method: reqwest::Method,
    path: &str,
    deadline: std::time::Duration,
) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let mut retried = false;
    loop {
        match client.json::<(), serde_json::Value>(method.clone(), path, None).await {
            Ok(reply) => {
                println!("{}", serde_json::to_string_pretty(&reply)?);
                return Ok(());
            }
            Err(error) if retryable_verb_error(&error) && started.elapsed() < deadline => {
                eprintln!("{method} {path}: {error}; retrying (the change is safe to repeat)");
                retried = true;
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            Err(error) if retried => {
                return Err(anyhow::Error::new(error).context(format!(
                    "{method} {path} (after a retry: an earlier attempt may have done the change; see `tidal status`)"
                )))
            }
            Err(error) => return Err(anyhow::Error::new(error).context(format!("{method} {path}"))),
        }
    }
}

fn retryable_verb_error(error: &tidal_client::Error) -> bool {
    match error {
        tidal_client::Error::Api { status, .. } => matches!(status, 503 | 504),
        tidal_client::Error::Transport(_) | tidal_client::Error::Link(_) => true,
    }
}

/// `tidal members remove --node N [--dry-run]`: the leader removes node N from the membership.
pub async fn members_remove(args: VerbArgs, node: u64, dry_run: bool) -> anyhow::Result<()> {
    let client = args.client()?;
    let path = format!("/cluster/members/{node}{}", dry_run_query(dry_run, '?'));
    send_membership_verb(client, reqwest::Method::DELETE, &path, std::time::Duration::from_secs(120)).await
}

/// `tidal reconcile [--dry-run]`: the node at `--url` reconciles its hard negatives with every peer.
pub async fn reconcile(args: VerbArgs, dry_run: bool) -> anyhow::Result<()> {
    post_verb(args, &format!("/cluster/reconcile{}", dry_run_query(dry_run, '?'))).await
}

fn local_clients(dir: &Path) -> anyhow::Result<Vec<(u64, Client)>> {
    let membership = tidal_server::config::load_cluster(&dir.join("cluster.toml"), 1).with_context(|| {
        format!("no local cluster in {} (run `tidal cluster up --dir` first)", dir.display())
    })?;
    Ok(membership
        .spec
        .nodes
        .iter()
        .map(|n| (n.id.0, Client::new(format!("http://{}", n.http), None)))
        .collect())
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    sorted.get(((sorted.len().max(1) as f64 - 1.0) * q).round() as usize).copied().unwrap_or_default()
}

/// `tidal cluster promote-bench`: on a local cluster, one client writes back to back (through every
/// node in turn: followers forward) while the leader hands over to the next node; reports how long
/// each transfer took and the longest gap between two acknowledged writes around it.
pub async fn promote_bench(dir: &Path, rounds: u32) -> anyhow::Result<()> {
    anyhow::ensure!((1..=100).contains(&rounds), "rounds must be 1..=100");
    let clients = local_clients(dir)?;
    anyhow::ensure!(clients.len() >= 2, "a transfer needs at least two nodes");
    let mut gaps = Vec::new();
    let mut transfers = Vec::new();
    for round in 0..rounds {
        let leader = wait_leader(&clients, Duration::from_secs(30)).await?;
        let position =
            clients.iter().position(|(id, _)| *id == leader).context("leader not in cluster file")?;
        let target = clients[(position + 1) % clients.len()].0;
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let writers: Vec<Client> = clients.iter().map(|(_, c)| c.clone()).collect();
        let writer = tokio::spawn(async move {
            let mut acks = Vec::new();
            let mut turn = 0usize;
            let mut written = 0u64;
            while !*stopped.borrow() && written < 1_000_000 {
                let client = &writers[turn % writers.len()];
                let write = client.put_item(3, serde_json::json!({"round": round, "n": written}), None);
                match tokio::time::timeout(Duration::from_millis(500), write).await {
                    Ok(Ok(_)) => acks.push(Instant::now()),
                    _ => turn += 1,
                }
                written += 1;
            }
            acks
        });
        let started = Instant::now();
        let path = format!("/cluster/promote?node={target}");
        let (_, leader_client) = &clients[position];
        let reply: serde_json::Value = leader_client
            .json::<(), _>(reqwest::Method::POST, &path, None)
            .await
            .with_context(|| format!("POST {path} to node {leader}"))?;
        let transfer = started.elapsed();
        // Keep writing until the new leader has acknowledged writes for a while, so the gap that
        // ends with the first ack under the new leader is inside the window.
        let deadline = Instant::now() + Duration::from_secs(30);
        let (_, target_client) =
            clients.iter().find(|(id, _)| *id == target).context("target not in file")?;
        loop {
            let status = target_client.status().await;
            if status.is_ok_and(|s| s.role == "leader") {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "node {target} did not take office within 30 s: {reply}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let serving_from = Instant::now();
        while serving_from.elapsed() < Duration::from_millis(300) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop.send_replace(true);
        let acks = writer.await.context("writer task")?;
        let gap = acks
            .windows(2)
            .filter(|w| w[1] >= started)
            .map(|w| w[1].duration_since(w[0]))
            .max()
            .unwrap_or_default();
        println!(
            "round {round}: n{leader} -> n{target}: promote answered after {} ms ({}); longest gap between acks {} ms ({} acks)",
            transfer.as_millis(),
            reply["action"].as_str().unwrap_or("?"),
            gap.as_millis(),
            acks.len()
        );
        gaps.push(gap);
        transfers.push(transfer);
    }
    gaps.sort();
    transfers.sort();
    println!(
        "promote over {} rounds: write gap p50 {} ms, p99 {} ms, max {} ms; promote call p50 {} ms, p99 {} ms",
        gaps.len(),
        quantile(&gaps, 0.5).as_millis(),
        quantile(&gaps, 0.99).as_millis(),
        gaps.last().map_or(0, |g| g.as_millis()),
        quantile(&transfers, 0.5).as_millis(),
        quantile(&transfers, 0.99).as_millis(),
    );
    Ok(())
}

/// `tidal cluster failover-bench`: on a local cluster started by `tidal cluster up --dir DIR`,
/// repeatedly SIGKILLs the leader and measures the time until another node acknowledges a write,
/// then restarts the killed node (`cluster up` again) and waits until all are ready.
pub async fn failover_bench(dir: &Path, rounds: u32) -> anyhow::Result<()> {
    let mut gaps = failover_rounds(dir, rounds, |line| println!("{line}")).await?;
    gaps.sort();
    let pick = |q: f64| gaps[((gaps.len() as f64 - 1.0) * q).round() as usize];
    println!(
        "failover over {} rounds (leader SIGKILL -> first acknowledged write on another node): p50 {} ms, p99 {} ms, max {} ms",
        gaps.len(),
        pick(0.5).as_millis(),
        pick(0.99).as_millis(),
        gaps.last().map_or(0, |g| g.as_millis())
    );
    Ok(())
}

/// The rounds of the failover benchmark: one gap (leader SIGKILL -> first acknowledged write) per
/// round, in round order; `say` gets one line per round.
pub async fn failover_rounds(dir: &Path, rounds: u32, say: impl Fn(String)) -> anyhow::Result<Vec<Duration>> {
    anyhow::ensure!((1..=100).contains(&rounds), "rounds must be 1..=100");
    let membership = tidal_server::config::load_cluster(&dir.join("cluster.toml"), 1).with_context(|| {
        format!("no local cluster in {} (run `tidal cluster up --dir` first)", dir.display())
    })?;
    let nodes = membership.spec.nodes.clone();
    let clients: Vec<(u64, Client)> =
        nodes.iter().map(|n| (n.id.0, Client::new(format!("http://{}", n.http), None))).collect();
    let mut gaps = Vec::new();
    for round in 0..rounds {
        let leader = wait_leader(&clients, Duration::from_secs(30)).await?;
        let (_, leader_client) =
            clients.iter().find(|(id, _)| *id == leader).context("leader not in cluster file")?;
        leader_client
            .put_item(1, serde_json::json!({"round": round}), None)
            .await
            .context("write before the kill")?;
        let pid = std::fs::read_to_string(dir.join(format!("n{leader}.pid")))
            .context("read the leader's pid file")?
            .trim()
            .to_string();
        let killed = std::process::Command::new("kill").args(["-KILL", &pid]).status().context("run kill")?;
        anyhow::ensure!(killed.success(), "kill -KILL {pid} failed");
        let started = Instant::now();
        let deadline = started + Duration::from_secs(30);
        let gap = 'acked: loop {
            for (id, client) in clients.iter().filter(|(id, _)| *id != leader) {
                let write = client.put_item(2, serde_json::json!({"after": round, "via": id}), None);
                if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(500), write).await {
                    break 'acked started.elapsed();
                }
            }
            anyhow::ensure!(Instant::now() < deadline, "no node accepted a write within 30 s of the kill");
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        say(format!(
            "round {round}: killed leader n{leader} (pid {pid}); a write was acknowledged after {} ms",
            gap.as_millis()
        ));
        gaps.push(gap);
        // Restart the killed node quietly and wait until every node is ready again.
        let exe = std::env::current_exe().context("find the tidal binary")?;
        let up = std::process::Command::new(exe)
            .args(["cluster", "up", "--dir"])
            .arg(dir)
            .output()
            .context("restart the killed node")?;
        anyhow::ensure!(up.status.success(), "cluster up failed: {}", String::from_utf8_lossy(&up.stderr));
    }
    Ok(gaps)
}

async fn wait_leader(clients: &[(u64, Client)], timeout: Duration) -> anyhow::Result<u64> {
    let deadline = Instant::now() + timeout;
    loop {
        for (_, client) in clients {
            if let Ok(status) = client.status().await {
                if status.role == "leader" {
                    return Ok(status.node_id);
                }
            }
        }
        anyhow::ensure!(Instant::now() < deadline, "no leader within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
