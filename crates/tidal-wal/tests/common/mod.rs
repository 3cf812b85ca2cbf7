//! Helpers shared by the integration tests: a WAL over `SimIo` with a manual clock, request
//! builders, a recording hook, and read-back.
#![allow(dead_code)]
// Helpers of tests: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tidal_types::{RecordKind, Seqno};
use tidal_wal::{AppendRequest, Batch, FlushedHook, ManualClock, Recovery, SimIo, Wal, WalConfig};

/// The WAL directory used in SimIo tests.
pub fn dir() -> PathBuf {
    PathBuf::from("/data/wal")
}

/// A small-segment config in [`dir`].
pub fn small_config(segment_bytes_max: u64) -> WalConfig {
    let mut config = WalConfig::new(dir());
    config.segment_bytes_max = segment_bytes_max;
    config
}

/// Batches seen by a [`RecordingHook`].
#[derive(Clone, Default)]
pub struct Recorded(pub Arc<Mutex<Vec<Batch>>>);

impl Recorded {
    pub fn batches(&self) -> Vec<Batch> {
        self.0.lock().unwrap().clone()
    }
}

/// A hook that records every flushed batch, and checks they arrive in seqno order.
pub struct RecordingHook(pub Recorded);

impl FlushedHook for RecordingHook {
    fn flushed(&mut self, batches: &[Batch]) {
        let mut recorded = self.0 .0.lock().unwrap();
        for batch in batches {
            if let Some(last) = recorded.last() {
                assert_eq!(batch.first_seqno(), last.last_seqno().next(), "hook batches out of order");
            }
            recorded.push(batch.clone());
        }
    }
}

/// Opens a WAL over `io` in [`dir`] with a manual clock and a recording hook.
pub fn open(io: &SimIo, config: WalConfig, clock: &Arc<ManualClock>) -> (Wal, Recovery, Recorded) {
    try_open(io, config, clock).expect("open WAL")
}

pub fn try_open(
    io: &SimIo,
    config: WalConfig,
    clock: &Arc<ManualClock>,
) -> Result<(Wal, Recovery, Recorded), tidal_wal::Error> {
    let recorded = Recorded::default();
    let (wal, recovery) =
        Wal::open(config, Arc::new(io.clone()), clock.clone(), Box::new(RecordingHook(recorded.clone())))?;
    Ok((wal, recovery, recorded))
}

/// A request whose payload is the 8-byte time slot followed by `body`.
pub fn request(kind: RecordKind, event_count: u32, body: &[u8]) -> AppendRequest {
    let mut payload = vec![0u8; 8];
    payload.extend_from_slice(body);
    AppendRequest { kind, event_count, payload }
}

/// Every durable batch from `from` on.
pub fn read_all(wal: &Wal, from: u64) -> Vec<Batch> {
    wal.read_from(Seqno(from)).expect("read_from").collect::<Result<Vec<_>, _>>().expect("read batches")
}

/// Segment files (paths ending in .seg) of a SimIo, sorted.
pub fn segment_paths(io: &SimIo) -> Vec<PathBuf> {
    io.paths().into_iter().filter(|path| path.extension().is_some_and(|ext| ext == "seg")).collect()
}

/// Whether `needle` occurs in `haystack`.
pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|window| window == needle)
}

/// Checks that `batches` form an unbroken chain starting at seqno 1.
pub fn assert_chain_from_one(batches: &[Batch]) {
    let mut next = Seqno(1);
    for batch in batches {
        assert_eq!(batch.first_seqno(), next, "broken chain");
        next = batch.last_seqno().next();
    }
}

pub fn file_name(path: &Path) -> String {
    path.file_name().unwrap().to_string_lossy().into_owned()
}

/// The committed golden WAL fixture (t50_golden writes it, t50 and t52 read it).
pub fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/golden")
}

/// (file name, bytes) of the committed golden fixture, sorted by name.
pub fn fixture_files() -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(fixture_dir())
        .expect("the golden fixture directory exists")
        .map(|entry| {
            let path = entry.unwrap().path();
            (file_name(&path), std::fs::read(&path).unwrap())
        })
        .collect();
    files.sort();
    files
}

/// Bodies whose batch ends in zero bytes, the two cases of issue 37 (finding 10): an item delete
/// (the item id as u64 LE, its high bytes zero) and an embedding whose last components are 0.0
/// (item id u64, dimension u32, f32s LE).
pub fn zero_ending_bodies() -> Vec<(&'static str, RecordKind, Vec<u8>)> {
    let delete = 42u64.to_le_bytes().to_vec();
    let mut embedding = 43u64.to_le_bytes().to_vec();
    embedding.extend(4u32.to_le_bytes());
    for component in [0.5f32, -1.25, 0.0, 0.0] {
        embedding.extend(component.to_le_bytes());
    }
    vec![("delete", RecordKind::ItemDelete, delete), ("embedding", RecordKind::ItemEmbedding, embedding)]
}

