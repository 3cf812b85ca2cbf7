//! The fjall database and its keyspaces, one per concern: [`Stores`].
//!
//! Delicate: the list of log-derived keyspaces ([`Stores::log_derived`]) defines what the digest
//! covers; a new log-derived keyspace must be added there, and node-local data (like the hard
//! negatives) must never be. fjall's own sequence numbers never leave this crate and are never
//! confused with our [`tidal_types::Seqno`]: the applied seqno is a value in `meta`.

use std::path::Path;

use fjall::{Database, Keyspace, KeyspaceCreateOptions};

use crate::error::Error;

/// Bound on fjall's journals on disk (the least fjall accepts): what an open after a crash replays.
pub const JOURNAL_BYTES_MAX: u64 = 64 * 1024 * 1024;

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
    /// Trending scores and per (item, signal kind) counters, one entry per block of 16 item ids
    /// (`trend_blocks.rs`, decisions/070): the digest and snapshots see them as the logical
    /// keyspaces `trending` and `counters`.
    pub trend_blocks: Keyspace,
    /// The old layout's per-item trending scores: emptied into `trend_blocks` at open.
    pub legacy_trending: Keyspace,
    /// The old layout's per (item, signal kind) counters: emptied into `trend_blocks` at open.
    pub legacy_counters: Keyspace,
    /// Per-user profile vectors.
    pub profiles: Keyspace,
    /// (user, item) seen sets.
    pub seen: Keyspace,
    /// The idempotency table.
    pub idempotency: Keyspace,
    /// Stream metas and consumer offsets.
    pub streams: Keyspace,
    /// Stream events by (stream, offset).
    pub stream_events: Keyspace,
    /// Inboxes: metas, topics, messages, dedupe windows and receipts.
    pub inboxes: Keyspace,
    /// Hard negatives (NOT log-derived).
    pub negatives: Keyspace,
    /// What this node keeps about its own fjall state to open fast: the item and user counts at
    /// fjall's applied seqno (decisions/048). Not in the digest, not in snapshots.
    pub local: Keyspace,
}

impl Stores {
    /// Opens (or creates) the database at `path`.
    pub fn open(path: &Path) -> Result<Stores, Error> {
        // Commits (overlay flushes) reach OS buffers (a process crash loses nothing committed); fsync
        // happens only in checkpoint() and for negatives: the WAL is the source of truth and startup
        // replays it from the applied seqno, so a power loss costing fjall a tail is repaired by replay.
        // fjall's journal is replayed entry by entry at every open, at about 15 MB/s here for our
        // small entries: its default bound (512 MiB) let a node that crashed after a few minutes of
        // ingest spend tens of seconds opening. 64 MiB is the least fjall allows (experiments/034).
        let database = Database::builder(path)
            .manual_journal_persist(false)
            .max_journaling_size(JOURNAL_BYTES_MAX)
            .open()?;
        let keyspace = |name: &str| database.keyspace(name, KeyspaceCreateOptions::default);
        Ok(Stores {
            meta: keyspace("meta")?,
            items: keyspace("items")?,
            embeddings: keyspace("embeddings")?,
            trend_blocks: keyspace("trend_blocks")?,
            legacy_trending: keyspace("trending")?,
            legacy_counters: keyspace("counters")?,
            profiles: keyspace("profiles")?,
            seen: keyspace("seen")?,
            idempotency: keyspace("idempotency")?,
            streams: keyspace("streams")?,
            stream_events: keyspace("stream_events")?,
            inboxes: keyspace("inboxes")?,
            negatives: keyspace("negatives")?,
            local: keyspace("local")?,
            database,
        })
    }

    /// Every log-derived keyspace as the digest and snapshots name it, in digest order, with the
    /// fjall keyspace that stores it: `trending` and `counters` are both stored in `trend_blocks`.
    pub fn log_derived(&self) -> [(&'static str, &Keyspace); 11] {
        [
            ("meta", &self.meta),
            ("items", &self.items),
            ("embeddings", &self.embeddings),
            ("trending", &self.trend_blocks),
            ("counters", &self.trend_blocks),
            ("profiles", &self.profiles),
            ("seen", &self.seen),
            ("idempotency", &self.idempotency),
            ("streams", &self.streams),
            ("stream_events", &self.stream_events),
            ("inboxes", &self.inboxes),
        ]
    }

    /// Every fjall keyspace that stores log-derived state, each once.
    pub fn log_derived_stored(&self) -> impl Iterator<Item = &Keyspace> {
        self.log_derived().into_iter().filter(|(name, _)| *name != "counters").map(|(_, keyspace)| keyspace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn journal_bytes(path: &Path) -> u64 {
        std::fs::read_dir(path)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "jnl"))
            .map(|path| std::fs::metadata(path).unwrap().len())
            .sum()
    }

    /// fjall's journals stay near [`JOURNAL_BYTES_MAX`] however much is written: an open after a
    /// crash replays them entry by entry (experiments/034). With fjall's default bound (512 MiB)
    /// the 320 MiB written here would all still be journal.
    #[test]
    fn the_journal_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let stores = Stores::open(dir.path()).unwrap();
        let written: u64 = 320 * 1024 * 1024;
        let chunks = written / (4 * 1024 * 1024);
        for chunk in 0..chunks {
            write_chunk(&stores, chunk);
        }
        // fjall evicts old journals in its background workers after their memtables are flushed,
        // and asks the small keyspace to flush only when a flush finds the journals past the bound.
        // Once writes stop, nothing asks again: a run under load once stopped at 213 MB. So, as a
        // node's overlay flushes go on, keep writing (at most 64 MiB more: still under fjall's
        // default bound, which would keep it all) while polling the observable size, with a
        // deadline.
        let bound = 2 * JOURNAL_BYTES_MAX + 64 * 1024 * 1024;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut more = chunks..chunks + 16;
        while journal_bytes(dir.path()) > bound && std::time::Instant::now() < deadline {
            if let Some(chunk) = more.next() {
                write_chunk(&stores, chunk);
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let journal = journal_bytes(dir.path());
        assert!(journal <= bound, "{journal} bytes of journal after writing {written} and {more:?} more");
    }

    /// 4 MiB of embeddings and, as every overlay flush writes, a small `meta` entry: a keyspace
    /// whose memtable never fills, and which pins every journal it has entries in.
    fn write_chunk(stores: &Stores, chunk: u64) {
        let value = vec![7u8; 1024];
        let mut batch = stores.database.batch();
        for index in 0..4096u64 {
            batch.insert(&stores.embeddings, (chunk * 4096 + index).to_be_bytes(), value.as_slice());
        }
        batch.insert(&stores.meta, b"applied", chunk.to_le_bytes());
        batch.commit().unwrap();
    }
}
