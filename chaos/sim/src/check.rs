//! Checks over the nodes' WALs, read straight from each node's simulated file system after the run:
//! invariant 3 (seqnos strictly increase and are contiguous, every batch verifies, terms never go
//! down) and log matching across nodes (a seqno held by two nodes is the same batch: same term, same
//! hash), which is what "at most one leader writes each term" leaves behind on disk.

use crate::faults::Damage;
use crate::violation::{Node, Violation};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tidal_wal::segment::logged_time_ms;
use tidal_wal::{decode_batch, SimIo};

/// One node's WAL as `first seqno -> (term, last seqno, batch hash)`.
pub type LogMap = BTreeMap<u64, (u64, u64, [u8; 32])>;

/// The WAL segment files under `wal_dir`, in seqno order.
pub fn segments(io: &SimIo, wal_dir: &Path) -> Vec<PathBuf> {
    let mut segments: Vec<_> = io
        .paths()
        .into_iter()
        .filter(|path| path.parent() == Some(wal_dir) && path.extension().is_some_and(|ext| ext == "seg"))
        .collect();
    segments.sort();
    segments
}

/// Every complete batch of a segment's bytes as `(offset, encoded length)`.
fn batch_spans(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut offset = 0usize;
    while offset < bytes.len() {
        let Ok(batch) = decode_batch(&bytes[offset..]) else { break };
        spans.push((offset, batch.encoded.len()));
        offset += batch.encoded.len();
    }
    spans
}

/// Header bytes of a batch (the bit flip stays in the payload, so the damage is a hash failure,
/// not a length that could read as a torn write).
const HEADER_LEN: usize = 64;

/// Damages a stopped node's WAL (see [`Damage`]); returns the damaged file, its bytes before, and
/// a description, or `None` when the WAL has nothing to damage.
pub fn damage(io: &SimIo, wal_dir: &Path, damage: Damage) -> Option<(PathBuf, Vec<u8>, String)> {
    let files: Vec<(PathBuf, Vec<u8>)> = segments(io, wal_dir)
        .into_iter()
        .filter_map(|path| Some((path.clone(), io.file_bytes(&path).ok()?)))
        .collect();
    let bit_flip = |pick: u64| -> Option<(PathBuf, Vec<u8>, String)> {
        let spans: Vec<(usize, usize, usize)> = files
            .iter()
            .enumerate()
            .flat_map(|(file, (_, bytes))| {
                batch_spans(bytes).into_iter().map(move |(at, len)| (file, at, len))
            })
            .filter(|(_, _, len)| *len > HEADER_LEN)
            .collect();
        let count = spans.len() as u64;
        let (file, at, len) = *spans.get(usize::try_from(pick % count.max(1)).ok()?)?;
        let payload_bits = ((len - HEADER_LEN) * 8) as u64;
        let bit = ((at + HEADER_LEN) * 8) as u64 + (pick / count.max(1)) % payload_bits;
        let (path, original) = &files[file];
        io.flip_bit(path, bit).ok()?;
        Some((
            path.clone(),
            original.clone(),
            format!("bit {bit} of {} flipped (batch at offset {at})", path.display()),
        ))
    };
    match damage {
        Damage::BitFlip { pick } => bit_flip(pick),
        Damage::TruncateSegment { pick } => {
            let candidates: Vec<&(PathBuf, Vec<u8>)> = files
                .iter()
                .take(files.len().saturating_sub(1))
                .filter(|(_, bytes)| bytes.len() > 1)
                .collect();
            if candidates.is_empty() {
                // One segment only: a cut would read as a torn tail; flip a bit instead.
                return bit_flip(pick);
            }
            let (path, original) = candidates[usize::try_from(pick % candidates.len() as u64).ok()?];
            let cut = 1 + (pick / candidates.len() as u64) % (original.len() as u64 - 1);
            io.truncate_file(path, cut).ok()?;
            Some((
                path.clone(),
                original.clone(),
                format!("{} cut from {} to {cut} bytes", path.display(), original.len()),
            ))
        }
        Damage::TruncateTail { pick } => {
            let (path, original) = files.last()?;
            let (at, len) = *batch_spans(original).last()?;
            let cut = at as u64 + 1 + pick % (len as u64 - 1);
            io.truncate_file(path, cut).ok()?;
            Some((
                path.clone(),
                original.clone(),
                format!(
                    "{} cut inside its last batch, from {} to {cut} bytes",
                    path.display(),
                    original.len()
                ),
            ))
        }
    }
}

