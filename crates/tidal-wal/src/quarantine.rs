//! Truncation of the log's tail into `quarantine/`: [`QuarantineReport`], the writer's quarantine
//! and reset, and the step recovery uses to finish a truncation a crash interrupted.
//!
//! A follower truncates when a leader of another term holds a seqno it holds (PROTOCOL.md, "Shipping
//! and pulling", step 3), and resets when it installs a snapshot. Nothing is dropped silently: the
//! batches go, raw and byte-identical, into `<wal dir>/quarantine/<term>-<first>-<last>-<unix ms>.wal`
//! (`term` is the first quarantined batch's term; the directory sits inside the WAL directory so
//! the WAL stays one self-contained directory, and recovery never mistakes it for segments).
//!
//! Delicate:
//! - The durable frontier goes DOWN here, the one exception to its monotonicity. The caller
//!   guarantees that nothing above the cut was committed or applied (quorum mode halts instead).
//! - Crash safety, in this order: (1) the quarantine file is written as `.wal.tmp`, fsynced, renamed
//!   and its directory fsynced (recovery removes a leftover `.tmp`); (2) `wal.meta` is replaced with
//!   the truncated term history and a pending `truncate_from`; (3) segments above the cut are removed
//!   and the one holding it is cut at the batch's offset and fsynced; (4) `wal.meta` is replaced
//!   without the pending truncation. A crash before (2) leaves the old log (and perhaps a complete,
//!   redundant quarantine file); a crash after (2) leaves a pending truncation that recovery finishes
//!   with [`finish_truncation`] before it scans, so the next open sees the truncated log.
//! - A reset records `purge point := position` and the given term history in the same step (2),
//!   with `truncate_from = 1`, which (being at or below the purge point) means "remove every segment".
//! - It runs on the writer thread between drains, under the log lock: nothing is in flight, and
//!   readers see either the old segment list or the new one (a reader already on its way stops with
//!   [`Error::TruncatedWhileReading`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use tidal_types::{Seqno, Term, TermSeqno};

use crate::batch::decode_batch;
use crate::error::Error;
use crate::io::FileIo;
use crate::segment::{segment_file_name, SegmentInfo};
use crate::shared::{LogState, Shared, TruncateOp};
use crate::wal_meta::{WalMeta, TERM_HISTORY_LEN_MAX};
use crate::writer::Writer;

/// Name of the quarantine directory inside the WAL directory.
pub const QUARANTINE_DIR_NAME: &str = "quarantine";
/// Suffix of a complete quarantine file.
pub const QUARANTINE_SUFFIX: &str = ".wal";
/// Suffix of a quarantine file still being written; removed on open.
const QUARANTINE_TMP_SUFFIX: &str = ".wal.tmp";

/// What a quarantine or reset did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuarantineReport {
    /// The quarantine file (raw encoded batches); `None` if nothing was retained to move.
    pub path: Option<PathBuf>,
    /// Position of the first quarantined seqno (`(0, 0)` if none).
    pub first: TermSeqno,
    /// Position of the last quarantined seqno (`(0, 0)` if none).
    pub last: TermSeqno,
    /// Batches moved.
    pub batches: u64,
    /// Their encoded bytes.
    pub bytes: u64,
    /// The durable (and last) position of the log afterwards.
    pub durable: TermSeqno,
}

/// Called on the writer thread with the outcome of a truncation.
pub(crate) type TruncateCompletion = Box<dyn FnOnce(Result<QuarantineReport, Error>) + Send>;

/// What was copied into a quarantine file.
struct Copied {
    path: PathBuf,
    first: TermSeqno,
    last: TermSeqno,
    batches: u64,
    bytes: u64,
}

impl Writer {
    /// Performs a truncation. The outer error is fatal (the caller poisons the WAL); the inner one
    /// is a refusal that changed nothing.
    pub(crate) fn truncate(&mut self, op: TruncateOp) -> Result<Result<QuarantineReport, Error>, Error> {
        let shared = self.shared.clone();
        let mut log = shared.lock_log();
        match op {
            TruncateOp::QuarantineFrom(cut) => {
                if log.index.batch_of(cut).map(|(first, _)| first) != Some(cut) {
                    return Ok(Err(Error::NotBatchStart { seqno: cut }));
                }
                shared.truncations.fetch_add(1, Ordering::SeqCst);
                let report = self.quarantine_locked(&mut log, cut);
                shared.truncations.fetch_add(1, Ordering::SeqCst);
                report.map(Ok)
            }
            TruncateOp::ResetTo { position, term_history } => {
                let term_history = match reset_history(position, term_history) {
                    Ok(history) => history,
                    Err(reason) => return Ok(Err(Error::InvalidReset(reason))),
                };
                shared.truncations.fetch_add(1, Ordering::SeqCst);
                let report = self.reset_locked(&mut log, position, term_history);
                shared.truncations.fetch_add(1, Ordering::SeqCst);
                report.map(Ok)
            }
        }
    }

