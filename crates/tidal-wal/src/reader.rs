//! [`WalReader`]: a read-only scan of durable batches from a seqno, for catch-up and replay.
//!
//! Delicate: the reader takes a snapshot of the segment list and the durable frontier when it is
//! created and never reads past it, so it never sees bytes that are written but not yet fsynced. It
//! verifies every batch again (a disk can rot after recovery) and the seqno chain. A segment purged
//! while the reader is on its way is reported as [`Error::Purged`]; a truncation (quarantine, reset)
//! since the reader was created, as [`Error::TruncatedWhileReading`], checked after each segment read,
//! so a reader never mixes batches of the old and the new log.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tidal_types::Seqno;

use crate::batch::{decode_batch, Batch};
use crate::error::Error;
use crate::segment::SegmentInfo;
use crate::shared::Shared;

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
}

struct OpenSegment {
    path: PathBuf,
    bytes: Vec<u8>,
    offset: usize,
}

impl WalReader {
    pub(crate) fn new(
        shared: Arc<Shared>,
        segments: Vec<SegmentInfo>,
        from: Seqno,
        durable: Seqno,
        truncations: u64,
    ) -> WalReader {
        WalReader {
            shared,
            segments: segments.into(),
            from,
            durable,
            current: None,
            next_seqno: None,
            done: false,
            truncations,
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
        let read = self.shared.io.read_prefix(&segment.path, segment.bytes);
        if self.shared.truncations.load(Ordering::SeqCst) != self.truncations {
            return Err(Error::TruncatedWhileReading { requested: self.from });
        }
        let bytes = match read {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                let first_retained = self
                    .shared
                    .lock_log()
                    .segments
                    .first()
                    .map_or(segment.first_seqno, |first| first.first_seqno);
                return Err(Error::Purged { requested: self.from, first_retained });
            }
            Err(err) => return Err(Error::io("read segment", &segment.path, err)),
        };
        let durable_len = usize::try_from(segment.bytes).unwrap_or(usize::MAX);
        if bytes.len() < durable_len {
            let reason = format!("segment is {} bytes but {durable_len} were fsynced", bytes.len());
            return Err(Error::corrupt(&segment.path, bytes.len() as u64, reason));
        }
        self.next_seqno = Some(segment.first_seqno);
        self.current = Some(OpenSegment { path: segment.path, bytes, offset: 0 });
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
            let batch = decode_batch(&current.bytes[offset..])
                .map_err(|err| Error::corrupt(&current.path, offset as u64, err.to_string()))?;
            let header = batch.header;
            if Some(header.first_seqno) != self.next_seqno {
                let expected = self.next_seqno.map_or_else(String::new, |seqno| seqno.to_string());
                let reason = format!("batch starts at seqno {}, expected {expected}", header.first_seqno);
                return Err(Error::corrupt(&current.path, offset as u64, reason));
            }
            current.offset += batch.encoded.len();
            self.next_seqno = Some(header.last_seqno().next());
            if header.first_seqno > self.durable {
                return Ok(None);
            }
            if header.last_seqno() < self.from {
                continue;
            }
            let batch = Batch::from_verified(Arc::from(batch.encoded))
                .map_err(|err| Error::corrupt(&current.path, offset as u64, err.to_string()))?;
            return Ok(Some(batch));
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
