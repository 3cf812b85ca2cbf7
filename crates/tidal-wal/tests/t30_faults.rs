//! Faults: fsync and write failures poison; damaged files refuse to open, naming file and offset;
//! torn tails are cut; interrupted purges are finished on open.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::*;
use tidal_types::{RecordKind, Seqno, Term};
use tidal_wal::{CrashMode, Error, ManualClock, SimIo, SubmitError, HEADER_LEN};

fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(77))
}

/// A WAL with `batches` batches of 40-byte bodies in 200-byte segments, shut down cleanly.
fn written(batches: u8) -> (SimIo, Vec<tidal_wal::Batch>) {
    let io = SimIo::new();
    let (wal, _, recorded) = open(&io, small_config(200), &clock());
    wal.set_term(Term(1));
    for index in 0..batches {
        wal.append_blocking(request(RecordKind::Signal, 1, &[index; 40])).unwrap();
    }
    wal.shutdown();
    (io, recorded.batches())
}

#[test]
fn a_failed_fsync_poisons_and_only_synced_data_comes_back() {
    let io = SimIo::new();
    let (wal, _, _) = open(&io, small_config(1 << 20), &clock());
    let (told, heard) = std::sync::mpsc::channel();
    wal.on_poison(move |reason| told.send(reason.to_string()).unwrap());
    wal.append_blocking(request(RecordKind::Signal, 2, b"kept")).unwrap();
    let before = read_all(&wal, 1);
    assert!(heard.try_recv().is_err() && wal.poison_reason().is_none());
    {
        tracing::info!("phase: the failing drain's completion gets the fsync error");
        io.fail_next_sync();
        let err = wal.append_blocking(request(RecordKind::Signal, 1, b"lost")).unwrap_err();
        assert!(matches!(&err, Error::Fatal { op: "fsync segment", .. }), "{err}");
        assert!(wal.is_poisoned());
        assert_eq!(wal.durable_seqno(), Seqno(2));
    }
    {
        tracing::info!("phase: the listener was told once, before the completion, with the reason");
        let reason = heard.try_recv().unwrap();
        assert!(reason.contains("fsync segment"), "{reason}");
        assert_eq!(wal.poison_reason(), Some(reason.clone()));
        let (late, told_late) = std::sync::mpsc::channel();
        wal.on_poison(move |reason| late.send(reason.to_string()).unwrap());
        assert_eq!(told_late.try_recv().unwrap(), reason, "a late listener is told at once");
    }
    {
        tracing::info!("phase: every later submit is refused; nothing is retried");
        let syncs = io.data_sync_count();
        assert!(matches!(
            wal.submit(request(RecordKind::Signal, 1, b"x"), Box::new(|_| ())),
            Err(SubmitError::Poisoned)
        ));
        assert!(matches!(wal.append_blocking(request(RecordKind::Signal, 1, b"x")), Err(Error::Poisoned)));
        assert!(matches!(wal.purge_below(Seqno(10)), Err(Error::Poisoned)));
        assert_eq!(io.data_sync_count(), syncs, "no fsync after the failure");
        assert_eq!(read_all(&wal, 1), before, "readers see only durable batches");
    }
    drop(wal);
    io.crash(CrashMode::LoseUnsynced);
    let (wal, recovery, _) = open(&io, small_config(1 << 20), &clock());
    assert_eq!(recovery.durable, Seqno(2));
    assert_eq!(read_all(&wal, 1), before);
    assert_eq!(wal.append_blocking(request(RecordKind::Signal, 1, b"again")).unwrap().first, Seqno(3));
}

#[test]
fn queued_requests_behind_a_failed_fsync_are_failed_too() {
    let io = SimIo::new();
    io.set_sync_delay(std::time::Duration::from_millis(10));
    let (wal, _, _) = open(&io, small_config(1 << 20), &clock());
    io.fail_syncs(true);
    let (sender, receiver) = std::sync::mpsc::channel();
    for index in 0..50u8 {
        let sender = sender.clone();
        match wal.submit(request(RecordKind::Signal, 1, &[index]), Box::new(move |r| sender.send(r).unwrap()))
        {
            Ok(()) | Err(SubmitError::Poisoned) => {}
            Err(other) => panic!("{other}"),
        }
    }
    drop(sender);
    let results: Vec<_> = receiver.iter().collect();
    assert!(!results.is_empty());
    assert!(results.iter().all(|result| matches!(result, Err(Error::Fatal { .. } | Error::Poisoned))));
    assert_eq!(wal.durable_seqno(), Seqno(0));
}

