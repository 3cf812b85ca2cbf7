//! The committed golden fixture (`tests/fixtures/golden/`): a deterministic WAL of several segments
//! and batches of every kind. It must stay readable and equal to what the generator writes (the
//! on-disk format is binding), every single-bit flip in it must be detected, and every truncation of
//! its last segment must recover exactly a prefix of whole batches.
//!
//! Regenerate (only for a deliberate format change, with a decision record):
//! `TIDAL_WAL_REGENERATE_GOLDEN=1 cargo test -p tidal-wal --test t50_golden`

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::*;
use tidal_types::{RecordKind, Seqno, Term, TermSeqno};
use tidal_wal::{decode_batch, Batch, Error, ManualClock, NoopHook, SimIo, StdIo, Wal, WalConfig};

const REGENERATE_ENV: &str = "TIDAL_WAL_REGENERATE_GOLDEN";
const GOLDEN_SEGMENT_BYTES_MAX: u64 = 512;
const GOLDEN_START_MS: u64 = 1_732_900_000_000;

/// (term, kind, event count, body) of each golden batch, in seqno order.
fn golden_spec() -> Vec<(Term, RecordKind, u32, Vec<u8>)> {
    let mut spec = Vec::new();
    // The kinds the fixture was cut with (0..=8); kind 9 (decisions/061) came later and is framed
    // the same way: the fixture stays as committed.
    for (index, kind) in RecordKind::ALL[..9].iter().enumerate() {
        let term = Term(1 + index as u64 / 4);
        let events = if *kind == RecordKind::Signal || *kind == RecordKind::StreamEvents { 5 } else { 1 };
        let body: Vec<u8> = (0..(20 + index * 23)).map(|at| (at * 7 + index) as u8).collect();
        spec.push((term, *kind, events, body));
    }
    for extra in 0..3u8 {
        spec.push((Term(5), RecordKind::Signal, 3, vec![b'x' + extra; 90]));
    }
    spec
}

/// Writes the golden WAL into a fresh SimIo at [`dir`].
fn generate() -> SimIo {
    let io = SimIo::new();
    let clock = Arc::new(ManualClock::new(GOLDEN_START_MS));
    let (wal, _, _) = open(&io, small_config(GOLDEN_SEGMENT_BYTES_MAX), &clock);
    for (term, kind, events, body) in golden_spec() {
        wal.set_term(term);
        clock.advance(1_000);
        wal.append_blocking(request(kind, events, &body)).unwrap();
    }
    wal.shutdown();
    io
}

/// (file name, bytes) of the generated WAL, sorted by name. A `segment.ready` the shutdown kept
/// (decisions/033) is zeros, not log, and exists only if the writer was idle long enough to
/// prepare it: not part of the fixture.
fn generated_files() -> Vec<(String, Vec<u8>)> {
    let io = generate();
    io.paths()
        .iter()
        .map(|path| (file_name(path), io.file_bytes(path).unwrap()))
        .filter(|(name, _)| name != "segment.ready")
        .collect()
}

/// The fixture copied into a fresh SimIo at [`dir`].
fn fixture_io(files: &[(String, Vec<u8>)]) -> SimIo {
    let io = SimIo::new();
    for (name, bytes) in files {
        io.write_file(&dir().join(name), bytes);
    }
    io
}

/// Start offsets of the batches in a segment's bytes.
fn batch_offsets(bytes: &[u8]) -> Vec<usize> {
    let mut offsets = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        offsets.push(at);
        at += decode_batch(&bytes[at..]).unwrap().encoded.len();
    }
    offsets
}

#[test]
fn fixture_equals_the_generator_output() {
    let generated = generated_files();
    if std::env::var_os(REGENERATE_ENV).is_some() {
        let dir = fixture_dir();
        if dir.exists() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                std::fs::remove_file(entry.unwrap().path()).unwrap();
            }
        }
        std::fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in &generated {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }
    let fixture = fixture_files();
    let names: Vec<&String> = fixture.iter().map(|(name, _)| name).collect();
    assert_eq!(
        names,
        generated.iter().map(|(name, _)| name).collect::<Vec<_>>(),
        "set {REGENERATE_ENV}=1 to regenerate"
    );
    for ((name, fixture_bytes), (_, generated_bytes)) in fixture.iter().zip(&generated) {
        assert!(fixture_bytes == generated_bytes, "{name} differs from the generator's output");
    }
    assert!(names.iter().filter(|name| name.ends_with(".seg")).count() >= 2);
}

