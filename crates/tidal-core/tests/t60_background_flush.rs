//! The background flusher: reads while a frozen overlay is in flight, crashes with one in flight
//! (in process and by a real abort), and backpressure when a second flush comes due. The flusher
//! is held at a stage by `TidalDb::hold_flushes`, so nothing here depends on timing.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

mod common;

use std::path::Path;

use common::*;
use tidal_core::{EngineConfig, FlushStage, ItemState, Ranked, TidalDb};
use tidal_types::{RecordKind, Seqno};

const USERS: [&str; 8] = ["u0", "u1", "u2", "u3", "u4", "u5", "u6", "nobody"];

/// Feeds, trending, similar, items, embeddings, idempotency records and the state sizes.
type Reads = (
    Vec<Ranked>,
    Vec<Option<ItemState>>,
    Vec<Option<(Vec<f32>, Seqno)>>,
    Vec<Option<tidal_core::IdempotencyRecord>>,
    tidal_core::EngineStats,
);

fn reads(db: &TidalDb) -> Reads {
    let mut feeds: Vec<Ranked> = USERS.iter().map(|user| db.feed(user, 50, &[]).unwrap()).collect();
    feeds.push(db.trending(50).unwrap());
    feeds.push(db.similar(3, 50).unwrap().unwrap());
    let items = (0..45).map(|item| db.get_item(item).unwrap()).collect();
    let embeddings = (0..45).map(|item| db.get_embedding(item).unwrap()).collect();
    let keys = (0..30)
        .map(|round| db.idempotency_lookup(&format!("p{}", round % 2), &format!("k{round}")).unwrap())
        .collect();
    (feeds, items, embeddings, keys, sizes(db))
}

/// Nothing flushes before a checkpoint or a digest: the reference for reads at any prefix.
fn never_flush() -> EngineConfig {
    EngineConfig { overlay_bytes_max: usize::MAX, overlay_batches_max: usize::MAX, ..config() }
}

/// Reads of a database that applied `log.batches[..count]` and flushed nothing.
fn reference_reads(log: &Log, count: usize) -> Reads {
    let dir = tempfile::tempdir().unwrap();
    let db = open_with(dir.path(), never_flush());
    apply_all(&db, &log.batches[..count]);
    reads(&db)
}

/// A flush window of `FLUSH_EVERY` applies, and the split of the workload the tests use: the first
/// `CHECKPOINTED` batches reach fjall, the next `FLUSH_EVERY` fill the overlay that is frozen and
/// held in flight, and `ACTIVE_AFTER` more sit in the fresh active overlay above it.
const FLUSH_EVERY: usize = 20;
const CHECKPOINTED: usize = 50;
const ACTIVE_AFTER: usize = 7;

/// Applies the checkpointed part, then fills and freezes one overlay while `stage` holds the
/// flusher, then applies `ACTIVE_AFTER` more. Returns the hold and the frozen overlay's seqno.
fn freeze_one_held(db: &TidalDb, log: &Log, stage: FlushStage) -> (tidal_core::FlushHold, Seqno) {
    apply_all(db, &log.batches[..CHECKPOINTED]);
    let checkpointed = db.checkpoint().unwrap();
    assert_eq!(checkpointed, log.batches[CHECKPOINTED - 1].last_seqno());
    let hold = db.hold_flushes(stage);
    let frozen_at = CHECKPOINTED + FLUSH_EVERY;
    apply_all(db, &log.batches[CHECKPOINTED..frozen_at]);
    hold.wait_parked();
    apply_all(db, &log.batches[frozen_at..frozen_at + ACTIVE_AFTER]);
    (hold, log.batches[frozen_at - 1].last_seqno())
}

/// Flushes every `FLUSH_EVERY` applies, each by ingestion behind an intent file however small
/// (decisions/072): the stages these tests hold the flusher at are the ingestion's.
fn flush_window() -> EngineConfig {
    EngineConfig { overlay_batches_max: FLUSH_EVERY, flush_ingest_bytes_min: 0, ..config() }
}

