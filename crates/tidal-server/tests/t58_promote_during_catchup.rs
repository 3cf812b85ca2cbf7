//! A promotion while a follower is in the middle of catch-up (real tonic and HTTP on loopback,
//! quorum durability): a follower stopped through a burst of writes restarts and pulls; while it is
//! still behind, leadership moves to the other follower. Nothing acknowledged is lost, the
//! catching-up follower follows the new leader and every node converges to the same digest.

#![allow(clippy::unwrap_used)] // tests may unwrap; helpers outside #[test] are not covered by allow-unwrap-in-tests

mod common;

use common::cluster::{retrying, same, Cluster};
use serde_json::json;
use tidal_cluster::Durability;
use tidal_types::SignalIn;

/// Batches written while the follower is down, and signals per batch: enough that its catch-up is
/// still running when the promotion starts.
const BATCHES: u64 = 60;
const SIGNALS_PER_BATCH: u64 = 1000;

fn batch(n: u64) -> Vec<SignalIn> {
    (0..SIGNALS_PER_BATCH)
        .map(|i| SignalIn {
            user: format!("u{}", (n * SIGNALS_PER_BATCH + i) % 97),
            item: (n + i) % 31,
            kind: "click".into(),
            weight: None,
            ts: None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promotion_while_a_follower_catches_up_loses_nothing_and_converges() {
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(root.path(), 3, Durability::Quorum, |_| {});
    cluster.start_all().await;
    let l = cluster.leader().await;
    let followers = cluster.followers_of(l);
    let (behind, target) = (followers[0], followers[1]);
    let target_id = cluster.spec.nodes[target].id.0;
    cluster.put_acked(1, json!({"before": "outage"})).await;
    cluster.stop(behind).await;
    let mut acked = Vec::new();
    for n in 0..BATCHES {
        let key = format!("burst-{n}");
        acked.push(retrying(|| cluster.client(l).post_signals(batch(n), Some(&key))).await.seqno);
    }
    let burst_end = *acked.last().unwrap();
    cluster.start(behind).await;
    // Promote at once: the restarted follower is still pulling the burst.
    let applied_at_promote = cluster.client(behind).status().await.unwrap().applied_seqno;
    let post = |path: String| {
        let client = cluster.client(l).clone();
        async move { client.json::<(), serde_json::Value>(reqwest::Method::POST, &path, None).await }
    };
    let done = retrying(|| post(format!("/cluster/promote?node={target_id}"))).await;
    assert_eq!(done["new_leader"], json!(target_id), "{done}");
    assert!(
        applied_at_promote < burst_end,
        "the follower had caught up before the promotion ({applied_at_promote} of {burst_end}): the test did not test catch-up"
    );
    assert_eq!(cluster.leader().await, target);
    let last = cluster.put_acked(2, json!({"after": "promotion"})).await.seqno;
    let digests = cluster.digests_at(last).await;
    assert_eq!(digests.len(), 3);
    assert!(same(&digests), "replicas differ after a promotion during catch-up: {digests:?}");
    // Every acknowledged write is on the caught-up follower.
    assert_eq!(cluster.client(behind).get_item(1).await.unwrap().metadata, json!({"before": "outage"}));
    let retried = cluster.client(behind).post_signals(batch(0), Some("burst-0")).await.unwrap();
    assert_eq!(retried.seqno, acked[0], "an acknowledged batch was written twice or lost");
    cluster.stop_all().await;
}
