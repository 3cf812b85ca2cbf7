//! [`ProcessCluster`]: N `tidal serve` processes on loopback, each with its own data dir and log,
//! every RPC link routed through a [`Relay`] so it can be cut.
//!
//! The cluster file and secret it writes are the ones `tidal cluster up` writes
//! (`crates/tidal-cli/src/cluster_cmd.rs`, parsed by tidal-server's `config.rs`): `cluster_id`, `secret_file`,
//! `durability`, one `[[node]]` with `id`, `http`, `rpc` per member. Each node is started with
//! `--dial PEER=RELAY` for every peer, so node A reaches node B only through relay (A, B).

use crate::process::NodeProcess;
use crate::relay::Relay;
use crate::PortLease;
use crate::{log_tail, DEADLINE, POLL};
use anyhow::Context;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tidal_client::Client;
use tidal_types::{ClusterStatus, DigestView};

/// How long one harness probe (`/readyz`, status) may take before it counts as "no answer".
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// Log lines quoted in an error.
const LOG_TAIL_LINES: usize = 25;

/// A running cluster of `tidal` processes. Dropping it SIGKILLs every process and stops the relays.
pub struct ProcessCluster {
    binary: PathBuf,
    cluster_file: PathBuf,
    members: Vec<Member>,
    /// (from, to) → the relay node `from` dials to reach `to`.
    relays: BTreeMap<(u64, u64), Relay>,
    probe: reqwest::Client,
    /// Every node's HTTP and RPC port, held while the cluster lives (a killed node restarts on
    /// them).
    _ports: PortLease,
}

struct Member {
    id: u64,
    http: SocketAddr,
    data_dir: PathBuf,
    log: PathBuf,
    client: Client,
    process: Mutex<Option<NodeProcess>>,
}

/// A converged cluster: every running node applied `seqno` and has the same `digest`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Converged {
    /// The leader every node names.
    pub leader: u64,
    /// The common applied = commit = durable frontier.
    pub seqno: u64,
    /// The common state digest.
    pub digest: String,
}

impl ProcessCluster {
    /// Writes the cluster file and secret under `root`, starts `size` nodes (ids 1..=size, data in
    /// `root/nN`, logs in `root/nN.log`) in `durability` (`quorum` or `leader`), and waits until every
    /// node is ready and all name one serving leader.
    pub async fn start(
        binary: &Path,
        root: &Path,
        size: u64,
        durability: &str,
    ) -> anyhow::Result<ProcessCluster> {
        anyhow::ensure!((1..=9).contains(&size), "a process cluster has 1..=9 nodes");
        std::fs::create_dir_all(root).with_context(|| format!("create {}", root.display()))?;
        let ports = PortLease::take(2 * size as usize)?;
        let addresses: Vec<(u64, SocketAddr, SocketAddr)> = (1..=size)
            .map(|id| {
                let at = 2 * (id as usize - 1);
                (id, ports.address(at), ports.address(at + 1))
            })
            .collect();
        let mut relays = BTreeMap::new();
        for (from, _, _) in &addresses {
            for (to, _, rpc) in addresses.iter().filter(|(to, _, _)| to != from) {
                relays.insert((*from, *to), Relay::start(*rpc).await?);
            }
        }
        let cluster_file = write_cluster_file(root, durability, &addresses)?;
        let members = addresses
            .iter()
            .map(|(id, http, _)| Member {
                id: *id,
                http: *http,
                data_dir: root.join(format!("n{id}")),
                log: root.join(format!("n{id}.log")),
                client: Client::new(format!("http://{http}"), None),
                process: Mutex::new(None),
            })
            .collect();
        let probe = reqwest::Client::builder().timeout(PROBE_TIMEOUT).build()?;
        let cluster = ProcessCluster {
            binary: binary.to_path_buf(),
            cluster_file,
            members,
            relays,
            probe,
            _ports: ports,
        };
        for id in cluster.ids() {
            cluster.restart(id)?;
        }
        for id in cluster.ids() {
            cluster.wait_ready(id).await?;
        }
        cluster.leader().await?;
        Ok(cluster)
    }

    /// Every member id.
    pub fn ids(&self) -> Vec<u64> {
        self.members.iter().map(|member| member.id).collect()
    }

