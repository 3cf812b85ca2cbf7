//! Work handed from a node's async tasks to threads of their own, counted so that a simulation can
//! wait until those threads are done before it advances time (decisions/051, 052).
//!
//! A node hands work to real threads: the WAL writer, the applier, tokio's blocking pool. In the
//! turmoil simulation every node's async code runs on one thread, step by step, on a simulated
//! clock; these threads run beside it on the OS's schedule. The simulation's [`Scheduler`]
//! (`chaos/sim`'s `activity.rs`) counts that work and grants those threads their turns only
//! between its steps, one at a time in a fixed order, so a replay of a seed sees them act at the
//! same points.
//!
//! This module is the production side of that seam: the [`Scheduler`] trait and the handles node
//! code calls where it hands work over ([`Handoff`], [`Turn`], [`blocked`], [`carry`],
//! [`carry_awaiting_threads`]). In production nothing is counted: [`current`] is `None` on every
//! thread unless the simulation set it, and every call is a check of that `None`.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// What the simulation installs on a thread ([`set_current`]) to count handed-off work and order
/// the threads' turns. Every method is called by the handles of this module only.
///
/// Turns are taken one at a time: each [`Handoff`] has a rank (the order the handoffs were made
/// in, [`Scheduler::new_rank`]), and the scheduler decides which waiting rank goes next and when.
pub trait Scheduler: Send + Sync + std::fmt::Debug + 'static {
    /// A rank for a new handoff: its place in the order of turns.
    fn new_rank(&self) -> u64;
    /// One more piece of handed-off work is pending.
    fn work_begun(&self);
    /// A piece of handed-off work is done.
    fn work_done(&self);
    /// The thread ranked `rank` was woken for work (`true`) or parked (`false`).
    fn set_awake(&self, rank: u64, awake: bool);
    /// Waits for `rank`'s turn and takes it.
    fn take_turn(&self, rank: u64);
    /// The running turn ended.
    fn end_turn(&self);
    /// The thread ranked `rank` left its turn to wait for another thread ([`blocked`]).
    fn block(&self, rank: u64);
    /// The thread ranked `rank` is done waiting for another thread; it asks for its turn next.
    fn unblock(&self, rank: u64);
    /// Blocking work that waits for the node's threads starts (`true`) or ends (`false`): they
    /// take their turns meanwhile, step or not ([`carry_awaiting_threads`]).
    fn open_turns(&self, open: bool);
}

thread_local! {
    static CURRENT: RefCell<Option<Arc<dyn Scheduler>>> = const { RefCell::new(None) };
    /// The turn this thread holds, with its rank (for [`blocked`]).
    static HELD: RefCell<Option<(Arc<dyn Scheduler>, u64)>> = const { RefCell::new(None) };
}

/// The scheduler work started on this thread counts on, if any.
pub fn current() -> Option<Arc<dyn Scheduler>> {
    CURRENT.with(|current| current.borrow().clone())
}

/// Sets this thread's scheduler; returns the one it replaces.
pub fn set_current(scheduler: Option<Arc<dyn Scheduler>>) -> Option<Arc<dyn Scheduler>> {
    CURRENT.with(|current| std::mem::replace(&mut *current.borrow_mut(), scheduler))
}

/// Runs `wait`, a wait for another thread, outside this thread's turn if it holds one: the turn
/// ends, the thread counts as blocked (turns go on without it), and it asks for its turn again
/// once `wait` returns. A thread that waited inside its turn for one that needs a turn would stall.
pub fn blocked<R>(wait: impl FnOnce() -> R) -> R {
    let Some((scheduler, rank)) = HELD.with(|held| held.borrow_mut().take()) else {
        return wait();
    };
    scheduler.block(rank);
    let result = wait();
    scheduler.unblock(rank);
    // The same turn again (its guard is still held by the caller).
    take_turn(&scheduler, rank);
    result
}

/// Waits for `rank`'s turn and takes it (the thread holds it from here).
fn take_turn(scheduler: &Arc<dyn Scheduler>, rank: u64) {
    scheduler.take_turn(rank);
    HELD.with(|held| *held.borrow_mut() = Some((scheduler.clone(), rank)));
}

/// One piece of counted work; done when dropped.
#[derive(Debug)]
#[must_use = "the work counts as done when the guard is dropped"]
pub struct Busy(Option<Arc<dyn Scheduler>>);

impl Busy {
    /// A guard that counts nothing.
    pub fn none() -> Busy {
        Busy(None)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if let Some(scheduler) = self.0.take() {
            scheduler.work_done();
        }
    }
}

/// A thread's turn (see [`Handoff::turn`]); ends when dropped.
#[derive(Debug)]
#[must_use = "the turn ends when the guard is dropped"]
pub struct Turn(Option<Arc<dyn Scheduler>>);

