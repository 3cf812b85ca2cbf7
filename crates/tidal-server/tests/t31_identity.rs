//! A data dir belongs to one node (decisions/063): a WAL or an engine state copied in from another
//! node, or a data dir started under another node's configuration, is refused at start with both
//! identities named; a restart under the same identity starts as before.

#![allow(clippy::unwrap_used)] // tests may unwrap; helpers outside #[test] are not covered by allow-unwrap-in-tests

mod common;

use common::cluster::{Cluster, DEADLINE};
use std::path::Path;
use tidal_cluster::{ClusterSpec, Durability, NodeSpec};
use tidal_server::config::{ClusterMembership, ServeConfig};
use tidal_types::NodeId;

/// The configuration of node `me` of `spec` on `dir` (it need not be started).
fn member_config(dir: &Path, spec: &ClusterSpec, me: u64) -> ServeConfig {
    let mut config = common::config(dir, 4);
    config.cluster = Some(ClusterMembership {
        spec: spec.clone(),
        me: NodeId(me),
        timing: tidal_cluster::ControlTiming::default(),
        join: false,
    });
    config
}

/// What `run` answers for `config`: it must refuse to start.
async fn refusal(config: ServeConfig) -> String {
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let rpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let run = tidal_server::run(config, http, Some(rpc), std::future::pending());
    match tokio::time::timeout(DEADLINE, run).await {
        Ok(Err(error)) => format!("{error:#}"),
        Ok(Ok(())) => panic!("the node started and stopped"),
        Err(_) => panic!("the node started"),
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

fn other_cluster(spec: &ClusterSpec) -> ClusterSpec {
    let node = |id: u64| NodeSpec { id: NodeId(id), http: "127.0.0.1:1".into(), rpc: "127.0.0.1:2".into() };
    ClusterSpec {
        cluster_id: format!("{}-other", spec.cluster_id),
        secret: spec.secret.clone(),
        durability: Durability::Quorum,
        nodes: vec![node(1), node(2)],
        dial: Default::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_nodes_wal_or_engine_is_refused_naming_both_identities() {
    common::trace();
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(&root.path().join("a"), 1, Durability::Quorum, |_| {});
    cluster.start(0).await;
    cluster.put_acked(1, serde_json::json!({"title": "one"})).await;
    cluster.stop(0).await;
    // The same identity starts again, and finds its data.
    cluster.start(0).await;
    assert!(cluster.client(0).get_item(1).await.is_ok());
    cluster.stop(0).await;
    let source = cluster.dirs[0].clone();
    let recorded = format!("cluster id {:?}, node id 1", cluster.spec.cluster_id);
    let other = other_cluster(&cluster.spec);

    // Its WAL copied into node 2 of another cluster.
    let wal_copy = root.path().join("wal-copy");
    copy_dir(&source.join("wal"), &wal_copy.join("wal"));
    let error = refusal(member_config(&wal_copy, &other, 2)).await;
    let configured = format!("cluster id {:?}, node id 2", other.cluster_id);
    for expected in [&recorded, &configured, &wal_copy.join("wal").join("identity").display().to_string()] {
        assert!(error.contains(expected.as_str()), "{expected} not in: {error}");
    }
    // Another node id of the same cluster.
    let mut same_cluster = other.clone();
    same_cluster.cluster_id = cluster.spec.cluster_id.clone();
    let error = refusal(member_config(&wal_copy, &same_cluster, 2)).await;
    assert!(error.contains(&recorded) && error.contains("node id 2"), "{error}");
    // As a single node.
    let error = refusal(common::config(&wal_copy, 4)).await;
    assert!(error.contains(&recorded) && error.contains("a single node"), "{error}");

    // Its engine state alone copied into another node's data dir.
    let state_copy = root.path().join("state-copy");
    copy_dir(&source.join("state"), &state_copy.join("state"));
    let error = refusal(member_config(&state_copy, &other, 2)).await;
    assert!(error.contains(&recorded) && error.contains(&configured), "{error}");
    assert!(error.contains(&state_copy.join("state").display().to_string()), "{error}");

    // A refused start wrote no identity of its own.
    let identity = |dir: &Path| std::fs::read(dir.join("wal").join("identity")).unwrap();
    assert_eq!(identity(&wal_copy), identity(&source));
}

/// A data dir from a build without identities gets its identity at its first start and keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_dir_without_an_identity_gets_one() {
    common::trace();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data");
    let node = common::TestNode::start(common::config(&dir, 4)).await;
    node.stop().await;
    let file = dir.join("wal").join("identity");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("node_id = 0") && !text.contains("cluster_id"), "{text}");
    // An older build's data dir: no file (the engine keeps its key; the file alone is rewritten).
    std::fs::remove_file(&file).unwrap();
    let node = common::TestNode::start(common::config(&dir, 4)).await;
    node.stop().await;
    assert_eq!(std::fs::read_to_string(&file).unwrap(), text);
}
