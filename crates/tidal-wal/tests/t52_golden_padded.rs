//! The golden fixture as a preallocated WAL leaves it after a power loss (decisions/017): its last
//! segment followed by zeros up to a larger size. The sweeps of `t50_golden` over it: every single
//! bit flip is detected (a flip in a batch is corruption named by file and offset, or, in the last
//! batch only, a torn tail; a flip in the zeros is the remains of an unsynced write, cut at the
//! logical end, with every batch kept), and a write cut at every byte of the last segment, zeros
//! after it, recovers exactly a prefix of whole batches.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::*;
use tidal_wal::{decode_batch, Batch, Error, ManualClock, SimIo};

const GOLDEN_SEGMENT_BYTES_MAX: u64 = 512;
/// The padded last segment's size: past the segment size, as after a batch that outgrew it.
const PADDED_LEN: usize = 1024;

fn last_segment_name(files: &[(String, Vec<u8>)]) -> String {
    files.iter().filter(|(name, _)| name.ends_with(".seg")).map(|(name, _)| name.clone()).next_back().unwrap()
}

/// The fixture with its last segment padded with zeros to [`PADDED_LEN`]; and the last segment's
/// unpadded length.
fn padded_files() -> (Vec<(String, Vec<u8>)>, usize) {
    let mut files = fixture_files();
    let last = last_segment_name(&files);
    let entry = files.iter_mut().find(|(name, _)| *name == last).unwrap();
    let logical = entry.1.len();
    assert!(logical < PADDED_LEN);
    entry.1.resize(PADDED_LEN, 0);
    (files, logical)
}

fn fixture_io(files: &[(String, Vec<u8>)]) -> SimIo {
    let io = SimIo::new();
    for (name, bytes) in files {
        io.write_file(&dir().join(name), bytes);
    }
    io
}

/// Start and end offsets of the batches in the first `len` bytes of a segment.
fn batch_spans(bytes: &[u8], len: usize) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut at = 0;
    while at < len {
        let end = at + decode_batch(&bytes[at..len]).unwrap().encoded.len();
        spans.push((at, end));
        at = end;
    }
    spans
}

fn original_batches() -> Vec<Batch> {
    let io = fixture_io(&fixture_files());
    let (wal, _, _) = open(&io, small_config(GOLDEN_SEGMENT_BYTES_MAX), &Arc::new(ManualClock::new(0)));
    read_all(&wal, 1)
}

#[test]
fn the_padded_fixture_reads_as_the_fixture_with_nothing_cut() {
    let (files, _) = padded_files();
    let io = fixture_io(&files);
    let (wal, recovery, _) =
        open(&io, small_config(GOLDEN_SEGMENT_BYTES_MAX), &Arc::new(ManualClock::new(0)));
    assert_eq!(recovery.truncated, None);
    assert_eq!(read_all(&wal, 1), original_batches());
}

#[test]
fn every_single_bit_flip_in_the_padded_fixture_is_detected() {
    let (files, logical) = padded_files();
    let original = original_batches();
    let last_segment = last_segment_name(&files);
    let (mut flips, mut torn_batches, mut torn_zeros) = (0u64, 0u64, 0u64);
    for (name, bytes) in &files {
        let path = dir().join(name);
        let is_last = *name == last_segment;
        let data_len = if is_last { logical } else { bytes.len() };
        let spans =
            if name.ends_with(".seg") { batch_spans(bytes, data_len) } else { vec![(0, bytes.len())] };
        for bit in 0..bytes.len() as u64 * 8 {
            flips += 1;
            let byte = (bit / 8) as usize;
            let io = fixture_io(&files);
            io.flip_bit(&path, bit).unwrap();
            let label = format!("flip of bit {bit} (byte {byte}) of {name}");
            let opened =
                try_open(&io, small_config(GOLDEN_SEGMENT_BYTES_MAX), &Arc::new(ManualClock::new(0)));
            if byte >= data_len {
                tracing::info!("a flip in the zeros: garbage after the logical end, cut there");
                let (wal, recovery, _) = opened.unwrap_or_else(|err| panic!("{label}: {err}"));
                let torn = recovery.truncated.unwrap_or_else(|| panic!("{label} went unnoticed"));
                assert_eq!((torn.path, torn.offset), (path.clone(), logical as u64), "{label}");
                assert_eq!(read_all(&wal, 1), original, "{label}");
                torn_zeros += 1;
                continue;
            }
            let batch_start = spans.iter().rfind(|(start, _)| *start <= byte).unwrap().0 as u64;
            match opened {
                Err(Error::Corrupt { path: got, offset, .. }) => {
                    assert_eq!(got, path, "{label}");
                    assert_eq!(offset, batch_start, "{label}");
                }
                Err(other) => panic!("{label}: {other}"),
                Ok((wal, recovery, _)) => {
                    torn_batches += 1;
                    let torn = recovery.truncated.unwrap_or_else(|| panic!("{label} went unnoticed"));
                    let in_last_batch = is_last && batch_start == spans.last().unwrap().0 as u64;
                    assert!(in_last_batch, "{label}: only the last batch may look torn");
                    assert_eq!((torn.path, torn.offset), (path.clone(), batch_start), "{label}");
                    assert_eq!(read_all(&wal, 1), original[..original.len() - 1], "{label}");
                }
            }
        }
    }
    assert!(flips > 10_000, "{flips} flips");
    assert!(torn_batches < 100, "{torn_batches} flips in batches were read as torn tails");
    assert_eq!(torn_zeros, ((PADDED_LEN - logical) * 8) as u64);
}

