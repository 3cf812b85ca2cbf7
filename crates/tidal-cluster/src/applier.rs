//! The applier: folds logged batches into the engine, never past the commit frontier.
//!
//! One thread per node owns `TidalDb::apply` (the one apply path). It receives, in order, the
//! batches the WAL writer wrote (a cluster member's: leader writes, follower ships and pulled chunks
//! alike, handed over before their fsync; a single node's: after it) and the commit frontier, and
//! applies the prefix of pending batches whose last seqno is committed. In quorum mode that is what
//! keeps reads from ever showing a write that may still vanish: a batch is committed only once a
//! majority has fsynced it, so a follower may show it before its OWN fsync (decisions/025), and the
//! engine's [`DurableFrontier`] gate keeps fjall from persisting state past this node's durable WAL.
//!
//! Delicate:
//! - Input is bounded (a sync channel): the WAL writer waits for the applier rather than buffering
//!   without limit. Pending batches are bounded by what is written but not yet committed, which the
//!   write path bounds (in-flight writes wait for their apply).
//! - An apply error is fatal: the applier records it and stops; the applied frontier stops moving,
//!   every waiter is woken with an error, and a restart replays the WAL.
//! - [`ApplyProbe`] is a test seam (chaos/sim's `apply` crash points); production has none.

mod mailbox;
mod waiters;

use mailbox::{MailboxReceiver, MailboxSender, SendError};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;
use tidal_core::{DurableGate, GateWait, TidalDb};
use tidal_types::Seqno;
use tidal_wal::{Batch, DurableView, FlushedHook};
use tokio::sync::watch;
use waiters::Publisher;
pub use waiters::{AppliedWaiter, AppliedWaiters, Reached};

/// Messages queued to the applier. Each `Flushed` is one WAL drain, itself bounded in bytes.
const APPLIER_INPUT_MAX: usize = 256;

/// What the applier is told.
#[derive(Debug)]
pub enum ApplierInput {
    /// Batches the WAL writer logged, in seqno order (written, or durable: see the module doc).
    Flushed(Vec<Batch>),
    /// The commit frontier moved (it never moves back; lower values are ignored).
    Commit(Seqno),
    /// The log was cut from this seqno on (a divergent suffix quarantined): drop pending batches
    /// there; they were never committed, and other batches will take their seqnos.
    Truncated(Seqno),
    /// Apply what is committed and stop (shutdown, after the WAL writer has drained).
    Stop,
    /// A snapshot install reset the WAL to `seqno`: every pending batch belongs to the quarantined
    /// log and is dropped (never applied); `seqno` counts as committed. `done` is told once the
    /// applier has done it, so the install replaces the state only afterwards.
    SnapshotInstalled {
        /// The snapshot's seqno.
        seqno: Seqno,
        /// Told when the pending batches are gone.
        done: SyncSender<()>,
    },
}

/// Sends to the applier. A send after the applier stopped is dropped: the node is already failing.
///
/// Delicate: the WAL writer thread must never wait for the applier BEFORE its fsync. The applier
/// may wait for the engine's flusher, which waits for the WAL to be durable (the engine's gate,
/// decisions/025): the writer blocked on a full input before its fsync would close the cycle. So the
/// writer's pre-fsync sends are [`ApplierSender::try_flushed`] (the hook defers what does not fit to
/// after the fsync) and [`ApplierSender::commit`], which never blocks: the frontier is also kept
/// beside the channel, and the applier takes it at every message, but only once it has taken every
/// cut (truncation, snapshot install) sent before the frontier was told. A commit must not overtake
/// the cut that drops the pending batches of an old log at the same seqnos (the first version of this
/// did, and the simulation's register scenario saw two digests at one applied seqno). A notice the
/// full channel refused is also re-sent by [`ApplierSender::resend_commit`] after the next fsync.
///
/// Batches are queued without waking the applier unless the commit frontier told so far already
/// covers them (`mailbox.rs`, decisions/027): they cannot be applied before a commit message, which
/// wakes it. Every other message wakes it.
#[derive(Clone)]
pub struct ApplierSender {
    tx: MailboxSender<ApplierInput>,
    /// Cuts sent so far.
    cuts: Arc<AtomicU64>,
    /// The highest commit frontier told, with the number of cuts sent when it was told.
    told: Arc<Mutex<(Seqno, u64)>>,
    /// A commit notice was refused by a full channel since the last `resend_commit`.
    commit_dropped: Arc<AtomicBool>,
}

