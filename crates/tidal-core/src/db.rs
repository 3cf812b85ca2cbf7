//! [`TidalDb`]: the engine. One apply path folds WAL batches into fjall; reads rank from an
//! in-memory index mirrored from fjall.
//!
//! Delicate:
//! - Atomicity: each apply writes its data, the new applied seqno and the new logged time in ONE
//!   fjall write batch. After any crash, `open` finds the applied seqno of the last committed batch
//!   and the caller replays the WAL from the next one. No fsync per apply: `checkpoint` persists.
//! - Replays are harmless: a batch at or below the applied seqno is skipped, a batch that does not
//!   start right after it is a gap; both write nothing.
//! - A failed apply leaves fjall and the index unchanged: the fold only fills an uncommitted batch
//!   and a list of index changes, applied after the commit succeeds.
//! - Consistency of reads: the fjall commit and the index update happen under the index write lock,
//!   so a ranked read (which holds the read lock) sees fjall and the index at one applied seqno.
//! - Hard negatives are NOT log-derived: written on any node, persisted with an fsync per change (a
//!   lost change could reuse a CRDT dot), and excluded from [`TidalDb::digest`].

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock, RwLockReadGuard};

use fjall::PersistMode;
use tidal_types::Seqno;
use tidal_wal::Batch;

use crate::config::EngineConfig;
use crate::error::Error;
use crate::feed_index::{FeedIndex, IndexChange};
use crate::fold;
use crate::idempotency::{self, IdempotencyRecord, NewKey, Window};
use crate::keys::{self, Profile};
use crate::negatives::{Actor, NegativesState, NEGATIVES_PER_USER_MAX};
use crate::ranked::{rank_feed, rank_similar, rank_trending, RankParams, Ranked, RANKED_LIMIT_MAX};
use crate::record::{decode_payload, records_fingerprint, Records};
use crate::stores::Stores;
use crate::trend::Trend;

/// What [`TidalDb::apply`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApplyOutcome {
    /// The batch was folded; the applied frontier is now `last_seqno`.
    Applied {
        /// First seqno of the batch.
        first_seqno: Seqno,
        /// Last seqno of the batch, the new applied frontier.
        last_seqno: Seqno,
    },
    /// The batch was already applied; nothing changed.
    Skipped,
}

/// An item as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ItemState {
    /// Metadata JSON text.
    pub metadata: Vec<u8>,
    /// Whether the item has an embedding.
    pub has_embedding: bool,
    /// Seqno of the write that last set the metadata.
    pub seqno: Seqno,
}

/// Sizes, for metrics and status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct EngineStats {
    /// Applied frontier.
    pub applied_seqno: Seqno,
    /// Logged time of the last applied batch.
    pub last_applied_time_ms: u64,
    /// Items with metadata.
    pub items: u64,
    /// Items with an embedding.
    pub embeddings: u64,
    /// Items with a trending score.
    pub trending_items: u64,
    /// Users with a profile (every user who sent a signal).
    pub users: u64,
}

/// The engine over one fjall database. `Send + Sync`: reads run concurrently with `apply`.
pub struct TidalDb {
    stores: Stores,
    config: EngineConfig,
    index: RwLock<FeedIndex>,
    /// Mirrors meta's applied seqno; written under the index write lock after each commit.
    applied_seqno: AtomicU64,
    /// Mirrors meta's last logged time; written with `applied_seqno`.
    last_time_ms: AtomicU64,
    items: AtomicU64,
    users: AtomicU64,
    /// Serializes `apply` even if a caller forgets to.
    apply_lock: Mutex<()>,
    /// Serializes read-modify-write of hard negatives.
    negatives_lock: Mutex<()>,
}

