//! The real binary as an OS process: SIGKILL under write load loses no acknowledged write; SIGTERM
//! drains and exits cleanly.

#![allow(clippy::unwrap_used)] // tests may unwrap; helpers outside #[test] are not covered by allow-unwrap-in-tests

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tidal_client::Client;
use tidal_procs::SingleNode;

/// One stand-alone node on `root/data`, logging to `root/node.log` (appended across restarts).
async fn start(root: &Path) -> SingleNode {
    let binary = Path::new(env!("CARGO_BIN_EXE_tidal"));
    SingleNode::start(binary, &root.join("data"), &root.join("node.log"), &["--dimension", "2"])
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_under_load_loses_no_acknowledged_write() {
    let dir = tidal_procs::TestDir::new().unwrap();
    let process = start(dir.path()).await;
    let client = process.client().clone();
    let acked = Arc::new(Mutex::new(Vec::<(u64, u64)>::new()));
    let next_id = Arc::new(AtomicU64::new(1));
    const KILL_AFTER_ACKS: usize = 400;
    let mut writers = Vec::new();
    for _ in 0..16 {
        let (client, acked, next_id) = (client.clone(), acked.clone(), next_id.clone());
        writers.push(tokio::spawn(async move {
            // Bounded: each writer stops at its first failure (the kill) or after 1000 writes.
            for _ in 0..1000 {
                let id = next_id.fetch_add(1, Ordering::Relaxed);
                match client.put_item(id, serde_json::json!({"id": id}), None).await {
                    Ok(reply) => acked.lock().unwrap().push((id, reply.seqno)),
                    Err(_) => return,
                }
            }
        }));
    }
    // Kill once enough writes were acknowledged, while the writers are still going.
    loop {
        if acked.lock().unwrap().len() >= KILL_AFTER_ACKS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    process.kill().unwrap();
    for writer in writers {
        writer.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() >= KILL_AFTER_ACKS);

    let process = start(dir.path()).await;
    let client = process.client().clone();
    for (id, seqno) in &acked {
        let item = client.get_item(*id).await.unwrap_or_else(|e| panic!("acknowledged item {id} lost: {e}"));
        assert_eq!(item.seqno, *seqno, "item {id} came back at another seqno");
    }
    let status = client.status().await.unwrap();
    let max_acked = acked.iter().map(|(_, s)| *s).max().unwrap();
    assert!(status.applied_seqno >= max_acked);
    process.kill().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_and_exits_zero() {
    let dir = tidal_procs::TestDir::new().unwrap();
    let process = start(dir.path()).await;
    let reply = process.client().put_item(7, serde_json::json!({"x": 1}), None).await.unwrap();
    let status = process.terminate().await.unwrap();
    assert!(status.success(), "tidal exited with {status} after SIGTERM");
    // The shutdown wrote fjall's memtables into tables (experiments/050): the item is in a table, not
    // only in fjall's journal, which the next open would replay entry by entry.
    {
        let engine = fjall::Database::builder(dir.path().join("data/state")).open().unwrap();
        let items = engine.keyspace("items", fjall::KeyspaceCreateOptions::default).unwrap();
        assert!(items.table_count() > 0, "a clean shutdown left the items in fjall's journal only");
    }
    let process = start(dir.path()).await;
    assert_eq!(process.client().get_item(7).await.unwrap().seqno, reply.seqno);
    process.kill().unwrap();
}

/// Stops the local cluster in a directory when dropped (by its pid files), whatever the test did.
struct Down<'a>(&'a std::path::Path);

impl Drop for Down<'_> {
    fn drop(&mut self) {
        let _ =
            Command::new(env!("CARGO_BIN_EXE_tidal")).args(["cluster", "down", "--dir"]).arg(self.0).output();
    }
}

/// Runs `tidal cluster up` for 3 nodes from `port_base` in `dir` and returns what it said.
fn cluster_up(dir: &std::path::Path, port_base: u16) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tidal"))
        .args(["cluster", "up", "--nodes", "3", "--port-base", &port_base.to_string(), "--dir"])
        .arg(dir)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_up_starts_a_healthy_local_cluster_and_down_stops_it() {
    let dir = tidal_procs::TestDir::new().unwrap();
    // Held for the test's life: no other test takes these ports while the nodes start and stop.
    let ports = tidal_procs::PortLease::take_block(3, tidal_cli::cluster_cmd::RPC_PORT_OFFSET).unwrap();
    let port_base = ports.port(0);
    let up = cluster_up(dir.path(), port_base);
    // Whatever happens below, the processes this test started are stopped (by their pid files).
    let _down = Down(dir.path());
    let stdout = String::from_utf8_lossy(&up.stdout);
    assert!(up.status.success(), "cluster up failed: {stdout}\n{}", String::from_utf8_lossy(&up.stderr));
    assert!(stdout.contains("is up (3 nodes, quorum durability)"), "{stdout}");
    let follower = Client::new(format!("http://127.0.0.1:{}", port_base + 2), None);
    // A write through any node reaches the leader (forwarded when this node follows).
    let reply = follower.put_item(5, serde_json::json!({"via": "follower"}), None).await.unwrap();
    // openraft elected some node; the follower names it (node N serves HTTP on port_base + N - 1).
    let leader_id = follower.status().await.unwrap().leader_id.expect("a ready node knows the leader");
    let leader = Client::new(format!("http://127.0.0.1:{}", port_base + leader_id as u16 - 1), None);
    let status = leader.status().await.unwrap();
    assert_eq!(status.role, "leader");
    assert_eq!(status.nodes.len(), 3);
    assert!(status.commit_seqno >= reply.seqno);
    let down = Command::new(env!("CARGO_BIN_EXE_tidal"))
        .args(["cluster", "down", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(down.status.success());
    assert!(String::from_utf8_lossy(&down.stdout).contains("3 node(s) stopped"));
}

/// A node that cannot start (its HTTP port is taken) fails `cluster up` at once, not after the ready
/// timeout, and the error quotes the node's own words from its log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_up_fails_at_once_when_a_node_exits_and_quotes_its_log() {
    let dir = tidal_procs::TestDir::new().unwrap();
    // Held for the test's life: no other test takes these ports while the nodes start and stop.
    let ports = tidal_procs::PortLease::take_block(3, tidal_cli::cluster_cmd::RPC_PORT_OFFSET).unwrap();
    let port_base = ports.port(0);
    // Node 3's HTTP port, held by this test for as long as `cluster up` runs.
    let taken = std::net::TcpListener::bind(("127.0.0.1", port_base + 2)).unwrap();
    let up = cluster_up(dir.path(), port_base);
    let _down = Down(dir.path());
    drop(taken);
    let stderr = String::from_utf8_lossy(&up.stderr);
    assert!(!up.status.success(), "cluster up succeeded with node 3's port taken");
    assert!(stderr.contains("node 3 exited before it was ready"), "{stderr}");
    assert!(stderr.contains("bind HTTP address"), "the error does not quote node 3's log: {stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_add_node_and_remove_node_change_the_membership_of_real_processes() {
    let dir = tidal_procs::TestDir::new().unwrap();
    // Held for the test's life: no other test takes these ports while the nodes start and stop.
    let ports = tidal_procs::PortLease::take_block(4, tidal_cli::cluster_cmd::RPC_PORT_OFFSET).unwrap();
    let port_base = ports.port(0);
    let tidal = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_tidal"))
            .args(args)
            .arg("--dir")
            .arg(dir.path())
            .env("RUST_LOG", "warn")
            .output()
            .unwrap()
    };
    let up = tidal(&["cluster", "up", "--nodes", "3", "--port-base", &port_base.to_string()]);
    let _down = Down(dir.path());
    assert!(up.status.success(), "cluster up failed: {}", String::from_utf8_lossy(&up.stderr));
    let node = |id: u64| Client::new(format!("http://127.0.0.1:{}", port_base + id as u16 - 1), None);
    let mut last = 0;
    for id in 0..25 {
        last = node(1).put_item(id, serde_json::json!({"id": id}), None).await.unwrap().seqno;
    }
    let added = tidal(&["cluster", "add-node"]);
    let stdout = String::from_utf8_lossy(&added.stdout);
    assert!(added.status.success(), "add-node failed: {stdout}\n{}", String::from_utf8_lossy(&added.stderr));
    assert!(stdout.contains("is now a voter"), "{stdout}");
    // The new process holds the history: same digest as node 1 at the last acknowledged write.
    let digest = |client: Client| async move {
        client
            .json::<(), tidal_types::DigestView>(
                reqwest::Method::GET,
                &format!("/cluster/digest?min_seqno={last}"),
                None,
            )
            .await
            .unwrap()
            .digest
    };
    assert_eq!(digest(node(4)).await, digest(node(1)).await);
    let status = node(4).status().await.unwrap();
    assert_eq!(status.nodes.iter().filter(|n| !n.learner).count(), 4, "{status:?}");
    // Remove a founder that does not lead: it is stopped, its data dir moved aside, 3 voters remain.
    let leader = status.leader_id.unwrap();
    let gone = (1..=3).find(|id| *id != leader).unwrap();
    let refused = tidal(&["cluster", "remove-node", "--node", &leader.to_string()]);
    assert!(!refused.status.success(), "removing the leader must be refused");
    let removed = tidal(&["cluster", "remove-node", "--node", &gone.to_string()]);
    assert!(removed.status.success(), "remove-node failed: {}", String::from_utf8_lossy(&removed.stderr));
    assert!(dir.path().join(format!("n{gone}.removed")).exists());
    let status = node(4).status().await.unwrap();
    let voters: Vec<u64> = status.nodes.iter().filter(|n| !n.learner).map(|n| n.id).collect();
    assert_eq!(voters.len(), 3, "{status:?}");
    assert!(!voters.contains(&gone), "{status:?}");
    // Writes still commit with the three remaining voters.
    let survivor = (1..=4).find(|id| *id != gone).unwrap();
    node(survivor).put_item(99, serde_json::json!({"after": "remove"}), None).await.unwrap();
}