#[test]
fn reads_during_an_in_flight_flush_return_what_they_returned_before_it() {
    let log = workload();
    let applied_count = CHECKPOINTED + FLUSH_EVERY + ACTIVE_AFTER;
    let expected = reference_reads(&log, applied_count);
    let dir = tempfile::tempdir().unwrap();
    let db = open_with(dir.path(), flush_window());
    let (hold, frozen_seqno) = freeze_one_held(&db, &log, FlushStage::BeforeCommit);
    let checkpointed = log.batches[CHECKPOINTED - 1].last_seqno();
    {
        tracing::info!("held before the commit: reads see the active overlay over the frozen one over fjall");
        assert_eq!(db.flushed_applied_seqno(), checkpointed);
        assert!(db.stats().flush.in_flight);
        assert_eq!(db.applied_seqno(), log.batches[applied_count - 1].last_seqno());
        assert_eq!(reads(&db), expected);
    }
    {
        tracing::info!("held after the commit: fjall holds the frozen overlay, which reads still see");
        hold.advance(FlushStage::AfterCommit);
        hold.wait_parked();
        assert_eq!(db.flushed_applied_seqno(), frozen_seqno);
        assert!(db.stats().flush.in_flight);
        assert_eq!(reads(&db), expected);
    }
    {
        tracing::info!("released: the frozen overlay leaves the read path; reads are unchanged");
        drop(hold);
        assert_eq!(db.checkpoint().unwrap(), db.applied_seqno());
        assert!(!db.stats().flush.in_flight);
        assert_eq!(reads(&db), expected);
        apply_all(&db, &log.batches);
        assert_eq!(reads(&db), reference_reads(&log, log.batches.len()));
    }
}

#[test]
fn a_crash_with_a_frozen_overlay_in_flight_recovers_by_replay_to_the_same_digest() {
    let log = workload();
    let clean = {
        let dir = tempfile::tempdir().unwrap();
        let db = open_with(dir.path(), never_flush());
        apply_all(&db, &log.batches);
        (db.digest().unwrap(), reads(&db))
    };
    let checkpointed = log.batches[CHECKPOINTED - 1].last_seqno();
    // Before its marker, fjall holds every keyspace of the flush but `meta`: the open finishes it
    // from the intent file, so it is committed as if the crash came after.
    let stages = [
        (FlushStage::BeforeCommit, false),
        (FlushStage::BeforeMarker, true),
        (FlushStage::AfterCommit, true),
    ];
    for (stage, committed) in stages {
        let dir = tempfile::tempdir().unwrap();
        let frozen_seqno = {
            tracing::info!(?stage, "crash while the flusher is held");
            let db = open_with(dir.path(), flush_window());
            let (hold, frozen_seqno) = freeze_one_held(&db, &log, stage);
            db.simulate_crash();
            drop(hold);
            frozen_seqno
        };
        {
            tracing::info!(?stage, "reopen: fjall holds a whole flush, and replay restores the rest");
            let db = open_with(dir.path(), flush_window());
            let expected = if committed { frozen_seqno } else { checkpointed };
            assert_eq!(db.applied_seqno(), expected, "crash at {stage:?}");
            apply_all(&db, &log.batches);
            assert_eq!(db.digest().unwrap(), clean.0, "crash at {stage:?}");
            assert_eq!(reads(&db), clean.1, "crash at {stage:?}");
            tracing::info!(?stage, "replaying again changes nothing");
            apply_all(&db, &log.batches);
            assert_eq!(db.digest().unwrap(), clean.0, "crash at {stage:?}");
        }
    }
}