fn check_golden_contents(batches: &[Batch]) {
    let spec = golden_spec();
    assert_eq!(batches.len(), spec.len());
    let mut next = Seqno(1);
    for (index, (batch, (term, kind, events, body))) in batches.iter().zip(&spec).enumerate() {
        assert_eq!(batch.first_seqno(), next);
        assert_eq!((batch.term(), batch.kind(), batch.header().event_count), (*term, *kind, *events));
        let time = u64::from_le_bytes(batch.payload()[..8].try_into().unwrap());
        assert_eq!(time, GOLDEN_START_MS + 1_000 * (index as u64 + 1));
        assert_eq!(&batch.payload()[8..], &body[..]);
        next = batch.last_seqno().next();
    }
}

#[test]
fn fixture_is_readable_through_sim_io_and_std_io() {
    let files = fixture_files();
    {
        let io = fixture_io(&files);
        let clock = Arc::new(ManualClock::new(0));
        let (wal, recovery, _) = open(&io, small_config(GOLDEN_SEGMENT_BYTES_MAX), &clock);
        assert_eq!(recovery.truncated, None);
        check_golden_contents(&read_all(&wal, 1));
        let history: Vec<TermSeqno> = wal.term_history();
        assert_eq!(
            history.iter().map(|entry| entry.term).collect::<Vec<_>>(),
            vec![Term(1), Term(2), Term(3), Term(5)]
        );
    }
    {
        let temp = tempfile::tempdir().unwrap();
        for (name, bytes) in &files {
            std::fs::write(temp.path().join(name), bytes).unwrap();
        }
        let config = WalConfig::new(temp.path());
        let (wal, _) =
            Wal::open(config, Arc::new(StdIo), Arc::new(ManualClock::new(0)), Box::new(NoopHook)).unwrap();
        check_golden_contents(&read_all(&wal, 1));
    }
}

#[test]
fn every_single_bit_flip_is_detected() {
    let files = fixture_files();
    let original = {
        let io = fixture_io(&files);
        let (wal, _, _) = open(&io, small_config(GOLDEN_SEGMENT_BYTES_MAX), &Arc::new(ManualClock::new(0)));
        read_all(&wal, 1)
    };
    let last_segment = files
        .iter()
        .filter(|(name, _)| name.ends_with(".seg"))
        .map(|(name, _)| name.clone())
        .next_back()
        .unwrap();
    let mut flips = 0u64;
    let mut truncations = 0u64;
    for (name, bytes) in &files {
        let path = dir().join(name);
        let offsets = if name.ends_with(".seg") { batch_offsets(bytes) } else { vec![0] };
        for bit in 0..bytes.len() as u64 * 8 {
            flips += 1;
            let byte = (bit / 8) as usize;
            let batch_start = *offsets.iter().rfind(|start| **start <= byte).unwrap() as u64;
            let io = fixture_io(&files);
            io.flip_bit(&path, bit).unwrap();
            let label = format!("flip of bit {bit} (byte {byte}) of {name}");
            match try_open(&io, small_config(GOLDEN_SEGMENT_BYTES_MAX), &Arc::new(ManualClock::new(0))) {
                Err(Error::Corrupt { path: got, offset, .. }) => {
                    assert_eq!(got, path, "{label}");
                    assert_eq!(offset, batch_start, "{label}");
                }
                Err(other) => panic!("{label}: {other}"),
                Ok((wal, recovery, _)) => {
                    truncations += 1;
                    let torn = recovery.truncated.unwrap_or_else(|| panic!("{label} went unnoticed"));
                    let in_last_batch =
                        *name == last_segment && batch_start == *offsets.last().unwrap() as u64;
                    assert!(in_last_batch, "{label}: only the last batch may look torn");
                    assert_eq!((torn.path, torn.offset), (path.clone(), batch_start), "{label}");
                    assert_eq!(read_all(&wal, 1), original[..original.len() - 1], "{label}");
                }
            }
        }
    }
    assert!(flips > 10_000, "{flips} flips");
    assert!(truncations < 100, "{truncations} flips were read as torn tails");
}

