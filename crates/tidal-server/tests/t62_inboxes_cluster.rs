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

/// Senders on all three nodes at once (two of them forwarding) into one topic: every message is
/// delivered once, and each sender's messages in the order it sent them. A discard racing a
/// receive for the same message: exactly one of them gets it, every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_senders_on_every_node_and_a_discard_racing_a_receive() {
    common::trace();
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(root.path(), 3, Durability::Quorum, |_| {});
    cluster.start_all().await;
    let l = cluster.leader().await;
    const PER_SENDER: u64 = 20;
    let senders = (0..3).map(|node| {
        let client = cluster.client(node).clone();
        tokio::spawn(async move {
            for i in 0..PER_SENDER {
                let body = json!({"topic": "jobs", "payload": {"node": node, "i": i}, "message_id": format!("n{node}-{i}")});
                retrying(|| client.json::<Value, InboxSent>(Method::POST, "/v1/inboxes/o/messages", Some(&body))).await;
            }
        })
    });
    for sender in senders.collect::<Vec<_>>() {
        sender.await.unwrap();
    }
    let client = cluster.client(l).clone();
    let body = json!({"topics": ["jobs"], "receive_id": "all", "max": 1000});
    let all: InboxReceived =
        retrying(|| client.json::<Value, InboxReceived>(Method::POST, "/v1/inboxes/o/receive", Some(&body)))
            .await;
    let messages = all.messages.unwrap();
    assert_eq!(messages.len() as u64, 3 * PER_SENDER, "every message once");
    assert!(messages.windows(2).all(|w| w[0].inbox_seq < w[1].inbox_seq));
    for node in 0..3u64 {
        let order: Vec<u64> = messages
            .iter()
            .filter(|m| m.payload["node"] == node)
            .map(|m| m.payload["i"].as_u64().unwrap())
            .collect();
        assert_eq!(order, (0..PER_SENDER).collect::<Vec<_>>(), "node {node}'s sends in its order");
    }

    let followers = cluster.followers_of(l);
    for round in 0..10 {
        let id = format!("race-{round}");
        let body = json!({"topic": "race", "payload": round, "message_id": id});
        retrying(|| client.json::<Value, InboxSent>(Method::POST, "/v1/inboxes/o/messages", Some(&body)))
            .await;
        let http = reqwest::Client::new();
        let receive_url = format!("{}/v1/inboxes/o/receive", cluster.client(followers[round % 2]).base());
        let discard_url = format!("{}/v1/inboxes/o/discard", client.base());
        let receive = json!({"topics": ["race"], "receive_id": id, "wait_ms": 0});
        let discard = json!({"topic": "race", "through": u64::MAX});
        let (received, discarded) = tokio::join!(
            http.post(receive_url).json(&receive).send(),
            http.post(discard_url).json(&discard).send(),
        );
        let got = received.unwrap().status().as_u16() == 200;
        let dropped: Value = discarded.unwrap().json().await.unwrap();
        assert_eq!(u64::from(got) + dropped["discarded"].as_u64().unwrap(), 1, "round {round}: {dropped}");
    }
    cluster.stop_all().await;
}
