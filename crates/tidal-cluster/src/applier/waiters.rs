//! Waiters keyed by seqno on the applied frontier: each is told once, when the frontier reaches its
//! seqno, and no other time (decisions/028).
//!
//! A `watch` of the frontier wakes every task that waits on it at every step: with 50 writes in
//! flight, each apply woke all 50 to find most still short. A write also woke twice: once when its
//! WAL append completed, once when it was applied. Here the WAL completion registers the write
//! directly (on the writer thread, no task wake), and the applier tells only the waiters its new
//! frontier covers, after the engine shows the state.
//!
//! Delicate:
//! - The frontier is checked and the waiter registered under one lock, so a publish between a check
//!   and a registration cannot be missed (then `on_applied` tells the waiter at once).
//! - Waiters are told outside the lock (they wake tasks; they may register more).
//! - Once the applier has stopped, every waiter, waiting or registered later, is told
//!   [`Reached::Stopped`] (the write's outcome is unknown: the node stops acknowledging).
//! - A cut of the log (a divergent suffix quarantined, a snapshot installed) tells every waiter at or
//!   above it [`Reached::Cut`]: its batch will never be applied, and other batches will take its
//!   seqnos, so the frontier passing them later says nothing about this write.
//! - A waiter whose write has gone is still told, at its seqno, a cut or the stop;
//!   [`AppliedWaiters::on_applied`] prunes the [`AppliedWaiter::abandoned`] ones when many wait, so a
//!   frontier that stops moving does not collect them without bound.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tidal_types::Seqno;

/// What a waiter is told, once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reached {
    /// The frontier reached the waited seqno; it is now this.
    Applied(Seqno),
    /// The log was cut at or below the waited seqno: the batch waited for is gone.
    Cut,
    /// The applier stopped first.
    Stopped,
}

/// One waiter on the applied frontier.
pub trait AppliedWaiter: Send {
    /// Told once.
    fn reached(self: Box<Self>, reached: Reached);

    /// Whether nobody waits here any more (then it may be dropped untold).
    fn abandoned(&self) -> bool;
}

/// Pruning runs when this many waiters wait (the write path keeps far fewer in flight).
const PRUNE_AT: usize = 4096;

/// The applied frontier's keyed waiters. The applier publishes; writes register.
pub struct AppliedWaiters {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    applied: Seqno,
    stopped: bool,
    waiting: BTreeMap<Seqno, Vec<Box<dyn AppliedWaiter>>>,
    count: usize,
}

impl AppliedWaiters {
    /// Waiters whose frontier starts at `applied`.
    pub fn new(applied: Seqno) -> Arc<AppliedWaiters> {
        Arc::new(AppliedWaiters { state: Mutex::new(State { applied, ..State::default() }) })
    }

    /// Tells `waiter` once the applied frontier reaches `seqno`: now (on this thread) if it has, else
    /// from the applier's publish; [`Reached::Stopped`] if the applier has stopped, [`Reached::Cut`]
    /// if the log is cut at or below `seqno` first.
    pub fn on_applied(&self, seqno: Seqno, waiter: Box<dyn AppliedWaiter>) {
        let now = {
            let mut state = self.lock();
            if state.stopped {
                Reached::Stopped
            } else if state.applied >= seqno {
                Reached::Applied(state.applied)
            } else {
                if state.count >= PRUNE_AT {
                    state.prune();
                }
                state.waiting.entry(seqno).or_default().push(waiter);
                state.count += 1;
                return;
            }
        };
        waiter.reached(now);
    }

    /// How many waiters wait (writes appended but not yet applied; abandoned ones until pruned).
    pub fn waiting(&self) -> usize {
        self.lock().count
    }

    /// The frontier is now `applied` (the engine already shows it): tells every waiter it covers.
    pub fn publish(&self, applied: Seqno) {
        let reached = {
            let mut state = self.lock();
            if applied <= state.applied {
                return;
            }
            state.applied = applied;
            let later = state.waiting.split_off(&applied.next());
            let reached = std::mem::replace(&mut state.waiting, later);
            state.count -= reached.values().map(Vec::len).sum::<usize>();
            reached
        };
        for waiter in reached.into_values().flatten() {
            waiter.reached(Reached::Applied(applied));
        }
    }

    /// The log was cut from `from` on (nothing at or above it will be applied from the log the
    /// waiters wrote to): tells every waiter at or above it [`Reached::Cut`].
    pub fn cut(&self, from: Seqno) {
        let cut = {
            let mut state = self.lock();
            let cut = state.waiting.split_off(&from);
            state.count -= cut.values().map(Vec::len).sum::<usize>();
            cut
        };
        for waiter in cut.into_values().flatten() {
            waiter.reached(Reached::Cut);
        }
    }

