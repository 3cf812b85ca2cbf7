//! An N-node cluster in-process over real tonic and HTTP on loopback, for the cluster tests.

use std::path::{Path, PathBuf};
use std::time::Duration;
use tidal_client::Client;
use tidal_cluster::{ClusterSpec, Durability, NodeSpec};
use tidal_server::config::{ClusterMembership, ServeArgs, ServeConfig};
use tidal_types::NodeId;

/// Deadline of every wait on observable state.
pub const DEADLINE: Duration = Duration::from_secs(60);
/// Polling step of those waits (not a synchronization: each wait re-checks state until DEADLINE).
pub const POLL: Duration = Duration::from_millis(50);

pub struct Member {
    pub client: Client,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

/// A per-node configuration change (see [`Cluster::node_tweaks`]).
pub type NodeTweak = std::sync::Arc<dyn Fn(&mut ServeConfig) + Send + Sync>;

pub struct Cluster {
    pub spec: ClusterSpec,
    pub dirs: Vec<PathBuf>,
    pub members: Vec<Option<Member>>,
    /// How many of the nodes (the first ones) found the cluster; the others start with `--join`
    /// and become members through `members add`.
    pub founders: usize,
    tweak: fn(&mut ServeConfig),
    /// Per node, applied after `tweak` at every start: a test's own seams (a fault-injecting WAL
    /// file system, a raft store injector, an apply probe) for that node.
    pub node_tweaks: Vec<Option<NodeTweak>>,
    /// Every node's HTTP and RPC port, held while the cluster lives (see `tidal_procs::PortLease`).
    _ports: tidal_procs::PortLease,
}

/// A cluster id and secret no other test cluster (in this or another process) shares.
fn unique_identity() -> (String, String) {
    static CLUSTERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = CLUSTERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let tag = format!("{}-{n}-{nanos}", std::process::id());
    (format!("test-{tag}"), format!("cluster-secret-{tag}"))
}

/// Runs a write until it is answered, retrying a retryable 503 `not_ready` (an election under way,
/// or a leader deposed before the write committed) as clients are told to; other errors fail.
pub async fn retrying<T, F, Fut>(mut write: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tidal_client::Error>>,
{
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        match write().await {
            Ok(reply) => return reply,
            Err(error) if error.code() == Some("not_ready") => {
                assert!(tokio::time::Instant::now() < deadline, "a write was never acknowledged: {error:?}");
                tokio::time::sleep(POLL).await;
            }
            Err(error) => panic!("write refused: {error:?}"),
        }
    }
}

/// One metric's value from a node's `/metrics` (None if absent); `name` includes any labels, e.g.
/// `tidal_replication_refusals_total{reason="gap"}`.
pub async fn metric(client: &Client, name: &str) -> Option<f64> {
    let text = reqwest::get(format!("{}/metrics", client.base())).await.ok()?.text().await.ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .and_then(|value| value.trim().parse().ok())
}

/// True when every digest (node id, digest) is the same.
pub fn same(digests: &[(u64, String)]) -> bool {
    digests.windows(2).all(|w| w[0].1 == w[1].1)
}

impl Cluster {
    /// A cluster of `size` nodes under `root`; `tweak` adjusts every node's configuration.
    pub fn new(root: &Path, size: u64, durability: Durability, tweak: fn(&mut ServeConfig)) -> Cluster {
        // Leased ports, held while the cluster lives: ports found by binding port 0 and released
        // were handed out again (two nodes got the same address, CI 2026-12-01), and a stopped
        // node's port could be taken before its restart.
        let ports = tidal_procs::PortLease::take(2 * size as usize).unwrap();
        let nodes: Vec<NodeSpec> = (1..=size)
            .map(|id| {
                let at = 2 * (id as usize - 1);
                NodeSpec {
                    id: NodeId(id),
                    http: ports.address(at).to_string(),
                    rpc: ports.address(at + 1).to_string(),
                }
            })
            .collect();
        // Each cluster its own id and secret: tests run side by side (nextest runs each in its own
        // process), and a port one cluster released (a spare never started, a node stopped) may be
        // taken by another test's node. With a shared secret that node answered this cluster's
        // RPCs: a never-started learner "caught up", and openraft on the other node tripped over a
        // foreign leader's entries (CI, 2026-12-01). Now such a node refuses them.
        let (cluster_id, secret) = unique_identity();
        let spec = ClusterSpec { cluster_id, secret, durability, nodes, dial: Default::default() };
        let dirs = (1..=size).map(|id| root.join(format!("n{id}"))).collect();
        Cluster {
            spec,
            dirs,
            members: (0..size).map(|_| None).collect(),
            founders: size as usize,
            tweak,
            node_tweaks: (0..size).map(|_| None).collect(),
            _ports: ports,
        }
    }

    /// A cluster of `founders` nodes plus `spares` more that start with `--join` (their cluster file
    /// lists every node; the founders' lists only the founders).
    pub fn with_spares(
        root: &Path,
        founders: u64,
        spares: u64,
        durability: Durability,
        tweak: fn(&mut ServeConfig),
    ) -> Cluster {
        let mut cluster = Cluster::new(root, founders + spares, durability, tweak);
        cluster.founders = founders as usize;
        cluster
    }

