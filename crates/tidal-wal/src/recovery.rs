//! Recovery on open: scan every retained segment, verify every batch and the seqno chain, cut a torn
//! tail of the last segment, and rebuild what the writer needs to continue.
//!
//! Delicate:
//! - Only the end of the LAST segment may be torn (see [`crate::segment`]); anything else that fails
//!   to verify is corruption and the WAL refuses to open, naming the file and offset.
//! - The last segment is fsynced after the scan: bytes that were written but never fsynced before a
//!   process crash may still sit in the page cache, and are only durable once we fsync them.
//! - `wal.meta` holds the term history and purge point. Segments wholly at or below the purge point
//!   are leftovers of an interrupted purge and are removed. The term history is rebuilt from the scan
//!   for the retained range (the scan is the truth there) and kept from the file below it.
//! - A truncation (quarantine or reset) that a crash interrupted is recorded in `wal.meta` as
//!   `truncate_from`; it is finished FIRST, before anything else looks at the segments, and the meta
//!   file is then written again without it. Half-written quarantine files (`.wal.tmp`) are removed.
//! - The batch index is built from the same scan: 8 bytes per retained batch.
//! - Preallocation (decisions/017): zeros after the last batch of the last segment are its logical
//!   end, not a tail to cut; so is the end mark the writer leaves there (decisions/058). A torn
//!   tail is cut (the file is truncated there, so no leftover of an unsynced write can ever line
//!   up with a later batch). A last batch that was written whole and fails its seal is corruption,
//!   never a torn tail: the end mark after it, or the end of the file right after it, tells (see
//!   [`crate::segment`]). The open writes the mark after the last batch again before anything else. A prepared next segment (`segment.prep`)
//!   is kept when it holds only zeros (it never holds a batch) and preparation goes on from its
//!   length; otherwise it is removed. Then the active segment is filled with zeros up to the
//!   preallocated size and fsynced, before the writer starts.
//! - `segment.ready` is a completely prepared next segment (decisions/033): renamed from
//!   `segment.prep` only after every zero in it was written and fsynced, so an open trusts it
//!   without reading it. If the last segment ends clean at its file length (a clean shutdown cut
//!   it there), the open takes `segment.ready` as the next segment (a rename, as a rotation does)
//!   instead of filling the last one with zeros again: a clean restart writes no zeros. Otherwise
//!   it stays the prepared next segment.

use std::path::PathBuf;

use tidal_types::{Seqno, Term, TermSeqno};

use crate::batch_index::BatchIndex;
use crate::config::WalConfig;
use crate::error::Error;
use crate::io::{FileIo, WalFile};
use crate::quarantine::{finish_truncation, remove_incomplete_quarantine_files};
use crate::segment::{
    end_mark, parse_segment_file_name, scan_segment, segment_file_name, ScanEnd, SegmentInfo, SegmentScan,
    END_MARK_LEN, PREP_FILE_NAME, READY_FILE_NAME,
};
use crate::wal_meta::{WalMeta, META_FILE_NAME, META_TMP_FILE_NAME};

/// What recovery found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recovery {
    /// The durable frontier: last seqno of the last verified batch (or the purge point if none).
    pub durable: Seqno,
    /// Term of the last batch (or of the purge point, or of the last history entry).
    pub last_term: Term,
    /// Logged time of the last batch (0 if no batch is retained).
    pub last_time_ms: u64,
    /// Retained segments.
    pub segments: usize,
    /// Verified batches.
    pub batches: u64,
    /// Bytes of verified batches.
    pub bytes: u64,
    /// The torn tail that was cut, if any.
    pub truncated: Option<TornTail>,
}

/// A torn tail cut from the last segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TornTail {
    /// The segment.
    pub path: PathBuf,
    /// Where the torn bytes started (the new length of the file).
    pub offset: u64,
    /// How many bytes were cut.
    pub bytes_dropped: u64,
}

/// A `segment.prep` kept at open, and its length (zeros up to it).
pub(crate) type KeptPrep = (Box<dyn WalFile>, u64);

