//! Ranked reads: feed exclusions and ties, exact decay, similar, trending, hard negatives.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

mod common;

use common::*;
use tidal_core::{EngineConfig, NegativesState, RankedEntry, TidalDb, RANKED_LIMIT_MAX};
use tidal_types::Seqno;

fn ids(entries: &[RankedEntry]) -> Vec<u64> {
    entries.iter().map(|e| e.item).collect()
}

fn hourly() -> EngineConfig {
    EngineConfig { half_life_ms: HOUR, ..config() }
}

#[test]
fn feed_excludes_seen_items_negatives_and_the_exclude_list() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    let mut log = Log::new();
    for item in 1..=6 {
        db.apply(&log.embedding(T0, item, &[1.0, item as f32, 0.0, 0.0])).unwrap();
    }
    db.apply(&log.signals(T0, &[("u1", 1, "view", 1.0), ("u2", 4, "view", 1.0)])).unwrap();
    db.negatives_add("u1", 2).unwrap();
    db.negatives_add("u2", 5).unwrap();
    let feed = db.feed("u1", 10, &[3]).unwrap();
    let mut got = ids(&feed.items);
    got.sort();
    assert_eq!(got, vec![4, 5, 6]);
    assert_eq!(feed.applied_seqno, Seqno(8));
    // Other users' exclusions do not leak.
    let mut got = ids(&db.feed("u2", 10, &[]).unwrap().items);
    got.sort();
    assert_eq!(got, vec![1, 2, 3, 6]);
    // A user that never signalled gets everything not excluded.
    assert_eq!(db.feed("nobody", 10, &[]).unwrap().items.len(), 6);
    assert_eq!(db.feed("u1", 0, &[]).unwrap().items.len(), 0);
}

#[test]
fn ties_are_broken_by_item_id() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    let mut log = Log::new();
    for item in [9u64, 3, 7, 1, 5] {
        db.apply(&log.embedding(T0, item, &[0.5, 0.5, 0.5, 0.5])).unwrap();
    }
    let feed = db.feed("nobody", 10, &[]).unwrap();
    assert_eq!(ids(&feed.items), vec![1, 3, 5, 7, 9]);
    assert!(feed.items.iter().all(|e| e.score == 0.0));
    // Equal similarity too: a profile pointing the same way as every item.
    db.apply(&log.embedding(T0, 100, &[0.5, 0.5, 0.5, 0.5])).unwrap();
    db.apply(&log.signals(T0, &[("u", 100, "view", 0.0)])).unwrap();
    let feed = db.feed("u", 3, &[]).unwrap();
    assert_eq!(ids(&feed.items), vec![1, 3, 5]);
    let similar = db.similar(9, 10).unwrap().unwrap();
    assert_eq!(ids(&similar.items), vec![1, 3, 5, 7, 100]);
}

#[test]
fn trending_decays_with_the_half_life_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let db = open_with(dir.path(), hourly());
    let mut log = Log::new();
    db.apply(&log.embedding(T0, 1, &[1.0, 0.0, 0.0, 0.0])).unwrap();
    db.apply(&log.signals(T0, &[("u1", 1, "view", 1.0)])).unwrap();
    // Move "now" one half-life later with an unrelated write: the score is now 1 * 2^-1 = 0.5.
    db.apply(&log.item(T0 + HOUR, 42, "{}")).unwrap();
    let trending = db.trending(10).unwrap();
    assert_eq!(trending.items.len(), 1);
    assert_eq!(trending.items[0].trending, 0.5f64.ln_1p());
    assert!((trending.items[0].trending - 0.405_465_108_108_164_4).abs() < 1e-15);
    let feed = db.feed("nobody", 10, &[]).unwrap();
    assert_eq!(feed.items[0].score, 0.1 * 0.5f64.ln_1p());

    // Two more half-lives, a weight-2 event: 0.5 * 2^-2 + 2 = 2.125, reference moved forward.
    db.apply(&log.signals(T0 + 3 * HOUR, &[("u1", 1, "view", 2.0)])).unwrap();
    let trend = db.trend(1).unwrap();
    assert_eq!((trend.score, trend.ref_ms), (2.125, (T0 + 3 * HOUR) as i64));
    // A late event (ts one half-life before the reference) counts half.
    let late = tidal_core::SignalEvent {
        user: "u1".into(),
        item: 1,
        kind: "view".into(),
        weight: 1.0,
        ts_ms: Some((T0 + 2 * HOUR) as i64),
    };
    db.apply(&log.push(T0 + 3 * HOUR, tidal_core::Records::Signals(vec![late]))).unwrap();
    assert_eq!(db.trend(1).unwrap().score, 2.625);
    assert_eq!(db.trending(1).unwrap().items[0].trending, 2.625f64.ln_1p());
}

