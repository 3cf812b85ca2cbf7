//! Crash at every point: a power loss at each mutating file operation of a workload (appends,
//! rotations, a term change, a purge), losing or tearing unsynced bytes, then reopen. Recovery must
//! give exactly a prefix of whole batches, holding every batch whose completion was delivered.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use tidal_types::{RecordKind, Seqno, Term};
use tidal_wal::{Appended, CrashMode, ManualClock, SimIo, Wal};

const SEGMENT_BYTES_MAX: u64 = 400;
const BLOCKING_APPENDS: usize = 24;
const BURST: usize = 8;
/// Only a hang waits this long for the writer to prepare a 400-byte segment.
const PREPARED_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// An acknowledged write and the body it carried.
type Acked = (Appended, Vec<u8>);

fn body(index: usize) -> Vec<u8> {
    let len = 10 + (index * 37) % 120;
    let mut body = format!("request {index:03}:").into_bytes();
    body.resize(len, b'a' + (index % 26) as u8);
    body
}

/// Bodies in the order the workload submits them (the order seqnos are assigned in).
fn submitted() -> Vec<Vec<u8>> {
    (0..BLOCKING_APPENDS + BURST).map(body).collect()
}

/// Runs the workload until the first failure; returns the acknowledged writes.
fn workload(wal: &Wal) -> Vec<Acked> {
    let mut acked = Vec::new();
    if blocking_phase(wal, &mut acked) {
        burst_phase(wal, &mut acked);
    }
    acked
}

/// The appends one at a time, each waited for (the same file operations in every run); false if
/// one failed.
fn blocking_phase(wal: &Wal, acked: &mut Vec<Acked>) -> bool {
    for index in 0..BLOCKING_APPENDS {
        if index == 8 {
            wal.set_term(Term(2));
        }
        if index == 16 && wal.purge_below(Seqno(12)).is_err() {
            return false;
        }
        let kind = RecordKind::ALL[index % RecordKind::ALL.len()];
        match wal.append_blocking(request(kind, (index % 3 + 1) as u32, &body(index))) {
            Ok(appended) => acked.push((appended, body(index))),
            Err(_) => return false,
        }
        // The writer prepares its next segment while idle (decisions/017): let it, so every run
        // performs the same file operations in the same order.
        wal.wait_segment_prepared(PREPARED_WAIT);
    }
    true
}

/// A burst of submissions at once: how they group into drains depends on thread timing.
fn burst_phase(wal: &Wal, acked: &mut Vec<Acked>) {
    let burst_acked: Arc<Mutex<Vec<Acked>>> = Arc::default();
    let (sender, receiver) = std::sync::mpsc::channel::<()>();
    for index in BLOCKING_APPENDS..BLOCKING_APPENDS + BURST {
        let (burst_acked, sender) = (burst_acked.clone(), sender.clone());
        let done = Box::new(move |result: Result<Appended, tidal_wal::Error>| {
            if let Ok(appended) = result {
                burst_acked.lock().unwrap().push((appended, body(index)));
            }
            drop(sender);
        });
        if wal.submit(request(RecordKind::Signal, 2, &body(index)), done).is_err() {
            break;
        }
    }
    drop(sender);
    let _ = receiver.recv(); // returns once every completion has dropped its sender
    wal.wait_segment_prepared(PREPARED_WAIT);
    acked.extend(burst_acked.lock().unwrap().drain(..));
}

