//! `/openapi.json` against the real thing: the node serves the generated document; every example
//! in the README is a request the document describes, its body valid against the request schema,
//! and the node's answer valid against the reply schema; every path tidal-client calls (and every
//! query parameter it sends) is in the document.

#![allow(clippy::unwrap_used)] // tests may unwrap; helpers outside #[test] are not covered by allow-unwrap-in-tests

mod common;

use common::schema::validate;
use common::{config, TestNode};
use serde_json::{json, Value};
use std::path::Path;

/// The README's examples use 128-dimensional embeddings.
const DIMENSION: u32 = 128;
/// Writes before the examples run, so the offsets they name (57) exist, as on a cluster in use.
const FILLER_WRITES: u64 = 60;

/// One `curl` of the README.
#[derive(Debug)]
struct Example {
    method: String,
    path: String,
    body: Option<String>,
    headers: Vec<(String, String)>,
    streaming: bool,
}

/// Splits a shell command into words: single quotes, double quotes with `\"`, comments, `$(...)`.
fn words(command: &str) -> Vec<String> {
    let (mut out, mut word, mut quote, mut chars) =
        (Vec::new(), None::<String>, None, command.chars().peekable());
    while let Some(c) = chars.next() {
        match (quote, c) {
            (None, '#') if word.is_none() => break,
            // A command substitution is kept verbatim (its own quotes included) for `expand`.
            (_, '$') if chars.peek() == Some(&'(') => {
                let word = word.get_or_insert_with(String::new);
                word.push('$');
                let mut depth = 0;
                for c in chars.by_ref() {
                    word.push(c);
                    depth += match c {
                        '(' => 1,
                        ')' => -1,
                        _ => 0,
                    };
                    if depth == 0 {
                        break;
                    }
                }
            }
            (None, c) if c.is_whitespace() => out.extend(word.take()),
            (None, '\'' | '"') => {
                quote = Some(c);
                word.get_or_insert_with(String::new);
            }
            (Some('"'), '\\') => word.get_or_insert_with(String::new).extend(chars.next()),
            (Some(q), c) if c == q => quote = None,
            (_, c) => word.get_or_insert_with(String::new).push(c),
        }
    }
    out.extend(word);
    out
}

/// The README's one generated body: `$(python3 -c 'print(",".join(["0.1"]*128))')`, expanded.
fn expand(word: &str) -> String {
    let Some((before, rest)) = word.split_once("$(") else { return word.to_string() };
    let (inner, after) = rest.rsplit_once(')').unwrap();
    let value = inner.split("[\"").nth(1).and_then(|v| v.split('"').next()).unwrap();
    let count: usize =
        inner.rsplit('*').next().unwrap().trim_end_matches(|c: char| !c.is_ascii_digit()).parse().unwrap();
    format!("{before}{}{after}", vec![value; count].join(","))
}

fn readme_examples() -> Vec<Example> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md")).unwrap();
    let mut lines = readme.lines();
    let mut examples = Vec::new();
    while let Some(line) = lines.next() {
        if !line.starts_with("curl ") {
            continue;
        }
        let mut command = line.to_string();
        while command.matches('\'').count() % 2 == 1 {
            command = format!("{command}\n{}", lines.next().unwrap());
        }
        let words: Vec<String> = words(&command).iter().map(|w| expand(w)).collect();
        let after = |flag: &str| words.iter().position(|w| w == flag).map(|at| words[at + 1].clone());
        let url = words.iter().find(|w| w.contains("localhost:")).unwrap();
        let path = url[url.find('/').unwrap()..].to_string();
        let body = after("--json");
        let method = after("-X").unwrap_or(if body.is_some() { "POST" } else { "GET" }.into());
        let headers = words
            .windows(2)
            .filter(|pair| pair[0] == "-H")
            .map(|pair| pair[1].split_once(": ").map(|(n, v)| (n.to_string(), v.to_string())).unwrap())
            .collect();
        examples.push(Example { method, path, body, headers, streaming: words.iter().any(|w| w == "-sN") });
    }
    examples
}

/// The document's operation for `method` and a concrete `path` (its template's segments in `{}`
/// match any one segment).
fn operation<'a>(document: &'a Value, method: &str, path: &str) -> Option<&'a Value> {
    let path = path.split('?').next().unwrap();
    document["paths"].as_object()?.iter().find_map(|(template, item)| {
        let (t, p): (Vec<&str>, Vec<&str>) = (template.split('/').collect(), path.split('/').collect());
        let fits = t.len() == p.len() && t.iter().zip(&p).all(|(t, p)| t == p || t.starts_with('{'));
        fits.then(|| item.get(method.to_lowercase())).flatten()
    })
}

