//! The one apply path: idempotent replays, gaps, bad input, deletes, idempotency table.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

mod common;

use common::*;
use tidal_core::{encode_payload, ApplyOutcome, EngineConfig, Envelope, Error, Records, TidalDb};
use tidal_types::{RecordKind, Seqno, Term};
use tidal_wal::Batch;

#[test]
fn replaying_the_log_twice_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    let log = workload();
    apply_all(&db, &log.batches);
    let first = db.digest().unwrap();
    assert_eq!(first.0, Seqno(log.next - 1));
    assert_eq!(db.applied_seqno(), Seqno(log.next - 1));
    for batch in &log.batches {
        assert_eq!(db.apply(batch).unwrap(), ApplyOutcome::Skipped);
    }
    assert_eq!(db.digest().unwrap(), first);
}

#[test]
fn a_gap_is_an_error_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    let mut log = Log::new();
    let first = log.item(T0, 1, "{}");
    db.apply(&first).unwrap();
    let before = db.digest().unwrap();
    let _lost = log.item(T0, 2, "{}");
    let after_gap = log.item(T0, 3, "{}");
    match db.apply(&after_gap) {
        Err(Error::Gap { expected, got }) => {
            assert_eq!((expected, got), (Seqno(2), Seqno(3)));
        }
        other => panic!("expected a gap, got {other:?}"),
    }
    assert_eq!(db.digest().unwrap(), before);
    assert_eq!(db.applied_seqno(), Seqno(1));
    assert!(db.get_item(3).unwrap().is_none());

    // A batch that starts inside the applied range but ends after it is a gap too.
    let mut overlapping = Log::new();
    overlapping.item(T0, 1, "{}");
    let signals = overlapping.signals(T0, &[("u", 1, "view", 1.0), ("u", 2, "view", 1.0)]);
    db.apply(&log.batches[1]).unwrap();
    assert_eq!(signals.first_seqno(), Seqno(2));
    assert!(matches!(db.apply(&signals), Err(Error::Gap { .. })));
}

#[test]
fn kinds_without_an_applier_and_bad_payloads_error_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    let mut log = Log::new();
    db.apply(&log.item(T0, 1, "{}")).unwrap();
    let before = db.digest().unwrap();
    let envelope = encode_payload(&Envelope::default(), &Records::ItemDelete { item: 1 }).payload;

    // Inbox kinds have no applier yet; stream kinds do not decode from an item delete's payload.
    for kind in
        [RecordKind::StreamEvents, RecordKind::StreamControl, RecordKind::InboxSend, RecordKind::InboxConsume]
    {
        let batch = Batch::new(kind, Term(1), Seqno(2), 1, &envelope);
        assert!(matches!(db.apply(&batch), Err(Error::Record { .. })), "{kind}");
    }
    let garbage = Batch::new(RecordKind::Signal, Term(1), Seqno(2), 1, b"\x01\x02garbage");
    assert!(matches!(db.apply(&garbage), Err(Error::Record { .. })));
    // Header says 3 events, payload holds 1.
    let miscounted = Batch::new(RecordKind::ItemDelete, Term(1), Seqno(2), 3, &envelope);
    assert!(matches!(db.apply(&miscounted), Err(Error::EventCount { header: 3, records: 1, .. })));
    // An embedding of the wrong dimension.
    let wrong_dim =
        encode_payload(&Envelope::default(), &Records::ItemEmbedding { item: 1, vector: vec![1.0; 3] });
    let batch = Batch::new(wrong_dim.kind, Term(1), Seqno(2), 1, &wrong_dim.payload);
    assert!(matches!(db.apply(&batch), Err(Error::EmbeddingDimension { expected: 4, got: 3, .. })));

    assert_eq!(db.digest().unwrap(), before);
    assert_eq!(db.applied_seqno(), Seqno(1));
    // The log continues normally afterwards.
    db.apply(&log.item(T0, 2, "{}")).unwrap();
    assert_eq!(db.applied_seqno(), Seqno(2));
}

#[test]
fn items_embeddings_and_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    let mut log = Log::new();
    apply_all(
        &db,
        &[
            log.item(T0, 7, r#"{"title":"a"}"#),
            log.embedding(T0, 7, &[1.0, 2.0, 3.0, 4.0]),
            log.signals(T0, &[("u1", 7, "view", 1.0), ("u1", 7, "click", 2.0)]),
            log.item(T0, 7, r#"{"title":"b"}"#),
        ],
    );
    let item = db.get_item(7).unwrap().unwrap();
    assert_eq!(item.metadata, br#"{"title":"b"}"#);
    assert!(item.has_embedding);
    assert_eq!(item.seqno, Seqno(5));
    assert_eq!(db.get_embedding(7).unwrap(), Some((vec![1.0, 2.0, 3.0, 4.0], Seqno(2))));
    assert_eq!(db.stats().items, 1);
    assert_eq!(db.stats().users, 1);
    assert_eq!(db.trending(10).unwrap().items.len(), 1);

    db.apply(&log.delete(T0, 7)).unwrap();
    assert_eq!(db.get_item(7).unwrap(), None);
    assert_eq!(db.get_embedding(7).unwrap(), None);
    assert!(db.trending(10).unwrap().items.is_empty());
    assert!(db.similar(7, 10).unwrap().is_none());
    let stats = db.stats();
    assert_eq!((stats.items, stats.embeddings, stats.trending_items), (0, 0, 0));
    assert_eq!(stats.applied_seqno, Seqno(6));
}

#[test]
fn the_dimension_is_fixed_at_creation() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path()));
    let other = EngineConfig { dimension: DIM + 1, ..config() };
    assert!(matches!(
        TidalDb::open(dir.path(), other),
        Err(Error::DimensionMismatch { persisted: 4, configured: 5 })
    ));
    let bad = EngineConfig { half_life_ms: 0, ..config() };
    assert!(matches!(TidalDb::open(dir.path(), bad), Err(Error::Config { .. })));
}

