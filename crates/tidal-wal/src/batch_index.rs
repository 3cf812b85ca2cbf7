//! [`BatchIndex`]: the in-memory index of the retained log's batch boundaries, which answers
//! "which batch holds seqno S" without reading a segment.
//!
//! It stores only each retained batch's FIRST seqno (8 bytes per batch) plus the seqno after the last
//! one; a batch's last seqno is the next batch's first minus one, and its term comes from the term
//! history (one entry per term, not per batch). Memory is therefore 8 bytes per retained batch: a
//! 64 MiB segment of 1 KiB batches costs about 512 KiB of index, and purge releases it.
//!
//! Beside it, sparse **marks**: a batch's first seqno and its byte offset in the segment holding it,
//! for one batch in every [`crate::WalConfig::mark_spacing`] bytes of a segment. A reader that
//! starts in the middle of a segment begins at the last mark at or before its seqno instead of
//! walking every batch from the segment's start (a startup replay or a pull from the middle of a
//! 64 MiB segment walked up to 64 MiB of headers first). Where the marks fall is a heuristic; what
//! each one says is exact, and a reader checks it: the batch it finds at the offset must start at
//! the mark's seqno.
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
    /// `(first seqno, offset in its segment)` of some retained batches, strictly increasing in seqno.
    marks: VecDeque<(Seqno, u64)>,
    /// Offset of the last pushed batch: a smaller one starts another segment.
    last_offset: u64,
    /// Offset from which the next batch in this segment gets a mark.
    mark_from: u64,
    /// Bytes between marks in a segment, at least (>= 1).
    spacing: u64,
}

/// Bytes the index spends per retained batch.
pub const INDEX_BYTES_PER_BATCH: usize = std::mem::size_of::<Seqno>();

impl BatchIndex {
    /// An empty index whose next batch starts at `next`, with a mark every `spacing` bytes of a
    /// segment at most.
    pub(crate) fn new(next: Seqno, spacing: u64) -> BatchIndex {
        let spacing = spacing.max(1);
        BatchIndex {
            firsts: VecDeque::new(),
            next,
            marks: VecDeque::new(),
            last_offset: 0,
            mark_from: spacing,
            spacing,
        }
    }

    /// Records the batch `first..=last`, which must continue the index, written at `offset` in its
    /// segment.
    pub(crate) fn push(&mut self, first: Seqno, last: Seqno, offset: u64) {
        assert!(
            first == self.next && last >= first,
            "batch index continuity violated: next={} batch={first}..={last}",
            self.next
        );
        self.firsts.push_back(first);
        self.next = last.next();
        if offset < self.last_offset {
            // Another segment (or the back of this one after a truncation: a spare mark at most).
            self.mark_from = self.spacing;
        }
        self.last_offset = offset;
        if offset >= self.mark_from {
            self.marks.push_back((first, offset));
            self.mark_from = offset + self.spacing;
        }
    }

    /// Where a reader of the segment that starts at `segment_first` begins to reach `from`: the
    /// last mark in that segment at or before `from`, as `(seqno, offset)`; `None`: the segment's
    /// start.
    pub(crate) fn start_in(&self, segment_first: Seqno, from: Seqno) -> Option<(Seqno, u64)> {
        let after = self.marks.partition_point(|(seqno, _)| *seqno <= from);
        let (seqno, offset) = *self.marks.get(after.checked_sub(1)?)?;
        (seqno > segment_first).then_some((seqno, offset))
    }

    /// Forgets batches that start below `first_retained` (a purge at a segment boundary).
    pub(crate) fn purge_below(&mut self, first_retained: Seqno) {
        while self.firsts.front().is_some_and(|first| *first < first_retained) {
            self.firsts.pop_front();
        }
        while self.marks.front().is_some_and(|(first, _)| *first < first_retained) {
            self.marks.pop_front();
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
        self.marks.truncate(self.marks.partition_point(|(first, _)| *first < cut));
    }

    /// Empties the index; the next batch starts at `next`.
    pub(crate) fn reset(&mut self, next: Seqno) {
        self.firsts.clear();
        self.next = next;
        self.marks.clear();
        self.last_offset = 0;
        self.mark_from = self.spacing;
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
        let mut index = BatchIndex::new(Seqno(11), 64);
        index.push(Seqno(11), Seqno(15), 0);
        index.push(Seqno(16), Seqno(16), 10);
        index.push(Seqno(17), Seqno(30), 20);
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
    fn marks_fall_every_spacing_bytes_per_segment_and_follow_purges_and_cuts() {
        // Segment A: batches of 30 bytes from seqno 1; segment B from seqno 11.
        let mut index = BatchIndex::new(Seqno(1), 64);
        for (seqno, offset) in (1..=10).zip((0..).step_by(30)) {
            index.push(Seqno(seqno), Seqno(seqno), offset);
        }
        for (seqno, offset) in (11..=20).zip((0..).step_by(30)) {
            index.push(Seqno(seqno), Seqno(seqno), offset);
        }
        let marks: Vec<(Seqno, u64)> = index.marks.iter().copied().collect();
        let expected = [(4, 90), (7, 180), (10, 270), (14, 90), (17, 180), (20, 270)];
        assert_eq!(marks, expected.map(|(seqno, offset)| (Seqno(seqno), offset)));
        assert_eq!(index.start_in(Seqno(1), Seqno(3)), None, "before the first mark: the segment's start");
        assert_eq!(index.start_in(Seqno(1), Seqno(8)), Some((Seqno(7), 180)));
        assert_eq!(index.start_in(Seqno(1), Seqno(10)), Some((Seqno(10), 270)));
        assert_eq!(index.start_in(Seqno(11), Seqno(13)), None, "a mark of segment A is not one of B");
        assert_eq!(index.start_in(Seqno(11), Seqno(20)), Some((Seqno(20), 270)));
        index.truncate_from(Seqno(16));
        assert_eq!(index.start_in(Seqno(11), Seqno(20)), Some((Seqno(14), 90)), "marks past a cut go");
        // The log goes on at the cut's offset (150): the index marks it again.
        index.push(Seqno(16), Seqno(16), 150);
        assert_eq!(index.start_in(Seqno(11), Seqno(16)), Some((Seqno(16), 150)));
        index.purge_below(Seqno(11));
        assert_eq!(index.marks.front(), Some(&(Seqno(14), 90)), "marks below a purge go");
        index.reset(Seqno(40));
        assert!(index.marks.is_empty());
    }

    #[test]
    #[should_panic(expected = "not at a batch boundary")]
    fn truncation_inside_a_batch_is_refused() {
        let mut index = BatchIndex::new(Seqno(1), 64);
        index.push(Seqno(1), Seqno(5), 0);
        index.truncate_from(Seqno(3));
    }
}
