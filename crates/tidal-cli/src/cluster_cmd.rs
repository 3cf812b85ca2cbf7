//! `tidal cluster up` / `tidal cluster down`: a local cluster on loopback for trying Tidal out;
//! `add-node` / `remove-node` change its membership (`--join`, then `members add`; `members remove`).
//!
//! `up` writes a cluster file and a secret under `--dir` (kept across runs: data dirs persist),
//! starts one `tidal serve` process per node (logs in `nN.log`, pid in `nN.pid`), waits until every
//! node is ready and prints where to reach them. `down` stops the processes it started (SIGTERM, by
//! the recorded pids; they drain and checkpoint).

use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// RPC ports sit this far above HTTP ports: node i gets `port_base + i` and `port_base + 100 + i`.
pub const RPC_PORT_OFFSET: u16 = 100;
/// How long `up` waits for every node to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// `tidal cluster` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ClusterCommand {
    /// Start a local cluster on loopback and wait until it is healthy.
    Up {
        /// Number of nodes.
        #[arg(long, default_value_t = 3)]
        nodes: u64,
        /// Folder for the cluster file, secret, data dirs and logs.
        #[arg(long, default_value = "./tidal-cluster")]
        dir: PathBuf,
        /// HTTP port of node 1 (node i gets base + i - 1; RPC ports are 100 higher).
        #[arg(long, default_value_t = 7070)]
        port_base: u16,
        /// When a write is acknowledged: `quorum` (once a majority fsynced it; no acknowledged write
        /// is lost when a minority fails) or `leader` (once the leader fsynced it; a failover may
        /// lose the last writes). Written to a new cluster file; an existing one must agree.
        #[arg(long, default_value = "quorum", value_parser = ["quorum", "leader"])]
        durability: String,
        /// Serve HTTPS and TLS between peers (mutual), with a throwaway CA made under `--dir/tls`
        /// (kept across runs). Clients verify with `--ca DIR/tls/ca.pem` or `TIDAL_CA`.
        #[arg(long)]
        tls: bool,
    },
    /// Stop the local cluster started from `--dir`.
    Down {
        /// Folder given to `up`.
        #[arg(long, default_value = "./tidal-cluster")]
        dir: PathBuf,
    },
    /// Add a node to the running local cluster: the next id and ports, `--join`, then `members add`
    /// (it catches up as a learner, then votes).
    AddNode {
        /// Folder given to `up`.
        #[arg(long, default_value = "./tidal-cluster")]
        dir: PathBuf,
        /// Say what would be done, change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Remove node N from the running local cluster (`members remove`), stop it, and move its data
    /// dir aside (`nN.removed`).
    RemoveNode {
        /// Folder given to `up`.
        #[arg(long, default_value = "./tidal-cluster")]
        dir: PathBuf,
        /// The node to remove.
        #[arg(long)]
        node: u64,
        /// Say what would be done, change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Failover benchmark on a running local cluster: SIGKILL the leader, time until another node
    /// acknowledges a write, restart the killed node; repeat.
    FailoverBench {
        /// Folder given to `up`.
        #[arg(long, default_value = "./tidal-cluster")]
        dir: PathBuf,
        /// Kill rounds.
        #[arg(long, default_value_t = 10)]
        rounds: u32,
    },
    /// Leadership-transfer benchmark on a running local cluster: while one client writes without
    /// pause, promote another node; report the transfer time and the longest gap between acks.
    PromoteBench {
        /// Folder given to `up`.
        #[arg(long, default_value = "./tidal-cluster")]
        dir: PathBuf,
        /// Transfers.
        #[arg(long, default_value_t = 10)]
        rounds: u32,
    },
}

/// Runs a `tidal cluster` subcommand.
pub async fn run(command: ClusterCommand) -> anyhow::Result<()> {
    match command {
        ClusterCommand::Up { nodes, dir, port_base, durability, tls } => {
            if tls {
                std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
                crate::local_tls::ensure(&dir, &(1..=nodes).collect::<Vec<_>>())?;
            }
            up(nodes, &dir, port_base, &durability).await
        }
        ClusterCommand::Down { dir } => down(&dir),
        ClusterCommand::AddNode { dir, dry_run } => add_node(&dir, dry_run).await,
        ClusterCommand::RemoveNode { dir, node, dry_run } => remove_node(&dir, node, dry_run).await,
        ClusterCommand::FailoverBench { dir, rounds } => crate::ops::failover_bench(&dir, rounds).await,
        ClusterCommand::PromoteBench { dir, rounds } => crate::ops::promote_bench(&dir, rounds).await,
    }
}

/// Writes `dir/cluster.toml` for a new local cluster, or checks that an existing one has the asked
/// `durability` (its nodes and ports stay as they are: the data dirs were made with them).
fn write_cluster_file(nodes: u64, dir: &Path, port_base: u16, durability: &str) -> anyhow::Result<PathBuf> {
    let path = dir.join("cluster.toml");
    if path.exists() {
        let existing = tidal_server::config::load_cluster(&path, 1)?;
        let asked = tidal_server::config::parse_durability(durability)?;
        anyhow::ensure!(
            existing.spec.durability == asked,
            "{} says durability {}, not {durability}: edit it (every node reads it at start) or use a new --dir",
            path.display(),
            durability_name(existing.spec.durability)
        );
        return Ok(path);
    }
    tidal_server::config::parse_durability(durability)?;
    anyhow::ensure!((1..=9).contains(&nodes), "a local cluster has 1..=9 nodes");
    let secret_path = dir.join("secret");
    let mut random = [0u8; 24];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut file| std::io::Read::read_exact(&mut file, &mut random))
        .context("read /dev/urandom for the cluster secret")?;
    let secret: String = random.iter().map(|b| format!("{b:02x}")).collect();
    // Created 0600: a node refuses a secret file that group or others may read.
    tidal_server::auth::write_private_file(&secret_path, format!("{secret}\n").as_bytes())
        .with_context(|| format!("write cluster secret {}", secret_path.display()))?;
    let mut text = String::from(
        "# Local Tidal cluster (tidal cluster up). Every node reads this same file.\n\
         cluster_id = \"local\"\nsecret_file = \"secret\"\n",
    );
    text.push_str(&format!("durability = \"{durability}\"\n"));
    for i in 0..nodes {
        let id = i + 1;
        let offset = u16::try_from(i).expect("at most 9 nodes");
        text.push_str(&format!(
            "\n[[node]]\nid = {id}\nhttp = \"127.0.0.1:{}\"\nrpc = \"127.0.0.1:{}\"\n",
            port_base + offset,
            port_base + RPC_PORT_OFFSET + offset
        ));
    }
    std::fs::write(&path, text).context("write cluster file")?;
    Ok(path)
}

