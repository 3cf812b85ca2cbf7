//! [`WalReader`]: a read-only scan of durable batches from a seqno, for catch-up and replay;
//! [`RawReader`]: the same durable batches as runs of segment bytes, for serving a pull.
//!
//! Delicate: the reader takes a snapshot of the segment list and the durable frontier when it is
//! created and never reads past it, so it never sees bytes that are written but not yet fsynced. It
//! verifies every batch again (a disk can rot after recovery) and the seqno chain; only startup
//! replay ([`crate::Wal::read_recovered_from`]) skips the seals recovery checked in the same open.
//! A segment purged while the reader is on its way is reported as [`Error::Purged`]; a truncation
//! (quarantine, reset) since the reader was created, as [`Error::TruncatedWhileReading`], checked
//! after each segment read, so a reader never mixes batches of the old and the new log.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tidal_types::{Seqno, TermSeqno};

use crate::batch::{check_seal, decode_batch_unsealed, decode_header, Batch, DecodeError, HEADER_LEN};
use crate::error::Error;
use crate::segment::SegmentInfo;
use crate::shared::Shared;

/// What a reader reads, taken under the log lock at once.
pub(crate) struct ReadPlan {
    /// The retained segments from the one holding `from`.
    pub(crate) segments: Vec<SegmentInfo>,
    /// The first seqno wanted (at least 1).
    pub(crate) from: Seqno,
    /// The durable frontier the reader stops at.
    pub(crate) durable: Seqno,
    /// `Shared::truncations` when the plan was taken.
    pub(crate) truncations: u64,
    /// `(first seqno, offset)` of the batch to start at in the first segment, from the batch index's
    /// marks; `None`: the segment's start. The reader checks that the batch there starts at it.
    pub(crate) start: Option<(Seqno, u64)>,
}

/// Iterator of durable batches, starting with the batch that contains the requested seqno.
pub struct WalReader {
    shared: Arc<Shared>,
    segments: VecDeque<SegmentInfo>,
    from: Seqno,
    durable: Seqno,
    current: Option<OpenSegment>,
    next_seqno: Option<Seqno>,
    done: bool,
    /// `Shared::truncations` when the reader was created.
    truncations: u64,
    /// Batches up to here were verified by this process's recovery: their seals are not checked
    /// again ([`crate::Wal::read_recovered_from`]; `Seqno::ZERO` checks every seal).
    trusted_through: Seqno,
    /// Where to start in the first segment ([`ReadPlan::start`]); taken when it is opened.
    start: Option<(Seqno, u64)>,
}

struct OpenSegment {
    path: PathBuf,
    /// The segment's durable bytes from `base` on.
    bytes: Vec<u8>,
    /// File offset of `bytes[0]`.
    base: u64,
    offset: usize,
}

impl WalReader {
    pub(crate) fn new(shared: Arc<Shared>, plan: ReadPlan, trusted_through: Seqno) -> WalReader {
        WalReader {
            shared,
            segments: plan.segments.into(),
            from: plan.from,
            durable: plan.durable,
            current: None,
            next_seqno: None,
            done: false,
            truncations: plan.truncations,
            trusted_through,
            start: plan.start,
        }
    }

    /// The durable frontier this reader stops at.
    pub fn durable(&self) -> Seqno {
        self.durable
    }

    fn open_next_segment(&mut self) -> Result<bool, Error> {
        let Some(segment) = self.segments.pop_front() else {
            return Ok(false);
        };
        // Only the durable, logical part: the active segment's file goes on with preallocated zeros.
        let (first, base) = self.start.take().unwrap_or((segment.first_seqno, 0));
        let read = if base == 0 {
            self.shared.io.read_prefix(&segment.path, segment.bytes)
        } else {
            self.shared.io.read_range(&segment.path, base, segment.bytes.saturating_sub(base))
        };
        let bytes = checked_read(
            &self.shared,
            self.truncations,
            self.from,
            &segment.path,
            segment.first_seqno,
            read,
        )?;
        let durable_len = usize::try_from(segment.bytes.saturating_sub(base)).unwrap_or(usize::MAX);
        if bytes.len() < durable_len {
            let end = base + bytes.len() as u64;
            let reason = format!("segment is {end} bytes but {} were fsynced", segment.bytes);
            return Err(Error::corrupt(&segment.path, end, reason));
        }
        self.next_seqno = Some(first);
        self.current = Some(OpenSegment { path: segment.path, bytes, base, offset: 0 });
        Ok(true)
    }

