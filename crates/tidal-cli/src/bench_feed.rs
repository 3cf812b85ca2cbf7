//! The feed and similar-items workloads' load and figures: clustered embeddings loaded in txs,
//! recall@20 of the node's answers against its exact scan (`exact=true`), the ranking index's
//! memory from `/metrics`, and embedding writes at a fixed rate beside the reads.
//!
//! Delicate: the embeddings are drawn around [`CLUSTERS`] centres, as real embeddings cluster;
//! uniform random vectors in 128 dimensions have no near neighbours to find (every item is about
//! as far as every other), which no approximate index is built for. Users click mostly in one
//! cluster, so their profiles point somewhere.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tidal_client::Client;
use tidal_types::SignalIn;

use crate::bench::{BenchArgs, Workload};

/// Centres the embeddings are drawn around.
const CLUSTERS: u64 = 1000;
/// Spread of an item around its centre, relative to the spread of the centres.
const SPREAD: f64 = 0.5;
/// Embeddings per tx while loading (the route's bound is 1000).
const LOAD_TX_OPS: u64 = 500;
/// Concurrent load requests: the node's applier is the bound, not the client.
const LOAD_TASKS: usize = 4;
/// Results per query whose recall is measured.
const RECALL_K: usize = 20;

/// What the feed and similar workloads measured beyond the latency table.
#[derive(Clone, Debug)]
pub struct FeedFigures {
    /// Mean recall@20 of the answers of the run's kind (feed or similar) against `exact=true`.
    pub recall: f64,
    /// Users (or items) sampled for it.
    pub samples: usize,
    /// Embeddings per second while loading.
    pub load_per_second: f64,
    /// `tidal_feed_index_bytes` and `tidal_feed_ann_index_bytes` after the run, in MB.
    pub index_mb: f64,
    /// See `index_mb`.
    pub ann_mb: f64,
    /// Embedding writes acknowledged per second during the run (`--embedding-rate`).
    pub writes_per_second: f64,
}

/// Item `id`'s embedding: its cluster's centre plus [`SPREAD`] of noise.
pub fn clustered_embedding(id: u64, dim: usize) -> Vec<f64> {
    let cluster = id % CLUSTERS;
    (0..dim as u64).map(|d| uniform(cluster * 4099 + d) + SPREAD * uniform((id << 16) ^ d ^ 0x5EED)).collect()
}

/// SplitMix64 of `seed` as a value in [-1, 1).
fn uniform(seed: u64) -> f64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
}

/// Loads `--items` clustered embeddings (txs of [`LOAD_TX_OPS`]) and every user's clicks (four in
/// five in the user's own cluster); returns the embeddings loaded per second.
pub async fn preload(client: &Client, args: &BenchArgs) -> anyhow::Result<f64> {
    eprintln!("bench: loading {} items with {}-dim clustered embeddings", args.items, args.dim);
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..LOAD_TASKS {
        let (client, next, items, dim) = (client.clone(), next.clone(), args.items, args.dim);
        tasks.push(tokio::spawn(async move {
            loop {
                let first = next.fetch_add(LOAD_TX_OPS, Ordering::Relaxed);
                if first >= items {
                    return Ok::<(), anyhow::Error>(());
                }
                let ops: Vec<serde_json::Value> = (first..(first + LOAD_TX_OPS).min(items))
                    .map(|id| {
                        let vector = clustered_embedding(id, dim);
                        serde_json::json!({"op": "put_embedding", "item": id, "vector": vector})
                    })
                    .collect();
                client.tx(&ops, None).await.context("preload embeddings")?;
                if first % 100_000 < LOAD_TX_OPS {
                    eprint!("\rbench: {first} embeddings loaded");
                }
            }
        }));
    }
    for task in tasks {
        task.await??;
    }
    let load_per_second = args.items as f64 / started.elapsed().as_secs_f64().max(1e-9);
    eprintln!("\rbench: {} embeddings loaded, {load_per_second:.0}/s", args.items);
    let users = args.users.max(1);
    let per_cluster = (args.items / CLUSTERS).max(1);
    for chunk in 0..(users / 100).max(1) {
        let signals = (0..1000u64)
            .map(|i| {
                let user = (chunk * 100 + i % 100) % users;
                let pick = (i * 7919 + chunk) % per_cluster;
                let item = if i % 5 == 0 {
                    (i * 7919 + chunk * 31) % args.items
                } else {
                    user % CLUSTERS + CLUSTERS * pick
                };
                SignalIn {
                    user: format!("u{user}"),
                    item: item.min(args.items - 1),
                    kind: "click".into(),
                    weight: None,
                    ts: None,
                }
            })
            .collect();
        client.post_signals(signals, None).await.context("preload signals")?;
    }
    Ok(load_per_second)
}

