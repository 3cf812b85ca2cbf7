//! A 3-node cluster in-process over real tonic and HTTP on loopback: a follower stopped while the
//! others checkpoint and purge their WALs past the follower's position (and restart, so no
//! in-memory ship tail covers the gap) cannot catch up from the log (the leader answers `Purged`);
//! on restart it fetches and installs the leader's snapshot on its
//! own, pulls on from the snapshot's seqno, and reaches the same digest as the others.

#![allow(clippy::unwrap_used)] // tests may unwrap; helpers outside #[test] are not covered by allow-unwrap-in-tests

use std::path::{Path, PathBuf};
use std::time::Duration;
use tidal_client::Client;
use tidal_cluster::{ClusterSpec, Durability, NodeSpec};
use tidal_server::config::{ClusterMembership, ServeArgs, ServeConfig};
use tidal_types::{NodeId, SignalIn};

/// Deadline of every wait on observable state.
const DEADLINE: Duration = Duration::from_secs(60);
/// Polling step of those waits (not a synchronization: each wait re-checks state until DEADLINE).
const POLL: Duration = Duration::from_millis(50);

struct Member {
    client: Client,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

struct Cluster {
    spec: ClusterSpec,
    dirs: Vec<PathBuf>,
    members: Vec<Option<Member>>,
}

fn reserve() -> (std::net::TcpListener, String) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    (listener, address)
}

impl Cluster {
    fn new(root: &Path, size: u64) -> Cluster {
        let mut nodes = Vec::new();
        for id in 1..=size {
            let (_http, http) = reserve();
            let (_rpc, rpc) = reserve();
            nodes.push(NodeSpec { id: NodeId(id), http, rpc });
        }
        let spec = ClusterSpec {
            cluster_id: "t55".into(),
            secret: "cluster-secret-0123456789".into(),
            durability: Durability::Quorum,
            nodes,
        };
        let dirs = (1..=size).map(|id| root.join(format!("n{id}"))).collect();
        Cluster { spec, dirs, members: (0..size).map(|_| None).collect() }
    }

    async fn start(&mut self, index: usize) {
        let node = &self.spec.nodes[index];
        let args =
            ServeArgs { data_dir: Some(self.dirs[index].clone()), dimension: Some(4), ..Default::default() };
        let mut config = ServeConfig::resolve(&args).unwrap();
        config.http = node.http.parse().unwrap();
        // Tiny segments, a tiny retention budget and frequent checkpoints: the WAL is purged soon
        // after every few writes.
        config.segment_bytes_max = 4096;
        config.wal_retention_bytes = 8192;
        config.checkpoint_interval_ms = 100;
        config.cluster = Some(ClusterMembership {
            spec: self.spec.clone(),
            me: node.id,
            timing: tidal_cluster::ControlTiming::default(),
        });
        let http = tokio::net::TcpListener::bind(&node.http).await.unwrap();
        let rpc = tokio::net::TcpListener::bind(&node.rpc).await.unwrap();
        let (shutdown, on_shutdown) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(tidal_server::run(config, http, Some(rpc), async move {
            let _ = on_shutdown.await;
        }));
        let client = Client::new(format!("http://{}", node.http), None);
        let deadline = tokio::time::Instant::now() + DEADLINE;
        while client.status().await.is_err() {
            assert!(!task.is_finished(), "node {} exited during startup", node.id);
            assert!(tokio::time::Instant::now() < deadline, "node {} did not start", node.id);
            tokio::time::sleep(POLL).await;
        }
        self.members[index] = Some(Member { client, shutdown: Some(shutdown), task: Some(task) });
    }

    async fn stop(&mut self, index: usize) {
        let mut member = self.members[index].take().unwrap();
        let _ = member.shutdown.take().unwrap().send(());
        member.task.take().unwrap().await.unwrap().unwrap();
    }

    fn client(&self, index: usize) -> &Client {
        &self.members[index].as_ref().unwrap().client
    }

