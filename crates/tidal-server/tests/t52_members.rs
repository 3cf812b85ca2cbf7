//! Membership changes on a real cluster (tonic and HTTP on loopback): a node started with `--join`
//! is added with `members add` (a learner that catches up through the log, then a voter), counts
//! toward the quorum once it votes, and a removed voter no longer does; the verbs refuse what they
//! cannot do with a clear error, and a dry run changes nothing.

#![allow(clippy::unwrap_used)] // tests may unwrap; helpers outside #[test] are not covered by allow-unwrap-in-tests

mod common;

use common::cluster::{same, Cluster, DEADLINE, POLL};
use serde_json::{json, Value};
use tidal_client::Client;
use tidal_cluster::Durability;

async fn verb(client: &Client, method: reqwest::Method, path: &str) -> Result<Value, tidal_client::Error> {
    client.json::<(), Value>(method, path, None).await
}

fn ids(value: &Value) -> Vec<u64> {
    value.as_array().unwrap().iter().map(|id| id.as_u64().unwrap()).collect()
}

/// Waits until `client`'s status lists exactly `voters` as voters and `learners` as learners.
async fn wait_members(client: &Client, voters: &[u64], learners: &[u64]) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Ok(status) = client.status().await {
            let seen_voters: Vec<u64> = status.nodes.iter().filter(|n| !n.learner).map(|n| n.id).collect();
            let seen_learners: Vec<u64> = status.nodes.iter().filter(|n| n.learner).map(|n| n.id).collect();
            if seen_voters == voters && seen_learners == learners {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "membership never became voters {voters:?} learners {learners:?}: {seen_voters:?} {seen_learners:?}"
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joined_node_catches_up_votes_and_a_removed_voter_stops_counting() {
    common::trace();
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::with_spares(root.path(), 3, 1, Durability::Quorum, |_| {});
    for index in 0..3 {
        cluster.start(index).await;
    }
    for id in 0..40 {
        cluster.put_acked(id, json!({"before": id})).await;
    }
    let l = cluster.leader().await;
    let leader_id = cluster.spec.nodes[l].id.0;
    let follower = cluster.followers_of(l)[0];
    let new = cluster.spec.nodes[3].clone();
    let add = format!("/cluster/members/4?http={}&rpc={}&catch_up_s=60", new.http, new.rpc);

    // Refusals: bad ids and addresses, removing the leader or a stranger.
    let refused = [
        (reqwest::Method::POST, format!("/cluster/members/0?http={}&rpc={}", new.http, new.rpc)),
        (reqwest::Method::POST, "/cluster/members/x?http=a:1&rpc=b:2".to_string()),
        (reqwest::Method::POST, "/cluster/members/4?http=nowhere&rpc=b:2".to_string()),
        (reqwest::Method::POST, "/cluster/members/4".to_string()),
        (
            reqwest::Method::POST,
            format!("/cluster/members/4?http={}&rpc={}", cluster.spec.nodes[0].http, new.rpc),
        ),
        (reqwest::Method::DELETE, format!("/cluster/members/{leader_id}")),
        (reqwest::Method::DELETE, "/cluster/members/9".to_string()),
    ];
    for (method, path) in refused {
        let error = verb(cluster.client(l), method.clone(), &path).await.unwrap_err();
        assert_eq!(error.code(), Some("invalid_argument"), "{method} {path}: {error:?}");
    }

    // A dry run, through a follower (forwarded to the leader), changes nothing.
    let dry =
        verb(cluster.client(follower), reqwest::Method::POST, &format!("{add}&dry_run=true")).await.unwrap();
    assert_eq!(dry["dry_run"], json!(true));
    assert_eq!(ids(&dry["voters_after"]), vec![1, 2, 3, 4]);
    wait_members(cluster.client(l), &[1, 2, 3], &[]).await;

    // The new node joins: nothing is written to its control log until the leader adds it.
    cluster.start(3).await;
    let joining = cluster.client(3).status().await.unwrap();
    assert_eq!(joining.leader_id, None, "a joining node knows no leader before it is added");
    let added = verb(cluster.client(follower), reqwest::Method::POST, &add).await.unwrap();
    assert_eq!(ids(&added["voters_after"]), vec![1, 2, 3, 4], "{added}");
    for index in 0..4 {
        wait_members(cluster.client(index), &[1, 2, 3, 4], &[]).await;
    }
    // Adding it again is a no-op.
    let again = verb(cluster.client(l), reqwest::Method::POST, &add).await.unwrap();
    assert!(again["action"].as_str().unwrap().contains("already a voter"), "{again}");

    // It holds the history (caught up through the log) and follows new writes.
    let mut last = 0;
    for id in 40..60 {
        last = cluster.put_acked(id, json!({"after": id})).await.seqno;
    }
    let digests = cluster.digests_at(last).await;
    assert_eq!(digests.len(), 4);
    assert!(same(&digests), "the new member diverged: {digests:?}");
    let item = cluster.client(3).get_item(7).await.unwrap();
    assert_eq!(item.metadata, json!({"before": 7}));

    // Four voters: a majority is three. Remove one founder follower, stop it and another founder:
    // the leader and the new member (two of three voters) still commit.
    let l = cluster.leader().await;
    let founders: Vec<usize> = cluster.followers_of(l).into_iter().filter(|i| *i < 3).collect();
    let (gone, down) = (founders[0], founders[1]);
    let gone_id = cluster.spec.nodes[gone].id.0;
    let dry =
        verb(cluster.client(l), reqwest::Method::DELETE, &format!("/cluster/members/{gone_id}?dry_run=true"))
            .await
            .unwrap();
    assert_eq!(dry["dry_run"], json!(true));
    let mut expected: Vec<u64> = vec![1, 2, 3, 4].into_iter().filter(|id| *id != gone_id).collect();
    assert_eq!(ids(&dry["voters_after"]), expected);
    let removed = verb(cluster.client(l), reqwest::Method::DELETE, &format!("/cluster/members/{gone_id}"))
        .await
        .unwrap();
    assert_eq!(ids(&removed["voters_after"]), expected, "{removed}");
    expected.sort();
    wait_members(cluster.client(l), &expected, &[]).await;
    cluster.stop(gone).await;
    cluster.stop(down).await;
    let reply = cluster.put_acked(100, json!({"quorum": "leader and the new member"})).await;
    let survivors = cluster.digests_at(reply.seqno).await;
    assert_eq!(survivors.len(), 2);
    assert!(same(&survivors), "{survivors:?}");
    cluster.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voter_that_never_caught_up_is_not_counted_and_an_unreachable_learner_times_out() {
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::with_spares(root.path(), 3, 1, Durability::Quorum, |_| {});
    for index in 0..3 {
        cluster.start(index).await;
    }
    cluster.put_acked(1, json!({"one": 1})).await;
    // Node 4 is never started: the learner cannot catch up, the verb gives up with a retryable 503
    // and node 4 stays a learner that does not count toward the quorum.
    let new = cluster.spec.nodes[3].clone();
    let add = format!("/cluster/members/4?http={}&rpc={}&catch_up_s=2", new.http, new.rpc);
    // A 503 is retryable: another one (leadership moving under a loaded machine) is retried, as an
    // operator would; the verb must end in "still catching up", never succeed.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let l = cluster.leader().await;
        let error = verb(cluster.client(l), reqwest::Method::POST, &add).await.unwrap_err();
        assert_eq!(error.code(), Some("not_ready"), "{error:?}");
        if error.to_string().contains("still catching up") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the add never reached the catch-up wait: {error}");
        tokio::time::sleep(POLL).await;
    }
    let l = cluster.leader().await;
    wait_members(cluster.client(l), &[1, 2, 3], &[4]).await;
    // Writes still commit with the three voters (a learner is not in the quorum).
    cluster.put_acked(2, json!({"two": 2})).await;
    // The learner can be removed.
    let removed = verb(cluster.client(l), reqwest::Method::DELETE, "/cluster/members/4").await.unwrap();
    assert!(removed["action"].as_str().unwrap().contains("learner n4 removed"), "{removed}");
    wait_members(cluster.client(l), &[1, 2, 3], &[]).await;
    cluster.stop_all().await;
}
