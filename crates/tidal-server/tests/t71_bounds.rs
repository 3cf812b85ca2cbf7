//! The ports' bounds (issue 41): a cap on connections that idle sockets cannot use up, a deadline
//! on request heads and bodies, and a budget of request-body bytes in flight.
#![allow(clippy::unwrap_used)]

mod common;

use common::TestNode;
use serde_json::json;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A metric's value, read over a fresh connection (a pooled one may be the one evicted):
/// `common::cluster::metric` makes a new client per call.
async fn metric(node: &TestNode, line_prefix: &str) -> f64 {
    common::cluster::metric(&node.client, line_prefix).await.unwrap_or_else(|| panic!("no {line_prefix}"))
}

/// Waits (bounded) until `metric` reaches `at_least`.
async fn metric_reaches(node: &TestNode, line_prefix: &str, at_least: f64) {
    for _ in 0..400 {
        if metric(node, line_prefix).await >= at_least {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{line_prefix} never reached {at_least} (now {})", metric(node, line_prefix).await);
}

/// Resident memory of this process (the node runs in it), in bytes.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    statm.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 4096
}

/// Peak resident memory of this process since the last [`reset_peak`], in bytes.
fn peak() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|line| line.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// Starts a new peak-memory window (Linux: `5` to clear_refs resets VmHWM to the current RSS).
fn reset_peak() {
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
}

/// Reads until the node closes the socket (EOF or reset); what it sent before that.
async fn until_closed(socket: &mut TcpStream, within: Duration) -> String {
    let mut seen = Vec::new();
    let read = tokio::time::timeout(within, async {
        let mut buf = [0u8; 4096];
        loop {
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the node kept the socket open for {within:?}");
    String::from_utf8_lossy(&seen).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twice_the_cap_of_idle_sockets_leaves_writes_acknowledged_and_memory_flat() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = common::config(dir.path(), 4);
    config.net.http_connections_max = 50;
    let node = TestNode::start(config).await;
    node.client.put_item(1, json!({"warm": true}), None).await.unwrap();
    let before = rss();
    let address = node.url.trim_start_matches("http://").to_string();
    let mut idle = Vec::new();
    for _ in 0..100 {
        idle.push(TcpStream::connect(&address).await.unwrap());
    }
    // Every one was admitted by evicting an older idle one once the port was full.
    metric_reaches(&node, "tidal_connections_evicted_total{port=\"http\"}", 50.0).await;
    for id in 0..20 {
        let reply = node.client.put_item(id, json!({"n": id}), None).await.unwrap();
        assert!(reply.seqno > 0);
    }
    let open = metric(&node, "tidal_connections_open{port=\"http\"}").await;
    assert!(open <= 50.0, "{open} connections open, cap 50");
    let grown = rss().saturating_sub(before);
    assert!(grown < 32 << 20, "memory grew {grown} bytes holding 100 idle sockets");
    // The oldest idle sockets were the ones closed.
    for socket in idle.iter_mut().take(40) {
        until_closed(socket, Duration::from_secs(10)).await;
    }
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_that_sends_nothing_or_half_a_head_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = common::config(dir.path(), 4);
    config.net.idle_timeout = Duration::from_millis(300);
    let node = TestNode::start(config).await;
    let address = node.url.trim_start_matches("http://").to_string();
    let mut silent = TcpStream::connect(&address).await.unwrap();
    until_closed(&mut silent, Duration::from_secs(10)).await;
    let mut slow = TcpStream::connect(&address).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n").await.unwrap();
    until_closed(&mut slow, Duration::from_secs(10)).await;
    // A whole request on a fresh socket is still answered.
    node.client.put_item(1, json!({}), None).await.unwrap();
    node.stop().await;
}

/// Sends the head of a PUT declaring `declared` body bytes, then `sent` of them.
async fn half_sent_body(address: &str, declared: usize, sent: usize) -> TcpStream {
    let mut socket = TcpStream::connect(address).await.unwrap();
    let head = format!(
        "PUT /v1/items/9 HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {declared}\r\n\r\n"
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    socket.write_all(&vec![b' '; sent]).await.unwrap();
    socket
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_bodies_are_bounded_in_bytes_and_in_time() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = common::config(dir.path(), 4);
    config.body_bytes_max = 32 * 1024;
    config.net.inflight_body_bytes_max = 64 * 1024;
    config.net.body_timeout = Duration::from_secs(2);
    let node = TestNode::start(config).await;
    let address = node.url.trim_start_matches("http://").to_string();
    let budget = "tidal_http_inflight_body_bytes";
    let mut first = half_sent_body(&address, 32_000, 30_000).await;
    metric_reaches(&node, budget, 30_000.0).await;
    let mut second = half_sent_body(&address, 32_000, 30_000).await;
    metric_reaches(&node, budget, 60_000.0).await;
    let mut third = half_sent_body(&address, 32_000, 30_000).await;
    let refused = until_closed(&mut third, Duration::from_secs(10)).await;
    assert!(refused.starts_with("HTTP/1.1 503") && refused.contains("overloaded"), "{refused}");
    // The first two never finish: each is answered 408 once its body is overdue, and the budget
    // is whole again.
    for socket in [&mut first, &mut second] {
        let answer = until_closed(socket, Duration::from_secs(10)).await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    }
    assert_eq!(metric(&node, budget).await, 0.0);
    let digest_before = node.client.digest().await.unwrap();
    assert_eq!(digest_before.applied_seqno, 0, "nothing was written");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_vector_or_metadata_body_costs_about_its_size_not_a_tree_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let node = TestNode::start(common::config(dir.path(), 4)).await;
    // 12 MB of `0,`: parsed into a tree of values it cost ~16x its size (issue 41).
    let zeros = "0,".repeat(6 << 20);
    let vector = format!("{{\"vector\":[{}0]}}", zeros);
    let metadata = format!("{{\"metadata\":{{\"list\":[{}0]}}}}", zeros);
    for (path, body, expected) in [
        ("/v1/items/1/embedding", &vector, (400, "dimension_mismatch")),
        ("/v1/items/1", &metadata, (413, "payload_too_large")),
    ] {
        reset_peak();
        let before = rss();
        let (status, reply) = node.request(reqwest::Method::PUT, path, Some(body), &[]).await;
        assert_eq!((status, common::error_code(&reply)), expected, "{reply}");
        // The client's copy of the body and the node's are both in this process: 2x is the floor.
        let peak = peak().saturating_sub(before);
        assert!(
            peak < 4 * body.len() as u64,
            "a {} byte body to {path} peaked at {peak} more bytes",
            body.len()
        );
    }
    node.stop().await;
}

/// `embeddings_max` bounds the ranking index (issue 44): a new embedding past the cap is refused
/// with 507 `index_full`, by the route and inside a tx (which then writes nothing); an item's
/// replacement embedding and other writes still go through; a delete makes room again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_past_the_cap_are_refused_and_nothing_is_half_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = common::config(dir.path(), 4);
    config.embeddings_max = 3;
    let node = TestNode::start(config).await;
    let vector = |n: u64| vec![n as f64, 1.0, 0.0, 0.5];
    for item in 1..=3 {
        node.client.put_embedding(item, vector(item)).await.unwrap();
    }
    let refused = node.client.put_embedding(4, vector(4)).await.unwrap_err();
    assert_eq!(refused.code(), Some("index_full"), "{refused:?}");
    assert!(matches!(refused, tidal_client::Error::Api { status: 507, .. }), "{refused:?}");
    assert!(format!("{refused:?}").contains("embeddings_max (3)"), "{refused:?}");
    let ops = [
        json!({"op": "put_item", "item": 9, "metadata": {"in": "tx"}}),
        json!({"op": "put_embedding", "item": 5, "vector": vector(5)}),
    ];
    let refused = node.client.tx(&ops, None).await.unwrap_err();
    assert_eq!(refused.code(), Some("index_full"), "{refused:?}");
    assert!(node.client.get_item(9).await.is_err(), "the refused tx wrote its first op");
    // Replacing an embedding the item has, and writes that add none, still go through.
    node.client.put_embedding(2, vector(20)).await.unwrap();
    node.client.put_item(4, json!({"metadata": "only"}), None).await.unwrap();
    node.client.delete_item(1).await.unwrap();
    node.client.put_embedding(4, vector(4)).await.unwrap();
    node.stop().await;
}
