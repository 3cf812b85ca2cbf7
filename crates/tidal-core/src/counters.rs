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

use crate::fast_hash::{FastMap, FastState};

use crate::error::Error;
use crate::keys;
use crate::stores::Stores;

/// Up to this many kinds, a kind's id is found by comparing names rather than hashing.
const KINDS_SCANNED_MAX: usize = 8;

/// Per (item, kind) counts plus the keys changed since the last flush.
#[derive(Debug, Default)]
pub struct Counters {
    /// Kind name of each kind id.
    kinds: Vec<Box<str>>,
    /// Kind id of each kind name.
    kind_ids: FastMap<Box<str>, u32>,
    /// Count of every (item, kind id) that has one (> 0).
    counts: FastMap<(u64, u32), u64>,
    /// Value of every key changed since the last freeze; `None` means deleted.
    dirty: FastMap<(u64, u32), Option<u64>>,
}

/// The counters changed in one flush window, with their values at its end: what a flush writes.
#[derive(Debug, Default)]
pub struct DirtyCounters {
    /// Kind name of each kind id (the ids of `values`).
    kinds: Vec<Box<str>>,
    /// Value of every changed key; `None` means deleted.
    values: FastMap<(u64, u32), Option<u64>>,
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
            counters.counts.insert((item, kind), count);
        }
        Ok(counters)
    }

    /// Adds one to `(item, kind)` for a kind id of [`Counters::kind_id`].
    pub fn increment_id(&mut self, item: u64, kind: u32) {
        let count = self.counts.entry((item, kind)).or_insert(0);
        *count += 1;
        self.dirty.insert((item, kind), Some(*count));
    }

    /// Deletes every counter of `item`.
    pub fn remove_item(&mut self, item: u64) {
        for kind in 0..self.kinds.len() as u32 {
            if self.counts.remove(&(item, kind)).is_some() {
                self.dirty.insert((item, kind), None);
            }
        }
    }

    /// Moves the dirty set out (with the kind names it needs), leaving it empty: the counters of
    /// one flush window.
    pub fn take_dirty(&mut self) -> DirtyCounters {
        // The next window is sized like this one: growing a map of a million keys rehashes them
        // all, a pause of tens of milliseconds in the middle of an apply.
        let next = FastMap::with_capacity_and_hasher(self.dirty.len(), FastState::default());
        DirtyCounters { kinds: self.kinds.clone(), values: std::mem::replace(&mut self.dirty, next) }
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
        let mut changed: Vec<((u64, u32), Option<u64>)> =
            self.values.iter().map(|(key, value)| (*key, *value)).collect();
        // Key order: fjall's memtable inserts are cheaper in order.
        changed.sort_unstable_by_key(|(key, _)| *key);
        for ((item, kind), value) in changed {
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
