//! `tidal cluster up` / `tidal cluster down`: a local cluster on loopback for trying Tidal out.
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
const RPC_PORT_OFFSET: u16 = 100;
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
    },
    /// Stop the local cluster started from `--dir`.
    Down {
        /// Folder given to `up`.
        #[arg(long, default_value = "./tidal-cluster")]
        dir: PathBuf,
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
        ClusterCommand::Up { nodes, dir, port_base } => up(nodes, &dir, port_base).await,
        ClusterCommand::Down { dir } => down(&dir),
        ClusterCommand::FailoverBench { dir, rounds } => crate::ops::failover_bench(&dir, rounds).await,
        ClusterCommand::PromoteBench { dir, rounds } => crate::ops::promote_bench(&dir, rounds).await,
    }
}

fn write_cluster_file(nodes: u64, dir: &Path, port_base: u16) -> anyhow::Result<PathBuf> {
    let path = dir.join("cluster.toml");
    if path.exists() {
        return Ok(path);
    }
    anyhow::ensure!((1..=9).contains(&nodes), "a local cluster has 1..=9 nodes");
    let secret_path = dir.join("secret");
    let mut random = [0u8; 24];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut file| std::io::Read::read_exact(&mut file, &mut random))
        .context("read /dev/urandom for the cluster secret")?;
    let secret: String = random.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(&secret_path, format!("{secret}\n")).context("write cluster secret")?;
    let mut text = String::from(
        "# Local Tidal cluster (tidal cluster up). Every node reads this same file.\n\
         cluster_id = \"local\"\nsecret_file = \"secret\"\ndurability = \"quorum\"\n",
    );
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

async fn up(nodes: u64, dir: &Path, port_base: u16) -> anyhow::Result<()> {
    anyhow::ensure!((1024..=65_000).contains(&port_base), "port base must be 1024..=65000");
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let cluster_file = write_cluster_file(nodes, dir, port_base)?;
    let membership = crate::config::load_cluster(&cluster_file, 1)?;
    let exe = std::env::current_exe().context("find the tidal binary")?;
    for node in &membership.spec.nodes {
        let name = format!("n{}", node.id.0);
        let pid_path = dir.join(format!("{name}.pid"));
        if let Some(pid) = running_pid(&pid_path) {
            println!("{name}: already running (pid {pid})");
            continue;
        }
        let log = std::fs::File::create(dir.join(format!("{name}.log"))).context("create node log")?;
        let child = Command::new(&exe)
            .arg("serve")
            .arg("--cluster")
            .arg(&cluster_file)
            .args(["--node-id", &node.id.0.to_string()])
            .arg("--data-dir")
            .arg(dir.join(&name))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("start {name}"))?;
        std::fs::write(&pid_path, child.id().to_string()).context("write pid file")?;
        println!("{name}: started (pid {}), log {}", child.id(), dir.join(format!("{name}.log")).display());
    }
    let client = reqwest::Client::builder().timeout(Duration::from_secs(2)).build()?;
    let deadline = Instant::now() + READY_TIMEOUT;
    for node in &membership.spec.nodes {
        loop {
            let ready = client.get(format!("http://{}/readyz", node.http)).send().await;
            if ready.is_ok_and(|reply| reply.status().is_success()) {
                break;
            }
            if Instant::now() > deadline {
                anyhow::bail!(
                    "node {} did not become ready within {:?}; see {}",
                    node.id,
                    READY_TIMEOUT,
                    dir.join(format!("n{}.log", node.id.0)).display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // Every node is ready, so every node knows the leader openraft elected; ask the first.
    let status: Option<tidal_types::ClusterStatus> =
        match client.get(format!("http://{}/cluster/status", membership.spec.nodes[0].http)).send().await {
            Ok(reply) => reply.json().await.ok(),
            Err(_) => None,
        };
    let leader = status.and_then(|status| status.leader_id).map(tidal_types::NodeId);
    println!(
        "\nTidal cluster {:?} is up ({} nodes, quorum durability):",
        membership.spec.cluster_id,
        membership.spec.nodes.len()
    );
    for node in &membership.spec.nodes {
        let role = if Some(node.id) == leader { "leader" } else { "follower" };
        println!("  n{}  {role:<8}  http://{}  (rpc {})", node.id.0, node.http, node.rpc);
    }
    let (first, last) = (&membership.spec.nodes[0], &membership.spec.nodes[membership.spec.nodes.len() - 1]);
    println!("\nTry:");
    println!("  curl -s -X PUT {}/v1/items/1 -d '{{\"metadata\":{{\"title\":\"hello\"}}}}'", url(&last.http));
    println!("  curl -s -X POST {}/v1/signals -d '{{\"signals\":[{{\"user\":\"u1\",\"item\":1,\"kind\":\"like\"}}]}}'", url(&first.http));
    println!("  curl -s {}/v1/trending", url(&last.http));
    println!("  curl -s {}/cluster/status", url(&first.http));
    println!("  tidal cluster down --dir {}", dir.display());
    Ok(())
}

fn url(http: &str) -> String {
    format!("http://{http}")
}

fn running_pid(pid_path: &Path) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(pid_path).ok()?.trim().parse().ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    // Only a tidal process counts: the pid may have been reused.
    String::from_utf8_lossy(&cmdline).contains("serve").then_some(pid)
}

fn down(dir: &Path) -> anyhow::Result<()> {
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
                println!(
                    "{}: stopping (pid {pid})",
                    path.file_stem().map(|s| s.to_string_lossy()).unwrap_or_default()
                );
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
    println!("{stopped} node(s) stopped");
    Ok(())
}
