//! Tier 3: the real `tidal` binary as three OS processes on loopback (chaos/process), quorum
//! durability, every RPC link through a relay the harness can cut. Each test fails when its
//! guarantee breaks:
//!
//! - items, embeddings and signals written on the leader and through followers converge (same digest
//!   at the same applied seqno, feeds equal within 1e-6); a SIGKILLed follower restarted after
//!   writes converges from the log alone (no heal verb, no snapshot install); `tidal status`,
//!   `tidal heal` and `tidal catchup` work against the running cluster;
//! - the leader SIGKILLed under write load: another takes over, no acknowledged write is lost, the
//!   old leader rejoins as a follower; then two nodes SIGKILLed at once and restarted: nothing
//!   acknowledged is lost;
//! - the leader cut off from both followers while it keeps running under load: it acknowledges
//!   nothing sent after the others elected a new leader, and after the links are restored every
//!   acknowledged write is on every node.

#![allow(clippy::unwrap_used)] // tests may unwrap; helpers outside #[test] are not covered by allow-unwrap-in-tests

use serde_json::json;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tidal_client::Client;
use tidal_procs::{ProcessCluster, DEADLINE, POLL};
use tidal_types::SignalIn;

/// The binary's default embedding dimension.
const DIMENSION: usize = 128;
/// A load write gives up after this long (outcome unknown). Short, so a writer whose write hangs
/// on a cut-off leader moves on instead of holding the test for the client's default 30 s.
const WRITE_TIMEOUT: Duration = Duration::from_secs(3);
/// Pacing after a failed load write (a refused connection fails in microseconds).
const FAILURE_BACKOFF: Duration = Duration::from_millis(20);
/// Bounds on each load writer: writes and time.
const WRITES_PER_WRITER_MAX: u64 = 5_000;
const LOAD_DURATION_MAX: Duration = Duration::from_secs(120);
/// The item written to a cut-off leader (outside the load's ids).
const PROBE_ITEM: u64 = 900_000_000;
/// Size of the large item bodies that show replication going through the relays.
const BLOB_BYTES: usize = 900_000;
/// Acknowledged load writes each phase waits for before and after a fault.
const ACKS_PER_PHASE: usize = 150;

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()))
        .with_test_writer()
        .try_init();
}

async fn start_cluster(root: &Path) -> ProcessCluster {
    ProcessCluster::start(Path::new(env!("CARGO_BIN_EXE_tidal")), root, 3, "quorum").await.unwrap()
}

fn embedding(id: u64) -> Vec<f64> {
    (0..DIMENSION as u64).map(|k| ((id * 31 + k * 7) % 23) as f64 / 23.0 - 0.4).collect()
}

fn signals(count: u64, salt: u64) -> Vec<SignalIn> {
    (0..count)
        .map(|i| SignalIn {
            user: format!("u{}", (i + salt) % 5),
            item: (i * 7 + salt) % 40 + 1,
            kind: ["view", "click", "like", "skip"][(i % 4) as usize].into(),
            weight: None,
            ts: None,
        })
        .collect()
}

