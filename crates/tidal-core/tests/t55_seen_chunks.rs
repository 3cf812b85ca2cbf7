//! The seen set stored as one chunk per user per flush (decisions/056): what a flush writes, that
//! reads and the digest see the logical set whatever the layout, and that reads get a user's
//! entries merged into one chunk.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

mod common;

use std::path::Path;

use common::*;
use tidal_core::TidalDb;
use tidal_types::Term;

/// The stored seen entries of `user` in the closed engine at `path`: (pairs, chunks). A pair's key
/// ends in the 8-byte item, a chunk's in a tag byte and the 8-byte chunk id.
fn stored(path: &Path, user: &str) -> (usize, usize) {
    let database = fjall::Database::builder(path).open().unwrap();
    let seen = database.keyspace("seen", fjall::KeyspaceCreateOptions::default).unwrap();
    let mut prefix = (user.len() as u16).to_be_bytes().to_vec();
    prefix.extend_from_slice(user.as_bytes());
    let (mut pairs, mut chunks) = (0, 0);
    for guard in seen.prefix(&prefix) {
        let (key, value) = guard.into_inner().unwrap();
        match key.len() - prefix.len() {
            8 => {
                assert!(value.is_empty(), "a pair has no value");
                pairs += 1;
            }
            9 => {
                assert!(!value.is_empty(), "a chunk is never empty");
                chunks += 1;
            }
            other => panic!("a seen key with a {other}-byte suffix"),
        }
    }
    (pairs, chunks)
}

fn feed_ids(db: &TidalDb, user: &str) -> Vec<u64> {
    let mut ids: Vec<u64> = db.feed(user, 100, &[]).unwrap().items.iter().map(|e| e.item).collect();
    ids.sort_unstable();
    ids
}

/// 40 embedded items, then `rounds` batches in which u1 sees item `round + 1` (twice: a repeat in
/// one window is stored once) and u2 sees item `40 - round`.
fn log(rounds: u64) -> Log {
    let mut log = Log::new();
    for item in 1..=40 {
        log.embedding(T0, item, &[1.0, item as f32, 0.0, 0.0]);
    }
    for round in 0..rounds {
        log.signals(
            T0 + round,
            &[
                ("u1", round + 1, "view", 1.0),
                ("u2", 40 - round, "view", 1.0),
                ("u1", round + 1, "click", 1.0),
            ],
        );
    }
    log
}