#[test]
fn a_failed_write_poisons() {
    let io = SimIo::new();
    let (wal, _, _) = open(&io, small_config(1 << 20), &clock());
    io.fail_next_write();
    let err = wal.append_blocking(request(RecordKind::Signal, 1, b"x")).unwrap_err();
    assert!(matches!(&err, Error::Fatal { op: "write segment", .. }), "{err}");
    assert!(wal.is_poisoned());
}

#[test]
fn a_failed_fsync_of_a_new_segment_directory_poisons() {
    let io = SimIo::new();
    let (wal, _, _) = open(&io, small_config(100), &clock());
    wal.append_blocking(request(RecordKind::Signal, 1, &[1; 100])).unwrap();
    // The next append rotates: data fsync of the old segment, then the directory fsync; fail both.
    io.fail_syncs(true);
    assert!(wal.append_blocking(request(RecordKind::Signal, 1, b"x")).is_err());
    assert!(wal.is_poisoned());
}

#[test]
fn a_failed_meta_fsync_during_purge_poisons() {
    let (io, _) = written(20);
    let (wal, _, _) = open(&io, small_config(200), &clock());
    io.fail_next_sync();
    let err = wal.purge_below(Seqno(15)).unwrap_err();
    assert!(matches!(err, Error::Fatal { .. }), "{err}");
    assert!(wal.is_poisoned());
    assert_eq!(wal.purged().seqno, Seqno(0), "a failed purge changes nothing");
}

fn expect_corrupt(io: &SimIo, path: &PathBuf, offset: u64) {
    match try_open(io, small_config(200), &clock()) {
        Err(Error::Corrupt { path: got, offset: got_offset, reason }) => {
            assert_eq!((&got, got_offset), (path, offset), "{reason}");
        }
        Err(other) => panic!("expected corruption at {}:{offset}, got {other}", path.display()),
        Ok(_) => panic!("expected corruption at {}:{offset}, but the WAL opened", path.display()),
    }
}

#[test]
fn damage_in_a_segment_before_the_last_is_corruption() {
    let (io, batches) = written(20);
    let segments = segment_paths(&io);
    assert!(segments.len() >= 4);
    let batch_len = batches[0].encoded().len() as u64;
    {
        tracing::info!("phase: a cut tail of a middle segment is not a torn write");
        let copy = io.clone();
        let len = copy.file_bytes(&segments[1]).unwrap().len() as u64;
        let damaged = SimIo::new();
        for path in copy.paths() {
            damaged.write_file(&path, &copy.file_bytes(&path).unwrap());
        }
        damaged.truncate_file(&segments[1], len - 1).unwrap();
        let last_batch_offset = (len / batch_len - 1) * batch_len;
        expect_corrupt(&damaged, &segments[1], last_batch_offset);
    }
    {
        tracing::info!("phase: a flipped payload bit of a middle segment");
        let damaged = SimIo::new();
        for path in io.paths() {
            damaged.write_file(&path, &io.file_bytes(&path).unwrap());
        }
        damaged.flip_bit(&segments[2], (batch_len + HEADER_LEN as u64 + 3) * 8).unwrap();
        expect_corrupt(&damaged, &segments[2], batch_len);
    }
    {
        tracing::info!("phase: a missing middle segment breaks the chain");
        let damaged = SimIo::new();
        for path in io.paths().into_iter().filter(|path| *path != segments[1]) {
            damaged.write_file(&path, &io.file_bytes(&path).unwrap());
        }
        expect_corrupt(&damaged, &segments[2], 0);
    }
    {
        tracing::info!("phase: a missing first segment without a purge point");
        let damaged = SimIo::new();
        for path in io.paths().into_iter().filter(|path| *path != segments[0]) {
            damaged.write_file(&path, &io.file_bytes(&path).unwrap());
        }
        expect_corrupt(&damaged, &segments[1], 0);
    }
}

