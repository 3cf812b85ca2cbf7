//! Every per (item, signal kind) counter, in memory: [`Counters`].
//!
//! Counters are log-derived (they are in the digest) but no read serves them, so the applier keeps
//! all of them here, loaded from fjall on open, and flushes the dirty ones with the overlay. That
//! turns the fjall get each signal used to pay into one hash lookup. Memory is bounded by
//! items x kinds, like the trending scores the index already holds.
//!
//! Delicate:
//! - Kind names are interned to small ids in first-seen order, which depends on history; the ids
//!   never leave this file and [`DirtyCounters`] (fjall keys and the digest use the names).
//! - The dirty set carries each counter's value, so freezing it for the background flusher is a
//!   move ([`Counters::take_dirty`]), and the applier can keep counting while the flusher encodes.
//! - The dirty set is a [`DirtySet`]: each counter carries its mark, so an increment costs the
//!   one lookup of its counter (a second insert into a map keyed like it cost as much again).

use crate::dirty_set::{last_values, DirtySet, Mark};
use crate::error::Error;
use crate::fast_hash::FastMap;
use crate::keys;
use crate::stores::Stores;

/// Up to this many kinds, a kind's id is found by comparing names rather than hashing.
const KINDS_SCANNED_MAX: usize = 8;

/// A (item, kind id) counter key.
type Key = (u64, u32);

/// Per (item, kind) counts plus the keys changed since the last flush.
#[derive(Debug, Default)]
pub struct Counters {
    /// Kind name of each kind id.
    kinds: Vec<Box<str>>,
    /// Kind id of each kind name.
    kind_ids: FastMap<Box<str>, u32>,
    /// Every (item, kind id) that has a count (> 0).
    counts: FastMap<Key, Count>,
    /// Every key changed since the last freeze with its value (`None`: deleted).
    dirty: DirtySet<Key, Option<u64>>,
}

/// One counter and its mark in the dirty set.
#[derive(Debug, Clone, Copy)]
struct Count {
    count: u64,
    mark: Mark,
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
    /// Loads every counter from fjall.
    pub fn load(stores: &Stores) -> Result<Counters, Error> {
        let mut counters = Counters::default();
        for guard in stores.counters.iter() {
            let (key, value) = guard.into_inner()?;
            let item = key.get(..8).and_then(keys::item_of_key).ok_or_else(|| corrupt("malformed key"))?;
            let kind = std::str::from_utf8(&key[8..]).map_err(|_| corrupt("kind is not UTF-8"))?;
            let count = keys::u64_value(&value).ok_or_else(|| corrupt("not a u64"))?;
            let kind = counters.kind_id(kind);
            counters.counts.insert((item, kind), Count { count, mark: Mark::CLEAN });
        }
        Ok(counters)
    }

    /// Adds one to `(item, kind)` for a kind id of [`Counters::kind_id`].
    pub fn increment_id(&mut self, item: u64, kind: u32) {
        let key = (item, kind);
        let entry = self.counts.entry(key).or_insert(Count { count: 0, mark: Mark::CLEAN });
        entry.count += 1;
        self.dirty.set(&mut entry.mark, key, Some(entry.count));
    }

    /// Deletes every counter of `item`.
    pub fn remove_item(&mut self, item: u64) {
        for kind in 0..self.kinds.len() as u32 {
            let key = (item, kind);
            if let Some(entry) = self.counts.remove(&key) {
                self.dirty.set_removed(entry.mark, key, None);
            }
        }
    }

    /// Moves the dirty set out (with the kind names it needs), leaving it empty: the counters of
    /// one flush window.
    pub fn take_dirty(&mut self) -> DirtyCounters {
        let (values, wrapped) = self.dirty.take();
        if wrapped {
            for entry in self.counts.values_mut() {
                entry.mark = Mark::CLEAN;
            }
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
    /// Puts every changed counter (or its removal) into `writes`, in key order.
    pub fn flush_into(&self, stores: &Stores, writes: &mut fjall::OwnedWriteBatch) {
        for ((item, kind), value) in last_values(&self.values) {
            let key = keys::counter_key(item, &self.kinds[kind as usize]);
            match value {
                Some(count) => writes.insert(&stores.counters, key, count.to_le_bytes()),
                None => writes.remove(&stores.counters, key),
            }
        }
    }
}

fn corrupt(reason: &str) -> Error {
    Error::Corrupt { keyspace: "counters", reason: reason.into() }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The changes a flush of the current window would write, by kind name.
    fn flush(counters: &mut Counters) -> Vec<(u64, String, Option<u64>)> {
        let dirty = counters.take_dirty();
        let changes = last_values(&dirty.values);
        changes
            .into_iter()
            .map(|((item, kind), value)| (item, dirty.kinds[kind as usize].to_string(), value))
            .collect()
    }

    #[test]
    fn a_window_lists_each_counter_once_with_its_last_value() {
        let mut counters = Counters::default();
        let (view, click) = (counters.kind_id("view"), counters.kind_id("click"));
        for _ in 0..3 {
            counters.increment_id(7, view);
        }
        counters.increment_id(2, click);
        counters.increment_id(7, click);
        assert_eq!(counters.dirty_len(), 3);
        assert_eq!(
            flush(&mut counters),
            vec![(2, "click".into(), Some(1)), (7, "view".into(), Some(3)), (7, "click".into(), Some(1))]
        );
        // The next window starts clean and counts on from the totals.
        assert_eq!(counters.dirty_len(), 0);
        counters.increment_id(7, view);
        assert_eq!(flush(&mut counters), vec![(7, "view".into(), Some(4))]);
        assert_eq!(flush(&mut counters), vec![]);
    }

    #[test]
    fn a_removal_then_a_new_count_in_one_window_writes_the_new_count() {
        let mut counters = Counters::default();
        let view = counters.kind_id("view");
        counters.increment_id(1, view);
        counters.increment_id(1, view);
        counters.remove_item(1);
        assert_eq!(counters.dirty_len(), 1, "a removal of a counter dirty in this window reuses its entry");
        counters.increment_id(1, view);
        assert_eq!(flush(&mut counters), vec![(1, "view".into(), Some(1))]);
        // Removed in a later window: the removal is written.
        counters.remove_item(1);
        assert_eq!(flush(&mut counters), vec![(1, "view".into(), None)]);
        counters.increment_id(1, view);
        counters.remove_item(1);
        assert_eq!(flush(&mut counters), vec![(1, "view".into(), None)]);
    }
}