/// Every file of a SimIo with its bytes as a reader sees them, sorted by path.
pub fn snapshot(io: &SimIo) -> Vec<(PathBuf, Vec<u8>)> {
    io.paths().into_iter().map(|path| (path.clone(), io.file_bytes(&path).unwrap())).collect()
}

/// A fresh SimIo holding `files`, every byte and entry durable.
pub fn restore(files: &[(PathBuf, Vec<u8>)]) -> SimIo {
    let io = SimIo::new();
    for (path, bytes) in files {
        io.write_file(path, bytes);
    }
    io
}

/// Start and end offsets of the whole, verified batches at the start of a segment's bytes, up to
/// the first bytes that are not one (the end of the file, zeros, or whatever else follows).
pub fn verified_spans(bytes: &[u8]) -> Vec<std::ops::Range<usize>> {
    let mut spans = Vec::new();
    let mut at = 0;
    while let Ok(batch) = tidal_wal::decode_batch(&bytes[at..]) {
        spans.push(at..at + batch.encoded.len());
        at += batch.encoded.len();
    }
    spans
}

/// Flips, one at a time and each in a fresh copy of `files`, every bit of `span` of the segment
/// `path` (the file's length unchanged), and checks that every open refuses the WAL as corruption
/// of that segment at `span.start`: never a torn tail, never a WAL that opens. Returns the flips.
pub fn assert_every_flip_is_corruption(
    files: &[(PathBuf, Vec<u8>)],
    path: &Path,
    span: std::ops::Range<usize>,
    config: &WalConfig,
    label: &str,
) -> u64 {
    let clock = Arc::new(ManualClock::new(0));
    let mut flips = 0;
    for bit in span.start as u64 * 8..span.end as u64 * 8 {
        let io = restore(files);
        io.flip_bit(path, bit).unwrap();
        let label = format!("{label}: flip of bit {bit} (byte {})", bit / 8);
        match try_open(&io, config.clone(), &clock) {
            Err(tidal_wal::Error::Corrupt { path: got, offset, reason }) => {
                assert_eq!((got.as_path(), offset), (path, span.start as u64), "{label}: {reason}");
            }
            Err(other) => panic!("{label}: {other}"),
            Ok((_, recovery, _)) => panic!("{label}: opened, torn tail {:?}", recovery.truncated),
        }
        flips += 1;
    }
    flips
}

/// How [`wal_ending_in`] leaves its WAL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Left {
    /// Shut down cleanly: the last segment is cut at its last batch.
    Stopped,
    /// A power loss with the WAL open, once everything was fsynced (a SIGKILL leaves the same).
    PowerLoss,
}

/// A WAL in [`dir`] written with `config`: five 40-byte signal batches, then one batch of `kind`
/// holding `body`, the last acknowledged write; left as `left` says. With 300-byte segments the
/// last segment holds two batches before the last one.
pub fn wal_ending_in(config: &WalConfig, kind: RecordKind, body: &[u8], left: Left) -> SimIo {
    let io = SimIo::new();
    let clock = Arc::new(ManualClock::new(1_732_900_000_000));
    let (wal, _, _) = open(&io, config.clone(), &clock);
    wal.set_term(tidal_types::Term(3));
    for index in 0..5u8 {
        clock.advance(1_000);
        wal.append_blocking(request(RecordKind::Signal, 2, &[b'a' + index; 40])).unwrap();
    }
    clock.advance(1_000);
    wal.append_blocking(request(kind, 1, body)).unwrap();
    // The writer is quiet (nothing left to prepare) before the machine goes down.
    assert!(wal.wait_segment_prepared(std::time::Duration::from_secs(30)));
    match left {
        Left::Stopped => wal.shutdown(),
        Left::PowerLoss => {
            io.crash_at_op(1, tidal_wal::CrashMode::LoseUnsynced);
            drop(wal);
            io.restart();
        }
    }
    io
}

/// The last segment of a SimIo WAL in [`dir`], its bytes, and the span of its last whole batch.
pub fn last_batch(io: &SimIo) -> (PathBuf, Vec<u8>, std::ops::Range<usize>) {
    let path = segment_paths(io).pop().unwrap();
    let bytes = io.file_bytes(&path).unwrap();
    let span = verified_spans(&bytes).pop().unwrap();
    (path, bytes, span)
}