    fn next_batch(&mut self) -> Result<Option<Batch>, Error> {
        loop {
            let current = match &mut self.current {
                Some(current) if current.offset < current.bytes.len() => current,
                _ => {
                    self.current = None;
                    if !self.open_next_segment()? {
                        return Ok(None);
                    }
                    continue;
                }
            };
            let offset = current.offset;
            let at = current.base + offset as u64;
            let corrupt = |err: DecodeError| Error::corrupt(&current.path, at, err.to_string());
            let batch = decode_batch_unsealed(&current.bytes[offset..]).map_err(corrupt)?;
            let header = batch.header;
            // Recovery checked this seal at open (`read_recovered_from`); anything else is checked here.
            let trusted = header.last_seqno() <= self.trusted_through;
            if !trusted {
                check_seal(&batch).map_err(corrupt)?;
            }
            if Some(header.first_seqno) != self.next_seqno {
                let expected = self.next_seqno.map_or_else(String::new, |seqno| seqno.to_string());
                let reason = format!("batch starts at seqno {}, expected {expected}", header.first_seqno);
                return Err(Error::corrupt(&current.path, at, reason));
            }
            current.offset += batch.encoded.len();
            self.next_seqno = Some(header.last_seqno().next());
            if header.first_seqno > self.durable {
                return Ok(None);
            }
            if header.last_seqno() < self.from {
                continue;
            }
            let encoded = bytes::Bytes::copy_from_slice(batch.encoded);
            let batch = if trusted { Batch::from_recovered(encoded) } else { Batch::from_verified(encoded) };
            return batch.map(Some).map_err(corrupt);
        }
    }
}

impl Iterator for WalReader {
    type Item = Result<Batch, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let next = self.next_batch().transpose();
        if !matches!(next, Some(Ok(_))) {
            self.done = true;
        }
        next
    }
}

/// A run of whole durable batches, byte for byte as a segment holds them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawRun {
    /// Position of the run's last batch.
    pub last: TermSeqno,
    /// How many batches the run holds.
    pub batches: usize,
    /// The encoded batches, concatenated.
    pub bytes: Vec<u8>,
}

/// Durable batches from a seqno as [`RawRun`]s of at most a given size, read a range of a segment at
/// a time, for serving a pull.
///
/// Delicate: it checks each batch's header (framing, kind, lengths) and the seqno chain, never its
/// BLAKE3 seal: the receiver verifies every batch before its WAL takes it, and hashing here too would
/// double the CPU a catch-up costs the node that serves it. A batch that rotted on this disk is
/// therefore refused by the receiver, not here. Like [`WalReader`] it reads only what was durable
/// when it was created, and reports a purge or truncation since then as an error; memory is one run
/// (at most the requested size, or one batch if that is larger).
pub struct RawReader {
    shared: Arc<Shared>,
    segments: VecDeque<SegmentInfo>,
    from: Seqno,
    durable: Seqno,
    current: Option<RawSegment>,
    done: bool,
    truncations: u64,
    /// Where to start in the first segment ([`ReadPlan::start`]); taken when it is opened.
    start: Option<(Seqno, u64)>,
}

struct RawSegment {
    path: PathBuf,
    /// Durable length.
    len: u64,
    /// File offset of the next batch.
    offset: u64,
    /// Its first seqno.
    next_seqno: Seqno,
}

/// Where a walk over a range of a segment ended.
enum Walk {
    /// `consumed` bytes walked (batches below `from` included); `start..consumed` is the run.
    Run {
        consumed: usize,
        start: usize,
        last: Option<TermSeqno>,
        batches: usize,
        next: Seqno,
        /// The walk stopped at a batch past the durable frontier.
        past_durable: bool,
    },
    /// The run's first batch is longer than the range: read again from `skip` with `len` bytes.
    Longer { skip: usize, len: usize, next: Seqno },
}

impl RawReader {
    pub(crate) fn new(shared: Arc<Shared>, plan: ReadPlan) -> RawReader {
        RawReader {
            shared,
            segments: plan.segments.into(),
            from: plan.from,
            durable: plan.durable,
            current: None,
            done: false,
            truncations: plan.truncations,
            start: plan.start,
        }
    }

    /// The durable frontier this reader stops at.
    pub fn durable(&self) -> Seqno {
        self.durable
    }

