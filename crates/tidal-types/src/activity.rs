//! Work handed from a node's async tasks to threads of their own, counted so that a simulation can
//! wait until those threads are done before it advances time (decisions/051).
//!
//! A node hands work to real threads: the WAL writer, the applier, tokio's blocking pool. In the
//! turmoil simulation every node's async code runs on one thread, step by step, on a simulated
//! clock; these threads run beside it on the OS's schedule. Without a barrier, a write submitted
//! in one step completed in that step or in one of the next few, depending on the OS, and a replay
//! of a seed diverged from its first run within milliseconds. With [`Activity`], the simulation
//! waits after every step until no handed-off work is left, so everything handed off in a step is
//! done before the next one, and those threads take their turns only between steps, never while
//! a step runs: what they see of the nodes' async side, and when they wake it, depends on the
//! steps alone.
//!
//! In production nothing is counted: [`current`] is `None` on every thread unless the simulation
//! set it, and every counting call is a check of that `None`.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a thread waits for a step to end, or a step for the threads' turns to end, before it
/// goes on anyway (counted in [`Activity::stalls`]): a thread the step itself waits for must not
/// deadlock the simulation.
const TURN_WAIT_MAX: Duration = Duration::from_secs(2);

/// Counts work handed to threads outside the async runtime, and keeps that work and the
/// simulation's steps apart.
#[derive(Debug, Default)]
pub struct Activity {
    busy: AtomicUsize,
    turns: Mutex<Turns>,
    /// Signalled when the last turn ends.
    turns_done: Condvar,
    /// Signalled when a step ends.
    step_done: Condvar,
    stalls: AtomicUsize,
}

#[derive(Debug, Default)]
struct Turns {
    stepping: bool,
    inside: usize,
    /// Blocking work running that waits for the node's threads ([`carry_awaiting_threads`]):
    /// they take their turns meanwhile, step or not.
    opened: usize,
}

impl Activity {
    /// A new, idle counter.
    pub fn new() -> Arc<Activity> {
        Arc::new(Activity::default())
    }

    /// Handed-off work not done yet.
    pub fn busy(&self) -> usize {
        self.busy.load(Ordering::SeqCst)
    }

    /// Times a wait gave up after [`TURN_WAIT_MAX`].
    pub fn stalls(&self) -> usize {
        self.stalls.load(Ordering::SeqCst)
    }

