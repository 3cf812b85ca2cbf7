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
