//! Startup replay throughput: writes a WAL of realistic batches (untimed), then opens a node on it
//! with an empty engine, as after a crash with nothing checkpointed, and times `Node::open`: WAL
//! recovery (scan + BLAKE3 verify of every batch), then replay (read + verify again + decode + fold
//! into the overlay, with the background flushes the bounded overlay needs).
//!
//! `cargo run --release -p tidal-server --example replay_bench -- [signals|items|embeddings] [MB] [runs]`
//!
//! - signals: 10,000 embedding batches (128-dim) first, then batches of 1,000 signals (10k users
//!   over 100k items, kinds from the default list, no `ts`);
//! - items: one metadata batch per item (about 100 bytes of JSON);
//! - embeddings: one 128-dim embedding batch per item.
//!
//! Each run opens a fresh copy of the same WAL (copied untimed) with an empty state directory, and
//! prints the open time, the replay time and MB/s and events/s; the last line is the median.
//! `TIDAL_BENCH_DIR` picks the scratch directory (default: a temp dir). `TIDAL_BENCH_REOPEN=1` also
//! times a clean restart of each run's replayed state (engine open, WAL scan, replay of the rest).
//! `TIDAL_BENCH_FEEDS=N` times N feed reads right after each open (p50, p99, max).
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use tidal_core::{encode_payload, Envelope, Records, SignalEvent};
use tidal_server::config::{ServeArgs, ServeConfig};
use tidal_server::node::Node;
use tidal_wal::{AppendRequest, NoopHook, StdIo, SystemClock, Wal, WalConfig};

const DIMENSION: usize = 128;
const USERS: u64 = 10_000;
const ITEMS: u64 = 100_000;
const EMBEDDED: u64 = 10_000;
const KINDS: [&str; 5] = ["view", "click", "like", "share", "skip"];

fn main() {
    let mut args = std::env::args().skip(1);
    let workload = args.next().unwrap_or_else(|| "signals".into());
    let mb: u64 = args.next().map_or(256, |a| a.parse().unwrap());
    let runs: usize = args.next().map_or(3, |a| a.parse().unwrap());
    let scratch = match std::env::var_os("TIDAL_BENCH_DIR") {
        Some(dir) => tempfile::tempdir_in(dir).unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    let master = scratch.path().join("master");
    let (bytes, events) = write_wal(&master.join("wal"), &workload, mb * 1_000_000);
    println!(
        "replay_bench: workload {workload}, WAL {:.1} MB, {events} events (written untimed)",
        bytes as f64 / 1e6
    );
    let mut rates = Vec::new();
    for run in 1..=runs {
        let data_dir = scratch.path().join(format!("run{run}"));
        copy_dir(&master.join("wal"), &data_dir.join("wal"));
        let args = ServeArgs { data_dir: Some(data_dir.clone()), ..ServeArgs::default() };
        let config = ServeConfig::resolve(&args).unwrap();
        let started = Instant::now();
        let (node, report) = Node::open(config).unwrap();
        let open = started.elapsed().as_secs_f64();
        let replay = report.elapsed.as_secs_f64();
        let rate = report.bytes as f64 / 1e6 / replay;
        println!(
            "run {run}: open {open:.2}s (replay {replay:.2}s of it): replay {rate:.1} MB/s, {:.0} events/s; \
             whole open {:.1} MB/s ({} batches, {:.1} MB)",
            events as f64 / replay,
            report.bytes as f64 / 1e6 / open,
            report.batches,
            report.bytes as f64 / 1e6,
        );
        println!(
            "run {run}: open = engine {:.2}s + WAL recovery {:.2}s ({:.0} MB/s) + replay {replay:.2}s + the rest",
            report.engine_open.as_secs_f64(),
            report.wal_recovery.as_secs_f64(),
            report.bytes as f64 / 1e6 / report.wal_recovery.as_secs_f64(),
        );
        // Where the fold waited for the flusher: the split of the two cores between them.
        let flush = node.db().stats().flush;
        println!(
            "run {run}: flushes {} ({} entries, {} ms), fold waited for the flusher {} times, {} ms",
            flush.flushes,
            flush.entries,
            flush.duration_ms_sum,
            flush.backpressure_waits,
            flush.backpressure_wait_ms_sum
        );
        if let Some(feeds) =
            std::env::var("TIDAL_BENCH_FEEDS").ok().and_then(|n| n.parse().ok()).filter(|&n| n > 0)
        {
            time_feeds(node.db(), run, feeds);
        }
        rates.push((rate, events as f64 / replay, report.bytes as f64 / 1e6 / open));
        let stopping = Instant::now();
        node.shutdown();
        drop(node);
        println!(
            "run {run}: clean shutdown {:.2}s; the engine's files: {:.1} MB",
            stopping.elapsed().as_secs_f64(),
            dir_bytes(&data_dir.join("state")) as f64 / 1e6
        );
        if std::env::var_os("TIDAL_BENCH_REOPEN").is_some() {
            // A clean restart of the replayed state: what an open costs with it all in fjall.
            let started = Instant::now();
            let (node, report) = Node::open(ServeConfig::resolve(&args).unwrap()).unwrap();
            println!(
                "run {run}: clean reopen {:.2}s = engine {:.2}s + WAL recovery {:.2}s + replay {:.2}s ({} batches) + the rest",
                started.elapsed().as_secs_f64(),
                report.engine_open.as_secs_f64(),
                report.wal_recovery.as_secs_f64(),
                report.elapsed.as_secs_f64(),
                report.batches,
            );
            node.shutdown();
            drop(node);
        }
        std::fs::remove_dir_all(&data_dir).unwrap();
    }
    let median = |pick: fn(&(f64, f64, f64)) -> f64| {
        let mut values: Vec<f64> = rates.iter().map(pick).collect();
        values.sort_by(f64::total_cmp);
        let mid = values.len() / 2;
        if values.len().is_multiple_of(2) {
            (values[mid - 1] + values[mid]) / 2.0
        } else {
            values[mid]
        }
    };
    println!(
        "median of {runs}: replay {:.1} MB/s, {:.0} events/s; whole open {:.1} MB/s",
        median(|r| r.0),
        median(|r| r.1),
        median(|r| r.2)
    );
}

/// Bytes of the files under `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .flatten()
            .map(|entry| match entry.file_type() {
                Ok(kind) if kind.is_dir() => dir_bytes(&entry.path()),
                _ => entry.metadata().map_or(0, |meta| meta.len()),
            })
            .sum()
    })
}

