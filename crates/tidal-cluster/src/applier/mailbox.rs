//! The applier's input: a bounded queue whose sender decides, per message, whether the applier
//! must be woken for it (decisions/027).
//!
//! A `std::sync::mpsc` channel wakes its receiver for every message. Most of the applier's messages
//! cannot make it do anything: a drain the WAL writer hands over before its fsync is pending until
//! the commit frontier covers it, and on a leader (and on a follower whose commit notice comes after
//! the ship) that frontier arrives later, in a message of its own. Each wake of the applier thread is
//! a context switch (expensive on the small VMs we measure on), and one per write per node was
//! spent on nothing. So a message sent without a wake waits in the queue, in order, and is taken
//! together with the next message that wakes the applier (or whenever the applier is awake anyway).
//!
//! Delicate: a sender deciding not to wake must decide under the queue's lock
//! ([`MailboxSender::send`] evaluates its `wake` there), else a message that became useful between
//! the decision and the push (the commit frontier moved past it in another thread, whose own wake
//! the applier already consumed) could sit in the queue with the applier asleep.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

struct State<T> {
    queue: VecDeque<T>,
    /// Live senders; the receiver sees the end once there are none and the queue is empty.
    senders: usize,
    /// The receiver was dropped: sends fail.
    receiver_gone: bool,
    /// The receiver waits for a message (only then does a wake cost a notify).
    receiver_waiting: bool,
    /// Senders waiting for space.
    senders_waiting: usize,
}

struct Mailbox<T> {
    capacity: usize,
    state: Mutex<State<T>>,
    /// The receiver waits here.
    ready: Condvar,
    /// Senders of a full queue wait here.
    space: Condvar,
    /// Counts the receiver busy from a message it will take until it waits again (the
    /// simulation's step barrier, decisions/051; counts nothing in production).
    handoff: tidal_types::activity::Handoff,
}

impl<T> Mailbox<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Why a send failed; the message comes back.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum SendError<T> {
    /// The queue holds `capacity` messages (only [`MailboxSender::try_send`]).
    Full(T),
    /// The receiver is gone.
    Disconnected(T),
}

/// Sends to the applier; clones count as senders.
pub(crate) struct MailboxSender<T> {
    mailbox: Arc<Mailbox<T>>,
}

/// The applier's end.
pub(crate) struct MailboxReceiver<T> {
    mailbox: Arc<Mailbox<T>>,
}

/// A queue holding at most `capacity` messages (at least 1).
pub(crate) fn mailbox<T>(capacity: usize) -> (MailboxSender<T>, MailboxReceiver<T>) {
    let mailbox = Arc::new(Mailbox {
        capacity: capacity.max(1),
        state: Mutex::new(State {
            queue: VecDeque::new(),
            senders: 1,
            receiver_gone: false,
            receiver_waiting: false,
            senders_waiting: 0,
        }),
        ready: Condvar::new(),
        space: Condvar::new(),
        handoff: tidal_types::activity::Handoff::on_current(),
    });
    (MailboxSender { mailbox: mailbox.clone() }, MailboxReceiver { mailbox })
}

impl<T> Clone for MailboxSender<T> {
    fn clone(&self) -> Self {
        self.mailbox.lock().senders += 1;
        MailboxSender { mailbox: self.mailbox.clone() }
    }
}

impl<T> Drop for MailboxSender<T> {
    fn drop(&mut self) {
        let mut state = self.mailbox.lock();
        state.senders -= 1;
        if state.senders == 0 {
            drop(state);
            self.mailbox.ready.notify_all();
        }
    }
}

impl<T> MailboxSender<T> {
    /// Queues `message`, waiting for space; `wake` is asked under the queue's lock whether the
    /// receiver must be woken for it (see the module doc).
    pub(crate) fn send(&self, message: T, wake: impl FnOnce(&T) -> bool) -> Result<(), SendError<T>> {
        let mut state = self.mailbox.lock();
        loop {
            if state.receiver_gone {
                return Err(SendError::Disconnected(message));
            }
            if state.queue.len() < self.mailbox.capacity {
                break;
            }
            state.senders_waiting += 1;
            // The receiver needs its turn to make space (the simulation, decisions/052).
            state = tidal_types::activity::blocked(|| {
                self.mailbox.space.wait(state).unwrap_or_else(std::sync::PoisonError::into_inner)
            });
            state.senders_waiting -= 1;
        }
        self.push(state, message, wake);
        Ok(())
    }