    /// The ids of the members whose process runs.
    pub fn running(&self) -> Vec<u64> {
        self.members.iter().filter(|member| self.is_running(member.id)).map(|member| member.id).collect()
    }

    /// Whether `id`'s process was started and not killed by the harness.
    pub fn is_running(&self, id: u64) -> bool {
        self.member(id).is_ok_and(|member| lock(&member.process).is_some())
    }

    /// A client for `id`'s HTTP API.
    pub fn client(&self, id: u64) -> &Client {
        &self.members[self.index(id)].client
    }

    /// `id`'s base URL.
    pub fn url(&self, id: u64) -> String {
        format!("http://{}", self.members[self.index(id)].http)
    }

    /// `id`'s log file.
    pub fn log(&self, id: u64) -> &Path {
        &self.members[self.index(id)].log
    }

    /// `id`'s data dir.
    pub fn data_dir(&self, id: u64) -> &Path {
        &self.members[self.index(id)].data_dir
    }

    /// The cluster file every node reads.
    pub fn cluster_file(&self) -> &Path {
        &self.cluster_file
    }

    /// The `tidal` binary.
    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// SIGKILLs `id` (by the pid of the child the harness spawned) and reaps it.
    pub fn kill(&self, id: u64) -> anyhow::Result<()> {
        let process = lock(&self.member(id)?.process).take();
        let process = process.with_context(|| format!("node {id} is not running"))?;
        let pid = process.pid();
        let status = process.kill()?;
        tracing::info!(node = id, pid, %status, "SIGKILLed");
        Ok(())
    }

    /// Stops `id` gracefully (SIGTERM) and waits until it exits; the exit status is returned, and a
    /// process still alive at the deadline is killed and reported as an error.
    pub async fn stop(&self, id: u64) -> anyhow::Result<std::process::ExitStatus> {
        let process = lock(&self.member(id)?.process).take();
        let process = process.with_context(|| format!("node {id} is not running"))?;
        let status = process.terminate(Instant::now() + DEADLINE).await?;
        tracing::info!(node = id, %status, "stopped (SIGTERM)");
        Ok(status)
    }

    /// Starts `id` again on its data dir (or for the first time); does not wait for it.
    pub fn restart(&self, id: u64) -> anyhow::Result<()> {
        let member = self.member(id)?;
        let mut slot = lock(&member.process);
        anyhow::ensure!(slot.is_none(), "node {id} is already running");
        let mut args: Vec<OsString> =
            vec!["serve".into(), "--cluster".into(), self.cluster_file.clone().into()];
        args.extend([
            "--node-id".into(),
            id.to_string().into(),
            "--data-dir".into(),
            member.data_dir.clone().into(),
        ]);
        for ((from, to), relay) in &self.relays {
            if *from == id {
                args.extend(["--dial".into(), format!("{to}={}", relay.address()).into()]);
            }
        }
        let process = NodeProcess::spawn(&self.binary, &args, &member.log)?;
        tracing::info!(node = id, pid = process.pid(), "started");
        *slot = Some(process);
        Ok(())
    }

    /// Cuts every link to and from `id` (both directions of each); the process keeps running.
    pub fn cut(&self, id: u64) {
        for ((from, to), relay) in &self.relays {
            if *from == id || *to == id {
                relay.cut();
            }
        }
    }

    /// Restores every link to and from `id`.
    pub fn restore(&self, id: u64) {
        for ((from, to), relay) in &self.relays {
            if *from == id || *to == id {
                relay.restore();
            }
        }
    }

    /// Cuts the directed link `from` → `to` (`from`'s calls to `to`, and their answers).
    pub fn cut_link(&self, from: u64, to: u64) -> anyhow::Result<()> {
        self.relays.get(&(from, to)).context("no such link")?.cut();
        Ok(())
    }

    /// Restores the directed link `from` → `to`.
    pub fn restore_link(&self, from: u64, to: u64) -> anyhow::Result<()> {
        self.relays.get(&(from, to)).context("no such link")?.restore();
        Ok(())
    }

    /// Bytes relay (`from`, `to`) has forwarded so far: `from`'s calls to `to` and their answers.
    pub fn link_bytes(&self, from: u64, to: u64) -> anyhow::Result<u64> {
        Ok(self.relays.get(&(from, to)).context("no such link")?.bytes_forwarded())
    }

