//! The write-back overlay: where state sits (overlay or fjall) changes no digest and no read; a
//! crash loses only the overlay, and replay restores it.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

mod common;

use common::*;
use tidal_core::{EngineConfig, Envelope, ItemState, Ranked, Records, TidalDb};
use tidal_types::Seqno;

const USERS: [&str; 8] = ["u0", "u1", "u2", "u3", "u4", "u5", "u6", "nobody"];

/// Every apply flushes (the bytes bound is crossed by any apply).
fn write_through() -> EngineConfig {
    EngineConfig { overlay_bytes_max: 1, ..config() }
}

/// Nothing flushes before a checkpoint or a digest.
fn never_flush() -> EngineConfig {
    EngineConfig { overlay_bytes_max: usize::MAX, overlay_batches_max: usize::MAX, ..config() }
}

/// Feeds, trending, similar, items and embeddings.
type Reads = (Vec<Ranked>, Vec<Option<ItemState>>, Vec<Option<(Vec<f32>, Seqno)>>);

fn reads(db: &TidalDb) -> Reads {
    let mut feeds: Vec<Ranked> = USERS.iter().map(|user| db.feed(user, 50, &[]).unwrap()).collect();
    feeds.push(db.trending(50).unwrap());
    feeds.push(db.similar(3, 50).unwrap().unwrap());
    let items = (0..45).map(|item| db.get_item(item).unwrap()).collect();
    let embeddings = (0..45).map(|item| db.get_embedding(item).unwrap()).collect();
    (feeds, items, embeddings)
}

#[test]
fn the_digest_and_reads_do_not_depend_on_where_state_sits() {
    let log = workload();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let configs = [write_through(), never_flush(), EngineConfig { overlay_batches_max: 7, ..config() }];
    let dbs: Vec<TidalDb> =
        dirs.iter().zip(configs).map(|(dir, config)| open_with(dir.path(), config)).collect();
    {
        tracing::info!("apply the same log with three flush rhythms");
        for (n, batch) in log.batches.iter().enumerate() {
            for db in &dbs {
                db.apply(batch).unwrap();
            }
            // Flushes run in the background, one in flight, and the next apply waits for it.
            let two_behind = if n >= 2 { log.batches[n - 2].last_seqno() } else { Seqno::ZERO };
            let flushed = dbs[0].flushed_applied_seqno();
            assert!(
                two_behind <= flushed && flushed <= batch.last_seqno(),
                "write-through keeps fjall at most two applies behind: flushed {flushed} at {}",
                batch.last_seqno()
            );
            assert_eq!(dbs[1].flushed_applied_seqno(), Seqno::ZERO, "a huge overlay never flushes by itself");
            assert_eq!(dbs[1].applied_seqno(), batch.last_seqno());
        }
    }
    {
        tracing::info!("reads before any digest: the huge overlay serves them all");
        let expected = reads(&dbs[0]);
        for db in &dbs[1..] {
            assert_eq!(reads(db), expected);
            assert_eq!(sizes(db), sizes(&dbs[0]));
        }
        assert_eq!(dbs[1].flushed_applied_seqno(), Seqno::ZERO);
    }
    {
        tracing::info!("digests are identical, and a digest flushes");
        let digest = dbs[0].digest().unwrap();
        assert_eq!(digest.0, Seqno(log.next - 1));
        for db in &dbs[1..] {
            assert_eq!(db.digest().unwrap(), digest);
        }
        assert_eq!(dbs[1].flushed_applied_seqno(), Seqno(log.next - 1));
    }
}

