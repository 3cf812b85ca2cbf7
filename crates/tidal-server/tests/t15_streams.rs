//! Streams over HTTP on one node: publish, read, consumers, trim, the list, subscriptions, bad
//! input refused with a code and nothing written, and everything kept across a restart.

#![allow(clippy::unwrap_used)]

mod common;

use common::{config, error_code, TestNode};
use reqwest::Method;
use serde_json::json;
use tidal_client::{Delivery, Publish};

fn one(payload: serde_json::Value, key: Option<&str>) -> Publish {
    Publish { payload, key: key.map(str::to_owned) }
}

fn offsets(events: &tidal_types::StreamEvents) -> Vec<u64> {
    events.events.iter().map(|event| event.offset).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_read_consume_trim_and_restart() {
    common::trace();
    let dir = tempfile::tempdir().unwrap();
    let node = TestNode::start(config(dir.path(), 4)).await;
    let c = &node.client;
    let item = c.put_item(1, json!({}), None).await.unwrap();
    let first = c.publish("orders", &[one(json!({"id": 1}), None)], None).await.unwrap();
    assert_eq!(first.offsets, [item.seqno + 1], "the offset is the seqno");
    let batch = [one(json!([1, 2]), Some("eu")), one(json!("text"), None), one(json!(3.5), Some("eu"))];
    let many = c.publish("orders", &batch, None).await.unwrap();
    assert_eq!(many.offsets, [first.seqno + 1, first.seqno + 2, first.seqno + 3]);
    assert_eq!(many.seqno, first.seqno + 3);
    // The single-event body form, with whitespace the node drops.
    let (status, body) = node
        .request(
            Method::POST,
            "/v1/streams/orders/events",
            Some("{ \"payload\" : { \"a\" : [ 1 , 2 ] } }"),
            &[],
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let last = body["offsets"][0].as_u64().unwrap();

    let read = c.read_stream("orders", 0, 100).await.unwrap();
    assert_eq!(offsets(&read), [first.offsets[0], many.offsets[0], many.offsets[1], many.offsets[2], last]);
    assert_eq!(read.events[1].key.as_deref(), Some("eu"));
    assert_eq!(read.events[2].key, None);
    assert_eq!(read.events[1].payload, json!([1, 2]));
    assert_eq!(read.events[4].payload, json!({"a": [1, 2]}));
    assert_eq!(read.events[0].stream, "orders");
    assert!(read.events.windows(2).all(|w| w[0].created_at <= w[1].created_at));
    assert!(read.applied_seqno >= last);
    assert_eq!(offsets(&c.read_stream("orders", many.offsets[0], 2).await.unwrap()), many.offsets[1..]);

    // Consumers: saved monotonically, read from, listed.
    assert_eq!(c.save_offset("orders", "billing", many.offsets[1]).await.unwrap().offset, many.offsets[1]);
    assert_eq!(c.save_offset("orders", "billing", 1).await.unwrap().offset, many.offsets[1], "no going back");
    assert_eq!(c.get_offset("orders", "billing").await.unwrap().offset, many.offsets[1]);
    assert_eq!(offsets(&c.read_consumer("orders", "billing", 10).await.unwrap()), [many.offsets[2], last]);
    let past = c.save_offset("orders", "billing", last + 1).await.unwrap_err();
    assert_eq!(past.code(), Some("invalid_offset"));
    assert_eq!(c.get_offset("orders", "nobody").await.unwrap_err().code(), Some("not_found"));
    // A name that needs escaping reaches the same consumer through the path and the query.
    c.save_offset("orders", "bill ing/ü", many.offsets[2]).await.unwrap();
    assert_eq!(offsets(&c.read_consumer("orders", "bill ing/ü", 10).await.unwrap()), [last]);

    // Trim at the exact boundary: survivors keep their offsets; a consumer below stays.
    c.save_offset("orders", "slow", first.offsets[0]).await.unwrap();
    let trimmed = c.trim("orders", many.offsets[1]).await.unwrap();
    assert_eq!(trimmed.horizon, many.offsets[1]);
    assert_eq!(offsets(&c.read_stream("orders", 0, 100).await.unwrap()), [many.offsets[2], last]);
    assert_eq!(offsets(&c.read_consumer("orders", "slow", 100).await.unwrap()), [many.offsets[2], last]);
    assert_eq!(c.get_offset("orders", "slow").await.unwrap().offset, first.offsets[0]);
    assert_eq!(c.trim("nothing-here", 5).await.unwrap_err().code(), Some("not_found"));

    let list = c.streams("", 10).await.unwrap();
    assert_eq!(list.streams.len(), 1);
    let view = &list.streams[0];
    assert_eq!((view.first_offset, view.last_offset, view.events), (Some(many.offsets[2]), last, 2));
    let names: Vec<&str> = view.consumers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["bill ing/ü", "billing", "slow"]);

    let (_, metrics) = node.request(Method::GET, "/metrics", None, &[]).await;
    let metrics = metrics.as_str().unwrap().to_string();
    assert!(metrics.contains("tidal_stream_events{stream=\"orders\"} 2"), "{metrics}");

    let digest = c.digest().await.unwrap();
    node.stop().await;
    let node = TestNode::start(config(dir.path(), 4)).await;
    let c = &node.client;
    assert_eq!(c.digest().await.unwrap().digest, digest.digest, "a restart keeps the streams");
    assert_eq!(offsets(&c.read_stream("orders", 0, 100).await.unwrap()), [many.offsets[2], last]);
    assert_eq!(c.get_offset("orders", "billing").await.unwrap().offset, many.offsets[1]);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_publish_answers_the_first_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let node = TestNode::start(config(dir.path(), 4)).await;
    let events = [one(json!(1), None), one(json!(2), None)];
    let a = node.client.publish("s", &events, Some("pub-1")).await.unwrap();
    let b = node.client.publish("s", &events, Some("pub-1")).await.unwrap();
    assert_eq!(a, b);
    assert_eq!(node.client.read_stream("s", 0, 10).await.unwrap().events.len(), 2, "written once");
    let other = [one(json!(3), None)];
    let conflict = node.client.publish("s", &other, Some("pub-1")).await.unwrap_err();
    assert_eq!(conflict.code(), Some("idempotency_conflict"));
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_stream_input_is_refused_with_a_code_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path(), 4);
    config.stream_event_bytes_max = 64;
    config.stream_events_per_request_max = 3;
    let node = TestNode::start(config).await;
    node.client.publish("s", &[one(json!(0), None)], None).await.unwrap();
    let before = node.client.digest().await.unwrap();
    let post = "/v1/streams/s/events";
    let long = "x".repeat(256);
    let cases: Vec<(Method, String, Option<String>, u16, &str)> = vec![
        (Method::POST, post.into(), Some("{\"payload\":1,\"key\":\"\"}".into()), 400, "invalid_name"),
        (Method::POST, post.into(), Some("{\"payload\":null}".into()), 400, "invalid_argument"),
        (Method::POST, post.into(), Some("{}".into()), 400, "invalid_argument"),
        (Method::POST, post.into(), Some("{\"events\":[]}".into()), 400, "invalid_argument"),
        (Method::POST, post.into(), Some("{\"payload\":1,\"events\":[]}".into()), 400, "invalid_argument"),
        (Method::POST, post.into(), Some("{\"payload\":1,\"extra\":2}".into()), 400, "invalid_argument"),
        (Method::POST, post.into(), Some("{\"payload\":".into()), 400, "malformed_json"),
        (
            Method::POST,
            post.into(),
            Some("{\"events\":[{\"payload\":1},{\"payload\":1,\"key\":\"\"}]}".into()),
            400,
            "invalid_name",
        ),
        (
            Method::POST,
            post.into(),
            Some(format!("{{\"payload\":\"{}\"}}", "y".repeat(100))),
            413,
            "payload_too_large",
        ),
        (
            Method::POST,
            post.into(),
            Some("{\"events\":[{\"payload\":1},{\"payload\":1},{\"payload\":1},{\"payload\":1}]}".into()),
            413,
            "payload_too_large",
        ),
        (
            Method::POST,
            "/v1/streams/__tidal.x/events".into(),
            Some("{\"payload\":1}".into()),
            400,
            "invalid_name",
        ),
        (
            Method::POST,
            "/v1/streams/a%0Ab/events".into(),
            Some("{\"payload\":1}".into()),
            400,
            "invalid_name",
        ),
        (
            Method::POST,
            format!("/v1/streams/{long}/events"),
            Some("{\"payload\":1}".into()),
            400,
            "invalid_name",
        ),
        (Method::GET, "/v1/streams/s/events?limit=0".into(), None, 400, "invalid_argument"),
        (Method::GET, "/v1/streams/s/events?limit=10001".into(), None, 400, "invalid_argument"),
        (Method::GET, "/v1/streams/s/events?after=-1".into(), None, 400, "invalid_argument"),
        (Method::GET, "/v1/streams/s/events?after=1&consumer=c".into(), None, 400, "invalid_argument"),
        (Method::GET, "/v1/streams/s/events?consumer=%ZZ".into(), None, 400, "invalid_name"),
        (Method::GET, "/v1/streams/s/events?consumer=__tidal".into(), None, 400, "invalid_name"),
        (
            Method::PUT,
            "/v1/streams/s/consumers/c".into(),
            Some("{\"offset\":-1}".into()),
            400,
            "invalid_argument",
        ),
        (
            Method::PUT,
            "/v1/streams/s/consumers/c".into(),
            Some("{\"offset\":99999}".into()),
            400,
            "invalid_offset",
        ),
        (
            Method::PUT,
            "/v1/streams/s/consumers/__tidal".into(),
            Some("{\"offset\":0}".into()),
            400,
            "invalid_name",
        ),
        (
            Method::POST,
            "/v1/streams/s/trim".into(),
            Some("{\"through\":\"3\"}".into()),
            400,
            "invalid_argument",
        ),
        (
            Method::GET,
            "/v1/streams/s/subscribe?consistency=linearizable".into(),
            None,
            400,
            "invalid_argument",
        ),
    ];
    for (method, path, body, status, code) in cases {
        let (got, reply) = node.request(method.clone(), &path, body.as_deref(), &[]).await;
        assert_eq!((got, error_code(&reply)), (status, code), "{method} {path} {body:?}: {reply}");
    }
    assert_eq!(node.client.digest().await.unwrap(), before, "nothing was written");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_sees_every_event_in_order_resumes_and_ends_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let node = TestNode::start(config(dir.path(), 4)).await;
    let c = &node.client;
    let before = c.publish("live", &[one(json!("old"), None)], None).await.unwrap();
    let mut sub = c.subscribe("live", 0).await.unwrap();
    let mut published = before.offsets.clone();
    for round in 0..20u64 {
        let events: Vec<Publish> =
            (0..=round % 3).map(|i| one(json!({"round": round, "i": i}), None)).collect();
        published.extend(c.publish("live", &events, None).await.unwrap().offsets);
        // Other streams' writes wake the subscriber too: harmless.
        c.publish("noise", &[one(json!(round), None)], None).await.unwrap();
    }
    let mut seen = Vec::new();
    while seen.len() < published.len() {
        match sub.next().await.unwrap() {
            Some(Delivery::Event(event)) => {
                assert_eq!(event.stream, "live");
                seen.push(event.offset);
            }
            other => panic!("the subscription ended early: {other:?}"),
        }
    }
    assert_eq!(seen, published, "every event once, in offset order");
    // Resume after the 10th event: exactly the rest.
    let mut resumed = c.subscribe("live", published[9]).await.unwrap();
    let mut rest = Vec::new();
    while rest.len() < published.len() - 10 {
        if let Some(Delivery::Event(event)) = resumed.next().await.unwrap() {
            rest.push(event.offset);
        }
    }
    assert_eq!(rest, published[10..]);
    // A subscriber behind a trim resumes at the first survivor.
    c.trim("live", published[14]).await.unwrap();
    let mut behind = c.subscribe("live", 0).await.unwrap();
    match behind.next().await.unwrap() {
        Some(Delivery::Event(event)) => assert_eq!(event.offset, published[15]),
        other => panic!("{other:?}"),
    }
    let (_, metrics) = node.request(Method::GET, "/metrics", None, &[]).await;
    assert!(metrics.as_str().unwrap().contains("tidal_stream_subscribers 3"), "{metrics}");
    // The stop ends every subscription with its last word. The first subscriber, live through the
    // trim, got nothing from it: a trim is not an event.
    let stopping = tokio::spawn(node.stop());
    let mut after_trim = Vec::new();
    while let Some(delivery) = sub.next().await.unwrap() {
        after_trim.push(delivery);
    }
    match after_trim.as_slice() {
        [Delivery::Ended { reason, data }] => {
            assert_eq!(reason, "closing");
            assert_eq!(data["last_offset"], json!(published.last().unwrap()));
        }
        other => panic!("after the trim: {other:?}"),
    }
    stopping.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tx_writes_all_its_ops_as_one_batch_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let node = TestNode::start(config(dir.path(), 4)).await;
    let c = &node.client;
    c.publish("orders", &[one(json!("first"), None)], None).await.unwrap();
    let ops = [
        json!({"op": "put_item", "item": 7, "metadata": {"title": "seven"}}),
        json!({"op": "put_embedding", "item": 7, "vector": [1.0, 0.0, 0.0, 0.0]}),
        json!({"op": "signals", "signals": [{"user": "u1", "item": 7, "kind": "click"}]}),
        json!({"op": "publish", "stream": "orders", "payload": {"item": 7, "change": "created"}, "key": "7"}),
        json!({"op": "save_offset", "stream": "orders", "consumer": "indexer", "offset": 1}),
        json!({"op": "publish", "stream": "audit", "payload": 7}),
        json!({"op": "delete_item", "item": 99}),
    ];
    let reply = c.tx(&ops, Some("tx-1")).await.unwrap();
    // Seqnos: put_item, embedding, 1 signal, publish, save, publish, delete: 7, ending at `seqno`.
    assert_eq!(reply.offsets, [reply.seqno - 3, reply.seqno - 1]);
    assert_eq!(c.tx(&ops, Some("tx-1")).await.unwrap(), reply, "an idempotent retry answers the first");
    let item = c.get_item(7).await.unwrap();
    assert_eq!((item.seqno, item.has_embedding), (reply.seqno - 6, true));
    let orders = c.read_stream("orders", 0, 10).await.unwrap();
    assert_eq!(orders.events.last().unwrap().offset, reply.offsets[0]);
    assert_eq!(orders.events.last().unwrap().key.as_deref(), Some("7"));
    assert_eq!(c.read_stream("audit", 0, 10).await.unwrap().events[0].offset, reply.offsets[1]);
    assert_eq!(c.get_offset("orders", "indexer").await.unwrap().offset, 1);
    assert_eq!(
        c.trending(1).await.unwrap().items[0].item,
        7,
        "the signal folded after the put in the same tx"
    );

    let before = c.digest().await.unwrap();
    let bad = [
        (
            json!([{"op": "put_item", "item": 8, "metadata": {}}, {"op": "signals", "signals": [{"user": "u", "item": 8, "kind": "nope"}]}]),
            "unknown_signal_kind",
        ),
        (
            json!([{"op": "put_item", "item": 8, "metadata": {}}, {"op": "put_embedding", "item": 8, "vector": [1.0]}]),
            "dimension_mismatch",
        ),
        (json!([{"op": "publish", "stream": "s", "payload": 1, "key": ""}]), "invalid_name"),
        (json!([{"op": "publish", "stream": "s", "payload": null}]), "invalid_argument"),
        (
            json!([{"op": "save_offset", "stream": "orders", "consumer": "c", "offset": 999999}]),
            "invalid_offset",
        ),
        (json!([{"op": "drop_table"}]), "invalid_argument"),
        (json!([{"item": 1}]), "invalid_argument"),
        (json!([{"op": "delete_item", "item": 1, "extra": true}]), "invalid_argument"),
        (json!([]), "invalid_argument"),
    ];
    for (ops, code) in bad {
        let body = json!({ "ops": ops }).to_string();
        let (status, reply) = node.request(Method::POST, "/v1/tx", Some(&body), &[]).await;
        assert_eq!((status, error_code(&reply)), (400, code), "{ops}: {reply}");
    }
    let too_many = json!({ "ops": vec![json!({"op": "delete_item", "item": 1}); 1001] }).to_string();
    let (status, reply) = node.request(Method::POST, "/v1/tx", Some(&too_many), &[]).await;
    assert_eq!((status, error_code(&reply)), (413, "payload_too_large"), "{reply}");
    assert_eq!(c.digest().await.unwrap(), before, "a refused tx wrote nothing");
    assert!(c.get_item(8).await.is_err());
    node.stop().await;
}

