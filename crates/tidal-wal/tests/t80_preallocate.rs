//! Preallocated segments (decisions/017): the active segment is written with zeros before use and
//! overwritten in place; the next one is prepared while the writer is idle and renamed in at
//! rotation; a sealed segment is cut to its batches; a clean shutdown leaves no zeros behind. A crash
//! inside the preallocated space (writes lost, or torn over the zeros) recovers exactly a prefix of
//! whole batches holding every acknowledged one, and the log goes on from there.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use tidal_types::{RecordKind, Seqno, Term};
use tidal_wal::segment::{end_mark, END_MARK_LEN};
use tidal_wal::{Batch, CrashMode, ManualClock, NoopHook, SimIo, StdIo, Wal, WalConfig};

const SEGMENT_BYTES_MAX: u64 = 1000;
/// Long enough for any idle writer to prepare a 1000-byte segment; only a hang reaches it.
const PREPARED_WAIT: Duration = Duration::from_secs(30);

fn prep_path() -> PathBuf {
    dir().join("segment.prep")
}

fn ready_path() -> PathBuf {
    dir().join("segment.ready")
}

fn segment_path(first: Seqno) -> PathBuf {
    dir().join(format!("{:020}.seg", first.get()))
}

fn batch(first: u64, index: usize) -> Batch {
    let mut payload = (1_000 + index as u64).to_le_bytes().to_vec();
    payload.extend(std::iter::repeat_n(b'a' + (index % 26) as u8, 150 + index % 7));
    Batch::new(RecordKind::Signal, Term(1), Seqno(first), 1, &payload)
}

/// `count` replicated batches continuing at `first`.
fn batches(first: u64, count: usize) -> Vec<Batch> {
    (0..count).map(|index| batch(first + index as u64, index)).collect()
}

fn encoded(batches: &[Batch]) -> Vec<u8> {
    batches.iter().flat_map(|batch| batch.encoded().to_vec()).collect()
}

#[test]
fn the_active_segment_is_preallocated_and_sealed_segments_hold_no_zeros() {
    let io = SimIo::new();
    let clock = Arc::new(ManualClock::new(1_000));
    let (wal, _, recorded) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
    let first = dir().join("00000000000000000001.seg");
    assert_eq!(io.file_bytes(&first).unwrap(), vec![0u8; SEGMENT_BYTES_MAX as usize], "zero-filled at open");
    assert_eq!(io.synced_bytes(&first).unwrap().len() as u64, SEGMENT_BYTES_MAX, "and fsynced");
    for index in 0..20u8 {
        assert!(wal.wait_segment_prepared(PREPARED_WAIT));
        assert_eq!(io.synced_bytes(&ready_path()).unwrap(), vec![0u8; SEGMENT_BYTES_MAX as usize]);
        assert!(io.is_entry_durable(&ready_path()), "named ready only once complete, durably");
        assert!(io.file_bytes(&prep_path()).is_err());
        wal.append_blocking(request(RecordKind::Signal, 1, &[index; 200])).unwrap();
    }
    assert!(wal.wait_segment_prepared(PREPARED_WAIT));
    let stats = wal.stats();
    assert!(stats.rotations >= 3, "{stats:?}");
    assert_eq!(stats.rotations_unprepared, 0, "every rotation found its segment prepared");
    assert_eq!(stats.segments_prepared, stats.rotations + 1);
    let segments = wal.list_segments().unwrap();
    let (active, sealed) = segments.split_last().unwrap();
    let mut on_disk = Vec::new();
    for segment in sealed {
        let bytes = io.synced_bytes(&segment.path).unwrap();
        assert_eq!(bytes.len() as u64, segment.bytes, "{} is cut to its batches", segment.path.display());
        on_disk.extend(bytes);
    }
    let active_bytes = io.file_bytes(&active.path).unwrap();
    // A segment rotates once it reaches its size, so its last batch (and the end mark after it)
    // may run past the zeros.
    let end = active.bytes as usize + END_MARK_LEN;
    assert_eq!(
        active_bytes.len() as u64,
        SEGMENT_BYTES_MAX.max(end as u64),
        "the active segment keeps its zeros"
    );
    let next = recorded.batches().last().unwrap().last_seqno().next();
    assert_eq!(active_bytes[active.bytes as usize..end], end_mark(active.bytes, next), "decisions/058");
    assert!(active_bytes[end..].iter().all(|byte| *byte == 0));
    on_disk.extend(&active_bytes[..active.bytes as usize]);
    assert_eq!(on_disk, encoded(&recorded.batches()));
    assert_eq!(read_all(&wal, 1), recorded.batches());
    wal.shutdown();
    assert_eq!(io.file_bytes(&active.path).unwrap().len() as u64, active.bytes, "shutdown cuts the zeros");
    assert_eq!(
        io.synced_bytes(&ready_path()).unwrap(),
        vec![0u8; SEGMENT_BYTES_MAX as usize],
        "shutdown keeps it"
    );
    let (wal, recovery, _) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
    assert_eq!(recovery.truncated, None);
    assert_eq!(read_all(&wal, 1), recorded.batches());
}