/// fjall's ingestion is atomic per keyspace only: held before its marker, a flush has put every
/// keyspace but `meta` into fjall, so a snapshot taken then would pair the previous applied seqno
/// with the new data. A snapshot taken between flushes (digest, export) waits instead.
#[test]
fn a_snapshot_between_flushes_never_sees_half_of_one() {
    let log = workload();
    let checkpointed = log.batches[CHECKPOINTED - 1].last_seqno();
    let at_checkpoint = {
        let dir = tempfile::tempdir().unwrap();
        let db = open_with(dir.path(), never_flush());
        apply_all(&db, &log.batches[..CHECKPOINTED]);
        db.digest().unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let db = open_with(dir.path(), flush_window());
    let (hold, _) = freeze_one_held(&db, &log, FlushStage::BeforeMarker);
    let torn = db.digest_of_storage().unwrap();
    assert_eq!(torn.0, checkpointed, "meta still holds the previous flush's seqno");
    assert_ne!(torn, at_checkpoint, "fjall holds the new flush's data under the previous seqno");
    assert_eq!(db.try_digest_between_flushes().unwrap(), None, "a snapshot waits for the marker");
    drop(hold);
    let whole = db.digest().unwrap();
    assert_eq!(whole.0, db.applied_seqno());
    assert_eq!(db.try_digest_between_flushes().unwrap(), Some(whole));
}

const CHILD_DIR_ENV: &str = "TIDAL_CORE_FLUSH_CRASH_DIR";
const CHILD_STAGE_ENV: &str = "TIDAL_CORE_FLUSH_CRASH_STAGE";

/// The child side of `a_process_abort_with_a_frozen_overlay_in_flight_loses_only_overlays`: a no-op
/// unless the parent set the environment. Aborts while the flusher is held.
#[test]
fn flush_crash_child() {
    let (Some(dir), Some(stage)) = (std::env::var_os(CHILD_DIR_ENV), std::env::var_os(CHILD_STAGE_ENV))
    else {
        return;
    };
    let stage = match stage.to_str() {
        Some("before") => FlushStage::BeforeCommit,
        Some("marker") => FlushStage::BeforeMarker,
        _ => FlushStage::AfterCommit,
    };
    let log = workload();
    let db = open_with(Path::new(&dir), flush_window());
    let (_hold, _) = freeze_one_held(&db, &log, stage);
    // No drop, no checkpoint: the process dies as with kill -9, the flusher held mid-flight.
    std::process::abort();
}

#[test]
fn a_process_abort_with_a_frozen_overlay_in_flight_loses_only_overlays() {
    let log = workload();
    let clean = {
        let dir = tempfile::tempdir().unwrap();
        let db = open_with(dir.path(), never_flush());
        apply_all(&db, &log.batches);
        db.digest().unwrap()
    };
    let checkpointed = log.batches[CHECKPOINTED - 1].last_seqno();
    let frozen_seqno = log.batches[CHECKPOINTED + FLUSH_EVERY - 1].last_seqno();
    for (stage, expected) in [("before", checkpointed), ("marker", frozen_seqno), ("after", frozen_seqno)] {
        let dir = tempfile::tempdir().unwrap();
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "flush_crash_child", "--nocapture", "--test-threads=1"])
            .env(CHILD_DIR_ENV, dir.path())
            .env(CHILD_STAGE_ENV, stage)
            .status()
            .unwrap();
        assert!(!status.success(), "the child must abort");
        let db = open_with(dir.path(), flush_window());
        assert_eq!(db.applied_seqno(), expected, "abort {stage} the commit");
        apply_all(&db, &log.batches);
        assert_eq!(db.digest().unwrap(), clean, "abort {stage} the commit");
    }
}

#[test]
fn apply_waits_when_a_second_flush_comes_due_during_the_first() {
    let log = workload();
    let dir = tempfile::tempdir().unwrap();
    let db = open_with(dir.path(), EngineConfig { overlay_batches_max: 2, ..config() });
    let seqno_after = |count: usize| log.batches[count - 1].last_seqno();
    let hold = db.hold_flushes(FlushStage::BeforeCommit);
    {
        tracing::info!("two applies fill the overlay: it is frozen and its flush held");
        apply_all(&db, &log.batches[..2]);
        hold.wait_parked();
        assert!(db.stats().flush.in_flight);
    }
    {
        tracing::info!("two more fill the fresh overlay: its flush is due, but nobody waits yet");
        apply_all(&db, &log.batches[2..4]);
        assert_eq!(db.applied_seqno(), seqno_after(4));
        assert_eq!(db.stats().flush.backpressure_waits, 0);
    }
    std::thread::scope(|scope| {
        tracing::info!("the next apply waits for the first flush rather than grow a third overlay");
        let waiting = scope.spawn(|| db.apply(&log.batches[4]).unwrap());
        while db.stats().flush.backpressure_waits == 0 {
            std::thread::yield_now();
        }
        assert_eq!(db.applied_seqno(), seqno_after(4), "the waiting batch is not folded yet");
        assert_eq!(db.flushed_applied_seqno(), Seqno::ZERO);
        assert!(!waiting.is_finished());
        drop(hold);
        waiting.join().unwrap();
    });
    {
        tracing::info!("released: the first flush landed, the second was frozen, the batch applied");
        assert_eq!(db.applied_seqno(), seqno_after(5));
        assert!(db.flushed_applied_seqno() >= seqno_after(2));
        assert_eq!(db.checkpoint().unwrap(), seqno_after(5));
        let stats = db.stats().flush;
        assert_eq!((stats.flushes, stats.backpressure_waits, stats.failed), (3, 1, false));
        assert_eq!(stats.duration_ms_buckets.iter().sum::<u64>(), 3);
    }
}