#[test]
fn every_flush_writes_one_chunk_per_user_and_a_read_gets_them_merged() {
    let rounds = 20;
    let log = log(rounds + 1);
    let (dir, reference_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (all_but_last, last) = log.batches.split_at(log.batches.len() - 1);

    // A flush after each signal batch: one chunk per batch for u1.
    let db = open(dir.path());
    apply_all(&db, &all_but_last[..40]);
    for batch in &all_but_last[40..] {
        db.apply(batch).unwrap();
        db.checkpoint().unwrap();
    }
    drop(db);
    assert_eq!(stored(dir.path(), "u1"), (0, rounds as usize));

    // The reads see all of them; a read of more than the bound asks for a merge, which the next
    // flush does: one chunk with every item, the new one too.
    let db = open(dir.path());
    assert_eq!(feed_ids(&db, "u1"), (21..=40).collect::<Vec<_>>());
    db.apply(&last[0]).unwrap();
    db.checkpoint().unwrap();
    assert_eq!(db.stats().flush.seen_merged, 1);
    assert_eq!(feed_ids(&db, "u1"), (22..=40).collect::<Vec<_>>());
    // u2 was not read: its chunks stay (20 and the last round's).
    let digest = db.digest().unwrap();
    drop(db);
    assert_eq!(stored(dir.path(), "u1"), (0, 1));
    assert_eq!(stored(dir.path(), "u2"), (0, rounds as usize + 1));

    // The same log with one flush at the end: another layout, the same digest and feeds.
    let reference = open(reference_dir.path());
    apply_all(&reference, &log.batches);
    assert_eq!(reference.digest().unwrap(), digest);
    assert_eq!(feed_ids(&reference, "u1"), (22..=40).collect::<Vec<_>>());
    assert_eq!(feed_ids(&reference, "u2"), (1..=19).collect::<Vec<_>>());
    drop(reference);
    assert_eq!(stored(reference_dir.path(), "u1"), (0, 1));
}

#[test]
fn a_snapshot_carries_the_logical_set_and_an_install_stores_one_chunk_per_user() {
    let log = log(30);
    let (a_dir, b_dir, files) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = open(a_dir.path());
    for (n, batch) in log.batches.iter().enumerate() {
        a.apply(batch).unwrap();
        if n % 3 == 0 {
            a.checkpoint().unwrap();
        }
    }
    let path = files.path().join("snapshot");
    let file = std::fs::File::create(&path).unwrap();
    a.export_snapshot(std::io::BufWriter::new(file), |_| Some(Term(1))).unwrap();
    let digest = a.digest().unwrap();
    drop(a);
    assert_eq!(stored(a_dir.path(), "u1"), (0, 10));

    let b = open(b_dir.path());
    b.install_snapshot(&path).unwrap();
    assert_eq!(b.digest().unwrap(), digest);
    assert_eq!(feed_ids(&b, "u1"), (31..=40).collect::<Vec<_>>());
    assert_eq!(feed_ids(&b, "u2"), (1..=10).collect::<Vec<_>>());
    drop(b);
    assert_eq!(stored(b_dir.path(), "u1"), (0, 1));
    assert_eq!(stored(b_dir.path(), "u2"), (0, 1));
}

/// Rewrites the seen keyspace of the closed engine at `path` as data dirs before chunks stored it:
/// one pair per item. Decodes the chunks itself (LEB128 deltas), apart from the engine's code.
fn rewrite_as_pairs(path: &Path) {
    let database = fjall::Database::builder(path).open().unwrap();
    let seen = database.keyspace("seen", fjall::KeyspaceCreateOptions::default).unwrap();
    let mut batch = database.batch();
    for guard in seen.iter() {
        let (key, value) = guard.into_inner().unwrap();
        let prefix = &key[..key.len() - 9];
        let (mut item, mut delta, mut shift) = (0u64, 0u64, 0);
        for byte in value.iter() {
            delta |= u64::from(byte & 0x7f) << shift;
            shift += 7;
            if byte & 0x80 == 0 {
                item += delta;
                let mut pair = prefix.to_vec();
                pair.extend_from_slice(&item.to_be_bytes());
                batch.insert(&seen, pair, []);
                (delta, shift) = (0, 0);
            }
        }
        batch.remove(&seen, key);
    }
    batch.commit().unwrap();
    database.persist(fjall::PersistMode::SyncAll).unwrap();
}

#[test]
fn a_data_dir_of_seen_pairs_reads_the_same_and_reads_turn_the_pairs_into_a_chunk() {
    let log = log(30);
    let (dir, reference_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let db = open(dir.path());
    apply_all(&db, &log.batches);
    let digest = db.digest().unwrap();
    drop(db);
    rewrite_as_pairs(dir.path());
    assert_eq!(stored(dir.path(), "u1"), (30, 0));

    // The same digest and feed from pairs; the read asks for a merge, which the next flush does
    // (u1 is not in that flush's overlay: the merge stands alone).
    let db = open(dir.path());
    assert_eq!(db.digest().unwrap(), digest);
    assert_eq!(feed_ids(&db, "u1"), (31..=40).collect::<Vec<_>>());
    let mut more = Log { next: log.next, batches: Vec::new() };
    let batch = more.signals(T0 + 100, &[("u3", 1, "view", 1.0)]);
    db.apply(&batch).unwrap();
    db.checkpoint().unwrap();
    assert_eq!(db.stats().flush.seen_merged, 1);
    assert_eq!(feed_ids(&db, "u1"), (31..=40).collect::<Vec<_>>());
    let reference = open(reference_dir.path());
    apply_all(&reference, &log.batches);
    reference.apply(&batch).unwrap();
    assert_eq!(db.digest().unwrap(), reference.digest().unwrap());
    drop(db);
    assert_eq!(stored(dir.path(), "u1"), (0, 1));
    assert_eq!(stored(dir.path(), "u2"), (30, 0), "u2 was not read");
}