impl ApplierSender {
    /// Queues logged batches (see [`ApplierInput::Flushed`]), waiting for space.
    pub fn flushed(&self, batches: Vec<Batch>) {
        let _ = self.tx.send(ApplierInput::Flushed(batches), |message| self.applicable(message));
    }

    /// Queues logged batches if there is space now; hands them back if the input is full.
    pub fn try_flushed(&self, batches: Vec<Batch>) -> Result<(), Vec<Batch>> {
        match self.tx.try_send(ApplierInput::Flushed(batches), |message| self.applicable(message)) {
            Err(SendError::Full(ApplierInput::Flushed(batches))) => Err(batches),
            // Disconnected: the applier stopped; the node is failing anyway.
            _ => Ok(()),
        }
    }

    /// Whether the applier may apply something of `message` at once: batches whose first one the
    /// commit frontier told so far covers. Asked under the input's lock (see `mailbox.rs`): a commit
    /// told after this answer is queued after the batches, and wakes the applier itself.
    fn applicable(&self, message: &ApplierInput) -> bool {
        match message {
            ApplierInput::Flushed(batches) => batches.first().is_some_and(|first| {
                first.last_seqno() <= self.told.lock().unwrap_or_else(std::sync::PoisonError::into_inner).0
            }),
            _ => true,
        }
    }

    /// Drops pending batches from `from` on (the log was truncated there).
    pub fn truncated(&self, from: Seqno) {
        self.cuts.fetch_add(1, Ordering::SeqCst);
        let _ = self.tx.send(ApplierInput::Truncated(from), |_| true);
    }

    /// Advances the commit frontier. Never blocks (see the type's doc).
    pub fn commit(&self, commit: Seqno) {
        {
            let mut told = self.told.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if commit > told.0 {
                *told = (commit, self.cuts.load(Ordering::SeqCst));
            }
        }
        if let Err(SendError::Full(_)) = self.tx.try_send(ApplierInput::Commit(commit), |_| true) {
            self.commit_dropped.store(true, Ordering::SeqCst);
        }
    }

    /// Re-sends the commit frontier if a notice of it was refused by a full channel (waits for
    /// space: call it where blocking is safe, after the WAL's fsync).
    pub fn resend_commit(&self) {
        if self.commit_dropped.swap(false, Ordering::SeqCst) {
            let told = self.told.lock().unwrap_or_else(std::sync::PoisonError::into_inner).0;
            let _ = self.tx.send(ApplierInput::Commit(told), |_| true);
        }
    }

    /// Tells the applier that the WAL was reset to a snapshot at `seqno` and waits (blocking) until
    /// it dropped its pending batches. False if the applier has stopped.
    pub fn snapshot_installed(&self, seqno: Seqno) -> bool {
        let (done, dropped) = std::sync::mpsc::sync_channel(1);
        self.cuts.fetch_add(1, Ordering::SeqCst);
        self.tx.send(ApplierInput::SnapshotInstalled { seqno, done }, |_| true).is_ok()
            && dropped.recv().is_ok()
    }
}

/// Where an [`ApplyProbe`] is asked, for each committed batch the applier folds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApplyPoint {
    /// The batch is committed (on a follower maybe not yet fsynced here, decisions/025); the engine
    /// has not folded it (nothing of it in the
    /// engine's state, in memory or in fjall).
    BeforeApply,
    /// The engine folded it (`TidalDb::apply` returned); the applied frontier the node's waiters
    /// watch is not published yet (no write waiting on it is answered).
    BeforePublish,
}

