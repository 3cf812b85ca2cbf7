//! [`NetCluster`]: one `tidal serve` per namespace, bound to the namespace's address, started as
//! `ip netns exec NS tidal serve --cluster FILE --node-id N --data-dir DIR --insecure`.
//!
//! `ip netns exec` execs the command in place, so the pid the harness holds is the node's own:
//! SIGKILL, SIGSTOP and SIGCONT go to it by that pid and to nothing else.
//!
//! `--insecure`: a node refuses a non-loopback address unless it has tokens and TLS, or is told
//! the network is private. Here it is: the subnet exists only inside this machine, between
//! namespaces this run made, and the only client is the harness. The peers still authenticate
//! each other with the cluster secret. TLS would add certificates to every run and test nothing
//! about the network (chaos/process's t46 covers TLS between real processes).

use crate::topology::Topology;
use anyhow::Context;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;
use tidal_client::Client;
use tidal_procs::{log_tail, write_private, NodeProcess};
use tidal_types::{ClusterStatus, DigestView};

const HTTP_PORT: u16 = 7070;
const RPC_PORT: u16 = 7071;
/// How long a harness probe (status, digest, a read) may take before it counts as "no answer".
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// Log lines quoted when something fails.
pub const LOG_TAIL_LINES: usize = 30;

/// The running cluster. Dropping it SIGKILLs every node process.
pub struct NetCluster {
    binary: PathBuf,
    cluster_file: PathBuf,
    members: Vec<Member>,
    probe: reqwest::Client,
}

struct Member {
    id: u64,
    namespace: String,
    data_dir: PathBuf,
    log: PathBuf,
    client: Client,
    process: Mutex<Option<NodeProcess>>,
}

/// The converged cluster: every node applied `seqno` and has `digest`.
#[derive(Clone, Debug)]
pub struct Converged {
    pub leader: u64,
    pub seqno: u64,
    pub digest: String,
}

impl NetCluster {
    /// Writes the cluster file (each node at its namespace address) and secret under `root`, and
    /// starts every node; does not wait for them.
    pub fn start(binary: &Path, root: &Path, topology: &Topology, nodes: u64) -> anyhow::Result<NetCluster> {
        write_private(&root.join("secret"), format!("netchaos-{}\n", secret_salt()).as_bytes())
            .context("write cluster secret")?;
        let mut text = "# Written by tidal-netchaos (chaos/net).\ncluster_id = \"netchaos\"\n\
                        secret_file = \"secret\"\ndurability = \"quorum\"\n"
            .to_string();
        for id in 1..=nodes {
            let address = topology.address(id);
            text.push_str(&format!(
                "\n[[node]]\nid = {id}\nhttp = \"{address}:{HTTP_PORT}\"\nrpc = \"{address}:{RPC_PORT}\"\n"
            ));
        }
        let cluster_file = root.join("cluster.toml");
        std::fs::write(&cluster_file, text).context("write cluster file")?;
        let members = (1..=nodes)
            .map(|id| Member {
                id,
                namespace: topology.namespace(id),
                data_dir: root.join(format!("n{id}")),
                log: root.join(format!("n{id}.log")),
                client: Client::with_timeout(
                    format!("http://{}", SocketAddr::from((topology.address(id), HTTP_PORT))),
                    None,
                    PROBE_TIMEOUT,
                ),
                process: Mutex::new(None),
            })
            .collect();
        let probe = reqwest::Client::builder().timeout(PROBE_TIMEOUT).build()?;
        let cluster = NetCluster { binary: binary.to_path_buf(), cluster_file, members, probe };
        for id in cluster.ids() {
            cluster.restart(id)?;
        }
        Ok(cluster)
    }

    pub fn ids(&self) -> Vec<u64> {
        self.members.iter().map(|member| member.id).collect()
    }

    /// A client for node `id` with the probe timeout.
    pub fn client(&self, id: u64) -> anyhow::Result<&Client> {
        Ok(&self.member(id)?.client)
    }

