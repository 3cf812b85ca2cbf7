//! Trending scores and counters stored one entry per block of 16 item ids (decisions/070): what a
//! flush stores, that a data dir of the old layout (one entry per score and per counter) opens to
//! the same state (also after a crash between its migration's last steps), and that a data dir of
//! a layout this build does not know is refused.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

mod common;

use std::path::Path;

use common::*;
use tidal_core::TidalDb;
use tidal_types::Seqno;
use tidal_wal::Batch;

const KINDS: [&str; 5] = ["view", "click", "share", "like", "save"];

/// 70 embedded items (blocks 0 to 4), signals of five kinds over them (more kinds than an item's
/// trending entry holds in memory), and two deletes, one of an item signalled again after it.
fn log() -> Log {
    let mut log = Log::new();
    for item in 1..=70 {
        log.embedding(T0, item, &[1.0, item as f32, 0.0, 0.0]);
    }
    for round in 0..40u64 {
        let events: Vec<(String, u64, &str, f64)> = (0..6)
            .map(|i| {
                (
                    format!("u{}", (round + i) % 7),
                    (round * 13 + i * 29) % 70 + 1,
                    KINDS[((round + i) % 5) as usize],
                    1.0,
                )
            })
            .collect();
        let events: Vec<(&str, u64, &str, f64)> =
            events.iter().map(|(user, item, kind, weight)| (user.as_str(), *item, *kind, *weight)).collect();
        log.signals(T0 + round * 1000, &events);
        if round == 20 {
            log.delete(T0 + round * 1000 + 1, 14);
            log.delete(T0 + round * 1000 + 2, 33);
        }
    }
    log.signals(T0 + 50_000, &[("u1", 33, "view", 1.0)]);
    log
}

fn trending(db: &TidalDb) -> Vec<(u64, f64)> {
    db.trending(200).unwrap().items.iter().map(|entry| (entry.item, entry.score)).collect()
}

fn keyspace(database: &fjall::Database, name: &str) -> fjall::Keyspace {
    database.keyspace(name, fjall::KeyspaceCreateOptions::default).unwrap()
}

fn leb128(value: &[u8], at: &mut usize) -> u64 {
    let (mut number, mut shift) = (0u64, 0);
    loop {
        let byte = value[*at];
        *at += 1;
        number |= u64::from(byte & 0x7f) << shift;
        shift += 7;
        if byte & 0x80 == 0 {
            return number;
        }
    }
}

/// Which data dir [`rewrite_as_old_layout`] leaves.
#[derive(Clone, Copy, PartialEq)]
enum Rewrite {
    /// Layout 1: the old entries only, no layout recorded.
    OldLayout,
    /// The old entries beside the blocks, layout 2 recorded: a migration that a crash cut after
    /// it recorded the layout and before it cleared the old keyspaces.
    ClearNotDone,
}

/// Rewrites the trend blocks of the closed engine at `path` as the old layout stored them (one
/// `trending` entry per item, one `counters` entry per item and kind); for [`Rewrite::OldLayout`]
/// removes the blocks and forgets the layout. Decodes the blocks itself, apart from the engine's
/// code. Returns how many blocks there were.
fn rewrite_as_old_layout(path: &Path, rewrite: Rewrite) -> usize {
    let database = fjall::Database::builder(path).open().unwrap();
    let (blocks, trending, counters) = (
        keyspace(&database, "trend_blocks"),
        keyspace(&database, "trending"),
        keyspace(&database, "counters"),
    );
    let mut batch = database.batch();
    let mut stored = 0;
    for guard in blocks.iter() {
        let (key, value) = guard.into_inner().unwrap();
        let block = u64::from_be_bytes(key[..].try_into().unwrap());
        let mut at = 0;
        while at < value.len() {
            let item = block * 16 + u64::from(value[at]);
            batch.insert(&trending, item.to_be_bytes(), &value[at + 1..at + 17]);
            at += 17;
            for _ in 0..leb128(&value, &mut at) {
                let len = leb128(&value, &mut at) as usize;
                let mut counter = item.to_be_bytes().to_vec();
                counter.extend_from_slice(&value[at..at + len]);
                at += len;
                batch.insert(&counters, counter, leb128(&value, &mut at).to_le_bytes());
            }
        }
        if rewrite == Rewrite::OldLayout {
            batch.remove(&blocks, key);
        }
        stored += 1;
    }
    if rewrite == Rewrite::OldLayout {
        batch.remove(&keyspace(&database, "local"), "layout");
    }
    batch.commit().unwrap();
    database.persist(fjall::PersistMode::SyncAll).unwrap();
    stored
}