    fn quarantine_locked(&mut self, log: &mut LogState, cut: Seqno) -> Result<QuarantineReport, Error> {
        let shared = self.shared.clone();
        let (io, dir) = (shared.io.as_ref(), &shared.config.dir);
        let durable = Seqno(self.next_seqno.get() - 1);
        let copied = write_quarantine(&shared, &log.segments, &log.meta, cut, durable)?;
        let mut meta = log.meta.clone();
        meta.term_history.retain(|entry| entry.seqno < cut);
        meta.truncate_from = cut;
        meta.store(io, dir)?;
        let paths: Vec<(Seqno, PathBuf)> =
            log.segments.iter().map(|segment| (segment.first_seqno, segment.path.clone())).collect();
        let cut_len = finish_truncation(io, dir, &paths, &meta)?
            .expect("the segment holding a retained batch boundary is cut there");
        meta.truncate_from = Seqno::ZERO;
        meta.store(io, dir)?;

        let mut segments: Vec<SegmentInfo> =
            log.segments.iter().filter(|segment| segment.first_seqno <= cut).cloned().collect();
        let active_info = segments.last_mut().expect("a segment holds the cut");
        active_info.bytes = cut_len;
        active_info.last_seqno = (active_info.first_seqno < cut).then(|| Seqno(cut.get() - 1));
        let active_info = active_info.clone();
        self.active = io
            .open_append(&active_info.path)
            .map_err(|err| Error::fatal("open segment", &active_info.path, err))?;
        self.active_info = active_info;
        // finish_truncation cut the file at the batch (preallocated zeros after it went too).
        self.active_len = cut_len;
        log.segments = segments;
        log.index.truncate_from(cut);
        self.history_term = meta.term_history.last().map_or(Term(0), |entry| entry.term);
        self.next_seqno = cut;
        let durable = TermSeqno { term: meta.term_at(Seqno(cut.get() - 1)), seqno: Seqno(cut.get() - 1) };
        log.meta = meta;
        shared.durable.store(durable.seqno.get(), Ordering::SeqCst);
        tracing::warn!(
            path = %copied.path.display(),
            first = %copied.first,
            last = %copied.last,
            batches = copied.batches,
            "quarantined the WAL's tail; the durable frontier went down"
        );
        Ok(QuarantineReport {
            path: Some(copied.path),
            first: copied.first,
            last: copied.last,
            batches: copied.batches,
            bytes: copied.bytes,
            durable,
        })
    }

    fn reset_locked(
        &mut self,
        log: &mut LogState,
        position: TermSeqno,
        term_history: Vec<TermSeqno>,
    ) -> Result<QuarantineReport, Error> {
        let shared = self.shared.clone();
        let (io, dir) = (shared.io.as_ref(), &shared.config.dir);
        let durable = Seqno(self.next_seqno.get() - 1);
        let copied = match log.index.first() {
            Some(first) => Some(write_quarantine(&shared, &log.segments, &log.meta, first, durable)?),
            None => None,
        };
        let mut meta = WalMeta { term_history, purged: position, truncate_from: Seqno(1) };
        meta.store(io, dir)?;
        let paths: Vec<(Seqno, PathBuf)> =
            log.segments.iter().map(|segment| (segment.first_seqno, segment.path.clone())).collect();
        finish_truncation(io, dir, &paths, &meta)?;
        let next = position.seqno.next();
        let path = dir.join(segment_file_name(next));
        let active = io.open_append(&path).map_err(|err| Error::fatal("create segment", &path, err))?;
        io.sync_dir(dir).map_err(|err| Error::fatal("fsync WAL directory", dir, err))?;
        meta.truncate_from = Seqno::ZERO;
        meta.store(io, dir)?;

        self.active = active;
        self.active_len = 0;
        self.active_info = SegmentInfo { path, first_seqno: next, last_seqno: None, bytes: 0 };
        log.segments = vec![self.active_info.clone()];
        log.index.reset(next);
        self.history_term = meta.term_history.last().map_or(Term(0), |entry| entry.term);
        self.next_seqno = next;
        log.meta = meta;
        shared.durable.store(position.seqno.get(), Ordering::SeqCst);
        tracing::warn!(position = %position, quarantined = copied.as_ref().map_or(0, |c| c.batches), "reset the WAL to a snapshot position");
        let zero = TermSeqno { term: Term(0), seqno: Seqno::ZERO };
        Ok(QuarantineReport {
            path: copied.as_ref().map(|copied| copied.path.clone()),
            first: copied.as_ref().map_or(zero, |copied| copied.first),
            last: copied.as_ref().map_or(zero, |copied| copied.last),
            batches: copied.as_ref().map_or(0, |copied| copied.batches),
            bytes: copied.as_ref().map_or(0, |copied| copied.bytes),
            durable: position,
        })
    }
}

