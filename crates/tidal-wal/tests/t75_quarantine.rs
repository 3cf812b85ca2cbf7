//! Truncation into quarantine and reset to a snapshot position: the worked history "a cut-off
//! leader" of PROTOCOL.md, refusals that change nothing, and a crash at every file operation of a
//! quarantine and of a reset, which must recover to the old log or to the new one with a complete
//! quarantine file.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::*;
use tidal_types::{RecordKind, Seqno, Term, TermSeqno};
use tidal_wal::{Batch, CrashMode, Error, ManualClock, Position, SimIo, Wal};

const SEGMENT_BYTES_MAX: u64 = 500;

fn t(term: u64, seqno: u64) -> TermSeqno {
    TermSeqno { term: Term(term), seqno: Seqno(seqno) }
}

fn quarantine_files(io: &SimIo) -> Vec<PathBuf> {
    io.paths().into_iter().filter(|path| path.starts_with(dir().join("quarantine"))).collect()
}

fn encoded(batches: &[Batch]) -> Vec<u8> {
    batches.iter().flat_map(|batch| batch.encoded().to_vec()).collect()
}

/// n1 as leader of term 1: seqnos 1..=100 in 20 batches of 5, then 101..=105 in two batches that
/// never reach anyone. Returns n1's io and its batches.
fn cut_off_leader() -> (SimIo, Vec<Batch>) {
    let io = SimIo::new();
    let clock = Arc::new(ManualClock::new(1_000));
    let (n1, _, flushed) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
    n1.set_term(Term(1));
    for index in 0..20 {
        n1.append_blocking(request(RecordKind::Signal, 5, format!("write {index}").as_bytes())).unwrap();
    }
    n1.append_blocking(request(RecordKind::Signal, 3, b"101..103 on n1 only")).unwrap();
    n1.append_blocking(request(RecordKind::Signal, 2, b"104..105 on n1 only")).unwrap();
    n1.shutdown();
    assert!(n1.list_segments().unwrap().len() >= 4, "the cut must leave later segments to remove");
    (io, flushed.batches())
}

/// n2's log after it took office in term 2: n1's first 100 seqnos, then LeaderStart at 101 and two
/// more writes.
fn new_leader_log(n1_batches: &[Batch]) -> Vec<Batch> {
    let io = SimIo::new();
    let clock = Arc::new(ManualClock::new(2_000));
    let (n2, _, _) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
    n2.append_replicated_blocking(n1_batches[..20].to_vec()).unwrap();
    n2.set_term(Term(2));
    n2.append_blocking(request(RecordKind::Control, 1, b"LeaderStart t2")).unwrap();
    n2.append_blocking(request(RecordKind::Signal, 4, b"102..105 t2")).unwrap();
    n2.append_blocking(request(RecordKind::Signal, 2, b"106..107 t2")).unwrap();
    n2.shutdown();
    read_all(&n2, 1)
}

#[test]
fn a_cut_off_leader_quarantines_its_tail_and_takes_the_new_term() {
    let (io, n1_batches) = cut_off_leader();
    let n2_log = new_leader_log(&n1_batches);
    let clock = Arc::new(ManualClock::new(3_000));
    let (n1, _, _) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
    {
        tracing::info!("the ship's batch 101 is held with t1: n1 quarantines 101..105");
        assert_eq!(
            n1.locate(Seqno(101)),
            Position::In { term: Term(1), first: Seqno(101), last: Seqno(103) }
        );
        let report = n1.quarantine_from(Seqno(101)).unwrap();
        assert_eq!((report.first, report.last, report.batches), (t(1, 101), t(1, 105), 2));
        assert_eq!(report.durable, t(1, 100));
        let path = report.path.unwrap();
        assert_eq!(file_name(&path), "1-101-105-3000.wal");
        assert_eq!(io.synced_bytes(&path).unwrap(), encoded(&n1_batches[20..]));
        assert!(io.is_entry_durable(&path));
        assert_eq!(report.bytes, encoded(&n1_batches[20..]).len() as u64);
        assert_eq!(n1.durable_seqno(), Seqno(100), "the durable frontier went down");
        assert_eq!(n1.last_position(), t(1, 100));
        assert_eq!(n1.locate(Seqno(101)), Position::Beyond);
        assert_eq!(read_all(&n1, 1), n1_batches[..20].to_vec());
    }
    {
        tracing::info!("then it appends term 2 from 101, and a leader append of its stale term is refused");
        n1.append_replicated_blocking(n2_log[20..].to_vec()).unwrap();
        assert_eq!(read_all(&n1, 1), n2_log);
        assert_eq!(n1.term_history(), vec![t(1, 1), t(2, 101)]);
        assert!(matches!(
            n1.append_blocking(request(RecordKind::Signal, 1, b"stale")),
            Err(Error::TermRegression { .. })
        ));
    }
    {
        tracing::info!("a reopen sees the same log and index; the quarantine file stays");
        n1.shutdown();
        drop(n1);
        let (n1, recovery, _) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
        assert_eq!(recovery.durable, Seqno(107));
        assert_eq!(read_all(&n1, 1), n2_log);
        assert_eq!(n1.term_history(), vec![t(1, 1), t(2, 101)]);
        assert_eq!(
            n1.locate(Seqno(101)),
            Position::In { term: Term(2), first: Seqno(101), last: Seqno(101) }
        );
        assert_eq!(quarantine_files(&io).len(), 1);
    }
}