/// Retries `write` (which must be idempotent: keyed or an upsert) until it is acknowledged; a
/// spurious election on a loaded machine answers 503 for a moment. Returns the acknowledged seqno.
async fn until_acked<F, Fut>(what: &str, write: F) -> u64
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<tidal_types::WriteReply, tidal_client::Error>>,
{
    let deadline = Instant::now() + DEADLINE;
    loop {
        match write().await {
            Ok(reply) => return reply.seqno,
            Err(error) if Instant::now() > deadline => {
                panic!("{what}: not acknowledged by the deadline: {error}")
            }
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}

/// One acknowledged load write.
#[derive(Clone, Debug)]
struct Ack {
    item: u64,
    seqno: u64,
    /// The node the write was sent to.
    via: u64,
    /// When the request was sent.
    sent: Instant,
}

/// Concurrent item writes, a fixed set of writers per node, each bounded in count and time.
/// Failed writes (refused, 503, timed out) are unknown outcomes: not recorded, never retried.
struct Load {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<Ack>>>,
    writers: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(cluster: &ProcessCluster, writers_per_node: usize, first_item: u64) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let next_item = Arc::new(AtomicU64::new(first_item));
        let mut writers = Vec::new();
        for via in cluster.ids() {
            for _ in 0..writers_per_node {
                let client = Client::with_timeout(cluster.url(via), None, WRITE_TIMEOUT);
                let (stop, acked, next_item) = (stop.clone(), acked.clone(), next_item.clone());
                writers.push(tokio::spawn(async move {
                    let started = Instant::now();
                    for _ in 0..WRITES_PER_WRITER_MAX {
                        if stop.load(Ordering::SeqCst) || started.elapsed() > LOAD_DURATION_MAX {
                            return;
                        }
                        let item = next_item.fetch_add(1, Ordering::SeqCst);
                        let sent = Instant::now();
                        let key = format!("load-{item}");
                        match client.put_item(item, json!({"load": item}), Some(&key)).await {
                            Ok(reply) => {
                                acked.lock().unwrap().push(Ack { item, seqno: reply.seqno, via, sent })
                            }
                            Err(_) => tokio::time::sleep(FAILURE_BACKOFF).await,
                        }
                    }
                }));
            }
        }
        Load { stop, acked, writers }
    }

    /// Waits until `enough` holds for the acknowledged writes so far.
    async fn wait_until(&self, what: &str, enough: impl Fn(&[Ack]) -> bool) {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if enough(&self.acked.lock().unwrap()) {
                return;
            }
            let count = self.acked.lock().unwrap().len();
            assert!(Instant::now() < deadline, "load: {what} not reached by the deadline ({count} acks)");
            tokio::time::sleep(POLL).await;
        }
    }

    async fn finish(self) -> Vec<Ack> {
        self.stop.store(true, Ordering::SeqCst);
        for writer in self.writers {
            writer.await.unwrap();
        }
        let acked = self.acked.lock().unwrap().clone();
        acked
    }
}

/// Every acknowledged load write is readable on every node, at the seqno it was acknowledged with.
async fn assert_acked_everywhere(cluster: &ProcessCluster, acked: &[Ack]) {
    for node in cluster.ids() {
        let client = cluster.client(node);
        for ack in acked {
            let item = client.get_item(ack.item).await.unwrap_or_else(|error| {
                panic!(
                    "acknowledged write lost: item {} (seqno {}, sent to node {}) on node {node}: {error}",
                    ack.item, ack.seqno, ack.via
                )
            });
            assert_eq!(
                item.seqno, ack.seqno,
                "item {} on node {node} is not the acknowledged write {ack:?}",
                ack.item
            );
            assert_eq!(item.metadata, json!({"load": ack.item}));
        }
    }
}

/// Feeds of `user` on every node: same items, scores within 1e-6, and not empty (an empty feed
/// would make the comparison vacuous).
async fn assert_feed_parity(cluster: &ProcessCluster, user: &str) {
    let mut feeds = Vec::new();
    for node in cluster.ids() {
        feeds.push((node, cluster.client(node).feed(user, 20).await.unwrap()));
    }
    let (first_node, first) = &feeds[0];
    assert!(!first.items.is_empty(), "feed of {user} on node {first_node} is empty");
    for (node, feed) in &feeds[1..] {
        assert_eq!(feed.items.len(), first.items.len(), "feed of {user}: node {node} vs {first_node}");
        for (a, b) in feed.items.iter().zip(&first.items) {
            assert_eq!(a.item, b.item, "feed of {user} ranks differently on node {node} and {first_node}");
            assert!(
                (a.score - b.score).abs() <= 1e-6,
                "feed of {user}: score {} on node {node}, {} on node {first_node}",
                a.score,
                b.score
            );
        }
    }
}

