//! Every per (item, signal kind) counter, in memory: [`Counters`].
//!
//! Counters are log-derived (they are in the digest) but no read serves them, so the applier keeps
//! all of them here, loaded from fjall on open, and flushes the dirty ones with the overlay. That
//! turns the fjall get each signal used to pay into one hash lookup. Memory is bounded by
//! items x kinds, like the trending scores the index already holds.
//!
//! Delicate: kind names are interned to small ids in first-seen order, which depends on history;
//! the ids never leave this file (fjall keys and the digest use the names).

use crate::fast_hash::FastMap;

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
    /// Keys changed since the last flush, with repeats (a push is cheaper than a set insert on
    /// the hot path; the flush sorts and deduplicates). Absent from `counts` means deleted.
    dirty: Vec<(u64, u32)>,
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

    /// Adds one to `(item, kind)`.
    pub fn increment(&mut self, item: u64, kind: &str) {
        let kind = self.kind_id(kind);
        *self.counts.entry((item, kind)).or_insert(0) += 1;
        self.dirty.push((item, kind));
    }

    /// Deletes every counter of `item`.
    pub fn remove_item(&mut self, item: u64) {
        for kind in 0..self.kinds.len() as u32 {
            if self.counts.remove(&(item, kind)).is_some() {
                self.dirty.push((item, kind));
            }
        }
    }

    /// Puts every dirty counter (or its removal) into `writes`, in item order.
    pub fn flush_into(&mut self, stores: &Stores, writes: &mut fjall::OwnedWriteBatch) {
        self.dirty.sort_unstable();
        // One fjall batch must not hold a key twice.
        self.dirty.dedup();
        for &(item, kind) in &self.dirty {
            let key = keys::counter_key(item, &self.kinds[kind as usize]);
            match self.counts.get(&(item, kind)) {
                Some(count) => writes.insert(&stores.counters, key, count.to_le_bytes()),
                None => writes.remove(&stores.counters, key),
            }
        }
    }

    /// Forgets the dirty set once a flush committed.
    pub fn flushed(&mut self) {
        self.dirty.clear();
    }

    /// Counter changes since the last flush (with repeats).
    pub fn dirty_len(&self) -> usize {
        self.dirty.len()
    }

    fn kind_id(&mut self, kind: &str) -> u32 {
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

fn corrupt(reason: &str) -> Error {
    Error::Corrupt { keyspace: "counters", reason: reason.into() }
}
