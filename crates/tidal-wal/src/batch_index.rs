//! [`BatchIndex`]: the in-memory index of the retained log's batch boundaries, which answers
//! "which batch holds seqno S" without reading a segment.
//!
//! It stores only each retained batch's FIRST seqno (8 bytes per batch) plus the seqno after the last
//! one; a batch's last seqno is the next batch's first minus one, and its term comes from the term
//! history (one entry per term, not per batch). Memory is therefore 8 bytes per retained batch: a
//! 64 MiB segment of 1 KiB batches costs about 512 KiB of index, and purge releases it.
//!
//! Delicate: it covers exactly the durable retained range `(purge point, durable]`. The writer pushes
//! batches after their fsync, purge pops whole segments' batches from the front, and a quarantine or
//! reset cuts the back, all under the log lock, so a reader of the index sees the same log as a
//! reader of the segment list.

use std::collections::VecDeque;

use tidal_types::{Seqno, Term};

/// Where a seqno sits in this WAL's durable log (what [`crate::Wal::locate`] answers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Position {
    /// Inside the retained, durable batch `first..=last`, written in `term`.
    In {
        /// Term of that batch.
        term: Term,
        /// Its first seqno.
        first: Seqno,
        /// Its last seqno (inclusive).
        last: Seqno,
    },
    /// Past the durable frontier.
    Beyond,
    /// At or below the purge point (or seqno 0): batch boundaries there are no longer known.
    Purged,
}

/// First seqnos of the retained batches, oldest first, and the seqno after the last batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BatchIndex {
    /// Strictly increasing; `firsts[0]` is the first retained seqno.
    firsts: VecDeque<Seqno>,
    /// The seqno after the last indexed batch (durable + 1).
    next: Seqno,
}

/// Bytes the index spends per retained batch.
pub const INDEX_BYTES_PER_BATCH: usize = std::mem::size_of::<Seqno>();

impl BatchIndex {
    /// An empty index whose next batch starts at `next`.
    pub(crate) fn new(next: Seqno) -> BatchIndex {
        BatchIndex { firsts: VecDeque::new(), next }
    }

    /// Records the batch `first..=last`, which must continue the index.
    pub(crate) fn push(&mut self, first: Seqno, last: Seqno) {
        assert!(
            first == self.next && last >= first,
            "batch index continuity violated: next={} batch={first}..={last}",
            self.next
        );
        self.firsts.push_back(first);
        self.next = last.next();
    }

    /// Forgets batches that start below `first_retained` (a purge at a segment boundary).
    pub(crate) fn purge_below(&mut self, first_retained: Seqno) {
        while self.firsts.front().is_some_and(|first| *first < first_retained) {
            self.firsts.pop_front();
        }
    }

    /// Forgets the batch that starts at `cut` and everything after it.
    pub(crate) fn truncate_from(&mut self, cut: Seqno) {
        let keep = self.firsts.partition_point(|first| *first < cut);
        assert!(
            self.firsts.get(keep) == Some(&cut),
            "batch index truncation not at a batch boundary: cut={cut} next={}",
            self.next
        );
        self.firsts.truncate(keep);
        self.next = cut;
    }

    /// Empties the index; the next batch starts at `next`.
    pub(crate) fn reset(&mut self, next: Seqno) {
        self.firsts.clear();
        self.next = next;
    }

    /// The batch `(first, last)` holding `seqno`, if it is indexed.
    pub(crate) fn batch_of(&self, seqno: Seqno) -> Option<(Seqno, Seqno)> {
        if seqno >= self.next {
            return None;
        }
        let after = self.firsts.partition_point(|first| *first <= seqno);
        let index = after.checked_sub(1)?;
        let first = self.firsts[index];
        let last = self.firsts.get(after).map_or(self.next, |next_first| *next_first);
        Some((first, Seqno(last.get() - 1)))
    }

    /// The first retained seqno, if any batch is indexed.
    pub(crate) fn first(&self) -> Option<Seqno> {
        self.firsts.front().copied()
    }

    /// The seqno after the last indexed batch.
    pub(crate) fn next(&self) -> Seqno {
        self.next
    }

    /// Indexed batches.
    pub(crate) fn len(&self) -> usize {
        self.firsts.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locates_purges_and_truncates() {
        let mut index = BatchIndex::new(Seqno(11));
        index.push(Seqno(11), Seqno(15));
        index.push(Seqno(16), Seqno(16));
        index.push(Seqno(17), Seqno(30));
        assert_eq!(index.batch_of(Seqno(10)), None);
        assert_eq!(index.batch_of(Seqno(11)), Some((Seqno(11), Seqno(15))));
        assert_eq!(index.batch_of(Seqno(15)), Some((Seqno(11), Seqno(15))));
        assert_eq!(index.batch_of(Seqno(16)), Some((Seqno(16), Seqno(16))));
        assert_eq!(index.batch_of(Seqno(30)), Some((Seqno(17), Seqno(30))));
        assert_eq!(index.batch_of(Seqno(31)), None);
        index.purge_below(Seqno(16));
        assert_eq!(index.len(), 2);
        assert_eq!(index.batch_of(Seqno(12)), None);
        index.truncate_from(Seqno(17));
        assert_eq!(index.next(), Seqno(17));
        assert_eq!(index.batch_of(Seqno(17)), None);
        assert_eq!(index.batch_of(Seqno(16)), Some((Seqno(16), Seqno(16))));
    }

    #[test]
    #[should_panic(expected = "not at a batch boundary")]
    fn truncation_inside_a_batch_is_refused() {
        let mut index = BatchIndex::new(Seqno(1));
        index.push(Seqno(1), Seqno(5));
        index.truncate_from(Seqno(3));
    }
}