/// A test seam: the simulation's crash points in the apply path (chaos/sim `crashpoint.rs`).
/// Production passes none. Asked on the applier thread at every [`ApplyPoint`] of every batch it
/// folds (not in start-up replay); `true` means the process dies there: the applier does nothing
/// more (it folds nothing, publishes nothing, and only drains its input until the node is gone),
/// as a process killed at that instruction would.
pub trait ApplyProbe: Send + Sync + 'static {
    /// The applier is at `point` for the batch `first..=last`; `true`: die here.
    fn reached(&self, point: ApplyPoint, first: Seqno, last: Seqno) -> bool;
}

/// The running applier. It holds no sender itself: the thread ends when the last sender is gone.
pub struct Applier {
    applied: watch::Receiver<Seqno>,
    waiters: Arc<AppliedWaiters>,
    fatal: Arc<Mutex<Option<String>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Set by [`Applier::join`] before it tells the thread to stop: an end after it is no fault.
    stopping: AtomicBool,
}

impl Applier {
    /// Starts the applier thread over `db`, whose applied seqno is where it starts. Returns the
    /// first sender; clone it for every producer (the WAL hook, the commit tracker).
    pub fn spawn(db: Arc<TidalDb>) -> std::io::Result<(Applier, ApplierSender)> {
        Applier::spawn_probed(db, None)
    }

    /// [`Applier::spawn`] with a test probe ([`ApplyProbe`]; `None` is `spawn`).
    pub fn spawn_probed(
        db: Arc<TidalDb>,
        probe: Option<Arc<dyn ApplyProbe>>,
    ) -> std::io::Result<(Applier, ApplierSender)> {
        let (tx, rx) = mailbox::mailbox(APPLIER_INPUT_MAX);
        let (applied_tx, applied_rx) = watch::channel(db.applied_seqno());
        let waiters = AppliedWaiters::new(db.applied_seqno());
        let publisher = Publisher { watch: applied_tx, waiters: waiters.clone() };
        let fatal = Arc::new(Mutex::new(None));
        let thread_fatal = fatal.clone();
        let told = Arc::new(Mutex::new((Seqno::ZERO, 0)));
        let thread_told = told.clone();
        let thread = std::thread::Builder::new().name("tidal-applier".into()).spawn(move || {
            // A panic is a fatal fault like a failed apply: recorded for the node to see.
            let _guard = PanicGuard(thread_fatal.clone());
            run(db, rx, &thread_told, publisher, thread_fatal, probe)
        })?;
        let sender = ApplierSender {
            tx,
            cuts: Arc::new(AtomicU64::new(0)),
            told,
            commit_dropped: Arc::new(AtomicBool::new(false)),
        };
        let applier = Applier {
            applied: applied_rx,
            waiters,
            fatal,
            thread: Mutex::new(Some(thread)),
            stopping: AtomicBool::new(false),
        };
        Ok((applier, sender))
    }

    /// The applied frontier; closed (errors on wait) once the applier has stopped.
    pub fn applied(&self) -> watch::Receiver<Seqno> {
        self.applied.clone()
    }

    /// The applied frontier's keyed waiters (each told once: when the frontier reaches its seqno,
    /// when the log is cut below it, or when the applier stops).
    pub fn waiters(&self) -> Arc<AppliedWaiters> {
        self.waiters.clone()
    }

    /// The error that stopped the applier, if any.
    pub fn fatal(&self) -> Option<String> {
        self.fatal.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Why the applier stopped without being told to (a failed apply, a panic, or its thread ended
    /// otherwise), if it did: the node's fatal fault. `None` while it runs and after [`join`].
    ///
    /// [`join`]: Applier::join
    pub fn stopped(&self) -> Option<String> {
        if let Some(fatal) = self.fatal() {
            return Some(fatal);
        }
        if self.stopping.load(Ordering::SeqCst) {
            return None;
        }
        let thread = self.thread.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        thread
            .as_ref()
            .is_some_and(|thread| thread.is_finished())
            .then(|| "the applier thread ended while the node runs".to_string())
    }

    /// Stops the applier after everything queued before this call (shut the WAL down first, so its
    /// last drains are queued) and waits for the thread. Later sends are dropped.
    pub fn join(&self, own_sender: ApplierSender) {
        self.stopping.store(true, Ordering::SeqCst);
        let _ = own_sender.tx.send(ApplierInput::Stop, |_| true);
        drop(own_sender);
        let thread = self.thread.lock().expect("applier lock is never held across a panic").take();
        if let Some(thread) = thread {
            if thread.join().is_err() {
                tracing::error!("applier thread panicked");
            }
        }
    }
}

/// Records a panic of the applier thread as its fatal error.
struct PanicGuard(Arc<Mutex<Option<String>>>);

impl Drop for PanicGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            tracing::error!("the applier thread panicked; the node stops applying and acknowledging");
            let mut fatal = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            fatal.get_or_insert_with(|| "the applier thread panicked".to_string());
        }
    }
}

