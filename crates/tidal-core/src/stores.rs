//! The fjall database and its keyspaces, one per concern: [`Stores`].
//!
//! Delicate: the list of log-derived keyspaces ([`Stores::log_derived`]) defines what the digest
//! covers; a new log-derived keyspace must be added there, and node-local data (like the hard
//! negatives) must never be. fjall's own sequence numbers never leave this crate and are never
//! confused with our [`tidal_types::Seqno`]: the applied seqno is a value in `meta`.

use std::path::Path;

use fjall::{Database, Keyspace, KeyspaceCreateOptions};

use crate::error::Error;

/// The database and its keyspaces (handles: clones share the database).
#[derive(Clone)]
pub struct Stores {
    /// The fjall database.
    pub database: Database,
    /// Applied seqno, last logged time, dimension, last LeaderStart.
    pub meta: Keyspace,
    /// Item metadata.
    pub items: Keyspace,
    /// Item embeddings.
    pub embeddings: Keyspace,
    /// Per-item trending scores.
    pub trending: Keyspace,
    /// Per (item, signal kind) counters.
    pub counters: Keyspace,
    /// Per-user profile vectors.
    pub profiles: Keyspace,
    /// (user, item) seen sets.
    pub seen: Keyspace,
    /// The idempotency table.
    pub idempotency: Keyspace,
    /// Hard negatives (NOT log-derived).
    pub negatives: Keyspace,
}

impl Stores {
    /// Opens (or creates) the database at `path`.
    pub fn open(path: &Path) -> Result<Stores, Error> {
        // Commits (overlay flushes) reach OS buffers (a process crash loses nothing committed); fsync
        // happens only in checkpoint() and for negatives: the WAL is the source of truth and startup
        // replays it from the applied seqno, so a power loss costing fjall a tail is repaired by replay.
        let database = Database::builder(path).manual_journal_persist(false).open()?;
        let keyspace = |name: &str| database.keyspace(name, KeyspaceCreateOptions::default);
        Ok(Stores {
            meta: keyspace("meta")?,
            items: keyspace("items")?,
            embeddings: keyspace("embeddings")?,
            trending: keyspace("trending")?,
            counters: keyspace("counters")?,
            profiles: keyspace("profiles")?,
            seen: keyspace("seen")?,
            idempotency: keyspace("idempotency")?,
            negatives: keyspace("negatives")?,
            database,
        })
    }

    /// Every log-derived keyspace with its name, in digest order.
    pub fn log_derived(&self) -> [(&'static str, &Keyspace); 8] {
        [
            ("meta", &self.meta),
            ("items", &self.items),
            ("embeddings", &self.embeddings),
            ("trending", &self.trending),
            ("counters", &self.counters),
            ("profiles", &self.profiles),
            ("seen", &self.seen),
            ("idempotency", &self.idempotency),
        ]
    }
}
