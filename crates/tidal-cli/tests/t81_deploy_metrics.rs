//! The monitoring files in `deploy/prometheus/` name only metrics that a real node exports.
//!
//! A rule or a panel over a misspelt or renamed series never fires and never draws: it fails
//! silently, in production, when it is needed. So this test starts a real 3-node cluster of the
//! `tidal` binary (chaos/process), reads `/metrics` from every node (the leader's per-follower
//! families and the followers' own), and checks every `tidal_*` name in the rules file and in every
//! expression of the Grafana dashboard against what the nodes export. Recording rules
//! (`tidal:...`) used by an alert or a panel must be defined in the rules file.
//!
//! Delicate: some families have no samples until something happens (`tidal_follower_snapshot`
//! while no follower installs a snapshot). A family counts as exported when its `# TYPE` line is
//! there, as Prometheus itself would see it once it has a sample.

#![allow(clippy::unwrap_used)] // tests may unwrap; helpers outside #[test] are not covered by allow-unwrap-in-tests

use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Instant;
use tidal_procs::{ProcessCluster, DEADLINE, POLL};

/// The rules file and the dashboard, relative to the repository root.
const RULES: &str = "deploy/prometheus/tidal-rules.yml";
const DASHBOARD: &str = "deploy/prometheus/tidal-dashboard.json";
/// A check that found fewer names than this read the files wrongly (a vacuous pass).
const NAMES_MIN: usize = 15;

fn repository_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every metric name a Prometheus text exposition exports: sample names and `# TYPE` families.
fn exported_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some(name) = rest.split_whitespace().next() {
                names.insert(name.to_string());
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_string());
        }
    }
    names
}

/// Words of a PromQL expression (or any text): runs of `[A-Za-z0-9_:]`.
fn words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')).filter(|word| !word.is_empty())
}

/// The metric names (`tidal_*`) and recording-rule names (`tidal:*`) a text uses.
fn used_names(text: &str, metrics: &mut BTreeSet<String>, recorded: &mut BTreeSet<String>) {
    for word in words(text) {
        if word.starts_with("tidal_") {
            metrics.insert(word.to_string());
        } else if word.starts_with("tidal:") {
            recorded.insert(word.to_string());
        }
    }
}

/// The rules file, read as text: every non-comment line is scanned (expressions, and the
/// annotations that quote series too); `record:` lines define recording rules.
fn rules_names(text: &str) -> (BTreeSet<String>, BTreeSet<String>, BTreeSet<String>) {
    let (mut metrics, mut used_recorded, mut defined) = (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
    for line in text.lines().map(str::trim).filter(|line| !line.starts_with('#')) {
        let line = line.trim_start_matches("- ");
        if let Some(name) = line.strip_prefix("record:") {
            defined.insert(name.trim().trim_matches('"').to_string());
            continue;
        }
        used_names(line, &mut metrics, &mut used_recorded);
    }
    (metrics, used_recorded, defined)
}

/// Every query string of a Grafana dashboard: panel targets' `expr`, template variables' `query`
/// and `definition`.
fn dashboard_queries(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                match (key.as_str(), child) {
                    ("expr" | "query" | "definition", Value::String(text)) => out.push(text.clone()),
                    _ => dashboard_queries(child, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| dashboard_queries(item, out)),
        _ => {}
    }
}

/// The union of every node's `/metrics` names, once the leader reports its followers.
async fn cluster_names(cluster: &ProcessCluster) -> BTreeSet<String> {
    let leader = cluster.leader().await.unwrap();
    // A write, so that the write path's series have samples as well as families.
    cluster.client(leader).put_item(1, json!({"deploy": "metrics"}), Some("t81-1")).await.unwrap();
    let deadline = Instant::now() + DEADLINE;
    loop {
        let text = cluster.metrics(leader).await.unwrap();
        if text.lines().filter(|line| line.starts_with("tidal_follower_last_ack_seconds{")).count() == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "the leader never reported both followers:\n{text}");
        tokio::time::sleep(POLL).await;
    }
    let mut names = BTreeSet::new();
    for id in cluster.ids() {
        names.extend(exported_names(&cluster.metrics(id).await.unwrap()));
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_rules_and_the_dashboard_use_is_exported() {
    let root = repository_root();
    let rules = std::fs::read_to_string(root.join(RULES)).unwrap();
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(root.join(DASHBOARD)).unwrap()).unwrap();

    let (mut used, mut used_recorded, defined) = rules_names(&rules);
    let mut queries = Vec::new();
    dashboard_queries(&dashboard, &mut queries);
    for query in &queries {
        used_names(query, &mut used, &mut used_recorded);
    }
    assert!(used.len() >= NAMES_MIN, "only {} tidal_* names found: {used:?}", used.len());
    assert!(queries.len() >= NAMES_MIN, "only {} dashboard queries found", queries.len());
    let undefined: Vec<_> = used_recorded.difference(&defined).collect();
    assert!(undefined.is_empty(), "recording rules used but not defined in {RULES}: {undefined:?}");

    let dir = tidal_procs::TestDir::new().unwrap();
    let cluster =
        ProcessCluster::start(Path::new(env!("CARGO_BIN_EXE_tidal")), dir.path(), 3, "quorum").await.unwrap();
    let exported = cluster_names(&cluster).await;
    // A histogram's samples are NAME_bucket, NAME_sum and NAME_count; its family is NAME.
    let missing: Vec<_> = used.iter().filter(|name| !exported.contains(*name)).collect();
    assert!(
        missing.is_empty(),
        "{RULES} or {DASHBOARD} use metrics no node exports: {missing:?}\nexported: {exported:?}"
    );
    println!(
        "deploy metrics: {} names used by {} rules-file lines and {} dashboard queries, all exported",
        used.len(),
        rules.lines().count(),
        queries.len()
    );
}

#[test]
fn names_are_read_from_expressions_and_expositions() {
    let (metrics, used, defined) = rules_names(
        "# tidal_in_a_comment\n- record: tidal:lag\n  expr: max by (job) (tidal_commit_seqno) - tidal_applied_seqno\n\
         - alert: X\n  expr: tidal:lag > 5 and up{job=\"tidal\"} == 1\n",
    );
    assert_eq!(metrics, ["tidal_applied_seqno", "tidal_commit_seqno"].map(String::from).into());
    assert_eq!(used, ["tidal:lag"].map(String::from).into());
    assert_eq!(defined, ["tidal:lag"].map(String::from).into());
    let exported = exported_names(
        "# HELP tidal_x_seconds x\n# TYPE tidal_x_seconds histogram\ntidal_x_seconds_bucket{le=\"1\"} 2\n\
         # TYPE tidal_follower_snapshot gauge\ntidal_up 1\n",
    );
    assert_eq!(
        exported,
        ["tidal_follower_snapshot", "tidal_up", "tidal_x_seconds", "tidal_x_seconds_bucket"]
            .map(String::from)
            .into()
    );
    let mut queries = Vec::new();
    dashboard_queries(
        &json!({"panels": [{"targets": [{"expr": "a"}]}], "templating": {"list": [{"query": {"query": "b"}}]}}),
        &mut queries,
    );
    assert_eq!(queries, ["a", "b"]);
}