#[test]
fn a_damaged_or_missing_meta_file_is_corruption() {
    let (io, _) = written(20);
    let meta = dir().join("wal.meta");
    {
        let damaged = SimIo::new();
        for path in io.paths() {
            damaged.write_file(&path, &io.file_bytes(&path).unwrap());
        }
        damaged.flip_bit(&meta, 100).unwrap();
        expect_corrupt(&damaged, &meta, 0);
    }
    {
        tracing::info!("phase: without wal.meta, segments from seqno 1 rebuild the history");
        let rebuilt = SimIo::new();
        for path in io.paths().into_iter().filter(|path| *path != meta) {
            rebuilt.write_file(&path, &io.file_bytes(&path).unwrap());
        }
        let (wal, recovery, _) = open(&rebuilt, small_config(200), &clock());
        assert_eq!(recovery.durable, Seqno(20));
        assert_eq!(wal.term_history(), vec![tidal_types::TermSeqno { term: Term(1), seqno: Seqno(1) }]);
    }
    {
        tracing::info!("phase: without wal.meta, segments after a purge cannot be trusted");
        let (wal, _, _) = open(&io, small_config(200), &clock());
        wal.purge_below(Seqno(10)).unwrap();
        drop(wal);
        io.remove_file_for_test(&meta);
        let first = segment_paths(&io).remove(0);
        expect_corrupt(&io, &meta, 0);
        assert!(io.file_bytes(&first).is_ok());
    }
}

#[test]
fn torn_and_zero_filled_tails_of_the_last_segment_are_cut() {
    let (io, batches) = written(5);
    let last = segment_paths(&io).pop().unwrap();
    let len = io.file_bytes(&last).unwrap().len() as u64;
    {
        tracing::info!(
            "phase: zeros after the last batch (a preallocated, unwritten tail): its end, nothing cut"
        );
        let mut bytes = io.file_bytes(&last).unwrap();
        bytes.extend([0u8; 300]);
        io.write_file(&last, &bytes);
        let (wal, recovery, _) = open(&io, small_config(200), &clock());
        assert_eq!(recovery.truncated, None);
        assert_eq!(read_all(&wal, 1), batches);
        assert_eq!(io.file_bytes(&last).unwrap().len() as u64, len + 300);
        drop(wal);
        assert_eq!(io.file_bytes(&last).unwrap().len() as u64, len, "a clean shutdown cuts the zeros");
    }
}

#[test]
fn an_interrupted_purge_is_finished_on_open() {
    let (io, batches) = written(20);
    let segments = segment_paths(&io);
    let saved: Vec<(PathBuf, Vec<u8>)> =
        segments[..2].iter().map(|path| (path.clone(), io.file_bytes(path).unwrap())).collect();
    let (wal, _, _) = open(&io, small_config(200), &clock());
    let report = wal.purge_below(batches[10].first_seqno()).unwrap();
    assert!(report.segments_removed >= 2);
    drop(wal);
    tracing::info!("phase: put two purged segments back, as if the deletes never reached the disk");
    for (path, bytes) in &saved {
        io.write_file(path, bytes);
    }
    let (wal, recovery, _) = open(&io, small_config(200), &clock());
    assert_eq!(recovery.durable, Seqno(20));
    for (path, _) in &saved {
        assert!(io.file_bytes(path).is_err(), "{} was not removed", path.display());
    }
    assert!(matches!(wal.read_from(Seqno(1)), Err(Error::Purged { .. })));
    assert_eq!(wal.list_segments().unwrap()[0].first_seqno, report.first_retained);
}

#[test]
fn strangers_in_the_directory_are_ignored() {
    let (io, batches) = written(5);
    io.write_file(&dir().join("notes.txt"), b"hello");
    io.write_file(&dir().join("12.seg"), b"not a segment name");
    io.write_file(&dir().join("wal.meta.tmp"), b"half a meta file");
    let (wal, _, _) = open(&io, small_config(200), &clock());
    assert_eq!(read_all(&wal, 1), batches);
    assert!(io.file_bytes(&dir().join("wal.meta.tmp")).is_err(), "leftover tmp is removed");
}