    /// The applier stopped: every waiter, waiting or later, is told [`Reached::Stopped`].
    pub fn stop(&self) {
        let waiting = {
            let mut state = self.lock();
            state.stopped = true;
            state.count = 0;
            std::mem::take(&mut state.waiting)
        };
        for waiter in waiting.into_values().flatten() {
            waiter.reached(Reached::Stopped);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Nothing panics while holding it (waiters are told outside); recover the data if it did.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl State {
    fn prune(&mut self) {
        self.waiting.retain(|_, waiters| {
            waiters.retain(|waiter| !waiter.abandoned());
            !waiters.is_empty()
        });
        self.count = self.waiting.values().map(Vec::len).sum();
    }
}

/// The applier's side: publishes to the `watch` (whoever follows every step) and the keyed
/// waiters; dropping it (the applier thread ended) stops the waiters, as it closes the watch.
pub(super) struct Publisher {
    pub(super) watch: tokio::sync::watch::Sender<Seqno>,
    pub(super) waiters: Arc<AppliedWaiters>,
}

impl Publisher {
    pub(super) fn publish(&self, now: Seqno) {
        self.watch.send_if_modified(|published| std::mem::replace(published, now) != now);
        self.waiters.publish(now);
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.waiters.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::{AppliedWaiter, AppliedWaiters, Reached};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use tidal_types::Seqno;

    type Calls = Arc<Mutex<Vec<(u64, Reached)>>>;

    struct Recorded {
        calls: Calls,
        tag: u64,
        gone: Arc<AtomicBool>,
    }

    impl AppliedWaiter for Recorded {
        fn reached(self: Box<Self>, reached: Reached) {
            self.calls.lock().expect("test lock").push((self.tag, reached));
        }

        fn abandoned(&self) -> bool {
            self.gone.load(Ordering::SeqCst)
        }
    }

    fn record(calls: &Calls, tag: u64) -> Box<Recorded> {
        Box::new(Recorded { calls: calls.clone(), tag, gone: Arc::default() })
    }

    fn calls(calls: &Calls) -> Vec<(u64, Reached)> {
        calls.lock().expect("test lock").clone()
    }

    #[test]
    fn each_waiter_is_told_once_when_the_frontier_covers_it() {
        let waiters = AppliedWaiters::new(Seqno(5));
        let told = Calls::default();
        waiters.on_applied(Seqno(3), record(&told, 3));
        assert_eq!(calls(&told), vec![(3, Reached::Applied(Seqno(5)))], "already applied: told at once");
        waiters.on_applied(Seqno(7), record(&told, 7));
        waiters.on_applied(Seqno(9), record(&told, 9));
        waiters.on_applied(Seqno(7), record(&told, 70));
        waiters.publish(Seqno(6));
        assert_eq!(calls(&told).len(), 1, "nothing covered at 6");
        waiters.publish(Seqno(8));
        assert_eq!(calls(&told)[1..], [(7, Reached::Applied(Seqno(8))), (70, Reached::Applied(Seqno(8)))]);
        waiters.publish(Seqno(8));
        waiters.publish(Seqno(4));
        assert_eq!(calls(&told).len(), 3, "a publish that does not advance tells nobody");
        assert_eq!(waiters.waiting(), 1);
        waiters.publish(Seqno(20));
        assert_eq!(calls(&told)[3..], [(9, Reached::Applied(Seqno(20)))]);
        assert_eq!(waiters.waiting(), 0);
    }

    #[test]
    fn a_stop_tells_every_waiter_and_every_later_one_none() {
        let waiters = AppliedWaiters::new(Seqno(0));
        let told = Calls::default();
        waiters.on_applied(Seqno(1), record(&told, 1));
        waiters.on_applied(Seqno(2), record(&told, 2));
        waiters.stop();
        waiters.on_applied(Seqno(3), record(&told, 3));
        waiters.publish(Seqno(10));
        assert_eq!(calls(&told), vec![(1, Reached::Stopped), (2, Reached::Stopped), (3, Reached::Stopped)]);
    }

    #[test]
    fn a_cut_tells_the_waiters_at_and_above_it_and_keeps_the_rest() {
        let waiters = AppliedWaiters::new(Seqno(0));
        let told = Calls::default();
        for seqno in [2, 4, 5, 9] {
            waiters.on_applied(Seqno(seqno), record(&told, seqno));
        }
        waiters.cut(Seqno(4));
        assert_eq!(calls(&told), vec![(4, Reached::Cut), (5, Reached::Cut), (9, Reached::Cut)]);
        // The new log's batches at those seqnos are applied: only the waiter below the cut hears it.
        waiters.publish(Seqno(9));
        assert_eq!(calls(&told)[3..], [(2, Reached::Applied(Seqno(9)))]);
        assert_eq!(waiters.lock().count, 0);
    }

    #[test]
    fn abandoned_waiters_are_pruned_when_many_wait_and_the_frontier_stands_still() {
        let waiters = AppliedWaiters::new(Seqno(0));
        let told = Calls::default();
        let gone = Arc::new(AtomicBool::new(false));
        for i in 0..super::PRUNE_AT as u64 {
            waiters.on_applied(
                Seqno(i + 1),
                Box::new(Recorded { calls: told.clone(), tag: i, gone: gone.clone() }),
            );
        }
        gone.store(true, Ordering::SeqCst);
        waiters.on_applied(Seqno(1), record(&told, 99_999));
        assert_eq!(waiters.lock().count, 1, "the abandoned ones were dropped");
        waiters.publish(Seqno(1));
        assert_eq!(calls(&told), vec![(99_999, Reached::Applied(Seqno(1)))]);
    }

    #[test]
    fn a_waiter_racing_the_publish_from_another_thread_is_never_missed() {
        for round in 0..200u64 {
            let waiters = AppliedWaiters::new(Seqno(0));
            let told = Calls::default();
            let publisher = {
                let waiters = waiters.clone();
                std::thread::spawn(move || {
                    for seqno in 1..=50 {
                        waiters.publish(Seqno(seqno));
                    }
                })
            };
            for seqno in 1..=50 {
                waiters.on_applied(Seqno(seqno), record(&told, seqno));
            }
            publisher.join().expect("publisher thread");
            let told = calls(&told);
            assert_eq!(told.len(), 50, "round {round}: every waiter told");
            assert!(
                told.iter().all(|(tag, reached)| matches!(reached, Reached::Applied(r) if r.get() >= *tag)),
                "round {round}"
            );
        }
    }
}
