//! Apply throughput: loads embeddings and item metadata, then times the fold of signal batches of
//! 1,000 events (10k users over 1M items), then a checkpoint, and the replay after a crash
//! (reopen without checkpoint).
//!
//! Run: `cargo run --release -p tidal-core --example apply_bench [signal_batches] [embedded_items]`;
//! `OVERLAY_BYTES_MAX=n` overrides the overlay bound. Sustained ingest with flushes (the apply
//! latency line shows what a flush costs the applier):
//! `OVERLAY_BYTES_MAX=16777216 cargo run --release -p tidal-core --example apply_bench 3000`.
#![allow(clippy::unwrap_used)]

use std::time::Instant;

use tidal_core::{encode_payload, EngineConfig, Envelope, Records, SignalEvent, TidalDb};
use tidal_types::{Seqno, Term};
use tidal_wal::Batch;

const DIMENSION: u32 = 128;
const USERS: u64 = 10_000;
const ITEMS: u64 = 1_000_000;
const METADATA_ITEMS: u64 = 20_000;
const EVENTS_PER_BATCH: usize = 1000;
const T0: u64 = 1_700_000_000_000;

struct Log {
    next: u64,
    batches: Vec<Batch>,
}

impl Log {
    fn push(&mut self, time_ms: u64, records: Records) -> Batch {
        let envelope = Envelope { time_ms, principal: "bench".into(), ..Envelope::default() };
        let encoded = encode_payload(&envelope, &records);
        let batch =
            Batch::new(encoded.kind, Term(1), Seqno(self.next), encoded.event_count, &encoded.payload);
        self.next += u64::from(encoded.event_count);
        self.batches.push(batch.clone());
        batch
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let signal_batches: u64 = args.next().map(|a| a.parse().unwrap()).unwrap_or(500);
    let embedded: u64 = args.next().map(|a| a.parse().unwrap()).unwrap_or(100_000);
    let dir = tempfile::tempdir().unwrap();
    let mut config = EngineConfig::with_dimension(DIMENSION);
    if let Some(bytes) = std::env::var_os("OVERLAY_BYTES_MAX") {
        config.overlay_bytes_max = bytes.to_str().unwrap().parse().unwrap();
    }
    let db = TidalDb::open(dir.path(), config.clone()).unwrap();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut log = Log { next: 1, batches: Vec::new() };

    // Embeddings: one batch per item, as PUT /v1/items/{id}/embedding makes them.
    let embedding_batches: Vec<Batch> = (0..embedded)
        .map(|n| {
            let vector: Vec<f32> = (0..DIMENSION).map(|_| (next() % 2001) as f32 / 1000.0 - 1.0).collect();
            log.push(T0, Records::ItemEmbedding { item: n * (ITEMS / embedded.max(1)), vector })
        })
        .collect();
    let started = Instant::now();
    for batch in &embedding_batches {
        db.apply(batch).unwrap();
    }
    let seconds = started.elapsed().as_secs_f64();
    println!("embeddings: {embedded} batches in {seconds:.3}s ({:.0} batches/s)", embedded as f64 / seconds);

    let metadata_batches: Vec<Batch> = (0..METADATA_ITEMS)
        .map(|n| {
            let metadata = format!(r#"{{"title":"item {n}","tags":["a","b"]}}"#).into_bytes();
            log.push(T0, Records::ItemMetadata { item: next() % ITEMS, metadata })
        })
        .collect();
    let started = Instant::now();
    for batch in &metadata_batches {
        db.apply(batch).unwrap();
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "item metadata: {METADATA_ITEMS} batches in {seconds:.3}s ({:.0} batches/s)",
        METADATA_ITEMS as f64 / seconds
    );

    // Untimed: the signals below are timed without a flush of the items in flight.
    db.checkpoint().unwrap();

    let kinds = ["view", "click", "like"];
    let signal_log: Vec<Batch> = (0..signal_batches)
        .map(|n| {
            let events = (0..EVENTS_PER_BATCH)
                .map(|_| SignalEvent {
                    user: format!("user{}", next() % USERS),
                    item: next() % ITEMS,
                    kind: kinds[(next() % 3) as usize].into(),
                    weight: 1.0,
                    ts_ms: None,
                })
                .collect();
            log.push(T0 + n * 100, Records::Signals(events))
        })
        .collect();
    let mut apply_ms: Vec<f64> = Vec::with_capacity(signal_log.len());
    let started = Instant::now();
    for batch in &signal_log {
        let apply_started = Instant::now();
        db.apply(batch).unwrap();
        apply_ms.push(apply_started.elapsed().as_secs_f64() * 1e3);
    }
    let seconds = started.elapsed().as_secs_f64();
    let signals = signal_batches * EVENTS_PER_BATCH as u64;
    println!("signals: {signals} in {seconds:.3}s ({:.0} signals/s)", signals as f64 / seconds);
    apply_ms.sort_unstable_by(f64::total_cmp);
    let quantile = |q: f64| apply_ms[((apply_ms.len() - 1) as f64 * q) as usize];
    println!(
        "apply of a 1,000-signal batch: p50 {:.3} ms, p99 {:.3} ms, max {:.1} ms",
        quantile(0.5),
        quantile(0.99),
        quantile(1.0)
    );
    let flush = db.stats().flush;
    println!(
        "flushes since open: {} (max {} ms), applies that waited for one: {} ({} ms)",
        flush.flushes, flush.max_duration_ms, flush.backpressure_waits, flush.backpressure_wait_ms_sum
    );

    let started = Instant::now();
    let checkpoint = db.checkpoint().unwrap();
    let flush_seconds = started.elapsed().as_secs_f64();
    println!(
        "checkpoint (flush + fsync) at {checkpoint}: {flush_seconds:.3}s; signals incl. it: {:.0} signals/s",
        signals as f64 / (seconds + flush_seconds)
    );
    let started = Instant::now();
    let (applied, digest) = db.digest().unwrap();
    println!(
        "digest at {applied}: {:.3}s ({:02x}{:02x}..)",
        started.elapsed().as_secs_f64(),
        digest[0],
        digest[1]
    );

    // More signals, then a crash: the overlay is lost and replay folds it again.
    let lost: Vec<Batch> = (0..signal_batches / 5)
        .map(|n| {
            let events = (0..EVENTS_PER_BATCH)
                .map(|_| SignalEvent {
                    user: format!("user{}", next() % USERS),
                    item: next() % ITEMS,
                    kind: kinds[(next() % 3) as usize].into(),
                    weight: 1.0,
                    ts_ms: None,
                })
                .collect();
            log.push(T0 + (signal_batches + n) * 100, Records::Signals(events))
        })
        .collect();
    for batch in &lost {
        db.apply(batch).unwrap();
    }
    let last = db.applied_seqno();
    db.simulate_crash();
    let started = Instant::now();
    let db = TidalDb::open(dir.path(), config).unwrap();
    let reopened = started.elapsed().as_secs_f64();
    let from = db.applied_seqno();
    let started = Instant::now();
    for batch in &log.batches {
        db.apply(batch).unwrap();
    }
    println!(
        "reopen after a crash: open {reopened:.3}s at seqno {from}, replay of {} batches to {} in {:.3}s",
        lost.len(),
        db.applied_seqno(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(db.applied_seqno(), last);
}
