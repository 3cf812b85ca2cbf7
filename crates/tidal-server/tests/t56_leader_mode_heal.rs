//! Leader durability on a real cluster (tonic and HTTP on loopback): a leader acknowledges writes
//! its followers never got, is stopped, and the others elect a new leader that writes the same
//! seqnos in a higher term. When the old leader comes back, its committed batches conflict with the
//! new leader's and its applied state is past the divergence point (a ship of the new term makes
//! its receiver refuse with `halted`, or its pull finds the divergence first, depending on timing):
//! it heals itself by installing the new leader's snapshot; its lost writes stay in
//! `wal/quarantine/` for the operator, and it converges with no operator action.

#![allow(clippy::unwrap_used)] // tests may unwrap; helpers outside #[test] are not covered by allow-unwrap-in-tests

mod common;

use common::cluster::{metric, same, Cluster, DEADLINE, POLL};
use serde_json::json;
use tidal_cluster::Durability;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_leader_whose_acknowledged_writes_were_lost_heals_by_snapshot() {
    common::trace();
    let root = tempfile::tempdir().unwrap();
    // Leader mode acknowledges alone only within its lease (nine tenths of the minimum election
    // timeout, decisions/057): long election timeouts give the old leader seconds in which its
    // writes are acknowledged without any follower.
    let mut cluster = Cluster::new(root.path(), 3, Durability::Leader, |config| {
        if let Some(cluster) = config.cluster.as_mut() {
            cluster.timing.election_min = std::time::Duration::from_secs(4);
            cluster.timing.election_max = std::time::Duration::from_secs(6);
        }
    });
    cluster.start_all().await;
    cluster.put_acked(1, json!({"everyone": true})).await;
    let old = cluster.leader().await;
    let followers = cluster.followers_of(old);
    for f in &followers {
        cluster.stop(*f).await;
    }
    // Leader durability: acknowledged by the old leader alone, within its lease.
    for id in 100..106 {
        cluster.client(old).put_item(id, json!({"lost": id}), None).await.unwrap();
    }
    cluster.stop(old).await;
    for f in &followers {
        cluster.start(*f).await;
    }
    let mut last = 0;
    for id in 200..212 {
        last = cluster.put_acked(id, json!({"new term": id})).await.seqno;
    }
    // The old leader returns: it holds committed batches of the old term where the new leader has
    // others. It halts, installs the new leader's snapshot, and converges.
    cluster.start(old).await;
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let status = cluster.client(old).status().await.unwrap();
        if status.applied_seqno >= last {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the old leader never healed: {status:?}");
        tokio::time::sleep(POLL).await;
    }
    let digests = cluster.digests_at(last).await;
    assert_eq!(digests.len(), 3);
    assert!(same(&digests), "the old leader did not converge: {digests:?}");
    assert!(metric(cluster.client(old), "tidal_snapshot_installs_total").await.unwrap() >= 1.0);
    // Its lost writes are gone from its state and kept in quarantine.
    assert_eq!(cluster.client(old).get_item(100).await.unwrap_err().code(), Some("not_found"));
    let status = cluster.client(old).status().await.unwrap();
    assert!(status.quarantine_files >= 1, "{status:?}");
    cluster.stop_all().await;
}