    /// Queues `message` if there is space now (never waits); `wake` as for [`MailboxSender::send`].
    pub(crate) fn try_send(&self, message: T, wake: impl FnOnce(&T) -> bool) -> Result<(), SendError<T>> {
        let state = self.mailbox.lock();
        if state.receiver_gone {
            return Err(SendError::Disconnected(message));
        }
        if state.queue.len() >= self.mailbox.capacity {
            return Err(SendError::Full(message));
        }
        self.push(state, message, wake);
        Ok(())
    }

    fn push(&self, mut state: MutexGuard<'_, State<T>>, message: T, wake: impl FnOnce(&T) -> bool) {
        // A message that fills the queue wakes the receiver whatever it is: a full queue of lazy
        // messages with the receiver asleep refuses every later message, the waking ones too, and
        // a sender waiting for space would wait forever (an isolated leader's WAL writer did).
        let fills = state.queue.len() + 1 >= self.mailbox.capacity;
        let notify = state.receiver_waiting && (fills || wake(&message));
        if notify || !state.receiver_waiting {
            // Taken before the receiver waits again: it is busy until then.
            self.mailbox.handoff.woken();
        }
        state.queue.push_back(message);
        drop(state);
        if notify {
            self.mailbox.ready.notify_one();
        }
    }
}

impl<T> MailboxReceiver<T> {
    /// The next message with the receiver's turn to act on it (the simulation's step barrier,
    /// decisions/051): the message is taken inside the turn, so what the queue holds then does not
    /// depend on when other threads' turns ran (decisions/052). `None` as for
    /// [`MailboxReceiver::recv`].
    pub(crate) fn recv_in_turn(&self) -> Option<(T, tidal_types::activity::Turn)> {
        if !self.mailbox.handoff.counted() {
            return self.recv().map(|message| (message, tidal_types::activity::Turn::none()));
        }
        loop {
            let mut state = self.mailbox.lock();
            while state.queue.is_empty() {
                if state.senders == 0 {
                    return None;
                }
                state = self.wait(state);
            }
            drop(state);
            let turn = self.mailbox.handoff.turn();
            // Only this receiver takes messages: the queue still holds the one seen above.
            if let Some(message) = self.pop(self.mailbox.lock()) {
                return Some((message, turn));
            }
        }
    }

    /// Takes the front message, if any, and wakes the senders waiting for space.
    fn pop(&self, mut state: MutexGuard<'_, State<T>>) -> Option<T> {
        let message = state.queue.pop_front()?;
        let notify = state.senders_waiting > 0;
        drop(state);
        if notify {
            self.mailbox.space.notify_all();
        }
        Some(message)
    }

    /// The next message, waiting until one is queued AND a sender woke the receiver (or the queue
    /// is full); `None` once every sender is gone and the queue is empty. Messages queued while the
    /// receiver is awake are taken without a wake.
    pub(crate) fn recv(&self) -> Option<T> {
        let mut state = self.mailbox.lock();
        loop {
            if !state.queue.is_empty() {
                return self.pop(state);
            }
            if state.senders == 0 {
                return None;
            }
            state = self.wait(state);
        }
    }

    /// Waits until a sender wakes us, the queue fills up, or the senders are gone.
    fn wait<'a>(&'a self, mut state: MutexGuard<'a, State<T>>) -> MutexGuard<'a, State<T>> {
        // Messages queued before this wait were taken (the queue is empty): only a wake, the end of
        // the senders or a full queue (a sender waiting for space) ends it.
        loop {
            state.receiver_waiting = true;
            self.mailbox.handoff.parked();
            state = self.mailbox.ready.wait(state).unwrap_or_else(std::sync::PoisonError::into_inner);
            state.receiver_waiting = false;
            // A spurious wake with lazy messages queued is harmless: they are taken in order.
            if !state.queue.is_empty() || state.senders == 0 {
                return state;
            }
        }
    }
}

impl<T> Drop for MailboxReceiver<T> {
    fn drop(&mut self) {
        let mut state = self.mailbox.lock();
        state.receiver_gone = true;
        self.mailbox.handoff.parked();
        state.queue.clear();
        drop(state);
        self.mailbox.space.notify_all();
    }
}