impl TidalDb {
    /// Opens (or creates) the engine at `path` and rebuilds the in-memory index from fjall.
    pub fn open(path: &Path, config: EngineConfig) -> Result<TidalDb, Error> {
        config.validate()?;
        let stores = Stores::open(path)?;
        match stores.meta.get(keys::META_DIMENSION)? {
            Some(bytes) => {
                let persisted = <[u8; 4]>::try_from(&*bytes).map(u32::from_le_bytes).map_err(|_| {
                    Error::Corrupt { keyspace: "meta", reason: "dimension is not a u32".into() }
                })?;
                if persisted != config.dimension {
                    return Err(Error::DimensionMismatch { persisted, configured: config.dimension });
                }
            }
            None => {
                stores.meta.insert(keys::META_DIMENSION, config.dimension.to_le_bytes())?;
                stores.database.persist(PersistMode::SyncAll)?;
            }
        }
        let applied_seqno = meta_u64(&stores, keys::META_APPLIED_SEQNO)?;
        let last_time_ms = meta_u64(&stores, keys::META_LAST_TIME_MS)?;
        let index = load_index(&stores, config.dimension as usize)?;
        let items = stores.items.len()? as u64;
        let users = stores.profiles.len()? as u64;
        tracing::info!(applied_seqno, embeddings = index.embeddings(), items, users, "engine opened");
        Ok(TidalDb {
            stores,
            config,
            index: RwLock::new(index),
            applied_seqno: AtomicU64::new(applied_seqno),
            last_time_ms: AtomicU64::new(last_time_ms),
            items: AtomicU64::new(items),
            users: AtomicU64::new(users),
            apply_lock: Mutex::new(()),
            negatives_lock: Mutex::new(()),
        })
    }

    /// The configuration the engine runs with.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Highest seqno folded into fjall (committed atomically with the data it covers).
    pub fn applied_seqno(&self) -> Seqno {
        Seqno(self.applied_seqno.load(Ordering::Acquire))
    }

    /// Logged time of the last applied batch: "now" for every ranking.
    pub fn last_applied_time_ms(&self) -> u64 {
        self.last_time_ms.load(Ordering::Acquire)
    }

    /// THE apply path: the leader's writes, a follower's ships, catch-up and startup replay.
    ///
    /// A batch at or below the applied frontier is skipped; one that does not start right after it
    /// is [`Error::Gap`]; a kind without an applier or a payload that does not decode is an error.
    /// Errors write nothing.
    pub fn apply(&self, batch: &Batch) -> Result<ApplyOutcome, Error> {
        let _apply = self.apply_lock.lock().expect("apply lock poisoned: an apply panicked");
        let applied = self.applied_seqno();
        if batch.last_seqno() <= applied {
            return Ok(ApplyOutcome::Skipped);
        }
        if batch.first_seqno() != applied.next() {
            return Err(Error::Gap { expected: applied.next(), got: batch.first_seqno() });
        }
        let first_seqno = batch.first_seqno();
        let last_seqno = batch.last_seqno();
        let (envelope, records) = decode_payload(batch.kind(), batch.payload())
            .map_err(|source| Error::Record { seqno: first_seqno, kind: batch.kind(), source })?;
        let header_events = batch.header().event_count;
        if records.event_count() != u64::from(header_events) {
            return Err(Error::EventCount {
                seqno: first_seqno,
                header: header_events,
                records: records.event_count(),
            });
        }
        let now_ms = self.last_applied_time_ms().max(envelope.time_ms);
        let mut writes = self.stores.database.batch();
        let mut changes = Vec::new();
        let deltas = self.fold_records(first_seqno, envelope.time_ms, &records, &mut writes, &mut changes)?;
        let new_key = (!envelope.idempotency_key.is_empty()).then(|| NewKey {
            principal: &envelope.principal,
            key: &envelope.idempotency_key,
            record: IdempotencyRecord {
                last_seqno,
                first_seqno,
                fingerprint: records_fingerprint(batch.payload()),
                time_ms: envelope.time_ms,
            },
        });
        idempotency::fold(&self.stores.idempotency, &mut writes, new_key.as_ref(), now_ms, self.window())?;
        writes.insert(&self.stores.meta, keys::META_APPLIED_SEQNO, last_seqno.0.to_le_bytes());
        writes.insert(&self.stores.meta, keys::META_LAST_TIME_MS, now_ms.to_le_bytes());

        let mut index = self.index.write().expect("index lock poisoned: an index update panicked");
        writes.commit()?;
        index.apply(changes);
        self.applied_seqno.store(last_seqno.0, Ordering::Release);
        self.last_time_ms.store(now_ms, Ordering::Release);
        add_signed(&self.items, deltas.items);
        add_signed(&self.users, deltas.users);
        drop(index);
        tracing::trace!(%first_seqno, %last_seqno, kind = %batch.kind(), "applied");
        Ok(ApplyOutcome::Applied { first_seqno, last_seqno })
    }

