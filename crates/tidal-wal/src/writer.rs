//! The group-commit writer: one dedicated thread, the sequencer of the WAL.
//!
//! Each drain takes what is queued (bounded by `drain_bytes_max`, at least one request), assigns
//! seqnos, stamps the logged time and the current term, encodes every request as exactly one batch,
//! writes them, fsyncs ONCE (plus once per rotation), records a new term in `wal.meta`, advances the
//! durable frontier, then calls the [`FlushedHook`] and finally every completion.
//!
//! Delicate:
//! - Nothing is handed out (hook, completion, reader) before the fsync that covers it.
//! - A failed write or fsync poisons the WAL for good: the drain's completions get the error, every
//!   later request gets [`Error::Poisoned`], and nothing is ever retried (after a failed fsync the
//!   kernel may have dropped the pages; a later success would prove nothing).
//! - The logged time is `max(clock, previous batch's time)`, so it never goes backwards in seqno
//!   order, whatever the clock does.
//! - Segments rotate only at batch boundaries; the directory is fsynced after a segment is created,
//!   before any batch in it is acknowledged.

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use tidal_types::{RecordKind, Seqno, Term, TermSeqno};

use crate::batch::{encode_batch_into, Batch, HEADER_LEN};
use crate::error::Error;
use crate::io::WalFile;
use crate::segment::{segment_file_name, SegmentInfo};
use crate::shared::{Queued, Shared};

/// Bytes at the start of every payload that hold the envelope's logged time (u64 LE unix ms).
pub const LOGGED_TIME_LEN: usize = 8;

/// One client write: becomes exactly one batch.
pub struct AppendRequest {
    /// What the payload holds.
    pub kind: RecordKind,
    /// Seqnos the batch consumes (at least 1).
    pub event_count: u32,
    /// The payload; its first 8 bytes are the logged-time slot, overwritten by the writer.
    pub payload: Vec<u8>,
}

impl fmt::Debug for AppendRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AppendRequest")
            .field("kind", &self.kind)
            .field("event_count", &self.event_count)
            .field("payload_len", &self.payload.len())
            .finish()
    }
}

/// Where a request landed, once it is durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Appended {
    /// First seqno of the batch.
    pub first: Seqno,
    /// Last seqno of the batch (inclusive).
    pub last: Seqno,
    /// Term stamped in the batch.
    pub term: Term,
    /// Logged time stamped in the payload.
    pub time_ms: u64,
}

/// Called once per request on the writer thread, after its fsync (or with the error). It must be
/// quick and must not panic: it delays every later write.
pub type Completion = Box<dyn FnOnce(Result<Appended, Error>) + Send>;

/// Sees every flushed batch, on the writer thread, after the fsync and before the completions, in
/// seqno order (the ship feed hangs here). Must be quick and must not panic.
pub trait FlushedHook: Send + 'static {
    /// The batches just made durable, in seqno order.
    fn flushed(&mut self, batches: &[Batch]);
}

/// A hook that ignores everything.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoopHook;

impl FlushedHook for NoopHook {
    fn flushed(&mut self, _batches: &[Batch]) {}
}

/// The writer thread's own state.
pub(crate) struct Writer {
    pub(crate) shared: Arc<Shared>,
    pub(crate) hook: Box<dyn FlushedHook>,
    pub(crate) active: Box<dyn WalFile>,
    /// The active segment as it will be once the current drain is durable.
    pub(crate) active_info: SegmentInfo,
    pub(crate) next_seqno: Seqno,
    pub(crate) last_time_ms: u64,
    /// Term of the last term-history entry.
    pub(crate) history_term: Term,
}

/// What one drain wrote, before it is announced.
struct Flushed {
    batches: Vec<Batch>,
    appended: Vec<Appended>,
    /// Segments closed by rotations during the drain.
    closed_segments: Vec<SegmentInfo>,
    term_starts: Vec<TermSeqno>,
}