/// Polls `stream`'s event count on `node` until `done` says so; panics after 30 s.
async fn wait_for_events(node: &TestNode, stream: &str, done: impl Fn(u64) -> bool) -> u64 {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let list = node.client.streams("", 100).await.unwrap();
        let events = list.streams.iter().find(|s| s.stream == stream).map_or(0, |s| s.events);
        if done(events) {
            return events;
        }
        assert!(tokio::time::Instant::now() < deadline, "{stream} still holds {events} events");
        // Poll step of a wait on observable state (the deadline bounds it).
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_trims_through_the_log_to_the_configured_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path(), 4);
    config.stream_retention_events_max = Some(3);
    config.stream_retention_interval_ms = 100;
    let node = TestNode::start(config).await;
    let events: Vec<Publish> = (0..10).map(|n| one(json!(n), None)).collect();
    let published = node.client.publish("capped", &events, None).await.unwrap();
    wait_for_events(&node, "capped", |events| events == 3).await;
    let left = node.client.read_stream("capped", 0, 10).await.unwrap();
    assert_eq!(offsets(&left), published.offsets[7..], "the newest three stay, with their offsets");
    node.stop().await;

    let dir = tempfile::tempdir().unwrap();
    let mut config = common::config(dir.path(), 4);
    config.stream_retention_age_s = Some(0);
    config.stream_retention_interval_ms = 100;
    let node = TestNode::start(config).await;
    node.client.publish("aged", &[one(json!(1), None)], None).await.unwrap();
    // Anything created before the current second is past an age of 0 s.
    wait_for_events(&node, "aged", |events| events == 0).await;
    node.stop().await;
}