    /// Makes everything applied so far durable in fjall (fsync). Returns the applied seqno now
    /// durable: WAL purge may not pass it.
    pub fn checkpoint(&self) -> Result<Seqno, Error> {
        // Read before persisting: every commit up to this seqno is already in fjall's journal.
        let applied = self.applied_seqno();
        self.stores.database.persist(PersistMode::SyncAll)?;
        Ok(applied)
    }

    /// An item's metadata; `None` if it has no metadata (even if it has an embedding).
    pub fn get_item(&self, id: u64) -> Result<Option<ItemState>, Error> {
        let key = keys::item_key(id);
        let Some(value) = self.stores.items.get(key)? else {
            return Ok(None);
        };
        let (seqno, metadata) =
            keys::split_seqno_value(&value).ok_or_else(|| corrupt("items", "short value"))?;
        let has_embedding = self.stores.embeddings.contains_key(key)?;
        Ok(Some(ItemState { metadata: metadata.to_vec(), has_embedding, seqno }))
    }

    /// An item's embedding and the seqno that stored it.
    pub fn get_embedding(&self, id: u64) -> Result<Option<(Vec<f32>, Seqno)>, Error> {
        let Some(value) = self.stores.embeddings.get(keys::item_key(id))? else {
            return Ok(None);
        };
        let (seqno, bytes) =
            keys::split_seqno_value(&value).ok_or_else(|| corrupt("embeddings", "short value"))?;
        let vector = keys::f32s_from_bytes(bytes, self.config.dimension as usize)
            .ok_or_else(|| corrupt("embeddings", "wrong length"))?;
        Ok(Some((vector, seqno)))
    }

    /// A user's feed: items with embeddings, by `a * cosine(profile, e) + b * trending`, without the
    /// user's seen items, hard negatives and `exclude`. `limit` is capped at [`RANKED_LIMIT_MAX`].
    pub fn feed(&self, user: &str, limit: usize, exclude: &[u64]) -> Result<Ranked, Error> {
        let index = self.read_index();
        let applied_seqno = self.applied_seqno();
        let profile = match self.stores.profiles.get(user.as_bytes())? {
            Some(bytes) => Some(
                Profile::decode(&bytes, self.config.dimension as usize)
                    .ok_or_else(|| corrupt("profiles", "wrong length"))?,
            ),
            None => None,
        };
        let mut excluded: HashSet<u64> = exclude.iter().copied().collect();
        let prefix = keys::seen_prefix(user);
        for guard in self.stores.seen.prefix(&prefix) {
            let key = guard.key()?;
            let item = key.get(prefix.len()..).and_then(keys::item_of_key);
            excluded.insert(item.ok_or_else(|| corrupt("seen", "malformed key"))?);
        }
        excluded.extend(self.load_negatives(user)?.items());
        let params = RankParams {
            now_ms: self.now_ms(),
            half_life_ms: self.config.half_life_ms,
            similarity_weight: self.config.similarity_weight,
            trending_weight: self.config.trending_weight,
            excluded: &excluded,
            limit: limit.min(RANKED_LIMIT_MAX),
        };
        let items = rank_feed(&index, profile.as_ref().map(|p| p.vector.as_slice()), &params);
        Ok(Ranked { items, applied_seqno })
    }

    /// Nearest neighbours of `item` by cosine, without the item; `None` if it has no embedding.
    pub fn similar(&self, item: u64, limit: usize) -> Result<Option<Ranked>, Error> {
        let index = self.read_index();
        let applied_seqno = self.applied_seqno();
        Ok(rank_similar(&index, item, limit.min(RANKED_LIMIT_MAX))
            .map(|items| Ranked { items, applied_seqno }))
    }

    /// Items by trending term, decayed to the last applied batch's time.
    pub fn trending(&self, limit: usize) -> Result<Ranked, Error> {
        let index = self.read_index();
        let applied_seqno = self.applied_seqno();
        let items =
            rank_trending(&index, self.now_ms(), self.config.half_life_ms, limit.min(RANKED_LIMIT_MAX));
        Ok(Ranked { items, applied_seqno })
    }

