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

/// Renders a status as a table.
pub fn status_table(status: &ClusterStatus) -> String {
    let mut out = format!(
        "node {} ({}), term {}, leader {}, durable {}, commit {}, applied {}, baseline (t{}, {}), quarantined {} seqnos in {} files\n\n",
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
    out.push_str(&format!(
        "{:<5} {:<10} {:<22} {:>12} {:>12} {:>12} {:>10} {:>12} {:>8}\n",
        "id", "role", "http", "matched", "durable", "applied", "lag", "last ack", "pulling"
    ));
    for node in &status.nodes {
        let lag = status.commit_seqno.saturating_sub(node.applied_seqno);
        let ack = match node.lag_ms {
            _ if node.id == status.node_id => "-".to_string(),
            Some(ms) => format!("{ms} ms"),
            None => "never".to_string(),
        };
        out.push_str(&format!(
            "{:<5} {:<10} {:<22} {:>12} {:>12} {:>12} {:>10} {:>12} {:>8}\n",
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
    }
    out
}

/// `tidal status`.
pub async fn status(args: VerbArgs) -> anyhow::Result<()> {
    let client = args.client()?;
    let status = client.status().await.with_context(|| format!("GET {}/cluster/status", args.url))?;
    // A follower only knows what the leader last told it; the leader knows every follower.
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
    print!("{}", status_table(&status));
    Ok(())
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

/// `tidal catchup`: the node at `--url` pulls from its leader now.
pub async fn catchup(args: VerbArgs) -> anyhow::Result<()> {
    post_verb(args, "/cluster/catchup").await
}

/// `tidal heal --node N [--dry-run]`: the leader nudges follower N to pull from its last matched position.
pub async fn heal(args: VerbArgs, node: u64, dry_run: bool) -> anyhow::Result<()> {
    post_verb(args, &format!("/cluster/heal?node={node}{}", dry_run_query(dry_run, '&'))).await
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
        tidal_client::Error::Transport(_) => true,
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
