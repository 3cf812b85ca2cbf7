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
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a thread waits for its turn, or a step for the turns to end, before it goes on anyway
/// (counted in [`Activity::stalls`]): a thread the step itself waits for must not deadlock the
/// simulation.
const TURN_WAIT_MAX: Duration = Duration::from_secs(2);

/// Counts work handed to threads outside the async runtime, and keeps that work and the
/// simulation's steps apart.
///
/// Turns are taken one at a time, in a fixed order: each [`Handoff`] has a rank (the order the
/// handoffs were made in, which the steps decide), and a turn goes to the lowest-ranked waiting
/// thread only once every thread that was woken has either asked for its turn, parked, or blocked
/// (see [`blocked`]). Two threads that took turns side by side woke the nodes' tasks in an order
/// the OS chose, and a node's runtime polls its tasks in wake order; one thread that got there
/// first, before another that was still on its way, chose the order just as well.
#[derive(Debug, Default)]
pub struct Activity {
    busy: AtomicUsize,
    turns: Mutex<Turns>,
    /// Signalled whenever [`Turns`] changes.
    changed: Condvar,
    stalls: AtomicUsize,
}

#[derive(Debug, Default)]
struct Turns {
    stepping: bool,
    /// Turns running (more than one only after a stall).
    inside: usize,
    /// Blocking work running that waits for the node's threads ([`carry_awaiting_threads`]):
    /// they take their turns meanwhile, step or not.
    opened: usize,
    /// The handoffs' next rank.
    next_rank: u64,
    /// Ranks of the threads woken and not parked since.
    awake: BTreeSet<u64>,
    /// Ranks of the threads asking for a turn.
    waiting: BTreeSet<u64>,
    /// Ranks of the threads that left their turn to wait for another thread ([`blocked`]).
    blocked: BTreeSet<u64>,
}

impl Turns {
    /// Whether `rank` takes its turn now.
    fn grants(&self, rank: u64) -> bool {
        (!self.stepping || self.opened > 0)
            && self.inside == 0
            && self.waiting.first() == Some(&rank)
            && self.awake.iter().all(|awake| self.waiting.contains(awake) || self.blocked.contains(awake))
    }
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

    /// Waits on [`Activity::changed`] until `done` or [`TURN_WAIT_MAX`] (then a stall).
    fn wait_until<'a>(
        &self,
        mut turns: MutexGuard<'a, Turns>,
        done: impl Fn(&Turns) -> bool,
    ) -> MutexGuard<'a, Turns> {
        let deadline = Instant::now() + TURN_WAIT_MAX;
        while !done(&turns) {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                self.stalls.fetch_add(1, Ordering::SeqCst);
                break;
            };
            turns = self.changed.wait_timeout(turns, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        turns
    }

    /// The simulation starts a step: no thread starts a turn until [`Activity::end_step`], and
    /// this waits for the turn already started.
    pub fn begin_step(&self) {
        let mut turns = self.lock();
        turns.stepping = true;
        drop(self.wait_until(turns, |turns| turns.inside == 0));
    }

    /// The simulation's step ended: threads take their turns.
    pub fn end_step(&self) {
        self.lock().stepping = false;
        self.changed.notify_all();
    }

    /// Threads take their turns even during a step until the guard is dropped (see
    /// [`carry_awaiting_threads`]).
    fn open_turns(self: &Arc<Activity>) -> OpenTurns {
        self.lock().opened += 1;
        self.changed.notify_all();
        OpenTurns(Some(self.clone()))
    }

    /// A turn of the thread ranked `rank`: waits for a running step to end and for the turn's
    /// order (see [`Activity`]).
    fn turn(self: &Arc<Activity>, rank: u64) -> Turn {
        self.acquire(rank);
        Turn(Some(self.clone()))
    }

    /// Waits for `rank`'s turn and takes it (the thread holds it from here).
    fn acquire(self: &Arc<Activity>, rank: u64) {
        let mut turns = self.lock();
        turns.waiting.insert(rank);
        self.changed.notify_all();
        let mut turns = self.wait_until(turns, |turns| turns.grants(rank));
        turns.waiting.remove(&rank);
        turns.inside += 1;
        drop(turns);
        self.changed.notify_all();
        HELD.with(|held| *held.borrow_mut() = Some((self.clone(), rank)));
    }

    /// Ends a turn (the guard's drop, or [`blocked`]).
    fn end_turn(&self) {
        self.lock().inside -= 1;
        self.changed.notify_all();
    }

    /// Counts one piece of work until the returned guard is dropped.
    pub fn begin(self: &Arc<Activity>) -> Busy {
        self.busy.fetch_add(1, Ordering::SeqCst);
        Busy(Some(self.clone()))
    }

    fn new_rank(&self) -> u64 {
        let mut turns = self.lock();
        turns.next_rank += 1;
        turns.next_rank
    }

    fn set_awake(&self, rank: u64, awake: bool) {
        let mut turns = self.lock();
        if awake {
            turns.awake.insert(rank);
        } else {
            turns.awake.remove(&rank);
        }
        drop(turns);
        self.changed.notify_all();
    }
}

/// Runs `wait`, a wait for another thread, outside this thread's turn if it holds one: the turn
/// ends, the thread counts as blocked (turns go on without it), and it asks for its turn again
/// once `wait` returns. A thread that waited inside its turn for one that needs a turn would stall.
pub fn blocked<R>(wait: impl FnOnce() -> R) -> R {
    let Some((activity, rank)) = HELD.with(|held| held.borrow_mut().take()) else {
        return wait();
    };
    {
        let mut turns = activity.lock();
        turns.inside -= 1;
        turns.blocked.insert(rank);
    }
    activity.changed.notify_all();
    let result = wait();
    activity.lock().blocked.remove(&rank);
    // The same turn again (its guard is still held by the caller).
    activity.acquire(rank);
    result
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

/// A thread's turn (see [`Handoff::turn`]); ends when dropped.
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
            HELD.with(|held| held.borrow_mut().take());
            activity.end_turn();
        }
    }
}