#[test]
fn a_rotation_without_a_prepared_segment_appends_and_a_batch_may_outgrow_the_zeros() {
    let io = SimIo::new();
    let clock = Arc::new(ManualClock::new(1_000));
    let (wal, _, recorded) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
    assert!(wal.wait_segment_prepared(PREPARED_WAIT));
    // One request, one drain: its first rotation takes the prepared segment, the next ones find
    // none ready and fall back to an empty file.
    wal.append_replicated_blocking(batches(1, 20)).unwrap();
    let stats = wal.stats();
    assert!(stats.rotations >= 3, "{stats:?}");
    assert_eq!(stats.rotations_unprepared, stats.rotations - 1, "{stats:?}");
    // A batch larger than the segment: written past the zeros, the file grows.
    let big = {
        let mut payload = 7u64.to_le_bytes().to_vec();
        payload.resize(3 * SEGMENT_BYTES_MAX as usize, b'z');
        Batch::new(RecordKind::Control, Term(1), Seqno(21), 1, &payload)
    };
    assert!(wal.wait_segment_prepared(PREPARED_WAIT));
    wal.append_replicated_blocking(vec![big]).unwrap();
    let segments = wal.list_segments().unwrap();
    for segment in &segments[..segments.len() - 1] {
        assert_eq!(io.file_bytes(&segment.path).unwrap().len() as u64, segment.bytes, "{segment:?}");
    }
    let expected = recorded.batches();
    assert_eq!(read_all(&wal, 1), expected);
    drop(wal);
    let (wal, recovery, _) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
    assert_eq!(recovery.truncated, None);
    assert_eq!(read_all(&wal, 1), expected);
}

/// Acknowledged batches, then one drain of `drain` batches whose single write crashes with `mode`.
/// Returns the reopened WAL and its batches.
fn crash_in_preallocated_space(
    mode: CrashMode,
    drain: &[Batch],
) -> (SimIo, Wal, Vec<Batch>, tidal_wal::Recovery) {
    let io = SimIo::new();
    let clock = Arc::new(ManualClock::new(1_000));
    let (wal, _, _) = open(&io, small_config(4096), &clock);
    wal.append_replicated_blocking(batches(1, 3)).unwrap();
    assert!(wal.wait_segment_prepared(PREPARED_WAIT));
    // The writer is quiet: the next file operation is the drain's write.
    io.crash_at_op(1, mode);
    assert!(wal.append_replicated_blocking(drain.to_vec()).is_err());
    assert!(!io.crash_pending());
    drop(wal);
    io.restart();
    let (wal, recovery, _) = open(&io, small_config(4096), &clock);
    let got = read_all(&wal, 1);
    (io, wal, got, recovery)
}

#[test]
fn a_crash_inside_preallocated_space_recovers_a_prefix_of_whole_batches() {
    let acked = batches(1, 3);
    let drain: Vec<Batch> = (3..6).map(|index| batch(1 + index as u64, index)).collect();
    let drain_bytes = encoded(&drain);
    let boundaries: Vec<usize> = drain
        .iter()
        .scan(0, |end, batch| Some(std::mem::replace(end, *end + batch.encoded().len())))
        .collect();
    let mut modes = vec![CrashMode::LoseUnsynced];
    modes.extend((0..=drain_bytes.len() + 10).map(|keep| CrashMode::TornUnsynced { keep }));
    for mode in modes {
        let keep = match mode {
            CrashMode::LoseUnsynced => 0,
            CrashMode::TornUnsynced { keep } => keep.min(drain_bytes.len()),
        };
        let label = format!("{mode:?}");
        let (io, wal, got, recovery) = crash_in_preallocated_space(mode, &drain);
        let whole = drain.iter().scan(0, |end, batch| {
            *end += batch.encoded().len();
            Some(*end)
        });
        let whole = whole.filter(|end| *end <= keep).count();
        let mut expected = acked.clone();
        expected.extend_from_slice(&drain[..whole]);
        assert_eq!(got, expected, "{label}");
        let at_boundary = boundaries.contains(&keep) || keep == drain_bytes.len();
        assert_eq!(recovery.truncated.is_some(), !at_boundary, "{label}: {:?}", recovery.truncated);
        tracing::info!(
            "the recovered WAL goes on over what the crash left; a second crash finds no stale bytes"
        );
        let clock = Arc::new(ManualClock::new(2_000));
        let next = expected.last().unwrap().last_seqno().next();
        let after = wal.append_blocking(request(RecordKind::Control, 1, b"after")).unwrap();
        assert_eq!(after.first, next, "{label}");
        // A power loss with the WAL open: its zeros stay, no shutdown cuts anything.
        io.crash(CrashMode::LoseUnsynced);
        drop(wal);
        let (wal, recovery, _) = open(&io, small_config(4096), &clock);
        let again = read_all(&wal, 1);
        assert_eq!(again[..expected.len()], expected[..], "{label}");
        assert_eq!(again.len(), expected.len() + 1, "{label}");
        assert_eq!(recovery.truncated, None, "{label}");
    }
}