#[test]
fn truncating_the_last_segment_anywhere_recovers_a_prefix_of_whole_batches() {
    let files = fixture_files();
    let segments: Vec<&(String, Vec<u8>)> = files.iter().filter(|(name, _)| name.ends_with(".seg")).collect();
    let (last_name, last_bytes) = segments.last().unwrap();
    let last_path = dir().join(last_name);
    let offsets = batch_offsets(last_bytes);
    let original = {
        let io = fixture_io(&files);
        let (wal, _, _) = open(&io, small_config(GOLDEN_SEGMENT_BYTES_MAX), &Arc::new(ManualClock::new(0)));
        read_all(&wal, 1)
    };
    let before_last = original.len() - offsets.len();
    for len in 0..=last_bytes.len() {
        let io = fixture_io(&files);
        io.truncate_file(&last_path, len as u64).unwrap();
        let (wal, recovery, _) =
            open(&io, small_config(GOLDEN_SEGMENT_BYTES_MAX), &Arc::new(ManualClock::new(0)));
        let whole = offsets
            .iter()
            .skip(1)
            .chain(std::iter::once(&last_bytes.len()))
            .filter(|end| **end <= len)
            .count();
        let boundary = if whole == 0 { 0 } else { *offsets.get(whole).unwrap_or(&last_bytes.len()) };
        assert_eq!(read_all(&wal, 1), original[..before_last + whole], "truncated to {len}");
        match recovery.truncated {
            None => assert_eq!(boundary, len, "truncated to {len}: a partial batch was not reported"),
            Some(torn) => {
                assert_eq!(
                    (torn.offset, torn.bytes_dropped),
                    (boundary as u64, (len - boundary) as u64),
                    "len {len}"
                );
            }
        }
    }
    tracing::info!("phase: truncating a segment that is not the last is corruption");
    let (first_name, first_bytes) = segments[0];
    let first_path = dir().join(first_name);
    for len in 0..first_bytes.len() {
        let io = fixture_io(&files);
        io.truncate_file(&first_path, len as u64).unwrap();
        match try_open(&io, small_config(GOLDEN_SEGMENT_BYTES_MAX), &Arc::new(ManualClock::new(0))) {
            // Cut at a batch boundary, the segment itself verifies and the break shows at the next one.
            Err(Error::Corrupt { path, offset, .. }) => {
                let at_boundary = batch_offsets(first_bytes).contains(&len);
                let second_path = dir().join(&segments[1].0);
                assert!(
                    path == first_path || (at_boundary && path == second_path && offset == 0),
                    "len {len}"
                );
            }
            Err(other) => panic!("len {len}: {other}"),
            Ok(_) => panic!("truncation of {first_name} to {len} went unnoticed"),
        }
    }
}

/// Issue 37, finding 10, on a stopped WAL (its last segment cut at its last batch, as the fixture
/// is): a last batch whose payload ends in zero bytes (an item delete, an embedding ending in 0.0)
/// with any one bit flipped, the file's length unchanged, is corruption named by file and offset,
/// never a torn tail to cut. Every bit of the batch, header and payload.
#[test]
fn every_bit_flip_in_a_last_batch_that_ends_in_zeros_is_corruption() {
    let config = small_config(300);
    let mut flips = 0;
    for (name, kind, body) in zero_ending_bodies() {
        let io = wal_ending_in(&config, kind, &body, Left::Stopped);
        let (path, bytes, span) = last_batch(&io);
        assert_eq!(span.end, bytes.len(), "{name}: a stopped WAL's last segment ends at its last batch");
        assert!(
            span.start > 0 && bytes[span.end - 1] == 0,
            "{name}: ends in zeros, not first in its segment"
        );
        flips += assert_every_flip_is_corruption(&snapshot(&io), &path, span, &config, name);
    }
    assert!(flips > 1_000, "{flips} flips");
}