/// A test gate: durable through `durable`; records every seqno the flusher asks about.
#[derive(Default)]
struct TestGate {
    state: std::sync::Mutex<(Seqno, Vec<Seqno>)>,
    changed: std::sync::Condvar,
}

impl TestGate {
    fn set_durable(&self, seqno: Seqno) {
        self.state.lock().unwrap().0 = seqno;
        self.changed.notify_all();
    }

    /// Waits (bounded) until the flusher has asked about `seqno`.
    fn wait_asked(&self, seqno: Seqno) -> bool {
        let state = self.state.lock().unwrap();
        let (state, _) = self
            .changed
            .wait_timeout_while(state, std::time::Duration::from_secs(10), |s| !s.1.contains(&seqno))
            .unwrap();
        state.1.contains(&seqno)
    }
}

impl tidal_core::DurableGate for TestGate {
    fn wait_durable(&self, seqno: Seqno, timeout: std::time::Duration) -> tidal_core::GateWait {
        let mut state = self.state.lock().unwrap();
        if !state.1.contains(&seqno) {
            state.1.push(seqno);
            self.changed.notify_all();
        }
        let (state, _) = self.changed.wait_timeout_while(state, timeout, |s| s.0 < seqno).unwrap();
        if state.0 >= seqno {
            tidal_core::GateWait::Durable
        } else {
            tidal_core::GateWait::NotYet
        }
    }
}

#[test]
fn fjall_never_holds_state_past_the_durable_gate() {
    let log = workload();
    let dir = tempfile::tempdir().unwrap();
    let db = std::sync::Arc::new(open_with(dir.path(), flush_window()));
    let gate = std::sync::Arc::new(TestGate::default());
    assert!(db.set_durable_gate(gate.clone()));
    let at = |count: usize| log.batches[count - 1].last_seqno();
    {
        tracing::info!("durable through batch 25: the overlay frozen at batch 20 flushes");
        gate.set_durable(at(25));
        apply_all(&db, &log.batches[..30]);
        assert!(gate.wait_asked(at(20)));
    }
    {
        tracing::info!("a checkpoint freezes batch 30, past the gate: it waits, fjall stays at 20");
        let checkpointing = {
            let db = db.clone();
            std::thread::spawn(move || db.checkpoint().unwrap())
        };
        assert!(gate.wait_asked(at(30)), "the flusher never asked the gate about batch 30");
        assert_eq!(db.flushed_applied_seqno(), at(20), "fjall went past the WAL's durable frontier");
        assert_eq!(db.applied_seqno(), at(30), "applies do not wait for the gate");
        tracing::info!("the WAL is durable through batch 30: the checkpoint completes");
        gate.set_durable(at(30));
        assert_eq!(checkpointing.join().unwrap(), at(30));
        assert_eq!(db.flushed_applied_seqno(), at(30));
    }
}

/// Whether a freeze handed an overlay to the flusher (the flush may still run or be done).
fn flushed_or_flushing(db: &TidalDb) -> bool {
    let flush = db.stats().flush;
    flush.in_flight || flush.flushes > 0
}

#[test]
fn a_startup_replay_ignores_the_bound_on_applies_but_not_the_bound_on_bytes() {
    let log = workload();
    let dir = tempfile::tempdir().unwrap();
    let db = open_with(dir.path(), EngineConfig { overlay_batches_max: 2, ..config() });
    {
        tracing::info!("replaying: ten times the bound on applies, and nothing is frozen");
        db.set_replaying(true);
        apply_all(&db, &log.batches[..20]);
        assert!(!flushed_or_flushing(&db), "{:?}", db.stats().flush);
        assert_eq!(db.flushed_applied_seqno(), Seqno::ZERO);
    }
    {
        tracing::info!("replay over: the next apply freezes the overlay");
        db.set_replaying(false);
        apply_all(&db, &log.batches[20..21]);
        assert!(flushed_or_flushing(&db));
    }
    let dir = tempfile::tempdir().unwrap();
    let db = open_with(dir.path(), EngineConfig { overlay_bytes_max: 1, ..config() });
    tracing::info!("replaying with a bound on bytes every apply passes: it still freezes");
    db.set_replaying(true);
    apply_all(&db, &log.batches[..2]);
    assert!(flushed_or_flushing(&db));
}