#[test]
fn leftovers_of_a_preparation_and_an_unused_segment_are_not_corruption() {
    let io = SimIo::new();
    let clock = Arc::new(ManualClock::new(1_000));
    let expected = {
        let (wal, _, _) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
        wal.append_replicated_blocking(batches(1, 4)).unwrap();
        wal.shutdown();
        read_all(&open(&io, small_config(SEGMENT_BYTES_MAX), &clock).0, 1)
    };
    // What a crash right after a rotation leaves: the renamed, still all-zero next segment; and a
    // half-prepared `segment.prep` (no `segment.ready`: the rotation took it).
    let next = expected.last().unwrap().last_seqno().next();
    let unused = dir().join(format!("{:020}.seg", next.get()));
    io.write_file(&unused, &vec![0u8; SEGMENT_BYTES_MAX as usize]);
    io.remove_file_for_test(&ready_path());
    io.write_file(&prep_path(), &[0u8; 100]);
    let (wal, recovery, _) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
    assert_eq!(recovery.truncated, None);
    assert_eq!(read_all(&wal, 1), expected);
    assert!(wal.wait_segment_prepared(PREPARED_WAIT));
    assert_eq!(io.file_bytes(&ready_path()).unwrap(), vec![0u8; SEGMENT_BYTES_MAX as usize]);
    let appended = wal.append_blocking(request(RecordKind::Control, 1, b"into the unused one")).unwrap();
    assert_eq!(appended.first, next);
    assert_eq!(wal.list_segments().unwrap().last().unwrap().path, unused);
}

#[test]
fn real_files_are_preallocated_rotated_and_cut() {
    let temp = tempfile::tempdir().unwrap();
    let mut config = WalConfig::new(temp.path());
    config.segment_bytes_max = 64 * 1024;
    let open = |config: &WalConfig| {
        Wal::open(config.clone(), Arc::new(StdIo), Arc::new(ManualClock::new(1)), Box::new(NoopHook))
            .unwrap()
            .0
    };
    let wal = open(&config);
    let mut written = Vec::new();
    for index in 0..300usize {
        let body = vec![(index % 251) as u8; 700 + index % 300];
        assert!(wal.wait_segment_prepared(PREPARED_WAIT));
        let appended = wal.append_blocking(request(RecordKind::Signal, 1, &body)).unwrap();
        written.push((appended.first, body));
    }
    let segments = wal.list_segments().unwrap();
    assert!(segments.len() >= 3);
    for segment in &segments[..segments.len() - 1] {
        assert_eq!(std::fs::metadata(&segment.path).unwrap().len(), segment.bytes);
    }
    let active = segments.last().unwrap();
    assert_eq!(std::fs::metadata(&active.path).unwrap().len(), config.segment_bytes_max.max(active.bytes));
    assert_eq!(wal.stats().rotations_unprepared, 0);
    let check = |wal: &Wal| {
        let read = read_all(wal, 1);
        assert_eq!(read.len(), written.len());
        for (batch, (first, body)) in read.iter().zip(&written) {
            assert_eq!((batch.first_seqno(), &batch.payload()[8..]), (*first, &body[..]));
        }
    };
    check(&wal);
    drop(wal);
    assert_eq!(std::fs::metadata(&active.path).unwrap().len(), active.bytes);
    assert!(!temp.path().join("segment.prep").exists());
    assert_eq!(std::fs::metadata(temp.path().join("segment.ready")).unwrap().len(), config.segment_bytes_max);
    config.preallocate_bytes = 0;
    let wal = open(&config);
    check(&wal);
    assert!(!temp.path().join("segment.ready").exists(), "not kept without preallocation");
    wal.append_blocking(request(RecordKind::Signal, 1, b"unpreallocated")).unwrap();
    let logical = wal.list_segments().unwrap().last().unwrap().bytes;
    assert_eq!(
        std::fs::metadata(&active.path).unwrap().len(),
        logical + END_MARK_LEN as u64,
        "appended: the write ends with the end mark (decisions/058)"
    );
    drop(wal);
    assert_eq!(std::fs::metadata(&active.path).unwrap().len(), logical, "a clean shutdown cuts the mark");
}

