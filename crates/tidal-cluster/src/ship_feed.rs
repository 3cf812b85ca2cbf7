//! The ship feed: a bounded in-memory tail of the leader's flushed batches.
//!
//! The WAL writer pushes every drain here once it is written, just before its fsync (through its
//! hook, decisions/023 and 027); one ShipQueue
//! per follower reads from it. The tail is bounded by bytes and by batches (the oldest batches fall off):
//! a follower that needs what the tail no longer holds is told `Rotated` and pulls from the leader's
//! segments instead — the queue never reads disk. Delicate: the tail holds batches in seqno order,
//! contiguous (`push` asserts it); the last ones may not be durable yet.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use tidal_protocol::{tail_start, TailStart};
use tidal_types::{Seqno, Term, TermSeqno};
use tidal_wal::Batch;
use tokio::sync::watch;

/// Default bound on the tail's bytes: enough for well over a second of peak ingest, small next to
/// the WAL itself.
pub const TAIL_BYTES_MAX_DEFAULT: usize = 256 * 1024 * 1024;
/// Default bound on the tail's batches.
pub const TAIL_BATCHES_MAX_DEFAULT: usize = 200_000;

/// What a reader gets for a position.
#[derive(Debug, PartialEq, Eq)]
pub enum TailRead {
    /// Batches after the position (possibly empty: nothing new yet), bounded by the request.
    Batches(Vec<Batch>),
    /// The tail no longer holds what follows the position: pull from segments.
    Rotated {
        /// First seqno the tail still holds.
        tail_first: Seqno,
    },
    /// The position is not a batch boundary known to the tail (a follower with a misaligned or
    /// divergent position): resolve through the protocol (ship `prev` and let the follower answer).
    Unknown,
}

struct Tail {
    batches: VecDeque<Batch>,
    bytes: usize,
    /// The position right before the front batch (where the tail starts): the leader's log holds
    /// it, with its term, because it is the last position of a batch that fell off the front or
    /// the WAL's last position at a reset. Equal to `last` when the tail is empty.
    base: TermSeqno,
    /// Position of the last batch pushed, or `base` when empty.
    last: TermSeqno,
}

/// The bounded tail, shared between the writer's hook and the ShipQueues.
#[derive(Clone)]
pub struct ShipFeed {
    tail: Arc<Mutex<Tail>>,
    bytes_max: usize,
    batches_max: usize,
    last_tx: Arc<watch::Sender<Seqno>>,
}