/// Mean recall@20 of `samples` feeds (or similar lists) against the exact scan.
pub async fn recall(client: &Client, args: &BenchArgs, samples: usize) -> anyhow::Result<f64> {
    let (mut found, mut wanted) = (0usize, 0usize);
    for n in 0..samples as u64 {
        let (approximate, exact) = match args.workload {
            Workload::Similar => {
                let id = (n * 7_919) % args.items.max(1);
                (client.similar(id, RECALL_K, false).await?, client.similar(id, RECALL_K, true).await?)
            }
            _ => {
                let user = format!("u{}", (n * 7) % args.users.max(1));
                (
                    client.feed_with(&user, RECALL_K, false).await?,
                    client.feed_with(&user, RECALL_K, true).await?,
                )
            }
        };
        wanted += exact.items.len();
        found += approximate.items.iter().filter(|a| exact.items.iter().any(|e| e.item == a.item)).count();
    }
    Ok(if wanted == 0 { 1.0 } else { found as f64 / wanted as f64 })
}

/// The ranking index's bytes from `/metrics` (total, approximate part), in MB.
pub async fn index_mb(client: &Client) -> (f64, f64) {
    let text = crate::bench::fetch_metrics(client.base(), client.token()).await.unwrap_or_default();
    let gauge = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
            .and_then(|value| value.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1e6
    };
    (gauge("tidal_feed_index_bytes"), gauge("tidal_feed_ann_index_bytes"))
}

/// Writes new clustered embeddings (ids from `--items` on) at `--embedding-rate` per second until
/// `stop`; returns the number acknowledged.
pub fn spawn_writes(
    client: &Client,
    args: &BenchArgs,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<u64> {
    let (client, rate, first, dim) = (client.clone(), args.embedding_rate, args.items, args.dim);
    tokio::spawn(async move {
        if rate == 0 {
            return 0;
        }
        let done = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        // Sixteen writers: one write waits for a group commit (a few ms), so one writer alone
        // could not keep 1k/s; each takes every 16th slot of the schedule.
        let writers: Vec<_> = (0..16u64)
            .map(|lane| {
                let (client, done, stop) = (client.clone(), done.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut n = lane;
                    while !stop.load(Ordering::Relaxed) {
                        let due = started + Duration::from_secs_f64(n as f64 / rate as f64);
                        tokio::time::sleep_until(due.into()).await;
                        let id = first + n;
                        if client.put_embedding(id, clustered_embedding(id, dim)).await.is_ok() {
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                        n += 16;
                    }
                })
            })
            .collect();
        for writer in writers {
            let _ = writer.await;
        }
        done.load(Ordering::Relaxed)
    })
}

impl FeedFigures {
    /// The figures, then the last line: `feed: items <N>, dims <D>, recall@20 <R>, p50 <X> ms,
    /// p99 <Y> ms, index <MB> MB` (`similar:` for the similar workload).
    pub fn print(&self, args: &BenchArgs, p50_ms: f64, p99_ms: f64) {
        println!(
            "\nload: {:.0} embeddings/s; ranking index {:.1} MB ({:.1} MB approximate index, {:.1} bytes per item); \
             embedding writes during the run: {:.0}/s; recall@{RECALL_K} over {} samples{}",
            self.load_per_second,
            self.index_mb,
            self.ann_mb,
            self.ann_mb * 1e6 / args.items.max(1) as f64,
            self.writes_per_second,
            self.samples,
            if args.exact { " (the run's reads asked for exact=true)" } else { "" },
        );
        let kind = if matches!(args.workload, Workload::Similar) { "similar" } else { "feed" };
        println!(
            "{kind}: items {}, dims {}, recall@{RECALL_K} {:.3}, p50 {:.2} ms, p99 {:.2} ms, index {:.1} MB",
            args.items, args.dim, self.recall, p50_ms, p99_ms, self.index_mb
        );
    }
}
