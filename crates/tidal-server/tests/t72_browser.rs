//! A node in open mode (no token file, loopback) cannot be driven by a web page through its
//! visitor's browser (issue 41): the requests a page can send without a preflight are refused and
//! change nothing.
#![allow(clippy::unwrap_used)]

mod common;

use common::{error_code, TestNode};

/// Sends `method path` with exactly `headers` and `body` (no content type added).
async fn raw(
    node: &TestNode,
    method: reqwest::Method,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, serde_json::Value) {
    let mut builder = node.http.request(method, format!("{}{}", node.url, path)).body(body.to_string());
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let reply = builder.send().await.unwrap();
    let status = reply.status().as_u16();
    let json = reply.json().await.unwrap_or(serde_json::Value::Null);
    (status, json)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pages_simple_posts_and_rebound_names_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let node = TestNode::start(common::config(dir.path(), 4)).await;
    let signals = r#"{"signals":[{"user":"u1","item":1,"kind":"click"}]}"#;
    // What <form enctype="text/plain"> or fetch(..., {mode: "no-cors"}) sends.
    let (status, body) = raw(
        &node,
        reqwest::Method::POST,
        "/v1/signals",
        &[("content-type", "text/plain;charset=UTF-8")],
        signals,
    )
    .await;
    assert_eq!((status, error_code(&body)), (415, "unsupported_media_type"), "{body}");
    let (status, body) = raw(
        &node,
        reqwest::Method::POST,
        "/v1/signals",
        &[("content-type", "application/x-www-form-urlencoded"), ("origin", "http://evil.example")],
        signals,
    )
    .await;
    assert_eq!((status, error_code(&body)), (403, "forbidden"), "{body}");
    // The admin verb that would make a leader dial an attacker's address.
    let member = r#"{"rpc":"203.0.113.9:7170","http":"203.0.113.9:7070"}"#;
    let (status, body) = raw(
        &node,
        reqwest::Method::POST,
        "/cluster/members/9",
        &[
            ("content-type", "application/json"),
            ("sec-fetch-site", "cross-site"),
            ("origin", "http://evil.example"),
        ],
        member,
    )
    .await;
    assert_eq!((status, error_code(&body)), (403, "forbidden"), "{body}");
    // A page that rebinds its own name to 127.0.0.1 sends its own name as Host.
    let (status, body) =
        raw(&node, reqwest::Method::GET, "/v1/trending", &[("host", "attacker.example:7070")], "").await;
    assert_eq!((status, error_code(&body)), (403, "forbidden"), "{body}");
    assert_eq!(node.client.digest().await.unwrap().applied_seqno, 0, "nothing was written");
    // A client that says JSON, and a same-origin page, are served.
    let (status, _) =
        raw(&node, reqwest::Method::POST, "/v1/signals", &[("content-type", "application/json")], signals)
            .await;
    assert_eq!(status, 200);
    node.stop().await;
}