#[test]
fn feed_similarity_is_the_cosine_with_the_profile() {
    let dir = tempfile::tempdir().unwrap();
    let db = open_with(dir.path(), EngineConfig { trending_weight: 0.0, ..hourly() });
    let mut log = Log::new();
    db.apply(&log.embedding(T0, 1, &[2.0, 0.0, 0.0, 0.0])).unwrap();
    db.apply(&log.embedding(T0, 2, &[1.0, 1.0, 0.0, 0.0])).unwrap();
    db.apply(&log.embedding(T0, 3, &[0.0, 0.0, 3.0, 0.0])).unwrap();
    db.apply(&log.embedding(T0, 4, &[-1.0, 0.0, 0.0, 0.0])).unwrap();
    db.apply(&log.signals(T0, &[("u", 1, "like", 1.0)])).unwrap();
    let feed = db.feed("u", 10, &[]).unwrap();
    assert_eq!(ids(&feed.items), vec![2, 3, 4]);
    assert!((feed.items[0].similarity - std::f64::consts::FRAC_1_SQRT_2).abs() < 1e-7);
    assert_eq!(feed.items[1].similarity, 0.0);
    assert_eq!(feed.items[2].similarity, -1.0);
    assert_eq!(feed.items[0].score, feed.items[0].similarity);

    let similar = db.similar(1, 2).unwrap().unwrap();
    assert_eq!(ids(&similar.items), vec![2, 3]);
    assert!(db.similar(99, 2).unwrap().is_none());
}

#[test]
fn limits_are_capped() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    let mut log = Log::new();
    for item in 0..(RANKED_LIMIT_MAX as u64 + 10) {
        db.apply(&log.embedding(T0, item, &[1.0, 0.0, 0.0, item as f32])).unwrap();
    }
    assert_eq!(db.feed("u", usize::MAX, &[]).unwrap().items.len(), RANKED_LIMIT_MAX);
    assert_eq!(db.similar(0, usize::MAX).unwrap().unwrap().items.len(), RANKED_LIMIT_MAX);
}

#[test]
fn negatives_are_a_crdt_outside_the_digest() {
    let dir_a = tempfile::tempdir().unwrap();
    let dir_b = tempfile::tempdir().unwrap();
    let a = open_with(dir_a.path(), EngineConfig { node_actor: (1, 1), ..config() });
    let b = open_with(dir_b.path(), EngineConfig { node_actor: (2, 1), ..config() });
    let digest = a.digest().unwrap();
    let empty = a.negatives_digest().unwrap();
    assert_eq!(empty, b.negatives_digest().unwrap());

    a.negatives_add("u", 30).unwrap();
    a.negatives_add("u", 10).unwrap();
    a.negatives_add("u", 20).unwrap();
    assert_eq!(a.negatives("u").unwrap(), vec![10, 20, 30]);
    assert_eq!(a.digest().unwrap(), digest, "negatives are not log-derived");
    assert_ne!(a.negatives_digest().unwrap(), empty);

    // b learns them, removes one; a concurrently re-adds it: add wins.
    b.negatives_merge("u", &a.negatives_state("u").unwrap()).unwrap();
    b.negatives_remove("u", 20).unwrap();
    b.negatives_remove("u", 30).unwrap();
    a.negatives_add("u", 20).unwrap();
    let (state_a, state_b) = (a.negatives_state("u").unwrap(), b.negatives_state("u").unwrap());
    a.negatives_merge("u", &state_b).unwrap();
    b.negatives_merge("u", &state_a).unwrap();
    assert_eq!(a.negatives("u").unwrap(), vec![10, 20]);
    assert_eq!(b.negatives("u").unwrap(), vec![10, 20]);
    assert_eq!(a.negatives_digest().unwrap(), b.negatives_digest().unwrap());
    assert_eq!(a.negatives_users().unwrap(), vec!["u".to_owned()]);
    assert_eq!(a.negatives("other").unwrap(), Vec::<u64>::new());

    // Durable across reopen, and serializable for anti-entropy.
    let state = a.negatives_state("u").unwrap();
    drop(a);
    let a = TidalDb::open(dir_a.path(), EngineConfig { node_actor: (1, 1), ..config() }).unwrap();
    assert_eq!(a.negatives_state("u").unwrap(), state);
    let json = serde_json::to_string(&state).unwrap();
    assert_eq!(serde_json::from_str::<NegativesState>(&json).unwrap(), state);
    assert!(
        serde_json::from_str::<NegativesState>(r#"{"clock":[],"entries":[{"item":1,"dots":[]}]}"#).is_err()
    );
}