/// The next segment an open kept: complete (`segment.ready`) or half prepared (`segment.prep`).
pub(crate) enum KeptNext {
    /// `segment.ready`: every zero fsynced; its length.
    Ready(Box<dyn WalFile>, u64),
    /// `segment.prep`: zeros up to its length, checked at open.
    Prep(Box<dyn WalFile>, u64),
}

/// Everything the writer and the handles start from.
pub(crate) struct Recovered {
    pub(crate) recovery: Recovery,
    pub(crate) segments: Vec<SegmentInfo>,
    pub(crate) meta: WalMeta,
    pub(crate) active: Box<dyn WalFile>,
    /// The active segment's length on disk (its logical length plus preallocated zeros).
    pub(crate) active_len: u64,
    pub(crate) next_seqno: Seqno,
    pub(crate) index: BatchIndex,
    /// The next segment as the last run left it: `segment.ready` (complete), or `segment.prep`
    /// (zeros only, not longer than the preallocated size), which the writer goes on preparing
    /// instead of starting over.
    pub(crate) next: Option<KeptNext>,
    /// The active segment is the `segment.ready` the last run left (no zeros written at open).
    pub(crate) took_ready: bool,
}

/// What scanning the segments found.
struct ScanTotals {
    segments: Vec<SegmentInfo>,
    next_seqno: Seqno,
    last_term: Term,
    last_time_ms: u64,
    batches: u64,
    term_starts: Vec<TermSeqno>,
    torn: Option<TornTail>,
    index: BatchIndex,
    /// Sealed segments followed by zeros, and their logical lengths.
    unsealed: Vec<(PathBuf, u64)>,
}

pub(crate) fn recover(config: &WalConfig, io: &dyn FileIo) -> Result<Recovered, Error> {
    let dir = &config.dir;
    io.create_dir_all(dir).map_err(|err| Error::io("create WAL directory", dir, err))?;
    let paths = io.list_dir(dir).map_err(|err| Error::io("list WAL directory", dir, err))?;
    let tmp = dir.join(META_TMP_FILE_NAME);
    if paths.contains(&tmp) {
        io.remove_file(&tmp).map_err(|err| Error::io("remove leftover meta file", &tmp, err))?;
    }
    let ready = dir.join(READY_FILE_NAME);
    let ready_kept = if paths.contains(&ready) { keep_ready(config, io, &ready)? } else { None };
    let prep = dir.join(PREP_FILE_NAME);
    let prep_kept = match (paths.contains(&prep), ready_kept.is_some()) {
        (false, _) => None,
        (true, false) => keep_prepared(config, io, &prep)?,
        (true, true) => {
            // Only one next segment is ever prepared; the complete one is kept.
            tracing::warn!(path = %prep.display(), "removing a prepared segment beside a ready one");
            io.remove_file(&prep).map_err(|err| Error::io("remove prepared segment", &prep, err))?;
            None
        }
    };
    let mut segment_paths: Vec<(Seqno, PathBuf)> = paths
        .into_iter()
        .filter_map(|path| parse_segment_file_name(&path).map(|first| (first, path)))
        .collect();
    segment_paths.sort();
    let stored_meta = WalMeta::load(io, dir)?;
    let mut meta = stored_meta.clone().unwrap_or_default();
    remove_incomplete_quarantine_files(io, dir)?;
    let truncation_pending = meta.truncate_from > Seqno::ZERO;
    if truncation_pending {
        tracing::warn!(truncate_from = %meta.truncate_from, "finishing a WAL truncation interrupted by a crash");
        finish_truncation(io, dir, &segment_paths, &meta)?;
        let remove_all = meta.truncate_from <= meta.purged.seqno;
        segment_paths.retain(|(first, _)| !remove_all && *first <= meta.truncate_from);
        meta.truncate_from = Seqno::ZERO;
    }
    remove_purged_leftovers(io, config, &mut segment_paths, meta.purged.seqno)?;
    check_start(config, &segment_paths, &meta, stored_meta.is_some())?;

    let mut totals = scan_segments(io, &segment_paths, &meta, scan_threads(), config.mark_spacing())?;
    for (path, len) in &totals.unsealed {
        tracing::warn!(segment = %path.display(), len, "cutting the zeros off a sealed segment");
        let mut file = io.open_append(path).map_err(|err| Error::io("open segment", path, err))?;
        file.truncate(*len).map_err(|err| Error::fatal("seal segment", path, err))?;
        file.sync_data().map_err(|err| Error::fatal("fsync segment", path, err))?;
    }
    // The active segment and length, the next segment kept, and whether the ready one was taken.
    let (active, active_len, next, took_ready) = match ready_kept {
        Some((file, len)) if len >= config.preallocate_len() && ends_at_file_length(io, &totals)? => {
            let (active, active_len) = take_ready(io, config, &mut totals, file, len)?;
            (active, active_len, None, true)
        }
        // Not taken now: it stays the next segment (a rotation takes it).
        Some((file, len)) => {
            let (active, active_len) = open_active(io, config, &totals)?;
            (active, active_len, Some(KeptNext::Ready(file, len)), false)
        }
        None => {
            let (active, active_len) = open_active(io, config, &totals)?;
            (active, active_len, prep_kept.map(|(file, len)| KeptNext::Prep(file, len)), false)
        }
    };

    let retained_first = totals.segments.first().map_or(totals.next_seqno, |segment| segment.first_seqno);
    let mut term_history: Vec<TermSeqno> =
        meta.term_history.iter().copied().filter(|entry| entry.seqno < retained_first).collect();
    term_history.extend_from_slice(&totals.term_starts);
    if stored_meta.is_none() || truncation_pending || term_history != meta.term_history {
        if stored_meta.is_some() {
            tracing::warn!(?term_history, stored = ?meta.term_history, "rebuilt the term history from the segments");
        }
        meta.term_history = term_history;
        meta.store(io, dir)?;
    }
    let last_term = totals.last_term.max(meta.term_history.last().map_or(Term(0), |entry| entry.term));
    let segments = totals.segments;
    let recovery = Recovery {
        durable: Seqno(totals.next_seqno.get() - 1),
        last_term,
        last_time_ms: totals.last_time_ms,
        segments: segments.len(),
        batches: totals.batches,
        bytes: segments.iter().map(|segment| segment.bytes).sum(),
        truncated: totals.torn,
    };
    Ok(Recovered {
        recovery,
        segments,
        meta,
        active,
        active_len,
        next_seqno: totals.next_seqno,
        index: totals.index,
        next,
        took_ready,
    })
}

