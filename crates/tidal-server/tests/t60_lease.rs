//! A leader cut off from every follower (findings 4 and 12 of the safety review, decisions/057): in
//! leader mode it acknowledges nothing once its lease has run out, however long it goes on
//! believing it leads; every write it takes is answered (503, outcome unknown) within a bound, and
//! `/readyz` says it is not ready. At a57b07b such a leader acknowledged writes for as long as the
//! partition lasted (3,383 in 4 s in the review's run), and `/readyz` said `ready: leader`.

#![allow(clippy::unwrap_used)] // tests may unwrap; helpers outside #[test] are not covered by allow-unwrap-in-tests

mod common;

use common::cluster::{Cluster, DEADLINE, POLL};
use serde_json::json;
use std::time::Duration;
use tidal_cluster::Durability;

/// The bound a write is answered within (node.rs `WRITE_ANSWER_TIMEOUT`), with room for a loaded
/// test machine.
const ANSWER_BOUND: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_leader_mode_leader_acknowledges_nothing_after_its_lease() {
    common::trace();
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(root.path(), 3, Durability::Leader, |_| {});
    cluster.start_all().await;
    for id in 0..5 {
        cluster.put_acked(id, json!({"before": id})).await;
    }
    let leader = cluster.leader().await;
    let followers = cluster.followers_of(leader);
    for follower in &followers {
        cluster.stop(*follower).await;
    }
    // Observable state, not a sleep: the leader reports it lost contact with a majority.
    let ready = format!("{}/readyz", cluster.client(leader).base());
    let http = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let status = http.get(&ready).send().await.unwrap().status();
        if status == reqwest::StatusCode::SERVICE_UNAVAILABLE {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "/readyz still {status} with no follower up");
        tokio::time::sleep(POLL).await;
    }
    let status = cluster.client(leader).status().await.unwrap();
    assert_eq!(status.role, "leader", "the test needs a node that still believes it leads");

    // Past the lease: nothing is acknowledged, and every write is answered within the bound.
    let started = tokio::time::Instant::now();
    let mut writes = tokio::task::JoinSet::new();
    for id in 100..120u64 {
        let client = cluster.client(leader).clone();
        writes.spawn(async move { client.put_item(id, json!({"cut off": id}), None).await });
    }
    let mut acknowledged = Vec::new();
    while let Some(answer) = writes.join_next().await {
        match answer.unwrap() {
            Ok(reply) => acknowledged.push(reply.seqno),
            Err(error) => assert_eq!(error.code(), Some("not_ready"), "{error}"),
        }
    }
    assert!(acknowledged.is_empty(), "acknowledged after the lease ran out: seqnos {acknowledged:?}");
    assert!(started.elapsed() < ANSWER_BOUND, "writes answered after {:?}", started.elapsed());

    // Contact again: the leader (or a new one) acknowledges again.
    for follower in followers {
        cluster.start(follower).await;
    }
    cluster.put_acked(200, json!({"after": "contact"})).await;
    cluster.stop_all().await;
}