/// Rotation: no segment grows past the size limit, except by its last batch (a segment rotates
/// before the batch that would cross the limit, and a batch larger than the limit is alone in its
/// segment). Returns how many rotations the node's disk shows (segments after the first).
pub fn rotation(io: &SimIo, wal_dir: &Path, node: usize, limit: u64, violations: &mut Vec<Violation>) -> u64 {
    let segments = segments(io, wal_dir);
    for path in &segments {
        let Ok(bytes) = io.file_bytes(path) else { continue };
        let spans = batch_spans(&bytes);
        let before_last = spans.last().map_or(0, |(at, _)| *at as u64);
        if spans.len() > 1 && before_last > limit {
            violations.push(Violation::SegmentTooLarge {
                node: Node(node),
                segment: path.clone(),
                bytes: before_last,
                limit,
            });
        }
    }
    segments.len().saturating_sub(1) as u64
}

/// "0 duplicated": every write carries its own Idempotency-Key (`w<id>`, `r<id>`), so no key may
/// name two batches of a node's log (a retried write applied twice would). Decodes every complete
/// batch's envelope; returns how many keyed batches it saw.
pub fn duplicates(io: &SimIo, wal_dir: &Path, node: usize, violations: &mut Vec<Violation>) -> u64 {
    let mut seen: BTreeMap<String, u64> = BTreeMap::new();
    for segment in segments(io, wal_dir) {
        let Ok(bytes) = io.file_bytes(&segment) else { continue };
        let mut offset = 0usize;
        while offset < bytes.len() {
            let Ok(batch) = decode_batch(&bytes[offset..]) else { break };
            offset += batch.encoded.len();
            let first = batch.header.first_seqno.get();
            let Ok((envelope, _)) = tidal_core::record::decode_payload(batch.header.kind, batch.payload)
            else {
                continue;
            };
            if envelope.idempotency_key.is_empty() {
                continue;
            }
            if let Some(earlier) = seen.insert(envelope.idempotency_key.clone(), first) {
                violations.push(Violation::Duplicated {
                    node: Node(node),
                    key: envelope.idempotency_key.clone(),
                    seqnos: (earlier, first),
                });
            }
        }
    }
    seen.len() as u64
}

/// Reads and checks the WAL under `wal_dir` in `io`; returns its batches or the violations.
/// Besides invariant 3, the logged time (each batch envelope's leader timestamp) never goes
/// backwards along the log, across failovers and skewed clocks (PROTOCOL.md, "Time").
pub fn read_wal(io: &SimIo, wal_dir: &Path, node: usize, violations: &mut Vec<Violation>) -> LogMap {
    let segments = segments(io, wal_dir);
    let mut log = LogMap::new();
    let mut next: Option<u64> = None;
    let mut last_term = 0u64;
    let mut last_time = 0u64;
    for (index, segment) in segments.iter().enumerate() {
        let bytes = match io.file_bytes(segment) {
            Ok(bytes) => bytes,
            Err(error) => {
                violations.push(Violation::WalUnreadable {
                    node: Node(node),
                    segment: segment.clone(),
                    error: error.to_string(),
                });
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
                        violations.push(Violation::WalCorrupt {
                            node: Node(node),
                            segment: segment.clone(),
                            offset,
                            error: error.to_string(),
                        });
                    }
                    break;
                }
            };
            let header = batch.header;
            let first = header.first_seqno.get();
            let last_seqno = first + u64::from(header.event_count) - 1;
            if let Some(expected) = next {
                if first != expected {
                    violations.push(Violation::WalNotContiguous {
                        node: Node(node),
                        seqno: first,
                        after: expected - 1,
                    });
                }
            }
            if header.term.get() < last_term {
                violations.push(Violation::TermDecreases {
                    node: Node(node),
                    from: last_term,
                    to: header.term.get(),
                    seqno: first,
                });
            }
            last_term = header.term.get();
            if let Some(time) = logged_time_ms(batch.payload) {
                if time < last_time {
                    violations.push(Violation::LoggedTimeDecreases {
                        node: Node(node),
                        seqno: first,
                        time,
                        previous: last_time,
                    });
                }
                last_time = last_time.max(time);
            }
            next = Some(last_seqno + 1);
            log.insert(first, (header.term.get(), last_seqno, header.hash));
            offset += batch.encoded.len();
        }
    }
    log
}