/// The cluster file's word for `durability`.
fn durability_name(durability: tidal_cluster::Durability) -> &'static str {
    match durability {
        tidal_cluster::Durability::Quorum => "quorum",
        tidal_cluster::Durability::Leader => "leader",
    }
}

async fn up(nodes: u64, dir: &Path, port_base: u16, durability: &str) -> anyhow::Result<()> {
    let (membership, started) = start_with(nodes, dir, port_base, durability).await?;
    for (name, pid) in started {
        match pid {
            Some(pid) => {
                println!("{name}: started (pid {pid}), log {}", dir.join(format!("{name}.log")).display())
            }
            None => println!("{name}: already running"),
        }
    }
    let client = crate::local_tls::http_client(dir, Duration::from_secs(2))?;
    // Every node is ready, so every node knows the leader openraft elected; ask the first.
    let status: Option<tidal_types::ClusterStatus> =
        match client.get(format!("{}/cluster/status", url(dir, &membership.spec.nodes[0].http))).send().await
        {
            Ok(reply) => reply.json().await.ok(),
            Err(_) => None,
        };
    let leader = status.and_then(|status| status.leader_id).map(tidal_types::NodeId);
    println!(
        "\nTidal cluster {:?} is up ({} nodes, {} durability):",
        membership.spec.cluster_id,
        membership.spec.nodes.len(),
        durability_name(membership.spec.durability)
    );
    for node in &membership.spec.nodes {
        let role = if Some(node.id) == leader { "leader" } else { "follower" };
        println!("  n{}  {role:<8}  {}  (rpc {})", node.id.0, url(dir, &node.http), node.rpc);
    }
    let (first, last) = (&membership.spec.nodes[0], &membership.spec.nodes[membership.spec.nodes.len() - 1]);
    let curl = match crate::local_tls::enabled(dir) {
        true => format!("curl -s --cacert {}", crate::local_tls::ca_path(dir).display()),
        false => "curl -s".to_string(),
    };
    println!("\nTry:");
    if crate::local_tls::enabled(dir) {
        println!(
            "  export TIDAL_CA={}   # the tidal CLI verifies the nodes with it",
            crate::local_tls::ca_path(dir).display()
        );
    }
    println!(
        "  {curl} -X PUT {}/v1/items/1 --json '{{\"metadata\":{{\"title\":\"hello\"}}}}'",
        url(dir, &last.http)
    );
    println!("  {curl} -X POST {}/v1/signals --json '{{\"signals\":[{{\"user\":\"u1\",\"item\":1,\"kind\":\"like\"}}]}}'", url(dir, &first.http));
    println!("  {curl} {}/v1/trending", url(dir, &last.http));
    println!("  {curl} {}/cluster/status", url(dir, &first.http));
    println!("  tidal cluster down --dir {}", dir.display());
    Ok(())
}