/// Checks the reopened WAL against what was submitted and acknowledged.
fn check_recovered(io: &SimIo, acked: &[Acked], label: &str) {
    let clock = Arc::new(ManualClock::new(1_000));
    let (wal, recovery, _) = try_open(io, small_config(SEGMENT_BYTES_MAX), &clock)
        .unwrap_or_else(|err| panic!("{label}: reopen failed: {err}"));
    let first_retained = wal.list_segments().unwrap()[0].first_seqno;
    let batches = read_all(&wal, first_retained.get());
    assert_eq!(
        recovery.durable,
        batches.last().map_or(Seqno(first_retained.get() - 1), |b| b.last_seqno()),
        "{label}"
    );
    {
        tracing::info!("the recovered batches are a prefix of the submitted ones");
        let submitted = submitted();
        // Seqnos of the submitted requests, in order: each consumes `index % 3 + 1` or 2 (burst).
        let mut next = Seqno(1);
        let mut expected_at = Vec::new();
        for (index, body) in submitted.iter().enumerate() {
            let events = if index < BLOCKING_APPENDS { (index % 3 + 1) as u64 } else { 2 };
            expected_at.push((next, body.clone()));
            next = next.add(events);
        }
        let skip = expected_at.iter().position(|(seqno, _)| *seqno == first_retained);
        let skip = skip
            .unwrap_or_else(|| panic!("{label}: retained start {first_retained} is not a batch boundary"));
        for (batch, (seqno, body)) in batches.iter().zip(&expected_at[skip..]) {
            assert_eq!(batch.first_seqno(), *seqno, "{label}");
            assert_eq!(&batch.payload()[8..], &body[..], "{label}: batch at {seqno}");
        }
        assert!(batches.len() <= expected_at.len() - skip, "{label}: more batches than submitted");
    }
    {
        tracing::info!("every acknowledged batch that was not purged is there, byte-identical");
        for (appended, body) in acked {
            if appended.first < first_retained {
                continue;
            }
            let batch = batches
                .iter()
                .find(|batch| batch.first_seqno() == appended.first)
                .unwrap_or_else(|| panic!("{label}: acknowledged batch {} lost", appended.first));
            assert_eq!((batch.last_seqno(), batch.term()), (appended.last, appended.term), "{label}");
            assert_eq!(&batch.payload()[8..], &body[..], "{label}");
        }
    }
    let next = wal.append_blocking(request(RecordKind::Control, 1, b"after")).unwrap();
    assert_eq!(next.first, recovery.durable.next(), "{label}");
}

fn run_with_crash_at(op: u64, mode: CrashMode) -> bool {
    let io = SimIo::new();
    io.crash_at_op(op, mode);
    let clock = Arc::new(ManualClock::new(1_000));
    let acked = match try_open(&io, small_config(SEGMENT_BYTES_MAX), &clock) {
        Ok((wal, _, _)) => {
            let acked = workload(&wal);
            wal.shutdown();
            acked
        }
        Err(_) => Vec::new(),
    };
    if io.crash_pending() {
        return false;
    }
    io.restart();
    check_recovered(&io, &acked, &format!("crash at op {op} ({mode:?})"));
    true
}

#[test]
fn crash_at_every_operation_recovers_a_prefix_with_every_acknowledged_batch() {
    // The dry run: how many file operations the workload performs, and how many of them come
    // before the burst (those are the same in every run).
    let (blocking_ops, total_ops) = {
        let io = SimIo::new();
        let clock = Arc::new(ManualClock::new(1_000));
        let (wal, _, _) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
        let mut acked = Vec::new();
        assert!(blocking_phase(&wal, &mut acked));
        let blocking_ops = io.op_count();
        burst_phase(&wal, &mut acked);
        assert_eq!(acked.len(), BLOCKING_APPENDS + BURST);
        assert!(wal.list_segments().unwrap().len() > 3, "the workload must rotate");
        assert!(wal.purged().seqno > Seqno(0), "the workload must purge");
        wal.shutdown();
        (blocking_ops, io.op_count())
    };
    assert!(total_ops > blocking_ops, "the burst performs file operations");
    let modes = [
        CrashMode::LoseUnsynced,
        CrashMode::TornUnsynced { keep: 1 },
        CrashMode::TornUnsynced { keep: 40 },
        CrashMode::TornUnsynced { keep: 64 },
        CrashMode::TornUnsynced { keep: 65 },
        CrashMode::TornUnsynced { keep: 150 },
        CrashMode::TornUnsynced { keep: 100_000 },
    ];
    for mode in modes {
        // Burst drains vary run to run, so go a little past the dry run's count.
        let crashed: Vec<u64> = (1..=total_ops + 10).filter(|op| run_with_crash_at(*op, mode)).collect();
        // Every operation before the burst is reached in every run; how the burst groups into
        // drains (a write and a sync each, and rotations of 400-byte segments) depends on thread
        // timing, so of its operations at least the first drain's are.
        let missed: Vec<u64> = (1..=blocking_ops).filter(|op| !crashed.contains(op)).collect();
        assert!(missed.is_empty(), "{mode:?}: no crash at operations {missed:?} before the burst");
        assert!(
            crashed.len() as u64 >= blocking_ops + 2,
            "{mode:?}: {} crashes, none inside the burst (dry run: {blocking_ops} ops before it, {total_ops} in all)",
            crashed.len()
        );
    }
}

#[test]
fn crash_after_clean_shutdown_loses_nothing() {
    let io = SimIo::new();
    let clock = Arc::new(ManualClock::new(1_000));
    let (wal, _, _) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
    let acked = workload(&wal);
    wal.shutdown();
    io.crash(CrashMode::LoseUnsynced);
    check_recovered(&io, &acked, "clean shutdown");
}
