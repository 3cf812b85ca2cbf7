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

/// EMFILE ("too many open files"), as an `io::Error` carries it.
const EMFILE: i32 = 24;

fn is_emfile(err: &Error, op: &str) -> bool {
    matches!(err, Error::Io { op: got, source, .. } if *got == op && source.raw_os_error() == Some(EMFILE))
}

/// Issue 37, finding 11: with preallocation off a rotation creates the next segment. A creation
/// that fails for want of a file descriptor touched no byte of any batch: the requests that needed
/// the new segment fail with the error, the WAL is NOT poisoned, and once descriptors are free
/// again appends go on at the next seqno and recovery finds one contiguous log.
#[test]
fn an_emfile_when_creating_a_segment_fails_the_writes_without_poisoning() {
    let io = SimIo::new();
    let mut config = small_config(200);
    config.preallocate_bytes = 0;
    let (wal, _, recorded) = open(&io, config.clone(), &clock());
    wal.append_blocking(request(RecordKind::Signal, 1, &[1; 200])).unwrap();
    io.fail_opens(true);
    for attempt in 0..3 {
        let err = wal.append_blocking(request(RecordKind::Signal, 1, b"needs a new segment")).unwrap_err();
        assert!(is_emfile(&err, "create segment"), "attempt {attempt}: {err}");
        assert!(!wal.is_poisoned(), "attempt {attempt}");
        assert_eq!(wal.durable_seqno(), Seqno(1));
    }
    io.fail_opens(false);
    for index in 0..6u8 {
        let appended = wal.append_blocking(request(RecordKind::Signal, 1, &[index; 150])).unwrap();
        assert_eq!(appended.first, Seqno(2 + u64::from(index)));
    }
    assert!(wal.stats().rotations >= 3);
    let acked = recorded.batches();
    assert_eq!(read_all(&wal, 1), acked);
    drop(wal);
    io.crash(CrashMode::LoseUnsynced);
    let (wal, recovery, _) = open(&io, config, &clock());
    assert_eq!(recovery.truncated, None);
    assert_eq!(read_all(&wal, 1), acked);
    assert_chain_from_one(&acked);
}

/// With preallocation on, a rotation renames the prepared `segment.ready` into place and fsyncs
/// the directory, which needs a descriptor for the directory. EMFILE there: the rename is undone
/// (no segment the log does not continue into stays behind), the writes fail, the WAL is not
/// poisoned, and once the fault clears the rotation takes the prepared segment after all.
#[test]
fn an_emfile_when_naming_the_prepared_segment_fails_the_writes_without_poisoning() {
    let io = SimIo::new();
    let config = small_config(200);
    let (wal, _, recorded) = open(&io, config.clone(), &clock());
    wal.append_blocking(request(RecordKind::Signal, 1, &[1; 200])).unwrap();
    assert!(wal.wait_segment_prepared(std::time::Duration::from_secs(30)));
    let ready = dir().join("segment.ready");
    io.fail_opens(true);
    let err = wal.append_blocking(request(RecordKind::Signal, 1, b"needs a new segment")).unwrap_err();
    assert!(is_emfile(&err, "fsync WAL directory"), "{err}");
    assert!(!wal.is_poisoned());
    assert!(io.file_bytes(&ready).is_ok(), "the prepared segment is put back");
    assert_eq!(segment_paths(&io).len(), 1, "no second segment is left behind");
    io.fail_opens(false);
    let appended = wal.append_blocking(request(RecordKind::Signal, 1, b"after")).unwrap();
    assert_eq!(appended.first, Seqno(2));
    let stats = wal.stats();
    assert_eq!((stats.rotations, stats.rotations_unprepared), (1, 0), "{stats:?}");
    let acked = recorded.batches();
    drop(wal);
    io.crash(CrashMode::LoseUnsynced);
    let (wal, _, _) = open(&io, config, &clock());
    assert_eq!(read_all(&wal, 1), acked);
    assert_chain_from_one(&acked);
}