#[test]
fn a_write_cut_anywhere_in_the_last_segment_over_zeros_recovers_a_prefix_of_whole_batches() {
    let files = fixture_files();
    let last = last_segment_name(&files);
    let last_bytes = files.iter().find(|(name, _)| *name == last).unwrap().1.clone();
    let last_path = dir().join(&last);
    let spans = batch_spans(&last_bytes, last_bytes.len());
    let original = original_batches();
    let before_last = original.len() - spans.len();
    for len in 0..=last_bytes.len() {
        let mut cut = last_bytes[..len].to_vec();
        cut.resize(PADDED_LEN, 0);
        let io = fixture_io(&files);
        io.write_file(&last_path, &cut);
        let (wal, recovery, _) =
            open(&io, small_config(GOLDEN_SEGMENT_BYTES_MAX), &Arc::new(ManualClock::new(0)));
        // A batch survives if the zeros happen to be its own bytes; the first that does not is torn.
        let whole =
            spans.iter().take_while(|(start, end)| cut[*start..*end] == last_bytes[*start..*end]).count();
        let boundary = if whole == 0 { 0 } else { spans[whole - 1].1 };
        assert_eq!(read_all(&wal, 1), original[..before_last + whole], "cut at {len}");
        let rest_is_zero = cut[boundary..].iter().all(|byte| *byte == 0);
        match recovery.truncated {
            None => assert!(rest_is_zero, "cut at {len}: a partial batch was not reported"),
            Some(torn) => {
                assert!(!rest_is_zero, "cut at {len}: zeros reported as a torn tail");
                assert_eq!(
                    (torn.path, torn.offset, torn.bytes_dropped),
                    (last_path.clone(), boundary as u64, (PADDED_LEN - boundary) as u64),
                    "cut at {len}"
                );
            }
        }
    }
}

/// Issue 37, finding 10, after a power loss (or a SIGKILL) with the WAL open: a last batch whose
/// payload ends in zero bytes (an item delete, an embedding ending in 0.0) with any one bit
/// flipped, the file's length unchanged, is corruption named by file and offset, never a torn
/// tail to cut: with the segment preallocated (zeros after the written end) and without.
#[test]
fn every_bit_flip_in_a_last_batch_that_ends_in_zeros_is_corruption_after_a_power_loss() {
    let preallocated = small_config(300);
    let mut appended = small_config(300);
    appended.preallocate_bytes = 0;
    let mut flips = 0;
    for (layout, config) in [("preallocated", &preallocated), ("appended", &appended)] {
        for (name, kind, body) in zero_ending_bodies() {
            let io = wal_ending_in(config, kind, &body, Left::PowerLoss);
            let (path, bytes, span) = last_batch(&io);
            assert!(span.start > 0 && bytes[span.end - 1] == 0, "{layout} {name}");
            if config.preallocate_len() > 0 {
                assert!(bytes.len() >= 300, "{layout} {name}: the zeros are still there");
            }
            let label = format!("{layout} {name}");
            flips += assert_every_flip_is_corruption(&snapshot(&io), &path, span, config, &label);
        }
    }
    assert!(flips > 2_000, "{flips} flips");
}
