//! The batch index's marks: a read that starts inside a segment begins at the last mark before its
//! seqno, not at the segment's start, after writes, after a recovery and after a quarantine.
//!
//! Each test garbles the first batch of the segment once the log is written: a reader that walked
//! the segment from its start would report corruption there, so a clean read proves it started at
//! a mark (and a read from the start proves the garbling is real).

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::*;
use tidal_types::{RecordKind, Seqno};
use tidal_wal::{Error, ManualClock, SimIo, Wal, WalConfig};

/// One segment for everything written here (600 batches of about 80 bytes), a mark every 4 KiB.
fn config() -> WalConfig {
    small_config(1 << 20)
}

fn write(wal: &Wal, batches: u32, tag: &str) {
    for index in 0..batches {
        wal.append_blocking(request(RecordKind::Signal, 1, format!("{tag} {index:04}").as_bytes())).unwrap();
    }
}

/// Flips a bit in the header (the term field) of the first segment's first batch.
fn garble_first_batch(io: &SimIo) {
    let first = segment_paths(io).into_iter().min().unwrap();
    io.flip_bit(&first, 20 * 8).unwrap();
}

/// The batches from `from` through both readers, as bytes; the verifying reader's must be `expected`.
fn read_both(wal: &Wal, from: u64) -> Result<Vec<Vec<u8>>, Error> {
    let verified: Vec<Vec<u8>> = wal
        .read_from(Seqno(from))?
        .map(|batch| batch.map(|batch| batch.encoded().to_vec()))
        .collect::<Result<_, _>>()?;
    let mut raw = Vec::new();
    let mut reader = wal.read_raw_from(Seqno(from))?;
    while let Some(run) = reader.next_run(4096)? {
        raw.extend(run.bytes);
    }
    assert_eq!(raw, verified.concat(), "the raw reader returns the verifying reader's bytes from {from}");
    Ok(verified)
}

fn bodies(batches: &[Vec<u8>]) -> Vec<String> {
    batches.iter().map(|batch| String::from_utf8_lossy(&batch[batch.len() - 10..]).into_owned()).collect()
}

/// A WAL over `io` holding 600 batches ("first 0000" ...), reopened if `reopen` (its marks then
/// come from recovery's scan).
fn written(io: &SimIo, reopen: bool) -> Wal {
    let clock = Arc::new(ManualClock::new(5));
    let (wal, _, _) = open(io, config(), &clock);
    write(&wal, 600, "first");
    if !reopen {
        return wal;
    }
    wal.shutdown();
    drop(wal);
    open(io, config(), &clock).0
}

/// Reads from the middle of the segment, garbles its first batch, reads again.
fn read_past_garbled_start(io: &SimIo, wal: &Wal) {
    let expected = read_both(wal, 450).unwrap();
    garble_first_batch(io);
    assert_eq!(read_both(wal, 450).unwrap(), expected);
    assert!(matches!(read_both(wal, 1), Err(Error::Corrupt { .. })), "the garbling is real");
}

#[test]
fn a_read_inside_a_segment_starts_at_a_mark() {
    let io = SimIo::new();
    let wal = written(&io, false);
    read_past_garbled_start(&io, &wal);
}

#[test]
fn recovery_rebuilds_the_marks() {
    let io = SimIo::new();
    let wal = written(&io, true);
    read_past_garbled_start(&io, &wal);
}

#[test]
fn a_quarantine_drops_the_marks_past_its_cut() {
    let io = SimIo::new();
    // Reopened (the test hook does not follow a cut): the cut also removes the segment the reopen
    // started, and the log goes on inside the first one.
    let wal = written(&io, true);
    wal.quarantine_from(Seqno(301)).unwrap();
    // Longer bodies over the cut: a mark left from the first log would point into the middle of one.
    write(&wal, 300, "again, longer");
    garble_first_batch(&io);
    for from in [302, 450, 600] {
        let got = bodies(&read_both(&wal, from).unwrap());
        let expected: Vec<String> = (from - 301..300).map(|index| format!("onger {index:04}")).collect();
        assert_eq!(got, expected, "from {from}");
    }
}