/// One line per batch of a node's WAL (seqnos, term, kind, logged time, seal): for comparing two
/// replays of a seed (`TIDAL_SIM_TRACE_OUT`).
pub fn batch_lines(io: &SimIo, wal_dir: &Path, node: usize) -> Vec<String> {
    let mut lines = Vec::new();
    for segment in segments(io, wal_dir) {
        let Ok(bytes) = io.file_bytes(&segment) else { continue };
        let mut offset = 0usize;
        while let Ok(batch) = decode_batch(&bytes[offset..]) {
            let header = batch.header;
            let first = header.first_seqno.get();
            lines.push(format!(
                "wal n{} {first}..{} term {} {:?} time {:?} seal {}",
                node + 1,
                first + u64::from(header.event_count) - 1,
                header.term.get(),
                header.kind,
                logged_time_ms(batch.payload),
                &blake3::Hash::from(header.hash).to_hex()[..12]
            ));
            offset += batch.encoded.len();
        }
    }
    lines
}

/// Log matching: every batch two nodes both hold is the same batch.
pub fn log_matching(logs: &[LogMap], violations: &mut Vec<Violation>) -> u64 {
    let mut compared = 0;
    for a in 0..logs.len() {
        for b in a + 1..logs.len() {
            for (first, batch) in &logs[a] {
                if let Some(other) = logs[b].get(first) {
                    compared += 1;
                    if other != batch {
                        violations.push(Violation::LogMismatch {
                            nodes: (Node(a), Node(b)),
                            seqno: *first,
                            terms: (batch.0, other.0),
                        });
                    }
                }
            }
        }
    }
    compared
}

/// The seqnos at which two nodes hold different batches (what [`log_matching`] reports).
pub fn diverging(logs: &[LogMap]) -> std::collections::BTreeSet<u64> {
    let mut seqnos = std::collections::BTreeSet::new();
    for a in 0..logs.len() {
        for b in a + 1..logs.len() {
            for (first, batch) in &logs[a] {
                if logs[b].get(first).is_some_and(|other| other != batch) {
                    seqnos.insert(*first);
                }
            }
        }
    }
    seqnos
}

