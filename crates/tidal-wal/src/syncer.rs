//! The syncer of a pipelined writer (decisions/046): a second thread that owns the fsync of each
//! written drain, then publishes it, calls [`FlushedHook::flushed`] and runs its completions, while
//! the writer thread writes (and hands to [`FlushedHook::written`]) the next drain.
//!
//! Delicate:
//! - Order. Jobs are handled in the order they were sent: published, announced and completed one
//!   after the other, so the durable frontier, the hook and the completions see drains in seqno
//!   order, as without the pipeline. `written` of drain N+1 may run before `flushed` of drain N.
//! - One fsync covers every job taken at once: they are all written, and a rotation inside a later
//!   drain fsynced the segments before it on the writer thread. The fsync is of the segment the
//!   last of them ended in.
//! - A failed fsync poisons the WAL and fails every job taken with it and every later one: nothing
//!   is published or completed past the failure.
//! - A barrier is answered once every job sent before it is done: a truncation and the shutdown
//!   wait for it, so they never run beside an fsync of the log they change.
//! - Bounded: the writer hands jobs over a rendezvous channel, so at most one written drain waits
//!   (in the writer's hand) while another is fsynced.

use std::path::PathBuf;
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::error::Error;
use crate::io::WalFile;
use crate::segment::SegmentInfo;
use crate::shared::{Done, Outcome, Shared};
use crate::writer::FlushedHook;

/// The WAL hook, shared by the writer thread (`written`, `truncated`) and the syncer (`flushed`).
pub(crate) type SharedHook = Arc<Mutex<Box<dyn FlushedHook>>>;

/// Locks the hook; a panic inside it already poisoned the WAL, so a poisoned lock is taken as is.
pub(crate) fn lock_hook(hook: &SharedHook) -> MutexGuard<'_, Box<dyn FlushedHook>> {
    hook.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A handle to the active segment for the syncer's fsyncs (the writer writes through its own).
pub(crate) type SyncHandle = Arc<Mutex<Box<dyn WalFile>>>;

/// One written drain, waiting for its fsync.
pub(crate) struct SyncJob {
    /// The segment the drain ended in, and its path (for errors).
    pub(crate) file: SyncHandle,
    pub(crate) path: PathBuf,
    /// The drain's batches (empty if every request was refused) and one outcome per request.
    pub(crate) batches: Vec<crate::batch::Batch>,
    pub(crate) outcomes: Vec<Result<Outcome, Error>>,
    pub(crate) dones: Vec<Done>,
    /// What to publish once it is durable: the segments the drain closed, then the active one as
    /// the drain left it; new terms; the durable frontier.
    pub(crate) closed_segments: Vec<SegmentInfo>,
    pub(crate) active_info: SegmentInfo,
    pub(crate) term_starts: Vec<tidal_types::TermSeqno>,
    pub(crate) durable: u64,
}

/// What the writer sends the syncer.
pub(crate) enum SyncMsg {
    Job(SyncJob),
    /// Answered once every job sent before it is done.
    Barrier(SyncSender<()>),
}

/// Poisons the WAL if the syncer unwinds, so the writer and new requests stop.
struct PanicGuard(Arc<Shared>);

impl Drop for PanicGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            tracing::error!("the WAL syncer thread panicked; the WAL is poisoned");
            self.0.poison();
        }
    }
}

/// The thread body: until the writer drops its sender.
pub(crate) fn run(shared: Arc<Shared>, hook: SharedHook, input: Receiver<SyncMsg>) {
    let _guard = PanicGuard(shared.clone());
    while let Ok(first) = input.recv() {
        let mut jobs = Vec::new();
        let mut barriers = Vec::new();
        for message in std::iter::once(first).chain(input.try_iter()) {
            match message {
                SyncMsg::Job(job) => jobs.push(job),
                SyncMsg::Barrier(answer) => barriers.push(answer),
            }
        }
        if !jobs.is_empty() {
            sync_and_publish(&shared, &hook, jobs);
        }
        for answer in barriers {
            let _ = answer.send(());
        }
    }
}

fn sync_and_publish(shared: &Shared, hook: &SharedHook, jobs: Vec<SyncJob>) {
    let synced = match jobs.iter().rev().find(|job| !job.batches.is_empty()) {
        None => Ok(()),
        Some(_) if shared.is_poisoned() => Err(Error::Poisoned),
        Some(last) => {
            let started = Instant::now();
            let result = last.file.lock().unwrap_or_else(std::sync::PoisonError::into_inner).sync_data();
            match result {
                Ok(()) => {
                    shared.stats.record_fsync(started.elapsed());
                    Ok(())
                }
                Err(err) => {
                    let err = Error::fatal("fsync segment", &last.path, err);
                    tracing::error!("failed to {err:#}");
                    shared.poison();
                    Err(err)
                }
            }
        }
    };
    let mut failed = synced.err();
    for job in jobs {
        if failed.is_none() && !job.batches.is_empty() {
            if let Err(err) = crate::writer::publish(
                shared,
                &job.closed_segments,
                &job.active_info,
                &job.term_starts,
                &job.batches,
                &job.outcomes,
                job.durable,
            ) {
                tracing::error!("failed to {err:#}");
                shared.poison();
                failed = Some(err);
            }
        }
        if let Some(err) = &failed {
            for done in job.dones {
                done.fail(err.clone());
            }
            continue;
        }
        if !job.batches.is_empty() {
            lock_hook(hook).flushed(&job.batches);
        }
        for (done, outcome) in job.dones.into_iter().zip(job.outcomes) {
            done.complete(outcome);
        }
    }
}