/// A `segment.ready` found at open: kept, without reading it, if preallocation is on and it is not
/// longer than the preallocated size (the configuration may have changed); else removed.
fn keep_ready(
    config: &WalConfig,
    io: &dyn FileIo,
    path: &std::path::Path,
) -> Result<Option<KeptPrep>, Error> {
    let target = config.preallocate_len();
    if target > 0 {
        let (file, len) = open_with_len(io, path)?;
        if len <= target {
            return Ok(Some((file, len)));
        }
    }
    tracing::info!(path = %path.display(), "removing a kept prepared segment that is not used");
    io.remove_file(path).map_err(|err| Error::io("remove prepared segment", path, err))?;
    Ok(None)
}

/// Opens a WAL file for writing, with its length on disk.
fn open_with_len(io: &dyn FileIo, path: &std::path::Path) -> Result<(Box<dyn WalFile>, u64), Error> {
    let file = io.open_append(path).map_err(|err| Error::io("open WAL file", path, err))?;
    let len = file.len().map_err(|err| Error::io("read WAL file length", path, err))?;
    Ok((file, len))
}

/// Whether the last segment ended clean exactly at its file's length (a clean shutdown cut it
/// there): no torn tail, no zeros after its last batch.
fn ends_at_file_length(io: &dyn FileIo, totals: &ScanTotals) -> Result<bool, Error> {
    let Some(last) = totals.segments.last() else { return Ok(false) };
    if totals.torn.is_some() {
        return Ok(false);
    }
    Ok(open_with_len(io, &last.path)?.1 == last.bytes)
}

