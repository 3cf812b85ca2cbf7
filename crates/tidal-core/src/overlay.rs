//! The write-back overlay, [`Overlay`]: log-derived state applied since the last freeze, which
//! reads see over the frozen overlay (if a flush is in flight) and fjall: [`OverlayView`].
//!
//! Delicate:
//! - Every read of a key an overlay may hold looks in the active overlay, then in the frozen one,
//!   and only then in fjall: a `None` value is a delete (tombstone) that hides older layers.
//! - Every value a flush writes is held here by value (embedding vectors included), never looked
//!   up in the [`crate::feed_index::FeedIndex`] at flush time: the flusher encodes a frozen
//!   overlay on its own thread while the applier keeps changing the index.
//! - A flush writes every dirty entry, the applied seqno and the logged time as ONE flush
//!   (`flush_ingest`: ingested behind an intent file, `meta` last), so fjall always holds a prefix
//!   of the log (a replay's flush ingests its seen chunks first,
//!   experiments/054: the seen set only gains); a frozen overlay stays visible to reads until
//!   after that commit.

use std::collections::hash_map::Entry;
use std::collections::BTreeMap;

use tidal_types::Seqno;

use crate::dirty_set::{last_values, DirtySet};
use crate::error::Error;
use crate::fast_hash::FastMap;
use crate::flush_ingest::FlushWrites;
use crate::flusher::SeenMerge;
use crate::idempotency;
use crate::keys::{self, Profile};
use crate::seen;
use crate::stores::Stores;
use crate::trend::Trend;

/// Dirty state that reads must see. Changed only by `apply` (under the state write lock) and
/// moved out whole when it is frozen for a flush.
#[derive(Debug, Default)]
pub struct Overlay {
    /// Item metadata: the encoded fjall value (seqno | JSON), or `None` if deleted.
    pub items: FastMap<u64, Option<Vec<u8>>>,
    /// Embeddings: the seqno that stored the vector and the vector, or `None` if deleted.
    pub embeddings: FastMap<u64, Option<(Seqno, Vec<f32>)>>,
    /// Index in `users` of every user of this window: the one hash lookup of a user name per
    /// signal (the fold looks a user up once and then indexes `users`).
    pub user_ids: FastMap<Box<str>, u32>,
    /// Users whose profile changed, with the items they saw in this window, in order of first touch.
    pub users: Vec<DirtyUser>,
    /// Idempotency entries by fjall key; `None` if deleted.
    pub idempotency: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// Stream metas and consumer offsets by fjall key (never deleted).
    pub streams: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Stream events published in this window and not trimmed in it, by fjall key.
    pub stream_events: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Trims of this window: a stream's event key prefix and its new horizon. The flush deletes
    /// fjall's events at or below it ([`crate::streams::delete_trimmed`]).
    pub stream_trims: Vec<(Vec<u8>, u64)>,
    /// Inbox entries by fjall key; `None` if deleted.
    pub inboxes: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

/// A user's state changed since the last flush.
#[derive(Debug)]
pub struct DirtyUser {
    /// The user's name (the key of `Overlay::user_ids`).
    pub name: Box<str>,
    /// The whole current profile.
    pub profile: Profile,
    /// Items seen since the last flush, in log order, possibly repeated (deduplicated at flush).
    pub seen: Vec<u64>,
}

/// The applied state as reads see it: the active overlay over the frozen one (a flush in flight)
/// over fjall.
#[derive(Clone, Copy)]
pub struct OverlayView<'a> {
    /// Changes since the last freeze.
    pub active: &'a Overlay,
    /// Changes of the flush in flight, if any; fjall may or may not hold them yet.
    pub frozen: Option<&'a Overlay>,
}