    /// The next run of at most `bytes_max` bytes (or one batch, if that batch alone is longer);
    /// `None` once every durable batch from the start seqno on was returned.
    pub fn next_run(&mut self, bytes_max: usize) -> Result<Option<RawRun>, Error> {
        let bytes_max = bytes_max.max(HEADER_LEN);
        let mut want = bytes_max as u64;
        while !self.done {
            let segment = match &mut self.current {
                Some(segment) if segment.offset < segment.len => segment,
                _ => {
                    let Some(next) = self.segments.pop_front() else {
                        self.done = true;
                        break;
                    };
                    let (next_seqno, offset) = self.start.take().unwrap_or((next.first_seqno, 0));
                    self.current = Some(RawSegment { path: next.path, len: next.bytes, offset, next_seqno });
                    continue;
                }
            };
            let len = want.min(segment.len - segment.offset);
            let read = self.shared.io.read_range(&segment.path, segment.offset, len);
            let mut bytes = checked_read(
                &self.shared,
                self.truncations,
                self.from,
                &segment.path,
                segment.next_seqno,
                read,
            )?;
            if (bytes.len() as u64) < len {
                let reason = format!(
                    "segment is {} bytes but {} were fsynced",
                    segment.offset + bytes.len() as u64,
                    segment.len
                );
                return Err(Error::corrupt(&segment.path, segment.offset + bytes.len() as u64, reason));
            }
            let at_end = segment.offset + len == segment.len;
            let walk = walk(&bytes, at_end, segment.next_seqno, self.from, self.durable)
                .map_err(|(at, reason)| Error::corrupt(&segment.path, segment.offset + at as u64, reason))?;
            match walk {
                Walk::Longer { skip, len, next } => {
                    segment.offset += skip as u64;
                    segment.next_seqno = next;
                    want = len as u64;
                }
                Walk::Run { consumed, start, last, batches, next, past_durable } => {
                    segment.offset += consumed as u64;
                    segment.next_seqno = next;
                    want = bytes_max as u64;
                    // A batch past the durable frontier ends the read.
                    self.done = past_durable;
                    if let Some(last) = last {
                        bytes.truncate(consumed);
                        if start > 0 {
                            bytes.drain(..start);
                        }
                        return Ok(Some(RawRun { last, batches, bytes }));
                    }
                }
            }
        }
        Ok(None)
    }
}

/// Walks the batch headers of `bytes` (a range of a segment starting at a batch that should begin at
/// `next`): skips batches below `from`, stops before a batch past `durable` or one that does not fit.
/// A batch cut by the range's end is corruption only if the range ends the segment's durable part.
fn walk(
    bytes: &[u8],
    at_end: bool,
    mut next: Seqno,
    from: Seqno,
    durable: Seqno,
) -> Result<Walk, (usize, String)> {
    let mut at = 0;
    let mut start = None;
    let mut last = None;
    let mut batches = 0;
    let mut past_durable = false;
    while at < bytes.len() {
        let rest = &bytes[at..];
        let header = match decode_header(rest) {
            Ok(header) => header,
            Err(DecodeError::Truncated { .. }) if !at_end => {
                if start.is_none() && at == 0 {
                    // Not even a header fits: read at least one.
                    return Ok(Walk::Longer { skip: 0, len: HEADER_LEN, next });
                }
                break;
            }
            Err(error) => return Err((at, error.to_string())),
        };
        if header.first_seqno != next {
            return Err((at, format!("batch starts at seqno {}, expected {next}", header.first_seqno)));
        }
        if header.first_seqno > durable {
            past_durable = true;
            break;
        }
        let len = header.encoded_len();
        if rest.len() < len {
            if at_end {
                return Err((at, DecodeError::Truncated { needed: len, available: rest.len() }.to_string()));
            }
            if start.is_none() {
                return Ok(Walk::Longer { skip: at, len, next });
            }
            break;
        }
        next = header.last_seqno().next();
        if header.last_seqno() >= from {
            start.get_or_insert(at);
            last = Some(TermSeqno { term: header.term, seqno: header.last_seqno() });
            batches += 1;
        }
        at += len;
    }
    Ok(Walk::Run { consumed: at, start: start.unwrap_or(at), last, batches, next, past_durable })
}

/// A segment read, checked against what happened meanwhile: a truncation (the reader was opened
/// when `truncations` were done) or a purge of the file (`NotFound`: the first retained seqno, or
/// `segment_first` if none is left, says where the log starts now).
fn checked_read(
    shared: &Shared,
    truncations: u64,
    from: Seqno,
    path: &std::path::Path,
    segment_first: Seqno,
    read: std::io::Result<Vec<u8>>,
) -> Result<Vec<u8>, Error> {
    if shared.truncations.load(Ordering::SeqCst) != truncations {
        return Err(Error::TruncatedWhileReading { requested: from });
    }
    match read {
        Ok(bytes) => Ok(bytes),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            let first_retained =
                shared.lock_log().segments.first().map_or(segment_first, |first| first.first_seqno);
            Err(Error::Purged { requested: from, first_retained })
        }
        Err(err) => Err(Error::io("read segment", path, err)),
    }
}
