//! Startup replay: the WAL past the engine's applied seqno folded into the engine, and the durable
//! tail a cluster member may not apply yet handed to the applier.

use super::ReplayReport;
use anyhow::Context;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tidal_cluster::ApplierSender;
use tidal_core::{DecodedBatch, TidalDb};
use tidal_types::Seqno;
use tidal_wal::{Wal, WalReader};

/// Hands the durable batches in `(applied, durable]` to the applier as pending (not yet
/// committed), at open (recovery checked their seals moments ago).
pub(super) fn hand_tail_to_applier(
    wal: &Wal,
    sender: &ApplierSender,
    applied: Seqno,
    durable: Seqno,
) -> anyhow::Result<()> {
    const CHUNK_BYTES: usize = 4 * 1024 * 1024;
    let mut chunk = Vec::new();
    let mut bytes = 0usize;
    let mut batches = 0u64;
    for batch in wal.read_recovered_from(applied.next()).context("read the WAL tail")? {
        let batch = batch.context("read a WAL batch of the tail")?;
        if batch.first_seqno() > durable {
            break;
        }
        bytes += batch.encoded().len();
        batches += 1;
        chunk.push(batch);
        if bytes >= CHUNK_BYTES {
            sender.flushed(std::mem::take(&mut chunk));
            bytes = 0;
        }
    }
    if !chunk.is_empty() {
        sender.flushed(chunk);
    }
    tracing::info!(batches, from = %applied.next(), to = %durable, "WAL tail past the commit hint waits for the commit frontier");
    Ok(())
}

/// Bytes of read-ahead startup replay holds between its reader thread and the fold (at least one
/// batch, whatever its size): bounds the memory of the pipeline.
const REPLAY_READ_AHEAD_BYTES: usize = 32 * 1024 * 1024;
/// Bytes of batches the replay reader hands over at once (a chunk closes at either bound).
const REPLAY_CHUNK_BYTES: usize = 1024 * 1024;
/// Batches the replay reader hands over at once.
const REPLAY_CHUNK_BATCHES: usize = 1024;
/// How often a long replay logs its progress.
const REPLAY_PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// A chunk of decoded batches, or the read error that ended the reader.
type Chunk = Result<Vec<DecodedBatch>, tidal_wal::Error>;

/// The engine's replay mode ([`TidalDb::set_replaying`]) from `start` until dropped, however the
/// replay ends.
struct Replaying<'a>(&'a TidalDb);

impl<'a> Replaying<'a> {
    fn start(db: &'a TidalDb) -> Replaying<'a> {
        db.set_replaying(true);
        Replaying(db)
    }
}

impl Drop for Replaying<'_> {
    fn drop(&mut self) {
        self.0.set_replaying(false);
    }
}

/// Startup replay, as a pipeline: a reader thread ([`read_ahead`]) reads the segments, checks every
/// batch's header and the seqno chain (recovery verified their seals moments ago, on every core:
/// [`tidal_wal::Wal::read_recovered_from`]) and decodes its payload, while this thread folds the
/// batches in order through the one apply path ([`fold`]) and the engine's flusher writes fjall.
/// The read-ahead between the two is bounded by [`REPLAY_READ_AHEAD_BYTES`]. Each folded chunk goes
/// back to the reader to be freed where it was allocated (experiments/044). The engine is in replay
/// mode meanwhile (experiments/043).
pub(super) fn replay(wal: &Wal, db: &TidalDb, durable: Seqno) -> anyhow::Result<ReplayReport> {
    let started = Instant::now();
    let mut report = ReplayReport {
        batches: 0,
        bytes: 0,
        elapsed: Duration::ZERO,
        engine_open: Duration::ZERO,
        wal_recovery: Duration::ZERO,
    };
    let from = db.applied_seqno().next();
    if from > durable {
        return Ok(report);
    }
    tracing::info!(%from, %durable, "replaying WAL into the engine");
    let reader = wal.read_recovered_from(from).context("read WAL for replay")?;
    let budget = ReadAhead::new(REPLAY_READ_AHEAD_BYTES);
    let (sender, receiver) = std::sync::mpsc::channel::<Chunk>();
    // Folded chunks go back to the reader, which allocated them, to be freed there: glibc frees a
    // block into the arena of the thread that allocated it, under that arena's lock, so a fold
    // freeing the reader's allocations contends with the reader allocating the next ones.
    let (give_back, given_back) = std::sync::mpsc::channel::<Vec<DecodedBatch>>();
    let _replaying = Replaying::start(db);
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let budget = &budget;
        std::thread::Builder::new()
            .name("tidal-replay-read".into())
            .spawn_scoped(scope, move || read_ahead(reader, durable, budget, sender, given_back))
            .context("start the replay reader thread")?;
        // Whatever ends the fold (an error included) releases the reader.
        let _close = CloseOnDrop(budget);
        fold(receiver, db, durable, budget, give_back, &mut report)
    })?;
    report.elapsed = started.elapsed();
    anyhow::ensure!(
        db.applied_seqno() >= durable,
        "replay ended at seqno {} but should have reached {durable}",
        db.applied_seqno()
    );
    tracing::info!(
        batches = report.batches,
        mb = report.bytes as f64 / 1e6,
        seconds = report.elapsed.as_secs_f64(),
        "replay done"
    );
    Ok(report)
}