/// Writes the cluster file under `dir` if it is missing, starts every node that is not running and
/// waits until every node is ready. Returns the membership and, per node, the pid it was started
/// with (`None`: it was already running).
pub async fn start(
    nodes: u64,
    dir: &Path,
    port_base: u16,
) -> anyhow::Result<(tidal_server::config::ClusterMembership, Vec<(String, Option<u32>)>)> {
    start_with(nodes, dir, port_base, "quorum").await
}

/// [`start`] with the given durability (`quorum` or `leader`).
async fn start_with(
    nodes: u64,
    dir: &Path,
    port_base: u16,
    durability: &str,
) -> anyhow::Result<(tidal_server::config::ClusterMembership, Vec<(String, Option<u32>)>)> {
    anyhow::ensure!((1024..=65_000).contains(&port_base), "port base must be 1024..=65000");
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let cluster_file = write_cluster_file(nodes, dir, port_base, durability)?;
    let membership = tidal_server::config::load_cluster(&cluster_file, 1)?;
    let mut started = Vec::new();
    for node in &membership.spec.nodes {
        let name = format!("n{}", node.id.0);
        if running_pid(&dir.join(format!("{name}.pid"))).is_some() {
            started.push((name, None));
            continue;
        }
        started.push((name, Some(start_node(dir, node.id.0)?)));
    }
    for node in &membership.spec.nodes {
        wait_ready(dir, node.id.0, &node.http, READY_TIMEOUT).await?;
    }
    Ok((membership, started))
}

/// The first port base from `preferred` on (in steps of 1000) whose HTTP and RPC ports for `nodes`
/// nodes are all free right now, for commands that make a throwaway cluster (gates, demo). Another
/// process may still take a port before the nodes bind it; the nodes then fail to start, loudly.
pub fn free_port_base(preferred: u16, nodes: u16) -> anyhow::Result<u16> {
    let free = |port: u16| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok();
    let mut base = preferred;
    while base <= 65_000 - RPC_PORT_OFFSET - nodes {
        if (0..nodes).all(|i| free(base + i) && free(base + RPC_PORT_OFFSET + i)) {
            return Ok(base);
        }
        base += 1000;
    }
    anyhow::bail!("no free loopback ports from {preferred} on")
}

/// How long `add-node` lets the new node catch up as a learner.
const ADD_NODE_CATCH_UP_S: u64 = 600;

