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
        // Overlay flushes do not use the journal: they are ingested, each table fsynced
        // (`flush_ingest`, decisions/072). What still goes through it (hard negatives, fsynced per
        // change; the raft store; trims' deletes; migrations) reaches OS buffers, and fsync happens in
        // checkpoint(). fjall's journal is replayed entry by entry at every open, at about 15 MB/s
        // here for small entries: its default bound (512 MiB) let a node that crashed after a few
        // minutes of ingest spend tens of seconds opening when flushes went through it. 64 MiB is the
        // least fjall allows (experiments/034).
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

    /// The keyspace fjall names `name` (a flush intent names its keyspaces so).
    pub fn by_name(&self, name: &str) -> Option<&Keyspace> {
        [
            &self.meta,
            &self.items,
            &self.embeddings,
            &self.trend_blocks,
            &self.legacy_trending,
            &self.legacy_counters,
            &self.profiles,
            &self.seen,
            &self.idempotency,
            &self.streams,
            &self.stream_events,
            &self.inboxes,
            &self.negatives,
            &self.local,
        ]
        .into_iter()
        .find(|keyspace| &**keyspace.name() == name)
    }

    /// Every fjall keyspace that stores log-derived state, each once.
    pub fn log_derived_stored(&self) -> impl Iterator<Item = &Keyspace> {
        self.log_derived().into_iter().filter(|(name, _)| *name != "counters").map(|(_, keyspace)| keyspace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The journal files in `path`, by number: fjall numbers them in the order it creates them.
    fn journals(path: &Path) -> Vec<u64> {
        let mut journals: Vec<u64> = std::fs::read_dir(path)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "jnl"))
            .map(|path| path.file_stem().unwrap().to_str().unwrap().parse().unwrap())
            .collect();
        journals.sort_unstable();
        journals
    }

    /// Past [`JOURNAL_BYTES_MAX`] fjall flushes the memtables that hold the oldest journal and
    /// deletes it, even when one of them (here `meta`'s, as in a node) never fills: an open after a
    /// crash replays the journals entry by entry (experiments/034). With fjall's default bound
    /// (512 MiB) nothing written here (at most 480 MiB) would be deleted.
    ///
    /// How much journal stays is fjall's timing, not a figure to assert: a journal rotates only when
    /// a memtable flush finds it past 64 MB, and the journal sealed last stays until the next
    /// rotation asks `meta` to flush. Under load one grew to 190 MB and stayed with the next one's
    /// 82 MB once the writes ended. A node's checkpointer bounds it: past
    /// `checkpoint_engine_bytes_max` it writes every memtable into tables (tidal-server's t74),
    /// which frees every sealed journal, and its flushes let fjall rotate the active one.
    #[test]
    fn journals_past_the_bound_are_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let stores = Stores::open(dir.path()).unwrap();
        let first = journals(dir.path())[0];
        // The deletion is fjall's background work: keep writing, as a node's overlay flushes do,
        // so that rotations keep asking for it, then poll with a deadline.
        let mut chunks = 0..120u64;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while journals(dir.path())[0] == first && std::time::Instant::now() < deadline {
            match chunks.next() {
                Some(chunk) => write_chunk(&stores, chunk),
                None => std::thread::sleep(std::time::Duration::from_millis(50)),
            }
        }
        let left = journals(dir.path());
        assert_ne!(left[0], first, "journal {first} still there after {chunks:?} of 120 chunks: {left:?}");
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