/// Fails completions if the writer thread unwinds, so nobody waits forever.
struct PanicGuard(Arc<Shared>);

impl Drop for PanicGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            tracing::error!("the WAL writer thread panicked; the WAL is poisoned");
            self.0.poison();
            let queued: Vec<Queued> = {
                let mut queue = self.0.lock_queue();
                queue.closed = true;
                queue.bytes = 0;
                queue.requests.drain(..).collect()
            };
            for item in queued {
                (item.done)(Err(Error::Poisoned));
            }
        }
    }
}

impl Writer {
    /// The thread body: drain until closed and empty.
    pub(crate) fn run(mut self) {
        let _guard = PanicGuard(self.shared.clone());
        while let Some(drain) = self.next_drain() {
            if self.shared.is_poisoned() {
                fail_all(drain, &Error::Poisoned);
                continue;
            }
            let (requests, completions): (Vec<_>, Vec<_>) =
                drain.into_iter().map(|item| (item.request, item.done)).unzip();
            match self.write_drain(requests) {
                Ok(flushed) => {
                    self.hook.flushed(&flushed.batches);
                    for (done, appended) in completions.into_iter().zip(flushed.appended) {
                        done(Ok(appended));
                    }
                }
                Err(err) => {
                    tracing::error!("failed to {err:#}");
                    self.shared.poison();
                    for done in completions {
                        done(Err(err.clone()));
                    }
                }
            }
        }
    }