#[test]
fn a_clean_restart_takes_the_kept_segment_and_writes_no_zeros() {
    let io = SimIo::new();
    let clock = Arc::new(ManualClock::new(1_000));
    let (wal, _, _) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
    wal.append_replicated_blocking(batches(1, 2)).unwrap();
    assert!(wal.wait_segment_prepared(PREPARED_WAIT));
    let expected = read_all(&wal, 1);
    let next = expected.last().unwrap().last_seqno().next();
    drop(wal); // a clean shutdown
    assert!(io.file_bytes(&prep_path()).is_err());
    assert_eq!(io.synced_bytes(&ready_path()).unwrap(), vec![0u8; SEGMENT_BYTES_MAX as usize]);
    assert!(io.is_entry_durable(&ready_path()), "renamed, and the directory fsynced");

    let (wal, recovery, _) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
    // The last segment stays cut at its batches: the open wrote no zeros into it (the writer
    // thread, which prepares the next segment in idle steps, never touches a sealed segment).
    let last_len = io.file_bytes(&segment_path(Seqno(1))).unwrap().len();
    assert_eq!(last_len, encoded(&expected).len(), "no zeros written at open");
    assert_eq!(recovery.truncated, None);
    // Taken as the next segment, durably. (A new `segment.ready` may already be there: the idle
    // writer prepares the one after it at once.)
    assert!(io.is_entry_durable(&segment_path(next)), "as the next segment, durably");
    let segments = wal.list_segments().unwrap();
    let active = segments.last().unwrap();
    assert_eq!((&active.path, active.first_seqno, active.bytes), (&segment_path(next), next, 0));
    assert_eq!(io.file_bytes(&active.path).unwrap(), vec![0u8; SEGMENT_BYTES_MAX as usize]);
    assert_eq!(read_all(&wal, 1), expected);

    // Writes go into it; the next one is prepared in idle steps; a crash then loses nothing.
    let appended = wal.append_blocking(request(RecordKind::Control, 1, b"after a clean restart")).unwrap();
    assert_eq!(appended.first, next);
    assert!(wal.wait_segment_prepared(PREPARED_WAIT));
    assert_eq!(wal.stats().segments_prepared, 1);
    let all = read_all(&wal, 1);
    assert_eq!(all.len(), expected.len() + 1);
    crash(&io, wal);
    let (wal, recovery, _) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
    assert_eq!(recovery.truncated, None);
    assert_eq!(read_all(&wal, 1), all);
}

#[test]
fn a_kept_segment_replaces_an_empty_last_one_and_is_not_taken_after_zeros() {
    let io = SimIo::new();
    let clock = Arc::new(ManualClock::new(1_000));
    // A WAL that never took a batch: the kept segment replaces its empty first segment.
    drop(open(&io, small_config(SEGMENT_BYTES_MAX), &clock).0);
    let (wal, _, _) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
    let segments = wal.list_segments().unwrap();
    assert_eq!(segments.len(), 1, "{segments:?}");
    assert_eq!((&segments[0].path, segments[0].bytes), (&segment_path(Seqno(1)), 0));
    assert_eq!(io.file_bytes(&segments[0].path).unwrap(), vec![0u8; SEGMENT_BYTES_MAX as usize]);
    wal.append_replicated_blocking(batches(1, 2)).unwrap();
    assert!(wal.wait_segment_prepared(PREPARED_WAIT));
    let expected = read_all(&wal, 1);
    drop(wal);

    // The last segment does not end at its file's length (zeros after its batches, as a crash
    // leaves them): the ready segment is not taken now but stays the prepared next one.
    let last = segment_path(Seqno(1));
    let mut bytes = io.file_bytes(&last).unwrap();
    bytes.resize(SEGMENT_BYTES_MAX as usize, 0);
    io.write_file(&last, &bytes);
    let (wal, recovery, _) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
    assert_eq!(recovery.truncated, None);
    assert_eq!(wal.list_segments().unwrap().len(), 1);
    assert_eq!(io.file_bytes(&ready_path()).unwrap(), vec![0u8; SEGMENT_BYTES_MAX as usize]);
    assert_eq!(wal.stats().segments_prepared, 0, "it is the next segment, ready");
    assert_eq!(read_all(&wal, 1), expected);
    crash(&io, wal);

    // Longer than the preallocated size: removed, never a segment, and prepared anew.
    io.write_file(&ready_path(), &vec![0u8; SEGMENT_BYTES_MAX as usize + 1]);
    let (wal, recovery, _) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
    assert_eq!(recovery.truncated, None);
    assert_eq!(read_all(&wal, 1), expected);
    assert!(wal.wait_segment_prepared(PREPARED_WAIT));
    assert_eq!(wal.stats().segments_prepared, 1);
    assert_eq!(io.file_bytes(&ready_path()).unwrap(), vec![0u8; SEGMENT_BYTES_MAX as usize]);
    crash(&io, wal);

    // Beside a `segment.prep` (only one next segment is ever prepared): the complete one is kept.
    io.write_file(&prep_path(), &[0u8; 100]);
    let (wal, recovery, _) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
    assert_eq!(recovery.truncated, None);
    assert!(io.file_bytes(&prep_path()).is_err());
    assert_eq!(io.file_bytes(&ready_path()).unwrap(), vec![0u8; SEGMENT_BYTES_MAX as usize]);
    assert_eq!(read_all(&wal, 1), expected);
    crash(&io, wal);
}

