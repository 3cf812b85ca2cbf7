//! `Wal::read_recovered_from`, the startup-replay reader: it skips the seals that recovery checked
//! when this WAL was opened, and no others. Each test flips a payload bit AFTER the open, so only a
//! reader that checks the seal can see it: the flip shows exactly which batches a reader trusts.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::*;
use tidal_types::{RecordKind, Seqno};
use tidal_wal::{Error, ManualClock, SimIo, Wal, HEADER_LEN};

const SEGMENT_BYTES_MAX: u64 = 400;

/// Writes 12 batches of 2 events (seqnos 1..=24, several segments), closes the WAL and opens it
/// again, so recovery has verified all of them.
fn reopened_with_history(io: &SimIo, clock: &Arc<ManualClock>) -> Wal {
    let (wal, _, _) = open(io, small_config(SEGMENT_BYTES_MAX), clock);
    for index in 0..12u8 {
        wal.append_blocking(request(RecordKind::Signal, 2, &[index; 40])).unwrap();
    }
    wal.shutdown();
    let (wal, recovery, _) = open(io, small_config(SEGMENT_BYTES_MAX), clock);
    assert_eq!(recovery.durable, Seqno(24));
    assert!(wal.list_segments().unwrap().len() >= 3, "the history must span segments");
    wal
}

/// The segment holding `seqno` and the offset of the batch that starts there.
fn locate(io: &SimIo, wal: &Wal, seqno: u64) -> (PathBuf, u64) {
    let segment = wal
        .list_segments()
        .unwrap()
        .into_iter()
        .find(|segment| {
            segment.first_seqno.get() <= seqno && segment.last_seqno.is_some_and(|last| last.get() >= seqno)
        })
        .unwrap();
    let bytes = io.file_bytes(&segment.path).unwrap();
    let mut offset = 0usize;
    let mut first = segment.first_seqno.get();
    while first < seqno {
        let batch = tidal_wal::decode_batch(&bytes[offset..]).unwrap();
        offset += batch.encoded.len();
        first = batch.header.last_seqno().get() + 1;
    }
    assert_eq!(first, seqno, "seqno {seqno} must start a batch");
    (segment.path, offset as u64)
}

/// Flips the first payload bit of the batch that starts at `seqno`; returns its file and offset.
fn flip_payload(io: &SimIo, wal: &Wal, seqno: u64) -> (PathBuf, u64) {
    let (path, offset) = locate(io, wal, seqno);
    io.flip_bit(&path, (offset + HEADER_LEN as u64) * 8).unwrap();
    (path, offset)
}

fn read(reader: Result<tidal_wal::WalReader, Error>) -> Result<Vec<u64>, Error> {
    reader?.map(|batch| batch.map(|batch| batch.first_seqno().get())).collect()
}

/// The read failed as corrupt at the damaged batch's file and offset, for a reason that says `why`.
fn assert_corrupt_because(result: Result<Vec<u64>, Error>, path: &PathBuf, offset: u64, why: &str) {
    match result {
        Err(Error::Corrupt { path: at, offset: found, reason }) => {
            assert_eq!((&at, found), (path, offset), "corruption reported at the damaged batch");
            assert!(reason.contains(why), "reason {reason:?} should say {why:?}");
        }
        other => panic!("expected corruption ({why}) at {}:{offset}, got {other:?}", path.display()),
    }
}

/// A failed seal check at the flipped batch.
fn assert_corrupt_at(result: Result<Vec<u64>, Error>, path: &PathBuf, offset: u64) {
    assert_corrupt_because(result, path, offset, "checksum");
}

#[test]
fn batches_recovery_verified_are_not_hashed_again_and_later_ones_are() {
    let io = SimIo::new();
    let clock = Arc::new(ManualClock::new(1_000));
    let wal = reopened_with_history(&io, &clock);
    for index in 0..4u8 {
        wal.append_blocking(request(RecordKind::Signal, 2, &[100 + index; 40])).unwrap();
    }
    let all: Vec<u64> = (0..16).map(|index| 1 + 2 * index).collect();

    tracing::info!("phase: a flip in a batch recovery verified");
    let (path, offset) = flip_payload(&io, &wal, 5);
    assert_corrupt_at(read(wal.read_from(Seqno(1))), &path, offset);
    assert_eq!(read(wal.read_recovered_from(Seqno(1))).unwrap(), all, "its seal was checked at open");

    tracing::info!("phase: a flip in a batch written after the open is caught by both readers");
    let (path, offset) = flip_payload(&io, &wal, 27);
    assert_corrupt_at(read(wal.read_from(Seqno(25))), &path, offset);
    assert_corrupt_at(read(wal.read_recovered_from(Seqno(1))), &path, offset);
    assert_corrupt_at(read(wal.read_recovered_from(Seqno(25))), &path, offset);
}

#[test]
fn the_last_recovered_batch_is_trusted_and_the_first_later_one_is_not() {
    let io = SimIo::new();
    let clock = Arc::new(ManualClock::new(1_000));
    let wal = reopened_with_history(&io, &clock);
    wal.append_blocking(request(RecordKind::Signal, 2, &[7; 40])).unwrap();
    flip_payload(&io, &wal, 23);
    assert_eq!(read(wal.read_recovered_from(Seqno(23))).unwrap(), vec![23, 25]);
    let (path, offset) = flip_payload(&io, &wal, 25);
    assert_corrupt_at(read(wal.read_recovered_from(Seqno(23))), &path, offset);
}

#[test]
fn after_a_quarantine_every_seal_is_checked_again() {
    let io = SimIo::new();
    let clock = Arc::new(ManualClock::new(1_000));
    let wal = reopened_with_history(&io, &clock);
    wal.quarantine_from(Seqno(21)).unwrap();
    assert_eq!(wal.durable_seqno(), Seqno(20));
    let (path, offset) = flip_payload(&io, &wal, 3);
    assert_corrupt_at(read(wal.read_recovered_from(Seqno(1))), &path, offset);
}

#[test]
fn headers_and_the_seqno_chain_are_still_checked_where_seals_are_trusted() {
    let io = SimIo::new();
    let clock = Arc::new(ManualClock::new(1_000));
    let wal = reopened_with_history(&io, &clock);
    let (path, offset) = locate(&io, &wal, 9);
    // Byte 16 is the low byte of first_seqno: 9 becomes 8, which breaks the chain.
    io.flip_bit(&path, (offset + 16) * 8).unwrap();
    assert_corrupt_because(read(wal.read_recovered_from(Seqno(1))), &path, offset, "expected 9");
    // The magic number.
    io.flip_bit(&path, (offset + 16) * 8).unwrap();
    io.flip_bit(&path, offset * 8).unwrap();
    assert_corrupt_because(read(wal.read_recovered_from(Seqno(1))), &path, offset, "bad magic");
}
