//! Feed latency: loads 100k items x 128 dims plus signals, then times 200 feed queries.
//!
//! Run: `cargo run --release -p tidal-core --example feed_bench [items] [dimension]`.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use tidal_core::{encode_payload, EngineConfig, Envelope, Records, SignalEvent, TidalDb};
use tidal_types::{Seqno, Term};
use tidal_wal::Batch;

fn main() {
    let mut args = std::env::args().skip(1);
    let items: u64 = args.next().map(|a| a.parse().unwrap()).unwrap_or(100_000);
    let dimension: u32 = args.next().map(|a| a.parse().unwrap()).unwrap_or(128);
    let dir = tempfile::tempdir().unwrap();
    let db = TidalDb::open(dir.path(), EngineConfig::with_dimension(dimension)).unwrap();
    let mut seqno = 1u64;
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut apply = |db: &TidalDb, time_ms: u64, records: Records| {
        let encoded =
            encode_payload(&Envelope { time_ms, principal: "bench".into(), ..Envelope::default() }, &records);
        let batch = Batch::new(encoded.kind, Term(1), Seqno(seqno), encoded.event_count, &encoded.payload);
        seqno += u64::from(encoded.event_count);
        db.apply(&batch).unwrap();
    };
    let time = 1_700_000_000_000u64;
    let started = Instant::now();
    for item in 0..items {
        let vector: Vec<f32> = (0..dimension).map(|_| (next() % 2001) as f32 / 1000.0 - 1.0).collect();
        apply(&db, time, Records::ItemEmbedding { item, vector });
    }
    let load_embeddings = started.elapsed();
    let started = Instant::now();
    let users = 1000u64;
    for batch in 0..200u64 {
        let events = (0..1000)
            .map(|_| SignalEvent {
                user: format!("user{}", next() % users),
                item: next() % items,
                kind: "view".into(),
                weight: 1.0,
                ts_ms: None,
            })
            .collect();
        apply(&db, time + batch * 1000, Records::Signals(events));
    }
    let load_signals = started.elapsed();
    println!(
        "loaded {items} embeddings x {dimension} in {load_embeddings:?}, 200k signals in {load_signals:?} ({:.0} signals/s)",
        200_000.0 / load_signals.as_secs_f64()
    );

    if std::env::var_os("SETTLE").is_some() {
        db.checkpoint().unwrap();
        std::thread::sleep(Duration::from_secs(10));
    }
    let mut latencies: Vec<Duration> = Vec::with_capacity(200);
    for query in 0..200u64 {
        let user = format!("user{}", query % users);
        let started = Instant::now();
        let ranked = db.feed(&user, 20, &[]).unwrap();
        latencies.push(started.elapsed());
        assert_eq!(ranked.items.len(), 20);
    }
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    println!("feed: p50 {:?}  p99 {:?}  max {:?}", at(0.50), at(0.99), at(1.0));

    let mut latencies: Vec<Duration> = Vec::with_capacity(200);
    for query in 0..200u64 {
        let started = Instant::now();
        db.similar(query, 10).unwrap().unwrap();
        latencies.push(started.elapsed());
    }
    latencies.sort();
    println!("similar: p50 {:?}  p99 {:?}", latencies[100], latencies[198]);
    let started = Instant::now();
    db.trending(20).unwrap();
    println!("trending: {:?}", started.elapsed());
    let started = Instant::now();
    drop(db);
    let db = TidalDb::open(dir.path(), EngineConfig::with_dimension(dimension)).unwrap();
    println!("reopen (index rebuild): {:?}, applied {}", started.elapsed(), db.applied_seqno());
}
