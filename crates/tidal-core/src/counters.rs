//! Every per (item, signal kind) counter, in memory: [`Counters`] and [`ItemCounts`].
//!
//! Counters are log-derived (they are in the digest) but no read serves them, so the applier keeps
//! all of them in memory, loaded from fjall on open, and flushes the dirty ones with the overlay.
//! On disk they live beside their item's trending score, in its trend block (`trend_blocks.rs`).
//! Memory is bounded by items x kinds, like the trending scores the index already holds.
//!
//! Where they live (experiments/038): the counts of the first [`INLINE_KINDS`] kind ids (interned in
//! first-seen order: usually the busiest kinds, such as views and clicks) sit in the item's
//! trending entry of the [`FeedIndex`], which the fold has just looked up (and so brought into the
//! cache) to update the item's score. A map of their own cost one more random lookup per signal, a
//! cache miss over hundreds of thousands of counters: about a quarter of the fold. Two keep the
//! entry at one cache line and its memory at what a score plus one counter took before; the other
//! kinds are counted in [`Counters`]' own map, as all were before.
//!
//! Delicate:
//! - Kind names are interned to small ids in first-seen order, which depends on history; the ids
//!   never leave this file, [`ItemCounts`] and [`DirtyCounters`] (fjall keys and the digest use the
//!   names).
//! - Every item with a count has a trending score (one signal sets both; an item delete removes
//!   both), so every inline count has an entry to live in. [`Counters::load_count`] refuses a state
//!   where one does not.
//! - The dirty set carries each counter's value, so freezing it for the background flusher is a
//!   move ([`Counters::take_dirty`]), and the applier can keep counting while the flusher encodes.
//! - The dirty set is a [`DirtySet`]: each counter carries its mark, wherever the counter lives.

use crate::dirty_set::{last_values, DirtySet, Mark};
use crate::error::Error;
use crate::fast_hash::FastMap;
use crate::feed_index::FeedIndex;

/// Up to this many kinds, a kind's id is found by comparing names rather than hashing.
const KINDS_SCANNED_MAX: usize = 8;

/// Kind ids below this are counted in the item's trending entry ([`ItemCounts`]).
pub const INLINE_KINDS: usize = 2;

/// A (item, kind id) counter key.
type Key = (u64, u32);

/// A counter's change in a flush window: its new count, or `None` (removed).
pub type CountChange = (Key, Option<u64>);

/// Kind names, the counters of kind ids past [`INLINE_KINDS`], and the keys changed since the
/// last flush.
#[derive(Debug, Default)]
pub struct Counters {
    /// Kind name of each kind id.
    kinds: Vec<Box<str>>,
    /// Kind id of each kind name.
    kind_ids: FastMap<Box<str>, u32>,
    /// Every (item, kind id >= INLINE_KINDS) that has a count (> 0).
    more: FastMap<Key, Count>,
    /// Every key changed since the last freeze with its value (`None`: deleted).
    dirty: DirtySet<Key, Option<u64>>,
}

/// One item's counts of the kind ids below [`INLINE_KINDS`] (0: no counter), kept in its trending
/// entry.
#[derive(Debug, Clone, Copy, Default)]
pub struct ItemCounts([Count; INLINE_KINDS]);

/// One counter and its mark in the dirty set.
#[derive(Debug, Clone, Copy)]
struct Count {
    count: u64,
    mark: Mark,
}

impl Default for Count {
    fn default() -> Self {
        Count { count: 0, mark: Mark::CLEAN }
    }
}

impl ItemCounts {
    /// Forgets every dirty mark (after the dirty set's window counter wrapped).
    pub fn clear_marks(&mut self) {
        for count in &mut self.0 {
            count.mark = Mark::CLEAN;
        }
    }
}

/// The counters changed in one flush window, with their values at its end: what a flush writes.
#[derive(Debug, Default)]
pub struct DirtyCounters {
    /// Kind name of each kind id (the ids of `values`).
    kinds: Vec<Box<str>>,
    /// Every changed key with its value (`None`: deleted); of two entries of a key the later wins.
    values: Vec<(Key, Option<u64>)>,
}

