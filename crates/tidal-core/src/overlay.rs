//! The write-back overlay, [`Overlay`]: log-derived state applied since the last flush, which
//! reads see over fjall's.
//!
//! Delicate:
//! - Every read of a key the overlay may hold looks here first: a `None` value is a delete
//!   (tombstone) that hides fjall's entry. Only then does it read fjall.
//! - What the index already holds is not copied: embedding vectors and trending scores live in
//!   the [`FeedIndex`]; the overlay remembers which items are dirty (and, for embeddings, the
//!   seqno), and a flush encodes their values from the index.
//! - A flush writes every dirty entry, the applied seqno and the logged time in ONE fjall batch,
//!   so fjall always holds a prefix of the log; the overlay is cleared only after that commit.

use std::collections::hash_map::Entry;
use std::collections::BTreeMap;

use tidal_types::Seqno;

use crate::error::Error;
use crate::fast_hash::FastMap;
use crate::feed_index::FeedIndex;
use crate::idempotency;
use crate::keys::{self, Profile};
use crate::stores::Stores;

/// Dirty state that reads must see. Changed only by `apply` (under the state write lock) and
/// cleared by a flush.
#[derive(Debug, Default)]
pub struct Overlay {
    /// Item metadata: the encoded fjall value (seqno | JSON), or `None` if deleted.
    pub items: FastMap<u64, Option<Vec<u8>>>,
    /// Embeddings: the seqno that stored the vector (the vector is in the index), or `None` if
    /// deleted.
    pub embeddings: FastMap<u64, Option<Seqno>>,
    /// Users whose profile changed, with the items they saw in this window.
    pub users: FastMap<Box<str>, DirtyUser>,
    /// Idempotency entries by fjall key; `None` if deleted.
    pub idempotency: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

/// A user's state changed since the last flush.
#[derive(Debug)]
pub struct DirtyUser {
    /// The whole current profile.
    pub profile: Profile,
    /// Items seen since the last flush, in log order, possibly repeated (deduplicated at flush).
    pub seen: Vec<u64>,
}

/// Applier-side dirty state that no read needs (the digest flushes first).
#[derive(Debug, Default)]
pub struct WriterDirty {
    /// Items whose trending score changed or was deleted, with repeats (sorted and deduplicated
    /// at flush); the value is the index's.
    pub trends: Vec<u64>,
    /// The last LeaderStart folded (meta value).
    pub leader_start: Option<Vec<u8>>,
    /// Estimated bytes of the overlay and of the fjall batch that would flush it.
    pub bytes: usize,
    /// Applies since the last flush.
    pub batches: usize,
}

/// Estimated bytes of one dirty user entry beside its vector: hash map slot, box, seqno-free
/// profile header.
const USER_OVERHEAD_BYTES: usize = 96;
/// Estimated bytes of one dirty item-keyed entry (map slot plus its fjall batch item).
pub const ENTRY_OVERHEAD_BYTES: usize = 48;

impl Overlay {
    /// A user's profile: the overlay's, else fjall's.
    pub fn profile(&self, stores: &Stores, user: &str, dimension: usize) -> Result<Option<Profile>, Error> {
        if let Some(dirty) = self.users.get(user) {
            return Ok(Some(dirty.profile.clone()));
        }
        match stores.profiles.get(user.as_bytes())? {
            Some(bytes) => Profile::decode(&bytes, dimension)
                .map(Some)
                .ok_or_else(|| Error::Corrupt { keyspace: "profiles", reason: "wrong length".into() }),
            None => Ok(None),
        }
    }

    /// Whether the item has metadata: the overlay's answer, else fjall's.
    pub fn has_item(&self, stores: &Stores, item: u64) -> Result<bool, Error> {
        match self.items.get(&item) {
            Some(value) => Ok(value.is_some()),
            None => Ok(stores.items.contains_key(keys::item_key(item))?),
        }
    }

    /// The idempotency table as reads see it.
    pub fn idempotency_table<'a>(&'a self, stores: &'a Stores) -> idempotency::Table<'a> {
        idempotency::Table { keyspace: &stores.idempotency, overlay: &self.idempotency }
    }