/// Applier-side dirty state that no read needs (the digest flushes first).
#[derive(Debug, Default)]
pub struct WriterDirty {
    /// Trending score of every item whose score changed, or `None` if its score was deleted; the
    /// marks live in the index's trending entries.
    pub trends: DirtySet<u64, Option<Trend>>,
    /// The last LeaderStart folded (meta value).
    pub leader_start: Option<Vec<u8>>,
    /// The approximate index's centroids, chosen by an apply since the last freeze (meta value).
    pub ann_centroids: Option<Vec<u8>>,
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

impl<'a> OverlayView<'a> {
    /// The first answer of the active overlay, then of the frozen one.
    fn find<T>(&self, lookup: impl Fn(&'a Overlay) -> Option<T>) -> Option<T> {
        lookup(self.active).or_else(|| self.frozen.and_then(lookup))
    }

    /// A user's profile: the overlays', else fjall's.
    pub fn profile(&self, stores: &Stores, user: &str, dimension: usize) -> Result<Option<Profile>, Error> {
        if let Some(dirty) = self.find(|overlay| overlay.user(user)) {
            return Ok(Some(dirty.profile.clone()));
        }
        match stores.profiles.get(user.as_bytes())? {
            Some(bytes) => Profile::decode(&bytes, dimension)
                .map(Some)
                .ok_or_else(|| Error::Corrupt { keyspace: "profiles", reason: "wrong length".into() }),
            None => Ok(None),
        }
    }

    /// Items a user saw in the overlays (fjall's seen set holds the rest), possibly repeated.
    pub fn seen(&self, user: &str) -> impl Iterator<Item = u64> + 'a {
        let seen = |overlay: Option<&'a Overlay>| {
            overlay.and_then(|overlay| overlay.user(user)).into_iter().flat_map(|dirty| &dirty.seen)
        };
        seen(Some(self.active)).chain(seen(self.frozen)).copied()
    }

    /// An item's metadata entry in the overlays: `Some(None)` if deleted, `None` if not there.
    pub fn item(&self, item: u64) -> Option<&'a Option<Vec<u8>>> {
        self.find(|overlay| overlay.items.get(&item))
    }

    /// An item's embedding entry in the overlays: `Some(None)` if deleted, `None` if not there.
    pub fn embedding(&self, item: u64) -> Option<&'a Option<(Seqno, Vec<f32>)>> {
        self.find(|overlay| overlay.embeddings.get(&item))
    }

    /// Whether the item has metadata: the overlays' answer, else fjall's.
    pub fn has_item(&self, stores: &Stores, item: u64) -> Result<bool, Error> {
        match self.item(item) {
            Some(value) => Ok(value.is_some()),
            None => Ok(stores.items.contains_key(keys::item_key(item))?),
        }
    }

    /// The idempotency table as reads see it.
    pub fn idempotency_table(&self, stores: &'a Stores) -> idempotency::Table<'a> {
        idempotency::Table {
            keyspace: &stores.idempotency,
            active: &self.active.idempotency,
            frozen: self.frozen.map(|overlay| &overlay.idempotency),
        }
    }
}

impl Overlay {
    /// A user's dirty state in this overlay.
    pub fn user(&self, user: &str) -> Option<&DirtyUser> {
        self.user_ids.get(user).map(|&id| &self.users[id as usize])
    }