/// The replay's reader thread: reads and decodes the batches through `durable` and sends them in
/// chunks, within the read-ahead budget, until the fold stops listening.
fn read_ahead(
    reader: WalReader,
    durable: Seqno,
    budget: &ReadAhead,
    sender: Sender<Chunk>,
    given_back: Receiver<Vec<DecodedBatch>>,
) {
    // Batches travel in chunks, so small batches (an item, an embedding) do not pay a channel send
    // and two lock round trips each.
    let mut chunk = Vec::new();
    let mut chunk_bytes = 0;
    let mut spare: Option<Vec<DecodedBatch>> = None;
    for batch in reader {
        let batch = match batch {
            Ok(batch) => batch,
            Err(error) => {
                if !chunk.is_empty() {
                    budget.acquire(chunk_bytes);
                    let _ = sender.send(Ok(chunk));
                }
                let _ = sender.send(Err(error));
                return;
            }
        };
        let last = batch.last_seqno() >= durable;
        chunk_bytes += batch.encoded().len();
        chunk.push(DecodedBatch::decode(batch));
        if last || chunk_bytes >= REPLAY_CHUNK_BYTES || chunk.len() >= REPLAY_CHUNK_BATCHES {
            budget.acquire(chunk_bytes);
            chunk_bytes = 0;
            // Chunks the fold has given back by now: freed here, where they were allocated; the
            // last one's Vec carries the next chunk.
            for mut folded in given_back.try_iter() {
                folded.clear();
                spare = Some(folded);
            }
            let next = spare.take().unwrap_or_default();
            if budget.is_closed() || sender.send(Ok(std::mem::replace(&mut chunk, next))).is_err() || last {
                return;
            }
        }
    }
    if !chunk.is_empty() {
        budget.acquire(chunk_bytes);
        let _ = sender.send(Ok(chunk));
    }
}

/// The replay's fold: applies the chunks in order through `durable`, counting them in `report`,
/// and gives each back to the reader.
fn fold(
    receiver: Receiver<Chunk>,
    db: &TidalDb,
    durable: Seqno,
    budget: &ReadAhead,
    give_back: Sender<Vec<DecodedBatch>>,
    report: &mut ReplayReport,
) -> anyhow::Result<()> {
    let mut last_progress = Instant::now();
    for chunk in receiver {
        let mut chunk = chunk.context("read WAL batch for replay")?;
        let chunk_bytes: usize = chunk.iter().map(|decoded| decoded.batch().encoded().len()).sum();
        for decoded in &mut chunk {
            let (first_seqno, last_seqno, len) = {
                let batch = decoded.batch();
                (batch.first_seqno(), batch.last_seqno(), batch.encoded().len())
            };
            if last_seqno > durable {
                return Ok(());
            }
            db.apply_decoded(decoded).with_context(|| format!("replay batch at seqno {first_seqno}"))?;
            report.batches += 1;
            report.bytes += len as u64;
        }
        let last_seqno = chunk.last().map(|decoded| decoded.batch().last_seqno());
        // Freed by the reader; if it is gone, here.
        let _ = give_back.send(chunk);
        budget.release(chunk_bytes);
        if last_progress.elapsed() > REPLAY_PROGRESS_EVERY {
            last_progress = Instant::now();
            if let Some(applied) = last_seqno {
                tracing::info!(%applied, %durable, mb = report.bytes / 1_000_000, "replay progress");
            }
        }
    }
    Ok(())
}

/// The bytes read ahead of the fold during replay: the reader waits while they exceed the bound
/// (one batch always passes, whatever its size).
struct ReadAhead {
    bound: usize,
    state: Mutex<(usize, bool)>,
    changed: std::sync::Condvar,
}

impl ReadAhead {
    fn new(bound: usize) -> ReadAhead {
        ReadAhead { bound, state: Mutex::new((0, false)), changed: std::sync::Condvar::new() }
    }

    fn acquire(&self, bytes: usize) {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        while state.0 > 0 && state.0 + bytes > self.bound && !state.1 {
            state = self.changed.wait(state).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        state.0 += bytes;
    }

    fn release(&self, bytes: usize) {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        state.0 = state.0.saturating_sub(bytes);
        self.changed.notify_all();
    }

    fn close(&self) {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner).1 = true;
        self.changed.notify_all();
    }

    fn is_closed(&self) -> bool {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner).1
    }
}

struct CloseOnDrop<'a>(&'a ReadAhead);

impl Drop for CloseOnDrop<'_> {
    fn drop(&mut self) {
        self.0.close();
    }
}