    /// Adds a user that is not dirty yet, with its current profile; returns the estimated bytes.
    pub fn add_user(&mut self, user: &str, profile: Profile) -> usize {
        let bytes = USER_OVERHEAD_BYTES + user.len() + profile.vector.len() * 4;
        self.users.insert(user.into(), DirtyUser { profile, seen: Vec::new() });
        bytes
    }

    /// Records idempotency changes in order; returns the estimated bytes added.
    pub fn set_idempotency(&mut self, writes: idempotency::Writes) -> usize {
        let mut bytes = 0;
        for (key, value) in writes {
            bytes += ENTRY_OVERHEAD_BYTES + key.len() + value.as_ref().map_or(0, Vec::len);
            self.idempotency.insert(key, value);
        }
        bytes
    }

    /// Sets an item-keyed entry; returns the estimated bytes added (0 if the item was dirty).
    pub fn set<V>(map: &mut FastMap<u64, V>, item: u64, value: V, value_bytes: usize) -> usize {
        match map.entry(item) {
            Entry::Occupied(mut slot) => {
                slot.insert(value);
                0
            }
            Entry::Vacant(slot) => {
                slot.insert(value);
                ENTRY_OVERHEAD_BYTES + value_bytes
            }
        }
    }

    /// Puts every dirty entry of the overlay into `writes` (the caller adds the rest and commits).
    pub fn flush_into(&self, stores: &Stores, index: &FeedIndex, writes: &mut fjall::OwnedWriteBatch) {
        // Key order: fjall's memtable inserts are cheaper in order.
        let mut items: Vec<_> = self.items.iter().collect();
        items.sort_unstable_by_key(|(item, _)| **item);
        for (&item, value) in items {
            match value {
                Some(value) => writes.insert(&stores.items, keys::item_key(item), value.as_slice()),
                None => writes.remove(&stores.items, keys::item_key(item)),
            }
        }
        let mut embeddings: Vec<_> = self.embeddings.iter().collect();
        embeddings.sort_unstable_by_key(|(item, _)| **item);
        for (&item, seqno) in embeddings {
            match seqno {
                Some(seqno) => {
                    let vector = index.embedding(item).unwrap_or_else(|| {
                        panic!("overlay holds an embedding of item {item} at {seqno} that the index lacks")
                    });
                    let mut value = Vec::with_capacity(8 + vector.len() * 4);
                    value.extend_from_slice(&seqno.0.to_le_bytes());
                    keys::f32s_to_bytes(vector, &mut value);
                    writes.insert(&stores.embeddings, keys::item_key(item), value);
                }
                None => writes.remove(&stores.embeddings, keys::item_key(item)),
            }
        }
        let mut users: Vec<_> = self.users.iter().collect();
        users.sort_unstable_by_key(|(user, _)| (user.len(), user.as_bytes()));
        for (user, dirty) in users {
            writes.insert(&stores.profiles, user.as_bytes(), dirty.profile.encode());
            let mut seen = dirty.seen.clone();
            seen.sort_unstable();
            // One fjall batch must not hold a key twice.
            seen.dedup();
            for item in seen {
                writes.insert(&stores.seen, keys::seen_key(user, item), []);
            }
        }
        for (key, value) in &self.idempotency {
            match value {
                Some(value) => writes.insert(&stores.idempotency, key.as_slice(), value.as_slice()),
                None => writes.remove(&stores.idempotency, key.as_slice()),
            }
        }
    }
}

impl WriterDirty {
    /// Puts the dirty trending scores (values from the index) and the LeaderStart into `writes`.
    pub fn flush_into(&mut self, stores: &Stores, index: &FeedIndex, writes: &mut fjall::OwnedWriteBatch) {
        self.trends.sort_unstable();
        // One fjall batch must not hold a key twice.
        self.trends.dedup();
        for &item in &self.trends {
            match index.trend(item) {
                Some(trend) => writes.insert(&stores.trending, keys::item_key(item), trend.encode()),
                None => writes.remove(&stores.trending, keys::item_key(item)),
            }
        }
        if let Some(value) = &self.leader_start {
            writes.insert(&stores.meta, keys::META_LEADER_START, value.as_slice());
        }
    }
}