#[test]
fn a_sealed_segment_followed_by_zeros_is_cut_and_garbage_after_them_is_corruption() {
    let io = SimIo::new();
    let clock = Arc::new(ManualClock::new(1_000));
    let (wal, _, recorded) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
    wal.append_replicated_blocking(batches(1, 20)).unwrap();
    let segments = wal.list_segments().unwrap();
    assert!(segments.len() >= 3);
    drop(wal);
    let sealed = &segments[1];
    // The seal's cut did not reach the disk: the zeros are still there.
    io.truncate_file(&sealed.path, sealed.bytes + 700).unwrap();
    {
        let damaged = SimIo::new();
        for path in io.paths() {
            damaged.write_file(&path, &io.file_bytes(&path).unwrap());
        }
        damaged.flip_bit(&sealed.path, (sealed.bytes + 650) * 8).unwrap();
        match try_open(&damaged, small_config(SEGMENT_BYTES_MAX), &clock) {
            Err(tidal_wal::Error::Corrupt { path, offset, .. }) => {
                assert_eq!((path, offset), (sealed.path.clone(), sealed.bytes));
            }
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("garbage after a sealed segment's zeros went unnoticed"),
        }
        assert_eq!(
            damaged.file_bytes(&sealed.path).unwrap().len() as u64,
            sealed.bytes + 700,
            "refused: untouched"
        );
    }
    let (wal, recovery, _) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
    assert_eq!(recovery.truncated, None);
    assert_eq!(read_all(&wal, 1), recorded.batches());
    assert_eq!(io.file_bytes(&sealed.path).unwrap().len() as u64, sealed.bytes, "cut at open");
}

#[test]
fn a_segment_sealed_before_its_zeros_are_used_is_cut_to_its_batches() {
    let io = SimIo::new();
    let clock = Arc::new(ManualClock::new(1_000));
    let (wal, _, _) = open(&io, small_config(4096), &clock);
    wal.append_replicated_blocking(batches(1, 2)).unwrap();
    // A power loss, no clean shutdown: the active segment keeps its 4096 bytes of zeros.
    io.crash(CrashMode::LoseUnsynced);
    drop(wal);
    // Reopened with smaller segments: it rotates long before its zeros are used up.
    let (wal, _, _) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
    let mut expected = batches(1, 2);
    let more: Vec<Batch> = (2..8).map(|index| batch(1 + index as u64, index)).collect();
    expected.extend(more.iter().cloned());
    wal.append_replicated_blocking(more).unwrap();
    let segments = wal.list_segments().unwrap();
    assert!(segments.len() >= 2, "{segments:?}");
    assert_eq!(io.synced_bytes(&segments[0].path).unwrap().len() as u64, segments[0].bytes, "sealed: cut");
    assert_eq!(read_all(&wal, 1), expected);
}