#[test]
fn a_quarantine_at_a_segment_start_and_refusals() {
    let (io, n1_batches) = cut_off_leader();
    let clock = Arc::new(ManualClock::new(3_000));
    let (n1, _, _) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
    // The writer prepares its next segment while idle (decisions/017): let it finish first.
    assert!(n1.wait_segment_prepared(std::time::Duration::from_secs(30)));
    {
        tracing::info!("inside a batch, beyond the log, purged: refused, nothing changes");
        let before: Vec<(PathBuf, Vec<u8>)> =
            io.paths().into_iter().map(|p| (p.clone(), io.file_bytes(&p).unwrap())).collect();
        for seqno in [0, 102, 106, 500] {
            let refused = n1.quarantine_from(Seqno(seqno));
            assert!(matches!(refused, Err(Error::NotBatchStart { .. })), "{seqno}: {refused:?}");
        }
        let horizon = n1.list_segments().unwrap()[1].first_seqno;
        n1.purge_below(horizon).unwrap();
        assert!(matches!(n1.quarantine_from(Seqno(1)), Err(Error::NotBatchStart { .. })));
        assert!(!n1.is_poisoned());
        assert_eq!(read_all(&n1, horizon.get()).last().unwrap().last_seqno(), Seqno(105));
        let after: Vec<(PathBuf, Vec<u8>)> =
            io.paths().into_iter().map(|p| (p.clone(), io.file_bytes(&p).unwrap())).collect();
        assert_eq!(after.len() + 1, before.len(), "only the purge removed a file");
    }
    {
        tracing::info!("a cut at the first batch of a segment leaves that segment empty and active");
        let segments = n1.list_segments().unwrap();
        let cut = segments[1].first_seqno;
        let report = n1.quarantine_from(cut).unwrap();
        assert_eq!(report.durable.seqno, Seqno(cut.get() - 1));
        let segments_after = n1.list_segments().unwrap();
        assert_eq!(segments_after.len(), 2);
        assert_eq!(segments_after[1].bytes, 0);
        assert_eq!(segments_after[1].last_seqno, None);
        n1.append_replicated_blocking(
            n1_batches.iter().filter(|b| b.first_seqno() >= cut).cloned().collect(),
        )
        .unwrap();
        assert_eq!(n1.durable_seqno(), Seqno(105));
    }
}

/// What a reopened WAL looks like, to compare against the allowed states.
#[derive(Debug, PartialEq)]
struct Reopened {
    batches: Vec<Batch>,
    last: TermSeqno,
    purged: TermSeqno,
    history: Vec<TermSeqno>,
}

fn reopen(io: &SimIo) -> (Wal, Reopened) {
    let clock = Arc::new(ManualClock::new(4_000));
    let (wal, _, _) = open(io, small_config(SEGMENT_BYTES_MAX), &clock);
    let reopened = Reopened {
        batches: read_all(&wal, wal.purged().seqno.get() + 1),
        last: wal.last_position(),
        purged: wal.purged(),
        history: wal.term_history(),
    };
    (wal, reopened)
}

