//! The checkpointer's byte bounds (issue 43): past `checkpoint_engine_bytes_max` of fjall memtables
//! (journal entries that no table holds, which a crashed node's open replays one by one) or
//! `checkpoint_wal_bytes_max` of WAL since the last checkpoint, a checkpoint runs at once, and the
//! first one writes the memtables into tables (flushes under `engine_flush_ingest_bytes_min` go
//! through them, decisions/072: here all of them). The interval is an hour here, so only the bounds
//! can call for checkpoints: without them, the 8 MiB written would all stay in fjall's memtables
//! (fjall itself rotates a memtable only at 64 MiB).
#![allow(clippy::unwrap_used)]

mod common;

use common::TestNode;
use serde_json::json;
use std::time::{Duration, Instant};

/// Both bounds, small so that the test writes a few times past them in a second or two.
const BOUND: u64 = 1024 * 1024;
/// Stream events per publish, each of [`EVENT_BYTES`]: 256 KiB of payload a request.
const EVENTS_PER_PUBLISH: usize = 64;
const EVENT_BYTES: usize = 4096;
/// Publishes: 8 MiB of payload, eight times each bound.
const PUBLISHES: usize = 32;
/// How long the checkpointer may take to bring a figure under its bound once writes stop.
const SETTLE: Duration = Duration::from_secs(30);

async fn metric(node: &TestNode, name: &str) -> f64 {
    common::cluster::metric(&node.client, name).await.unwrap_or_else(|| panic!("no metric {name}"))
}

/// Polls (bounded) until `name` is at most `at_most`; its last value.
async fn settles_under(node: &TestNode, name: &str, at_most: f64) -> f64 {
    let deadline = Instant::now() + SETTLE;
    loop {
        let value = metric(node, name).await;
        if value <= at_most || Instant::now() >= deadline {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_by_bytes_keep_the_memtables_and_the_wal_past_them_bounded() {
    common::trace();
    let dir = tempfile::tempdir().unwrap();
    let mut config = common::config(dir.path(), 4);
    config.checkpoint_interval_ms = 3_600_000;
    config.checkpoint_engine_bytes_max = BOUND;
    config.checkpoint_wal_bytes_max = BOUND;
    // Every flush in one write batch, through fjall's journal and memtables, which this test
    // bounds: an ingested flush never reaches them (decisions/072).
    config.engine_flush_ingest_bytes_min = usize::MAX;
    let node = TestNode::start(config).await;
    let mut largest_memtables = 0f64;
    {
        tracing::info!("publish 8x the bounds in stream events, watching the memtables between writes");
        let payload = "x".repeat(EVENT_BYTES);
        let events: Vec<_> = (0..EVENTS_PER_PUBLISH).map(|_| json!({"payload": payload})).collect();
        let body = json!({ "events": events }).to_string();
        for _ in 0..PUBLISHES {
            let (status, reply) =
                node.request(reqwest::Method::POST, "/v1/streams/bulk/events", Some(&body), &[]).await;
            assert_eq!(status, 200, "{reply}");
            largest_memtables = largest_memtables.max(metric(&node, "tidal_engine_memtable_bytes").await);
        }
    }
    {
        tracing::info!("the checkpointer saw both bounds passed");
        let written = (PUBLISHES * EVENTS_PER_PUBLISH * EVENT_BYTES) as f64;
        let deadline = Instant::now() + SETTLE;
        let by = |reason: &'static str| format!("tidal_checkpoints_total{{reason=\"{reason}\"}}");
        while metric(&node, &by("engine_bytes")).await < 1.0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let engine_checkpoints = metric(&node, &by("engine_bytes")).await;
        assert!(
            engine_checkpoints >= 1.0,
            "no checkpoint for the engine's bytes after writing {written} bytes"
        );
        assert_eq!(metric(&node, &by("interval")).await, 0.0, "the interval is an hour");
        // Within one poll of the checkpointer a publish or two lands on top of a passed bound, but
        // never the whole 8 MiB: without the bound it all stays in the memtables.
        assert!(
            largest_memtables < written / 2.0,
            "fjall's memtables reached {largest_memtables} bytes of {written} written (bound {BOUND})"
        );
    }
    {
        tracing::info!("once writes stop, what a crash would replay is under the bounds");
        let memtables = settles_under(&node, "tidal_engine_memtable_bytes", BOUND as f64).await;
        assert!(memtables <= BOUND as f64, "fjall's memtables hold {memtables} bytes (bound {BOUND})");
        let wal = settles_under(&node, "tidal_wal_bytes_since_checkpoint", BOUND as f64).await;
        assert!(wal <= BOUND as f64, "{wal} WAL bytes since the last checkpoint (bound {BOUND})");
    }
    node.stop().await;
}