/// A startup replay's flush writes its seen pairs first, by fjall's ingestion, then the rest and
/// the applied seqno in one batch. A crash between the two leaves fjall holding seen pairs past its
/// applied seqno; the replay from there adds the same pairs again, so the state ends the same.
#[test]
fn a_crash_between_a_replay_flushs_ingestion_and_its_commit_recovers_to_the_same_digest() {
    let log = workload();
    let signals_from = log.batches.iter().position(|batch| batch.kind() == RecordKind::Signal).unwrap();
    let clean = {
        let dir = tempfile::tempdir().unwrap();
        let db = open_with(dir.path(), never_flush());
        apply_all(&db, &log.batches);
        db.digest().unwrap()
    };
    let at_checkpoint = {
        let dir = tempfile::tempdir().unwrap();
        let db = open_with(dir.path(), never_flush());
        apply_all(&db, &log.batches[..signals_from]);
        db.digest().unwrap()
    };
    {
        tracing::info!("a replay that flushes after every batch reaches the same state");
        let dir = tempfile::tempdir().unwrap();
        let db = open_with(dir.path(), EngineConfig { overlay_bytes_max: 1, ..config() });
        db.set_replaying(true);
        apply_all(&db, &log.batches);
        db.set_replaying(false);
        assert!(db.stats().flush.flushes > 1, "{:?}", db.stats().flush);
        assert_eq!(db.digest().unwrap(), clean);
        drop(db);
        // Most of those flushes have no seen pairs (the item batches): an ingestion started for
        // them would leave an empty table file behind each time.
        let empty = empty_table_files(dir.path());
        assert!(empty.is_empty(), "empty table files: {empty:?}");
    }
    let dir = tempfile::tempdir().unwrap();
    let checkpointed = {
        // Every apply freezes (a bound of one byte), and a replay's freezes ingest.
        let db = open_with(dir.path(), EngineConfig { overlay_bytes_max: 1, ..config() });
        apply_all(&db, &log.batches[..signals_from]);
        let checkpointed = db.checkpoint().unwrap();
        db.set_replaying(true);
        let hold = db.hold_flushes(FlushStage::AfterIngest);
        tracing::info!("a replay's flush of one signal batch ingests its seen pairs and is held");
        apply_all(&db, &log.batches[signals_from..=signals_from]);
        hold.wait_parked();
        db.simulate_crash();
        drop(hold);
        checkpointed
    };
    let db = open_with(dir.path(), config());
    assert_eq!(db.applied_seqno(), checkpointed, "the batch of the held flush was not committed");
    assert_ne!(
        db.digest().unwrap(),
        at_checkpoint,
        "fjall must hold the ingested seen pairs past its applied seqno (else this tests nothing)"
    );
    apply_all(&db, &log.batches);
    assert_eq!(db.digest().unwrap(), clean);
    tracing::info!("replaying again changes nothing");
    apply_all(&db, &log.batches);
    assert_eq!(db.digest().unwrap(), clean);
}

/// Empty files in any `tables` directory under `dir` (fjall keeps a keyspace's tables there).
fn empty_table_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut empty = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(next) = dirs.pop() {
        for entry in std::fs::read_dir(next).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_dir() {
                dirs.push(entry.path());
            } else if entry.metadata().unwrap().len() == 0 && in_tables_dir(&entry.path()) {
                empty.push(entry.path());
            }
        }
    }
    empty
}

fn in_tables_dir(path: &Path) -> bool {
    path.parent().is_some_and(|parent| parent.ends_with("tables"))
}

#[test]
fn a_failed_flush_is_the_engines_fault_until_a_restart() {
    let log = workload();
    let dir = tempfile::tempdir().unwrap();
    let db = open_with(dir.path(), config());
    apply_all(&db, &log.batches[..10]);
    assert_eq!(db.fault(), None, "a sound engine reports no fault");
    db.fail_next_flush("injected: no space left on device");
    assert!(db.checkpoint().is_err());
    let fault = db.fault().expect("the failed flush is not reported");
    assert!(fault.contains("no space left on device"), "{fault}");
    assert!(db.apply(&log.batches[10]).is_err(), "an apply after a failed flush must fail");
    db.simulate_crash();
    let db = open_with(dir.path(), config());
    assert_eq!(db.fault(), None, "a restart clears it (the WAL is replayed)");
}
