//! Bad input gets a 4xx with the contract's code, and nothing is written (the applied seqno and the
//! state digest do not move).

#![allow(clippy::unwrap_used)] // tests may unwrap; helpers outside #[test] are not covered by allow-unwrap-in-tests

mod common;

use common::{config, error_code, TestNode};
use reqwest::Method;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_with_codes_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path(), 3);
    config.body_bytes_max = 64 * 1024;
    config.write_inflight_bytes_max = 1024 * 1024;
    let node = TestNode::start(config).await;
    node.client.put_item(1, serde_json::json!({"ok": true}), None).await.unwrap();
    let before = node.client.digest().await.unwrap();
    let big = format!(r#"{{"metadata":{{"blob":"{}"}}}}"#, "x".repeat(70 * 1024));
    let many =
        format!(r#"{{"signals":[{}]}}"#, vec![r#"{"user":"u","item":1,"kind":"click"}"#; 10_001].join(","));
    let cases: Vec<(Method, &str, String, u16, &str)> = vec![
        (Method::POST, "/v1/signals", "{not json".into(), 400, "malformed_json"),
        (Method::POST, "/v1/signals", "".into(), 400, "malformed_json"),
        (Method::POST, "/v1/signals", r#"{"signals":[]}"#.into(), 400, "invalid_argument"),
        (
            Method::POST,
            "/v1/signals",
            r#"{"signals":[{"user":"u","item":1,"kind":"teleport"}]}"#.into(),
            400,
            "unknown_signal_kind",
        ),
        (
            Method::POST,
            "/v1/signals",
            r#"{"signals":[{"user":"","item":1,"kind":"click"}]}"#.into(),
            400,
            "invalid_argument",
        ),
        (
            Method::POST,
            "/v1/signals",
            r#"{"signals":[{"user":"__tidal_x","item":1,"kind":"click"}]}"#.into(),
            400,
            "invalid_argument",
        ),
        (
            Method::POST,
            "/v1/signals",
            r#"{"signals":[{"user":"u","item":-1,"kind":"click"}]}"#.into(),
            400,
            "invalid_argument",
        ),
        (
            Method::POST,
            "/v1/signals",
            r#"{"signals":[{"user":"u","item":18446744073709551616,"kind":"click"}]}"#.into(),
            400,
            "invalid_argument",
        ),
        (
            Method::POST,
            "/v1/signals",
            r#"{"signals":[{"user":"u","item":1,"kind":"click","weight":1e999}]}"#.into(),
            400,
            "malformed_json",
        ),
        (
            Method::POST,
            "/v1/signals",
            r#"{"signals":[{"user":"u","item":1,"kind":"click","ts":-5}]}"#.into(),
            400,
            "invalid_argument",
        ),
        (
            Method::POST,
            "/v1/signals",
            r#"{"signals":[{"user":"u","item":1,"kind":"click","colour":"red"}]}"#.into(),
            400,
            "invalid_argument",
        ),
        (
            Method::POST,
            "/v1/signals",
            r#"{"signals":[{"user":"u","item":1,"kind":"click"},{"user":"u","item":2,"kind":"nope"}]}"#
                .into(),
            400,
            "unknown_signal_kind",
        ),
        (Method::POST, "/v1/signals", many, 413, "payload_too_large"),
        (Method::PUT, "/v1/items/1", big, 413, "payload_too_large"),
        (Method::PUT, "/v1/items/abc", r#"{"metadata":{}}"#.into(), 400, "invalid_argument"),
        (Method::PUT, "/v1/items/18446744073709551616", r#"{"metadata":{}}"#.into(), 400, "invalid_argument"),
        (Method::PUT, "/v1/items/1", r#"{"meta":{}}"#.into(), 400, "invalid_argument"),
        (Method::PUT, "/v1/items/1/embedding", r#"{"vector":[1,2]}"#.into(), 400, "dimension_mismatch"),
        (Method::PUT, "/v1/items/1/embedding", r#"{"vector":[1,2,3,4]}"#.into(), 400, "dimension_mismatch"),
        (Method::PUT, "/v1/items/1/embedding", r#"{"vector":[1,null,3]}"#.into(), 400, "invalid_vector"),
        (Method::PUT, "/v1/items/1/embedding", r#"{"vector":[1,"NaN",3]}"#.into(), 400, "invalid_vector"),
        (Method::PUT, "/v1/items/1/embedding", r#"{"vector":[1,1e999,3]}"#.into(), 400, "invalid_vector"),
        (Method::PUT, "/v1/items/1/embedding", r#"{"vector":[1,1e300,3]}"#.into(), 400, "invalid_vector"),
        (Method::PUT, "/v1/items/1/embedding", r#"{"vector":[1,2,3"#.into(), 400, "malformed_json"),
        (Method::GET, "/v1/users/__tidal/feed", String::new(), 400, "invalid_argument"),
        (Method::GET, "/v1/users/u/feed?limit=0", String::new(), 400, "invalid_argument"),
        (Method::GET, "/v1/users/u/feed?limit=100000", String::new(), 400, "invalid_argument"),
        (Method::GET, "/v1/users/u/feed?exclude=1,x", String::new(), 400, "invalid_argument"),
        (Method::GET, "/v1/users/u/feed?min_seqno=abc", String::new(), 400, "invalid_argument"),
        (Method::GET, "/v1/items/77", String::new(), 404, "not_found"),
        (Method::GET, "/v1/items/77/similar", String::new(), 404, "not_found"),
        (Method::POST, "/v1/users/u/negatives", r#"{"item":"x"}"#.into(), 400, "invalid_argument"),
        (Method::POST, "/v1/streams/s/events", r#"{"payload":1,"key":""}"#.into(), 400, "invalid_name"),
        (Method::POST, "/v1/inboxes/o/messages", r#"{"topic":"t"}"#.into(), 400, "invalid_argument"),
        (
            Method::POST,
            "/v1/inboxes/o/messages",
            r#"{"topic":"t","payload":1,"message_id":""}"#.into(),
            400,
            "invalid_argument",
        ),
        (
            Method::POST,
            "/v1/inboxes/o/messages",
            format!(r#"{{"topic":"t","payload":1,"message_id":"{}"}}"#, "m".repeat(257)),
            400,
            "invalid_argument",
        ),
        (
            Method::POST,
            "/v1/inboxes/o/messages",
            r#"{"topic":"__tidal_x","payload":1,"message_id":"m"}"#.into(),
            400,
            "invalid_name",
        ),
        (
            Method::POST,
            "/v1/inboxes/__tidal/messages",
            r#"{"topic":"t","payload":1,"message_id":"m"}"#.into(),
            400,
            "invalid_name",
        ),
        (
            Method::POST,
            "/v1/inboxes/o/messages",
            r#"{"topic":"t","payload":null,"message_id":"m"}"#.into(),
            400,
            "invalid_argument",
        ),
        (
            Method::POST,
            "/v1/inboxes/o/messages",
            format!(r#"{{"topic":"t","payload":"{}","message_id":"m"}}"#, "x".repeat(70_000)),
            413,
            "payload_too_large",
        ),
        (
            Method::POST,
            "/v1/inboxes/o/messages",
            r#"{"topic":"t","payload":[1,"message_id":"m"}"#.into(),
            400,
            "malformed_json",
        ),
        (
            Method::POST,
            "/v1/inboxes/o/receive",
            r#"{"topics":[],"receive_id":"r"}"#.into(),
            400,
            "invalid_argument",
        ),
        (
            Method::POST,
            "/v1/inboxes/o/receive",
            r#"{"topics":["a","a"],"receive_id":"r"}"#.into(),
            400,
            "invalid_argument",
        ),
        (
            Method::POST,
            "/v1/inboxes/o/receive",
            r#"{"topics":["a"],"receive_id":"r","wait_ms":60001}"#.into(),
            400,
            "invalid_argument",
        ),
        (
            Method::POST,
            "/v1/inboxes/o/receive",
            r#"{"topics":["a"],"receive_id":"r","lease_ms":5}"#.into(),
            400,
            "invalid_argument",
        ),
        (
            Method::POST,
            "/v1/inboxes/o/receive",
            r#"{"topics":["a"],"receive_id":"r","max":0}"#.into(),
            400,
            "invalid_argument",
        ),
        (
            Method::POST,
            "/v1/inboxes/o/receive",
            r#"{"topics":["a"],"receive_id":"r","colour":1}"#.into(),
            400,
            "invalid_argument",
        ),
        (Method::GET, "/v1/inboxes/nobody", String::new(), 404, "not_found"),
        (Method::GET, "/v2/nothing", String::new(), 404, "not_found"),
    ];
    for (method, path, body, status, code) in cases {
        let body_ref = if body.is_empty() && method == Method::GET { None } else { Some(body.as_str()) };
        let (got_status, got_body) = node.request(method.clone(), path, body_ref, &[]).await;
        assert_eq!(
            (got_status, error_code(&got_body)),
            (status, code),
            "{method} {path} {}: {got_body}",
            &body.chars().take(120).collect::<String>()
        );
        assert!(got_body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    let (status, body) = node
        .request(Method::PUT, "/v1/items/1", Some(r#"{"metadata":{}}"#), &[("Idempotency-Key", "")])
        .await;
    assert_eq!((status, error_code(&body)), (400, "invalid_argument"));
    let after = node.client.digest().await.unwrap();
    assert_eq!(before, after, "a refused request changed the state");
    node.stop().await;
}

/// Every oversize body gets its 413, never a broken connection: the node reads (and drops) the rest
/// of a body past its limit before answering, so closing the connection does not reset it under the
/// client. Raw TCP: the client streams the body in pieces while it reads the answer, and must be able
/// to send all of it (without the drain the node resets the connection and the write fails with a
/// broken pipe, which is how clients such as reqwest lose the 413).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_bodies_always_get_their_answer() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path(), 3);
    config.body_bytes_max = 64 * 1024;
    config.write_inflight_bytes_max = 1024 * 1024;
    let node = TestNode::start(config).await;
    let addr = node.url.trim_start_matches("http://").to_string();
    for i in 0..40usize {
        let size = 67 * 1024 + (i % 20) * 48 * 1024;
        let body = format!(r#"{{"metadata":{{"blob":"{}"}}}}"#, "x".repeat(size));
        let stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let (mut read, mut write) = stream.into_split();
        let head = format!(
            "PUT /v1/items/1 HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
             connection: close\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        let writer = tokio::spawn(async move {
            write.write_all(head.as_bytes()).await?;
            // Past the limit at once, then the rest in pieces, as a client streaming a body does.
            let (first, rest) = body.as_bytes().split_at(66 * 1024);
            write.write_all(first).await?;
            for piece in rest.chunks(4096) {
                tokio::task::yield_now().await;
                write.write_all(piece).await?;
            }
            Ok::<_, std::io::Error>(write)
        });
        let mut answer = Vec::new();
        let got = read.read_to_end(&mut answer).await;
        let text = String::from_utf8_lossy(&answer);
        assert!(
            got.is_ok() && text.starts_with("HTTP/1.1 413") && text.contains("payload_too_large"),
            "body of {size} bytes: {got:?} {text}"
        );
        drop(writer.await.unwrap().expect("the node reset the connection under a body it refused"));
    }
    let (status, _) = node.request(Method::GET, "/v1/items/1", None, &[]).await;
    assert_eq!(status, 404, "an oversize body was written");
    node.stop().await;
}