/// Makes the kept `segment.ready` the active segment, as a rotation would: renamed to the next
/// segment's name (or over the last segment if that one holds no batch), then the directory
/// fsynced. Its zeros were fsynced before it got its name, so nothing else is written.
fn take_ready(
    io: &dyn FileIo,
    config: &WalConfig,
    totals: &mut ScanTotals,
    file: Box<dyn WalFile>,
    len: u64,
) -> Result<(Box<dyn WalFile>, u64), Error> {
    let ready = config.dir.join(READY_FILE_NAME);
    let empty_last =
        totals.segments.last().filter(|last| last.last_seqno.is_none()).map(|last| last.path.clone());
    let path = match empty_last {
        Some(path) => path,
        None => {
            let path = config.dir.join(segment_file_name(totals.next_seqno));
            totals.segments.push(SegmentInfo {
                path: path.clone(),
                first_seqno: totals.next_seqno,
                last_seqno: None,
                bytes: 0,
            });
            path
        }
    };
    io.rename(&ready, &path).map_err(|err| Error::fatal("rename prepared segment", &path, err))?;
    io.sync_dir(&config.dir).map_err(|err| Error::fatal("fsync WAL directory", &config.dir, err))?;
    tracing::info!(segment = %path.display(), len, "took the prepared segment a clean shutdown kept");
    Ok((file, len))
}

/// A `segment.prep` found at open: kept (and fsynced once more) if preallocation is on, it holds
/// only zeros and it is not longer than the preallocated size; else removed. Only zeros are ever
/// written to it (a rotation renames it and fsyncs the directory before the first batch goes in),
/// so this check is a guard, not a repair. Keeping it spares a restart (a follower that crashed
/// and must catch up) rewriting and fsyncing up to a whole segment of zeros before it serves.
fn keep_prepared(
    config: &WalConfig,
    io: &dyn FileIo,
    path: &std::path::Path,
) -> Result<Option<KeptPrep>, Error> {
    let target = config.preallocate_len();
    let kept = if target == 0 {
        None
    } else {
        let (mut file, len) = open_with_len(io, path)?;
        let zeros = len <= target
            && io.is_zero_prefix(path, len).map_err(|err| Error::io("read prepared segment", path, err))?;
        if zeros {
            file.sync_data().map_err(|err| Error::io("fsync prepared segment", path, err))?;
            Some((file, len))
        } else {
            tracing::warn!(path = %path.display(), len, "removing a prepared segment that is not zeros of at most the preallocated size");
            None
        }
    };
    if kept.is_none() {
        io.remove_file(path).map_err(|err| Error::io("remove prepared segment", path, err))?;
    }
    Ok(kept)
}

/// Removes segments wholly at or below the purge point (an interrupted purge); never the last one.
fn remove_purged_leftovers(
    io: &dyn FileIo,
    config: &WalConfig,
    segment_paths: &mut Vec<(Seqno, PathBuf)>,
    purged: Seqno,
) -> Result<(), Error> {
    let mut removed = 0;
    while segment_paths.len() > removed + 1 && segment_paths[removed + 1].0 <= purged.next() {
        let path = &segment_paths[removed].1;
        tracing::info!(segment = %path.display(), "removing a segment left over by an interrupted purge");
        io.remove_file(path).map_err(|err| Error::io("remove purged segment", path, err))?;
        removed += 1;
    }
    if removed > 0 {
        segment_paths.drain(..removed);
        io.sync_dir(&config.dir).map_err(|err| Error::fatal("fsync WAL directory", &config.dir, err))?;
    }
    Ok(())
}

/// The first segment must start right after the purge point.
fn check_start(
    config: &WalConfig,
    segment_paths: &[(Seqno, PathBuf)],
    meta: &WalMeta,
    meta_exists: bool,
) -> Result<(), Error> {
    let Some((first, path)) = segment_paths.first() else {
        return Ok(());
    };
    let expected = meta.purged.seqno.next();
    if !meta_exists && *first != Seqno(1) {
        let reason = format!("{META_FILE_NAME} is missing but the first segment starts at seqno {first}");
        return Err(Error::corrupt(config.dir.join(META_FILE_NAME), 0, reason));
    }
    if *first != expected {
        let reason = format!(
            "the first segment starts at seqno {first} but the purge point is {}: segments are missing",
            meta.purged.seqno
        );
        return Err(Error::corrupt(path, 0, reason));
    }
    Ok(())
}

