//! Streams in the engine: offsets are seqnos, reads merge the overlays over fjall, consumer offsets
//! only move forward, trims keep survivors' offsets and leave nothing in storage, and every layout
//! of the same log (flushed often, rarely, exported and installed) has one digest.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;

use common::*;
use proptest::prelude::*;
use tidal_core::{EngineConfig, PublishEvent, Records, StoredEvent, StreamControl, TidalDb};
use tidal_types::{Seqno, Term};

fn event(key: Option<&str>, n: u64) -> PublishEvent {
    PublishEvent { key: key.map(str::to_owned), payload: format!("{{\"n\":{n}}}").into_bytes() }
}

fn publish(log: &mut Log, time_ms: u64, stream: &str, events: Vec<PublishEvent>) -> tidal_wal::Batch {
    log.push(time_ms, Records::StreamEvents { stream: stream.into(), events })
}

fn trim(log: &mut Log, stream: &str, through: u64) -> tidal_wal::Batch {
    log.push(T0, Records::StreamControl(StreamControl::Trim { stream: stream.into(), through }))
}

fn save(log: &mut Log, stream: &str, consumer: &str, offset: u64) -> tidal_wal::Batch {
    let control = StreamControl::SaveOffset { stream: stream.into(), consumer: consumer.into(), offset };
    log.push(T0, Records::StreamControl(control))
}

fn offsets(events: &[StoredEvent]) -> Vec<u64> {
    events.iter().map(|event| event.offset).collect()
}

#[test]
fn offsets_are_seqnos_and_reads_are_in_offset_order() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    let mut log = Log::new();
    db.apply(&log.item(T0, 1, "{}")).unwrap(); // seqno 1: a fresh stream does not start at 1
    db.apply(&publish(&mut log, T0 + 1_999, "orders", vec![event(None, 0), event(Some("k"), 1)])).unwrap();
    db.apply(&publish(&mut log, T0, "other", vec![event(None, 9)])).unwrap(); // seqno 4
    db.apply(&publish(&mut log, T0 + 5_000, "orders", vec![event(Some("ü"), 2)])).unwrap(); // 5

    let all = db.stream_events("orders", 0, 100).unwrap();
    assert_eq!(offsets(&all), [2, 3, 5], "offsets are the events' seqnos; gaps are legal");
    assert_eq!(all[0].key, None);
    assert_eq!(all[1].key.as_deref(), Some("k"));
    assert_eq!(all[2].key.as_deref(), Some("ü"));
    assert_eq!(all[1].payload, b"{\"n\":1}");
    assert_eq!(all[0].created_at, ((T0 + 1_999) / 1000) as i64, "the logged time in seconds");
    assert_eq!(offsets(&db.stream_events("orders", 2, 100).unwrap()), [3, 5]);
    assert_eq!(offsets(&db.stream_events("orders", 0, 2).unwrap()), [2, 3]);
    assert_eq!(offsets(&db.stream_events("orders", 5, 100).unwrap()), Vec::<u64>::new());
    assert!(db.stream_events("nobody", 0, 10).unwrap().is_empty());
    let meta = db.stream_meta("orders").unwrap().unwrap();
    assert_eq!((meta.last_offset, meta.events, meta.horizon, meta.bytes), (5, 3, 0, 21));
    let listed: Vec<String> = db.streams("", 10).unwrap().into_iter().map(|info| info.name).collect();
    assert_eq!(listed, ["orders", "other"]);
    assert_eq!(db.streams("orders", 10).unwrap().len(), 1, "names after the cursor");
}

#[test]
fn consumer_offsets_only_move_forward_and_never_past_the_last_event() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    let mut log = Log::new();
    db.apply(&publish(&mut log, T0, "s", vec![event(None, 0); 5])).unwrap(); // 1..=5
    db.apply(&save(&mut log, "s", "c", 3)).unwrap();
    assert_eq!(db.consumer_offset("s", "c").unwrap(), Some(3));
    db.apply(&save(&mut log, "s", "c", 2)).unwrap();
    assert_eq!(db.consumer_offset("s", "c").unwrap(), Some(3), "a lower offset is a no-op");
    db.apply(&save(&mut log, "s", "c", 1_000)).unwrap();
    assert_eq!(db.consumer_offset("s", "c").unwrap(), Some(5), "clamped to the last offset");
    db.apply(&save(&mut log, "s", "b", 0)).unwrap();
    db.apply(&save(&mut log, "fresh", "early", 0)).unwrap();
    assert_eq!(db.consumers("s").unwrap(), [("b".to_string(), 0), ("c".to_string(), 5)]);
    assert_eq!(db.stream_meta("s").unwrap().unwrap().consumers, 2);
    assert_eq!(db.stream_meta("fresh").unwrap().unwrap().last_offset, 0, "a stream with a consumer only");
    assert_eq!(db.consumer_offset("s", "nobody").unwrap(), None);
}