impl ShipFeed {
    /// An empty tail that starts after `last` (the leader's durable position).
    pub fn new(last: TermSeqno, bytes_max: usize, batches_max: usize) -> ShipFeed {
        let (last_tx, _) = watch::channel(last.seqno);
        ShipFeed {
            tail: Arc::new(Mutex::new(Tail { batches: VecDeque::new(), bytes: 0, base: last, last })),
            bytes_max: bytes_max.max(1),
            batches_max: batches_max.max(1),
            last_tx: Arc::new(last_tx),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tail> {
        self.tail.lock().expect("ship feed lock is never held across a panic")
    }

    /// Appends batches (in seqno order, contiguous with what the tail holds), once written (maybe not
    /// yet fsynced).
    pub fn push(&self, batches: &[Batch]) {
        let mut tail = self.lock();
        for batch in batches {
            assert!(
                batch.first_seqno() == tail.last.seqno.next(),
                "ship feed continuity violated: last={} next batch starts at {}",
                tail.last.seqno,
                batch.first_seqno()
            );
            tail.last = TermSeqno { term: batch.term(), seqno: batch.last_seqno() };
            tail.bytes += batch.encoded().len();
            tail.batches.push_back(batch.clone());
        }
        // Keep at least the newest batch even if it alone is over the byte bound: a batch that can
        // be written must be shippable.
        while tail.batches.len() > 1 && (tail.bytes > self.bytes_max || tail.batches.len() > self.batches_max)
        {
            if let Some(old) = tail.batches.pop_front() {
                tail.bytes -= old.encoded().len();
                tail.base = TermSeqno { term: old.term(), seqno: old.last_seqno() };
            }
        }
        let last = tail.last.seqno;
        drop(tail);
        self.last_tx.send_replace(last);
    }

    /// Resets the tail to start after `last` (after a truncation or snapshot install).
    pub fn reset(&self, last: TermSeqno) {
        let mut tail = self.lock();
        tail.batches.clear();
        tail.bytes = 0;
        tail.base = last;
        tail.last = last;
        drop(tail);
        self.last_tx.send_replace(last.seqno);
    }

    /// What the tail holds now: (batches, bytes of their encodings).
    pub fn held(&self) -> (usize, usize) {
        let tail = self.lock();
        (tail.batches.len(), tail.bytes)
    }

    /// Last position pushed.
    pub fn last(&self) -> TermSeqno {
        self.lock().last
    }

    /// A receiver that changes whenever batches are pushed.
    pub fn subscribe(&self) -> watch::Receiver<Seqno> {
        self.last_tx.subscribe()
    }

    /// Whether `position` is a position of the tail: its base or the last position of one of its
    /// batches, with the same term.
    pub fn holds(&self, position: TermSeqno) -> bool {
        let tail = self.lock();
        tail_start(position, tail.base, tail.last, |seqno| tail.batch_ending_at(seqno)) == TailStart::After
    }

    /// Batches after `after`, at most `bytes_max` bytes but always at least one batch if one is
    /// available. Only for an `after` the tail holds, term included ([`ShipFeed::holds`],
    /// [`tail_start`]): the batches then continue exactly the log the follower's prev check will
    /// compare against. Any other position is `Unknown` (or `Rotated` below the tail), never a
    /// guess: a follower's own last position that merely lines up with the tail's front would
    /// otherwise pass its own prev check with batches of another log (decisions/057).
    pub fn read_after(&self, after: TermSeqno, bytes_max: usize) -> TailRead {
        let tail = self.lock();
        match tail_start(after, tail.base, tail.last, |seqno| tail.batch_ending_at(seqno)) {
            TailStart::After => {
                // Batches are contiguous: the first one after `after` by binary search (none when
                // `after` is the tail's last position).
                let start = tail.batches.partition_point(|batch| batch.first_seqno() <= after.seqno);
                TailRead::Batches(take(&tail.batches, start, bytes_max))
            }
            TailStart::Rotated { tail_first } => TailRead::Rotated { tail_first },
            TailStart::Unknown => TailRead::Unknown,
        }
    }
}

impl Tail {
    /// The term of the tail's batch whose last seqno is `seqno`, if there is one.
    fn batch_ending_at(&self, seqno: Seqno) -> Option<Term> {
        let start = self.batches.partition_point(|batch| batch.first_seqno() <= seqno);
        let batch = self.batches.get(start.checked_sub(1)?)?;
        (batch.last_seqno() == seqno).then(|| batch.term())
    }
}

fn take(batches: &VecDeque<Batch>, start: usize, bytes_max: usize) -> Vec<Batch> {
    let mut out = Vec::new();
    let mut bytes = 0;
    for batch in batches.iter().skip(start) {
        if !out.is_empty() && bytes + batch.encoded().len() > bytes_max {
            break;
        }
        bytes += batch.encoded().len();
        out.push(batch.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidal_types::RecordKind;

    fn batch(first: u64, count: u32, term: u64) -> Batch {
        Batch::new(RecordKind::ItemMetadata, Term(term), Seqno(first), count, &[0u8; 100])
    }

    fn at(term: u64, seqno: u64) -> TermSeqno {
        TermSeqno { term: Term(term), seqno: Seqno(seqno) }
    }

    #[test]
    fn reads_after_a_boundary_and_coalesces_within_the_byte_bound() {
        let feed = ShipFeed::new(at(0, 0), 1 << 20, 1000);
        feed.push(&[batch(1, 2, 1), batch(3, 1, 1), batch(4, 5, 1)]);
        let TailRead::Batches(all) = feed.read_after(at(0, 0), 1 << 20) else { panic!() };
        assert_eq!(all.len(), 3);
        let TailRead::Batches(rest) = feed.read_after(at(1, 3), 1 << 20) else { panic!() };
        assert_eq!(rest.iter().map(|b| b.first_seqno().get()).collect::<Vec<_>>(), vec![4]);
        let TailRead::Batches(one) = feed.read_after(at(0, 0), 10) else { panic!() };
        assert_eq!(one.len(), 1, "always at least one batch");
        assert_eq!(feed.read_after(at(1, 8), 1 << 20), TailRead::Batches(vec![]));
    }

    #[test]
    fn misaligned_or_divergent_positions_are_unknown() {
        let feed = ShipFeed::new(at(0, 0), 1 << 20, 1000);
        feed.push(&[batch(1, 2, 1), batch(3, 1, 2)]);
        assert_eq!(feed.read_after(at(1, 1), 1 << 20), TailRead::Unknown);
        assert_eq!(feed.read_after(at(2, 2), 1 << 20), TailRead::Unknown);
        assert_eq!(feed.read_after(at(1, 3), 1 << 20), TailRead::Unknown);
        assert_eq!(feed.read_after(at(9, 99), 1 << 20), TailRead::Unknown);
    }

    #[test]
    fn the_tail_is_bounded_and_old_positions_rotate() {
        let feed = ShipFeed::new(at(0, 0), 1 << 20, 3);
        for i in 1..=10 {
            feed.push(&[batch(i, 1, 1)]);
        }
        assert_eq!(feed.read_after(at(1, 2), 1 << 20), TailRead::Rotated { tail_first: Seqno(8) });
        let TailRead::Batches(b) = feed.read_after(at(1, 7), 1 << 20) else { panic!() };
        assert_eq!(b.len(), 3);
        let small = ShipFeed::new(at(0, 0), 10, 100);
        small.push(&[batch(1, 1, 1), batch(2, 1, 1)]);
        let TailRead::Batches(b) = small.read_after(at(1, 1), 1 << 20) else { panic!() };
        assert_eq!(b.len(), 1, "a batch larger than the bound is still kept");
    }

    /// Finding 1 of the safety review: a follower's own last position that lines up with the
    /// tail's front must not become the `prev` of the front batch unless the tail's base IS that
    /// position. At a57b07b this shipped `{prev (1,101), [(3,102)]}` and the follower accepted it.
    #[test]
    fn a_position_that_only_lines_up_with_the_front_is_unknown() {
        let feed = ShipFeed::new(at(0, 0), 1 << 20, 1000);
        feed.reset(at(2, 101));
        assert_eq!(feed.read_after(at(1, 101), 1 << 20), TailRead::Unknown, "empty tail, other term");
        feed.push(&[batch(102, 1, 3)]);
        assert_eq!(feed.read_after(at(1, 101), 1 << 20), TailRead::Unknown);
        let TailRead::Batches(front) = feed.read_after(at(2, 101), 1 << 20) else { panic!() };
        assert_eq!(front.len(), 1, "the base itself ships the front");
        assert!(feed.holds(at(2, 101)) && feed.holds(at(3, 102)));
        assert!(!feed.holds(at(1, 101)) && !feed.holds(at(2, 102)));
    }

    /// The base moves with the batches that fall off the front and keeps their term.
    #[test]
    fn the_base_follows_rotation_with_its_term() {
        let feed = ShipFeed::new(at(0, 0), 1 << 20, 2);
        feed.push(&[batch(1, 1, 1), batch(2, 2, 1), batch(4, 1, 2), batch(5, 1, 2)]);
        assert!(feed.holds(at(1, 3)), "the last batch to fall off is the base");
        assert!(feed.holds(at(2, 4)) && feed.holds(at(2, 5)));
        assert!(!feed.holds(at(2, 3)) && !feed.holds(at(1, 4)) && !feed.holds(at(1, 1)));
        assert_eq!(feed.read_after(at(2, 3), 1 << 20), TailRead::Unknown);
        assert_eq!(feed.read_after(at(1, 1), 1 << 20), TailRead::Rotated { tail_first: Seqno(4) });
        let TailRead::Batches(rest) = feed.read_after(at(1, 3), 1 << 20) else { panic!() };
        assert_eq!(rest.len(), 2);
    }

    #[test]
    #[should_panic(expected = "ship feed continuity violated")]
    fn a_gap_in_pushes_is_a_bug() {
        let feed = ShipFeed::new(at(0, 0), 1 << 20, 10);
        feed.push(&[batch(2, 1, 1)]);
    }
}