/// (trend blocks, old-layout entries) stored in the closed engine at `path`.
fn stored(path: &Path) -> (usize, usize) {
    let database = fjall::Database::builder(path).open().unwrap();
    let old = keyspace(&database, "trending").iter().count() + keyspace(&database, "counters").iter().count();
    (keyspace(&database, "trend_blocks").iter().count(), old)
}

/// An engine's digest: (applied seqno, hash).
type Digest = (Seqno, [u8; 32]);

/// Applies `batches` to a new engine at `path`, checkpoints and closes it; its digest and trending.
fn applied_and_closed(path: &Path, batches: &[Batch]) -> (Digest, Vec<(u64, f64)>) {
    let db = open(path);
    apply_all(&db, batches);
    db.checkpoint().unwrap();
    (db.digest().unwrap(), trending(&db))
}

#[test]
fn a_flush_stores_one_entry_per_block_of_sixteen_items() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    apply_all(&db, &log().batches);
    db.checkpoint().unwrap();
    let blocks: std::collections::BTreeSet<u64> = trending(&db).iter().map(|(item, _)| item / 16).collect();
    drop(db);
    assert_eq!(stored(dir.path()), (blocks.len(), 0));
    assert_eq!(blocks.len(), 5, "items 1 to 70 were signalled");
}

#[test]
fn a_data_dir_of_the_old_layout_opens_to_the_same_state_and_moves_into_blocks() {
    let log = log();
    // The embeddings, 23 signal batches and both deletes; then the rest, which signals a deleted
    // item again.
    let (half, rest) = log.batches.split_at(95);
    let (dir, reference_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (digest, scores) = applied_and_closed(dir.path(), half);
    let blocks = rewrite_as_old_layout(dir.path(), Rewrite::OldLayout);
    let (left, old) = stored(dir.path());
    assert_eq!(left, 0);
    assert!(old > scores.len(), "the old layout holds the scores and at least one count each: {old}");

    let db = open(dir.path());
    assert_eq!(db.digest().unwrap(), digest, "the digest sees the same logical state");
    assert_eq!(trending(&db), scores);
    // The log goes on from there, counting on from the migrated counters, as on a node that never
    // had the old layout.
    apply_all(&db, rest);
    let reference = open(reference_dir.path());
    apply_all(&reference, &log.batches);
    assert_eq!(db.digest().unwrap(), reference.digest().unwrap());
    assert_eq!(trending(&db), trending(&reference));
    drop(db);
    let (after, old) = stored(dir.path());
    assert_eq!(old, 0, "nothing is left in the old layout");
    assert!(after >= blocks, "{after} blocks after, {blocks} before");
}

#[test]
fn an_open_after_a_crash_between_the_layout_and_the_clear_clears_the_old_layout() {
    let dir = tempfile::tempdir().unwrap();
    let (digest, scores) = applied_and_closed(dir.path(), &log().batches);
    let blocks = rewrite_as_old_layout(dir.path(), Rewrite::ClearNotDone);
    let (left, old) = stored(dir.path());
    assert_eq!(left, blocks);
    assert!(old > scores.len(), "the old entries are back beside the blocks: {old}");

    let db = open(dir.path());
    assert_eq!(db.digest().unwrap(), digest);
    assert_eq!(trending(&db), scores);
    drop(db);
    assert_eq!(stored(dir.path()), (blocks, 0), "the open cleared the old layout");
}

#[test]
fn a_data_dir_of_a_later_layout_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path()));
    {
        let database = fjall::Database::builder(dir.path()).open().unwrap();
        keyspace(&database, "local").insert("layout", 3u32.to_le_bytes()).unwrap();
        database.persist(fjall::PersistMode::SyncAll).unwrap();
    }
    let error = TidalDb::open(dir.path(), config()).err().expect("a later layout is refused");
    assert!(error.to_string().contains("engine layout 3; this build reads up to 2"), "{error}");
}
