//! Streams on a 3-node cluster: publishes through the leader and through a follower give the same
//! offsets and read order on every node; a subscriber on a follower sees every acknowledged event
//! once, in order, and after the leader is stopped resumes by its last id with no gap or
//! duplicate; consumer offsets and trims replicate and survive the failover; the digests agree.

#![allow(clippy::unwrap_used)]

mod common;

use common::cluster::{retrying, same, Cluster, DEADLINE};
use serde_json::json;
use tidal_client::{Delivery, Publish, Subscription};
use tidal_cluster::Durability;

fn events(round: u64, n: u64) -> Vec<Publish> {
    (0..n)
        .map(|i| Publish {
            payload: json!({"round": round, "i": i}),
            key: (i % 2 == 0).then(|| format!("k{round}")),
        })
        .collect()
}

/// Offsets and keys of `stream` as node `index` reads them once it applied `seqno`.
async fn read_all(cluster: &Cluster, index: usize, stream: &str, seqno: u64) -> Vec<(u64, Option<String>)> {
    let path = format!("/v1/streams/{stream}/events?after=0&limit=10000&min_seqno={seqno}");
    let read: tidal_types::StreamEvents =
        cluster.client(index).json::<(), _>(reqwest::Method::GET, &path, None).await.unwrap();
    read.events.into_iter().map(|event| (event.offset, event.key)).collect()
}

/// Reads `count` events from a subscription; panics on an early end.
async fn take(sub: &mut Subscription, count: usize) -> Vec<u64> {
    let mut offsets = Vec::new();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while offsets.len() < count {
        let next = tokio::time::timeout_at(deadline, sub.next()).await.expect("events within the deadline");
        match next {
            Ok(Some(Delivery::Event(event))) => offsets.push(event.offset),
            Ok(Some(Delivery::Ended { reason, .. })) => {
                panic!("subscription ended ({reason}) after {offsets:?}")
            }
            Ok(None) => panic!("subscription closed after {offsets:?}"),
            Err(error) => panic!("subscription failed after {offsets:?}: {error}"),
        }
    }
    offsets
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_holds_the_same_stream_and_a_follower_subscriber_survives_failover() {
    common::trace();
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(root.path(), 3, Durability::Quorum, |_| {});
    cluster.start_all().await;
    let l = cluster.leader().await;
    let followers = cluster.followers_of(l);
    let (f1, f2) = (followers[0], followers[1]);
    let mut sub = cluster.client(f1).subscribe("orders", 0).await.unwrap();
    let mut published = Vec::new();
    for round in 0..10u64 {
        // Every other publish goes through the second follower, which forwards it to the leader.
        let via = if round % 2 == 0 { l } else { f2 };
        let client = cluster.client(via).clone();
        let batch = events(round, 1 + round % 3);
        let key = format!("round-{round}");
        let reply = retrying(|| client.publish("orders", &batch, Some(&key))).await;
        published.extend(reply.offsets);
    }
    let last = *published.last().unwrap();
    retrying(|| cluster.client(l).save_offset("orders", "billing", published[3])).await;
    let trim = retrying(|| cluster.client(f2).trim("orders", published[1])).await;
    let reads = [
        read_all(&cluster, l, "orders", trim.seqno).await,
        read_all(&cluster, f1, "orders", trim.seqno).await,
        read_all(&cluster, f2, "orders", trim.seqno).await,
    ];
    assert_eq!(reads[0].iter().map(|(o, _)| *o).collect::<Vec<_>>(), published[2..]);
    assert!(reads.windows(2).all(|w| w[0] == w[1]), "nodes read differently: {reads:?}");
    assert_eq!(take(&mut sub, published.len()).await, published, "the follower's subscriber saw every event");
    let digests = cluster.digests_at(trim.seqno).await;
    assert!(same(&digests), "replicas differ: {digests:?}");

    tracing::info!("the leader stops; the follower's subscriber resumes by its last id");
    cluster.stop(l).await;
    let resume_from = sub.last_id();
    assert_eq!(resume_from, last);
    let new_leader = cluster.leader().await;
    let mut after = Vec::new();
    for round in 10..16u64 {
        let client = cluster.client(new_leader).clone();
        let batch = events(round, 2);
        let key = format!("round-{round}");
        after.extend(retrying(|| client.publish("orders", &batch, Some(&key))).await.offsets);
    }
    // The old subscription may have ended or may still run (its node did not stop): a resume by
    // last id from either gives exactly the new events.
    let mut resumed = cluster.client(f1).subscribe("orders", resume_from).await.unwrap();
    assert_eq!(take(&mut resumed, after.len()).await, after, "no gap, no duplicate across the failover");
    let billing = cluster.client(f2).get_offset("orders", "billing").await.unwrap();
    assert_eq!(billing.offset, published[3], "the consumer offset survived the failover");
    let list = cluster.client(new_leader).streams("", 10).await.unwrap();
    assert_eq!(list.streams[0].trimmed_through, published[1]);
    cluster.start(l).await;
    let last_write = retrying(|| cluster.client(new_leader).save_offset("orders", "billing", after[0])).await;
    let digests = cluster.digests_at(last_write.seqno.unwrap()).await;
    assert!(same(&digests), "replicas differ after the failover: {digests:?}");
    let old = read_all(&cluster, l, "orders", last_write.seqno.unwrap()).await;
    assert_eq!(old, read_all(&cluster, new_leader, "orders", last_write.seqno.unwrap()).await);
    cluster.stop_all().await;
}