/// A restart after a crash goes on with the `segment.prep` it finds (zeros only) instead of writing
/// a whole segment of zeros again before it serves (decisions/022); a `segment.prep` holding
/// anything but zeros, or longer than a segment, is removed and prepared anew.
#[test]
fn a_prepared_segment_left_by_a_crash_is_kept_and_one_with_bytes_is_replaced() {
    let io = SimIo::new();
    let clock = Arc::new(ManualClock::new(1_000));
    {
        let (wal, _, _) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
        wal.append_replicated_blocking(batches(1, 2)).unwrap();
        assert!(wal.wait_segment_prepared(PREPARED_WAIT));
        crash(&io, wal); // no clean shutdown: segment.ready stays
    }
    let (wal, _, _) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
    assert!(wal.wait_segment_prepared(PREPARED_WAIT));
    assert_eq!(wal.stats().segments_prepared, 0, "the kept segment.ready: nothing written at open");
    assert_eq!(io.synced_bytes(&ready_path()).unwrap(), vec![0u8; SEGMENT_BYTES_MAX as usize]);
    // Up to the first rotation only: a second one may come before the next segment.prep is ready.
    for index in 0..8u8 {
        wal.append_blocking(request(RecordKind::Signal, 1, &[index + 1; 200])).unwrap();
        if wal.stats().rotations >= 1 {
            break;
        }
    }
    let stats = wal.stats();
    assert_eq!(stats.rotations, 1, "{stats:?}");
    assert_eq!(stats.rotations_unprepared, 0, "the first rotation took the kept segment: {stats:?}");
    let before = read_all(&wal, 1);
    crash(&io, wal);

    // Half prepared (a crash during the preparation after a rotation): finished in idle steps
    // from where it stopped, then named ready.
    io.remove_file_for_test(&ready_path());
    io.write_file(&prep_path(), &[0u8; 300]);
    let (wal, _, _) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
    assert!(wal.wait_segment_prepared(PREPARED_WAIT));
    assert_eq!(wal.stats().segments_prepared, 1);
    assert_eq!(io.synced_bytes(&ready_path()).unwrap(), vec![0u8; SEGMENT_BYTES_MAX as usize]);
    assert!(io.file_bytes(&prep_path()).is_err());
    assert_eq!(read_all(&wal, 1), before);
    crash(&io, wal);

    // Not zeros, or too long: removed and prepared again, and never read as a segment.
    for bad in [vec![7u8; 300], vec![0u8; SEGMENT_BYTES_MAX as usize + 1]] {
        io.remove_file_for_test(&ready_path());
        io.write_file(&prep_path(), &bad);
        let (wal, recovery, _) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
        assert_eq!(recovery.truncated, None);
        assert_eq!(read_all(&wal, 1), before);
        assert!(wal.wait_segment_prepared(PREPARED_WAIT));
        assert_eq!(io.synced_bytes(&ready_path()).unwrap(), vec![0u8; SEGMENT_BYTES_MAX as usize]);
        crash(&io, wal);
    }

    // Complete but not yet renamed (a crash between the last zeros' fsync and the rename): kept
    // after its check and named ready by the next step, with nothing written.
    io.remove_file_for_test(&ready_path());
    io.write_file(&prep_path(), &vec![0u8; SEGMENT_BYTES_MAX as usize]);
    let (wal, _, _) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
    assert!(wal.wait_segment_prepared(PREPARED_WAIT));
    assert_eq!(wal.stats().segments_prepared, 1);
    assert!(io.file_bytes(&prep_path()).is_err());
    assert_eq!(io.synced_bytes(&ready_path()).unwrap(), vec![0u8; SEGMENT_BYTES_MAX as usize]);
    assert_eq!(read_all(&wal, 1), before);
}

/// The process dies with the machine: its next file operation (the clean shutdown's first) fails,
/// and so does everything after it; then the machine is back.
fn crash(io: &SimIo, wal: Wal) {
    io.crash_at_op(1, CrashMode::LoseUnsynced);
    drop(wal);
    io.restart();
}