/// Checks a reset's term history against its position; keeps the entries through it.
fn reset_history(position: TermSeqno, mut term_history: Vec<TermSeqno>) -> Result<Vec<TermSeqno>, String> {
    term_history.retain(|entry| entry.seqno <= position.seqno);
    if term_history.len() > TERM_HISTORY_LEN_MAX {
        return Err(format!("{} term history entries is over the maximum", term_history.len()));
    }
    for pair in term_history.windows(2) {
        if pair[1].term <= pair[0].term || pair[1].seqno <= pair[0].seqno {
            return Err(format!("term history is not increasing at {} after {}", pair[1], pair[0]));
        }
    }
    if term_history.first().is_some_and(|entry| entry.seqno == Seqno::ZERO || entry.term == Term(0)) {
        return Err("term history entries start at seqno 1 and term 1".to_string());
    }
    let meta = WalMeta { term_history, purged: position, truncate_from: Seqno::ZERO };
    let term = if position.seqno == Seqno::ZERO { Term(0) } else { meta.term_at(position.seqno) };
    if term != position.term {
        return Err(format!(
            "the term history puts term {term} at seqno {}, not {}",
            position.seqno, position.term
        ));
    }
    Ok(meta.term_history)
}

/// Copies the durable batches from `from` to `durable` into a new quarantine file, durably.
fn write_quarantine(
    shared: &Shared,
    segments: &[SegmentInfo],
    meta: &WalMeta,
    from: Seqno,
    durable: Seqno,
) -> Result<Copied, Error> {
    let (io, dir) = (shared.io.as_ref(), &shared.config.dir);
    let quarantine_dir = dir.join(QUARANTINE_DIR_NAME);
    io.create_dir_all(&quarantine_dir)
        .map_err(|err| Error::fatal("create quarantine directory", &quarantine_dir, err))?;
    io.sync_dir(dir).map_err(|err| Error::fatal("fsync WAL directory", dir, err))?;
    let name = format!("{}-{}-{}-{}", meta.term_at(from).get(), from, durable, shared.clock.now_ms());
    let path = quarantine_dir.join(format!("{name}{QUARANTINE_SUFFIX}"));
    let tmp = quarantine_dir.join(format!("{name}{QUARANTINE_TMP_SUFFIX}"));
    let mut file = io.open_append(&tmp).map_err(|err| Error::fatal("create quarantine file", &tmp, err))?;
    file.truncate(0).map_err(|err| Error::fatal("truncate quarantine file", &tmp, err))?;
    let mut copied = Copied {
        path,
        first: TermSeqno { term: meta.term_at(from), seqno: from },
        last: TermSeqno { term: Term(0), seqno: durable },
        batches: 0,
        bytes: 0,
    };
    for segment in segments.iter().filter(|segment| segment.last_seqno.is_some_and(|last| last >= from)) {
        let bytes = io
            .read_prefix(&segment.path, segment.bytes)
            .map_err(|err| Error::io("read segment", &segment.path, err))?;
        let (mut offset, mut start) = (0usize, None);
        while offset < bytes.len() {
            let batch = decode_batch(&bytes[offset..])
                .map_err(|err| Error::corrupt(&segment.path, offset as u64, err.to_string()))?;
            if batch.header.first_seqno >= from {
                start.get_or_insert(offset);
                copied.batches += 1;
                copied.last.term = batch.header.term;
            }
            offset += batch.encoded.len();
        }
        if let Some(start) = start {
            file.write_all(&bytes[start..])
                .map_err(|err| Error::fatal("write quarantine file", &tmp, err))?;
            copied.bytes += (bytes.len() - start) as u64;
        }
    }
    file.sync_data().map_err(|err| Error::fatal("fsync quarantine file", &tmp, err))?;
    drop(file);
    io.rename(&tmp, &copied.path).map_err(|err| Error::fatal("rename quarantine file", &copied.path, err))?;
    io.sync_dir(&quarantine_dir)
        .map_err(|err| Error::fatal("fsync quarantine directory", &quarantine_dir, err))?;
    Ok(copied)
}