#[test]
fn reads_during_a_non_empty_overlay_see_the_overlay() {
    let dir = tempfile::tempdir().unwrap();
    let db = open_with(dir.path(), never_flush());
    let mut log = Log::new();
    {
        tracing::info!("state checkpointed to fjall");
        db.apply(&log.item(T0, 1, r#"{"v":1}"#)).unwrap();
        db.apply(&log.embedding(T0, 1, &[1.0, 0.0, 0.0, 0.0])).unwrap();
        db.apply(&log.item(T0, 2, r#"{"v":2}"#)).unwrap();
        db.apply(&log.embedding(T0, 2, &[0.0, 1.0, 0.0, 0.0])).unwrap();
        db.apply(&log.embedding(T0, 3, &[0.0, 0.0, 1.0, 0.0])).unwrap();
        db.apply(&log.signals(T0, &[("u", 1, "view", 1.0)])).unwrap();
        assert_eq!(db.checkpoint().unwrap(), Seqno(6));
    }
    {
        tracing::info!("changes held only in the overlay: an update, a delete, signals, a keyed write");
        db.apply(&log.item(T0 + 1, 2, r#"{"v":22}"#)).unwrap();
        db.apply(&log.embedding(T0 + 1, 2, &[0.0, 2.0, 0.0, 0.0])).unwrap();
        db.apply(&log.delete(T0 + 1, 1)).unwrap();
        db.apply(&log.signals(T0 + 2, &[("u", 2, "like", 2.0), ("w", 3, "view", 1.0)])).unwrap();
        let envelope = Envelope { time_ms: T0 + 3, principal: "p".into(), idempotency_key: "k".into() };
        db.apply(&log.push_with(envelope, Records::ItemMetadata { item: 4, metadata: b"{}".to_vec() }))
            .unwrap();
        assert_eq!(db.flushed_applied_seqno(), Seqno(6));
        assert_eq!(db.applied_seqno(), Seqno(12));
    }
    let check = |db: &TidalDb| {
        assert_eq!(db.get_item(1).unwrap(), None, "a delete in the overlay hides fjall's item");
        assert_eq!(db.get_embedding(1).unwrap(), None);
        let item = db.get_item(2).unwrap().unwrap();
        assert_eq!(
            (item.metadata.as_slice(), item.seqno, item.has_embedding),
            (&br#"{"v":22}"#[..], Seqno(7), true)
        );
        assert_eq!(db.get_embedding(2).unwrap(), Some((vec![0.0, 2.0, 0.0, 0.0], Seqno(8))));
        assert_eq!(db.get_embedding(3).unwrap(), Some((vec![0.0, 0.0, 1.0, 0.0], Seqno(5))));
        // u saw 1 (deleted, so gone anyway) and 2: only 3 is left; w saw 3.
        let feed: Vec<u64> = db.feed("u", 10, &[]).unwrap().items.iter().map(|entry| entry.item).collect();
        assert_eq!(feed, vec![3]);
        let feed: Vec<u64> = db.feed("w", 10, &[]).unwrap().items.iter().map(|entry| entry.item).collect();
        assert_eq!(feed, vec![2]);
        let record = db.idempotency_lookup("p", "k").unwrap().unwrap();
        assert_eq!((record.first_seqno, record.last_seqno), (Seqno(12), Seqno(12)));
        let stats = db.stats();
        assert_eq!((stats.items, stats.embeddings, stats.users, stats.applied_seqno), (2, 2, 2, Seqno(12)));
    };
    check(&db);
    {
        tracing::info!("the same reads after a flush, and after a clean close and reopen");
        db.checkpoint().unwrap();
        check(&db);
        drop(db);
        let db = open_with(dir.path(), never_flush());
        assert_eq!(db.applied_seqno(), Seqno(12), "dropping the engine flushes the overlay");
        check(&db);
    }
}

#[test]
fn a_crash_loses_only_the_overlay_and_replay_restores_the_same_state() {
    let log = workload();
    let clean = {
        let dir = tempfile::tempdir().unwrap();
        let db = open_with(dir.path(), write_through());
        apply_all(&db, &log.batches);
        (db.digest().unwrap(), reads(&db))
    };
    let template = tempfile::tempdir().unwrap();
    drop(open(template.path()));
    for crash_after in (0..=log.batches.len()).step_by(3) {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(template.path(), dir.path());
        let small = EngineConfig { overlay_batches_max: 4, ..config() };
        let (flushed, applied) = {
            let db = open_with(dir.path(), small.clone());
            apply_all(&db, &log.batches[..crash_after]);
            let (flushed, applied) = (db.flushed_applied_seqno(), db.applied_seqno());
            assert!(flushed <= applied);
            db.simulate_crash();
            (flushed, applied)
        };
        let db = open_with(dir.path(), small);
        // A flush in flight at the crash may or may not have committed.
        let recovered = db.applied_seqno();
        assert!(
            flushed <= recovered && recovered <= applied,
            "crash after {crash_after} batches: recovered {recovered}, flushed {flushed}, applied {applied}"
        );
        apply_all(&db, &log.batches);
        assert_eq!(reads(&db), clean.1, "crash after {crash_after} batches");
        assert_eq!(db.digest().unwrap(), clean.0, "crash after {crash_after} batches");
    }
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// The expiry scan is skipped while nothing can have expired; a node that restarts often (and so
/// scans on its first apply) must still prune exactly like one that never restarts, including when
/// logged times go backwards (a new leader with a slower clock).
#[test]
fn idempotency_pruning_is_the_same_with_and_without_restarts() {
    let mut log = Log::new();
    let mut time = T0;
    for n in 0..120u64 {
        // Mostly forward, sometimes backwards, sometimes past the window.
        time = match n % 10 {
            3 => time - 20 * 60_000,
            7 => time + HOUR + 1,
            _ => time + 60_000,
        };
        let envelope = Envelope {
            time_ms: time,
            principal: format!("p{}", n % 3),
            idempotency_key: if n % 4 == 0 { String::new() } else { format!("k{}", n % 17) },
        };
        log.push_with(envelope, Records::ItemMetadata { item: n % 5, metadata: b"{}".to_vec() });
    }
    let config = EngineConfig { idempotency_window_ms: HOUR, idempotency_keys_max: 4, ..config() };
    let steady_dir = tempfile::tempdir().unwrap();
    let steady = open_with(steady_dir.path(), config.clone());
    apply_all(&steady, &log.batches);
    let restarted_dir = tempfile::tempdir().unwrap();
    for chunk in log.batches.chunks(7) {
        let db = open_with(restarted_dir.path(), config.clone());
        apply_all(&db, chunk);
        // Dropped: flushed, and the next open starts without a pruning bound.
    }
    let restarted = open_with(restarted_dir.path(), config);
    assert_eq!(restarted.digest().unwrap(), steady.digest().unwrap());
    for n in 0..17 {
        for p in 0..3 {
            let (principal, key) = (format!("p{p}"), format!("k{n}"));
            assert_eq!(
                restarted.idempotency_lookup(&principal, &key).unwrap(),
                steady.idempotency_lookup(&principal, &key).unwrap()
            );
        }
    }
}

/// Flushes run while readers read: a value once visible never disappears (no read falls between
/// the fjall commit and the overlay clear), and the frontier readers see only moves forward.
#[test]
fn reads_beside_frequent_flushes_never_lose_a_value() {
    let dir = tempfile::tempdir().unwrap();
    let db = open_with(dir.path(), EngineConfig { overlay_batches_max: 3, ..config() });
    let log = workload();
    let last = Seqno(log.next - 1);
    std::thread::scope(|scope| {
        let writer = scope.spawn(|| apply_all(&db, &log.batches));
        for _ in 0..2 {
            scope.spawn(|| {
                let (mut embedding, mut item, mut keyed, mut seqno) = (false, false, false, Seqno::ZERO);
                while seqno < last {
                    let feed = db.feed("u1", 10, &[]).unwrap();
                    assert!(feed.applied_seqno >= seqno);
                    seqno = feed.applied_seqno;
                    let now = db.get_embedding(0).unwrap().is_some();
                    assert!(now || !embedding, "item 0's embedding vanished at {seqno}");
                    embedding = now;
                    let now = db.get_item(39).unwrap().is_some();
                    assert!(now || !item, "item 39 vanished at {seqno}");
                    item = now;
                    let now = db.idempotency_lookup("p0", "k0").unwrap().is_some();
                    assert!(now || !keyed, "key k0 vanished at {seqno}");
                    keyed = now;
                }
                assert!(embedding && item && keyed);
            });
        }
        writer.join().unwrap();
    });
    assert_eq!(db.applied_seqno(), last);
    assert!(db.flushed_applied_seqno() > Seqno::ZERO);
}

/// decisions/048: an open takes the item and user counts the last flush stored with fjall's applied
/// seqno, without counting keys; counts stored at another seqno (a flush by a build that did not
/// store them) are counted again.
#[test]
fn an_open_takes_the_counts_stored_at_the_applied_seqno_and_counts_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = open(dir.path());
        let mut log = Log::new();
        for item in 1..=3 {
            db.apply(&log.item(T0, item, "{}")).unwrap();
        }
        db.apply(&log.delete(T0, 2)).unwrap();
        db.apply(&log.signals(T0, &[("u", 1, "view", 1.0), ("w", 3, "view", 1.0)])).unwrap();
    }
    let counts = || {
        let stats = sizes(&open(dir.path()));
        (stats.items, stats.users)
    };
    assert_eq!(counts(), (2, 2));
    // Rewrites the stored counts (`applied seqno | items | users`, u64 LE) with the seqno moved by
    // `shift` and other counts.
    let store = |shift: u64, items: u64, users: u64| {
        let database = fjall::Database::builder(dir.path()).open().unwrap();
        let local = database.keyspace("local", fjall::KeyspaceCreateOptions::default).unwrap();
        let value = local.get("counts").unwrap().expect("the flush stored the counts");
        let seqno = u64::from_le_bytes(value[..8].try_into().unwrap()) + shift;
        let mut forged = Vec::new();
        for part in [seqno, items, users] {
            forged.extend_from_slice(&part.to_le_bytes());
        }
        local.insert("counts", forged).unwrap();
        database.persist(fjall::PersistMode::SyncAll).unwrap();
    };
    store(0, 7, 9);
    assert_eq!(counts(), (7, 9), "an open at the stored seqno takes the stored counts");
    store(1, 7, 9);
    assert_eq!(counts(), (2, 2), "counts stored at another seqno are counted again");
}
