//! The RPC port's bounds (issue 41): idle sockets from anyone who can reach the port (600 of them
//! held a node's RPC port for 48 s) neither push out the peers' connections nor stop replication,
//! and one that never carries the cluster secret is closed after the idle timeout.
#![allow(clippy::unwrap_used)]

mod common;

use common::cluster::{metric, Cluster};
use serde_json::json;
use std::time::Duration;
use tidal_cluster::Durability;
use tokio::io::AsyncReadExt;

fn tweak(config: &mut tidal_server::config::ServeConfig) {
    config.net.rpc_connections_max = 16;
    config.net.idle_timeout = Duration::from_secs(3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sockets_on_the_rpc_port_leave_replication_running_and_are_closed() {
    common::trace();
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(root.path(), 3, Durability::Quorum, tweak);
    cluster.start_all().await;
    let leader = cluster.leader().await;
    cluster.put_acked(1, json!({"before": true})).await;
    let rpc = cluster.spec.nodes[leader].rpc.clone();
    let mut idle = Vec::new();
    for _ in 0..32 {
        idle.push(tokio::net::TcpStream::connect(&rpc).await.unwrap());
    }
    // Twice the cap of strangers: each was admitted by closing an older stranger, never a peer.
    let client = cluster.client(leader).clone();
    for _ in 0..400 {
        if metric(&client, "tidal_connections_evicted_total{port=\"rpc\"}").await.unwrap_or(0.0) >= 16.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let open = metric(&client, "tidal_connections_open{port=\"rpc\"}").await.unwrap();
    assert!(open <= 16.0, "{open} RPC connections open, cap 16");
    // Quorum writes need a follower's acknowledgement over the RPC port: they still come.
    for id in 2..12 {
        cluster.put_acked(id, json!({"during": id})).await;
    }
    // The strangers still open never sent the secret: closed within the idle timeout.
    for socket in idle.iter_mut() {
        let mut buf = [0u8; 64];
        let closed = tokio::time::timeout(Duration::from_secs(15), async {
            loop {
                match socket.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        });
        assert!(closed.await.is_ok(), "an idle RPC socket without the secret stayed open");
    }
    cluster.stop_all().await;
}