fn run(
    db: Arc<TidalDb>,
    input: MailboxReceiver<ApplierInput>,
    told: &Mutex<(Seqno, u64)>,
    applied: Publisher,
    fatal: Arc<Mutex<Option<String>>>,
    probe: Option<Arc<dyn ApplyProbe>>,
) {
    let dies_at = |point: ApplyPoint, batch: &Batch| {
        probe.as_ref().is_some_and(|probe| probe.reached(point, batch.first_seqno(), batch.last_seqno()))
    };
    let mut pending: VecDeque<Batch> = VecDeque::new();
    let mut commit = db.applied_seqno();
    let mut stop = false;
    // Cuts taken so far (they come in the order `ApplierSender` counts them).
    let mut cuts = 0u64;
    while let Some((message, _turn)) = input.recv_in_turn() {
        match message {
            ApplierInput::Flushed(batches) => pending.extend(batches),
            ApplierInput::Commit(seqno) => commit = commit.max(seqno),
            ApplierInput::Truncated(from) => {
                cuts += 1;
                // Writes waiting at or above the cut will never be applied; the batches that take
                // their seqnos are not theirs.
                applied.waiters.cut(from);
                let before = pending.len();
                pending.retain(|batch| batch.first_seqno() < from);
                if pending.len() != before {
                    tracing::warn!(%from, dropped = before - pending.len(), "dropped pending batches of a truncated log");
                }
            }
            ApplierInput::Stop => stop = true,
            ApplierInput::SnapshotInstalled { seqno, done } => {
                cuts += 1;
                if !pending.is_empty() {
                    tracing::warn!(batches = pending.len(), %seqno, "dropped batches of the quarantined log");
                }
                pending.clear();
                // Every write still waiting was in the quarantined log.
                applied.waiters.cut(Seqno::ZERO);
                commit = commit.max(seqno);
                let _ = done.send(());
            }
        }
        // A notice a full channel may have refused (`ApplierSender::commit`), once we have taken
        // every cut sent before it.
        let (told, told_after) = *told.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if told_after <= cuts {
            commit = commit.max(told);
        }
        while let Some(front) = pending.front() {
            if front.last_seqno() > commit {
                break;
            }
            if dies_at(ApplyPoint::BeforeApply, front) {
                return drain_dead(&input);
            }
            if let Err(error) = db.apply(front) {
                let message = format!("apply of batch at seqno {} failed: {error}", front.first_seqno());
                tracing::error!("{message}; the node stops applying and acknowledging");
                *fatal.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(message);
                return;
            }
            if dies_at(ApplyPoint::BeforePublish, front) {
                return drain_dead(&input);
            }
            pending.pop_front();
            // Each batch is shown as soon as it is applied, not after every batch the commit
            // covers: a follower catching up applies thousands in one go, and the first write of
            // a long run would wait for the last one (its reads, its ack, the lag a reader sees).
            applied.publish(db.applied_seqno());
        }
        // Compared with the engine, not with what this thread applied: startup replay applies before
        // the first message, and its frontier must show too. Replay applies only up to the commit
        // hint, where `commit` starts, so nothing applied is ever past the commit frontier.
        let engine = db.applied_seqno();
        assert!(engine <= commit, "the engine applied {engine}, past the commit frontier {commit}");
        applied.publish(engine);
        if stop {
            return;
        }
    }
}