/// Carries out `meta.truncate_from` on the segment files: removes the segments above the cut (all
/// of them if the cut is at or below the purge point: a reset) and cuts the one holding it at the
/// batch's offset. Idempotent, so recovery can finish what a crash interrupted. Returns the new
/// length of the cut segment, if it held the cut as a batch boundary.
pub(crate) fn finish_truncation(
    io: &dyn FileIo,
    dir: &Path,
    segment_paths: &[(Seqno, PathBuf)],
    meta: &WalMeta,
) -> Result<Option<u64>, Error> {
    let cut = meta.truncate_from;
    let remove_all = cut <= meta.purged.seqno;
    let mut removed = false;
    for (first, path) in segment_paths.iter().rev() {
        if remove_all || *first > cut {
            match io.remove_file(path) {
                Ok(()) => removed = true,
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => return Err(Error::fatal("remove truncated segment", path, err)),
            }
        }
    }
    if removed {
        io.sync_dir(dir).map_err(|err| Error::fatal("fsync WAL directory", dir, err))?;
    }
    let holding = segment_paths.iter().rev().find(|(first, _)| *first <= cut);
    let Some((first, path)) = holding.filter(|_| !remove_all) else {
        return Ok(None);
    };
    let bytes = io.read_all(path).map_err(|err| Error::io("read segment", path, err))?;
    let Some(offset) = batch_offset(&bytes, *first, cut) else {
        return Ok(None);
    };
    if offset < bytes.len() as u64 {
        let mut file = io.open_append(path).map_err(|err| Error::fatal("open segment", path, err))?;
        file.truncate(offset).map_err(|err| Error::fatal("truncate segment", path, err))?;
        file.sync_data().map_err(|err| Error::fatal("fsync segment", path, err))?;
    }
    Ok(Some(offset))
}

/// The offset of the batch starting at `cut` in a segment starting at `first`, walking verified
/// batches; the end of the segment if the batches end right before `cut`; `None` otherwise.
fn batch_offset(bytes: &[u8], first: Seqno, cut: Seqno) -> Option<u64> {
    let (mut offset, mut next) = (0usize, first);
    loop {
        if next == cut {
            return Some(offset as u64);
        }
        if next > cut || offset >= bytes.len() {
            return None;
        }
        let batch = decode_batch(&bytes[offset..]).ok()?;
        if batch.header.first_seqno != next {
            return None;
        }
        next = batch.header.last_seqno().next();
        offset += batch.encoded.len();
    }
}

/// Removes quarantine files a crash left half-written.
/// What the quarantine directory holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuarantineSummary {
    /// Quarantine files.
    pub files: u64,
    /// Seqnos they cover (from their names `<term>-<first>-<last>-<unix ms>.wal`).
    pub seqnos: u64,
}

/// Summarizes the quarantine directory of the WAL in `dir` (empty if there is none). Files whose
/// names do not parse count as files covering no seqno.
pub fn quarantine_summary(dir: &Path) -> std::io::Result<QuarantineSummary> {
    let mut summary = QuarantineSummary::default();
    let entries = match std::fs::read_dir(dir.join(QUARANTINE_DIR_NAME)) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(summary),
        Err(error) => return Err(error),
    };
    for entry in entries {
        let name = entry?.file_name();
        let Some(stem) = name.to_str().and_then(|name| name.strip_suffix(QUARANTINE_SUFFIX)) else {
            continue;
        };
        summary.files += 1;
        let parts: Vec<u64> = stem.split('-').filter_map(|part| part.parse().ok()).collect();
        if let [_term, first, last, _ms] = parts[..] {
            summary.seqnos += last.saturating_sub(first) + 1;
        }
    }
    Ok(summary)
}

pub(crate) fn remove_incomplete_quarantine_files(io: &dyn FileIo, dir: &Path) -> Result<(), Error> {
    let quarantine_dir = dir.join(QUARANTINE_DIR_NAME);
    let Ok(paths) = io.list_dir(&quarantine_dir) else {
        return Ok(());
    };
    let mut removed = false;
    for path in paths {
        if path.to_str().is_some_and(|name| name.ends_with(QUARANTINE_TMP_SUFFIX)) {
            tracing::info!(path = %path.display(), "removing an incomplete quarantine file");
            io.remove_file(&path)
                .map_err(|err| Error::io("remove incomplete quarantine file", &path, err))?;
            removed = true;
        }
    }
    if removed {
        io.sync_dir(&quarantine_dir)
            .map_err(|err| Error::fatal("fsync quarantine directory", &quarantine_dir, err))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn quarantine_summary_counts_files_and_seqnos_from_their_names() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(quarantine_summary(dir.path()).unwrap(), QuarantineSummary::default());
        let q = dir.path().join(QUARANTINE_DIR_NAME);
        std::fs::create_dir_all(&q).unwrap();
        std::fs::write(q.join("1-101-105-1700000000000.wal"), b"x").unwrap();
        std::fs::write(q.join("2-7-7-1700000000001.wal"), b"x").unwrap();
        std::fs::write(q.join("garbage.wal"), b"x").unwrap();
        std::fs::write(q.join("3-1-2-1700000000002.wal.tmp"), b"x").unwrap();
        assert_eq!(quarantine_summary(dir.path()).unwrap(), QuarantineSummary { files: 3, seqnos: 6 });
    }
}