/// Runs `operation` on a fresh copy of the cut-off leader's WAL with a crash planned at its `op`-th
/// file operation; returns the io after the crash, or `None` if the operation finished first.
fn crash_during(op: u64, mode: CrashMode, operation: &dyn Fn(&Wal)) -> Option<SimIo> {
    let (io, _) = cut_off_leader();
    let clock = Arc::new(ManualClock::new(3_000));
    let (wal, _, _) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
    // The writer prepares its next segment while idle (decisions/017): let it finish first.
    assert!(wal.wait_segment_prepared(std::time::Duration::from_secs(30)));
    io.crash_at_op(op, mode);
    operation(&wal);
    wal.shutdown();
    if io.crash_pending() {
        return None;
    }
    io.restart();
    Some(io)
}

fn ops_of(operation: &dyn Fn(&Wal)) -> u64 {
    let (io, _) = cut_off_leader();
    let clock = Arc::new(ManualClock::new(3_000));
    let (wal, _, _) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
    assert!(wal.wait_segment_prepared(std::time::Duration::from_secs(30)));
    let before = io.op_count();
    operation(&wal);
    io.op_count() - before
}

const MODES: [CrashMode; 2] = [CrashMode::LoseUnsynced, CrashMode::TornUnsynced { keep: 7 }];

#[test]
fn a_crash_at_every_operation_of_a_quarantine_leaves_the_old_or_the_truncated_log() {
    let (_, n1_batches) = cut_off_leader();
    let quarantine = |wal: &Wal| {
        let _ = wal.quarantine_from(Seqno(36));
    };
    let cut_index = n1_batches.iter().position(|b| b.first_seqno() == Seqno(36)).unwrap();
    let old =
        Reopened { batches: n1_batches.clone(), last: t(1, 105), purged: t(0, 0), history: vec![t(1, 1)] };
    let truncated = Reopened {
        batches: n1_batches[..cut_index].to_vec(),
        last: t(1, 35),
        purged: t(0, 0),
        history: vec![t(1, 1)],
    };
    let total = ops_of(&quarantine);
    assert!(total > 8, "a quarantine takes several operations, got {total}");
    let (mut saw_old, mut saw_truncated) = (0, 0);
    for op in 1..=total {
        for mode in MODES {
            let Some(io) = crash_during(op, mode, &quarantine) else { continue };
            let (wal, reopened) = reopen(&io);
            let files = quarantine_files(&io);
            assert!(files.iter().all(|p| p.extension().is_some_and(|e| e == "wal")), "op {op}: {files:?}");
            if reopened == truncated {
                saw_truncated += 1;
                assert_eq!(files.len(), 1, "op {op} {mode:?}: the truncated log needs its quarantine file");
                assert_eq!(io.synced_bytes(&files[0]).unwrap(), encoded(&n1_batches[cut_index..]));
            } else {
                assert_eq!(reopened, old, "op {op} {mode:?}: neither the old nor the truncated log");
                saw_old += 1;
            }
            {
                tracing::info!("either way the log continues: a new term from the end it has");
                let next = wal.durable_seqno().next();
                let batch = Batch::new(RecordKind::Control, Term(2), next, 1, &[0u8; 8]);
                wal.append_replicated_blocking(vec![batch]).unwrap();
                wal.shutdown();
                drop(wal);
                let (_, again) = reopen(&io);
                assert_eq!(again.last, t(2, next.get()), "op {op} {mode:?}: a second reopen continues");
            }
        }
    }
    assert!(saw_old > 0 && saw_truncated > 0, "old {saw_old}, truncated {saw_truncated}");
}