impl<T> Iterator for &MailboxReceiver<T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        self.recv()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// Starts a receiver thread that reports every message it takes.
    fn receiver_thread(receiver: MailboxReceiver<u32>) -> (mpsc::Receiver<u32>, std::thread::JoinHandle<()>) {
        let (seen_tx, seen_rx) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            for message in &receiver {
                seen_tx.send(message).unwrap();
            }
        });
        (seen_rx, thread)
    }

    /// [`receiver_thread`], returned once the receiver is asleep (so a lazy message finds it
    /// waiting).
    fn asleep_receiver(
        sender: &MailboxSender<u32>,
        receiver: MailboxReceiver<u32>,
    ) -> (mpsc::Receiver<u32>, std::thread::JoinHandle<()>) {
        let started = receiver_thread(receiver);
        while !sender.mailbox.lock().receiver_waiting {
            std::thread::yield_now();
        }
        started
    }

    #[test]
    fn a_message_sent_without_a_wake_is_taken_in_order_with_the_next_wake() {
        let (sender, receiver) = mailbox::<u32>(8);
        let (seen, thread) = asleep_receiver(&sender, receiver);
        sender.send(1, |_| false).unwrap();
        // Not woken: nothing is taken (a spurious wake could take it; the assertion below is the
        // one that matters). A bounded wait, not a sleep standing in for synchronization.
        let early = seen.recv_timeout(Duration::from_millis(50)).ok();
        sender.send(2, |_| true).unwrap();
        let mut got: Vec<u32> = early.into_iter().collect();
        while got.len() < 2 {
            got.push(seen.recv_timeout(Duration::from_secs(10)).expect("the wake delivers both"));
        }
        assert_eq!(got, vec![1, 2], "taken in order");
        drop(sender);
        thread.join().unwrap();
    }

    #[test]
    fn a_queue_filled_with_lazy_messages_wakes_its_receiver() {
        // The receiver sleeps; every message is lazy. The one that fills the queue must wake it, or
        // the next send waits for space forever and every try_send (waking or not) is refused.
        let (sender, receiver) = mailbox::<u32>(4);
        let (seen, thread) = asleep_receiver(&sender, receiver);
        for message in 1..=6 {
            sender.send(message, |_| false).unwrap();
        }
        // 1..=4 filled the queue and woke it; 5 and 6 are taken while it is awake, or with 7.
        sender.send(7, |_| true).unwrap();
        let got: Vec<u32> = (0..7)
            .map(|_| seen.recv_timeout(Duration::from_secs(10)).expect("every message is taken"))
            .collect();
        assert_eq!(got, (1..=7).collect::<Vec<_>>(), "taken in order");
        drop(sender);
        thread.join().unwrap();
    }

    #[test]
    fn the_receiver_sees_the_end_once_every_sender_is_gone() {
        let (sender, receiver) = mailbox::<u32>(8);
        let other = sender.clone();
        let (seen, thread) = receiver_thread(receiver);
        sender.send(7, |_| false).unwrap();
        drop(sender);
        other.send(8, |_| false).unwrap();
        drop(other);
        thread.join().unwrap();
        assert_eq!(seen.try_iter().collect::<Vec<_>>(), vec![7, 8], "lazy messages are taken before the end");
    }

    #[test]
    fn a_full_queue_refuses_try_send_and_makes_send_wait_for_space() {
        let (sender, receiver) = mailbox::<u32>(2);
        sender.try_send(1, |_| false).unwrap();
        sender.try_send(2, |_| false).unwrap();
        assert_eq!(sender.try_send(3, |_| true), Err(SendError::Full(3)));
        let blocked = {
            let sender = sender.clone();
            std::thread::spawn(move || sender.send(3, |_| false))
        };
        // The blocked sender goes on once the receiver takes one.
        assert_eq!(receiver.recv(), Some(1));
        blocked.join().unwrap().unwrap();
        assert_eq!(receiver.recv(), Some(2));
        assert_eq!(receiver.recv(), Some(3));
        drop(receiver);
        assert_eq!(sender.send(4, |_| true), Err(SendError::Disconnected(4)));
        assert_eq!(sender.try_send(5, |_| true), Err(SendError::Disconnected(5)));
    }

    #[test]
    fn a_sender_waiting_for_space_is_released_when_the_receiver_goes() {
        let (sender, receiver) = mailbox::<u32>(1);
        sender.send(1, |_| false).unwrap();
        let blocked = {
            let sender = sender.clone();
            std::thread::spawn(move || sender.send(2, |_| false))
        };
        while sender.mailbox.lock().senders_waiting == 0 {
            std::thread::yield_now();
        }
        drop(receiver);
        assert_eq!(blocked.join().unwrap(), Err(SendError::Disconnected(2)));
    }
}