/// Turns opened during a step (see [`Activity::open_turns`]).
struct OpenTurns(Option<Arc<Activity>>);

impl Drop for OpenTurns {
    fn drop(&mut self) {
        if let Some(activity) = self.0.take() {
            activity.lock().opened -= 1;
            activity.changed.notify_all();
        }
    }
}

thread_local! {
    static CURRENT: RefCell<Option<Arc<Activity>>> = const { RefCell::new(None) };
    /// The turn this thread holds, with its rank (for [`blocked`]).
    static HELD: RefCell<Option<(Arc<Activity>, u64)>> = const { RefCell::new(None) };
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
    /// Its place in the order of turns.
    rank: u64,
    woken: AtomicBool,
}

impl Handoff {
    /// A handoff on this thread's activity (counting nothing without one).
    pub fn on_current() -> Handoff {
        let activity = current();
        let rank = activity.as_ref().map_or(0, |activity| activity.new_rank());
        Handoff { activity, rank, woken: AtomicBool::new(false) }
    }

    /// The thread is being woken for work.
    pub fn woken(&self) {
        if let Some(activity) = &self.activity {
            if !self.woken.swap(true, Ordering::SeqCst) {
                activity.busy.fetch_add(1, Ordering::SeqCst);
                activity.set_awake(self.rank, true);
            }
        }
    }

    /// The thread has no work left and goes to sleep.
    pub fn parked(&self) {
        if let Some(activity) = &self.activity {
            if self.woken.swap(false, Ordering::SeqCst) {
                activity.set_awake(self.rank, false);
                activity.busy.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    /// Whether this handoff counts (only in a simulation).
    pub fn counted(&self) -> bool {
        self.activity.is_some()
    }

    /// A turn of the thread's work (see [`Activity`]: one thread at a time, in rank order).
    pub fn turn(&self) -> Turn {
        self.activity.as_ref().map_or_else(Turn::none, |activity| activity.turn(self.rank))
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

    /// A handoff on `activity`, woken.
    fn woken_handoff(activity: &Arc<Activity>) -> Handoff {
        set_current(Some(activity.clone()));
        let handoff = Handoff::on_current();
        set_current(None);
        handoff.woken();
        handoff
    }

    #[test]
    fn a_turn_waits_for_the_step_and_a_step_waits_for_the_turns() {
        let activity = Activity::new();
        activity.begin_step();
        let (tx, rx) = std::sync::mpsc::channel();
        let ended = Arc::new(AtomicBool::new(false));
        let handoff = woken_handoff(&activity);
        let thread = {
            let ended = ended.clone();
            std::thread::spawn(move || {
                let turn = handoff.turn();
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
        let handoff = woken_handoff(&activity);
        set_current(Some(activity.clone()));
        activity.begin_step();
        let work =
            carry_awaiting_threads(move || std::thread::spawn(move || drop(handoff.turn())).join().unwrap());
        set_current(None);
        work();
        activity.end_step();
        assert_eq!(activity.stalls(), 0, "the thread got its turn without waiting out the step");
        assert_eq!(activity.busy(), 0);
    }

    #[test]
    fn turns_go_one_at_a_time_in_rank_order_once_every_woken_thread_asked() {
        let activity = Activity::new();
        let first = woken_handoff(&activity);
        let second = woken_handoff(&activity);
        let order = Arc::new(Mutex::new(Vec::new()));
        let inside = Arc::new(AtomicUsize::new(0));
        let take = |handoff: Handoff, name: &'static str, delay: Duration| {
            let (order, inside) = (order.clone(), inside.clone());
            std::thread::spawn(move || {
                std::thread::sleep(delay);
                let turn = handoff.turn();
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "turns overlap");
                order.lock().unwrap().push(name);
                std::thread::sleep(Duration::from_millis(20));
                inside.fetch_sub(1, Ordering::SeqCst);
                drop(turn);
                handoff.parked();
            })
        };
        // The second-ranked thread asks first; the first-ranked one is still on its way.
        let late = take(first, "first", Duration::from_millis(100));
        let early = take(second, "second", Duration::ZERO);
        late.join().unwrap();
        early.join().unwrap();
        assert_eq!(*order.lock().unwrap(), ["first", "second"]);
        assert_eq!(activity.stalls(), 0);
        assert_eq!(activity.busy(), 0);
    }

    #[test]
    fn a_thread_blocked_on_another_leaves_its_turn_meanwhile() {
        let activity = Activity::new();
        let waiter = woken_handoff(&activity);
        let feeder = woken_handoff(&activity);
        let (tx, rx) = std::sync::mpsc::channel();
        let waiting = std::thread::spawn(move || {
            let turn = waiter.turn();
            // Waits for the other thread, which needs a turn to send.
            let got = blocked(|| rx.recv().unwrap());
            drop(turn);
            waiter.parked();
            got
        });
        let feeding = std::thread::spawn(move || {
            // The waiter ranks first and is awake: this turn comes after the waiter's has started,
            // whichever thread asks first.
            let turn = feeder.turn();
            tx.send(7).unwrap();
            drop(turn);
            feeder.parked();
        });
        feeding.join().unwrap();
        assert_eq!(waiting.join().unwrap(), 7);
        assert_eq!(activity.stalls(), 0, "no turn waited out its limit");
    }
}
