//! Streams with the real binary as an OS process: the `tidal stream` verbs and the stream bench
//! workloads drive it, and a SIGKILL under publish load loses no acknowledged event.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use tidal_client::Publish;
use tidal_procs::SingleNode;

async fn start(root: &Path) -> SingleNode {
    let binary = Path::new(env!("CARGO_BIN_EXE_tidal"));
    SingleNode::start(binary, &root.join("data"), &root.join("node.log"), &["--dimension", "2"])
        .await
        .unwrap()
}

/// Runs `tidal ARGS` and returns its stdout; fails with its stderr if it exits non-zero.
fn tidal(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_tidal")).args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "tidal {args:?} failed: {stderr}");
    String::from_utf8(output.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_verbs_and_bench_workloads_drive_a_node() {
    let dir = tidal_procs::TestDir::new().unwrap();
    let node = start(dir.path()).await;
    let url = node.url().to_string();
    let published: serde_json::Value = serde_json::from_str(&tidal(&[
        "stream",
        "publish",
        "--url",
        &url,
        "orders",
        "{\"a\":1}",
        "[2]",
        "--key",
        "k",
    ]))
    .unwrap();
    let offsets: Vec<u64> = serde_json::from_value(published["offsets"].clone()).unwrap();
    assert_eq!(offsets.len(), 2);
    let read = tidal(&["stream", "read", "--url", &url, "orders"]);
    let lines: Vec<serde_json::Value> =
        read.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[1]["payload"], serde_json::json!([2]));
    assert_eq!(lines[0]["key"], "k");
    let saved =
        tidal(&["stream", "offset", "--url", &url, "orders", "billing", "--set", &offsets[0].to_string()]);
    assert!(saved.contains(&format!("\"offset\":{}", offsets[0])), "{saved}");
    let after_consumer = tidal(&["stream", "read", "--url", &url, "orders", "--consumer", "billing"]);
    assert_eq!(after_consumer.lines().count(), 1);
    tidal(&["stream", "trim", "--url", &url, "orders", "--through", &offsets[0].to_string()]);
    let list: serde_json::Value = serde_json::from_str(&tidal(&["stream", "list", "--url", &url])).unwrap();
    assert_eq!(list["streams"][0]["events"], 1);
    assert_eq!(list["streams"][0]["trimmed_through"], offsets[0]);
    let bad = Command::new(env!("CARGO_BIN_EXE_tidal"))
        .args(["stream", "publish", "--url", &url, "orders", "{not json"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    for workload in [
        vec!["--workload", "publish", "--batch", "10", "--requests-max", "50"],
        vec!["--workload", "stream-read", "--items", "2000", "--requests-max", "20"],
    ] {
        let mut args = vec!["bench", "--url", &url, "--concurrency", "2", "--seconds", "5", "--quiet"];
        args.extend(workload.iter().copied());
        let table = tidal(&args);
        let row = table
            .lines()
            .find(|line| line.starts_with("| Publish") || line.starts_with("| StreamRead"))
            .unwrap();
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        assert_eq!(cells[5], "0", "no errors: {row}");
        assert!(cells[8].parse::<f64>().unwrap() > 0.0, "events/s: {row}");
    }
    node.terminate().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_under_publish_load_loses_no_acknowledged_event() {
    let dir = tidal_procs::TestDir::new().unwrap();
    let node = start(dir.path()).await;
    let client = node.client().clone();
    let acked = Arc::new(Mutex::new(Vec::<(u64, u64)>::new()));
    let mut writers = Vec::new();
    for writer in 0..8u64 {
        let (client, acked) = (client.clone(), acked.clone());
        writers.push(tokio::spawn(async move {
            // Bounded: each writer stops at its first failure (the kill) or after 500 publishes.
            for n in 0..500u64 {
                let id = writer * 1000 + n;
                let events = [Publish { payload: serde_json::json!({ "id": id }), key: None }];
                match client.publish("s", &events, None).await {
                    Ok(reply) => acked.lock().unwrap().push((reply.offsets[0], id)),
                    Err(_) => return,
                }
            }
        }));
    }
    loop {
        if acked.lock().unwrap().len() >= 300 {
            break;
        }
        tokio::task::yield_now().await;
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    node.kill().unwrap();
    for writer in writers {
        writer.await.unwrap();
    }
    let node = start(dir.path()).await;
    let mut held = std::collections::BTreeMap::new();
    let mut after = 0;
    loop {
        let page = node.client().read_stream("s", after, 1000).await.unwrap();
        let Some(last) = page.events.last() else { break };
        after = last.offset;
        for event in page.events {
            held.insert(event.offset, event.payload["id"].as_u64().unwrap());
        }
    }
    for (offset, id) in acked.lock().unwrap().iter() {
        assert_eq!(held.get(offset), Some(id), "acknowledged event {id} at offset {offset} lost");
    }
    node.kill().unwrap();
}