impl Counters {
    /// Puts one stored counter into memory: a count of one of the first kinds into its item's
    /// trending entry (set before it), any other into the map. Kind ids are interned in the
    /// order counters are loaded: item, then kind name.
    pub fn load_count(
        &mut self,
        index: &mut FeedIndex,
        item: u64,
        kind: &str,
        count: u64,
    ) -> Result<(), Error> {
        let kind = self.kind_id(kind);
        if kind as usize >= INLINE_KINDS {
            self.more.insert((item, kind), Count { count, mark: Mark::CLEAN });
            return Ok(());
        }
        place_inline(index, item, kind, count)
    }

    /// Adds one to `(item, kind)` for a kind id of [`Counters::kind_id`]; `counts` are the item's
    /// (from its trending entry).
    pub fn increment_id(&mut self, counts: &mut ItemCounts, item: u64, kind: u32) {
        let key = (item, kind);
        let entry = match counts.0.get_mut(kind as usize) {
            Some(entry) => entry,
            None => self.more.entry(key).or_default(),
        };
        entry.count += 1;
        self.dirty.set(&mut entry.mark, key, Some(entry.count));
    }

    /// Deletes every counter of `item`; `counts` are the ones its removed trending entry held.
    pub fn remove_item(&mut self, item: u64, counts: Option<ItemCounts>) {
        for (kind, entry) in counts.iter().flat_map(|counts| counts.0.iter()).enumerate() {
            if entry.count > 0 {
                self.dirty.set_removed(entry.mark, (item, kind as u32), None);
            }
        }
        for kind in INLINE_KINDS as u32..self.kinds.len() as u32 {
            let key = (item, kind);
            if let Some(entry) = self.more.remove(&key) {
                self.dirty.set_removed(entry.mark, key, None);
            }
        }
    }

    /// Moves the dirty set out (with the kind names it needs), leaving it empty: the counters of
    /// one flush window. Resets the marks (those in `index` too) when the window counter wraps.
    pub fn take_dirty(&mut self, index: &mut FeedIndex) -> DirtyCounters {
        let (values, wrapped) = self.dirty.take();
        if wrapped {
            for entry in self.more.values_mut() {
                entry.mark = Mark::CLEAN;
            }
            index.clear_count_marks();
        }
        DirtyCounters { kinds: self.kinds.clone(), values }
    }

    /// Counters changed since the last freeze.
    pub fn dirty_len(&self) -> usize {
        self.dirty.len()
    }

    /// The id of a kind name, interned on first sight.
    pub fn kind_id(&mut self, kind: &str) -> u32 {
        // A handful of kinds is the norm: comparing them beats hashing the name.
        if self.kinds.len() <= KINDS_SCANNED_MAX {
            if let Some(id) = self.kinds.iter().position(|known| **known == *kind) {
                return id as u32;
            }
        } else if let Some(&id) = self.kind_ids.get(kind) {
            return id;
        }
        let id =
            u32::try_from(self.kinds.len()).expect("fewer than 2^32 signal kinds: each needs a log event");
        self.kinds.push(kind.into());
        self.kind_ids.insert(kind.into(), id);
        id
    }
}

impl DirtyCounters {
    /// The window's counter changes, last values only, ascending by (item, kind id), and the name
    /// of each kind id.
    pub fn changes(&self) -> (Vec<CountChange>, &[Box<str>]) {
        (last_values(&self.values), &self.kinds)
    }
}

/// Puts a count of one of the first kinds into its item's trending entry, which must exist.
fn place_inline(index: &mut FeedIndex, item: u64, kind: u32, count: u64) -> Result<(), Error> {
    let counts = index
        .counts_mut(item)
        .ok_or_else(|| corrupt(&format!("item {item} has a count but no trending score")))?;
    counts.0[kind as usize] = Count { count, mark: Mark::CLEAN };
    Ok(())
}