/// A running member's HTTP address (the first that answers), to send a verb to.
async fn live_member(
    dir: &Path,
    membership: &tidal_server::config::ClusterMembership,
    except: u64,
) -> anyhow::Result<String> {
    let client = crate::local_tls::http_client(dir, Duration::from_secs(2))?;
    for node in membership.spec.nodes.iter().filter(|node| node.id.0 != except) {
        if client
            .get(format!("{}/healthz", url(dir, &node.http)))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            return Ok(url(dir, &node.http));
        }
    }
    anyhow::bail!("no member of the local cluster answers; start it with `tidal cluster up`")
}

async fn add_node(dir: &Path, dry_run: bool) -> anyhow::Result<()> {
    let cluster_file = dir.join("cluster.toml");
    let membership = tidal_server::config::load_cluster(&cluster_file, 1)
        .with_context(|| format!("no local cluster in {} (run `tidal cluster up` first)", dir.display()))?;
    let id = membership.spec.nodes.iter().map(|node| node.id.0).max().unwrap_or(0) + 1;
    anyhow::ensure!(id <= 9, "a local cluster has at most 9 nodes");
    let first = &membership.spec.nodes[0];
    let port_base: u16 = first
        .http
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
        .context("node 1's http address has no port")?;
    let offset = u16::try_from(id - 1).expect("at most 9 nodes");
    let (http, rpc) = (
        format!("127.0.0.1:{}", port_base + offset),
        format!("127.0.0.1:{}", port_base + RPC_PORT_OFFSET + offset),
    );
    let leader_url = live_member(dir, &membership, 0).await?;
    if dry_run {
        println!("would start n{id} (http {http}, rpc {rpc}) with --join and ask {leader_url} to add it");
        let verb = local_verb(dir, leader_url);
        return crate::ops::members_add(verb, id, &http, &rpc, ADD_NODE_CATCH_UP_S, true).await;
    }
    let mut text = std::fs::read_to_string(&cluster_file).context("read cluster file")?;
    text.push_str(&format!("\n[[node]]\nid = {id}\nhttp = \"{http}\"\nrpc = \"{rpc}\"\n"));
    std::fs::write(&cluster_file, text).context("write cluster file")?;
    if crate::local_tls::enabled(dir) {
        crate::local_tls::ensure(dir, &[id])?;
    }
    let pid = start_node_with(dir, id, true)?;
    println!("n{id}: started with --join (pid {pid}), log {}", dir.join(format!("n{id}.log")).display());
    let client = crate::local_tls::http_client(dir, Duration::from_secs(2))?;
    let deadline = Instant::now() + READY_TIMEOUT;
    while !client
        .get(format!("{}/healthz", url(dir, &http)))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        anyhow::ensure!(Instant::now() < deadline, "n{id} did not start; see its log");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("n{id}: catching up as a learner, then a voter (members add on {leader_url})");
    let verb = local_verb(dir, leader_url);
    crate::ops::members_add(verb, id, &http, &rpc, ADD_NODE_CATCH_UP_S, false).await
}

async fn remove_node(dir: &Path, id: u64, dry_run: bool) -> anyhow::Result<()> {
    let cluster_file = dir.join("cluster.toml");
    let membership = tidal_server::config::load_cluster(&cluster_file, 1)
        .with_context(|| format!("no local cluster in {} (run `tidal cluster up` first)", dir.display()))?;
    let url = live_member(dir, &membership, id).await?;
    let verb = local_verb(dir, url);
    crate::ops::members_remove(verb, id, dry_run).await?;
    if dry_run {
        return Ok(());
    }
    // Out of the cluster file, so `cluster up` does not start it again; its data dir kept aside.
    let text = std::fs::read_to_string(&cluster_file).context("read cluster file")?;
    let kept: Vec<&str> =
        text.split("\n[[node]]\n").filter(|block| !block.starts_with(&format!("id = {id}\n"))).collect();
    std::fs::write(&cluster_file, kept.join("\n[[node]]\n")).context("write cluster file")?;
    let pid_path = dir.join(format!("n{id}.pid"));
    if let Some(pid) = running_pid(&pid_path) {
        let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status();
        let deadline = Instant::now() + READY_TIMEOUT;
        while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        println!("n{id}: stopped (pid {pid})");
    }
    std::fs::remove_file(&pid_path).ok();
    let data = dir.join(format!("n{id}"));
    if data.exists() {
        let aside = dir.join(format!("n{id}.removed"));
        std::fs::remove_dir_all(&aside).ok();
        std::fs::rename(&data, &aside).context("move the removed node's data dir aside")?;
        println!("n{id}: data dir moved to {}", aside.display());
    }
    Ok(())
}

