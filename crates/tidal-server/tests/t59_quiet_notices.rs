//! decisions/027 on a real cluster: once a write is committed, the leader tells each follower with
//! a quiet commit notice (no ship, no answer), and the followers apply from it. One client writing
//! one item at a time moves the commit frontier after every ship's answer, with no later ship to
//! carry it: every follower must receive notices and advance its commit frontier by them, and the
//! leader must send no more than about one per write per follower (a commit handed to the notice
//! task while a ship was out is not sent again after the answer).

#![allow(clippy::unwrap_used)] // tests may unwrap; helpers outside #[test] are not covered by allow-unwrap-in-tests

mod common;

use common::cluster::{metric, same, Cluster, DEADLINE, POLL};
use serde_json::json;
use tidal_cluster::Durability;

const WRITES: u64 = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_apply_from_quiet_notices_one_per_write() {
    common::trace();
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(root.path(), 3, Durability::Quorum, |_| {});
    cluster.start_all().await;
    cluster.put_acked(1, json!({"first": true})).await;
    let leader = cluster.leader().await;
    let sent_before =
        metric(cluster.client(leader), r#"tidal_commit_notices_total{outcome="sent"}"#).await.unwrap();
    let mut last = 0;
    for id in 0..WRITES {
        last = cluster.client(leader).put_item(100 + id, json!({"n": id}), None).await.unwrap().seqno;
    }
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let digests = cluster.digests_at(last).await;
        if same(&digests) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no convergence: {digests:?}");
        tokio::time::sleep(POLL).await;
    }
    for follower in cluster.followers_of(leader) {
        let client = cluster.client(follower);
        let received = metric(client, r#"tidal_commit_notices_total{outcome="received"}"#).await.unwrap();
        let advanced = metric(client, r#"tidal_commit_notices_total{outcome="advanced"}"#).await.unwrap();
        assert!(
            received > 0.0 && advanced > 0.0,
            "node {follower}: received {received}, advanced {advanced}"
        );
    }
    let sent = metric(cluster.client(leader), r#"tidal_commit_notices_total{outcome="sent"}"#).await.unwrap()
        - sent_before;
    // Two followers, one notice each per write; heartbeats and the first write's leftovers may add a
    // few. Sending a commit again after the ship's answer would make it about three per write.
    assert!(sent <= (2 * WRITES + 10) as f64, "{sent} notices for {WRITES} writes");
    cluster.stop_all().await;
}