/// A probe killed the node here: nothing more is applied or published; the input is drained
/// (so its senders never block) until the node's senders are gone or it is told to stop, and the
/// watch of the applied frontier stays open meanwhile (its waiters wait, as a dead process's
/// clients do).
fn drain_dead(input: &MailboxReceiver<ApplierInput>) {
    tracing::warn!("apply probe: the node died in its applier");
    while let Some((message, _turn)) = input.recv_in_turn() {
        match message {
            ApplierInput::Stop => return,
            ApplierInput::SnapshotInstalled { done, .. } => drop(done),
            _ => {}
        }
    }
}

/// The engine's durability gate on a cluster member (decisions/025): the flusher waits here until
/// the WAL is durable through the overlay it writes to fjall. The WAL's own durable frontier is the
/// truth (it may also go down, at a quarantine); the condvar only wakes waiters, at each flush.
/// It holds a [`DurableView`], not the WAL: the engine holds the gate, and a WAL kept open by its
/// engine would keep its writer, hook, applier and so the engine itself alive (a crashed node's
/// fjall lock would never be released).
#[derive(Default)]
pub struct DurableFrontier {
    wal: OnceLock<DurableView>,
    /// Held by a waiter from its look at the frontier until it waits, and by `notify`.
    lock: Mutex<()>,
    flushed: Condvar,
}

impl DurableFrontier {
    /// A gate that holds everything back until [`DurableFrontier::attach`] gives it the WAL.
    pub fn new() -> Arc<DurableFrontier> {
        Arc::new(DurableFrontier::default())
    }

    /// The WAL whose durable frontier this is (once; later calls are ignored).
    pub fn attach(&self, wal: DurableView) {
        let _ = self.wal.set(wal);
        self.notify();
    }

