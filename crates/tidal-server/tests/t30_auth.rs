//! Bearer tokens and scopes; the bind policy for non-loopback addresses.

#![allow(clippy::unwrap_used)] // tests may unwrap; helpers outside #[test] are not covered by allow-unwrap-in-tests

mod common;

use common::{config, error_code, TestNode};
use reqwest::Method;

const TOKENS: &str = r#"
[[token]]
name = "reader"
token = "reader-token-0123456789"
scopes = ["read"]

[[token]]
name = "writer"
token = "writer-token-0123456789"
scopes = ["read", "write"]

[[token]]
name = "ops"
token = "ops-token-0123456789abcd"
scopes = ["admin"]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_need_the_right_scope() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("tokens.toml");
    tidal_server::auth::write_private_file(&token_file, TOKENS.as_bytes()).unwrap();
    let mut config = config(&dir.path().join("data"), 2);
    config.token_file = Some(token_file);
    let node = TestNode::start(config).await;
    let item = r#"{"metadata":{}}"#;
    let bearer = |t: &'static str| ("Authorization", t);
    let (status, body) = node.request(Method::PUT, "/v1/items/1", Some(item), &[]).await;
    assert_eq!((status, error_code(&body)), (401, "unauthorized"));
    let (status, body) = node
        .request(Method::PUT, "/v1/items/1", Some(item), &[bearer("Bearer wrong-token-0000000000")])
        .await;
    assert_eq!((status, error_code(&body)), (401, "unauthorized"));
    let (status, body) = node
        .request(Method::PUT, "/v1/items/1", Some(item), &[bearer("Bearer reader-token-0123456789")])
        .await;
    assert_eq!((status, error_code(&body)), (403, "forbidden"));
    let (status, _) = node
        .request(Method::PUT, "/v1/items/1", Some(item), &[bearer("Bearer writer-token-0123456789")])
        .await;
    assert_eq!(status, 200);
    let (status, _) =
        node.request(Method::GET, "/v1/items/1", None, &[bearer("Bearer reader-token-0123456789")]).await;
    assert_eq!(status, 200);
    let (status, body) =
        node.request(Method::GET, "/cluster/status", None, &[bearer("Bearer writer-token-0123456789")]).await;
    assert_eq!((status, error_code(&body)), (403, "forbidden"));
    let (status, _) = node
        .request(Method::GET, "/cluster/status", None, &[bearer("Bearer ops-token-0123456789abcd")])
        .await;
    assert_eq!(status, 200);
    let (status, _) = node.request(Method::GET, "/healthz", None, &[]).await;
    assert_eq!(status, 200, "liveness needs no token");
    let (status, _) = node.request(Method::GET, "/readyz", None, &[]).await;
    assert_eq!(status, 200, "readiness needs no token");
    node.stop().await;
}

#[test]
fn non_loopback_bind_without_tokens_is_refused_unless_insecure() {
    let public: std::net::SocketAddr = "0.0.0.0:7070".parse().unwrap();
    let loopback: std::net::SocketAddr = "127.0.0.1:7070".parse().unwrap();
    assert!(tidal_server::check_bind_policy(public, false, false).is_err());
    assert!(tidal_server::check_bind_policy(public, true, false).is_ok());
    assert!(tidal_server::check_bind_policy(public, false, true).is_ok());
    assert!(tidal_server::check_bind_policy(loopback, false, false).is_ok());
}