/// Times `count` feeds (20 items) of users spread over the workload's users, right after the open:
/// the reads that meet whatever the replay left in fjall (seen tables not compacted yet).
fn time_feeds(db: &tidal_core::TidalDb, run: usize, count: u64) {
    let mut micros: Vec<u128> = Vec::new();
    let mut returned = 0;
    for n in 0..count {
        let user = format!("user-{}", (n * 7_919) % USERS);
        let started = Instant::now();
        let feed = db.feed(&user, 20, &[]).unwrap();
        micros.push(started.elapsed().as_micros());
        returned += feed.items.len();
    }
    micros.sort_unstable();
    let at = |q: f64| micros[((micros.len() - 1) as f64 * q).round() as usize];
    println!(
        "run {run}: {count} feeds after the open: p50 {} µs, p99 {} µs, max {} µs ({} items returned)",
        at(0.5),
        at(0.99),
        micros.last().unwrap(),
        returned
    );
}

/// Writes batches of `workload` until the WAL holds `target` bytes; returns (bytes, events).
fn write_wal(dir: &Path, workload: &str, target: u64) -> (u64, u64) {
    let (wal, _) = Wal::open(
        WalConfig::new(dir.to_path_buf()),
        Arc::new(StdIo),
        Arc::new(SystemClock),
        Box::new(NoopHook),
    )
    .unwrap();
    let pending = Arc::new((Mutex::new(0u64), Condvar::new()));
    let failed = Arc::new(AtomicU64::new(0));
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let envelope = Envelope { time_ms: 0, principal: "bench".into(), idempotency_key: String::new() };
    let (mut bytes, mut events, mut n) = (0u64, 0u64, 0u64);
    let submit = |records: Records| {
        let encoded = encode_payload(&envelope, &records);
        let len = encoded.payload.len() as u64 + 64;
        {
            // The writer's queue is bounded (4,096 batches): keep at most 1,024 in flight.
            let (count, cond) = &*pending;
            let mut count = count.lock().unwrap();
            while *count >= 1024 {
                count = cond.wait(count).unwrap();
            }
            *count += 1;
        }
        let done_pending = pending.clone();
        let done_failed = failed.clone();
        let request =
            AppendRequest { kind: encoded.kind, event_count: encoded.event_count, payload: encoded.payload };
        wal.submit(
            request,
            Box::new(move |result| {
                if result.is_err() {
                    done_failed.fetch_add(1, Ordering::Relaxed);
                }
                let (count, cond) = &*done_pending;
                *count.lock().unwrap() -= 1;
                cond.notify_all();
            }),
        )
        .unwrap();
        len
    };
    let vector = |next: &mut dyn FnMut() -> u64| -> Vec<f32> {
        (0..DIMENSION).map(|_| (next() % 2001) as f32 / 1000.0 - 1.0).collect()
    };
    if workload == "signals" {
        for item in 0..EMBEDDED {
            let vector = vector(&mut next);
            bytes += submit(Records::ItemEmbedding { item: item * (ITEMS / EMBEDDED), vector });
            events += 1;
        }
    }
    while bytes < target {
        let records = match workload {
            "signals" => Records::Signals(
                (0..1000)
                    .map(|_| SignalEvent {
                        user: format!("user-{}", next() % USERS),
                        item: next() % ITEMS,
                        kind: KINDS[(next() % KINDS.len() as u64) as usize].into(),
                        weight: 1.0,
                        ts_ms: None,
                    })
                    .collect(),
            ),
            "items" => Records::ItemMetadata {
                item: n,
                metadata: format!(
                    r#"{{"title":"item number {n}","tags":["alpha","beta"],"price":{}}}"#,
                    n % 977
                )
                .into_bytes(),
            },
            "embeddings" => Records::ItemEmbedding { item: n % ITEMS, vector: vector(&mut next) },
            other => panic!("unknown workload {other}: signals, items or embeddings"),
        };
        events += records.event_count();
        bytes += submit(records);
        n += 1;
    }
    let (count, cond) = &*pending;
    let mut guard = count.lock().unwrap();
    while *guard > 0 {
        guard = cond.wait(guard).unwrap();
    }
    drop(guard);
    assert_eq!(failed.load(Ordering::Relaxed), 0, "WAL writes failed");
    wal.shutdown();
    (bytes, events)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}