    /// Starts node `id` (again) on its data dir, in its namespace.
    pub fn restart(&self, id: u64) -> anyhow::Result<()> {
        let member = self.member(id)?;
        let mut slot = lock(&member.process);
        anyhow::ensure!(slot.is_none(), "node {id} is already running");
        let args: Vec<OsString> = vec![
            "netns".into(),
            "exec".into(),
            member.namespace.clone().into(),
            self.binary.clone().into(),
            "serve".into(),
            "--cluster".into(),
            self.cluster_file.clone().into(),
            "--node-id".into(),
            id.to_string().into(),
            "--data-dir".into(),
            member.data_dir.clone().into(),
            "--insecure".into(),
        ];
        *slot = Some(NodeProcess::spawn(Path::new("ip"), &args, &member.log)?);
        Ok(())
    }

    /// SIGKILLs node `id` and reaps it.
    pub fn kill(&self, id: u64) -> anyhow::Result<()> {
        let process = lock(&self.member(id)?.process).take();
        process.with_context(|| format!("node {id} is not running"))?.kill()?;
        Ok(())
    }

    /// Sends `signal` (`STOP`, `CONT`) to node `id`'s process.
    pub fn signal(&self, id: u64, signal: &str) -> anyhow::Result<()> {
        let pid = lock(&self.member(id)?.process)
            .as_ref()
            .map(NodeProcess::pid)
            .with_context(|| format!("node {id} is not running"))?;
        let status = Command::new("kill").args([format!("-{signal}"), pid.to_string()]).status()?;
        anyhow::ensure!(status.success(), "kill -{signal} {pid}: {status}");
        Ok(())
    }

    /// Fails if a node the harness started has exited on its own (a crash is a finding).
    pub fn check_alive(&self) -> anyhow::Result<()> {
        for member in &self.members {
            let mut slot = lock(&member.process);
            if let Some(process) = slot.as_mut() {
                if let Some(status) = process.exited()? {
                    *slot = None;
                    drop(slot);
                    anyhow::bail!("node {} exited on its own ({status}):\n{}", member.id, self.log_tails());
                }
            }
        }
        Ok(())
    }

    pub async fn status(&self, id: u64) -> anyhow::Result<ClusterStatus> {
        self.client(id)?.status().await.with_context(|| format!("status of node {id}"))
    }

    /// The one serving leader every node names, or what is not so yet.
    pub async fn check_leader(&self) -> Result<u64, String> {
        let mut leaders = Vec::new();
        let mut named = BTreeMap::new();
        for id in self.ids() {
            let status = self.status(id).await.map_err(|e| format!("{e:#}"))?;
            if status.role == "leader" {
                leaders.push(id);
            }
            named.insert(id, status.leader_id);
        }
        let [leader] = leaders[..] else {
            return Err(format!("leaders by role {leaders:?}; named {named:?}"));
        };
        if named.values().any(|named| *named != Some(leader)) {
            return Err(format!("not every node names {leader}: {named:?}"));
        }
        let url = format!("{}/readyz", self.client(leader).map_err(|e| format!("{e:#}"))?.base());
        let ready = self.probe.get(url).send().await;
        if !ready.is_ok_and(|reply| reply.status().is_success()) {
            return Err(format!("leader {leader} is not serving yet"));
        }
        Ok(leader)
    }

    /// Whether every node names one serving leader and has applied `seqno`.
    pub async fn check_caught_up(&self, seqno: u64) -> Result<u64, String> {
        let leader = self.check_leader().await?;
        for id in self.ids() {
            let applied = self.status(id).await.map_err(|e| format!("{e:#}"))?.applied_seqno;
            if applied < seqno {
                return Err(format!("node {id} applied {applied} < {seqno}"));
            }
        }
        Ok(leader)
    }