/// A replicated request whose batches span a rotation that fails for want of a descriptor: the
/// batches written before the rotation are durable and announced like any other (the hook saw
/// them, readers and the frontier too), the request fails, the WAL goes on; a retry of the rest
/// continues the log.
#[test]
fn a_rotation_that_fails_inside_a_replicated_request_keeps_and_announces_what_it_wrote() {
    let io = SimIo::new();
    let mut config = small_config(300);
    config.preallocate_bytes = 0;
    let (wal, _, recorded) = open(&io, config.clone(), &clock());
    let batches: Vec<tidal_wal::Batch> = (1..=6u64)
        .map(|seqno| {
            let mut payload = (9_000 + seqno).to_le_bytes().to_vec();
            payload.extend([seqno as u8; 40]);
            tidal_wal::Batch::new(RecordKind::Signal, Term(1), Seqno(seqno), 1, &payload)
        })
        .collect();
    io.fail_opens(true);
    let err = wal.append_replicated_blocking(batches.clone()).unwrap_err();
    assert!(is_emfile(&err, "create segment"), "{err}");
    assert!(!wal.is_poisoned());
    let written = wal.durable_seqno().get() as usize;
    assert!((1..6).contains(&written), "the rotation came inside the request: {written}");
    assert_eq!(recorded.batches(), batches[..written], "what was written is announced");
    io.fail_opens(false);
    assert_eq!(read_all(&wal, 1), batches[..written]);
    wal.append_replicated_blocking(batches[written..].to_vec()).unwrap();
    assert_eq!(read_all(&wal, 1), batches);
    drop(wal);
    io.crash(CrashMode::LoseUnsynced);
    let (wal, _, _) = open(&io, config, &clock());
    assert_eq!(read_all(&wal, 1), batches);
}

/// Preparing the next segment is retried after a failure (it was given up until a restart): an
/// EMFILE while the writer prepares at start costs one unprepared rotation, and the segments
/// after it are prepared again.
#[test]
fn a_failed_preparation_of_the_next_segment_is_tried_again() {
    let io = SimIo::new();
    let config = small_config(200);
    let recovered = tidal_wal::Wal::recover(config.clone(), Arc::new(io.clone())).unwrap();
    io.fail_opens(true);
    let (wal, _) = recovered.start(clock(), Box::new(tidal_wal::NoopHook)).unwrap();
    wal.append_blocking(request(RecordKind::Signal, 1, &[1; 200])).unwrap();
    assert_eq!(wal.stats().segments_prepared, 0);
    io.fail_opens(false);
    for index in 0..4u8 {
        wal.append_blocking(request(RecordKind::Signal, 1, &[index; 200])).unwrap();
        assert!(wal.wait_segment_prepared(std::time::Duration::from_secs(30)));
    }
    let stats = wal.stats();
    assert_eq!(stats.rotations, 4, "{stats:?}");
    assert_eq!(stats.rotations_unprepared, 1, "only the first rotation found nothing prepared: {stats:?}");
    assert!(stats.segments_prepared >= 4, "{stats:?}");
    assert!(!wal.is_poisoned());
}

/// What stays fatal: a rotation whose directory fsync itself fails (not a descriptor shortage:
/// the directory was opened) poisons, like any failed fsync.
#[test]
fn a_failed_directory_fsync_at_rotation_still_poisons() {
    for preallocate in [true, false] {
        let io = SimIo::new();
        let mut config = small_config(200);
        if !preallocate {
            config.preallocate_bytes = 0;
        }
        let (wal, _, _) = open(&io, config, &clock());
        wal.append_blocking(request(RecordKind::Signal, 1, &[1; 200])).unwrap();
        assert!(wal.wait_segment_prepared(std::time::Duration::from_secs(30)));
        io.fail_next_dir_sync();
        let err = wal.append_blocking(request(RecordKind::Signal, 1, b"x")).unwrap_err();
        assert!(matches!(&err, Error::Fatal { op: "fsync WAL directory", .. }), "{preallocate}: {err}");
        assert!(wal.is_poisoned(), "{preallocate}");
    }
}

