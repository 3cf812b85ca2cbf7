//! Checks over the nodes' WALs, read straight from each node's simulated file system after the run:
//! invariant 3 (seqnos strictly increase and are contiguous, every batch verifies, terms never go
//! down) and log matching across nodes (a seqno held by two nodes is the same batch: same term, same
//! hash), which is what "at most one leader writes each term" leaves behind on disk.

use std::collections::BTreeMap;
use std::path::Path;
use tidal_wal::{decode_batch, SimIo};

/// One node's WAL as `first seqno -> (term, last seqno, batch hash)`.
pub type LogMap = BTreeMap<u64, (u64, u64, [u8; 32])>;

/// Reads and checks the WAL under `wal_dir` in `io`; returns its batches or the violations.
pub fn read_wal(io: &SimIo, wal_dir: &Path, node: usize, violations: &mut Vec<String>) -> LogMap {
    let mut segments: Vec<_> = io
        .paths()
        .into_iter()
        .filter(|path| path.parent() == Some(wal_dir) && path.extension().is_some_and(|ext| ext == "seg"))
        .collect();
    segments.sort();
    let mut log = LogMap::new();
    let mut next: Option<u64> = None;
    let mut last_term = 0u64;
    for (index, segment) in segments.iter().enumerate() {
        let bytes = match io.file_bytes(segment) {
            Ok(bytes) => bytes,
            Err(error) => {
                violations.push(format!("n{}: read {}: {error}", node + 1, segment.display()));
                continue;
            }
        };
        let mut offset = 0usize;
        while offset < bytes.len() {
            let batch = match decode_batch(&bytes[offset..]) {
                Ok(batch) => batch,
                Err(error) => {
                    let last = index + 1 == segments.len();
                    // A torn tail of the last segment is what a crash leaves before recovery cuts it.
                    if !last {
                        violations.push(format!(
                            "invariant 3: n{}: {} offset {offset}: {error}",
                            node + 1,
                            segment.display()
                        ));
                    }
                    break;
                }
            };
            let header = batch.header;
            let first = header.first_seqno.get();
            let last_seqno = first + u64::from(header.event_count) - 1;
            if let Some(expected) = next {
                if first != expected {
                    violations.push(format!(
                        "invariant 3: n{}: batch at seqno {first} follows one ending at {}",
                        node + 1,
                        expected - 1
                    ));
                }
            }
            if header.term.get() < last_term {
                violations.push(format!(
                    "invariant 3: n{}: term goes down from {last_term} to {} at seqno {first}",
                    node + 1,
                    header.term.get()
                ));
            }
            last_term = header.term.get();
            next = Some(last_seqno + 1);
            log.insert(first, (header.term.get(), last_seqno, header.hash));
            offset += batch.encoded.len();
        }
    }
    log
}

/// Log matching: every batch two nodes both hold is the same batch.
pub fn log_matching(logs: &[LogMap], violations: &mut Vec<String>) -> u64 {
    let mut compared = 0;
    for a in 0..logs.len() {
        for b in a + 1..logs.len() {
            for (first, batch) in &logs[a] {
                if let Some(other) = logs[b].get(first) {
                    compared += 1;
                    if other != batch {
                        violations.push(format!(
                            "log matching: n{} and n{} hold different batches at seqno {first} (terms {} and {})",
                            a + 1,
                            b + 1,
                            batch.0,
                            other.0
                        ));
                    }
                }
            }
        }
    }
    compared
}
