//! Storage faults are fatal and hand over (decisions/059, issue 37 findings 5 and 6), on a real
//! cluster (tonic and HTTP on loopback, quorum durability): a leader whose WAL is poisoned, whose
//! vote cannot be fsynced, or whose applier dies leaves office at once, fails `/healthz` and
//! `/readyz` with the reason, and its `run` returns the fault (`tidal serve` exits non-zero); the
//! other nodes elect a leader and acknowledge writes again. A single node's poisoned WAL and a
//! failed engine flush are fatal the same way.

#![allow(clippy::unwrap_used)] // tests may unwrap; helpers outside #[test] are not covered by allow-unwrap-in-tests

mod common;

use common::cluster::{metric, Cluster, DEADLINE, POLL};
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tidal_client::Client;
use tidal_cluster::{ApplyPoint, ApplyProbe, Durability, FatalSource};
use tidal_core::{RaftStep, RaftStoreFaults};
use tidal_server::config::ServeConfig;
use tidal_server::FatalExit;
use tidal_types::Seqno;
use tidal_wal::SimIo;

/// How long a faulted node keeps answering before it exits: long enough for the checks below on a
/// loaded machine.
const GRACE_MS: u64 = 4_000;

fn tweak(config: &mut ServeConfig) {
    config.fatal_exit_grace_ms = GRACE_MS;
}

/// `GET path` on `client`'s node: status and body.
async fn probe(client: &Client, path: &str) -> (u16, String) {
    let reply = reqwest::get(format!("{}{path}", client.base())).await.unwrap();
    let status = reply.status().as_u16();
    (status, reply.text().await.unwrap())
}