fn scan_segments(
    io: &dyn FileIo,
    segment_paths: &[(Seqno, PathBuf)],
    meta: &WalMeta,
    threads: usize,
    mark_spacing: u64,
) -> Result<ScanTotals, Error> {
    let mut totals = ScanTotals {
        segments: Vec::with_capacity(segment_paths.len()),
        next_seqno: meta.purged.seqno.next(),
        last_term: if meta.purged.seqno > Seqno::ZERO { meta.purged.term } else { Term(0) },
        last_time_ms: 0,
        batches: 0,
        term_starts: Vec::new(),
        torn: None,
        index: BatchIndex::new(meta.purged.seqno.next(), mark_spacing),
        unsealed: Vec::new(),
    };
    let mut prescans = prescan(io, segment_paths, threads);
    for (index, (first, path)) in segment_paths.iter().enumerate() {
        if *first != totals.next_seqno {
            let reason =
                format!("segment name says seqno {first} but the WAL continues at {}", totals.next_seqno);
            return Err(Error::corrupt(path, 0, reason));
        }
        let is_last = index + 1 == segment_paths.len();
        let read_error = |err| Error::io("read segment", path, err);
        let prescan = match prescans.get_mut(index).and_then(Option::take) {
            Some(Ok(prescan)) => prescan.continuing(*first, totals.last_term),
            Some(Err(err)) => return Err(read_error(err)),
            None => None,
        };
        let SegmentRead { scan, file_len, bytes_len } = match prescan {
            Some(read) => read,
            None => {
                read_and_scan(io, path, totals.next_seqno, totals.last_term, is_last).map_err(read_error)?
            }
        };
        match scan.end {
            ScanEnd::Clean => {}
            ScanEnd::Torn { offset } => {
                totals.torn = Some(TornTail { path: path.clone(), offset, bytes_dropped: file_len - offset });
            }
            ScanEnd::Corrupt { offset, reason } => return Err(Error::corrupt(path, offset, reason)),
        }
        if !is_last && scan.batches == 0 {
            return Err(Error::corrupt(path, 0, "empty segment before the last one"));
        }
        if !is_last && scan.valid_len < bytes_len {
            // Zeros after the batches of a sealed segment: its cut at rotation did not reach the disk.
            // Finished once every segment verified (the next one must continue the seqnos).
            totals.unsealed.push((path.clone(), scan.valid_len));
        }
        let last_seqno = (scan.batches > 0).then(|| Seqno(scan.next_seqno.get() - 1));
        totals.segments.push(SegmentInfo {
            path: path.clone(),
            first_seqno: *first,
            last_seqno,
            bytes: scan.valid_len,
        });
        for (at, (first, offset)) in scan.batch_starts.iter().enumerate() {
            let next = scan.batch_starts.get(at + 1).map_or(scan.next_seqno, |(next, _)| *next);
            totals.index.push(*first, Seqno(next.get() - 1), *offset);
        }
        totals.next_seqno = scan.next_seqno;
        totals.last_term = scan.last_term;
        totals.last_time_ms = scan.last_time_ms.unwrap_or(totals.last_time_ms);
        totals.batches += scan.batches;
        totals.term_starts.extend(scan.term_starts);
    }
    Ok(totals)
}

/// At most this many threads verify segments at open (each holds one segment in memory).
const MAX_SCAN_THREADS: usize = 4;

/// A segment read and scanned.
struct SegmentRead {
    scan: SegmentScan,
    /// The file's length.
    file_len: u64,
    /// The bytes read (the file's length without the preallocated zeros only counted).
    bytes_len: u64,
}

impl SegmentRead {
    /// This scan, made from the seqno the file's name gives and term 0 (before the segments ahead
    /// were scanned), as the scan in order from (`first`, `term`) would have ended; None when that
    /// cannot be told from it (no batch verified, or the first batch's term is below `term`:
    /// corruption, which the scan in order then reports).
    fn continuing(mut self, first: Seqno, term: Term) -> Option<SegmentRead> {
        // From term 0, the scan recorded the first batch's term as a term start if it is above 0;
        // the scan in order records it only if it is above `term`. The batches after it scan the
        // same either way.
        let first_term = self.scan.first_term?;
        if first_term < term {
            return None;
        }
        if first_term > Term(0) && first_term == term {
            debug_assert_eq!(self.scan.term_starts.first(), Some(&TermSeqno { term, seqno: first }));
            self.scan.term_starts.remove(0);
        }
        Some(self)
    }
}

