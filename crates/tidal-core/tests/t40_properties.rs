//! Properties of the apply path over generated logs: a batch folds like its events one by one,
//! garbage never panics nor writes, random logs survive reopen-and-replay, reads run beside apply.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

mod common;

use std::path::Path;
use std::sync::Arc;

use common::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use tidal_core::{Envelope, Records, SignalEvent, TidalDb};
use tidal_types::{RecordKind, Seqno, Term};
use tidal_wal::Batch;

fn event(user: &str, item: u64, weight: f64, ts_ms: Option<i64>) -> SignalEvent {
    SignalEvent { user: user.into(), item, kind: "view".into(), weight, ts_ms }
}

#[test]
fn one_batch_of_many_events_folds_like_the_events_one_by_one() {
    let events: Vec<SignalEvent> = (0..1000u64)
        .map(|n| {
            let ts = (n % 7 == 0).then(|| (T0 - (n * 1000) % HOUR) as i64);
            event(["a", "b", "c"][(n % 3) as usize], n % 4, 0.25 + (n % 5) as f64, ts)
        })
        .collect();
    let setup = |log: &mut Log| {
        for item in 0..4u64 {
            log.embedding(T0 - HOUR, item, &[1.0, item as f32, -0.5, 0.25]);
        }
    };
    let mut batched = Log::new();
    setup(&mut batched);
    batched.push(T0, Records::Signals(events.clone()));
    let mut single = Log::new();
    setup(&mut single);
    for event in events {
        single.push(T0, Records::Signals(vec![event]));
    }
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (open(dir_a.path()), open(dir_b.path()));
    apply_all(&a, &batched.batches);
    apply_all(&b, &single.batches);
    assert_eq!(a.applied_seqno(), Seqno(1004));
    assert_eq!(a.digest().unwrap(), b.digest().unwrap());
    assert_eq!(a.feed("nobody", 10, &[]).unwrap(), b.feed("nobody", 10, &[]).unwrap());
}

#[test]
fn garbage_batches_never_panic_and_never_write() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    let mut log = Log::new();
    db.apply(&log.embedding(T0, 1, &[1.0, 0.0, 0.0, 0.0])).unwrap();
    let mut runner = TestRunner::new(Config { cases: 2000, failure_persistence: None, ..Config::default() });
    let strategy = (0u8..9, prop::collection::vec(any::<u8>(), 0..128), 1u32..4);
    runner
        .run(&strategy, |(kind, payload, count)| {
            let kind = RecordKind::from_byte(kind).unwrap();
            let before = db.digest().unwrap();
            // Built at the frontier, so a garbage payload that happens to decode is no gap later.
            let batch = Batch::new(kind, Term(1), db.applied_seqno().next(), count, &payload);
            if db.apply(&batch).is_err() {
                prop_assert_eq!(db.digest().unwrap(), before);
            }
            Ok(())
        })
        .unwrap();
}

#[derive(Clone, Debug)]
enum Op {
    Item(u64),
    Embedding(u64, [i8; 4]),
    Signals(Vec<(u8, u64, i8, Option<u16>)>),
    Delete(u64),
    Keyed(u8, u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..12u64).prop_map(Op::Item),
        (0..12u64, any::<[i8; 4]>()).prop_map(|(i, v)| Op::Embedding(i, v)),
        prop::collection::vec((0..4u8, 0..12u64, any::<i8>(), prop::option::of(any::<u16>())), 1..20)
            .prop_map(Op::Signals),
        (0..12u64).prop_map(Op::Delete),
        (0..3u8, 0..6u8).prop_map(|(p, k)| Op::Keyed(p, k)),
    ]
}

fn build(ops: &[(Op, u16)]) -> Log {
    let mut log = Log::new();
    let mut time = T0;
    for (op, advance) in ops {
        time += u64::from(*advance) * 1000;
        match op {
            Op::Item(item) => {
                log.item(time, *item, "{}");
            }
            Op::Embedding(item, v) => {
                log.embedding(time, *item, &v.map(|x| f32::from(x) / 16.0));
            }
            Op::Signals(events) => {
                let events = events
                    .iter()
                    .map(|(user, item, weight, late)| {
                        let ts = late.map(|late| time as i64 - i64::from(late) * 1000);
                        event(&format!("u{user}"), *item, f64::from(*weight) / 8.0, ts)
                    })
                    .collect();
                log.push(time, Records::Signals(events));
            }
            Op::Delete(item) => {
                log.delete(time, *item);
            }
            Op::Keyed(principal, key) => {
                let envelope = Envelope {
                    time_ms: time,
                    principal: format!("p{principal}"),
                    idempotency_key: format!("k{key}"),
                };
                log.push_with(envelope, Records::ItemDelete { item: 100 });
            }
        }
    }
    log
}

fn snapshot(db: &TidalDb) -> impl PartialEq + std::fmt::Debug {
    let feeds: Vec<_> = (0..4).map(|u| db.feed(&format!("u{u}"), 20, &[]).unwrap()).collect();
    let similar: Vec<_> = (0..12).map(|i| db.similar(i, 20).unwrap()).collect();
    (db.digest().unwrap(), feeds, similar, db.trending(20).unwrap(), sizes(db))
}

fn copy_dir(from: &Path, to: &Path) {
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

#[test]
fn random_logs_survive_reopen_and_replay() {
    let template = tempfile::tempdir().unwrap();
    drop(open(template.path()));
    let mut runner = TestRunner::new(Config { cases: 24, failure_persistence: None, ..Config::default() });
    let strategy = (prop::collection::vec((op(), 0..4000u16), 1..40), any::<prop::sample::Index>());
    runner
        .run(&strategy, |(ops, cut)| {
            let log = build(&ops);
            let (clean_dir, crash_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
            copy_dir(template.path(), clean_dir.path());
            copy_dir(template.path(), crash_dir.path());
            let clean = open(clean_dir.path());
            apply_all(&clean, &log.batches);
            let cut = cut.index(log.batches.len() + 1);
            {
                let db = open(crash_dir.path());
                apply_all(&db, &log.batches[..cut]);
            }
            let db = open(crash_dir.path());
            let before_replay = snapshot(&db);
            apply_all(&db, &log.batches[..cut]); // all skipped
            prop_assert_eq!(snapshot(&db), before_replay);
            apply_all(&db, &log.batches);
            prop_assert_eq!(snapshot(&db), snapshot(&clean));
            Ok(())
        })
        .unwrap();
}

#[test]
fn reads_run_beside_apply_and_see_a_monotone_frontier() {
    let dir = tempfile::tempdir().unwrap();
    let db = Arc::new(open(dir.path()));
    let log = workload();
    let last = log.next - 1;
    std::thread::scope(|scope| {
        let writer = scope.spawn(|| apply_all(&db, &log.batches));
        for _ in 0..2 {
            scope.spawn(|| {
                let mut seen = Seqno::ZERO;
                while seen < Seqno(last) {
                    let feed = db.feed("u1", 10, &[]).unwrap();
                    assert!(feed.applied_seqno >= seen);
                    seen = feed.applied_seqno;
                    let trending = db.trending(10).unwrap();
                    assert!(trending.applied_seqno >= seen);
                    db.digest().unwrap();
                }
            });
        }
        writer.join().unwrap();
    });
    assert_eq!(db.applied_seqno(), Seqno(last));
}
