//! Helpers for the engine's integration tests: a log builder that hands out seqnos like the WAL
//! writer does, and an engine opener.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::Path;

use tidal_core::{encode_payload, EngineConfig, EngineStats, Envelope, Records, SignalEvent, TidalDb};
use tidal_types::{Seqno, Term};
use tidal_wal::Batch;

pub const DIM: u32 = 4;
pub const HOUR: u64 = 3_600_000;
pub const T0: u64 = 1_700_000_000_000;

pub fn config() -> EngineConfig {
    EngineConfig { node_actor: (1, 1), ..EngineConfig::with_dimension(DIM) }
}

pub fn open(path: &Path) -> TidalDb {
    TidalDb::open(path, config()).unwrap()
}

pub fn open_with(path: &Path, config: EngineConfig) -> TidalDb {
    TidalDb::open(path, config).unwrap()
}

/// Builds batches with consecutive seqnos.
pub struct Log {
    pub next: u64,
    pub batches: Vec<Batch>,
}

impl Log {
    pub fn new() -> Log {
        Log { next: 1, batches: Vec::new() }
    }

    pub fn push_with(&mut self, envelope: Envelope, records: Records) -> Batch {
        let encoded = encode_payload(&envelope, &records);
        let batch =
            Batch::new(encoded.kind, Term(1), Seqno(self.next), encoded.event_count, &encoded.payload);
        self.next += u64::from(encoded.event_count);
        self.batches.push(batch.clone());
        batch
    }

    pub fn push(&mut self, time_ms: u64, records: Records) -> Batch {
        self.push_with(
            Envelope { time_ms, principal: "test".into(), idempotency_key: String::new() },
            records,
        )
    }

    pub fn item(&mut self, time_ms: u64, item: u64, json: &str) -> Batch {
        self.push(time_ms, Records::ItemMetadata { item, metadata: json.as_bytes().to_vec() })
    }

    pub fn embedding(&mut self, time_ms: u64, item: u64, vector: &[f32]) -> Batch {
        self.push(time_ms, Records::ItemEmbedding { item, vector: vector.to_vec() })
    }

    pub fn signals(&mut self, time_ms: u64, events: &[(&str, u64, &str, f64)]) -> Batch {
        let events = events
            .iter()
            .map(|(user, item, kind, weight)| SignalEvent {
                user: (*user).into(),
                item: *item,
                kind: (*kind).into(),
                weight: *weight,
                ts_ms: None,
            })
            .collect();
        self.push(time_ms, Records::Signals(events))
    }

    pub fn delete(&mut self, time_ms: u64, item: u64) -> Batch {
        self.push(time_ms, Records::ItemDelete { item })
    }
}

/// The state sizes of `db`'s stats: without the flush fields, which are node-local (when and how
/// often a node flushed), so replicas of one log compare equal.
/// The log-derived part of [`TidalDb::stats`]: flush progress and the ranking index's allocation
/// sizes (node-local) zeroed.
pub fn sizes(db: &TidalDb) -> EngineStats {
    EngineStats {
        flushed_applied_seqno: Seqno::ZERO,
        flush: Default::default(),
        feed_index_bytes: 0,
        ann_index_bytes: 0,
        ..db.stats()
    }
}

pub fn apply_all(db: &TidalDb, batches: &[Batch]) {
    for batch in batches {
        db.apply(batch).unwrap();
    }
}

/// A deterministic mixed workload: items, embeddings, signal batches (some touching one item many
/// times), a re-embedding, a delete, keyed writes.
pub fn workload() -> Log {
    let mut log = Log::new();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut time = T0;
    for item in 0..40u64 {
        log.item(time, item, &format!(r#"{{"n":{item}}}"#));
        let vector: Vec<f32> = (0..DIM).map(|_| (next() % 2001) as f32 / 1000.0 - 1.0).collect();
        log.embedding(time, item, &vector);
        time += 1000;
    }
    for round in 0..30u64 {
        let events: Vec<SignalEvent> = (0..(1 + next() % 50))
            .map(|_| SignalEvent {
                user: format!("u{}", next() % 7),
                item: next() % 45,
                kind: ["view", "click", "like"][(next() % 3) as usize].into(),
                weight: (next() % 5) as f64 * 0.5,
                ts_ms: (next() % 4 == 0).then(|| (time - (next() % (2 * HOUR))) as i64),
            })
            .collect();
        let key = if round % 3 == 0 { format!("k{round}") } else { String::new() };
        log.push_with(
            Envelope { time_ms: time, principal: format!("p{}", round % 2), idempotency_key: key },
            Records::Signals(events),
        );
        time += next() % HOUR;
        if round == 10 {
            log.embedding(time, 3, &[1.0, 0.0, 0.0, 0.0]);
        }
        if round == 20 {
            log.delete(time, 5);
        }
    }
    log
}