    /// Adds a user that is not dirty yet, with its current profile; returns its index in `users`
    /// and the estimated bytes.
    pub fn add_user(&mut self, user: &str, profile: Profile) -> (u32, usize) {
        let bytes = USER_OVERHEAD_BYTES + user.len() + profile.vector.len() * 4;
        let id = u32::try_from(self.users.len()).expect("fewer than 2^32 users in one overlay window");
        let name: Box<str> = user.into();
        self.users.push(DirtyUser { name: name.clone(), profile, seen: Vec::new() });
        self.user_ids.insert(name, id);
        (id, bytes)
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

    /// Puts every dirty entry of the overlay into `writes` (the caller adds the rest and commits);
    /// `seen` says how the seen items go in. `chunk` names this flush's seen chunks (its applied
    /// seqno).
    pub fn flush_into(&self, stores: &Stores, writes: &mut FlushWrites, chunk: u64, seen: SeenWrites<'_>) {
        // In any order: `FlushWrites` sorts each keyspace's writes once.
        for (&item, value) in &self.items {
            match value {
                Some(value) => writes.insert(&stores.items, keys::item_key(item), value.as_slice()),
                None => writes.remove(&stores.items, keys::item_key(item)),
            }
        }
        for (&item, entry) in &self.embeddings {
            match entry {
                Some((seqno, vector)) => {
                    let mut value = Vec::with_capacity(8 + vector.len() * 4);
                    value.extend_from_slice(&seqno.0.to_le_bytes());
                    keys::f32s_to_bytes(vector, &mut value);
                    writes.insert(&stores.embeddings, keys::item_key(item), value);
                }
                None => writes.remove(&stores.embeddings, keys::item_key(item)),
            }
        }
        let merges = match seen {
            SeenWrites::Ingested => &[][..],
            SeenWrites::Chunks(merges) => merges,
        };
        let merged: std::collections::HashSet<&str> = merges.iter().map(|merge| &*merge.user).collect();
        let chunks = matches!(seen, SeenWrites::Chunks(_));
        for dirty in self.users_in_key_order() {
            writes.insert(&stores.profiles, dirty.name.as_bytes(), dirty.profile.encode());
            if chunks && !dirty.seen.is_empty() && !merged.contains(&*dirty.name) {
                let value = seen::encode_chunk(&dirty.seen_in_key_order());
                writes.insert(&stores.seen, seen::chunk_key(&dirty.name, chunk), value);
            }
        }
        for merge in merges {
            let key = seen::chunk_key(&merge.user, chunk);
            for stored in &merge.stored {
                // One batch holds a key once: the merged chunk replaces a stored one of this id.
                if **stored != *key {
                    writes.remove(&stores.seen, stored.clone());
                }
            }
            if !merge.items.is_empty() {
                writes.insert(&stores.seen, key, seen::encode_chunk(&merge.items));
            }
        }
        for (key, value) in &self.idempotency {
            match value {
                Some(value) => writes.insert(&stores.idempotency, key.as_slice(), value.as_slice()),
                None => writes.remove(&stores.idempotency, key.as_slice()),
            }
        }
        for (key, value) in &self.streams {
            writes.insert(&stores.streams, key.as_slice(), value.as_slice());
        }
        for (key, value) in &self.stream_events {
            writes.insert(&stores.stream_events, key.as_slice(), value.as_slice());
        }
        for (key, value) in &self.inboxes {
            match value {
                Some(value) => writes.insert(&stores.inboxes, key.as_slice(), value.as_slice()),
                None => writes.remove(&stores.inboxes, key.as_slice()),
            }
        }
    }

    /// Merges an inbox record's change (values and deletes by key); returns the estimated bytes
    /// added.
    pub fn merge_inbox(&mut self, change: BTreeMap<Vec<u8>, Option<Vec<u8>>>) -> usize {
        let mut bytes = 0;
        for (key, value) in change {
            bytes += ENTRY_OVERHEAD_BYTES + key.len() + value.as_ref().map_or(0, Vec::len);
            self.inboxes.insert(key, value);
        }
        bytes
    }

    /// Merges a stream record's change; returns the estimated bytes added.
    pub fn merge_stream(&mut self, change: crate::streams::StreamChange) -> usize {
        let mut bytes = 0;
        if let Some((prefix, old, horizon)) = change.trim {
            // What this window published at or below the new horizon never reaches fjall.
            let from = [prefix.as_slice(), &(old + 1).to_be_bytes()].concat();
            let to = [prefix.as_slice(), &horizon.to_be_bytes()].concat();
            let doomed: Vec<Vec<u8>> =
                self.stream_events.range(from..=to).map(|(key, _)| key.clone()).collect();
            for key in doomed {
                self.stream_events.remove(&key);
            }
            self.stream_trims.push((prefix, horizon));
            bytes += ENTRY_OVERHEAD_BYTES;
        }
        for (key, value) in change.writes {
            bytes += ENTRY_OVERHEAD_BYTES + key.len() + value.len();
            self.streams.insert(key, value);
        }
        for (key, value) in change.events {
            bytes += ENTRY_OVERHEAD_BYTES + key.len() + value.len();
            self.stream_events.insert(key, value);
        }
        bytes
    }
}

impl Overlay {
    /// The dirty users in the key order of their profiles and seen pairs (length, then bytes).
    fn users_in_key_order(&self) -> Vec<&DirtyUser> {
        let mut users: Vec<&DirtyUser> = self.users.iter().collect();
        users.sort_unstable_by_key(|dirty| (dirty.name.len(), dirty.name.as_bytes()));
        users
    }