    /// An item's trending score as stored (not decayed), for tests and debugging.
    pub fn trend(&self, item: u64) -> Option<Trend> {
        self.read_index().trend(item)
    }

    /// The write that used `(principal, key)` within the window, as of the applied state.
    pub fn idempotency_lookup(&self, principal: &str, key: &str) -> Result<Option<IdempotencyRecord>, Error> {
        idempotency::lookup(
            &self.stores.idempotency,
            principal,
            key,
            self.last_applied_time_ms(),
            self.window(),
        )
    }

    /// Adds a hard negative as this node's actor; durable (fsync) when it returns.
    pub fn negatives_add(&self, user: &str, item: u64) -> Result<(), Error> {
        let _lock = self.negatives_lock.lock().expect("negatives lock poisoned");
        let mut state = self.load_negatives(user)?;
        if !state.contains(item) && state.len() >= NEGATIVES_PER_USER_MAX {
            return Err(Error::NegativesFull { count: state.len() });
        }
        let (node, incarnation) = self.config.node_actor;
        state.add(Actor { node, incarnation }, item);
        self.store_negatives(user, &state)
    }

    /// Removes a hard negative (the dots this node has seen); durable when it returns.
    pub fn negatives_remove(&self, user: &str, item: u64) -> Result<(), Error> {
        let _lock = self.negatives_lock.lock().expect("negatives lock poisoned");
        let mut state = self.load_negatives(user)?;
        if !state.contains(item) {
            return Ok(());
        }
        state.remove(item);
        self.store_negatives(user, &state)
    }

    /// A user's hard negatives, ascending.
    pub fn negatives(&self, user: &str) -> Result<Vec<u64>, Error> {
        Ok(self.load_negatives(user)?.items())
    }

    /// A user's CRDT state, for anti-entropy.
    pub fn negatives_state(&self, user: &str) -> Result<NegativesState, Error> {
        self.load_negatives(user)
    }

    /// Merges a peer's state for `user` into ours (ORSWOT join); durable when it returns.
    pub fn negatives_merge(&self, user: &str, remote: &NegativesState) -> Result<(), Error> {
        let _lock = self.negatives_lock.lock().expect("negatives lock poisoned");
        let mut state = self.load_negatives(user)?;
        let before = state.clone();
        state.merge(remote);
        if state == before {
            return Ok(());
        }
        self.store_negatives(user, &state)
    }

    /// Every user with a hard negatives state, ascending by bytes, for anti-entropy.
    pub fn negatives_users(&self) -> Result<Vec<String>, Error> {
        let mut users = Vec::new();
        for guard in self.stores.negatives.iter() {
            let key = guard.key()?;
            let user = std::str::from_utf8(&key).map_err(|_| corrupt("negatives", "user is not UTF-8"))?;
            users.push(user.to_owned());
        }
        Ok(users)
    }

    /// BLAKE3 over the canonical log-derived state, with the applied seqno it was taken at. Two
    /// replicas that applied the same log have equal digests. Excludes hard negatives.
    pub fn digest(&self) -> Result<(Seqno, [u8; 32]), Error> {
        crate::digest::state_digest(&self.stores)
    }

    /// BLAKE3 over every user's hard negatives state.
    pub fn negatives_digest(&self) -> Result<[u8; 32], Error> {
        crate::digest::negatives_digest(&self.stores)
    }

    /// Sizes, for metrics.
    pub fn stats(&self) -> EngineStats {
        let index = self.read_index();
        EngineStats {
            applied_seqno: self.applied_seqno(),
            last_applied_time_ms: self.last_applied_time_ms(),
            items: self.items.load(Ordering::Relaxed),
            embeddings: index.embeddings() as u64,
            trending_items: index.trending_items() as u64,
            users: self.users.load(Ordering::Relaxed),
        }
    }