/// Waits until node `index` fails `/healthz` (a fatal fault raised), then checks, while it still
/// answers: `/healthz` and `/readyz` are 503 and name the fault's source, the node no longer claims
/// to lead, its metrics say so; then that its `run` returns the fault.
async fn assert_stopped_by(cluster: &mut Cluster, index: usize, source: FatalSource) {
    let client = cluster.client(index).clone();
    let named = format!("fatal storage fault ({source})");
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let (status, body) = loop {
        let (status, body) = probe(&client, "/healthz").await;
        if status != 200 {
            break (status, body);
        }
        assert!(tokio::time::Instant::now() < deadline, "/healthz still answers 200 after the fault");
        tokio::time::sleep(POLL).await;
    };
    assert_eq!(status, 503, "/healthz: {body}");
    assert!(body.contains(&named), "/healthz does not name the fault: {body}");
    let (status, body) = probe(&client, "/readyz").await;
    assert_eq!(status, 503, "/readyz: {body}");
    assert!(body.contains(&named), "/readyz does not name the fault: {body}");
    // Out of office at once: no longer serving as leader (no heartbeats, no ship queues).
    let until = tokio::time::Instant::now() + Duration::from_secs(1);
    loop {
        let role = client.status().await.unwrap().role;
        if role != "leader" {
            break;
        }
        assert!(tokio::time::Instant::now() < until, "the faulted node still serves as leader");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(metric(&client, "tidal_is_leader").await, Some(0.0));
    assert_eq!(metric(&client, "tidal_up").await, Some(0.0));
    assert_eq!(metric(&client, &format!("tidal_fatal{{source=\"{source}\"}}")).await, Some(1.0));
    // Then it exits with the fault (`tidal serve` turns it into a non-zero status).
    let exit = cluster.exited(index).await.expect_err("the node's run returned Ok after a fatal fault");
    let fatal = exit.downcast_ref::<FatalExit>().unwrap_or_else(|| panic!("not a fatal exit: {exit:#}"));
    assert_eq!(fatal.0.source, source, "{exit:#}");
}

/// The others elect a leader and acknowledge a write: it is not `faulted`.
async fn assert_failed_over(cluster: &Cluster, faulted: usize, id: u64) {
    cluster.put_acked(id, json!({"after": "failover"})).await;
    let leader = cluster.leader().await;
    assert_ne!(leader, faulted);
    assert_eq!(cluster.client(leader).get_item(id).await.unwrap().metadata, json!({"after": "failover"}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_wal_is_poisoned_leaves_office_fails_health_and_exits() {
    common::trace();
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(root.path(), 3, Durability::Quorum, tweak);
    let disks: Vec<SimIo> = (0..3).map(|_| SimIo::new()).collect();
    for (index, disk) in disks.iter().enumerate() {
        let disk = disk.clone();
        cluster.node_tweaks[index] =
            Some(Arc::new(move |config| config.io.wal_files = Arc::new(disk.clone())));
    }
    cluster.start_all().await;
    cluster.put_acked(1, json!({"before": "fault"})).await;
    let leader = cluster.leader().await;
    disks[leader].fail_syncs(true);
    let refused = cluster.client(leader).put_item(2, json!({"fsync": "fails"}), None).await.unwrap_err();
    assert_eq!(refused.code(), Some("not_ready"), "{refused:?}");
    assert_stopped_by(&mut cluster, leader, FatalSource::Wal).await;
    assert_failed_over(&cluster, leader, 3).await;
    cluster.stop_all().await;
}

/// Fails the fsync of every write of the vote while armed.
#[derive(Default)]
struct VoteFsyncFails {
    armed: AtomicBool,
    failed: AtomicU64,
}

impl RaftStoreFaults for VoteFsyncFails {
    fn before(&self, step: RaftStep, keys: &[&[u8]]) -> std::io::Result<()> {
        if step == RaftStep::Sync && self.armed.load(Ordering::SeqCst) && keys.contains(&&b"vote"[..]) {
            self.failed.fetch_add(1, Ordering::SeqCst);
            return Err(std::io::Error::other("injected: the vote's fsync failed"));
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_vote_fsync_fails_leaves_office_fails_health_and_exits() {
    common::trace();
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(root.path(), 3, Durability::Quorum, tweak);
    let faults: Vec<Arc<VoteFsyncFails>> = (0..3).map(|_| Arc::default()).collect();
    for (index, injector) in faults.iter().enumerate() {
        let injector = injector.clone();
        cluster.node_tweaks[index] = Some(Arc::new(move |config| {
            let injector: Arc<dyn RaftStoreFaults> = injector.clone();
            config.io.raft_faults = Some(injector);
        }));
    }
    cluster.start_all().await;
    cluster.put_acked(1, json!({"before": "fault"})).await;
    let leader = cluster.leader().await;
    let target = cluster.followers_of(leader)[0];
    faults[leader].armed.store(true, Ordering::SeqCst);
    // A leadership transfer makes the leader persist the target's higher term: that vote's fsync
    // fails. (The transfer's own answer does not matter here.)
    let client = cluster.client(leader).clone();
    let target_id = cluster.spec.nodes[target].id.0;
    let promoting = tokio::spawn(async move {
        client
            .json::<(), serde_json::Value>(
                reqwest::Method::POST,
                &format!("/cluster/promote?node={target_id}"),
                None,
            )
            .await
    });
    assert_stopped_by(&mut cluster, leader, FatalSource::Vote).await;
    assert!(faults[leader].failed.load(Ordering::SeqCst) >= 1, "no vote fsync failed");
    let _ = promoting.await;
    assert_failed_over(&cluster, leader, 3).await;
    cluster.stop_all().await;
}

/// Panics in the applier (before folding a batch) while armed: the applier thread dies.
#[derive(Default)]
struct ApplierDies {
    armed: AtomicBool,
}

impl ApplyProbe for ApplierDies {
    fn reached(&self, point: ApplyPoint, first: Seqno, _last: Seqno) -> bool {
        if point == ApplyPoint::BeforeApply && self.armed.load(Ordering::SeqCst) {
            panic!("injected: the applier fails at seqno {first}");
        }
        false
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_applier_dies_leaves_office_fails_health_and_exits() {
    common::trace();
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(root.path(), 3, Durability::Quorum, tweak);
    let probes: Vec<Arc<ApplierDies>> = (0..3).map(|_| Arc::default()).collect();
    for (index, probe) in probes.iter().enumerate() {
        let probe = probe.clone();
        cluster.node_tweaks[index] = Some(Arc::new(move |config| {
            let probe: Arc<dyn ApplyProbe> = probe.clone();
            config.io.apply_probe = Some(probe);
        }));
    }
    cluster.start_all().await;
    cluster.put_acked(1, json!({"before": "fault"})).await;
    let leader = cluster.leader().await;
    probes[leader].armed.store(true, Ordering::SeqCst);
    let refused = cluster.client(leader).put_item(2, json!({"apply": "fails"}), None).await.unwrap_err();
    assert_eq!(refused.code(), Some("not_ready"), "{refused:?}");
    assert_stopped_by(&mut cluster, leader, FatalSource::Applier).await;
    assert_failed_over(&cluster, leader, 3).await;
    cluster.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_node_whose_wal_is_poisoned_fails_health_and_exits() {
    common::trace();
    let dir = tempfile::tempdir().unwrap();
    let disk = SimIo::new();
    let mut config = common::config(dir.path(), 4);
    config.fatal_exit_grace_ms = GRACE_MS;
    config.io.wal_files = Arc::new(disk.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = Client::new(format!("http://{}", listener.local_addr().unwrap()), None);
    let node = tokio::spawn(tidal_server::run(config, listener, None, std::future::pending()));
    client.put_item(1, json!({"before": "fault"}), None).await.unwrap();
    assert_eq!(probe(&client, "/healthz").await.0, 200);
    disk.fail_syncs(true);
    let refused = client.put_item(2, json!({"fsync": "fails"}), None).await.unwrap_err();
    assert_eq!(refused.code(), Some("not_ready"), "{refused:?}");
    let (status, body) = probe(&client, "/healthz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("fatal storage fault (wal)"), "{body}");
    let exit = tokio::time::timeout(DEADLINE, node).await.unwrap().unwrap().unwrap_err();
    assert_eq!(exit.downcast_ref::<FatalExit>().unwrap().0.source, FatalSource::Wal, "{exit:#}");
}

#[tokio::test]
async fn a_failed_engine_flush_is_a_fatal_fault_of_the_node() {
    common::trace();
    let dir = tempfile::tempdir().unwrap();
    let (node, _) = tidal_server::node::Node::open(common::config(dir.path(), 4)).unwrap();
    let anonymous = tidal_server::auth::Principal::anonymous();
    let item = tidal_core::Records::ItemMetadata { item: 1, metadata: b"{}".to_vec() };
    node.write(&anonymous, None, item).await.unwrap();
    assert!(node.check_fatal().is_none());
    // The engine's next flush fails as a full disk would fail it (fjall refuses the commit).
    node.db().fail_next_flush("injected: no space left on device");
    assert!(
        node.checkpoint_and_purge(tidal_server::node::checkpoints::CheckpointReason::Interval).is_err(),
        "the checkpoint's flush did not fail"
    );
    // Seen by the periodic check even though no apply came since.
    let fatal = node.check_fatal().expect("a failed engine flush is not fatal");
    assert_eq!(fatal.source, FatalSource::Engine, "{fatal}");
    assert!(fatal.detail.contains("no space left on device"), "{fatal}");
    assert_eq!(node.fatal(), Some(fatal), "the fault is kept");
    node.stop_after_fatal();
}

/// A node whose engine directory disappears under it (a failed or unmounted disk): the
/// checkpoint's flush fails (its intent file cannot be written, decisions/072) or, for what fjall's
/// journal holds, fjall's flush worker fails and poisons fjall and the table write ends with an
/// error instead of waiting forever for the sealed memtables; the fault is fatal, and the shutdown
/// a SIGTERM starts returns (it used to hang in fjall's `rotate_memtable_and_wait`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_engine_directory_is_gone_fails_its_checkpoint_and_still_shuts_down() {
    use tidal_server::node::checkpoints::CheckpointReason;
    common::trace();
    let dir = tempfile::tempdir().unwrap();
    let (node, _) = tidal_server::node::Node::open(common::config(dir.path(), 4)).unwrap();
    let node = Arc::new(node);
    let anonymous = tidal_server::auth::Principal::anonymous();
    for item in 1..=50 {
        let metadata = format!("{{\"n\": {item}}}").into_bytes();
        node.write(&anonymous, None, tidal_core::Records::ItemMetadata { item, metadata }).await.unwrap();
    }
    std::fs::remove_dir_all(dir.path().join("state")).unwrap();
    let checkpointing = {
        let node = node.clone();
        tokio::task::spawn_blocking(move || node.checkpoint_and_purge(CheckpointReason::EngineBytes))
    };
    let outcome = tokio::time::timeout(DEADLINE, checkpointing).await;
    let outcome = outcome.expect("the table write still waits for fjall's failed flush worker").unwrap();
    let error = outcome.expect_err("the engine wrote tables into a directory that is gone");
    let error = format!("{error:#}");
    assert!(error.contains("flush intent") || error.contains("not written to tables"), "{error}");
    let fatal = node.check_fatal().expect("a poisoned engine is not fatal");
    assert_eq!(fatal.source, FatalSource::Engine, "{fatal}");
    let stopping = tokio::task::spawn_blocking(move || node.shutdown());
    tokio::time::timeout(DEADLINE, stopping).await.expect("the shutdown hangs on the failed engine").unwrap();
}