fn corrupt(reason: &str) -> Error {
    Error::Corrupt { keyspace: "trend_blocks", reason: reason.into() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trend::Trend;

    /// Counters with the index their first kinds live in, changed as the fold changes them.
    struct Both {
        counters: Counters,
        index: FeedIndex,
    }

    impl Both {
        fn new() -> Both {
            Both { counters: Counters::default(), index: FeedIndex::new(2) }
        }

        fn kind(&mut self, name: &str) -> u32 {
            self.counters.kind_id(name)
        }

        /// One signal: the fold sets the item's score first, then counts.
        fn increment(&mut self, item: u64, kind: u32) {
            let trend = self.index.trend(item).unwrap_or(Trend::first(0, 1.0));
            self.index.set_trend(item, trend);
            let counts = self.index.counts_mut(item).unwrap();
            self.counters.increment_id(counts, item, kind);
        }

        fn remove(&mut self, item: u64) {
            let removed = self.index.remove_item(item);
            self.counters.remove_item(item, removed.map(|(_, counts)| counts));
        }

        /// The changes a flush of the current window would write, by kind name.
        fn flush(&mut self) -> Vec<(u64, String, Option<u64>)> {
            let dirty = self.counters.take_dirty(&mut self.index);
            let changes = last_values(&dirty.values);
            changes
                .into_iter()
                .map(|((item, kind), value)| (item, dirty.kinds[kind as usize].to_string(), value))
                .collect()
        }
    }

    #[test]
    fn a_window_lists_each_counter_once_with_its_last_value() {
        let mut both = Both::new();
        let (view, click) = (both.kind("view"), both.kind("click"));
        for _ in 0..3 {
            both.increment(7, view);
        }
        both.increment(2, click);
        both.increment(7, click);
        assert_eq!(both.counters.dirty_len(), 3);
        assert_eq!(
            both.flush(),
            vec![(2, "click".into(), Some(1)), (7, "view".into(), Some(3)), (7, "click".into(), Some(1))]
        );
        // The next window starts clean and counts on from the totals.
        assert_eq!(both.counters.dirty_len(), 0);
        both.increment(7, view);
        assert_eq!(both.flush(), vec![(7, "view".into(), Some(4))]);
        assert_eq!(both.flush(), vec![]);
    }

    #[test]
    fn a_removal_then_a_new_count_in_one_window_writes_the_new_count() {
        let mut both = Both::new();
        let view = both.kind("view");
        both.increment(1, view);
        both.increment(1, view);
        both.remove(1);
        assert_eq!(
            both.counters.dirty_len(),
            1,
            "a removal of a counter dirty in this window reuses its entry"
        );
        both.increment(1, view);
        assert_eq!(both.flush(), vec![(1, "view".into(), Some(1))]);
        // Removed in a later window: the removal is written.
        both.remove(1);
        assert_eq!(both.flush(), vec![(1, "view".into(), None)]);
        both.increment(1, view);
        both.remove(1);
        assert_eq!(both.flush(), vec![(1, "view".into(), None)]);
    }

    /// Kinds past the ones the trending entry holds are counted in the counters' own map, with the
    /// same flush, removal and re-count rules.
    #[test]
    fn kinds_past_the_inline_ones_count_the_same() {
        let mut both = Both::new();
        let kinds: Vec<u32> = (0..INLINE_KINDS + 3).map(|k| both.kind(&format!("k{k}"))).collect();
        for (n, &kind) in kinds.iter().enumerate() {
            for _ in 0..=n {
                both.increment(5, kind);
            }
        }
        let expected: Vec<_> = (0..kinds.len()).map(|n| (5, format!("k{n}"), Some(n as u64 + 1))).collect();
        assert_eq!(both.flush(), expected);
        // A removal then a count of one inline and one further kind in one window: the others go.
        let (inline, further) = (kinds[1], kinds[INLINE_KINDS + 1]);
        both.remove(5);
        both.increment(5, inline);
        both.increment(5, further);
        let flushed = both.flush();
        for (n, kind) in kinds.iter().enumerate() {
            let value = if *kind == inline || *kind == further { Some(1) } else { None };
            assert!(flushed.contains(&(5, format!("k{n}"), value)), "k{n}: {flushed:?}");
        }
        assert_eq!(flushed.len(), kinds.len());
    }

    /// When the dirty set's window counter wraps, every mark is reset, the ones in the index too:
    /// a stale mark would overwrite another counter's change.
    #[test]
    fn a_wrapped_window_resets_the_marks_in_the_index() {
        let mut both = Both::new();
        let view = both.kind("view");
        both.increment(1, view);
        both.flush();
        // Item 1's counter keeps its mark of window 1; the next take wraps back to window 1.
        both.counters.dirty.jump_to_last_window();
        both.increment(2, view);
        assert_eq!(both.flush(), vec![(2, "view".into(), Some(1))]);
        both.increment(3, view);
        both.increment(1, view);
        assert_eq!(both.flush(), vec![(1, "view".into(), Some(2)), (3, "view".into(), Some(1))]);
    }
}