/// Starts node `id` of the local cluster in `dir` (its cluster file must exist) as a `tidal serve`
/// process: log in `nN.log` (appended to, so a restart keeps the history), pid in `nN.pid`.
pub fn start_node(dir: &Path, id: u64) -> anyhow::Result<u32> {
    start_node_with(dir, id, false)
}

/// [`start_node`], with `--join` when `join` (a node added to a running cluster).
fn start_node_with(dir: &Path, id: u64, join: bool) -> anyhow::Result<u32> {
    let name = format!("n{id}");
    let exe = std::env::current_exe().context("find the tidal binary")?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{name}.log")))
        .context("open node log")?;
    let mut child = Command::new(&exe)
        .arg("serve")
        .arg("--cluster")
        .arg(dir.join("cluster.toml"))
        .args(["--node-id", &id.to_string()])
        .arg("--data-dir")
        .arg(dir.join(&name))
        .args(join.then_some("--join"))
        .args(if crate::local_tls::enabled(dir) { crate::local_tls::serve_args(dir, id) } else { Vec::new() })
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("start {name}"))?;
    let pid = child.id();
    std::fs::write(dir.join(format!("{name}.pid")), pid.to_string()).context("write pid file")?;
    // Reap the child when it exits, so a long-lived caller (gates, demo) leaves no zombie that
    // `stop` would wait for; `cluster up` exits at once and init adopts its children instead.
    std::thread::Builder::new()
        .name(format!("reap-{name}"))
        .spawn(move || {
            let _ = child.wait();
        })
        .context("start the reaper thread")?;
    Ok(pid)
}

