//! Every route of the table against every way of lacking its scope (issue 41: the probe's 243
//! refused requests are the floor): no token, an unknown one, a valid one mangled, another scheme,
//! and each token that holds only some other scope. Every answer is 401 or 403 with the JSON error
//! body, and nothing is written.
#![allow(clippy::unwrap_used)]

mod common;

use common::{config, error_code, TestNode};
use reqwest::Method;
use tidal_server::auth::Scope;
use tidal_server::http::{Access, ROUTES};

const TOKENS: &str = r#"
[[token]]
name = "reader"
token = "reader-token-0123456789"
scopes = ["read"]

[[token]]
name = "writer"
token = "writer-token-0123456789"
scopes = ["write"]

[[token]]
name = "receiver"
token = "receiver-token-0123456789"
scopes = ["receive"]

[[token]]
name = "inbox-admin"
token = "inbox-admin-token-012345"
scopes = ["inbox_admin"]

[[token]]
name = "ops"
token = "ops-token-0123456789abcd"
scopes = ["admin"]
"#;

/// The single-scope tokens, by the scope each holds.
const SCOPED: [(Scope, &str); 4] = [
    (Scope::Read, "reader-token-0123456789"),
    (Scope::Write, "writer-token-0123456789"),
    (Scope::Receive, "receiver-token-0123456789"),
    (Scope::InboxAdmin, "inbox-admin-token-012345"),
];

/// A concrete path for a route pattern.
fn concrete(pattern: &str) -> String {
    [
        ("{id}", "1"),
        ("{item}", "1"),
        ("{user}", "u1"),
        ("{stream}", "s1"),
        ("{name}", "c1"),
        ("{owner}", "o1"),
    ]
    .iter()
    .fold(pattern.to_string(), |path, (from, to)| path.replace(from, to))
}

fn methods_of(route: &tidal_server::http::Route) -> Vec<Method> {
    [Method::GET, Method::PUT, Method::POST, Method::DELETE]
        .into_iter()
        .filter(|method| {
            let filter = axum::routing::MethodFilter::try_from(method.clone()).unwrap();
            route.methods.or(filter) == route.methods
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_refuses_every_caller_without_its_scope_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("tokens.toml");
    tidal_server::auth::write_private_file(&token_file, TOKENS.as_bytes()).unwrap();
    let mut config = config(&dir.path().join("data"), 2);
    config.token_file = Some(token_file);
    let node = TestNode::start(config).await;
    let mut refused = 0;
    for route in ROUTES {
        let Access::Needs(scope) = route.access else { continue };
        let mut cases: Vec<(Option<String>, u16)> = vec![
            (None, 401),
            (Some("Bearer not-a-token-000000000".into()), 401),
            (Some("Bearer writer-token-0123456789x".into()), 401),
            (Some("Basic d3JpdGVyOnRva2Vu".into()), 401),
        ];
        for (_, token) in SCOPED.iter().filter(|(held, _)| *held != scope) {
            cases.push((Some(format!("Bearer {token}")), 403));
        }
        for method in methods_of(route) {
            for (authorization, expected) in &cases {
                let mut headers = vec![];
                if let Some(value) = authorization {
                    headers.push(("Authorization", value.as_str()));
                }
                let body = (method != Method::GET).then_some("{}");
                let (status, reply) =
                    node.request(method.clone(), &concrete(route.path), body, &headers).await;
                let code = if *expected == 401 { "unauthorized" } else { "forbidden" };
                assert_eq!(
                    (status, error_code(&reply)),
                    (*expected, code),
                    "{method} {} with {authorization:?}: {reply}",
                    route.path
                );
                refused += 1;
            }
        }
    }
    assert!(refused >= 243, "only {refused} refusals: the probe's 243 are the floor");
    let (status, digest) = node
        .request(
            Method::GET,
            "/cluster/digest",
            None,
            &[("Authorization", "Bearer ops-token-0123456789abcd")],
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(digest["applied_seqno"], 0, "a refused request wrote something: {digest}");
    node.stop().await;
}
