//! The simulation's [`Scheduler`]: it counts the work a node hands to threads outside the async
//! runtime (the WAL writer, the applier, tokio's blocking pool) and keeps that work and the
//! simulation's steps apart (decisions/051, 052). Node code reaches it only through the handles of
//! `tidal_types::activity`; in production none is installed.
//!
//! Without a barrier, a write submitted in one step completed in that step or in one of the next
//! few, depending on the OS, and a replay of a seed diverged from its first run within
//! milliseconds. With [`Activity`], the driver waits after every step until no handed-off work is
//! left, so everything handed off in a step is done before the next one, and those threads take
//! their turns only between steps, never while a step runs: what they see of the nodes' async
//! side, and when they wake it, depends on the steps alone.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tidal_types::activity::Scheduler;

/// How long a thread waits for its turn, or a step for the turns to end, before it goes on anyway
/// (counted in [`Activity::stalls`]): a thread the step itself waits for must not deadlock the
/// simulation.
const TURN_WAIT_MAX: Duration = Duration::from_secs(2);

/// Counts work handed to threads outside the async runtime, and keeps that work and the
/// simulation's steps apart.
///
/// Turns are taken one at a time, in a fixed order: each handoff has a rank (the order the
/// handoffs were made in, which the steps decide), and a turn goes to the lowest-ranked waiting
/// thread only once every thread that was woken has either asked for its turn, parked, or blocked
/// (`tidal_types::activity::blocked`). Two threads that took turns side by side woke the nodes'
/// tasks in an order the OS chose, and a node's runtime polls its tasks in wake order; one thread
/// that got there first, before another that was still on its way, chose the order just as well.
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
    /// Blocking work running that waits for the node's threads
    /// (`tidal_types::activity::carry_awaiting_threads`): they take their turns meanwhile, step
    /// or not.
    opened: usize,
    /// The handoffs' next rank.
    next_rank: u64,
    /// Ranks of the threads woken and not parked since.
    awake: BTreeSet<u64>,
    /// Ranks of the threads asking for a turn.
    waiting: BTreeSet<u64>,
    /// Ranks of the threads that left their turn to wait for another thread.
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
}

impl Scheduler for Activity {
    fn new_rank(&self) -> u64 {
        let mut turns = self.lock();
        turns.next_rank += 1;
        turns.next_rank
    }

    fn work_begun(&self) {
        self.busy.fetch_add(1, Ordering::SeqCst);
    }

    fn work_done(&self) {
        self.busy.fetch_sub(1, Ordering::SeqCst);
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

    /// Waits for a running step to end and for the turn's order (see [`Activity`]).
    fn take_turn(&self, rank: u64) {
        let mut turns = self.lock();
        turns.waiting.insert(rank);
        self.changed.notify_all();
        let mut turns = self.wait_until(turns, |turns| turns.grants(rank));
        turns.waiting.remove(&rank);
        turns.inside += 1;
        drop(turns);
        self.changed.notify_all();
    }

    fn end_turn(&self) {
        self.lock().inside -= 1;
        self.changed.notify_all();
    }

    fn block(&self, rank: u64) {
        {
            let mut turns = self.lock();
            turns.inside -= 1;
            turns.blocked.insert(rank);
        }
        self.changed.notify_all();
    }

    fn unblock(&self, rank: u64) {
        self.lock().blocked.remove(&rank);
    }

    fn open_turns(&self, open: bool) {
        let mut turns = self.lock();
        if open {
            turns.opened += 1;
        } else {
            turns.opened -= 1;
        }
        drop(turns);
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use tidal_types::activity::{blocked, carry, carry_awaiting_threads, current, set_current, Handoff};

    /// Makes `activity` this thread's scheduler.
    fn install(activity: &Arc<Activity>) {
        set_current(Some(activity.clone()));
    }

    #[test]
    fn carried_work_counts_until_it_returns_and_runs_on_the_activity() {
        let activity = Activity::new();
        install(&activity);
        let seen = activity.clone();
        let work = carry(move || {
            let on =
                current().is_some_and(|inner| std::ptr::addr_eq(Arc::as_ptr(&inner), Arc::as_ptr(&seen)));
            (on, seen.busy())
        });
        assert_eq!(activity.busy(), 1);
        let (on, busy) = std::thread::spawn(work).join().unwrap();
        assert!(on, "the work runs on the carried activity");
        assert_eq!(busy, 1, "it counts while it runs");
        assert_eq!(activity.busy(), 0);
        set_current(None);
    }

    #[test]
    fn a_handoff_counts_once_per_wake_until_parked_and_ends_when_dropped() {
        let activity = Activity::new();
        install(&activity);
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
        install(activity);
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
        install(&activity);
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