    fn lock(&self) -> MutexGuard<'_, Turns> {
        self.turns.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The simulation starts a step: no thread starts a turn until [`Activity::end_step`], and
    /// this waits for the turns already started.
    pub fn begin_step(&self) {
        let mut turns = self.lock();
        turns.stepping = true;
        let deadline = Instant::now() + TURN_WAIT_MAX;
        while turns.inside > 0 {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                self.stalls.fetch_add(1, Ordering::SeqCst);
                return;
            };
            turns = self.turns_done.wait_timeout(turns, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// The simulation's step ended: threads take their turns.
    pub fn end_step(&self) {
        self.lock().stepping = false;
        self.step_done.notify_all();
    }

    /// Threads take their turns even during a step until the guard is dropped (see
    /// [`carry_awaiting_threads`]).
    fn open_turns(self: &Arc<Activity>) -> OpenTurns {
        self.lock().opened += 1;
        self.step_done.notify_all();
        OpenTurns(Some(self.clone()))
    }

    /// A turn of a thread's own work, taken between steps (waits for a running step to end).
    pub fn turn(self: &Arc<Activity>) -> Turn {
        let mut turns = self.lock();
        let deadline = Instant::now() + TURN_WAIT_MAX;
        while turns.stepping && turns.opened == 0 {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                self.stalls.fetch_add(1, Ordering::SeqCst);
                break;
            };
            turns = self.step_done.wait_timeout(turns, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        turns.inside += 1;
        Turn(Some(self.clone()))
    }

    /// Counts one piece of work until the returned guard is dropped.
    pub fn begin(self: &Arc<Activity>) -> Busy {
        self.busy.fetch_add(1, Ordering::SeqCst);
        Busy(Some(self.clone()))
    }
}

/// One piece of counted work; done when dropped.
#[derive(Debug)]
#[must_use = "the work counts as done when the guard is dropped"]
pub struct Busy(Option<Arc<Activity>>);

impl Busy {
    /// A guard that counts nothing.
    pub fn none() -> Busy {
        Busy(None)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if let Some(activity) = self.0.take() {
            activity.busy.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// A thread's turn (see [`Activity::turn`]); ends when dropped.
#[derive(Debug)]
#[must_use = "the turn ends when the guard is dropped"]
pub struct Turn(Option<Arc<Activity>>);

impl Turn {
    /// A turn outside any activity (production).
    pub fn none() -> Turn {
        Turn(None)
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some(activity) = self.0.take() {
            let mut turns = activity.lock();
            turns.inside -= 1;
            if turns.inside == 0 {
                drop(turns);
                activity.turns_done.notify_all();
            }
        }
    }
}

/// Turns opened during a step (see [`Activity::open_turns`]).
struct OpenTurns(Option<Arc<Activity>>);

impl Drop for OpenTurns {
    fn drop(&mut self) {
        if let Some(activity) = self.0.take() {
            activity.lock().opened -= 1;
        }
    }
}

thread_local! {
    static CURRENT: RefCell<Option<Arc<Activity>>> = const { RefCell::new(None) };
}

/// The activity work started on this thread counts on, if any.
pub fn current() -> Option<Arc<Activity>> {
    CURRENT.with(|current| current.borrow().clone())
}

/// Sets this thread's activity; returns the one it replaces.
pub fn set_current(activity: Option<Arc<Activity>>) -> Option<Arc<Activity>> {
    CURRENT.with(|current| std::mem::replace(&mut *current.borrow_mut(), activity))
}

/// Counts one piece of work on this thread's activity (nothing without one).
pub fn begin() -> Busy {
    match current() {
        Some(activity) => activity.begin(),
        None => Busy::none(),
    }
}

/// Wraps `work` for another thread: it counts as busy from now until it returns, and runs with this
/// thread's activity as its own (so threads it starts count too). The node's own threads (WAL
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
    let activity = current();
    let busy = begin();
    move || {
        let opened = match &activity {
            Some(activity) if awaiting_threads => activity.open_turns(),
            _ => OpenTurns(None),
        };
        let previous = set_current(activity);
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
    activity: Option<Arc<Activity>>,
    woken: AtomicBool,
}

impl Handoff {
    /// A handoff on this thread's activity (counting nothing without one).
    pub fn on_current() -> Handoff {
        Handoff { activity: current(), woken: AtomicBool::new(false) }
    }

    /// The thread is being woken for work.
    pub fn woken(&self) {
        if let Some(activity) = &self.activity {
            if !self.woken.swap(true, Ordering::SeqCst) {
                activity.busy.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    /// The thread has no work left and goes to sleep.
    pub fn parked(&self) {
        if let Some(activity) = &self.activity {
            if self.woken.swap(false, Ordering::SeqCst) {
                activity.busy.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    /// Whether this handoff counts (only in a simulation).
    pub fn counted(&self) -> bool {
        self.activity.is_some()
    }

    /// A turn of the thread's work (see [`Activity::turn`]).
    pub fn turn(&self) -> Turn {
        self.activity.as_ref().map_or_else(Turn::none, Activity::turn)
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
    fn nothing_counts_without_an_activity() {
        assert!(current().is_none());
        let busy = begin();
        let handoff = Handoff::on_current();
        handoff.woken();
        drop(busy);
        handoff.parked();
    }

    #[test]
    fn carried_work_counts_until_it_returns_and_runs_on_the_activity() {
        let activity = Activity::new();
        set_current(Some(activity.clone()));
        let work = carry(|| current().map(|inner| inner.busy()));
        assert_eq!(activity.busy(), 1);
        let seen = std::thread::spawn(work).join().unwrap();
        assert_eq!(seen, Some(1), "the work runs on the carried activity while it counts");
        assert_eq!(activity.busy(), 0);
        set_current(None);
    }

    #[test]
    fn a_handoff_counts_once_per_wake_until_parked_and_ends_when_dropped() {
        let activity = Activity::new();
        set_current(Some(activity.clone()));
        let handoff = Handoff::on_current();
        set_current(None);
        handoff.woken();
        handoff.woken();
        assert_eq!(activity.busy(), 1, "a second wake before the thread ran counts nothing more");
        handoff.parked();
        handoff.parked();
        assert_eq!(activity.busy(), 0);
        handoff.woken();
        drop(handoff);
        assert_eq!(activity.busy(), 0, "a thread that ended is not busy");
    }

    #[test]
    fn a_turn_waits_for_the_step_and_a_step_waits_for_the_turns() {
        let activity = Activity::new();
        activity.begin_step();
        let (tx, rx) = std::sync::mpsc::channel();
        let ended = Arc::new(AtomicBool::new(false));
        let thread = {
            let (activity, ended) = (activity.clone(), ended.clone());
            std::thread::spawn(move || {
                let turn = activity.turn();
                tx.send(()).unwrap();
                // A turn that lasts: a step that did not wait for it would find it running.
                std::thread::sleep(Duration::from_millis(50));
                ended.store(true, Ordering::SeqCst);
                drop(turn);
            })
        };
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err(), "no turn is taken while a step runs");
        activity.end_step();
        rx.recv_timeout(TURN_WAIT_MAX).expect("the turn is taken once the step ended");
        activity.begin_step();
        assert!(ended.load(Ordering::SeqCst), "the next step waited for the turn to end");
        activity.end_step();
        thread.join().unwrap();
        assert_eq!(activity.stalls(), 0);
    }

    #[test]
    fn blocking_work_that_awaits_the_threads_lets_them_take_turns_during_a_step() {
        let activity = Activity::new();
        set_current(Some(activity.clone()));
        activity.begin_step();
        let work = carry_awaiting_threads({
            let activity = activity.clone();
            move || std::thread::spawn(move || drop(activity.turn())).join().unwrap()
        });
        set_current(None);
        work();
        activity.end_step();
        assert_eq!(activity.stalls(), 0, "the thread got its turn without waiting out the step");
        assert_eq!(activity.busy(), 0);
    }
}
