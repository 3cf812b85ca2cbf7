//! A 3-node cluster in-process over real tonic and HTTP on loopback, leadership decided by openraft:
//! writes on the leader and through a follower converge on every node (same digest, same feed); a
//! follower stopped through writes catches up by its pull; in quorum mode a leader without a
//! majority acknowledges nothing; when the leader stops, another takes office without losing an
//! acknowledged write, and the old leader rejoins as a follower and converges.

#![allow(clippy::unwrap_used)] // tests may unwrap; helpers outside #[test] are not covered by allow-unwrap-in-tests

use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tidal_client::Client;
use tidal_cluster::{ClusterSpec, Durability, NodeSpec};
use tidal_server::config::{ClusterMembership, ServeArgs, ServeConfig};
use tidal_types::{NodeId, SignalIn};

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
    fn new(root: &Path, size: u64, durability: Durability) -> Cluster {
        let mut nodes = Vec::new();
        for id in 1..=size {
            let (_http, http) = reserve();
            let (_rpc, rpc) = reserve();
            nodes.push(NodeSpec { id: NodeId(id), http, rpc });
        }
        let spec = ClusterSpec {
            cluster_id: "t50".into(),
            secret: "cluster-secret-0123456789".into(),
            durability,
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
        for _ in 0..400 {
            assert!(!task.is_finished(), "node {} exited during startup", node.id);
            if client.status().await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
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

    /// Waits until a running node serves as leader and every running node names it; returns its
    /// index.
    async fn leader(&self) -> usize {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
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
            assert!(tokio::time::Instant::now() < deadline, "no leader within 30 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn followers_of(&self, leader: usize) -> Vec<usize> {
        (0..self.members.len()).filter(|i| *i != leader && self.members[*i].is_some()).collect()
    }

    /// Waits until every running node has applied `seqno` (bounded by the node's read wait), then
    /// returns their digests.
    async fn digests_at(&self, seqno: u64) -> Vec<String> {
        let mut digests = Vec::new();
        for member in self.members.iter().flatten() {
            let digest: tidal_types::DigestView = member
                .client
                .json::<(), _>(reqwest::Method::GET, &format!("/cluster/digest?min_seqno={seqno}"), None)
                .await
                .unwrap();
            assert_eq!(digest.applied_seqno, seqno, "node {} applied past the last write", digest.node_id);
            digests.push(digest.digest);
        }
        digests
    }
}

fn signals(n: u64) -> Vec<SignalIn> {
    (0..n)
        .map(|i| SignalIn {
            user: format!("u{}", i % 7),
            item: i % 5,
            kind: "click".into(),
            weight: None,
            ts: None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_on_leader_and_follower_converge_and_a_restarted_follower_catches_up() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .with_test_writer()
        .try_init();
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(root.path(), 3, Durability::Quorum);
    for i in 0..3 {
        cluster.start(i).await;
    }
    let l = cluster.leader().await;
    let followers = cluster.followers_of(l);
    let (f1, f2) = (followers[0], followers[1]);
    {
        tracing::info!("phase 1: writes on the leader and through a follower");
        let leader = cluster.client(l).clone();
        for id in 0..5u64 {
            leader.put_item(id, json!({"n": id}), None).await.unwrap();
            leader.put_embedding(id, vec![1.0, id as f64, 0.5, -1.0]).await.unwrap();
        }
        leader.post_signals(signals(100), None).await.unwrap();
        let via_follower =
            cluster.client(f2).put_item(42, json!({"via": "follower"}), Some("k-42")).await.unwrap();
        let retried =
            cluster.client(f1).put_item(42, json!({"via": "follower"}), Some("k-42")).await.unwrap();
        assert_eq!(via_follower, retried, "the idempotency key holds across nodes");
        let digests = cluster.digests_at(via_follower.seqno).await;
        assert!(digests.windows(2).all(|w| w[0] == w[1]), "replicas differ: {digests:?}");
        let feeds: Vec<_> = futures_feeds(&cluster, "u3").await;
        assert!(feeds.windows(2).all(|w| w[0] == w[1]), "feeds differ: {feeds:?}");
        let item = cluster.client(f1).get_item(42).await.unwrap();
        assert_eq!(item.metadata, json!({"via": "follower"}));
        let metrics = reqwest::get(format!("{}/metrics", cluster.client(l).base()))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        for line in [
            format!("tidal_commit_seqno {}", via_follower.seqno),
            "tidal_is_leader 1".to_string(),
            format!(
                "tidal_follower_matched_seqno{{node=\"{}\"}} {}",
                cluster.spec.nodes[f1].id.0, via_follower.seqno
            ),
        ] {
            assert!(metrics.contains(&line), "metrics lack {line:?}:\n{metrics}");
        }
    }
    {
        tracing::info!("phase 2: a follower stopped through writes catches up by its boot-time pull");
        cluster.stop(f2).await;
        let leader = cluster.client(l).clone();
        let mut last = 0;
        for round in 0..20u64 {
            last = leader.post_signals(signals(50 + round), None).await.unwrap().seqno;
        }
        cluster.start(f2).await;
        let digests = cluster.digests_at(last).await;
        assert!(digests.windows(2).all(|w| w[0] == w[1]), "replicas differ after catch-up: {digests:?}");
    }
    {
        tracing::info!("phase 3: without a majority the leader acknowledges nothing; with one it does");
        cluster.stop(f1).await;
        cluster.stop(f2).await;
        let leader = cluster.client(l).clone();
        let pending = tokio::spawn(async move { leader.put_item(7, json!({"late": true}), None).await });
        // The write cannot be acknowledged while no follower runs: it is still pending when a
        // follower comes back, and acknowledged after.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!pending.is_finished(), "a write was acknowledged without a majority");
        cluster.start(f1).await;
        let reply = tokio::time::timeout(Duration::from_secs(20), pending).await.unwrap().unwrap().unwrap();
        let item = cluster
            .client(f1)
            .json::<(), tidal_types::ItemView>(
                reqwest::Method::GET,
                &format!("/v1/items/7?min_seqno={}", reply.seqno),
                None,
            )
            .await
            .unwrap();
        assert_eq!(item.seqno, reply.seqno);
    }
    for i in [l, f1] {
        cluster.stop(i).await;
    }
}

/// The leader stops under writes: the others elect a new leader, which takes office (probe, adopt,
/// LeaderStart) and accepts writes; every acknowledged write is still there; the old leader
/// restarts as a follower and converges to the same digest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_keeps_acknowledged_writes_and_the_old_leader_rejoins() {
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(root.path(), 3, Durability::Quorum);
    for i in 0..3 {
        cluster.start(i).await;
    }
    let old = cluster.leader().await;
    let mut acknowledged = Vec::new();
    for id in 0..20u64 {
        acknowledged
            .push((id, cluster.client(old).put_item(id, json!({"term": "first"}), None).await.unwrap()));
    }
    cluster.stop(old).await;
    let new = cluster.leader().await;
    assert_ne!(new, old);
    let status = cluster.client(new).status().await.unwrap();
    assert!(status.term >= 2, "a new leader runs in a new term: {status:?}");
    for id in 20..30u64 {
        acknowledged
            .push((id, cluster.client(new).put_item(id, json!({"term": "second"}), None).await.unwrap()));
    }
    let last = acknowledged.last().unwrap().1.seqno;
    for (id, reply) in &acknowledged {
        let item = cluster.client(new).get_item(*id).await.unwrap();
        assert_eq!(item.seqno, reply.seqno, "acknowledged write of item {id} lost or moved");
    }
    cluster.start(old).await;
    let digests = cluster.digests_at(last).await;
    assert_eq!(digests.len(), 3);
    assert!(digests.windows(2).all(|w| w[0] == w[1]), "replicas differ after failover: {digests:?}");
    for i in 0..3 {
        cluster.stop(i).await;
    }
}

async fn futures_feeds(cluster: &Cluster, user: &str) -> Vec<Vec<(u64, String)>> {
    let mut feeds = Vec::new();
    for member in cluster.members.iter().flatten() {
        let feed = member.client.feed(user, 10).await.unwrap();
        feeds.push(feed.items.iter().map(|i| (i.item, format!("{:.9}", i.score))).collect());
    }
    feeds
}

/// The counterpart of phase 3 above: in `leader` durability the same write, with both followers
/// down, is acknowledged after the leader's own fsync — so the quorum test is not passing by
/// accident — and the followers converge once they are back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_durability_acknowledges_without_followers_and_they_converge_later() {
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(root.path(), 3, Durability::Leader);
    for i in 0..3 {
        cluster.start(i).await;
    }
    let l = cluster.leader().await;
    let followers = cluster.followers_of(l);
    for f in &followers {
        cluster.stop(*f).await;
    }
    let leader = cluster.client(l).clone();
    let reply =
        tokio::time::timeout(Duration::from_secs(20), leader.put_item(9, json!({"alone": true}), None))
            .await
            .expect("leader durability must not wait for followers")
            .unwrap();
    for f in &followers {
        cluster.start(*f).await;
    }
    let digests = cluster.digests_at(reply.seqno).await;
    assert!(digests.windows(2).all(|w| w[0] == w[1]), "replicas differ: {digests:?}");
    for i in 0..3 {
        cluster.stop(i).await;
    }
}