    /// Waits until a running node serves as leader and every running node names it.
    async fn leader(&self) -> usize {
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

    /// Every running node's digest once it has applied `seqno` (the endpoint waits for it).
    async fn digests_at(&self, seqno: u64) -> Vec<(u64, String)> {
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

/// One metric's value from a node's `/metrics` (None if absent).
async fn metric(client: &Client, name: &str) -> Option<f64> {
    let text = reqwest::get(format!("{}/metrics", client.base())).await.ok()?.text().await.ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .and_then(|value| value.trim().parse().ok())
}

fn signals(n: u64, round: u64) -> Vec<SignalIn> {
    (0..n)
        .map(|i| SignalIn {
            user: format!("u{}", (i + round) % 11),
            item: (i * 7 + round) % 13,
            kind: "click".into(),
            weight: None,
            ts: None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_behind_the_leaders_purge_point_installs_a_snapshot_and_converges() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .with_test_writer()
        .try_init();
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(root.path(), 3);
    for i in 0..3 {
        cluster.start(i).await;
    }
    let l = cluster.leader().await;
    let f = (l + 1) % 3;
    let other = (l + 2) % 3;
    let leader = cluster.client(l).clone();
    let stopped_at = {
        tracing::info!("phase 1: a few writes reach every node, then the follower stops");
        let mut last = 0;
        for round in 0..5 {
            last = leader.post_signals(signals(20, round), None).await.unwrap().seqno;
        }
        let digests = cluster.digests_at(last).await;
        assert!(digests.windows(2).all(|w| w[0].1 == w[1].1), "replicas differ: {digests:?}");
        cluster.stop(f).await;
        last
    };
    let last = {
        tracing::info!(
            "phase 2: the leader writes on until its checkpointer purged the WAL past the follower"
        );
        let deadline = tokio::time::Instant::now() + DEADLINE;
        let mut round = 5;
        let mut last;
        loop {
            last = leader.post_signals(signals(40, round), None).await.unwrap().seqno;
            round += 1;
            let mut purged = f64::MAX;
            for running in [l, other] {
                let node = metric(cluster.client(running), "tidal_wal_purged_seqno").await.unwrap_or(0.0);
                purged = purged.min(node);
            }
            if purged > (stopped_at + 1) as f64 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the leader did not purge past {stopped_at} (purged through {purged})"
            );
        }
        // A few more writes after the purge, so the follower must also pull after its install.
        for _ in 0..3 {
            last = leader.post_signals(signals(40, round), None).await.unwrap().seqno;
            round += 1;
        }
        last
    };
    let leader = {
        tracing::info!(
            "phase 3: the two running nodes restart, so no in-memory ship tail still covers the gap"
        );
        for running in [l, other] {
            cluster.stop(running).await;
        }
        for running in [l, other] {
            cluster.start(running).await;
        }
        let l = cluster.leader().await;
        cluster.client(l).clone()
    };
    {
        tracing::info!("phase 4: the follower restarts, installs the leader's snapshot and converges");
        assert_eq!(metric(&leader, "tidal_snapshot_installs_total").await, Some(0.0));
        cluster.start(f).await;
        let follower = cluster.client(f).clone();
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let installs = metric(&follower, "tidal_snapshot_installs_total").await.unwrap_or(0.0);
            if installs >= 1.0 {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "the follower installed no snapshot");
            tokio::time::sleep(POLL).await;
        }
        let digests = cluster.digests_at(last).await;
        assert_eq!(digests.len(), 3);
        assert!(
            digests.windows(2).all(|w| w[0].1 == w[1].1),
            "replicas differ after the install: {digests:?}"
        );
        let quarantine = cluster.dirs[f].join("wal").join("quarantine");
        assert!(
            std::fs::read_dir(&quarantine).map(|entries| entries.count()).unwrap_or(0) > 0,
            "the follower's old WAL was not moved to {}",
            quarantine.display()
        );
        assert_eq!(metric(&follower, "tidal_snapshot_install_failures_total").await, Some(0.0));
    }
    {
        tracing::info!("phase 5: writes after the install reach the follower through the log");
        let reply = leader.post_signals(signals(10, 999), None).await.unwrap();
        let digests = cluster.digests_at(reply.seqno).await;
        assert!(digests.windows(2).all(|w| w[0].1 == w[1].1), "replicas differ: {digests:?}");
    }
    for i in 0..3 {
        cluster.stop(i).await;
    }
}