    pub async fn start(&mut self, index: usize) {
        let node = &self.spec.nodes[index];
        let args =
            ServeArgs { data_dir: Some(self.dirs[index].clone()), dimension: Some(4), ..Default::default() };
        let mut config = ServeConfig::resolve(&args).unwrap();
        config.wal_preallocate_bytes = super::TEST_PREALLOCATE_BYTES;
        config.http = node.http.parse().unwrap();
        let join = index >= self.founders;
        let mut spec = self.spec.clone();
        if !join {
            spec.nodes.truncate(self.founders);
        }
        config.cluster = Some(ClusterMembership {
            spec,
            me: node.id,
            timing: tidal_cluster::ControlTiming::default(),
            join,
        });
        (self.tweak)(&mut config);
        if let Some(tweak) = &self.node_tweaks[index] {
            tweak(&mut config);
        }
        let client = Client::new(format!("http://{}", node.http), None);
        let deadline = tokio::time::Instant::now() + DEADLINE;
        // A node stopped in this same process has released its data dir when its `run` returned
        // (the engine and the lock go with the last task that held them), so a restart starts at
        // once; an exit here, `Locked` included, fails the test.
        let http = tokio::net::TcpListener::bind(&node.http).await.unwrap();
        let rpc = tokio::net::TcpListener::bind(&node.rpc).await.unwrap();
        let (shutdown, on_shutdown) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(tidal_server::run(config, http, Some(rpc), async move {
            let _ = on_shutdown.await;
        }));
        while client.status().await.is_err() {
            if task.is_finished() {
                panic!("node {} exited during startup: {:?}", node.id, task.await);
            }
            assert!(tokio::time::Instant::now() < deadline, "node {} did not start", node.id);
            tokio::time::sleep(POLL).await;
        }
        self.members[index] = Some(Member { client, shutdown: Some(shutdown), task: Some(task) });
    }

    /// Starts every node, in order.
    pub async fn start_all(&mut self) {
        for index in 0..self.members.len() {
            self.start(index).await;
        }
    }

    /// Stops every running node.
    pub async fn stop_all(&mut self) {
        for index in 0..self.members.len() {
            if self.members[index].is_some() {
                self.stop(index).await;
            }
        }
    }

    pub async fn stop(&mut self, index: usize) {
        let mut member = self.members[index].take().unwrap();
        let _ = member.shutdown.take().unwrap().send(());
        member.task.take().unwrap().await.unwrap().unwrap();
    }

    /// Waits (up to [`DEADLINE`]) until node `index` exits by itself and returns what its `run`
    /// returned; the node is no longer a running member afterwards.
    pub async fn exited(&mut self, index: usize) -> anyhow::Result<()> {
        let mut member = self.members[index].take().unwrap();
        let task = member.task.take().unwrap();
        match tokio::time::timeout(DEADLINE, task).await {
            Ok(joined) => joined.unwrap(),
            Err(_) => panic!("node {} did not exit within {DEADLINE:?}", self.spec.nodes[index].id),
        }
    }

    pub fn client(&self, index: usize) -> &Client {
        &self.members[index].as_ref().unwrap().client
    }

    /// Waits until a running node serves as leader and every running node names it; returns its
    /// index.
    pub async fn leader(&self) -> usize {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let mut leader = None;
            let mut named = Vec::new();
            for (index, member) in self.members.iter().enumerate() {
                let Some(member) = member else { continue };
                if let Ok(status) = member.client.status().await {
                    if status.role == "leader" {
                        leader = Some(index);
                    }
                    named.push(status.leader_id);
                }
            }
            if let Some(index) = leader {
                let id = self.spec.nodes[index].id.0;
                if named.iter().all(|named| *named == Some(id)) {
                    return index;
                }
            }
            assert!(tokio::time::Instant::now() < deadline, "no leader within {DEADLINE:?}");
            tokio::time::sleep(POLL).await;
        }
    }

    /// Writes item `id` through the current leader until it is acknowledged, retrying a retryable
    /// 503 (an election under way, or a leader deposed before the write committed) with the same
    /// Idempotency-Key, as clients are told to; a retry of a write that did commit returns its
    /// first seqno.
    pub async fn put_acked(&self, id: u64, metadata: serde_json::Value) -> tidal_types::WriteReply {
        let key = format!("put-acked-{id}");
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let leader = self.leader().await;
            match self.client(leader).put_item(id, metadata.clone(), Some(&key)).await {
                Ok(reply) => return reply,
                Err(error) if error.code() == Some("not_ready") => {
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "item {id} never acknowledged: {error:?}"
                    );
                    tokio::time::sleep(POLL).await;
                }
                Err(error) => panic!("write of item {id} refused: {error:?}"),
            }
        }
    }

    /// The running nodes other than `leader`.
    pub fn followers_of(&self, leader: usize) -> Vec<usize> {
        (0..self.members.len()).filter(|i| *i != leader && self.members[*i].is_some()).collect()
    }

    /// Every running node's (id, digest) once it has applied `seqno` (the endpoint waits for it);
    /// asserts none applied past it.
    pub async fn digests_at(&self, seqno: u64) -> Vec<(u64, String)> {
        let mut digests = Vec::new();
        for member in self.members.iter().flatten() {
            let digest: tidal_types::DigestView = member
                .client
                .json::<(), _>(reqwest::Method::GET, &format!("/cluster/digest?min_seqno={seqno}"), None)
                .await
                .unwrap();
            assert_eq!(digest.applied_seqno, seqno, "node {} applied past the last write", digest.node_id);
            digests.push((digest.node_id, digest.digest));
        }
        digests
    }
}