/// A new term's first batch is written, fsynced and then recorded in `wal.meta`. With no file
/// descriptor left for that file the batch is still durable and acknowledged, the WAL is not
/// poisoned, and the term history is right in memory and after a restart (recovery rebuilds the
/// retained range's history from the segments). A purge in the same state fails alone.
#[test]
fn a_new_term_or_a_purge_without_a_file_descriptor_does_not_poison() {
    let (io, batches) = written(20);
    // Larger segments from now on: the last one has room, so the appends below rotate nothing.
    let config = small_config(4096);
    let (wal, _, _) = open(&io, config.clone(), &clock());
    let entry = |term, seqno| tidal_types::TermSeqno { term: Term(term), seqno: Seqno(seqno) };
    io.fail_opens(true);
    let err = wal.purge_below(Seqno(15)).unwrap_err();
    assert!(
        matches!(&err, Error::Fatal { op: "create meta file", source, .. } if source.raw_os_error() == Some(EMFILE)),
        "{err}"
    );
    assert!(!wal.is_poisoned());
    assert_eq!(wal.purged().seqno, Seqno(0), "the purge changed nothing");
    wal.set_term(Term(2));
    // No rotation: only the term's record in wal.meta needs a new file.
    let appended = wal.append_blocking(request(RecordKind::Signal, 1, b"t2")).unwrap();
    assert_eq!((appended.first, appended.term), (Seqno(21), Term(2)));
    assert!(!wal.is_poisoned());
    assert_eq!(wal.term_history(), vec![entry(1, 1), entry(2, 21)]);
    io.fail_opens(false);
    assert_eq!(read_all(&wal, 1)[..20], batches[..]);
    assert!(wal.purge_below(Seqno(15)).unwrap().segments_removed > 0);
    drop(wal);
    io.crash(CrashMode::LoseUnsynced);
    let (wal, recovery, _) = open(&io, config, &clock());
    assert_eq!(recovery.durable, Seqno(21));
    assert_eq!(wal.term_history(), vec![entry(1, 1), entry(2, 21)]);
}

/// A disk that cannot read what it holds (EIO: a bad sector, a failing controller) fails the
/// readers (a pull a peer is served, a catch-up), not the log: appends go on, nothing is poisoned,
/// and once reads work again the readers see one contiguous log. A leader taking office relies on
/// it: its source's failing pull must not take the source down with it (issue 37, finding 7).
#[test]
fn an_unreadable_disk_fails_the_readers_and_not_the_log() {
    let io = SimIo::new();
    let (wal, _, recorded) = open(&io, small_config(200), &clock());
    wal.set_term(Term(1));
    for index in 0..4u8 {
        wal.append_blocking(request(RecordKind::Signal, 1, &[index; 40])).unwrap();
    }
    io.fail_reads(true);
    let failed = wal.read_from(Seqno(1)).and_then(|mut reader| reader.next().transpose());
    assert!(failed.is_err(), "a read of an unreadable disk must fail: {failed:?}");
    let prev = tidal_types::TermSeqno { term: Term(1), seqno: Seqno(1) };
    let raw = wal.read_raw_after(prev).and_then(|mut reader| reader.next_run(1 << 20).map(|_| ()));
    assert!(raw.is_err(), "a pull's reader of an unreadable disk must fail");
    let appended = wal.append_blocking(request(RecordKind::Signal, 1, b"while reads fail")).unwrap();
    assert_eq!(appended.first, Seqno(5));
    assert!(!wal.is_poisoned());
    io.fail_reads(false);
    let acked = recorded.batches();
    assert_eq!(read_all(&wal, 1), acked);
    assert_chain_from_one(&acked);
}
