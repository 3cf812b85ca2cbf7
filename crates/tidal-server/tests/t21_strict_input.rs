//! Issue 41: the API takes only input it can fold safely, and refuses everything else with the
//! contract's JSON error body, writing nothing.
//!
//! - a signal's weight is finite and at most 1e6 in absolute value, and its `ts` at most an hour past
//!   the node's clock: `1e308` made a trending score infinite (`"score": null`, first in every feed);
//! - ids are canonical decimal u64: `+1`, `01`, ` 1`, `1.0`, `1e3` and `18446744073709551616` are
//!   refused, never aliased to item 1 or turned into a float;
//! - every 4xx of every route (bad ids, garbage bodies, a wrong content type, a wrong method) is
//!   `application/json` with `{"error": {"code", "message"}}`.

#![allow(clippy::unwrap_used)] // tests may unwrap; helpers outside #[test] are not covered by allow-unwrap-in-tests

mod common;

use common::{config, error_code, TestNode};
use reqwest::Method;
use tidal_server::http::ROUTES;

/// A request with full control of the body and its content type; answers the status, whether the
/// answer is JSON, and the body (as JSON if it parses).
async fn raw(
    node: &TestNode,
    method: Method,
    path: &str,
    body: Option<&[u8]>,
    content_type: Option<&str>,
    headers: &[(&str, &str)],
) -> (u16, bool, serde_json::Value) {
    let mut builder = node.http.request(method, format!("{}{}", node.url, path));
    if let Some(content_type) = content_type {
        builder = builder.header("content-type", content_type);
    }
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    if let Some(body) = body {
        builder = builder.body(body.to_vec());
    }
    let reply = builder.send().await.unwrap();
    let status = reply.status().as_u16();
    let json = reply
        .headers()
        .get("content-type")
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/json"));
    let text = reply.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
    (status, json, body)
}

/// The contract's error shape: `{"error": {"code": snake_case, "message": non-empty}}` and nothing else.
fn is_error_body(body: &serde_json::Value) -> bool {
    let code = body["error"]["code"].as_str().unwrap_or("");
    let message = body["error"]["message"].as_str().unwrap_or("");
    body.as_object().is_some_and(|o| o.len() == 1)
        && body["error"].as_object().is_some_and(|o| o.len() == 2)
        && !code.is_empty()
        && code.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
        && !message.is_empty()
}

async fn start(dir: &std::path::Path) -> TestNode {
    let mut config = config(dir, 3);
    config.body_bytes_max = 64 * 1024;
    TestNode::start(config).await
}