/// Reads and scans one segment whose first batch must start at `first` and whose terms may not go
/// below `term`. The last segment's preallocated zeros are counted, not read into memory; a scan
/// that does not end cleanly on the trimmed bytes (a batch may run into the zeros) reads it all
/// again.
fn read_and_scan(
    io: &dyn FileIo,
    path: &std::path::Path,
    first: Seqno,
    term: Term,
    is_last: bool,
) -> std::io::Result<SegmentRead> {
    let (mut bytes, mut zeros) = if is_last { io.read_zero_trimmed(path)? } else { (io.read_all(path)?, 0) };
    let mut scan = scan_segment(&bytes, first, term, is_last);
    if zeros > 0 && !matches!(scan.end, ScanEnd::Clean) {
        (bytes, zeros) = (io.read_all(path)?, 0);
        scan = scan_segment(&bytes, first, term, is_last);
    }
    Ok(SegmentRead { scan, file_len: bytes.len() as u64 + zeros, bytes_len: bytes.len() as u64 })
}

/// Threads that verify segments at open: one per core, at most [`MAX_SCAN_THREADS`].
fn scan_threads() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get).min(MAX_SCAN_THREADS)
}

/// Reads and scans every segment on up to `threads` threads, each from the seqno its name gives and
/// term 0 (the term it may not go below is only known once the segments ahead are scanned):
/// verifying the checksums of a large WAL is most of what recovery costs. One result per segment,
/// in order; None for all when one thread would do it (the scan in order reads them itself).
fn prescan(
    io: &dyn FileIo,
    segments: &[(Seqno, PathBuf)],
    threads: usize,
) -> Vec<Option<std::io::Result<SegmentRead>>> {
    let threads = threads.min(segments.len());
    if threads <= 1 {
        return segments.iter().map(|_| None).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<std::sync::Mutex<Option<std::io::Result<SegmentRead>>>> =
        segments.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let index = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((first, path)) = segments.get(index) else { break };
                let is_last = index + 1 == segments.len();
                let read = read_and_scan(io, path, *first, Term(0), is_last);
                *results[index].lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(read);
            });
        }
    });
    results
        .into_iter()
        .map(|slot| slot.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner))
        .collect()
}

/// Opens the last segment for writing (cutting a torn tail), or creates the first; writes the end
/// mark after its last batch, if it has one; fills it with zeros up to the preallocated size;
/// fsyncs. Returns it and its length on disk.
fn open_active(
    io: &dyn FileIo,
    config: &WalConfig,
    totals: &ScanTotals,
) -> Result<(Box<dyn WalFile>, u64), Error> {
    let Some(last) = totals.segments.last() else {
        let path = config.dir.join(segment_file_name(totals.next_seqno));
        let mut file = io.open_append(&path).map_err(|err| Error::io("create segment", &path, err))?;
        let len = file.len().map_err(|err| Error::io("stat segment", &path, err))?;
        let len = fill_zeros(file.as_mut(), &path, len, config.preallocate_len())?;
        file.sync_data().map_err(|err| Error::fatal("fsync segment", &path, err))?;
        io.sync_dir(&config.dir).map_err(|err| Error::fatal("fsync WAL directory", &config.dir, err))?;
        return Ok((file, len));
    };
    let path = &last.path;
    let mut file = io.open_append(path).map_err(|err| Error::io("open segment", path, err))?;
    let mut len = file.len().map_err(|err| Error::io("stat segment", path, err))?;
    if let Some(torn) = &totals.torn {
        tracing::warn!(
            segment = %torn.path.display(),
            offset = torn.offset,
            bytes_dropped = torn.bytes_dropped,
            "truncating a torn write at the end of the WAL"
        );
        file.truncate(torn.offset).map_err(|err| Error::fatal("truncate torn segment tail", path, err))?;
        len = torn.offset;
    }
    if last.last_seqno.is_some() {
        // The end mark after the last batch (decisions/058), before the zeros: a crash in the
        // middle of this preparation that kept any zero after the batch kept the mark too.
        let mark = end_mark(last.bytes, totals.next_seqno);
        file.write_all_at(last.bytes, &mark)
            .map_err(|err| Error::fatal("write segment end mark", path, err))?;
        len = len.max(last.bytes + END_MARK_LEN as u64);
    }
    let len = fill_zeros(file.as_mut(), path, len, config.preallocate_len())?;
    file.sync_data().map_err(|err| Error::fatal("fsync segment", path, err))?;
    Ok((file, len))
}