    /// Waits until `id`'s `/readyz` answers 200 (for a follower: it knows a leader and hears it).
    pub async fn wait_ready(&self, id: u64) -> anyhow::Result<()> {
        let deadline = Instant::now() + DEADLINE;
        loop {
            self.check_alive(id)?;
            if self.ready(id).await {
                return Ok(());
            }
            if Instant::now() > deadline {
                anyhow::bail!("node {id} not ready within {DEADLINE:?}:\n{}", self.log_tails(&[id]));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until one running node serves as leader (its `/readyz` is 200) and every running node
    /// names it; returns its id.
    pub async fn leader(&self) -> anyhow::Result<u64> {
        self.leader_of(&self.running()).await
    }

    /// Like [`ProcessCluster::leader`], among `ids` only (e.g. the majority side of a cut).
    pub async fn leader_of(&self, ids: &[u64]) -> anyhow::Result<u64> {
        let deadline = Instant::now() + DEADLINE;
        loop {
            match self.check_leader(ids).await {
                Ok(leader) => return Ok(leader),
                Err(why) if Instant::now() > deadline => {
                    anyhow::bail!(
                        "no leader among {ids:?} within {DEADLINE:?}: {why}\n{}",
                        self.log_tails(ids)
                    )
                }
                Err(_) => tokio::time::sleep(POLL).await,
            }
        }
    }

    /// `id`'s `GET /cluster/status`.
    pub async fn status(&self, id: u64) -> anyhow::Result<ClusterStatus> {
        self.client(id).status().await.with_context(|| format!("status of node {id}"))
    }

    /// `id`'s digest once it has applied `min_seqno` (the node waits for it, bounded).
    pub async fn digest(&self, id: u64, min_seqno: u64) -> anyhow::Result<DigestView> {
        self.client(id)
            .json::<(), DigestView>(
                reqwest::Method::GET,
                &format!("/cluster/digest?min_seqno={min_seqno}"),
                None,
            )
            .await
            .with_context(|| format!("digest of node {id} at {min_seqno}"))
    }

    /// `id`'s `/metrics` text.
    pub async fn metrics(&self, id: u64) -> anyhow::Result<String> {
        let reply = self.probe.get(format!("{}/metrics", self.url(id))).send().await?;
        Ok(reply.error_for_status()?.text().await?)
    }

    /// The value of the metric line named exactly `series` (with its labels, if any), if present.
    pub async fn metric(&self, id: u64, series: &str) -> anyhow::Result<Option<f64>> {
        let text = self.metrics(id).await?;
        Ok(text.lines().find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            (name == series).then(|| value.parse().ok()).flatten()
        }))
    }

    /// Waits until the running nodes have converged ([`ProcessCluster::check_converged`]).
    pub async fn converged(&self) -> anyhow::Result<Converged> {
        let ids = self.running();
        let deadline = Instant::now() + DEADLINE;
        loop {
            match self.check_converged(&ids).await {
                Ok(converged) => return Ok(converged),
                Err(why) if Instant::now() > deadline => {
                    anyhow::bail!("no convergence within {DEADLINE:?}: {why}\n{}", self.log_tails(&ids))
                }
                Err(_) => tokio::time::sleep(POLL).await,
            }
        }
    }

    /// The first unmet condition of convergence among `ids`, or the converged state: one serving
    /// leader that all name; every node's durable, commit and applied frontiers equal to the
    /// leader's commit; the same state digest (and hard-negatives digest) at that seqno everywhere.
    pub async fn check_converged(&self, ids: &[u64]) -> Result<Converged, String> {
        let leader = self.check_leader(ids).await?;
        let commit = self.status(leader).await.map_err(|e| format!("{e:#}"))?.commit_seqno;
        for id in ids {
            let status = self.status(*id).await.map_err(|e| format!("{e:#}"))?;
            let frontiers = (status.durable_seqno, status.commit_seqno, status.applied_seqno);
            if frontiers != (commit, commit, commit) {
                return Err(format!(
                    "node {id}: durable/commit/applied {frontiers:?}, leader {leader} commit {commit}"
                ));
            }
        }
        let mut first: Option<DigestView> = None;
        for id in ids {
            let digest = self.digest(*id, commit).await.map_err(|e| format!("{e:#}"))?;
            if digest.applied_seqno != commit {
                return Err(format!("node {id}: digest at {} (expected {commit})", digest.applied_seqno));
            }
            let differs = first.as_ref().is_some_and(|first| {
                (&first.digest, &first.negatives_digest) != (&digest.digest, &digest.negatives_digest)
            });
            if differs {
                return Err(format!("digests differ at {commit}: {first:?} vs {digest:?}"));
            }
            first.get_or_insert(digest);
        }
        let digest = first.map(|digest| digest.digest).ok_or_else(|| "no nodes".to_string())?;
        Ok(Converged { leader, seqno: commit, digest })
    }

    /// One unmet condition of "one serving leader among `ids`, named by all", or its id.
    async fn check_leader(&self, ids: &[u64]) -> Result<u64, String> {
        let mut leaders = Vec::new();
        let mut named = BTreeMap::new();
        for id in ids {
            self.check_alive(*id).map_err(|e| format!("{e:#}"))?;
            let status = self.status(*id).await.map_err(|e| format!("{e:#}"))?;
            if status.role == "leader" {
                leaders.push(*id);
            }
            named.insert(*id, status.leader_id);
        }
        let [leader] = leaders[..] else {
            return Err(format!("leaders by role {leaders:?}; named {named:?}"));
        };
        if named.values().any(|named| *named != Some(leader)) {
            return Err(format!("not every node names {leader}: {named:?}"));
        }
        if !self.ready(leader).await {
            return Err(format!("leader {leader} is not serving yet"));
        }
        Ok(leader)
    }

    async fn ready(&self, id: u64) -> bool {
        let reply = self.probe.get(format!("{}/readyz", self.url(id))).send().await;
        reply.is_ok_and(|reply| reply.status().is_success())
    }

    /// Fails if `id` was started and its process has exited on its own (a crash is a finding).
    fn check_alive(&self, id: u64) -> anyhow::Result<()> {
        let member = self.member(id)?;
        let mut slot = lock(&member.process);
        let process = slot.as_mut().with_context(|| format!("node {id} is not running"))?;
        if let Some(status) = process.exited()? {
            *slot = None;
            drop(slot);
            anyhow::bail!("node {id} exited on its own ({status}):\n{}", self.log_tails(&[id]));
        }
        Ok(())
    }

    /// The last lines of the logs of `ids`, for error messages.
    pub fn log_tails(&self, ids: &[u64]) -> String {
        let mut out = String::new();
        for id in ids {
            let _ = writeln!(
                out,
                "--- n{id}.log (last {LOG_TAIL_LINES} lines) ---\n{}",
                log_tail(self.log(*id), LOG_TAIL_LINES)
            );
        }
        out
    }

    fn member(&self, id: u64) -> anyhow::Result<&Member> {
        self.members.iter().find(|member| member.id == id).with_context(|| format!("no node {id}"))
    }

    fn index(&self, id: u64) -> usize {
        self.members.iter().position(|member| member.id == id).unwrap_or_else(|| panic!("no node {id}"))
    }
}

fn lock(process: &Mutex<Option<NodeProcess>>) -> std::sync::MutexGuard<'_, Option<NodeProcess>> {
    // A panic while holding this lock leaves the slot as it was; keep using it.
    process.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A secret unique enough for a loopback test cluster (not a production secret: `tidal cluster up`
/// reads /dev/urandom for that).
fn test_secret() -> String {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("tidal-procs-{}-{nanos}", std::process::id())
}

/// Writes a file only its owner may read (mode 0600 from its creation): a node refuses a secret
/// or token file that group or others may read.
pub fn write_private(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)?.write_all(contents)
}

fn write_cluster_file(
    root: &Path,
    durability: &str,
    addresses: &[(u64, SocketAddr, SocketAddr)],
) -> anyhow::Result<PathBuf> {
    write_private(&root.join("secret"), format!("{}\n", test_secret()).as_bytes())
        .context("write cluster secret")?;
    let mut text = format!(
        "# Written by tidal-procs (chaos/process).\ncluster_id = \"procs\"\nsecret_file = \"secret\"\ndurability = \"{durability}\"\n"
    );
    for (id, http, rpc) in addresses {
        let _ = write!(text, "\n[[node]]\nid = {id}\nhttp = \"{http}\"\nrpc = \"{rpc}\"\n");
    }
    let path = root.join("cluster.toml");
    std::fs::write(&path, text).context("write cluster file")?;
    Ok(path)
}