/// The history of one position on one node, for a log-matching report: the batch that holds
/// `seqno` now (its term, its span, the simulated ms its leader logged it at), and every batch that
/// held it and was moved to `quarantine/` (its term and span, and when: the quarantine file's name
/// carries the node's clock). `epoch_ms` is the simulated clock's zero.
pub fn position_history(io: &SimIo, wal_dir: &Path, seqno: u64, epoch_ms: u64) -> Vec<String> {
    let describe = |bytes: &[u8]| -> Option<String> {
        let mut offset = 0usize;
        while offset < bytes.len() {
            let batch = decode_batch(&bytes[offset..]).ok()?;
            let first = batch.header.first_seqno.get();
            let last = first + u64::from(batch.header.event_count) - 1;
            if (first..=last).contains(&seqno) {
                let logged = logged_time_ms(batch.payload)
                    .map_or("-".to_string(), |ms| format!("{}", ms.saturating_sub(epoch_ms)));
                let hash: String = batch.header.hash[..4].iter().map(|b| format!("{b:02x}")).collect();
                return Some(format!(
                    "(term {}, {first}..={last}, hash {hash}, logged at {logged} ms)",
                    batch.header.term.get()
                ));
            }
            offset += batch.encoded.len();
        }
        None
    };
    let mut lines = Vec::new();
    let held = segments(io, wal_dir)
        .iter()
        .filter_map(|path| io.file_bytes(path).ok())
        .find_map(|bytes| describe(&bytes));
    lines.push(format!("holds {}", held.unwrap_or_else(|| "nothing".to_string())));
    let quarantine = wal_dir.join("quarantine");
    let mut files: Vec<PathBuf> =
        io.paths().into_iter().filter(|path| path.parent() == Some(&quarantine)).collect();
    files.sort();
    for path in files {
        let Some(name) = path.file_name().and_then(|name| name.to_str()) else { continue };
        let Ok(bytes) = io.file_bytes(&path) else { continue };
        let Some(batch) = describe(&bytes) else { continue };
        let at = name
            .split('.')
            .next()
            .and_then(|stem| stem.rsplit('-').next())
            .and_then(|ms| ms.parse::<u64>().ok())
            .map_or("-".to_string(), |ms| format!("{}", ms.saturating_sub(epoch_ms)));
        lines.push(format!("quarantined {batch} at {at} ms ({name})"));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidal_types::{RecordKind, Seqno, Term};
    use tidal_wal::Batch;

    /// Encoded batches `(term, first seqno, events)`.
    fn encoded(batches: &[(u64, u64, u32)]) -> Vec<u8> {
        let mut bytes = Vec::new();
        for (term, first, events) in batches {
            let batch = Batch::new(RecordKind::ItemDelete, Term(*term), Seqno(*first), *events, &[0u8; 18]);
            bytes.extend_from_slice(batch.encoded());
        }
        bytes
    }

    #[test]
    fn a_diverging_position_is_told_node_by_node() {
        let io = SimIo::new();
        let (n1, n3) = (Path::new("/n1/wal"), Path::new("/n3/wal"));
        io.write_file(&n1.join("00000000000000000001.seg"), &encoded(&[(1, 1, 9), (3, 10, 1)]));
        io.write_file(&n1.join("quarantine/2-10-10-1735689601500.wal"), &encoded(&[(2, 10, 1)]));
        io.write_file(&n3.join("00000000000000000001.seg"), &encoded(&[(1, 1, 9), (2, 10, 1)]));
        let mut violations = Vec::new();
        let logs = vec![read_wal(&io, n1, 0, &mut violations), read_wal(&io, n3, 2, &mut violations)];
        assert!(violations.is_empty(), "{violations:?}");
        assert_eq!(diverging(&logs).into_iter().collect::<Vec<_>>(), [10]);
        let n1_story = position_history(&io, n1, 10, 1_735_689_600_000);
        assert_eq!(n1_story.len(), 2, "{n1_story:?}");
        assert!(n1_story[0].starts_with("holds (term 3, 10..=10"), "{n1_story:?}");
        assert!(n1_story[1].starts_with("quarantined (term 2, 10..=10"), "{n1_story:?}");
        assert!(n1_story[1].contains("at 1500 ms"), "{n1_story:?}");
        let n3_story = position_history(&io, n3, 5, 1_735_689_600_000);
        assert_eq!(n3_story.len(), 1, "{n3_story:?}");
        assert!(n3_story[0].starts_with("holds (term 1, 1..=9, hash "), "{n3_story:?}");
        assert_eq!(position_history(&io, n3, 11, 0), ["holds nothing"]);
    }
}
