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
fn non_loopback_bind_without_tokens_or_tls_is_refused_unless_insecure() {
    use tidal_server::check_bind_policy as policy;
    let public: std::net::SocketAddr = "0.0.0.0:7070".parse().unwrap();
    let loopback: std::net::SocketAddr = "127.0.0.1:7070".parse().unwrap();
    // (tokens, tls, insecure)
    let no_tokens = policy(public, false, true, false).unwrap_err().to_string();
    assert!(no_tokens.contains("without a token file"), "{no_tokens}");
    let no_tls = policy(public, true, false, false).unwrap_err().to_string();
    assert!(no_tls.contains("without TLS") && no_tls.contains("--tls-cert"), "{no_tls}");
    assert!(policy(public, true, true, false).is_ok());
    assert!(policy(public, false, false, true).is_ok(), "--insecure allows both");
    assert!(policy(loopback, false, false, false).is_ok(), "loopback needs neither");
}