#[test]
fn a_trim_keeps_survivors_offsets_and_leaves_nothing_in_storage() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    let mut log = Log::new();
    db.apply(&publish(&mut log, T0, "s", vec![event(None, 0); 3])).unwrap(); // 1..=3
    db.checkpoint().unwrap(); // 1..=3 in fjall
    db.apply(&log.item(T0, 1, "{}")).unwrap(); // 4: a gap in the stream
    db.apply(&publish(&mut log, T0, "s", vec![event(None, 0); 3])).unwrap(); // 5..=7, in the overlay
    db.apply(&save(&mut log, "s", "slow", 1)).unwrap();
    db.apply(&trim(&mut log, "s", 4)).unwrap(); // over the gap: deletes 1..=3
    assert_eq!(offsets(&db.stream_events("s", 0, 100).unwrap()), [5, 6, 7]);
    assert_eq!(offsets(&db.stream_events("s", 2, 100).unwrap()), [5, 6, 7], "a reader behind resumes");
    db.apply(&trim(&mut log, "s", 5)).unwrap(); // the exact boundary, in the overlay
    assert_eq!(offsets(&db.stream_events("s", 0, 100).unwrap()), [6, 7]);
    db.apply(&trim(&mut log, "s", 2)).unwrap(); // below the horizon: nothing
    assert_eq!(db.consumer_offset("s", "slow").unwrap(), Some(1), "a consumer below the horizon stays");
    let meta = db.stream_meta("s").unwrap().unwrap();
    assert_eq!((meta.horizon, meta.events, meta.last_offset), (5, 2, 7));
    assert_eq!(db.stream_events_in_storage("s").unwrap(), 2, "trimmed events are gone from storage");
    db.apply(&trim(&mut log, "s", u64::MAX)).unwrap(); // past the last: clamped to it
    assert_eq!(db.stream_meta("s").unwrap().unwrap().horizon, 7);
    assert_eq!(db.stream_events_in_storage("s").unwrap(), 0);
    db.apply(&publish(&mut log, T0, "s", vec![event(None, 0)])).unwrap();
    let after = db.stream_events("s", 0, 10).unwrap();
    assert_eq!(offsets(&after), [log.next - 1], "a trim through the last offset hides no later event");
}

/// One step of the property test below.
#[derive(Clone, Debug)]
enum Op {
    Publish { stream: u8, events: u8, keyed: bool },
    Trim { stream: u8, back: u8 },
    Save { stream: u8, consumer: u8, back: u8 },
    Item,
    Checkpoint,
}

fn any_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..2, 1u8..4, any::<bool>()).prop_map(|(stream, events, keyed)| Op::Publish { stream, events, keyed }),
        2 => (0u8..2, 0u8..6).prop_map(|(stream, back)| Op::Trim { stream, back }),
        1 => (0u8..2, 0u8..2, 0u8..6).prop_map(|(stream, consumer, back)| Op::Save { stream, consumer, back }),
        1 => Just(Op::Item),
        1 => Just(Op::Checkpoint),
    ]
}

/// What a stream holds, by the rules, without the engine.
#[derive(Default)]
struct Model {
    events: BTreeMap<u64, Option<String>>,
    last: u64,
    horizon: u64,
}

fn config_flushing_every(batches: usize) -> EngineConfig {
    EngineConfig { overlay_batches_max: batches, ..config() }
}

