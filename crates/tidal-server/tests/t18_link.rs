//! The write link (`GET /v1/link`): writes on it are their HTTP routes' writes, it needs the write
//! scope, a malformed frame ends it with the reason, a follower refuses its writes, and a stopping
//! node closes it.

#![allow(clippy::unwrap_used)] // tests may unwrap; helpers outside #[test] are not covered by allow-unwrap-in-tests

mod common;

use common::cluster::Cluster;
use common::{config, error_code, TestNode};
use tidal_client::{Error, Link};
use tidal_types::link::{self, LinkOp, LinkRequest};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

fn refusal(error: &Error) -> (u16, &str) {
    match error {
        Error::Api { status, code, .. } => (*status, code.as_str()),
        other => panic!("a refusal expected, not {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_on_a_link_are_the_routes_writes() {
    let dir = tempfile::tempdir().unwrap();
    let node = TestNode::start(config(&dir.path().join("data"), 2)).await;
    let link = Link::connect(&node.url, None).await.unwrap();
    // Many writes at once on one link, each answered with its own seqno.
    let mut writes = tokio::task::JoinSet::new();
    for id in 1..=200u64 {
        let link = link.clone();
        writes.spawn(async move {
            let body = format!(r#"{{"metadata":{{"n":{id}}}}}"#);
            (id, link.put_item(id, body.as_bytes(), None).await.unwrap().seqno)
        });
    }
    let mut seqnos: Vec<u64> = writes.join_all().await.into_iter().map(|(_, seqno)| seqno).collect();
    seqnos.sort_unstable();
    seqnos.dedup();
    assert_eq!(seqnos.len(), 200, "every write its own seqno");
    assert_eq!(node.client.get_item(77).await.unwrap().metadata, serde_json::json!({"n": 77}));
    let signals = link
        .post_signals(br#"{"signals":[{"user":"u1","item":5,"kind":"click","weight":1.0}]}"#, None)
        .await
        .unwrap();
    assert!(signals.seqno > seqnos[199], "{} after {}", signals.seqno, seqnos[199]);
    let published = link.publish("orders", br#"{"payload":{"total":3}}"#, None).await.unwrap();
    assert_eq!(published.offsets, vec![published.seqno]);

    // A route's refusal is that write's answer; the link goes on.
    let bad = link.put_item(1, br#"{"metadata":"#, None).await.unwrap_err();
    assert_eq!(refusal(&bad).0, 400, "{bad}");
    let bad = link
        .post_signals(br#"{"signals":[{"user":"u1","item":5,"kind":"click","weight":1e400}]}"#, None)
        .await
        .unwrap_err();
    assert_eq!(refusal(&bad).0, 400, "{bad}");
    let bad = link.publish("", br#"{"payload":1}"#, None).await.unwrap_err();
    assert_eq!(refusal(&bad).0, 400, "{bad}");
    let bad = link.send(LinkOp::PutItem, "0x1", br#"{"metadata":{}}"#, None).await.unwrap_err();
    assert_eq!(refusal(&bad), (400, "invalid_argument"), "{bad}");
    let bad = link.send(LinkOp::PostSignals, "extra", br#"{"signals":[]}"#, None).await.unwrap_err();
    assert_eq!(refusal(&bad), (400, "invalid_argument"), "{bad}");

    // Idempotency keys as on HTTP: a retry returns the first seqno; a key a header could not carry
    // is refused.
    let first = link.put_item(500, br#"{"metadata":{}}"#, Some("key-500")).await.unwrap();
    let again = link.put_item(500, br#"{"metadata":{}}"#, Some("key-500")).await.unwrap();
    assert_eq!(first.seqno, again.seqno);
    let bad = link.put_item(501, br#"{"metadata":{}}"#, Some("bad\nkey")).await.unwrap_err();
    assert_eq!(refusal(&bad), (400, "invalid_argument"), "{bad}");
    assert!(link.put_item(502, br#"{"metadata":{}}"#, None).await.is_ok(), "the link goes on");

    // The link's writes are counted under their routes.
    let (_, metrics) = node.request(reqwest::Method::GET, "/metrics", None, &[]).await;
    let metrics = metrics.as_str().unwrap();
    let puts = r#"tidal_http_requests_total{method="PUT",route="/v1/items/{id}",status="200"} 203"#;
    assert!(metrics.lines().any(|line| line == puts), "{metrics}");

    // A plain GET, without the upgrade, is told what the route expects.
    let (status, body) = node.request(reqwest::Method::GET, link::LINK_PATH, None, &[]).await;
    assert_eq!((status, error_code(&body)), (400, "invalid_argument"), "{body}");

    // A stopping node closes its links: a write after that fails, it does not hang.
    node.stop().await;
    let closed = link.put_item(503, br#"{"metadata":{}}"#, None).await.unwrap_err();
    assert!(matches!(closed, Error::Link(_)), "{closed}");
}

const TOKENS: &str = r#"
[[token]]
name = "reader"
token = "reader-token-0123456789"
scopes = ["read"]

[[token]]
name = "writer"
token = "writer-token-0123456789"
scopes = ["read", "write"]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_needs_the_write_scope() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("tokens.toml");
    tidal_server::auth::write_private_file(&token_file, TOKENS.as_bytes()).unwrap();
    let mut config = config(&dir.path().join("data"), 2);
    config.token_file = Some(token_file);
    let node = TestNode::start(config).await;
    let none = Link::connect(&node.url, None).await.err().unwrap();
    assert_eq!(refusal(&none), (401, "unauthorized"), "{none}");
    let reader = Link::connect(&node.url, Some("reader-token-0123456789")).await.err().unwrap();
    assert_eq!(refusal(&reader), (403, "forbidden"), "{reader}");
    let writer = Link::connect(&node.url, Some("writer-token-0123456789")).await.unwrap();
    let written = writer.put_item(1, br#"{"metadata":{}}"#, None).await.unwrap();
    assert!(written.seqno >= 1);
    node.stop().await;
}

/// Upgrades a raw connection to a link by hand.
async fn raw_link(url: &str) -> BufReader<tokio::net::TcpStream> {
    let authority = url.strip_prefix("http://").unwrap();
    let mut stream = BufReader::new(tokio::net::TcpStream::connect(authority).await.unwrap());
    let head = format!(
        "GET {} HTTP/1.1\r\nHost: {authority}\r\nConnection: Upgrade\r\nUpgrade: {}\r\n\r\n",
        link::LINK_PATH,
        link::LINK_PROTOCOL
    );
    stream.get_mut().write_all(head.as_bytes()).await.unwrap();
    let mut answer = String::new();
    while !answer.ends_with("\r\n\r\n") {
        assert!(stream.read_line(&mut answer).await.unwrap() > 0, "closed during the upgrade: {answer}");
    }
    assert!(answer.starts_with("HTTP/1.1 101"), "{answer}");
    stream
}

/// Reads the link's next reply: id, status and body as JSON.
async fn next_reply(stream: &mut BufReader<tokio::net::TcpStream>) -> (u64, u16, serde_json::Value) {
    let mut prefix = [0u8; 4];
    stream.read_exact(&mut prefix).await.unwrap();
    let mut frame = vec![0; link::frame_length(prefix, 1 << 20).unwrap()];
    stream.read_exact(&mut frame).await.unwrap();
    let reply = link::decode_reply(&frame).unwrap();
    (reply.id, reply.status, serde_json::from_slice(reply.body).unwrap())
}

/// Whether the node closed the connection (EOF; no more replies).
async fn closed(stream: &mut BufReader<tokio::net::TcpStream>) -> bool {
    let mut byte = [0u8; 1];
    matches!(stream.read(&mut byte).await, Ok(0) | Err(_))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_frame_ends_the_link_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let node = TestNode::start(config(&dir.path().join("data"), 2)).await;

    // An op no route has: a good write before it is answered, then the node's reply (id 0) and EOF.
    let mut stream = raw_link(&node.url).await;
    let mut frames = Vec::new();
    let good = LinkRequest {
        id: 1,
        op: LinkOp::PutItem,
        idempotency_key: None,
        argument: "9",
        body: br#"{"metadata":{}}"#,
    };
    link::encode_request(&good, &mut frames);
    let start = frames.len();
    link::encode_request(&LinkRequest { id: 2, ..good.clone() }, &mut frames);
    frames[start + 4 + 8] = 99;
    stream.get_mut().write_all(&frames).await.unwrap();
    let mut replies = vec![next_reply(&mut stream).await, next_reply(&mut stream).await];
    replies.sort_by_key(|(id, _, _)| std::cmp::Reverse(*id));
    assert_eq!((replies[0].0, replies[0].1), (1, 200), "{replies:?}");
    assert_eq!((replies[1].0, replies[1].1), (link::NODE_REPLY_ID, 400), "{replies:?}");
    assert!(replies[1].2["error"]["message"].as_str().unwrap().contains("unknown link op 99"), "{replies:?}");
    assert!(closed(&mut stream).await);

    // A length over the bound is refused before its bytes are read or held.
    let mut stream = raw_link(&node.url).await;
    stream.get_mut().write_all(&u32::MAX.to_be_bytes()).await.unwrap();
    let (id, status, body) = next_reply(&mut stream).await;
    assert_eq!((id, status), (link::NODE_REPLY_ID, 400), "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("a link frame of 4294967295 bytes"),
        "{body}"
    );
    assert!(closed(&mut stream).await);

    // Request id 0 is the node's own.
    let mut stream = raw_link(&node.url).await;
    let mut frame = Vec::new();
    link::encode_request(&LinkRequest { id: 0, ..good.clone() }, &mut frame);
    stream.get_mut().write_all(&frame).await.unwrap();
    assert_eq!(next_reply(&mut stream).await.0, link::NODE_REPLY_ID);
    assert!(closed(&mut stream).await);

    // A frame cut short by the client's close: the link ends, nothing is written, the node serves on.
    let mut stream = raw_link(&node.url).await;
    let mut frame = Vec::new();
    link::encode_request(&LinkRequest { argument: "10", ..good.clone() }, &mut frame);
    stream.get_mut().write_all(&frame[..frame.len() - 3]).await.unwrap();
    stream.get_mut().shutdown().await.unwrap();
    assert!(closed(&mut stream).await);
    let missing = node.client.get_item(10).await.unwrap_err();
    assert_eq!(missing.code(), Some("not_found"), "{missing}");
    assert_eq!(node.client.get_item(9).await.unwrap().metadata, serde_json::json!({}));
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_refuses_link_writes_naming_the_leader() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(dir.path(), 3, tidal_cluster::Durability::Quorum, |_| {});
    cluster.start_all().await;
    let leader = cluster.leader().await;
    let follower = cluster.followers_of(leader)[0];
    let on_follower = Link::connect(cluster.client(follower).base(), None).await.unwrap();
    let refused = on_follower.put_item(1, br#"{"metadata":{}}"#, None).await.unwrap_err();
    assert_eq!(refusal(&refused), (503, "not_ready"), "{refused}");
    assert!(refused.to_string().contains("leads"), "{refused}");
    let on_leader = Link::connect(cluster.client(leader).base(), None).await.unwrap();
    let written = on_leader.put_item(1, br#"{"metadata":{"x":1}}"#, None).await.unwrap();
    assert!(written.seqno >= 1);
    cluster.stop_all().await;
}

/// Whether a fresh connection to the HTTP port is admitted and answered.
async fn answered(url: &str) -> bool {
    let authority = url.strip_prefix("http://").unwrap();
    let mut stream = tokio::net::TcpStream::connect(authority).await.unwrap();
    let request = format!("GET /healthz HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return false;
    }
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    answer.starts_with(b"HTTP/1.1 200")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_keeps_its_place_in_the_port_and_an_idle_one_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(&dir.path().join("data"), 2);
    config.net.http_connections_max = 2;
    config.net.idle_timeout = std::time::Duration::from_millis(500);
    let node = TestNode::start(config).await;
    // Two links fill the port: they are busy, so a new connection evicts neither and is refused.
    let first = Link::connect(&node.url, None).await.unwrap();
    let second = Link::connect(&node.url, None).await.unwrap();
    assert!(!answered(&node.url).await, "a third connection was served beside two links, cap 2");
    assert!(first.put_item(1, br#"{"metadata":{}}"#, None).await.is_ok());
    assert!(second.put_item(2, br#"{"metadata":{}}"#, None).await.is_ok());
    // A link dropped by its client frees its place.
    drop(first);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while !answered(&node.url).await {
        assert!(tokio::time::Instant::now() < deadline, "the dropped link's place was never freed");
        tokio::task::yield_now().await;
    }
    // A link with nothing in flight that sends nothing for the idle timeout is closed.
    drop(second);
    let mut idle = raw_link(&node.url).await;
    let waited = tokio::time::timeout(std::time::Duration::from_secs(10), closed(&mut idle)).await;
    assert_eq!(waited, Ok(true), "an idle link stayed open");
    node.stop().await;
}
