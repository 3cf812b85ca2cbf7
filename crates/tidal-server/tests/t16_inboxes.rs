//! Inboxes over HTTP on one node: send and resend, receive (now, parked, retried), leases and
//! acks, per-topic caps, discard, close, show, tokens that may not, and a restart.

#![allow(clippy::unwrap_used)]

mod common;

use common::{config, error_code, TestNode};
use reqwest::Method;
use serde_json::{json, Value};

async fn post(node: &TestNode, path: &str, body: Value) -> (u16, Value) {
    node.request(Method::POST, path, Some(&body.to_string()), &[]).await
}

async fn send(node: &TestNode, topic: &str, id: &str, payload: Value) -> (u16, Value) {
    post(node, "/v1/inboxes/o/messages", json!({"topic": topic, "payload": payload, "message_id": id})).await
}

async fn receive(node: &TestNode, body: Value) -> (u16, Value) {
    post(node, "/v1/inboxes/o/receive", body).await
}

async fn metric(node: &TestNode, name: &str) -> f64 {
    let text = node.http.get(format!("{}/metrics", node.url)).send().await.unwrap().text().await.unwrap();
    let line = text.lines().find(|line| line.starts_with(&format!("{name} "))).unwrap();
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_receive_resend_and_a_parked_receiver_woken_once() {
    common::trace();
    let dir = tempfile::tempdir().unwrap();
    let node = TestNode::start(config(dir.path(), 4)).await;
    let (status, first) = send(&node, "a", "m1", json!({"n": 1.50})).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["duplicate"], false);
    let (_, again) = send(&node, "a", "m1", json!({"other": true})).await;
    assert_eq!(
        (again["inbox_seq"].clone(), again["duplicate"].clone()),
        (first["inbox_seq"].clone(), json!(true))
    );

    let (status, got) = receive(&node, json!({"topics": ["b", "a"], "receive_id": "r1"})).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["inbox_seq"], first["inbox_seq"]);
    assert_eq!((got["topic"].as_str(), got["message_id"].as_str()), (Some("a"), Some("m1")));
    assert_eq!(got["sender"], "anonymous");
    assert_eq!(got["receive_id"], "r1");
    assert_eq!(got["payload"], json!({"n": 1.50}));
    // The same receive retried is answered from its receipt; a new one finds nothing.
    assert_eq!(receive(&node, json!({"topics": ["a"], "receive_id": "r1"})).await.1, got);
    let (status, _) = receive(&node, json!({"topics": ["a"], "receive_id": "r2"})).await;
    assert_eq!(status, 204);
    let (_, resent) = send(&node, "a", "m1", json!(1)).await;
    assert_eq!(resent["duplicate"], true, "a resend after consumption is still a duplicate");

    // A receiver parked before the send is woken by it, once.
    let parks = metric(&node, "tidal_inbox_receive_parks_total").await;
    let wakes = metric(&node, "tidal_inbox_receive_wakes_total").await;
    let waiting = {
        let (url, http) = (node.url.clone(), node.http.clone());
        tokio::spawn(async move {
            let body = json!({"topics": ["a"], "receive_id": "r3", "wait_ms": 20_000}).to_string();
            let reply = http
                .post(format!("{url}/v1/inboxes/o/receive"))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            (reply.status().as_u16(), reply.json::<Value>().await.unwrap())
        })
    };
    while metric(&node, "tidal_inbox_receive_parks_total").await <= parks {
        tokio::task::yield_now().await;
    }
    let (_, sent) = send(&node, "a", "m2", json!("late")).await;
    let (status, woken) = waiting.await.unwrap();
    assert_eq!((status, woken["inbox_seq"].clone()), (200, sent["inbox_seq"].clone()));
    assert_eq!(metric(&node, "tidal_inbox_receive_wakes_total").await, wakes + 1.0);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_batches_caps_discard_close_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), 4);
    (cfg.inbox.backlog_max, cfg.inbox.topics_max) = (3, 2);
    let node = TestNode::start(cfg.clone()).await;

    // A lease not acked in time goes to the next receive, which waits for it; the late ack loses.
    send(&node, "jobs", "j1", json!(1)).await;
    let (status, held) =
        receive(&node, json!({"topics": ["jobs"], "receive_id": "l1", "lease_ms": 300})).await;
    assert_eq!(status, 200, "{held}");
    assert!(held["lease_until_ms"].as_u64().is_some());
    let (status, retaken) = receive(
        &node,
        json!({"topics": ["jobs"], "receive_id": "l2", "lease_ms": 60_000, "wait_ms": 10_000}),
    )
    .await;
    assert_eq!((status, retaken["inbox_seq"].clone()), (200, held["inbox_seq"].clone()));
    let (status, body) = post(&node, "/v1/inboxes/o/ack", json!({"receive_id": "l1"})).await;
    assert_eq!((status, error_code(&body)), (409, "lease_lost"));
    let (status, body) = post(&node, "/v1/inboxes/o/ack", json!({"receive_id": "l2"})).await;
    assert_eq!((status, body["acked"].clone()), (200, json!(1)));
    let (status, body) = post(&node, "/v1/inboxes/o/ack", json!({"receive_id": "never"})).await;
    assert_eq!((status, error_code(&body)), (404, "unknown_receive"));

    // Per-topic caps: the full topic refuses while another flows; a third live topic is refused.
    for id in ["h1", "h2", "h3"] {
        assert_eq!(send(&node, "hot", id, json!(id)).await.0, 200);
    }
    let (status, body) = send(&node, "hot", "h4", json!(4)).await;
    assert_eq!((status, error_code(&body)), (429, "inbox_full"));
    assert!(body["error"]["message"].as_str().unwrap().contains("hot"));
    assert_eq!(send(&node, "cold", "c1", json!(1)).await.0, 200);
    let (status, body) = send(&node, "third", "t1", json!(1)).await;
    assert_eq!((status, error_code(&body)), (429, "too_many_topics"));

    // A batch receive takes the oldest across its topics, in order.
    let (status, batch) =
        receive(&node, json!({"topics": ["cold", "hot"], "receive_id": "b1", "max": 2})).await;
    assert_eq!(status, 200, "{batch}");
    let ids: Vec<&str> =
        batch["messages"].as_array().unwrap().iter().map(|m| m["message_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["h1", "h2"]);

    let (status, shown) = node.request(Method::GET, "/v1/inboxes/o", None, &[]).await;
    assert_eq!(status, 200, "{shown}");
    let topics: Vec<(&str, u64)> = shown["topics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["topic"].as_str().unwrap(), t["backlog"].as_u64().unwrap()))
        .collect();
    assert_eq!(topics, [("cold", 1), ("hot", 1)]);
    assert_eq!(shown["consumed"], 3);

    let (status, dropped) =
        post(&node, "/v1/inboxes/o/discard", json!({"topic": "hot", "through": u64::MAX})).await;
    assert_eq!((status, dropped["discarded"].clone()), (200, json!(1)));
    let (status, closed) = node.request(Method::DELETE, "/v1/inboxes/o", None, &[]).await;
    assert_eq!(status, 200, "{closed}");
    assert_eq!(closed["unconsumed"], json!([{"topic": "cold", "count": 1}]));
    let (status, body) = send(&node, "cold", "c2", json!(2)).await;
    assert_eq!((status, error_code(&body)), (410, "inbox_closed"));
    let (status, body) = receive(&node, json!({"topics": ["cold"], "receive_id": "z"})).await;
    assert_eq!((status, error_code(&body)), (410, "inbox_closed"));
    let digest = node.client.digest().await.unwrap();
    node.stop().await;

    let node = TestNode::start(cfg).await;
    assert_eq!(node.client.digest().await.unwrap().digest, digest.digest);
    let (_, shown) = node.request(Method::GET, "/v1/inboxes/o", None, &[]).await;
    assert_eq!(shown["closed"], true);
    node.stop().await;
}

const TOKENS: &str = r#"
[[token]]
name = "agents-only"
token = "agents-only-token-0123"
scopes = ["read", "write"]
inbox_owners = ["agent-*"]

[[token]]
name = "worker"
token = "worker-token-012345678"
scopes = ["read", "receive"]

[[token]]
name = "ops"
token = "ops-token-0123456789abcd"
scopes = ["admin"]
"#;

/// A token may send only to the owners its patterns match, and receiving needs its own scope;
/// either refusal writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_reach_only_their_inboxes_and_refusals_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("tokens.toml");
    tidal_server::auth::write_private_file(&token_file, TOKENS.as_bytes()).unwrap();
    let mut cfg = config(&dir.path().join("data"), 2);
    cfg.token_file = Some(token_file);
    let node = TestNode::start(cfg).await;
    let agents = ("Authorization", "Bearer agents-only-token-0123");
    let worker = ("Authorization", "Bearer worker-token-012345678");
    let message = json!({"topic": "t", "payload": 1, "message_id": "m"}).to_string();
    let (status, body) =
        node.request(Method::POST, "/v1/inboxes/agent-1/messages", Some(&message), &[agents]).await;
    assert_eq!(status, 200, "{body}");
    let ops = ("Authorization", "Bearer ops-token-0123456789abcd");
    let before = node.request(Method::GET, "/cluster/status", None, &[ops]).await;
    let applied = |status: &Value| status["applied_seqno"].clone();
    let (status, body) =
        node.request(Method::POST, "/v1/inboxes/user-1/messages", Some(&message), &[agents]).await;
    assert_eq!((status, error_code(&body)), (403, "forbidden"));
    let receive = json!({"topics": ["t"], "receive_id": "r"}).to_string();
    let (status, body) =
        node.request(Method::POST, "/v1/inboxes/agent-1/receive", Some(&receive), &[agents]).await;
    assert_eq!((status, error_code(&body)), (403, "forbidden"));
    let (status, body) =
        node.request(Method::POST, "/v1/inboxes/agent-1/messages", Some(&message), &[worker]).await;
    assert_eq!((status, error_code(&body)), (403, "forbidden"));
    let (status, body) = node.request(Method::DELETE, "/v1/inboxes/agent-1", None, &[worker]).await;
    assert_eq!((status, error_code(&body)), (403, "forbidden"));
    let after = node.request(Method::GET, "/cluster/status", None, &[ops]).await;
    assert_eq!(applied(&before.1), applied(&after.1), "a refusal wrote something");
    let (status, got) =
        node.request(Method::POST, "/v1/inboxes/agent-1/receive", Some(&receive), &[worker]).await;
    assert_eq!((status, got["sender"].clone()), (200, json!("agents-only")));
    node.stop().await;
}

/// With a TTL, the leader drops messages older than it as logged discards; a topic whose TTL is 0
/// keeps its messages, and a resend of an expired message is still a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_expires_messages_past_their_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), 4);
    cfg.inbox.ttl_s = Some(1);
    cfg.inbox.topic_ttl_s.insert("keep".into(), 0);
    cfg.stream_retention_interval_ms = 100;
    let node = TestNode::start(cfg).await;
    let (_, first) = send(&node, "jobs", "j1", json!(1)).await;
    send(&node, "keep", "k1", json!(1)).await;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    let topics = loop {
        let (_, shown) = node.request(Method::GET, "/v1/inboxes/o", None, &[]).await;
        let topics: Vec<String> = shown["topics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["topic"].as_str().unwrap().to_string())
            .collect();
        if !topics.contains(&"jobs".to_string()) || tokio::time::Instant::now() > deadline {
            break topics;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(topics, ["keep"], "the expired topic drained, the one without a TTL did not");
    let (_, resent) = send(&node, "jobs", "j1", json!(1)).await;
    assert_eq!(
        (resent["inbox_seq"].clone(), resent["duplicate"].clone()),
        (first["inbox_seq"].clone(), json!(true))
    );
    node.stop().await;
}

/// The lost-wakeup interleavings, put at exact points of a receive by the receive probe: a send
/// applied after the receive registered but before it looked is taken by the look (no wait); a
/// send applied after it looked and found nothing but before it waits wakes it (one wake). With a
/// lost wakeup the receive would sleep its whole `wait_ms` (a minute) and the wake count would not
/// move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_at_either_step_of_a_receive_is_never_missed() {
    use tidal_server::http::inboxes::{ReceiveProbe, ReceiveStep};
    type Paused = (ReceiveStep, tokio::sync::oneshot::Sender<()>);
    for at in [ReceiveStep::Registered, ReceiveStep::FoundNothing] {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(dir.path(), 4);
        let (steps, mut paused) = tokio::sync::mpsc::unbounded_channel::<Paused>();
        let probe: ReceiveProbe = std::sync::Arc::new(move |step| {
            let steps = steps.clone();
            Box::pin(async move {
                let (resume, resumed) = tokio::sync::oneshot::channel();
                if steps.send((step, resume)).is_ok() {
                    let _ = resumed.await;
                }
            })
        });
        cfg.io.receive_probe = Some(probe);
        let node = TestNode::start(cfg).await;
        let (url, http) = (node.url.clone(), node.http.clone());
        let mut receiver = tokio::spawn(async move {
            let body = json!({"topics": ["a"], "receive_id": "r", "wait_ms": 60_000}).to_string();
            let reply = http
                .post(format!("{url}/v1/inboxes/o/receive"))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            (reply.status().as_u16(), reply.json::<Value>().await.unwrap())
        });
        let wakes = metric(&node, "tidal_inbox_receive_wakes_total").await;
        let mut sent = None;
        // A woken receive answers at once; a lost wakeup would keep it waiting its whole minute.
        let lost = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
        let (status, got) = loop {
            tokio::select! {
                step = paused.recv() => {
                    let (step, resume) = step.unwrap();
                    if step == at && sent.is_none() {
                        sent = Some(send(&node, "a", "m1", json!(1)).await.1["inbox_seq"].clone());
                    }
                    resume.send(()).unwrap();
                }
                answer = &mut receiver => break answer.unwrap(),
                () = tokio::time::sleep_until(lost) => panic!("{at:?}: the send did not wake the receive"),
            }
        };
        assert_eq!(status, 200, "{at:?}: {got}");
        assert_eq!(Some(got["inbox_seq"].clone()), sent, "{at:?}");
        let woken = metric(&node, "tidal_inbox_receive_wakes_total").await - wakes;
        let expected = if at == ReceiveStep::FoundNothing { 1.0 } else { 0.0 };
        assert_eq!(woken, expected, "{at:?}: wakes");
        node.stop().await;
    }
}