/// On real files the last segment's zeros are counted in 1 MiB steps, not read into memory
/// (`StdIo::read_zero_trimmed`). Recovery must find the same log whatever the split: a segment that
/// ends in megabytes of preallocated zeros, a last batch whose payload itself ends in more than a
/// step of zeros (the scan of the trimmed bytes is not clean: read again in full), and a torn batch
/// followed by zeros (cut, with the bytes dropped counted up to the end of the file).
#[test]
fn recovery_over_real_files_counts_the_zeros_of_the_last_segment_without_losing_a_batch() {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("wal");
    let mut config = WalConfig::new(&dir);
    config.segment_bytes_max = 64 << 20;
    config.preallocate_bytes = 0; // the test writes the zeros itself
    let open = |config: &WalConfig| {
        Wal::open(config.clone(), Arc::new(StdIo), Arc::new(tidal_wal::SystemClock), Box::new(NoopHook))
            .unwrap()
    };
    let mut zero_tail = vec![7u8; 16];
    zero_tail.resize(3 << 20, 0);
    let (wal, _) = open(&config);
    wal.append_blocking(request(RecordKind::Signal, 1, &[1; 300])).unwrap();
    wal.append_blocking(request(RecordKind::Signal, 1, &zero_tail)).unwrap();
    let before = read_all(&wal, 1);
    drop(wal);
    let segment = dir.join("00000000000000000001.seg");
    let logical = std::fs::metadata(&segment).unwrap().len();
    let pad = |len: u64| {
        let file = std::fs::OpenOptions::new().write(true).open(&segment).unwrap();
        file.set_len(len).unwrap();
    };

    // Preallocated zeros after a batch whose payload ends in 3 MiB of zeros.
    pad(logical + (5 << 20));
    let (wal, recovery) = open(&config);
    assert_eq!(recovery.truncated, None);
    assert_eq!(recovery.batches, 2);
    assert_eq!(read_all(&wal, 1), before);
    wal.append_blocking(request(RecordKind::Signal, 1, &[3; 300])).unwrap();
    let before = read_all(&wal, 1);
    drop(wal);

    // A small last batch, then zeros: the common case.
    let logical = std::fs::metadata(&segment).unwrap().len();
    pad(logical + (9 << 20) + 5);
    let (wal, recovery) = open(&config);
    assert_eq!(recovery.truncated, None);
    assert_eq!(read_all(&wal, 1), before);
    drop(wal);

    // The last batch's second half zeros in a file that ends where the batch does (a clean
    // shutdown cut it there): every byte of the batch was written, so this is damage, not a torn
    // write (decisions/058).
    let last_len = before.last().unwrap().encoded().len() as u64;
    let zero_second_half = || {
        let file = std::fs::OpenOptions::new().write(true).open(&segment).unwrap();
        std::os::unix::fs::FileExt::write_all_at(
            &file,
            &vec![0u8; (last_len / 2) as usize],
            logical - last_len / 2,
        )
        .unwrap();
    };
    let cut = std::fs::read(&segment).unwrap();
    assert_eq!(cut.len() as u64, logical);
    zero_second_half();
    match Wal::open(config.clone(), Arc::new(StdIo), Arc::new(tidal_wal::SystemClock), Box::new(NoopHook)) {
        Err(tidal_wal::Error::Corrupt { path, offset, .. }) => {
            assert_eq!((path, offset), (segment.clone(), logical - last_len));
        }
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("a batch written whole with its second half zeroed was cut as torn"),
    }

    // The last batch torn (its second half never written), then preallocated zeros: cut at its
    // start.
    std::fs::write(&segment, &cut).unwrap();
    pad(logical + (2 << 20) + 3);
    zero_second_half();
    let file_len = std::fs::metadata(&segment).unwrap().len();
    let (wal, recovery) = open(&config);
    let torn = recovery.truncated.expect("the torn batch is cut");
    assert_eq!(torn.offset, logical - last_len);
    assert_eq!(torn.bytes_dropped, file_len - torn.offset);
    assert_eq!(read_all(&wal, 1), before[..before.len() - 1].to_vec());
}

/// Batches whose payloads (a logged time, then the body) end in zero bytes: the item delete and
/// the embedding of issue 37, and one whose last 40 bytes are zeros.
fn zero_ending_drain(first: u64) -> Vec<Batch> {
    let mut bodies: Vec<(RecordKind, Vec<u8>)> =
        zero_ending_bodies().into_iter().map(|(_, kind, body)| (kind, body)).collect();
    let mut long_tail = b"a long run of zeros".to_vec();
    long_tail.resize(long_tail.len() + 40, 0);
    bodies.push((RecordKind::Signal, long_tail));
    bodies
        .into_iter()
        .enumerate()
        .map(|(index, (kind, body))| {
            let seqno = first + index as u64;
            let mut payload = (5_000 + seqno).to_le_bytes().to_vec();
            payload.extend(body);
            Batch::new(kind, Term(1), Seqno(seqno), 1, &payload)
        })
        .collect()
}

