//! Issue 41: scores stay finite. Logs of extreme but decodable signals (weights up to `f64::MAX`
//! of either sign and down to the smallest subnormal, event times from 0 to `i64::MAX`, logged
//! times far apart, embeddings of huge and tiny values) must leave every trending score, every
//! profile value and every ranked score finite: the API answers `null` for an infinity or a NaN, and
//! such an item sat at the top of trending and of every feed. The API bounds weights and times now,
//! but a WAL written before it may hold anything the record codec decodes, so the fold saturates;
//! and it saturates alike on every node: a replay on a second engine ends at the same digest.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

mod common;

use common::*;
use proptest::prelude::*;
use tidal_core::{Envelope, Records, SignalEvent, TidalDb};

const ITEMS: u64 = 5;
const USERS: [&str; 3] = ["a", "b", "c"];

/// Finite weights, the extremes most often.
fn weight() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(f64::MAX),
        Just(-f64::MAX),
        Just(1e308),
        Just(-1e308),
        Just(f64::MIN_POSITIVE),
        Just(5e-324),
        Just(0.0),
        -1e6..1e6f64,
        any::<f64>().prop_filter("the codec refuses a weight that is not finite", |w| w.is_finite()),
    ]
}

/// An event's own time: none, ordinary, or far from the logged time on either side.
fn ts() -> impl Strategy<Value = Option<i64>> {
    prop_oneof![
        Just(None),
        Just(Some(0)),
        Just(Some(i64::MAX)),
        (0..2 * HOUR).prop_map(|back| Some((T0 - back) as i64)),
        (0i64..=i64::MAX).prop_map(Some),
    ]
}

/// An embedding value: ordinary, huge or tiny.
fn value() -> impl Strategy<Value = f32> {
    prop_oneof![
        Just(f32::MAX),
        Just(-f32::MAX),
        Just(1e30f32),
        Just(f32::MIN_POSITIVE),
        -1.0..1.0f32,
        any::<f32>().prop_filter("the API stores finite embeddings", |v| v.is_finite()),
    ]
}

#[derive(Clone, Debug)]
enum Step {
    /// Signals `(user, item, weight, ts)` logged after `later_ms` more.
    Signals { later_ms: u64, events: Vec<(usize, u64, f64, Option<i64>)> },
    /// An embedding for an item.
    Embedding { item: u64, vector: Vec<f32> },
}

fn step() -> impl Strategy<Value = Step> {
    let later = prop_oneof![Just(0u64), 0..HOUR, Just(1 << 40), Just(1 << 62)];
    let event = (0..USERS.len(), 0..ITEMS, weight(), ts());
    prop_oneof![
        3 => (later, prop::collection::vec(event, 1..8))
            .prop_map(|(later_ms, events)| Step::Signals { later_ms, events }),
        1 => (0..ITEMS, prop::collection::vec(value(), DIM as usize))
            .prop_map(|(item, vector)| Step::Embedding { item, vector }),
    ]
}

fn log_of(steps: &[Step]) -> Log {
    let mut log = Log::new();
    let mut time = T0;
    for step in steps {
        match step {
            Step::Signals { later_ms, events } => {
                // Logged times only move forward and stay a valid i64.
                time = time.saturating_add(*later_ms).min(i64::MAX as u64);
                let events = events
                    .iter()
                    .map(|&(user, item, weight, ts_ms)| SignalEvent {
                        user: USERS[user].into(),
                        item,
                        kind: "view".into(),
                        weight,
                        ts_ms,
                    })
                    .collect();
                let envelope =
                    Envelope { time_ms: time, principal: "p".into(), idempotency_key: String::new() };
                log.push_with(envelope, Records::Signals(events));
            }
            Step::Embedding { item, vector } => {
                log.embedding(time, *item, vector);
            }
        }
    }
    log
}

/// Every stored score, profile value and ranked score of `db` is finite.
fn check_finite(db: &TidalDb) -> Result<(), TestCaseError> {
    for item in 0..ITEMS {
        if let Some(trend) = db.trend(item) {
            prop_assert!(trend.score.is_finite(), "item {}: stored score {}", item, trend.score);
        }
        if let Some(similar) = db.similar(item, 10).unwrap() {
            for entry in similar.items {
                prop_assert!(entry.score.is_finite(), "similar to {}: {:?}", item, entry);
            }
        }
    }
    for entry in db.trending(10).unwrap().items {
        prop_assert!(entry.score.is_finite() && entry.trending.is_finite(), "trending: {:?}", entry);
    }
    for user in USERS {
        if let Some(vector) = db.profile(user).unwrap() {
            prop_assert!(vector.iter().all(|v| v.is_finite()), "user {}: profile {:?}", user, vector);
        }
        // The feed excludes what the user saw: rank every item for someone who saw none.
        for entry in db.feed(user, 10, &[]).unwrap().items {
            prop_assert!(
                entry.score.is_finite() && entry.similarity.is_finite(),
                "feed of {}: {:?}",
                user,
                entry
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Every value stays finite after every batch, whatever flushes happen in between, and a replay
    /// of the log on a second engine (another node, or this one after a restart) gives the same
    /// digest.
    #[test]
    fn extreme_signals_keep_every_score_finite_and_replay_alike(
        steps in prop::collection::vec(step(), 1..24),
        flushes in prop::collection::vec(prop::bool::weighted(0.25), 24),
    ) {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (db, replica) = (open(a.path()), open(b.path()));
        let log = log_of(&steps);
        for (i, batch) in log.batches.iter().enumerate() {
            db.apply(batch).unwrap();
            if flushes[i % flushes.len()] {
                db.checkpoint().unwrap();
            }
            check_finite(&db)?;
        }
        apply_all(&replica, &log.batches);
        check_finite(&replica)?;
        prop_assert_eq!(db.digest().unwrap(), replica.digest().unwrap());
    }
}

/// The report's case, as a fixed regression: two signals of weight `1e308` on one item, then one
/// far in the future.
#[test]
fn two_huge_weights_then_a_far_future_event_stay_finite() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    let mut log = Log::new();
    log.embedding(T0, 1, &[1.0, 0.0, 0.0, 0.0]);
    log.signals(T0, &[("u", 1, "view", 1e308), ("u", 1, "view", 1e308)]);
    log.push(
        T0 + 1,
        Records::Signals(vec![SignalEvent {
            user: "u".into(),
            item: 1,
            kind: "view".into(),
            weight: 1.0,
            ts_ms: Some(7_258_118_400_000),
        }]),
    );
    for batch in &log.batches {
        db.apply(batch).unwrap();
        if let Some(trend) = db.trend(1) {
            assert!(trend.score.is_finite(), "{trend:?}");
        }
    }
    let trending = db.trending(1).unwrap();
    assert!(trending.items[0].score.is_finite());
}