    fn fold_records(
        &self,
        seqno: Seqno,
        envelope_time_ms: u64,
        records: &Records,
        writes: &mut fjall::OwnedWriteBatch,
        changes: &mut Vec<IndexChange>,
    ) -> Result<CountDeltas, Error> {
        let mut deltas = CountDeltas::default();
        let stores = &self.stores;
        match records {
            Records::Signals(events) => {
                let index = self.read_index();
                deltas.users =
                    fold::signals(stores, &index, &self.config, envelope_time_ms, events, writes, changes)?;
            }
            Records::ItemMetadata { item, metadata } => {
                if !stores.items.contains_key(keys::item_key(*item))? {
                    deltas.items = 1;
                }
                fold::item_metadata(stores, seqno, *item, metadata, writes);
            }
            Records::ItemEmbedding { item, vector } => {
                fold::item_embedding(stores, &self.config, seqno, *item, vector, writes, changes)?;
            }
            Records::ItemDelete { item } => {
                if stores.items.contains_key(keys::item_key(*item))? {
                    deltas.items = -1;
                }
                fold::item_delete(stores, *item, writes, changes)?;
            }
            Records::Control(control) => fold::control(stores, control, writes),
        }
        Ok(deltas)
    }

    fn read_index(&self) -> RwLockReadGuard<'_, FeedIndex> {
        self.index.read().expect("index lock poisoned: an index update panicked")
    }

    fn now_ms(&self) -> i64 {
        i64::try_from(self.last_applied_time_ms()).unwrap_or(i64::MAX)
    }

    fn window(&self) -> Window {
        Window { window_ms: self.config.idempotency_window_ms, keys_max: self.config.idempotency_keys_max }
    }

    fn load_negatives(&self, user: &str) -> Result<NegativesState, Error> {
        match self.stores.negatives.get(user.as_bytes())? {
            Some(bytes) => NegativesState::from_bytes(&bytes)
                .map_err(|reason| Error::Corrupt { keyspace: "negatives", reason }),
            None => Ok(NegativesState::default()),
        }
    }

    fn store_negatives(&self, user: &str, state: &NegativesState) -> Result<(), Error> {
        let mut writes = self.stores.database.batch().durability(Some(PersistMode::SyncAll));
        writes.insert(&self.stores.negatives, user.as_bytes(), state.to_bytes());
        writes.commit()?;
        Ok(())
    }
}

// Reads run on many threads beside the applier: the engine must stay Send + Sync.
const _: () = {
    fn assert_send_sync<T: Send + Sync>() {}
    let _ = assert_send_sync::<TidalDb>;
};

/// Changes to the in-memory counts made by one batch.
#[derive(Default)]
struct CountDeltas {
    items: i64,
    users: i64,
}

fn add_signed(counter: &AtomicU64, delta: i64) {
    if delta >= 0 {
        counter.fetch_add(delta as u64, Ordering::Relaxed);
    } else {
        counter.fetch_sub(delta.unsigned_abs(), Ordering::Relaxed);
    }
}

fn corrupt(keyspace: &'static str, reason: &str) -> Error {
    Error::Corrupt { keyspace, reason: reason.into() }
}

fn meta_u64(stores: &Stores, key: &[u8]) -> Result<u64, Error> {
    match stores.meta.get(key)? {
        None => Ok(0),
        Some(bytes) => keys::u64_value(&bytes).ok_or_else(|| corrupt("meta", "not a u64")),
    }
}

fn load_index(stores: &Stores, dimension: usize) -> Result<FeedIndex, Error> {
    let mut index = FeedIndex::new(dimension);
    for guard in stores.embeddings.iter() {
        let (key, value) = guard.into_inner()?;
        let item = keys::item_of_key(&key).ok_or_else(|| corrupt("embeddings", "malformed key"))?;
        let (_, bytes) =
            keys::split_seqno_value(&value).ok_or_else(|| corrupt("embeddings", "short value"))?;
        let vector =
            keys::f32s_from_bytes(bytes, dimension).ok_or_else(|| corrupt("embeddings", "wrong length"))?;
        index.set_embedding(item, &vector);
    }
    for guard in stores.trending.iter() {
        let (key, value) = guard.into_inner()?;
        let item = keys::item_of_key(&key).ok_or_else(|| corrupt("trending", "malformed key"))?;
        index.set_trend(item, Trend::decode(&value).ok_or_else(|| corrupt("trending", "bad value"))?);
    }
    Ok(index)
}