fn signal(extra: &str) -> String {
    format!(r#"{{"signals":[{{"user":"u","item":1,"kind":"click"{extra}}}]}}"#)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_and_times_that_would_overflow_a_score_are_refused_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path()).await;
    node.client.put_item(1, serde_json::json!({}), None).await.unwrap();
    let before = node.client.digest().await.unwrap();
    let now_ms =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let two_hours_ahead = format!(r#","ts":{}"#, now_ms + 2 * 3_600_000);
    let cases: Vec<(String, u16, &str)> = vec![
        (signal(r#","weight":1e308"#), 400, "invalid_argument"),
        (signal(r#","weight":-1e308"#), 400, "invalid_argument"),
        (signal(r#","weight":1000000.5"#), 400, "invalid_argument"),
        (signal(r#","weight":1.7976931348623157e308"#), 400, "invalid_argument"),
        // JSON has no NaN or infinity: a literal out of f64's range, or the names as strings or bare.
        (signal(r#","weight":1e999"#), 400, "malformed_json"),
        (signal(r#","weight":NaN"#), 400, "malformed_json"),
        (signal(r#","weight":"NaN""#), 400, "invalid_argument"),
        (signal(r#","weight":Infinity"#), 400, "malformed_json"),
        (signal(&two_hours_ahead), 400, "invalid_argument"),
        (signal(r#","ts":7258118400000"#), 400, "invalid_argument"),
        (signal(r#","ts":9223372036854775807"#), 400, "invalid_argument"),
        (signal(r#","ts":-1"#), 400, "invalid_argument"),
        (signal(r#","ts":1.5"#), 400, "invalid_argument"),
        // Two huge weights that are each refused, in one batch and in a tx.
        (
            r#"{"signals":[{"user":"u","item":1,"kind":"click","weight":1e308},{"user":"u","item":1,"kind":"click","weight":1e308}]}"#.into(),
            400,
            "invalid_argument",
        ),
    ];
    for (body, status, code) in &cases {
        let (got, json, reply) =
            raw(&node, Method::POST, "/v1/signals", Some(body.as_bytes()), Some("application/json"), &[])
                .await;
        assert_eq!((got, error_code(&reply)), (*status, *code), "{body}: {reply}");
        assert!(json && is_error_body(&reply), "{body}: {reply}");
    }
    let tx = r#"{"ops":[{"op":"signals","signals":[{"user":"u","item":1,"kind":"click","weight":1e308}]}]}"#;
    let (got, _, reply) =
        raw(&node, Method::POST, "/v1/tx", Some(tx.as_bytes()), Some("application/json"), &[]).await;
    assert_eq!((got, error_code(&reply)), (400, "invalid_argument"), "{reply}");
    assert_eq!(node.client.digest().await.unwrap(), before, "a refused signal changed the state");
    // The bounds themselves are accepted, and the score stays a number.
    let edge = format!(r#","weight":1e6,"ts":{}"#, now_ms + 3_000_000);
    for body in [signal(&edge), signal(r#","weight":-1e6"#), signal(r#","weight":5e-324"#)] {
        let (got, _, reply) =
            raw(&node, Method::POST, "/v1/signals", Some(body.as_bytes()), Some("application/json"), &[])
                .await;
        assert_eq!(got, 200, "{body}: {reply}");
    }
    let (_, _, trending) = raw(&node, Method::GET, "/v1/trending", None, None, &[]).await;
    assert!(trending["items"][0]["score"].is_f64(), "{trending}");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_parse_only_in_canonical_decimal() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path()).await;
    node.client.put_item(1, serde_json::json!({"one": true}), None).await.unwrap();
    node.client.put_item(0, serde_json::json!({"zero": true}), None).await.unwrap();
    let before = node.client.digest().await.unwrap();
    // `0` is canonical.
    let (status, _, item) = raw(&node, Method::GET, "/v1/items/0", None, None, &[]).await;
    assert_eq!((status, &item["metadata"]), (200, &serde_json::json!({"zero": true})));
    let aliases =
        ["+1", "01", "0001", "%201", "1%20", "1.0", "1e3", "-1", "0x1", "18446744073709551616", "%2B1", ""];
    for alias in aliases {
        for (method, path) in [
            (Method::GET, format!("/v1/items/{alias}")),
            (Method::GET, format!("/v1/items/{alias}/embedding")),
            (Method::GET, format!("/v1/items/{alias}/similar")),
            (Method::DELETE, format!("/v1/items/{alias}")),
            (Method::DELETE, format!("/v1/users/u/negatives/{alias}")),
            (Method::GET, format!("/v1/users/u/feed?exclude=2,{alias}")),
            (Method::GET, format!("/v1/trending?limit={alias}")),
            (Method::GET, format!("/v1/trending?min_seqno={alias}")),
            (Method::GET, format!("/v1/streams/s/events?after={alias}")),
        ] {
            let (status, json, reply) = raw(&node, method.clone(), &path, None, None, &[]).await;
            // An empty id leaves a path no route takes (404); every other alias is a 400.
            assert!(
                (400..500).contains(&status) && json && is_error_body(&reply),
                "{method} {path}: {status} {reply}"
            );
            assert!(status == 400 || alias.is_empty(), "{method} {path}: {status} {reply}");
        }
        let put = format!("/v1/items/{alias}");
        let (status, _, reply) =
            raw(&node, Method::PUT, &put, Some(br#"{"metadata":{}}"#), Some("application/json"), &[]).await;
        assert!((400..500).contains(&status), "PUT {put}: {status} {reply}");
        if !alias.is_empty() && !alias.contains("%20") {
            let header = [("last-event-id", alias)];
            let (status, _, reply) =
                raw(&node, Method::GET, "/v1/streams/s/events", None, None, &header).await;
            assert_eq!((status, error_code(&reply)), (400, "invalid_argument"), "Last-Event-ID {alias:?}");
        }
    }
    // In JSON bodies: a number that is not an integer, or past u64, is refused, not made a float.
    for item in ["1.0", "1e3", "18446744073709551616", "-1", "+1", "01", "\"1\"", "1.5e0"] {
        let bodies = [
            ("/v1/signals", format!(r#"{{"signals":[{{"user":"u","item":{item},"kind":"click"}}]}}"#)),
            ("/v1/users/u/negatives", format!(r#"{{"item":{item}}}"#)),
            ("/v1/tx", format!(r#"{{"ops":[{{"op":"delete_item","item":{item}}}]}}"#)),
        ];
        for (path, body) in bodies {
            let (status, json, reply) =
                raw(&node, Method::POST, path, Some(body.as_bytes()), Some("application/json"), &[]).await;
            assert_eq!(status, 400, "{path} {body}: {reply}");
            assert!(json && is_error_body(&reply), "{path} {body}: {reply}");
        }
    }
    assert_eq!(node.client.digest().await.unwrap(), before, "an aliased id wrote");
    let (status, _, _) = raw(&node, Method::GET, "/v1/items/1", None, None, &[]).await;
    assert_eq!(status, 200, "item 1 is still there");
    node.stop().await;
}

/// Path parameters of the routes, filled with valid values, or with `bad` for the ids.
fn concrete(pattern: &str, bad_id: Option<&str>, bad_name: Option<&str>) -> String {
    pattern
        .split('/')
        .map(|part| match part {
            "{id}" | "{item}" => bad_id.unwrap_or("1").to_string(),
            "{user}" | "{stream}" | "{name}" | "{owner}" => bad_name.unwrap_or("n").to_string(),
            _ => part.to_string(),
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// Whether a route of the table answers `method` at `pattern`.
fn answered(pattern: &str, method: &Method) -> bool {
    let filter = axum::routing::MethodFilter::try_from(
        axum::http::Method::from_bytes(method.as_str().as_bytes()).unwrap(),
    )
    .unwrap();
    ROUTES.iter().any(|route| route.path == pattern && route.methods.or(filter) == route.methods)
}

/// Bodies no route takes.
fn garbage() -> Vec<Vec<u8>> {
    vec![
        b"{not json".to_vec(),
        b"null".to_vec(),
        b"[]".to_vec(),
        b"{\"nothing\":1}".to_vec(),
        vec![0xff, 0xfe, 0x00, 0x01],
        b"{\"signals\":[{\"user\":\"u\",\"item\":1,\"kind\":\"click\",\"weight\":1e308}]}"[..40].to_vec(),
        vec![b'['; 70 * 1024],
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_refuses_bad_input_with_a_json_error_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path()).await;
    node.client.put_item(1, serde_json::json!({}), None).await.unwrap();
    let before = node.client.digest().await.unwrap();
    let mut checked = 0;
    let mut check = |what: String, (status, json, body): (u16, bool, serde_json::Value)| {
        assert!((400..500).contains(&status), "{what}: {status} {body}");
        assert!(json, "{what}: a {status} without content-type application/json: {body}");
        assert!(is_error_body(&body), "{what}: {status} {body}");
        checked += 1;
    };
    let methods = [Method::GET, Method::PUT, Method::POST, Method::DELETE, Method::PATCH];
    for route in ROUTES {
        let path = concrete(route.path, None, None);
        for method in methods.iter().filter(|method| !answered(route.path, method)) {
            let reply = raw(&node, method.clone(), &path, Some(b"{}"), Some("application/json"), &[]).await;
            assert_eq!(reply.0, 405, "{method} {path}");
            assert_eq!(error_code(&reply.2), "method_not_allowed", "{method} {path}");
            check(format!("{method} {path}"), reply);
        }
        let own: Vec<&Method> = methods.iter().filter(|method| answered(route.path, method)).collect();
        for method in &own {
            if route.path.contains("{id}") || route.path.contains("{item}") {
                for bad in ["+1", "01", "1.0", "18446744073709551616", "x"] {
                    let bad_path = concrete(route.path, Some(bad), None);
                    let reply =
                        raw(&node, (*method).clone(), &bad_path, Some(b"{}"), Some("application/json"), &[])
                            .await;
                    check(format!("{method} {bad_path}"), reply);
                }
            }
            let names = ["{user}", "{stream}", "{name}", "{owner}"];
            if names.iter().any(|name| route.path.contains(name)) {
                for bad in ["%FF", "__tidal_x", "%00"] {
                    let bad_path = concrete(route.path, None, Some(bad));
                    let reply =
                        raw(&node, (*method).clone(), &bad_path, Some(b"{}"), Some("application/json"), &[])
                            .await;
                    check(format!("{method} {bad_path}"), reply);
                }
            }
            // Bodies go to the routes that read one (a DELETE reads none: it would write).
            if **method == Method::POST || **method == Method::PUT {
                for body in garbage() {
                    let what =
                        format!("{method} {path} {:?}", String::from_utf8_lossy(&body[..body.len().min(40)]));
                    for content_type in [Some("application/json"), Some("text/plain"), None] {
                        // A wrong content type may be refused for it (415) before the body is read.
                        let reply =
                            raw(&node, (*method).clone(), &path, Some(&body), content_type, &[]).await;
                        check(format!("{what} as {content_type:?}"), reply);
                    }
                }
            }
        }
    }
    let reply = raw(&node, Method::GET, "/v2/nothing", None, None, &[]).await;
    assert_eq!(error_code(&reply.2), "not_found");
    check("GET /v2/nothing".into(), reply);
    assert!(checked > 300, "only {checked} answers checked");
    assert_eq!(node.client.digest().await.unwrap(), before, "a refused request changed the state");
    node.stop().await;
}