    /// Convergence with writes stopped: one serving leader named by all, every node's durable,
    /// commit and applied frontiers equal to the leader's commit, one digest (and hard-negatives
    /// digest) at that seqno everywhere. The same conditions as chaos/process's
    /// `ProcessCluster::check_converged`.
    pub async fn check_converged(&self) -> Result<Converged, String> {
        let leader = self.check_leader().await?;
        let commit = self.status(leader).await.map_err(|e| format!("{e:#}"))?.commit_seqno;
        let mut first: Option<DigestView> = None;
        for id in self.ids() {
            let status = self.status(id).await.map_err(|e| format!("{e:#}"))?;
            let frontiers = (status.durable_seqno, status.commit_seqno, status.applied_seqno);
            if frontiers != (commit, commit, commit) {
                return Err(format!(
                    "node {id}: durable/commit/applied {frontiers:?}, leader {leader} commit {commit}"
                ));
            }
            let digest = self.digest(id, commit).await.map_err(|e| format!("{e:#}"))?;
            if digest.applied_seqno != commit {
                return Err(format!("node {id}: digest at {} (expected {commit})", digest.applied_seqno));
            }
            if let Some(first) = &first {
                if (&first.digest, &first.negatives_digest) != (&digest.digest, &digest.negatives_digest) {
                    return Err(format!("DIGESTS DIFFER at {commit}: {first:?} vs {digest:?}"));
                }
            }
            first.get_or_insert(digest);
        }
        let digest = first.map(|digest| digest.digest).ok_or("no nodes")?;
        Ok(Converged { leader, seqno: commit, digest })
    }

    async fn digest(&self, id: u64, min_seqno: u64) -> anyhow::Result<DigestView> {
        let path = format!("/cluster/digest?min_seqno={min_seqno}");
        Ok(self.client(id)?.json::<(), DigestView>(reqwest::Method::GET, &path, None).await?)
    }

    /// One line per node: role, term, leader, durable/commit/applied frontiers (or why not).
    pub async fn status_lines(&self) -> String {
        let mut out = String::new();
        for id in self.ids() {
            let line = match self.status(id).await {
                Ok(s) => format!(
                    "n{id}: {} term {} leader {:?} durable/commit/applied {}/{}/{}",
                    s.role, s.term, s.leader_id, s.durable_seqno, s.commit_seqno, s.applied_seqno
                ),
                Err(e) => format!("n{id}: no status: {e:#}"),
            };
            out.push_str(&line);
            out.push('\n');
        }
        out
    }

    /// Every thread's stack of each running node whose applied frontier is behind its commit
    /// frontier, written by gdb beside its log (`n<id>.stacks.txt`): a frontier that stands still
    /// says where it stands only while the process is still there. The paths written, one a line
    /// (nothing when no node lags, gdb is missing or it failed).
    pub async fn dump_lagging_stacks(&self) -> String {
        let mut out = String::new();
        for member in &self.members {
            let Ok(status) = self.status(member.id).await else { continue };
            if status.applied_seqno >= status.commit_seqno {
                continue;
            }
            let Some(pid) = lock(&member.process).as_ref().map(NodeProcess::pid) else { continue };
            let path = member.log.with_file_name(format!("n{}.stacks.txt", member.id));
            let dumped = std::process::Command::new("gdb")
                .args(["-p", &pid.to_string(), "-batch", "-ex", "thread apply all bt"])
                .output();
            if let Ok(output) = dumped {
                if std::fs::write(&path, &output.stdout).is_ok() {
                    out.push_str(&format!(
                        "stacks of n{} (applied {} < commit {}): {}\n",
                        member.id,
                        status.applied_seqno,
                        status.commit_seqno,
                        path.display()
                    ));
                }
            }
        }
        out
    }

    /// The last lines of every node's log.
    pub fn log_tails(&self) -> String {
        self.members
            .iter()
            .map(|member| {
                format!(
                    "--- n{}.log (last {LOG_TAIL_LINES} lines) ---\n{}\n",
                    member.id,
                    log_tail(&member.log, LOG_TAIL_LINES)
                )
            })
            .collect()
    }

    fn member(&self, id: u64) -> anyhow::Result<&Member> {
        self.members.iter().find(|member| member.id == id).with_context(|| format!("no node {id}"))
    }
}

fn lock(process: &Mutex<Option<NodeProcess>>) -> std::sync::MutexGuard<'_, Option<NodeProcess>> {
    // A panic while holding this lock leaves the slot as it was; keep using it.
    process.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Enough to tell two runs' secrets apart (not a production secret: `tidal cluster up` reads
/// /dev/urandom for that; this cluster lives on a private subnet for minutes).
fn secret_salt() -> String {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{}-{nanos}", std::process::id())
}