/// Polls `GET /readyz` of node `id` (HTTP address `http`) until it answers 200 or `timeout` passes.
///
/// Fails at once when the node's process (by its pid file in `dir`) has exited. Either failure says
/// the node's last answer (why it was not ready) and quotes the end of its log, so an operator (or
/// a CI log) sees the cause without another step.
pub async fn wait_ready(dir: &Path, id: u64, http: &str, timeout: Duration) -> anyhow::Result<()> {
    let client = crate::local_tls::http_client(dir, Duration::from_secs(2))?;
    let deadline = Instant::now() + timeout;
    let pid_path = dir.join(format!("n{id}.pid"));
    let log = dir.join(format!("n{id}.log"));
    loop {
        let last_answer = match client.get(format!("{}/readyz", url(dir, http))).send().await {
            Ok(reply) if reply.status().is_success() => return Ok(()),
            Ok(reply) => {
                let status = reply.status();
                let body = reply.text().await.unwrap_or_default();
                format!("{status}: {}", body.trim())
            }
            Err(error) => {
                let mut why = format!("no answer: {error}");
                let mut source = std::error::Error::source(&error);
                while let Some(cause) = source {
                    why.push_str(&format!(": {cause}"));
                    source = cause.source();
                }
                why
            }
        };
        if pid_path.exists() && running_pid(&pid_path).is_none() {
            anyhow::bail!(
                "node {id} exited before it was ready (last answer: {last_answer}); the end of {}:\n{}",
                log.display(),
                tidal_client::node_log::tail(&log, LOG_TAIL_LINES)
            );
        }
        if Instant::now() >= deadline {
            anyhow::bail!(
                "node {id} did not become ready within {timeout:?} (last answer: {last_answer}); the end of {}:\n{}",
                log.display(),
                tidal_client::node_log::tail(&log, LOG_TAIL_LINES)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How many lines of a node's log a failed start quotes.
const LOG_TAIL_LINES: usize = 40;

/// SIGKILLs node `id` of the local cluster in `dir` and waits until the process is gone; returns
/// its pid.
pub fn kill_node(dir: &Path, id: u64) -> anyhow::Result<u32> {
    let pid_path = dir.join(format!("n{id}.pid"));
    let pid = running_pid(&pid_path).with_context(|| format!("node {id} is not running"))?;
    let killed = Command::new("kill").args(["-KILL", &pid.to_string()]).status().context("run kill")?;
    anyhow::ensure!(killed.success(), "kill -KILL {pid} failed");
    let deadline = Instant::now() + READY_TIMEOUT;
    // The node was started by a process that has exited, so init reaps it; wait until it is gone.
    while Path::new(&format!("/proc/{pid}")).exists() && running_pid(&pid_path).is_some() {
        anyhow::ensure!(Instant::now() < deadline, "pid {pid} still alive {READY_TIMEOUT:?} after SIGKILL");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::fs::remove_file(&pid_path).ok();
    Ok(pid)
}

/// A node's base URL in the local cluster of `dir`.
pub fn url(dir: &Path, http: &str) -> String {
    format!("{}://{http}", crate::local_tls::scheme(dir))
}

/// Verb options for the local cluster of `dir`: its CA when it serves TLS.
fn local_verb(dir: &Path, url: String) -> crate::ops::VerbArgs {
    let ca = crate::local_tls::enabled(dir).then(|| crate::local_tls::ca_path(dir));
    crate::ops::VerbArgs { url, token: None, ca }
}

fn running_pid(pid_path: &Path) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(pid_path).ok()?.trim().parse().ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    // Only a tidal process counts: the pid may have been reused.
    String::from_utf8_lossy(&cmdline).contains("serve").then_some(pid)
}

fn down(dir: &Path) -> anyhow::Result<()> {
    let stopped = stop(dir, |line| println!("{line}"))?;
    println!("{stopped} node(s) stopped");
    Ok(())
}

/// Stops (SIGTERM) every node of the local cluster in `dir` that is running, waits until they have
/// exited, and returns how many there were; `say` gets one line per node.
pub fn stop(dir: &Path, say: impl Fn(String)) -> anyhow::Result<usize> {
    let mut stopped = 0;
    let mut waiting: Vec<u32> = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("read {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_none_or(|ext| ext != "pid") {
            continue;
        }
        if let Some(pid) = running_pid(&path) {
            let status =
                Command::new("kill").args(["-TERM", &pid.to_string()]).status().context("run kill")?;
            if status.success() {
                say(format!(
                    "{}: stopping (pid {pid})",
                    path.file_stem().map(|s| s.to_string_lossy()).unwrap_or_default()
                ));
                stopped += 1;
                waiting.push(pid);
            }
        }
        std::fs::remove_file(&path).ok();
    }
    // Wait for them to drain and checkpoint, so the data dirs are quiet when `down` returns.
    let deadline = Instant::now() + READY_TIMEOUT;
    while waiting.iter().any(|pid| Path::new(&format!("/proc/{pid}")).exists()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(stopped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_port_base_skips_a_taken_port() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        // Either a base 1000 up, or no room left above it; never the taken port.
        if let Ok(base) = free_port_base(port, 1) {
            assert_ne!(base, port, "port {port} is bound, yet it was chosen");
            assert_eq!((base - port) % 1000, 0, "bases step by 1000: {port} -> {base}");
        }
    }

    #[test]
    fn a_new_cluster_file_takes_the_asked_durability_and_an_existing_one_must_agree() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_cluster_file(3, dir.path(), 7070, "leader").unwrap();
        let membership = tidal_server::config::load_cluster(&path, 1).unwrap();
        assert_eq!(membership.spec.durability, tidal_cluster::Durability::Leader);
        assert_eq!(membership.spec.nodes.len(), 3);
        assert!(write_cluster_file(3, dir.path(), 7070, "leader").is_ok());
        let refused = write_cluster_file(3, dir.path(), 7070, "quorum").unwrap_err().to_string();
        assert!(refused.contains("says durability leader, not quorum"), "{refused}");
        let other = dir.path().join("other");
        std::fs::create_dir_all(&other).unwrap();
        assert!(write_cluster_file(3, &other, 7070, "eventual").is_err());
        assert!(!other.join("cluster.toml").exists(), "a refused durability writes no file");
    }
}