impl Turn {
    /// A turn outside any scheduler (production).
    pub fn none() -> Turn {
        Turn(None)
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some(scheduler) = self.0.take() {
            HELD.with(|held| held.borrow_mut().take());
            scheduler.end_turn();
        }
    }
}

/// Turns opened while blocking work runs (see [`carry_awaiting_threads`]).
struct OpenTurns(Option<Arc<dyn Scheduler>>);

impl Drop for OpenTurns {
    fn drop(&mut self) {
        if let Some(scheduler) = self.0.take() {
            scheduler.open_turns(false);
        }
    }
}

/// Counts one piece of work on this thread's scheduler (nothing without one).
pub fn begin() -> Busy {
    match current() {
        Some(scheduler) => {
            scheduler.work_begun();
            Busy(Some(scheduler))
        }
        None => Busy::none(),
    }
}

/// Wraps `work` for another thread: it counts as busy from now until it returns, and runs with this
/// thread's scheduler as its own (so threads it starts count too). The node's own threads (WAL
/// writer, applier) keep waiting for the step to end meanwhile: `work` must not wait for them (see
/// [`carry_awaiting_threads`]).
pub fn carry<R>(work: impl FnOnce() -> R) -> impl FnOnce() -> R {
    carry_as(work, false)
}

/// [`carry`] for blocking work that waits for the node's own threads (an append or a truncation
/// through the WAL writer, a shutdown, a snapshot install the applier must see): they take their
/// turns while it runs. tokio does not advance a paused clock while blocking work runs, so a step
/// that awaits this work cannot end before it does; without their turns it never would.
pub fn carry_awaiting_threads<R>(work: impl FnOnce() -> R) -> impl FnOnce() -> R {
    carry_as(work, true)
}

fn carry_as<R>(work: impl FnOnce() -> R, awaiting_threads: bool) -> impl FnOnce() -> R {
    let scheduler = current();
    let busy = begin();
    move || {
        let opened = match &scheduler {
            Some(scheduler) if awaiting_threads => {
                scheduler.open_turns(true);
                OpenTurns(Some(scheduler.clone()))
            }
            _ => OpenTurns(None),
        };
        let previous = set_current(scheduler);
        let result = work();
        drop(opened);
        set_current(previous);
        drop(busy);
        result
    }
}

/// A thread that sleeps until other threads hand it work: it counts as busy from the first wake
/// after it parked until it parks again.
///
/// The waker calls [`Handoff::woken`] where it decides to wake the thread, and the thread calls
/// [`Handoff::parked`] where it decides to sleep, both under the lock that guards the thread's
/// queue, so a wake is never lost between the two. Dropping the handoff (the thread ended) ends a
/// pending count.
#[derive(Debug, Default)]
pub struct Handoff {
    scheduler: Option<Arc<dyn Scheduler>>,
    /// Its place in the order of turns.
    rank: u64,
    woken: AtomicBool,
}

impl Handoff {
    /// A handoff on this thread's scheduler (counting nothing without one).
    pub fn on_current() -> Handoff {
        let scheduler = current();
        let rank = scheduler.as_ref().map_or(0, |scheduler| scheduler.new_rank());
        Handoff { scheduler, rank, woken: AtomicBool::new(false) }
    }

    /// The thread is being woken for work.
    pub fn woken(&self) {
        if let Some(scheduler) = &self.scheduler {
            if !self.woken.swap(true, Ordering::SeqCst) {
                scheduler.work_begun();
                scheduler.set_awake(self.rank, true);
            }
        }
    }

    /// The thread has no work left and goes to sleep.
    pub fn parked(&self) {
        if let Some(scheduler) = &self.scheduler {
            if self.woken.swap(false, Ordering::SeqCst) {
                scheduler.set_awake(self.rank, false);
                scheduler.work_done();
            }
        }
    }

    /// Whether this handoff counts (only in a simulation).
    pub fn counted(&self) -> bool {
        self.scheduler.is_some()
    }

    /// A turn of the thread's work (the scheduler's: one thread at a time, in rank order).
    pub fn turn(&self) -> Turn {
        match &self.scheduler {
            Some(scheduler) => {
                take_turn(scheduler, self.rank);
                Turn(Some(scheduler.clone()))
            }
            None => Turn::none(),
        }
    }
}

impl Drop for Handoff {
    fn drop(&mut self) {
        self.parked();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_counts_without_a_scheduler() {
        assert!(current().is_none());
        let busy = begin();
        let handoff = Handoff::on_current();
        assert!(!handoff.counted());
        handoff.woken();
        drop(busy);
        handoff.parked();
        drop(handoff.turn());
        assert_eq!(blocked(|| 7), 7);
        assert!(carry_awaiting_threads(|| current().is_none())());
    }
}