fn keyed(log: &mut Log, time_ms: u64, principal: &str, key: &str, item: u64) -> Batch {
    log.push_with(
        Envelope { time_ms, principal: principal.into(), idempotency_key: key.into() },
        Records::ItemDelete { item },
    )
}

#[test]
fn idempotency_keys_are_recorded_and_expire() {
    let dir = tempfile::tempdir().unwrap();
    let config = EngineConfig { idempotency_window_ms: HOUR, ..config() };
    let db = open_with(dir.path(), config);
    let mut log = Log::new();
    let batch = keyed(&mut log, T0, "alice", "k1", 1);
    db.apply(&batch).unwrap();
    let record = db.idempotency_lookup("alice", "k1").unwrap().unwrap();
    assert_eq!((record.first_seqno, record.last_seqno, record.time_ms), (Seqno(1), Seqno(1), T0));
    assert_eq!(record.fingerprint, tidal_core::records_fingerprint(batch.payload()));
    assert_eq!(db.idempotency_lookup("bob", "k1").unwrap(), None);
    assert_eq!(db.idempotency_lookup("alice", "k2").unwrap(), None);

    // A signal batch records its whole range.
    let signals = log.push_with(
        Envelope { time_ms: T0 + 1, principal: "alice".into(), idempotency_key: "k2".into() },
        Records::Signals(vec![
            tidal_core::SignalEvent {
                user: "u".into(),
                item: 1,
                kind: "v".into(),
                weight: 1.0,
                ts_ms: None
            };
            3
        ]),
    );
    db.apply(&signals).unwrap();
    let record = db.idempotency_lookup("alice", "k2").unwrap().unwrap();
    assert_eq!((record.first_seqno, record.last_seqno), (Seqno(2), Seqno(4)));

    // After the window, lookups miss at once; pruning removes the entries during later applies.
    db.apply(&log.item(T0 + HOUR + 2, 9, "{}")).unwrap();
    assert_eq!(db.idempotency_lookup("alice", "k1").unwrap(), None);
    assert_eq!(db.idempotency_lookup("alice", "k2").unwrap(), None);

    // A fresh database fed only the surviving history has the same digest: pruning left no trace.
    let fresh_dir = tempfile::tempdir().unwrap();
    let fresh = open_with(fresh_dir.path(), EngineConfig { idempotency_window_ms: HOUR, ..common::config() });
    let mut unkeyed = Log::new();
    unkeyed.push(T0, Records::ItemDelete { item: 1 });
    unkeyed.push(
        T0 + 1,
        Records::Signals(vec![
            tidal_core::SignalEvent {
                user: "u".into(),
                item: 1,
                kind: "v".into(),
                weight: 1.0,
                ts_ms: None
            };
            3
        ]),
    );
    unkeyed.item(T0 + HOUR + 2, 9, "{}");
    apply_all(&fresh, &unkeyed.batches);
    assert_eq!(fresh.digest().unwrap(), db.digest().unwrap());
}

#[test]
fn idempotency_keys_are_bounded_per_principal() {
    let dir = tempfile::tempdir().unwrap();
    let config = EngineConfig { idempotency_keys_max: 3, ..config() };
    let db = open_with(dir.path(), config);
    let mut log = Log::new();
    for n in 0..10u64 {
        db.apply(&keyed(&mut log, T0 + n, "alice", &format!("k{n}"), n)).unwrap();
        db.apply(&keyed(&mut log, T0 + n, "bob", &format!("k{n}"), n)).unwrap();
    }
    for principal in ["alice", "bob"] {
        for n in 0..7 {
            assert_eq!(db.idempotency_lookup(principal, &format!("k{n}")).unwrap(), None, "{principal} k{n}");
        }
        for n in 7..10 {
            assert!(
                db.idempotency_lookup(principal, &format!("k{n}")).unwrap().is_some(),
                "{principal} k{n}"
            );
        }
    }
    // Reusing a live key replaces its entry without growing the table.
    db.apply(&keyed(&mut log, T0 + 20, "alice", "k9", 99)).unwrap();
    assert_eq!(db.idempotency_lookup("alice", "k9").unwrap().unwrap().time_ms, T0 + 20);
    assert!(db.idempotency_lookup("alice", "k7").unwrap().is_some());
}