    /// The WAL made a drain durable (its hook, on the writer thread).
    pub fn notify(&self) {
        drop(self.lock.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        self.flushed.notify_all();
    }
}

impl DurableGate for DurableFrontier {
    fn wait_durable(&self, seqno: Seqno, timeout: Duration) -> GateWait {
        let look = || match self.wal.get() {
            None => GateWait::NotYet,
            Some(wal) if wal.durable_seqno() >= seqno => GateWait::Durable,
            Some(wal) if wal.is_poisoned() => GateWait::Never("the WAL is poisoned".into()),
            Some(_) => GateWait::NotYet,
        };
        let guard = self.lock.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Looked at under the lock a flush notifies through: no wake-up is lost in between.
        match look() {
            GateWait::NotYet => {}
            seen => return seen,
        }
        let _ = self.flushed.wait_timeout(guard, timeout);
        look()
    }
}

/// The WAL hook of a node whose commit frontier is its durable frontier (a single node, or a leader
/// in `leader` durability): every flushed drain is committed at once.
pub struct CommitOnFlush(pub ApplierSender);

impl FlushedHook for CommitOnFlush {
    fn flushed(&mut self, batches: &[Batch]) {
        if let Some(last) = batches.last() {
            let last = last.last_seqno();
            self.0.flushed(batches.to_vec());
            self.0.commit(last);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use tidal_core::{encode_payload, EngineConfig, Envelope, Records};
    use tidal_types::Term;

    /// An item write at `seqno` in term 1 (the replica's tests use it too).
    pub(crate) fn item_batch(seqno: u64) -> Batch {
        let envelope = Envelope { time_ms: 1, principal: "p".into(), idempotency_key: String::new() };
        let encoded =
            encode_payload(&envelope, &Records::ItemMetadata { item: seqno, metadata: b"{}".to_vec() });
        Batch::new(encoded.kind, Term(1), Seqno(seqno), encoded.event_count, &encoded.payload)
    }

    /// Dies at `point` of the batch starting at `first`.
    struct DieAt(ApplyPoint, Seqno);

    impl ApplyProbe for DieAt {
        fn reached(&self, point: ApplyPoint, first: Seqno, _last: Seqno) -> bool {
            point == self.0 && first == self.1
        }
    }

    #[test]
    fn a_probe_stops_the_applier_at_its_point() {
        for (point, engine_applied) in [(ApplyPoint::BeforeApply, 1), (ApplyPoint::BeforePublish, 2)] {
            let dir = tempfile::tempdir().unwrap();
            let db = Arc::new(TidalDb::open(dir.path(), EngineConfig::with_dimension(4)).unwrap());
            let (applier, sender) =
                Applier::spawn_probed(db.clone(), Some(Arc::new(DieAt(point, Seqno(2))))).unwrap();
            sender.flushed(vec![item_batch(1), item_batch(2), item_batch(3)]);
            sender.commit(Seqno(3));
            // Messages are handled in order; a dead applier never confirms an install.
            assert!(!sender.snapshot_installed(Seqno::ZERO), "{point:?}: the applier did not die");
            assert_eq!(db.applied_seqno(), Seqno(engine_applied), "{point:?}: the engine's frontier");
            // Batch 1 was applied and shown before the probe fired at batch 2, which never is.
            assert_eq!(*applier.applied().borrow(), Seqno(1), "{point:?}: the published frontier");
            applier.join(sender);
        }
    }

    /// Records, before each batch is applied, the frontier the node's readers see then.
    #[derive(Default)]
    struct SeenBefore {
        applied: OnceLock<watch::Receiver<Seqno>>,
        seen: Mutex<Vec<(Seqno, Seqno)>>,
    }

    impl ApplyProbe for SeenBefore {
        fn reached(&self, point: ApplyPoint, first: Seqno, _last: Seqno) -> bool {
            if let (ApplyPoint::BeforeApply, Some(applied)) = (point, self.applied.get()) {
                self.seen.lock().unwrap().push((first, *applied.borrow()));
            }
            false
        }
    }

    #[test]
    fn a_long_run_of_committed_batches_is_shown_batch_by_batch() {
        // A follower catching up gets one commit covering many batches. Each must be visible as
        // soon as it is applied: before this, the frontier moved once, after the last one.
        let dir = tempfile::tempdir().unwrap();
        let db = Arc::new(TidalDb::open(dir.path(), EngineConfig::with_dimension(4)).unwrap());
        let probe = Arc::new(SeenBefore::default());
        let (applier, sender) = Applier::spawn_probed(db, Some(probe.clone())).unwrap();
        probe.applied.set(applier.applied()).unwrap();
        sender.flushed((1..=100).map(item_batch).collect());
        sender.commit(Seqno(100));
        assert!(sender.snapshot_installed(Seqno(100)), "the applier handled everything before");
        let seen = probe.seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 100);
        for (first, shown) in seen {
            assert_eq!(shown.get(), first.get() - 1, "before batch {first} the readers saw {shown}");
        }
        applier.join(sender);
    }

    #[test]
    fn a_snapshot_install_drops_the_pending_batches_of_the_old_log() {
        let dir = tempfile::tempdir().unwrap();
        let db = Arc::new(TidalDb::open(dir.path(), EngineConfig::with_dimension(4)).unwrap());
        let (applier, sender) = Applier::spawn(db.clone()).unwrap();
        let (told, hear) = std::sync::mpsc::channel();
        applier.waiters().on_applied(Seqno(2), Box::new(Told(told, "write at 2")));
        sender.flushed(vec![item_batch(1), item_batch(2)]);
        assert!(sender.snapshot_installed(Seqno::ZERO));
        assert_eq!(hear.try_recv(), Ok(("write at 2", Reached::Cut)), "a write of the replaced log");
        sender.commit(Seqno(2));
        // Messages are handled in order: once this one is acknowledged the commit was handled too.
        assert!(sender.snapshot_installed(Seqno::ZERO));
        assert_eq!(db.applied_seqno(), Seqno::ZERO, "a dropped batch was applied");
        sender.flushed(vec![item_batch(1)]);
        sender.commit(Seqno(1));
        assert!(sender.snapshot_installed(Seqno::ZERO));
        assert_eq!(db.applied_seqno(), Seqno(1), "batches after the install apply");
        applier.join(sender);
    }

    /// A waiter that reports what it is told on a channel.
    struct Told(std::sync::mpsc::Sender<(&'static str, Reached)>, &'static str);

    impl AppliedWaiter for Told {
        fn reached(self: Box<Self>, reached: Reached) {
            let _ = self.0.send((self.1, reached));
        }

        fn abandoned(&self) -> bool {
            false
        }
    }

    #[test]
    fn a_write_whose_batch_is_cut_hears_so_though_another_batch_takes_its_seqno() {
        // A deposed leader's write at seqno 1 waits; its batch is cut (a divergent suffix) and the
        // new leader's batch at seqno 1 is applied. The frontier passing 1 says nothing about the
        // old write: it must hear `Cut` (outcome unknown), never `Applied`.
        let dir = tempfile::tempdir().unwrap();
        let db = Arc::new(TidalDb::open(dir.path(), EngineConfig::with_dimension(4)).unwrap());
        let (applier, sender) = Applier::spawn(db.clone()).unwrap();
        let (told, hear) = std::sync::mpsc::channel();
        let within = Duration::from_secs(10);
        applier.waiters().on_applied(Seqno(1), Box::new(Told(told.clone(), "old write")));
        sender.flushed(vec![item_batch_in(1, 1, br#"{"log":"old"}"#)]);
        sender.truncated(Seqno(1));
        assert_eq!(hear.recv_timeout(within), Ok(("old write", Reached::Cut)));
        sender.flushed(vec![item_batch_in(2, 1, br#"{"log":"new"}"#)]);
        sender.commit(Seqno(1));
        applier.waiters().on_applied(Seqno(1), Box::new(Told(told, "new write")));
        assert_eq!(hear.recv_timeout(within), Ok(("new write", Reached::Applied(Seqno(1)))));
        applier.join(sender);
    }

    fn item_batch_in(term: u64, seqno: u64, metadata: &[u8]) -> Batch {
        let envelope = Envelope { time_ms: 1, principal: "p".into(), idempotency_key: String::new() };
        let encoded =
            encode_payload(&envelope, &Records::ItemMetadata { item: 7, metadata: metadata.to_vec() });
        Batch::new(encoded.kind, Term(term), Seqno(seqno), encoded.event_count, &encoded.payload)
    }

    #[test]
    fn a_commit_told_beside_the_channel_never_overtakes_a_cut() {
        // The applier's input as the WAL writer and a commit notice leave it: an old log's batch at
        // seqno 1, the cut that drops it, the new log's batch at seqno 1, and the commit of seqno 1
        // (told beside the channel too, as a notice refused by a full channel would be). The
        // applier runs on this thread only after all of it is queued, so it sees the told frontier
        // while it holds the OLD batch: it must wait for the cut.
        let dir = tempfile::tempdir().unwrap();
        let db = Arc::new(TidalDb::open(dir.path(), EngineConfig::with_dimension(4)).unwrap());
        let (tx, rx) = mailbox::mailbox(APPLIER_INPUT_MAX);
        let told = Arc::new(Mutex::new((Seqno::ZERO, 0)));
        let sender = ApplierSender {
            tx,
            cuts: Arc::new(AtomicU64::new(0)),
            told: told.clone(),
            commit_dropped: Arc::new(AtomicBool::new(false)),
        };
        sender.flushed(vec![item_batch_in(1, 1, br#"{"log":"old"}"#)]);
        sender.truncated(Seqno(1));
        sender.flushed(vec![item_batch_in(2, 1, br#"{"log":"new"}"#)]);
        sender.commit(Seqno(1));
        drop(sender);
        let (watch, _) = watch::channel(Seqno::ZERO);
        let applied = Publisher { watch, waiters: AppliedWaiters::new(Seqno::ZERO) };
        run(db.clone(), rx, &told, applied, Arc::new(Mutex::new(None)), None);
        assert_eq!(db.applied_seqno(), Seqno(1));
        let item = db.get_item(7).unwrap().expect("item 7 applied");
        assert_eq!(item.metadata, br#"{"log":"new"}"#.to_vec(), "the old log's batch was applied");
    }
}