/// Bytes of zeros written per call while preparing a segment.
pub(crate) const ZERO_CHUNK_LEN: usize = 1 << 20;

/// Writes zeros from `from` up to `to` (nothing if `to <= from`); returns the new length. The caller
/// fsyncs.
pub(crate) fn fill_zeros(
    file: &mut dyn WalFile,
    path: &std::path::Path,
    from: u64,
    to: u64,
) -> Result<u64, Error> {
    let zeros = vec![0u8; ZERO_CHUNK_LEN.min(usize::try_from(to.saturating_sub(from)).unwrap_or(usize::MAX))];
    let mut at = from;
    while at < to {
        let len = zeros.len().min(usize::try_from(to - at).unwrap_or(usize::MAX));
        file.write_all_at(at, &zeros[..len]).map_err(|err| Error::fatal("preallocate segment", path, err))?;
        at += len as u64;
    }
    Ok(at.max(from))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::encode_batch;
    use crate::sim_io::SimIo;
    use tidal_types::RecordKind;

    const DIR: &str = "/data/wal";

    /// Writes segments of (term, batch count) runs; each batch holds 2 events. Returns their
    /// (first seqno, path), in order.
    fn write_segments(io: &SimIo, segments: &[&[(u64, usize)]]) -> Vec<(Seqno, PathBuf)> {
        let mut next = Seqno(1);
        let mut paths = Vec::new();
        for runs in segments {
            let path = PathBuf::from(DIR).join(segment_file_name(next));
            paths.push((next, path.clone()));
            let mut bytes = Vec::new();
            for &(term, count) in *runs {
                for _ in 0..count {
                    let payload = next.get().to_le_bytes().repeat(4);
                    bytes.extend(encode_batch(RecordKind::Signal, Term(term), next, 2, &payload));
                    next = Seqno(next.get() + 2);
                }
            }
            io.write_file(&path, &bytes);
        }
        paths
    }

    /// The scan's findings, comparable.
    fn findings(totals: &ScanTotals) -> impl PartialEq + std::fmt::Debug {
        (
            totals.segments.clone(),
            totals.next_seqno,
            totals.last_term,
            totals.batches,
            totals.term_starts.clone(),
            totals.index.clone(),
            totals.unsealed.clone(),
            totals.torn.clone(),
        )
    }

    fn both(
        io: &SimIo,
        paths: &[(Seqno, PathBuf)],
    ) -> (Result<ScanTotals, Error>, Result<ScanTotals, Error>) {
        let meta = WalMeta::default();
        (scan_segments(io, paths, &meta, 1, 64), scan_segments(io, paths, &meta, 3, 64))
    }

    #[test]
    fn the_parallel_scan_finds_what_the_scan_in_order_finds() {
        let io = SimIo::new();
        // Term 0 (a WAL no term was ever set on), a term that goes on over a boundary, one that
        // changes inside a segment, one that changes exactly at a boundary (and inside the last).
        let paths = write_segments(
            &io,
            &[&[(0, 1)], &[(0, 1), (1, 1)], &[(1, 1), (2, 2)], &[(4, 2)], &[(4, 3)], &[(4, 1), (5, 1)]],
        );
        let (in_order, parallel) = both(&io, &paths);
        let (in_order, parallel) = (in_order.unwrap(), parallel.unwrap());
        assert_eq!(findings(&in_order), findings(&parallel));
        assert_eq!(
            parallel.term_starts,
            [(1, 5), (2, 9), (4, 13), (5, 25)]
                .map(|(term, seqno)| TermSeqno { term: Term(term), seqno: Seqno(seqno) })
        );
        assert_eq!(parallel.batches, 13);
        assert_eq!(parallel.next_seqno, Seqno(27));
        // Every segment's parallel scan stood (none was done again in order).
        let mut term = Term(0);
        for ((first, path), read) in paths.iter().zip(prescan(&io, &paths, 3)) {
            let read = read.unwrap().unwrap().continuing(*first, term);
            term = read.unwrap_or_else(|| panic!("{} was scanned again", path.display())).scan.last_term;
        }
    }

    #[test]
    fn a_term_that_falls_at_a_segment_boundary_is_corruption_of_the_later_segment() {
        let io = SimIo::new();
        let paths = write_segments(&io, &[&[(1, 2)], &[(3, 2)], &[(2, 2)], &[(3, 1)]]);
        let (in_order, parallel) = both(&io, &paths);
        let (in_order, parallel) = (in_order.err().unwrap(), parallel.err().unwrap());
        assert_eq!(in_order.to_string(), parallel.to_string());
        let text = parallel.to_string();
        assert!(text.contains(&segment_file_name(Seqno(9))), "{text}");
        assert!(text.contains("below the previous term"), "{text}");
    }

    #[test]
    fn the_first_corrupt_segment_is_the_one_named() {
        let io = SimIo::new();
        let paths = write_segments(&io, &[&[(1, 2)], &[(1, 2)], &[(1, 2)], &[(1, 2)], &[(1, 1)]]);
        // Flip a payload bit in the second segment's second batch and one in the fourth segment.
        let batch_len = crate::batch::HEADER_LEN + 32;
        io.flip_bit(&paths[1].1, (batch_len as u64 + 70) * 8).unwrap();
        io.flip_bit(&paths[3].1, 70 * 8).unwrap();
        let (in_order, parallel) = both(&io, &paths);
        let (in_order, parallel) = (in_order.err().unwrap(), parallel.err().unwrap());
        assert_eq!(in_order.to_string(), parallel.to_string());
        let text = parallel.to_string();
        assert!(text.contains(&segment_file_name(Seqno(5))), "{text}");
        assert!(text.contains(&format!("offset {batch_len}")), "{text}");
    }

    #[test]
    fn a_torn_tail_and_an_empty_last_segment_are_found_by_both() {
        let io = SimIo::new();
        let paths = write_segments(&io, &[&[(1, 2)], &[(2, 3)]]);
        let mut bytes = io.file_bytes(&paths[1].1).unwrap();
        let whole = bytes.len();
        bytes.truncate(whole - 10);
        io.write_file(&paths[1].1, &bytes);
        let (in_order, parallel) = both(&io, &paths);
        let (in_order, parallel) = (in_order.unwrap(), parallel.unwrap());
        assert_eq!(findings(&in_order), findings(&parallel));
        let batch_len = (crate::batch::HEADER_LEN + 32) as u64;
        assert_eq!(
            parallel.torn,
            Some(TornTail { path: paths[1].1.clone(), offset: 2 * batch_len, bytes_dropped: batch_len - 10 })
        );
        // A last segment without a batch yet (a rotation just made it).
        let io = SimIo::new();
        let paths = write_segments(&io, &[&[(1, 2)], &[(1, 1)], &[]]);
        let (in_order, parallel) = both(&io, &paths);
        let (in_order, parallel) = (in_order.unwrap(), parallel.unwrap());
        assert_eq!(findings(&in_order), findings(&parallel));
        assert_eq!(parallel.next_seqno, Seqno(7));
    }

    #[test]
    fn zeros_after_a_sealed_segment_are_found_by_both() {
        let io = SimIo::new();
        let paths = write_segments(&io, &[&[(1, 2)], &[(1, 2)], &[(1, 1)]]);
        let mut bytes = io.file_bytes(&paths[1].1).unwrap();
        let logical = bytes.len() as u64;
        bytes.extend(vec![0u8; 4096]);
        io.write_file(&paths[1].1, &bytes);
        let (in_order, parallel) = both(&io, &paths);
        let (in_order, parallel) = (in_order.unwrap(), parallel.unwrap());
        assert_eq!(findings(&in_order), findings(&parallel));
        assert_eq!(parallel.unsealed, [(paths[1].1.clone(), logical)]);
    }
}
