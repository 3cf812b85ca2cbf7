//! Inboxes on a 3-node cluster: sends through the leader and through a follower land in one order,
//! a resend is a duplicate on every node and across a failover, a receive made on a follower is
//! served by the leader, and a receive retried with its id after the leader stopped is answered
//! by the new leader with the same message; the digests agree.

#![allow(clippy::unwrap_used)]

mod common;

use common::cluster::{retrying, same, Cluster};
use reqwest::Method;
use serde_json::{json, Value};
use tidal_cluster::Durability;
use tidal_types::{InboxReceived, InboxSent};

async fn send(cluster: &Cluster, via: usize, id: &str) -> InboxSent {
    let client = cluster.client(via).clone();
    let body = json!({"topic": "jobs", "payload": {"id": id}, "message_id": id});
    retrying(|| client.json::<Value, InboxSent>(Method::POST, "/v1/inboxes/o/messages", Some(&body))).await
}

async fn receive(cluster: &Cluster, via: usize, receive_id: &str) -> InboxReceived {
    let client = cluster.client(via).clone();
    let body = json!({"topics": ["jobs"], "receive_id": receive_id, "wait_ms": 5_000});
    retrying(|| client.json::<Value, InboxReceived>(Method::POST, "/v1/inboxes/o/receive", Some(&body))).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_order_on_every_node_and_a_receive_retried_across_a_failover() {
    common::trace();
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(root.path(), 3, Durability::Quorum, |_| {});
    cluster.start_all().await;
    let l = cluster.leader().await;
    let followers = cluster.followers_of(l);
    let (f1, f2) = (followers[0], followers[1]);
    let mut sent = Vec::new();
    for (i, id) in ["m0", "m1", "m2", "m3"].iter().enumerate() {
        let reply = send(&cluster, if i % 2 == 0 { l } else { f2 }, id).await;
        assert!(!reply.duplicate);
        sent.push(reply.inbox_seq);
    }
    assert!(sent.windows(2).all(|w| w[0] < w[1]));
    let resent = send(&cluster, f1, "m1").await;
    assert_eq!((resent.inbox_seq, resent.duplicate), (sent[1], true));

    // A receive on a follower is forwarded; its consumption is applied before the answer.
    let first = receive(&cluster, f1, "r1").await;
    assert_eq!((first.message.inbox_seq, first.message.message_id.as_str()), (sent[0], "m0"));
    let digests = cluster.digests_at(first.seqno).await;
    assert!(same(&digests), "replicas differ: {digests:?}");

    tracing::info!("the leader stops; the receive is retried with its id");
    cluster.stop(l).await;
    let new_leader = cluster.leader().await;
    let again = receive(&cluster, f2, "r1").await;
    assert_eq!(again.message, first.message, "the retry is answered with what the first attempt took");
    let resent = send(&cluster, new_leader, "m2").await;
    assert_eq!((resent.inbox_seq, resent.duplicate), (sent[2], true), "dedupe survives the failover");
    let mut order = Vec::new();
    for id in ["r2", "r3", "r4"] {
        order.push(receive(&cluster, f1, id).await.message.inbox_seq);
    }
    assert_eq!(order, sent[1..], "FIFO across the failover");

    cluster.start(l).await;
    let last = send(&cluster, new_leader, "m4").await;
    let digests = cluster.digests_at(last.inbox_seq).await;
    assert!(same(&digests), "replicas differ after the failover: {digests:?}");
    cluster.stop_all().await;
}