fn check_against(db: &TidalDb, models: &[Model; 2]) -> Result<(), TestCaseError> {
    for (index, model) in models.iter().enumerate() {
        let stream = format!("s{index}");
        let read = db.stream_events(&stream, 0, 1_000).unwrap();
        let want: Vec<(u64, Option<String>)> = model.events.iter().map(|(o, k)| (*o, k.clone())).collect();
        let got: Vec<(u64, Option<String>)> = read.into_iter().map(|e| (e.offset, e.key)).collect();
        prop_assert_eq!(got, want);
        if let Some(meta) = db.stream_meta(&stream).unwrap() {
            prop_assert_eq!((meta.last_offset, meta.horizon), (model.last, model.horizon));
            prop_assert_eq!(meta.events, model.events.len() as u64);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Three engines apply one log: one flushing after every batch, one after every third, one
    /// never (until the digest). Each read matches the model after every step, the three digests
    /// match, the state survives a reopen, and a snapshot installs it whole on a fourth.
    #[test]
    fn every_flush_layout_reads_and_digests_the_same(ops in prop::collection::vec(any_op(), 1..40)) {
        let dirs: Vec<_> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
        let dbs: Vec<TidalDb> = [1, 3, usize::MAX]
            .iter()
            .zip(&dirs)
            .map(|(batches, dir)| open_with(dir.path(), config_flushing_every(*batches)))
            .collect();
        let mut log = Log::new();
        let mut models: [Model; 2] = Default::default();
        for op in ops {
            let batch = match op {
                Op::Publish { stream, events, keyed } => {
                    let first = log.next;
                    let model = &mut models[stream as usize];
                    let list: Vec<PublishEvent> = (0..events)
                        .map(|i| event(keyed.then(|| format!("k{i}")).as_deref(), u64::from(i)))
                        .collect();
                    for (i, event) in list.iter().enumerate() {
                        model.events.insert(first + i as u64, event.key.clone());
                    }
                    model.last = first + u64::from(events) - 1;
                    publish(&mut log, T0, &format!("s{stream}"), list)
                }
                Op::Trim { stream, back } => {
                    let model = &mut models[stream as usize];
                    let through = model.last.saturating_sub(u64::from(back));
                    if model.last > 0 {
                        model.horizon = model.horizon.max(through);
                        model.events.retain(|offset, _| *offset > model.horizon);
                    }
                    trim(&mut log, &format!("s{stream}"), through)
                }
                Op::Save { stream, consumer, back } => {
                    let through = models[stream as usize].last.saturating_sub(u64::from(back));
                    save(&mut log, &format!("s{stream}"), &format!("c{consumer}"), through)
                }
                Op::Item => log.item(T0, 1, "{}"),
                Op::Checkpoint => {
                    for db in &dbs {
                        db.checkpoint().unwrap();
                    }
                    continue;
                }
            };
            for db in &dbs {
                db.apply(&batch).unwrap();
                check_against(db, &models)?;
            }
        }
        let digest = dbs[0].digest().unwrap();
        for db in &dbs[1..] {
            prop_assert_eq!(db.digest().unwrap(), digest);
        }
        for (index, model) in models.iter().enumerate() {
            prop_assert_eq!(dbs[2].stream_events_in_storage(&format!("s{index}")).unwrap(), model.events.len());
        }
        let snapshot = dirs[3].path().join("snap");
        let file = std::fs::File::create(&snapshot).unwrap();
        dbs[1].export_snapshot(file, |_| Some(Term(1))).unwrap();
        let installed = open(&dirs[3].path().join("db"));
        installed.install_snapshot(&snapshot).unwrap();
        prop_assert_eq!(installed.digest().unwrap(), digest);
        check_against(&installed, &models)?;
        let path = dirs[0].path().to_path_buf();
        let first = dbs.into_iter().next().unwrap();
        drop(first);
        let reopened = open(&path);
        prop_assert_eq!(reopened.digest().unwrap(), digest);
        check_against(&reopened, &models)?;
        prop_assert_eq!(reopened.applied_seqno(), Seqno(log.next - 1));
    }
}

/// A crash while the flush of a trim is in flight, before its batch commits or after it and before
/// the trimmed events are deleted: the reopened engine, replayed, holds the clean run's state (the
/// counts of the trim included) and no trimmed event in storage.
#[test]
fn a_crash_in_a_trims_flush_recovers_to_the_clean_state() {
    use tidal_core::FlushStage;
    let mut log = Log::new();
    publish(&mut log, T0, "s", vec![event(Some("k"), 0); 5]);
    trim(&mut log, "s", 3);
    publish(&mut log, T0, "s", vec![event(None, 1)]);
    let clean = {
        let dir = tempfile::tempdir().unwrap();
        let db = open(dir.path());
        apply_all(&db, &log.batches);
        db.digest().unwrap()
    };
    let (at_publish, at_trim) = {
        let dir = tempfile::tempdir().unwrap();
        let db = open(dir.path());
        db.apply(&log.batches[0]).unwrap();
        let at_publish = db.digest().unwrap();
        db.apply(&log.batches[1]).unwrap();
        (at_publish, db.digest().unwrap())
    };
    for stage in [FlushStage::BeforeCommit, FlushStage::BeforeTrimDeletes] {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = open_with(dir.path(), config_flushing_every(1));
            db.apply(&log.batches[0]).unwrap();
            db.checkpoint().unwrap();
            let hold = db.hold_flushes(stage);
            db.apply(&log.batches[1]).unwrap(); // the trim: its window freezes and parks
            hold.wait_parked();
            if stage == FlushStage::BeforeTrimDeletes {
                assert_eq!(db.digest_of_storage().unwrap(), at_trim, "fjall holds the trim, not its deletes");
            }
            db.simulate_crash();
            drop(hold);
        }
        let db = open(dir.path());
        let expected = if stage == FlushStage::BeforeCommit { 5 } else { 6 };
        let reopened_at = if stage == FlushStage::BeforeCommit { at_publish } else { at_trim };
        assert_eq!(db.digest_of_storage().unwrap(), reopened_at, "crash at {stage:?}");
        assert_eq!(db.applied_seqno(), Seqno(expected), "crash at {stage:?}");
        apply_all(&db, &log.batches);
        assert_eq!(db.digest().unwrap(), clean, "crash at {stage:?}");
        assert_eq!(db.stream_events_in_storage("s").unwrap(), 3, "crash at {stage:?}");
        assert_eq!(db.stream_meta("s").unwrap().unwrap().events, 3);
    }
}