fn query_names(path: &str) -> Vec<&str> {
    path.split_once('?')
        .map_or(vec![], |(_, q)| q.split('&').map(|pair| pair.split('=').next().unwrap()).collect())
}

fn documented_query(operation: &Value) -> Vec<&str> {
    let params = operation["parameters"].as_array().unwrap();
    params.iter().filter(|p| p["in"] == "query").map(|p| p["name"].as_str().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_examples_validate_against_the_served_document() {
    common::trace();
    let dir = tempfile::tempdir().unwrap();
    let node = TestNode::start(config(dir.path(), DIMENSION)).await;
    let (status, served) = node.request(reqwest::Method::GET, "/openapi.json", None, &[]).await;
    assert_eq!(status, 200);
    assert_eq!(served, tidal_server::http::openapi::document(), "the node serves the generated document");
    for id in 0..FILLER_WRITES {
        node.client.put_item(1000 + id, json!({"filler": id}), None).await.unwrap();
    }
    let examples = readme_examples();
    assert!(examples.len() >= 10, "the README's examples were not found: {examples:?}");
    for example in &examples {
        let what = format!("{} {}", example.method, example.path);
        let op = operation(&served, &example.method, &example.path)
            .unwrap_or_else(|| panic!("{what}: not in the document"));
        for name in query_names(&example.path) {
            assert!(documented_query(op).contains(&name), "{what}: query parameter {name} is not documented");
        }
        if let Some(body) = &example.body {
            let body: Value =
                serde_json::from_str(body).unwrap_or_else(|e| panic!("{what}: body is not JSON: {e}"));
            let schema = &op["requestBody"]["content"]["application/json"]["schema"];
            validate(&served, schema, &body, "body").unwrap_or_else(|e| panic!("{what}: request: {e}"));
        }
        if example.streaming {
            continue; // a live subscription never ends; its route and query are checked above
        }
        let headers: Vec<(&str, &str)> =
            example.headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        let method = reqwest::Method::from_bytes(example.method.as_bytes()).unwrap();
        let (status, reply) = node.request(method, &example.path, example.body.as_deref(), &headers).await;
        assert_eq!(status, 200, "{what}: {reply}");
        let schema = &op["responses"]["200"]["content"]["application/json"]["schema"];
        validate(&served, schema, &reply, "reply").unwrap_or_else(|e| panic!("{what}: reply {reply}: {e}"));
    }
    node.stop().await;
}

#[test]
fn every_path_and_query_parameter_tidal_client_uses_is_documented() {
    let document = tidal_server::http::openapi::document();
    let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tidal-client/src");
    let mut checked = 0;
    for file in std::fs::read_dir(&sources).unwrap() {
        let text = std::fs::read_to_string(file.unwrap().path()).unwrap();
        for literal in text.split('"').skip(1).step_by(2) {
            if !(literal.starts_with("/v1/") || literal.starts_with("/cluster/")) {
                continue;
            }
            // A `{tail}` placeholder stands for the rest of the path (the inbox verbs).
            let (path, tail) = match literal.split_once("{tail}") {
                Some((head, _)) => (head.to_string(), true),
                None => (literal.to_string(), false),
            };
            let path: String = path.replace("{}", "x");
            let concrete: Vec<&str> = path.split('?').next().unwrap().split('/').collect();
            let found = document["paths"].as_object().unwrap().iter().filter(|(template, _)| {
                let t: Vec<&str> = template.split('/').collect();
                let fits = |(t, c): (&&str, &&str)| t == c || t.starts_with('{');
                (t.len() == concrete.len() || (tail && t.len() > concrete.len()))
                    && t.iter().zip(&concrete).all(fits)
            });
            let ops: Vec<&Value> = found.flat_map(|(_, item)| item.as_object().unwrap().values()).collect();
            assert!(!ops.is_empty(), "tidal-client calls {literal}, which the document does not have");
            for name in query_names(&path) {
                assert!(
                    ops.iter().any(|op| documented_query(op).contains(&name)),
                    "{literal}: {name} undocumented"
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 15, "only {checked} client paths found: the scan is broken");
}

/// The committed copy is what the server serves; `TIDAL_BLESS=1` rewrites it.
#[test]
fn the_committed_document_is_the_generated_one() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json");
    let generated =
        serde_json::to_string_pretty(&tidal_server::http::openapi::document()).unwrap_or_default() + "\n";
    if std::env::var_os("TIDAL_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/openapi.json is not the generated document: run `TIDAL_BLESS=1 cargo test -p tidal-server --test t17_openapi` and commit it"
    );
}
