//! A write not committed within the answer bound (node.rs `WRITE_ANSWER_TIMEOUT`) is answered 503,
//! outcome unknown, while it stays in the leader's log under its office and may yet commit. A
//! retry with the same Idempotency-Key must not write it again. Before the fix, the first attempt's
//! key left the in-flight table with its answer, the engine's table did not have it yet (it was not
//! applied), so the retry appended a second copy, and both committed once the followers were back:
//! the event was in the stream twice. (The simulation's chaos, network and rotation families found
//! it once ships could stall for longer than the bound, decisions/071.)

#![allow(clippy::unwrap_used)] // tests may unwrap; helpers outside #[test] are not covered by allow-unwrap-in-tests

mod common;

use common::cluster::{retrying, Cluster, DEADLINE, POLL};
use serde_json::json;
use tidal_client::Publish;
use tidal_cluster::Durability;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_while_the_first_attempt_may_still_commit_never_writes_twice() {
    common::trace();
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(root.path(), 3, Durability::Quorum, |_| {});
    cluster.start_all().await;
    let leader = cluster.leader().await;
    let client = cluster.client(leader).clone();
    let warm = [Publish { payload: json!("warm"), key: None }];
    retrying(|| client.publish("orders", &warm, Some("warm"))).await;

    // No follower: nothing the leader writes can commit, and it goes on leading its term.
    let followers = cluster.followers_of(leader);
    for follower in &followers {
        cluster.stop(*follower).await;
    }
    let event = [Publish { payload: json!("once"), key: None }];
    for attempt in 1..=3 {
        let error = client.publish("orders", &event, Some("k-once")).await.unwrap_err();
        assert_eq!(error.code(), Some("not_ready"), "attempt {attempt}: {error}");
    }
    let status = cluster.client(leader).status().await.unwrap();
    assert_eq!(status.role, "leader", "the test needs the leader to keep its office meanwhile");

    // The followers come back; whatever the leader's log holds commits, once.
    for follower in followers {
        cluster.start(follower).await;
    }
    let answer = retrying(|| client.publish("orders", &event, Some("k-once"))).await;
    let path = format!("/v1/streams/orders/events?after=0&limit=100&min_seqno={}", answer.seqno);
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let read = loop {
        let leader = cluster.leader().await;
        match cluster
            .client(leader)
            .json::<(), tidal_types::StreamEvents>(reqwest::Method::GET, &path, None)
            .await
        {
            Ok(read) => break read,
            Err(error) => {
                assert!(tokio::time::Instant::now() < deadline, "the stream never read: {error}");
                tokio::time::sleep(POLL).await;
            }
        }
    };
    let copies: Vec<u64> =
        read.events.iter().filter(|event| event.payload == json!("once")).map(|event| event.offset).collect();
    assert_eq!(copies, answer.offsets, "the retried event is in the stream at offsets {copies:?}");
    cluster.stop_all().await;
}
