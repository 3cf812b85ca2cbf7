//! The HTTP contract end to end against a node in-process: writes, reads, ranked lists, negatives,
//! idempotency, read-your-writes, restart persistence.

#![allow(clippy::unwrap_used)] // tests may unwrap; helpers outside #[test] are not covered by allow-unwrap-in-tests

mod common;

use common::{config, error_code, TestNode};
use reqwest::Method;
use serde_json::json;
use tidal_types::SignalIn;

fn signal(user: &str, item: u64, kind: &str) -> SignalIn {
    SignalIn { user: user.into(), item, kind: kind.into(), weight: None, ts: None }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_are_readable_and_survive_restart() {
    let dir = tempfile::tempdir().unwrap();
    let digest_before;
    let feed_before;
    {
        tracing::info!("phase 1: write items, embeddings, signals; read them back");
        let node = TestNode::start(config(dir.path(), 4)).await;
        let c = &node.client;
        let a = c.put_item(1, json!({"title": "one"}), None).await.unwrap();
        let b = c.put_item(2, json!({"title": "two"}), None).await.unwrap();
        assert!(b.seqno > a.seqno);
        c.put_embedding(1, vec![1.0, 0.0, 0.0, 0.0]).await.unwrap();
        c.put_embedding(2, vec![0.0, 1.0, 0.0, 0.0]).await.unwrap();
        c.put_embedding(3, vec![0.9, 0.1, 0.0, 0.0]).await.unwrap();
        let signals = vec![signal("alice", 1, "like"), signal("bob", 2, "click"), signal("bob", 1, "view")];
        let reply = c.post_signals(signals, None).await.unwrap();
        let item = c.get_item(1).await.unwrap();
        assert_eq!(item.metadata, json!({"title": "one"}));
        assert!(item.has_embedding);
        assert_eq!(item.seqno, a.seqno);

        let feed = c.feed("alice", 10).await.unwrap();
        assert!(feed.applied_seqno >= reply.seqno);
        let ids: Vec<u64> = feed.items.iter().map(|i| i.item).collect();
        assert!(!ids.contains(&1), "seen item 1 must be excluded: {ids:?}");
        assert_eq!(ids.first(), Some(&3), "item 3 is the closest unseen item to alice's profile: {ids:?}");

        let trending = c.trending(10).await.unwrap();
        assert_eq!(trending.items.first().map(|i| i.item), Some(1));

        let (status, similar) = node.request(Method::GET, "/v1/items/1/similar?limit=1", None, &[]).await;
        assert_eq!(status, 200);
        assert_eq!(similar["items"][0]["item"], 3);

        let (status, body) = node.request(Method::GET, "/v1/users/alice/feed?exclude=3,2", None, &[]).await;
        assert_eq!(status, 200);
        assert_eq!(body["items"].as_array().unwrap().len(), 0, "{body}");

        // `exact=true` (the scan, for audits) answers as the default does below the threshold;
        // anything but true or false is refused (decisions/067).
        let (status, exact) =
            node.request(Method::GET, "/v1/users/alice/feed?limit=10&exact=true", None, &[]).await;
        assert_eq!(status, 200);
        assert_eq!(exact["items"], serde_json::to_value(&feed.items).unwrap(), "{exact}");
        let (status, exact) =
            node.request(Method::GET, "/v1/items/1/similar?limit=1&exact=true", None, &[]).await;
        assert_eq!((status, &exact["items"][0]["item"]), (200, &json!(3)));
        for path in ["/v1/users/alice/feed?exact=yes", "/v1/items/1/similar?exact=1"] {
            let (status, body) = node.request(Method::GET, path, None, &[]).await;
            assert_eq!((status, error_code(&body)), (400, "invalid_argument"), "{path}");
        }

        let deleted = c.delete_item(2).await.unwrap();
        let (status, body) = node.request(Method::GET, "/v1/items/2", None, &[]).await;
        assert_eq!((status, error_code(&body)), (404, "not_found"));
        assert!(deleted.seqno > reply.seqno);

        digest_before = c.digest().await.unwrap();
        feed_before = c.feed("bob", 10).await.unwrap();
        node.stop().await;
        // A stopped node has let go of its data dir: nothing of it still runs in this process.
        let lock = std::fs::File::open(dir.path().join("LOCK")).unwrap();
        lock.try_lock().expect("the data dir lock is free once `run` has returned");
    }
    {
        tracing::info!("phase 2: restart on the same data dir: same digest, same feed, seqnos continue");
        let node = TestNode::start(config(dir.path(), 4)).await;
        let c = &node.client;
        assert_eq!(c.digest().await.unwrap(), digest_before);
        assert_eq!(c.feed("bob", 10).await.unwrap(), feed_before);
        let next = c.put_item(9, json!({}), None).await.unwrap();
        assert_eq!(next.seqno, digest_before.applied_seqno + 1);
        node.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_key_returns_the_first_result_and_refuses_reuse() {
    let dir = tempfile::tempdir().unwrap();
    let node = TestNode::start(config(dir.path(), 4)).await;
    let c = &node.client;
    let first = c.put_item(5, json!({"v": 1}), Some("key-1")).await.unwrap();
    let retry = c.put_item(5, json!({"v": 1}), Some("key-1")).await.unwrap();
    assert_eq!(first, retry);
    let status = c.status().await.unwrap();
    assert_eq!(status.applied_seqno, first.seqno, "the retry wrote nothing");
    let err = c.put_item(5, json!({"v": 2}), Some("key-1")).await.unwrap_err();
    assert_eq!(err.code(), Some("idempotency_conflict"));

    tracing::info!("concurrent retries with one key write once");
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            c.post_signals(vec![signal("u", 1, "click")], Some("burst")).await.unwrap().seqno
        }));
    }
    let mut seqnos = Vec::new();
    for task in tasks {
        seqnos.push(task.await.unwrap());
    }
    seqnos.dedup();
    assert_eq!(seqnos.len(), 1, "{seqnos:?}");
    assert_eq!(c.status().await.unwrap().applied_seqno, seqnos[0]);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_seqno_waits_then_times_out_with_not_caught_up() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path(), 4);
    config.read_wait_ms_max = 200;
    let node = TestNode::start(config).await;
    let w = node.client.put_item(1, json!({}), None).await.unwrap();
    let (status, _) =
        node.request(Method::GET, &format!("/v1/items/1?min_seqno={}", w.seqno), None, &[]).await;
    assert_eq!(status, 200);
    let (status, body) =
        node.request(Method::GET, &format!("/v1/items/1?min_seqno={}", w.seqno + 100), None, &[]).await;
    assert_eq!((status, error_code(&body)), (504, "not_caught_up"));
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negatives_are_excluded_from_the_feed() {
    let dir = tempfile::tempdir().unwrap();
    let node = TestNode::start(config(dir.path(), 2)).await;
    let c = &node.client;
    c.put_embedding(1, vec![1.0, 0.0]).await.unwrap();
    c.put_embedding(2, vec![0.0, 1.0]).await.unwrap();
    let (status, body) =
        node.request(Method::POST, "/v1/users/carol/negatives", Some(r#"{"item":1}"#), &[]).await;
    assert_eq!((status, body["accepted"].as_bool()), (200, Some(true)));
    let feed = c.feed("carol", 10).await.unwrap();
    assert_eq!(feed.items.iter().map(|i| i.item).collect::<Vec<_>>(), vec![2]);
    let (_, body) = node.request(Method::GET, "/v1/users/carol/negatives", None, &[]).await;
    assert_eq!(body["items"], json!([1]));
    let (status, _) = node.request(Method::DELETE, "/v1/users/carol/negatives/1", None, &[]).await;
    assert_eq!(status, 200);
    let feed = c.feed("carol", 10).await.unwrap();
    assert_eq!(feed.items.len(), 2);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_metrics_status() {
    let dir = tempfile::tempdir().unwrap();
    let node = TestNode::start(config(dir.path(), 2)).await;
    node.client.put_item(1, json!({}), None).await.unwrap();
    let (status, _) = node.request(Method::GET, "/healthz", None, &[]).await;
    assert_eq!(status, 200);
    let (status, _) = node.request(Method::GET, "/readyz", None, &[]).await;
    assert_eq!(status, 200);
    let (status, body) = node.request(Method::GET, "/metrics", None, &[]).await;
    assert_eq!(status, 200);
    let text = body.as_str().unwrap();
    for name in [
        "tidal_wal_fsync_seconds_bucket",
        "tidal_applied_seqno",
        "tidal_writes_waiting",
        "tidal_http_requests_total",
        "tidal_wal_batches_total",
        "tidal_wal_drain_requests_bucket",
        "tidal_wal_gathers_total",
    ] {
        assert!(text.contains(name), "metrics lack {name}:\n{text}");
    }
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        assert!(line.starts_with("tidal_"), "metric not named tidal_*: {line}");
    }
    let status = node.client.status().await.unwrap();
    assert_eq!(status.role, "leader");
    assert_eq!(status.applied_seqno, 1);
    assert_eq!(status.durable_seqno, 1);
    node.stop().await;
}