/// Runs the `tidal` CLI; returns (success, stdout, stderr).
async fn cli(args: Vec<String>) -> (bool, String, String) {
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_tidal")).args(&args).env("RUST_LOG", "warn").output()
    })
    .await
    .unwrap()
    .unwrap();
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status.success(), text(&output.stdout), text(&output.stderr))
}

fn count_in_log(cluster: &ProcessCluster, node: u64, needle: &str) -> usize {
    std::fs::read_to_string(cluster.log(node)).unwrap_or_default().matches(needle).count()
}

/// Waits until `node`'s log holds more than `before` lines with `needle`.
async fn wait_log(cluster: &ProcessCluster, node: u64, needle: &str, before: usize) {
    let deadline = Instant::now() + DEADLINE;
    while count_in_log(cluster, node, needle) <= before {
        assert!(
            Instant::now() < deadline,
            "node {node} never logged {needle:?}:\n{}",
            cluster.log_tails(&[node])
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until `node` (an old leader) serves as a follower of another node.
async fn wait_follower(cluster: &ProcessCluster, node: u64) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let status = cluster.status(node).await.unwrap();
        if status.role == "follower" && status.leader_id.is_some_and(|leader| leader != node) {
            return;
        }
        assert!(Instant::now() < deadline, "node {node} never rejoined as a follower: {status:?}");
        tokio::time::sleep(POLL).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_converge_a_killed_follower_catches_up_from_the_log_and_operator_verbs_work() {
    init_tracing();
    let root = tidal_procs::TestDir::new().unwrap();
    let cluster = start_cluster(root.path()).await;
    let leader = cluster.leader().await.unwrap();
    let followers: Vec<u64> = cluster.ids().into_iter().filter(|id| *id != leader).collect();
    let (f1, f2) = (followers[0], followers[1]);
    {
        tracing::info!("phase 1: items, embeddings and signals on the leader and through both followers");
        let mut last = 0;
        for item in 1..=40u64 {
            let via = [leader, f1, f2][(item % 3) as usize];
            let client = cluster.client(via);
            let key = format!("item-{item}");
            last = last.max(
                until_acked("item", || client.put_item(item, json!({"n": item, "via": via}), Some(&key)))
                    .await,
            );
            let vector = embedding(item);
            last = last.max(until_acked("embedding", || client.put_embedding(item, vector.clone())).await);
        }
        // Replication (not only openraft) dials through the relays (`--dial`): the followers' links
        // from the leader carry these bodies; openraft's heartbeats are a few hundred bytes each.
        // Summed over every directed link: a re-election during the writes moves who ships, but
        // each body still reaches the two followers of whichever node leads.
        let nodes = [leader, f1, f2];
        let relayed_total = || {
            let mut total = 0u64;
            for from in nodes {
                for to in nodes.into_iter().filter(|to| *to != from) {
                    total += cluster.link_bytes(from, to).unwrap();
                }
            }
            total
        };
        let relayed_before = relayed_total();
        let blob = "x".repeat(BLOB_BYTES);
        for item in 101..=103u64 {
            let client = cluster.client(leader);
            let key = format!("blob-{item}");
            last = last
                .max(until_acked("blob", || client.put_item(item, json!({"blob": blob}), Some(&key))).await);
        }
        let relayed = relayed_total() - relayed_before;
        assert!(relayed >= 2 * 3 * BLOB_BYTES as u64, "the relays carried only {relayed} bytes");
        for (round, via) in [leader, f1, f2].into_iter().enumerate() {
            let client = cluster.client(via);
            let key = format!("signals-{round}");
            let batch = signals(300, round as u64);
            last = last.max(until_acked("signals", || client.post_signals(batch.clone(), Some(&key))).await);
        }
        let converged = cluster.converged().await.unwrap();
        assert!(
            converged.seqno >= last,
            "converged at {} below the last acknowledged write {last}",
            converged.seqno
        );
        for user in ["u0", "u3"] {
            assert_feed_parity(&cluster, user).await;
        }
        for node in cluster.ids() {
            let item = cluster.client(node).get_item(20).await.unwrap();
            assert_eq!(item.metadata, json!({"n": 20, "via": f2}), "item 20 was written through {f2}");
            assert!(item.has_embedding);
        }
    }
    {
        tracing::info!(
            "phase 2: follower {f1} SIGKILLed, writes continue, it restarts and catches up from the log"
        );
        let installs_before = cluster.metric(f1, "tidal_snapshot_installs_total").await.unwrap();
        assert_eq!(installs_before, Some(0.0), "the snapshot counter is exported and zero");
        cluster.kill(f1).unwrap();
        let mut acked = Vec::new();
        for item in 41..=100u64 {
            let via = if item % 2 == 0 { leader } else { f2 };
            let client = cluster.client(via);
            let key = format!("item-{item}");
            let seqno = until_acked("item", || client.put_item(item, json!({"n": item}), Some(&key))).await;
            acked.push(Ack { item, seqno, via, sent: Instant::now() });
        }
        let batch = signals(500, 9);
        let client = cluster.client(leader);
        until_acked("signals", || client.post_signals(batch.clone(), Some("signals-down"))).await;
        let pulls_before = count_in_log(&cluster, f1, "pull done");
        cluster.restart(f1).unwrap();
        cluster.wait_ready(f1).await.unwrap();
        // The boot-time pull from the leader it learns of (the log says `pull done batches=N`).
        wait_log(&cluster, f1, "pull done", pulls_before).await;
        let converged = cluster.converged().await.unwrap();
        assert!(converged.seqno >= acked.last().unwrap().seqno);
        for ack in &acked {
            let item = cluster.client(f1).get_item(ack.item).await.unwrap();
            assert_eq!((item.seqno, item.metadata), (ack.seqno, json!({"n": ack.item})));
        }
        assert_feed_parity(&cluster, "u2").await;
        assert_eq!(
            cluster.metric(f1, "tidal_snapshot_installs_total").await.unwrap(),
            Some(0.0),
            "follower {f1} caught up by a snapshot install, not the log"
        );
        let status = cluster.status(f1).await.unwrap();
        assert_eq!(status.quarantined_seqnos, 0, "a follower that only missed writes quarantined something");
        assert_eq!(count_in_log(&cluster, f1, "fetching a snapshot"), 0);
        assert_eq!(count_in_log(&cluster, leader, "heal: queue reset"), 0, "no heal verb was used");
    }
    {
        tracing::info!("phase 3: the operator verbs from the CLI");
        let (ok, out, err) = cli(vec!["status".into(), "--url".into(), cluster.url(f2)]).await;
        assert!(ok, "tidal status failed: {out}{err}");
        assert!(out.contains(&format!("leader {leader}")), "status does not name leader {leader}:\n{out}");
        assert_eq!(
            out.lines().filter(|line| line.contains("127.0.0.1:")).count(),
            3,
            "one row per node:\n{out}"
        );

        let heal = |url: String, node: u64, extra: &[&str]| {
            let mut args = vec!["heal".to_string(), "--url".into(), url, "--node".into(), node.to_string()];
            args.extend(extra.iter().map(|arg| arg.to_string()));
            cli(args)
        };
        // Asked of a follower, the verb is forwarded to the leader (which alone can reset its queues).
        let (ok, out, err) = heal(cluster.url(f2), f1, &["--dry-run"]).await;
        assert!(
            ok && out.contains("would reset") && out.contains("\"dry_run\": true"),
            "heal --dry-run through a follower: {out}{err}"
        );
        let (ok, out, err) = heal(cluster.url(leader), leader, &[]).await;
        assert!(!ok && err.contains("not a follower"), "heal of the leader itself must fail: {out}{err}");
        assert_eq!(
            count_in_log(&cluster, leader, "heal: queue reset"),
            0,
            "dry runs and refusals change nothing"
        );
        let pulls_before = count_in_log(&cluster, f1, "pull done");
        let (ok, out, err) = heal(cluster.url(leader), f1, &[]).await;
        assert!(ok, "heal failed: {out}{err}");
        let reply: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(reply["node"], json!(f1));
        assert!(reply["action"].as_str().unwrap().starts_with("reset the ShipQueue"), "{out}");
        // The effect: the leader resets the queue and nudges the follower, which pulls.
        wait_log(&cluster, leader, "heal: queue reset", 0).await;
        wait_log(&cluster, f1, "pull done", pulls_before).await;

        let (ok, out, err) = cli(vec!["catchup".into(), "--url".into(), cluster.url(leader)]).await;
        assert!(!ok && err.contains("nothing to catch up"), "catchup on the leader must fail: {out}{err}");
        let pulls_before = count_in_log(&cluster, f2, "pull done");
        let deadline = Instant::now() + DEADLINE;
        loop {
            let (ok, out, err) = cli(vec!["catchup".into(), "--url".into(), cluster.url(f2)]).await;
            assert!(ok, "catchup failed: {out}{err}");
            let reply: serde_json::Value = serde_json::from_str(&out).unwrap();
            assert_eq!((reply["node"].clone(), reply["leader"].clone()), (json!(f2), json!(leader)), "{out}");
            if reply["pull_started"] == json!(true) {
                break;
            }
            // A pull was already running; ask again once it is done.
            assert!(Instant::now() < deadline, "catchup never started a pull: {out}");
            tokio::time::sleep(POLL).await;
        }
        wait_log(&cluster, f2, "pull done", pulls_before).await;
        let client = cluster.client(f1);
        let seqno =
            until_acked("item", || client.put_item(500, json!({"after": "verbs"}), Some("item-500"))).await;
        let converged = cluster.converged().await.unwrap();
        assert!(converged.seqno >= seqno);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_under_load_then_two_nodes_killed_at_once_lose_no_acknowledged_write() {
    init_tracing();
    let root = tidal_procs::TestDir::new().unwrap();
    let cluster = start_cluster(root.path()).await;
    let mut all_acked = Vec::new();
    {
        let old = cluster.leader().await.unwrap();
        tracing::info!("phase 1: leader {old} SIGKILLed under concurrent writes on every node");
        let load = Load::start(&cluster, 2, 1);
        load.wait_until("acks before the kill", |acks| acks.len() >= ACKS_PER_PHASE).await;
        cluster.kill(old).unwrap();
        let survivors: Vec<u64> = cluster.running();
        let new = cluster.leader_of(&survivors).await.unwrap();
        assert_ne!(new, old);
        let elected = Instant::now();
        load.wait_until("acks from the new leader's term", |acks| {
            acks.iter().filter(|ack| ack.sent >= elected).count() >= ACKS_PER_PHASE
        })
        .await;
        cluster.restart(old).unwrap();
        cluster.wait_ready(old).await.unwrap();
        wait_follower(&cluster, old).await;
        let rejoined = Instant::now();
        load.wait_until("acks after the old leader rejoined", |acks| {
            acks.iter().filter(|ack| ack.sent >= rejoined).count() >= ACKS_PER_PHASE / 2
        })
        .await;
        let acked = load.finish().await;
        let converged = cluster.converged().await.unwrap();
        assert!(converged.seqno >= acked.iter().map(|ack| ack.seqno).max().unwrap());
        assert_acked_everywhere(&cluster, &acked).await;
        tracing::info!(acked = acked.len(), seqno = converged.seqno, "phase 1 converged");
        all_acked.extend(acked);
    }
    {
        let leader = cluster.leader().await.unwrap();
        let follower = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
        tracing::info!(
            "phase 2: leader {leader} and follower {follower} SIGKILLed at once under writes, then restarted"
        );
        let load = Load::start(&cluster, 2, 1_000_000);
        load.wait_until("acks before the kill", |acks| acks.len() >= ACKS_PER_PHASE).await;
        cluster.kill(leader).unwrap();
        cluster.kill(follower).unwrap();
        cluster.restart(leader).unwrap();
        cluster.restart(follower).unwrap();
        cluster.leader().await.unwrap();
        let back = Instant::now();
        load.wait_until("acks after the restart", |acks| {
            acks.iter().filter(|ack| ack.sent >= back).count() >= ACKS_PER_PHASE
        })
        .await;
        let acked = load.finish().await;
        let converged = cluster.converged().await.unwrap();
        assert!(converged.seqno >= acked.iter().map(|ack| ack.seqno).max().unwrap());
        all_acked.extend(acked);
        assert_acked_everywhere(&cluster, &all_acked).await;
        tracing::info!(acked = all_acked.len(), seqno = converged.seqno, "phase 2 converged");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_leader_stops_acknowledging_and_loses_no_acknowledged_write() {
    init_tracing();
    let root = tidal_procs::TestDir::new().unwrap();
    let cluster = start_cluster(root.path()).await;
    let old = cluster.leader().await.unwrap();
    let majority: Vec<u64> = cluster.ids().into_iter().filter(|id| *id != old).collect();
    let load = Load::start(&cluster, 2, 1);
    let (new, serving);
    {
        tracing::info!("phase 1: leader {old} cut off from {majority:?} under writes on every node");
        load.wait_until("acks before the cut", |acks| acks.len() >= ACKS_PER_PHASE).await;
        cluster.cut(old);
        new = cluster.leader_of(&majority).await.unwrap();
        serving = Instant::now();
        assert_ne!(new, old);
        load.wait_until("acks from the majority's new leader", |acks| {
            acks.iter().filter(|ack| ack.sent >= serving).count() >= ACKS_PER_PHASE
        })
        .await;
        // One more write straight to the cut-off leader, which still believes it leads: it must
        // not be acknowledged (it cannot reach a majority).
        let probe = Client::with_timeout(cluster.url(old), None, WRITE_TIMEOUT);
        let outcome = probe.put_item(PROBE_ITEM, json!({"probe": "cut off"}), Some("probe")).await;
        assert!(
            outcome.is_err(),
            "cut-off leader {old} acknowledged a write after {new} took over: {outcome:?}"
        );
    }
    {
        tracing::info!(
            "phase 2: links restored; the old leader must have acknowledged nothing sent after {new} served"
        );
        let acked = load.finish().await;
        cluster.restore(old);
        let late: Vec<&Ack> = acked.iter().filter(|ack| ack.via == old && ack.sent >= serving).collect();
        assert!(
            late.is_empty(),
            "deposed leader {old} acknowledged writes sent after {new} served: {late:?}"
        );
        wait_follower(&cluster, old).await;
        let converged = cluster.converged().await.unwrap();
        assert!(converged.seqno >= acked.iter().map(|ack| ack.seqno).max().unwrap());
        let status = cluster.status(old).await.unwrap();
        assert_acked_everywhere(&cluster, &acked).await;
        for node in cluster.ids() {
            // Written only to the cut-off leader's WAL, never acknowledged: quarantined there, and
            // on no node's state.
            let read = cluster.client(node).get_item(PROBE_ITEM).await;
            assert!(
                matches!(read, Err(tidal_client::Error::Api { status: 404, .. })),
                "the unacknowledged write to the cut-off leader is visible on node {node}: {read:?}"
            );
        }
        tracing::info!(
            acked = acked.len(),
            seqno = converged.seqno,
            quarantined = status.quarantined_seqnos,
            "converged after the cut"
        );
    }
}