#[test]
fn reset_to_a_snapshot_position_and_reopen() {
    let (io, n1_batches) = cut_off_leader();
    let clock = Arc::new(ManualClock::new(3_000));
    let (wal, _, _) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
    {
        tracing::info!("a history that does not fit the position is refused and changes nothing");
        assert!(matches!(wal.reset_to(t(5, 500), &[t(1, 1), t(4, 300)]), Err(Error::InvalidReset(_))));
        assert!(matches!(wal.reset_to(t(5, 500), &[t(5, 300), t(4, 400)]), Err(Error::InvalidReset(_))));
        assert_eq!(read_all(&wal, 1), n1_batches);
    }
    {
        tracing::info!("reset to (t5, 500): everything retained is quarantined, the log continues at 501");
        let report = wal.reset_to(t(5, 500), &[t(1, 1), t(5, 300), t(6, 600)]).unwrap();
        assert_eq!((report.first, report.last, report.batches), (t(1, 1), t(1, 105), 22));
        assert_eq!(io.synced_bytes(report.path.as_ref().unwrap()).unwrap(), encoded(&n1_batches));
        assert_eq!(wal.last_position(), t(5, 500));
        assert_eq!(wal.purged(), t(5, 500));
        assert_eq!(wal.term_history(), vec![t(1, 1), t(5, 300)]);
        assert_eq!(wal.locate(Seqno(500)), Position::Purged);
        assert_eq!(wal.locate(Seqno(501)), Position::Beyond);
        assert_eq!(wal.indexed_batches(), 0);
        assert_eq!(segment_paths(&io).len(), 1);
        wal.append_replicated_blocking(vec![Batch::new(
            RecordKind::Signal,
            Term(5),
            Seqno(501),
            2,
            &[1u8; 9],
        )])
        .unwrap();
    }
    wal.shutdown();
    drop(wal);
    {
        tracing::info!("a reopen continues from there");
        let (wal, reopened) = reopen(&io);
        assert_eq!(reopened.last, t(5, 502));
        assert_eq!(reopened.purged, t(5, 500));
        assert_eq!(reopened.history, vec![t(1, 1), t(5, 300)]);
        assert_eq!(
            wal.locate(Seqno(502)),
            Position::In { term: Term(5), first: Seqno(501), last: Seqno(502) }
        );
        assert_eq!(wal.term_at(Seqno(200)), Some(Term(1)));
    }
}

#[test]
fn a_crash_at_every_operation_of_a_reset_leaves_the_old_or_the_reset_log() {
    let (_, n1_batches) = cut_off_leader();
    let reset = |wal: &Wal| {
        let _ = wal.reset_to(t(5, 60), &[t(1, 1), t(5, 40)]);
    };
    let old =
        Reopened { batches: n1_batches.clone(), last: t(1, 105), purged: t(0, 0), history: vec![t(1, 1)] };
    let reset_log =
        Reopened { batches: Vec::new(), last: t(5, 60), purged: t(5, 60), history: vec![t(1, 1), t(5, 40)] };
    let total = ops_of(&reset);
    let (mut saw_old, mut saw_reset) = (0, 0);
    for op in 1..=total {
        for mode in MODES {
            let Some(io) = crash_during(op, mode, &reset) else { continue };
            let (wal, reopened) = reopen(&io);
            let files = quarantine_files(&io);
            if reopened == reset_log {
                saw_reset += 1;
                assert_eq!(files.len(), 1, "op {op} {mode:?}: the reset log needs its quarantine file");
                assert_eq!(io.synced_bytes(&files[0]).unwrap(), encoded(&n1_batches));
                let segments = wal.list_segments().unwrap();
                assert_eq!(segments.len(), 1);
                assert_eq!(segments[0].first_seqno, Seqno(61));
            } else {
                assert_eq!(reopened, old, "op {op} {mode:?}: neither the old nor the reset log");
                saw_old += 1;
            }
            let next = wal.durable_seqno().next();
            let batch = Batch::new(RecordKind::Control, Term(6), next, 1, &[0u8; 8]);
            wal.append_replicated_blocking(vec![batch]).unwrap();
            wal.shutdown();
            drop(wal);
            let (_, again) = reopen(&io);
            assert_eq!(again.last, t(6, next.get()), "op {op} {mode:?}: a second reopen continues");
        }
    }
    assert!(saw_old > 0 && saw_reset > 0, "old {saw_old}, reset {saw_reset}");
}

#[test]
fn an_incomplete_quarantine_file_is_removed_on_open() {
    let (io, _) = cut_off_leader();
    let tmp = dir().join("quarantine").join("1-101-105-3000.wal.tmp");
    io.write_file(&tmp, b"half a batch");
    let (wal, _) = reopen(&io);
    assert!(quarantine_files(&io).is_empty());
    assert_eq!(wal.durable_seqno(), Seqno(105));
}