    /// Waits for requests; `None` once closed and empty. Fails everything queued when poisoned.
    fn next_drain(&mut self) -> Option<Vec<Queued>> {
        let mut queue = self.shared.lock_queue();
        loop {
            if !queue.requests.is_empty() {
                break;
            }
            if queue.closed {
                return None;
            }
            queue = self.shared.queue_ready.wait(queue).unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        let drain_bytes_max =
            if self.shared.is_poisoned() { usize::MAX } else { self.shared.config.drain_bytes_max };
        let mut drain = Vec::new();
        let mut drain_bytes = 0usize;
        while let Some(front) = queue.requests.front() {
            let encoded_len = HEADER_LEN + front.request.payload.len();
            if !drain.is_empty() && drain_bytes.saturating_add(encoded_len) > drain_bytes_max {
                break;
            }
            let Some(item) = queue.requests.pop_front() else { break };
            queue.bytes -= item.request.payload.len();
            drain_bytes = drain_bytes.saturating_add(encoded_len);
            drain.push(item);
        }
        drop(queue);
        self.shared.queue_space.notify_all();
        Some(drain)
    }

    /// Writes and fsyncs one drain, then publishes the new durable frontier and segment list.
    fn write_drain(&mut self, requests: Vec<AppendRequest>) -> Result<Flushed, Error> {
        let term = Term(self.shared.term.load(Ordering::SeqCst));
        let mut flushed = Flushed {
            batches: Vec::with_capacity(requests.len()),
            appended: Vec::with_capacity(requests.len()),
            closed_segments: Vec::new(),
            term_starts: Vec::new(),
        };
        let mut buf =
            Vec::with_capacity(requests.iter().map(|request| HEADER_LEN + request.payload.len()).sum());
        for mut request in requests {
            let pending = self.active_info.bytes + buf.len() as u64;
            if pending > 0 && pending >= self.shared.config.segment_bytes_max {
                self.rotate(&mut buf, &mut flushed)?;
            }
            let first = self.next_seqno;
            let last = first.add(u64::from(request.event_count) - 1);
            let time_ms = self.shared.clock.now_ms().max(self.last_time_ms);
            request.payload[..LOGGED_TIME_LEN].copy_from_slice(&time_ms.to_le_bytes());
            let start = buf.len();
            encode_batch_into(&mut buf, request.kind, term, first, request.event_count, &request.payload);
            let batch = Batch::from_verified(Arc::from(&buf[start..])).map_err(|err| {
                Error::corrupt(&self.active_info.path, self.active_info.bytes, err.to_string())
            })?;
            if term > self.history_term {
                flushed.term_starts.push(TermSeqno { term, seqno: first });
                self.history_term = term;
            }
            self.next_seqno = last.next();
            self.last_time_ms = time_ms;
            self.active_info.last_seqno = Some(last);
            flushed.batches.push(batch);
            flushed.appended.push(Appended { first, last, term, time_ms });
        }
        self.write_and_sync(&mut buf)?;
        self.publish(&flushed)?;
        Ok(flushed)
    }

    fn write_and_sync(&mut self, buf: &mut Vec<u8>) -> Result<(), Error> {
        let path = &self.active_info.path;
        self.active.write_all(buf).map_err(|err| Error::fatal("write segment", path, err))?;
        self.active_info.bytes += buf.len() as u64;
        buf.clear();
        let started = Instant::now();
        self.active.sync_data().map_err(|err| Error::fatal("fsync segment", path, err))?;
        self.shared.stats.record_fsync(started.elapsed());
        Ok(())
    }

    /// Closes the active segment (write + fsync what is pending) and starts the next one at
    /// `self.next_seqno`, fsyncing the directory so the new file survives a crash.
    fn rotate(&mut self, buf: &mut Vec<u8>, flushed: &mut Flushed) -> Result<(), Error> {
        self.write_and_sync(buf)?;
        let dir = self.shared.config.dir.clone();
        let path: PathBuf = dir.join(segment_file_name(self.next_seqno));
        let file =
            self.shared.io.open_append(&path).map_err(|err| Error::fatal("create segment", &path, err))?;
        self.shared.io.sync_dir(&dir).map_err(|err| Error::fatal("fsync WAL directory", &dir, err))?;
        self.active = file;
        let closed = std::mem::replace(
            &mut self.active_info,
            SegmentInfo { path, first_seqno: self.next_seqno, last_seqno: None, bytes: 0 },
        );
        flushed.closed_segments.push(closed);
        self.shared.stats.rotations.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(segment = %self.active_info.path.display(), "rotated WAL segment");
        Ok(())
    }

    /// After the fsync: records new terms in `wal.meta`, then publishes segments and the frontier.
    fn publish(&mut self, flushed: &Flushed) -> Result<(), Error> {
        let mut log = self.shared.lock_log();
        if !flushed.term_starts.is_empty() {
            let mut meta = log.meta.clone();
            meta.term_history.extend_from_slice(&flushed.term_starts);
            meta.store(self.shared.io.as_ref(), &self.shared.config.dir)?;
            log.meta = meta;
        }
        for info in flushed.closed_segments.iter().chain(std::iter::once(&self.active_info)) {
            match log.segments.last_mut() {
                Some(last) if last.first_seqno == info.first_seqno => *last = info.clone(),
                _ => log.segments.push(info.clone()),
            }
        }
        let durable = self.next_seqno.get() - 1;
        assert!(
            durable >= self.shared.durable.load(Ordering::SeqCst),
            "durable frontier monotonicity violated: old={} new={durable}",
            self.shared.durable.load(Ordering::SeqCst)
        );
        self.shared.durable.store(durable, Ordering::SeqCst);
        drop(log);
        let stats = &self.shared.stats;
        stats.drains.fetch_add(1, Ordering::Relaxed);
        stats.batches.fetch_add(flushed.batches.len() as u64, Ordering::Relaxed);
        let events: u64 = flushed.appended.iter().map(|a| a.last.get() - a.first.get() + 1).sum();
        stats.events.fetch_add(events, Ordering::Relaxed);
        let bytes: u64 = flushed.batches.iter().map(|batch| batch.encoded().len() as u64).sum();
        stats.bytes.fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    }
}

fn fail_all(drain: Vec<Queued>, err: &Error) {
    for item in drain {
        (item.done)(Err(err.clone()));
    }
}