    /// Writes the overlay's seen chunks (named `chunk`, the flush's applied seqno) as new tables of
    /// the seen keyspace (fjall's ingestion: no journal, no memtable), before the flush's batch.
    /// Only a set gains: a crash between this and the batch leaves seen items of batches at most
    /// the frozen applied seqno (durable and committed, the flusher's gate) beside an older applied
    /// seqno, and the replay from there adds the same items again. The count of chunks written.
    pub fn ingest_seen(&self, stores: &Stores, chunk: u64) -> Result<usize, fjall::Error> {
        // An ingestion creates its first table file at once, and one that ends empty leaves it
        // behind.
        if self.users.iter().all(|dirty| dirty.seen.is_empty()) {
            return Ok(0);
        }
        let mut ingestion = stores.seen.start_ingestion()?;
        let mut written = 0;
        // Users in key order, one chunk each: the keys ascend, as an ingestion needs.
        for dirty in self.users_in_key_order() {
            if !dirty.seen.is_empty() {
                let value = seen::encode_chunk(&dirty.seen_in_key_order());
                ingestion.write(seen::chunk_key(&dirty.name, chunk), value)?;
                written += 1;
            }
        }
        ingestion.finish()?;
        Ok(written)
    }
}

/// How a flush writes the seen items of its overlay.
#[derive(Clone, Copy, Debug)]
pub enum SeenWrites<'a> {
    /// [`Overlay::ingest_seen`] wrote them already.
    Ingested,
    /// One chunk per user in the batch, but for the users of these merges, whose one chunk
    /// replaces their stored entries.
    Chunks(&'a [SeenMerge]),
}

impl DirtyUser {
    /// The user's seen items, ascending and once each (a chunk's items ascend strictly).
    fn seen_in_key_order(&self) -> Vec<u64> {
        let mut seen = self.seen.clone();
        seen.sort_unstable();
        seen.dedup();
        seen
    }
}

impl WriterDirty {
    /// Moves this window's state out and starts the next window. `true` with it if the trend
    /// set's window counter wrapped: the caller must clear the index's trend marks now.
    pub fn take(&mut self) -> (FrozenDirty, bool) {
        let (trends, wrapped) = self.trends.take();
        let frozen = FrozenDirty {
            trends,
            leader_start: self.leader_start.take(),
            ann_centroids: self.ann_centroids.take(),
        };
        self.bytes = 0;
        self.batches = 0;
        (frozen, wrapped)
    }
}

/// A window's [`WriterDirty`] changes, frozen for the flusher.
#[derive(Debug, Default)]
pub struct FrozenDirty {
    /// Every trending score change (a key may repeat; the later wins).
    trends: Vec<(u64, Option<Trend>)>,
    /// The last LeaderStart folded (meta value).
    leader_start: Option<Vec<u8>>,
    /// The approximate index's centroids, if chosen in this window (meta value).
    ann_centroids: Option<Vec<u8>>,
}

impl FrozenDirty {
    /// The window's trending score changes, last values only, ascending by item.
    pub fn trend_changes(&self) -> Vec<(u64, Option<Trend>)> {
        last_values(&self.trends)
    }

    /// Puts the LeaderStart and the centroids into `writes` (the trending scores go with the
    /// counters: [`crate::trend_blocks::Changes`]).
    pub fn flush_into(&self, stores: &Stores, writes: &mut FlushWrites) {
        if let Some(value) = &self.leader_start {
            writes.insert(&stores.meta, keys::META_LEADER_START, value.as_slice());
        }
        if let Some(value) = &self.ann_centroids {
            writes.insert(&stores.meta, keys::META_ANN_CENTROIDS, value.as_slice());
        }
    }
}