/// Acknowledged batches, then `drain` as one drain whose single write a power loss loses or tears
/// (`keep` of its bytes reach the disk); then the segment as the crash left it, and the reopened
/// WAL. With `zero_filled`, the torn write is instead given the file system's other face: the
/// file's length covers the whole write, but what did not reach the disk reads as zeros.
fn crash_during_a_drain(
    config: &WalConfig,
    mode: CrashMode,
    drain: &[Batch],
    zero_filled: bool,
) -> (SimIo, Vec<u8>, Wal, tidal_wal::Recovery) {
    let clock = Arc::new(ManualClock::new(1_000));
    let segment = segment_path(Seqno(1));
    let start = || {
        let io = SimIo::new();
        let (wal, _, _) = open(&io, config.clone(), &clock);
        wal.append_replicated_blocking(batches(1, 3)).unwrap();
        assert!(wal.wait_segment_prepared(PREPARED_WAIT));
        (io, wal)
    };
    // How far the drain's write reaches in the file when nothing goes wrong.
    let reached = {
        let (io, wal) = start();
        wal.append_replicated_blocking(drain.to_vec()).unwrap();
        io.file_bytes(&segment).unwrap().len()
    };
    let (io, wal) = start();
    io.crash_at_op(1, mode);
    assert!(wal.append_replicated_blocking(drain.to_vec()).is_err());
    assert!(!io.crash_pending());
    drop(wal);
    io.restart();
    if zero_filled {
        // What the torn write left, then zeros up to where the whole write would have reached.
        let CrashMode::TornUnsynced { keep } = mode else { unreachable!() };
        let logical = encoded(&batches(1, 3)).len();
        let mut bytes = io.file_bytes(&segment).unwrap();
        bytes.resize(bytes.len().max(reached), 0);
        let from = (logical + keep).min(bytes.len());
        bytes[from..].iter_mut().for_each(|byte| *byte = 0);
        io.write_file(&segment, &bytes);
    }
    let on_disk = io.file_bytes(&segment).unwrap();
    let (wal, recovery, _) = open(&io, config.clone(), &clock);
    (io, on_disk, wal, recovery)
}

/// Issue 37, finding 10, the other side: real torn writes of batches that end in zeros are still
/// torn tails, cut and repaired, wherever the write stops (every byte of it, and past it), over
/// preallocated zeros, appended, and zero-filled by the file system. A batch survives exactly
/// when all of its bytes are on disk (the zeros it ends in may be the disk's own); a torn tail is
/// reported exactly when part of a batch is; and the log goes on over what the crash left.
#[test]
fn a_torn_write_of_batches_that_end_in_zeros_is_cut_wherever_it_stops() {
    let acked = batches(1, 3);
    let logical = encoded(&acked).len();
    let drain = zero_ending_drain(4);
    let drain_bytes = encoded(&drain);
    let preallocated = small_config(4096);
    let mut appended = small_config(4096);
    appended.preallocate_bytes = 0;
    let mut cases = Vec::new();
    for (layout, config) in [("preallocated", &preallocated), ("appended", &appended)] {
        cases.push((layout, config, CrashMode::LoseUnsynced, false));
        for keep in 0..=drain_bytes.len() + 40 {
            cases.push((layout, config, CrashMode::TornUnsynced { keep }, false));
            cases.push((layout, config, CrashMode::TornUnsynced { keep }, true));
        }
    }
    for (layout, config, mode, zero_filled) in cases {
        let label = format!("{layout} {mode:?} zero-filled {zero_filled}");
        let keep = match mode {
            CrashMode::LoseUnsynced => 0,
            CrashMode::TornUnsynced { keep } => keep,
        };
        let (io, on_disk, wal, recovery) = crash_during_a_drain(config, mode, &drain, zero_filled);
        let mut end = logical;
        let mut whole = 0;
        for batch in &drain {
            let bytes = batch.encoded();
            if on_disk.get(end..end + bytes.len()) != Some(bytes) {
                break;
            }
            end += bytes.len();
            whole += 1;
        }
        let mut expected = acked.clone();
        expected.extend_from_slice(&drain[..whole]);
        assert_eq!(read_all(&wal, 1), expected, "{label}");
        let part_of_a_batch = whole < drain.len() && logical + keep > end;
        assert_eq!(
            recovery.truncated.map(|torn| torn.offset),
            part_of_a_batch.then_some(end as u64),
            "{label}"
        );
        let after = wal.append_blocking(request(RecordKind::Control, 1, b"after")).unwrap();
        assert_eq!(after.first, Seqno(4 + whole as u64), "{label}");
        // A power loss with the WAL open, once more: nothing stale comes back.
        io.crash(CrashMode::LoseUnsynced);
        drop(wal);
        let (wal, recovery, _) = open(&io, config.clone(), &Arc::new(ManualClock::new(2_000)));
        let again = read_all(&wal, 1);
        assert_eq!(again[..expected.len()], expected[..], "{label}");
        assert_eq!(again.len(), expected.len() + 1, "{label}");
        assert_eq!(recovery.truncated, None, "{label}");
    }
}
