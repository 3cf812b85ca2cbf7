//! Snapshot export and install on [`TidalDb`] (the format is in [`crate::snapshot`]).
//!
//! Export takes the same complete flush as [`TidalDb::digest`] (freeze, wait until fjall holds it)
//! and reads ONE fjall snapshot, so concurrent applies never tear it and it is exactly the state
//! `digest()` would hash at that seqno.
//!
//! Install, in this order:
//! 1. verify the whole file (checksum, shapes, digest of the records) without touching anything;
//! 2. under the writer lock, flush the overlays and wait until the background flusher is idle (no
//!    commit of the old state can land after this, and no frozen overlay stays visible); then under
//!    the state write lock too (applies and reads wait: neither ever sees a half-replaced state), commit [`META_IMPORT_PENDING`] to fjall, then delete every log-derived
//!    key, then write the snapshot's entries in bounded batches while the stream is read again;
//! 3. commit the snapshot's meta (applied seqno = S) and the removal of the marker in ONE batch,
//!    fsync, reload the in-memory index and counters, and check the digest against the snapshot's.
//!
//! Delicate:
//! - fjall cannot replace a keyspace atomically, so steps 2-3 are many batches. A crash in between
//!   leaves [`META_IMPORT_PENDING`] in fjall: `open` marks the engine incomplete and every apply is
//!   refused until an install completes. The caller (tidal-cluster) keeps the snapshot file and an
//!   `install_pending` marker so a restart installs it again (an install is idempotent).
//! - Hard negatives are not log-derived: the snapshot's are MERGED into ours (ORSWOT join, fsynced),
//!   never installed over them. A merge is safe at any point, so it is not undone on failure.
//! - The applied frontier may go DOWN (a node that applied a divergent suffix installs an earlier
//!   position); readers of `applied_seqno` must not assume it only grows across an install.

use std::fs::File;
use std::io::{BufReader, Write};
use std::path::Path;
use std::sync::atomic::Ordering;

use fjall::{PersistMode, Readable};
use tidal_types::{Seqno, Term, TermSeqno};

use super::{load_memory, meta_u64, State, TidalDb, Writer};
use crate::error::Error;
use crate::keys;
use crate::negatives::NegativesState;
use crate::overlay::{Overlay, WriterDirty};
use crate::seen;
use crate::snapshot::{
    hex, read_snapshot, SnapshotError, SnapshotInfo, SnapshotWriter, COUNTERS_SECTION, META_IMPORT_PENDING,
    NEGATIVES, NEGATIVES_SECTION, SECTIONS, SEEN_SECTION, TRENDING_SECTION,
};
use crate::trend::Trend;
use crate::trend_blocks::{self, ItemState};

/// Bytes of keys and values per fjall write batch during an install: bounds the memory of one batch
/// (fjall holds a batch whole until its commit) while keeping commits few.
const INSTALL_BATCH_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Users whose hard negatives are merged per fsynced batch.
const INSTALL_NEGATIVES_USERS_MAX: usize = 1024;
/// Read buffer of an install's passes over the file.
const READ_BUFFER_BYTES: usize = 256 * 1024;

impl TidalDb {
    /// Writes a snapshot of the log-derived state at the current applied seqno S (plus this node's
    /// hard negatives) to `out`, memory-bounded (entries stream from one fjall snapshot).
    /// `term_at(S)` names the term of the batch holding S (the WAL knows it); S = 0 has term 0.
    pub fn export_snapshot<W: Write>(
        &self,
        out: W,
        term_at: impl FnOnce(Seqno) -> Option<Term>,
    ) -> Result<(SnapshotInfo, W), SnapshotError> {
        let incomplete =
            || SnapshotError::Incompatible { reason: "this node's own install is incomplete".into() };
        if self.install_incomplete() {
            return Err(incomplete());
        }
        // The same complete flush `digest()` takes (applies continue meanwhile), then ONE fjall
        // snapshot, taken between two flushes' ingestions, so the snapshot holds the state at the
        // applied seqno it records. The snapshot is taken under the applier's lock, which an install
        // holds from start to end, so it never sees a half-replaced state.
        self.flush_all()?;
        let snapshot = {
            let _writer = self.lock_writer();
            if self.install_incomplete() {
                return Err(incomplete());
            }
            let _whole = self.ingest.whole_flushes();
            self.stores.database.snapshot()
        };
        let seqno = match snapshot.get(&self.stores.meta, keys::META_APPLIED_SEQNO)? {
            Some(bytes) => Seqno(keys::u64_value(&bytes).ok_or_else(|| super::corrupt("meta", "not a u64"))?),
            None => Seqno::ZERO,
        };
        let term = if seqno == Seqno::ZERO {
            Term(0)
        } else {
            term_at(seqno).ok_or_else(|| SnapshotError::Incompatible {
                reason: format!("no term is known for the applied seqno {seqno}"),
            })?
        };
        let mut writer = SnapshotWriter::new(out, TermSeqno { term, seqno }, self.config.dimension)?;
        let negatives = (NEGATIVES, &self.stores.negatives);
        for (name, keyspace) in self.stores.log_derived().into_iter().chain([negatives]) {
            writer.section(name)?;
            crate::digest::for_each_entry(&self.stores, &snapshot, name, keyspace, |key, value| {
                writer.entry(key, value)
            })?;
            writer.end_section()?;
        }
        let (info, out) = writer.finish()?;
        tracing::info!(position = %info.position, bytes = info.bytes, entries = info.entries, "snapshot exported");
        Ok((info, out))
    }

    /// Replaces the log-derived state with the snapshot in the file at `path` and merges its hard
    /// negatives. The file is verified whole before anything changes: a bad file is an error and
    /// leaves the state untouched. Returns what was installed; the applied seqno is then its S.
    pub fn install_snapshot(&self, path: &Path) -> Result<SnapshotInfo, SnapshotError> {
        self.install(path, None, u64::MAX)
    }

    /// [`TidalDb::install_snapshot`] of a file the caller has just verified whole with
    /// [`crate::snapshot::read_snapshot`] (`verified` is what it returned): skips the verify pass.
    /// The write pass still checks the checksum; a file that changed since is refused at its end,
    /// with the state left marked incomplete.
    pub fn install_verified_snapshot(
        &self,
        path: &Path,
        verified: SnapshotInfo,
    ) -> Result<SnapshotInfo, SnapshotError> {
        self.install(path, Some(verified), u64::MAX)
    }

    /// Starts an install and stops it after `entries` entries, as a crash would: the state is left
    /// half-replaced and marked incomplete. For crash tests.
    #[doc(hidden)]
    pub fn simulate_interrupted_install(&self, path: &Path, entries: u64) -> Result<(), SnapshotError> {
        match self.install(path, None, entries) {
            Err(SnapshotError::Interrupted) => Ok(()),
            Err(error) => Err(error),
            Ok(info) => Err(SnapshotError::Incompatible {
                reason: format!("the install of {} entries finished before {entries}", info.entries),
            }),
        }
    }

    fn install(
        &self,
        path: &Path,
        verified: Option<SnapshotInfo>,
        stop_after: u64,
    ) -> Result<SnapshotInfo, SnapshotError> {
        let dimension = self.config.dimension;
        let info = match verified {
            Some(info) => info,
            None => read_snapshot(open_file(path)?, dimension, &mut |_, _, _| Ok(()))?,
        };
        let started = std::time::Instant::now();
        let mut writer = self.lock_writer();
        // Nothing of the old state may reach fjall after the replacement starts: wait for the flush
        // in flight, freeze what is left and wait until the flusher has committed AND retired it
        // (`wait_idle` returns only once the flusher finished, after the retire). Only the applier
        // starts flushes and we hold its lock, so no flush runs until the install ends, and no
        // frozen overlay of the old state is left for reads.
        self.freeze(&mut writer, super::Wait::Flush)?;
        self.flush.wait_idle(false)?;
        let mut state = self.write_state();
        debug_assert!(state.frozen.is_none(), "a frozen overlay survived the flush before an install");
        // An intent the last flush left (emptied, but not durably) must never be finished over
        // the installed state, whose applied seqno may be below it.
        self.ingest.discard()?;
        self.import_incomplete.store(true, Ordering::Release);
        let mut marker = self.stores.database.batch();
        marker.insert(&self.stores.meta, META_IMPORT_PENDING, info.position.seqno.0.to_le_bytes());
        marker.commit()?;
        self.delete_log_derived()?;
        let mut import = Import::new(self, info.position.seqno);
        let mut written = 0u64;
        let installed = read_snapshot(open_file(path)?, dimension, &mut |section, key, value| {
            if written == stop_after {
                return Err(SnapshotError::Interrupted);
            }
            written += 1;
            import.entry(section, key, value)
        })?;
        if installed != info {
            return Err(SnapshotError::Incompatible {
                reason: "the snapshot file changed during the install".into(),
            });
        }
        import.finish()?;
        self.stores.database.persist(PersistMode::SyncAll)?;
        self.reload(&mut state, &mut writer)?;
        let (seqno, digest) = crate::digest::state_digest(&self.stores, &self.stores.database.snapshot())?;
        if seqno != info.position.seqno || digest != info.digest {
            return Err(SnapshotError::Installed { expected: hex(&info.digest), got: hex(&digest) });
        }
        self.import_incomplete.store(false, Ordering::Release);
        tracing::info!(position = %info.position, bytes = info.bytes, entries = info.entries,
            elapsed = ?started.elapsed(), "snapshot installed");
        Ok(info)
    }

    /// Whether an install is under way or was interrupted (applies are refused meanwhile).
    pub fn install_incomplete(&self) -> bool {
        self.import_incomplete.load(Ordering::Acquire)
    }

    /// Deletes every key of every log-derived keyspace but meta, in bounded batches.
    fn delete_log_derived(&self) -> Result<(), SnapshotError> {
        let snapshot = self.stores.database.snapshot();
        let mut batch = self.stores.database.batch();
        // The stored counts go with the state they count: an open before the install completes
        // counts (decisions/048); `reload` stores the new ones.
        batch.remove(&self.stores.local, keys::LOCAL_COUNTS);
        let mut bytes = 0usize;
        for keyspace in self.stores.log_derived_stored().skip(1) {
            for guard in snapshot.iter(keyspace) {
                let key = guard.key()?;
                bytes += key.len();
                batch.remove(keyspace, key);
                if bytes >= INSTALL_BATCH_BYTES_MAX {
                    std::mem::replace(&mut batch, self.stores.database.batch()).commit()?;
                    bytes = 0;
                }
            }
        }
        batch.commit()?;
        Ok(())
    }

    /// Rebuilds everything memory holds from fjall, as `open` does.
    fn reload(&self, state: &mut State, writer: &mut Writer) -> Result<(), Error> {
        let (index, counters) = load_memory(&self.stores, &self.config)?;
        state.index = index;
        state.overlay = Overlay::default();
        state.frozen = None;
        writer.counters = counters;
        writer.dirty = WriterDirty::default();
        writer.idempotency_oldest_ms = None;
        let applied = meta_u64(&self.stores, keys::META_APPLIED_SEQNO)?;
        self.applied_seqno.store(applied, Ordering::Release);
        // fjall holds exactly S now (it may be below the old frontier): the next freeze starts
        // from S and `flushed_applied_seqno()` reports S. No flush is in flight (the caller holds
        // the applier's lock after waiting for the flusher to go idle).
        writer.frozen_seqno = Seqno(applied);
        self.flush.reset_flushed(Seqno(applied));
        self.last_time_ms.store(meta_u64(&self.stores, keys::META_LAST_TIME_MS)?, Ordering::Release);
        let (items, users) = (self.stores.items.len()? as u64, self.stores.profiles.len()? as u64);
        self.items.store(items, Ordering::Relaxed);
        self.users.store(users, Ordering::Relaxed);
        let mut batch = self.stores.database.batch();
        batch.insert(
            &self.stores.local,
            keys::LOCAL_COUNTS,
            keys::counts_value(Seqno(applied), items, users),
        );
        batch.commit()?;
        Ok(())
    }
}

/// The write side of an install's second pass.
struct Import<'a> {
    db: &'a TidalDb,
    batch: fjall::OwnedWriteBatch,
    batch_bytes: usize,
    meta: Vec<(Vec<u8>, Vec<u8>)>,
    negatives: Vec<(String, NegativesState)>,
    /// The snapshot's applied seqno: the id of the seen chunks the install writes.
    chunk: u64,
    /// The user (key prefix) whose seen pairs are being gathered into one chunk, and its items.
    seen_user: Vec<u8>,
    seen_items: Vec<u64>,
    /// The trend block being gathered from the trending section (its items, ascending), or the
    /// stored block the counters section is adding counts to.
    block: Vec<ItemState>,
    /// Whether the trending section's blocks are committed (the counters section reads them).
    trending_committed: bool,
}

impl<'a> Import<'a> {
    fn new(db: &'a TidalDb, applied: Seqno) -> Import<'a> {
        Import {
            db,
            batch: db.stores.database.batch(),
            batch_bytes: 0,
            meta: Vec::new(),
            negatives: Vec::new(),
            chunk: applied.0,
            seen_user: Vec::new(),
            seen_items: Vec::new(),
            block: Vec::new(),
            trending_committed: false,
        }
    }

    fn entry(&mut self, section: usize, key: &[u8], value: &[u8]) -> Result<(), SnapshotError> {
        let stores = &self.db.stores;
        if section == SEEN_SECTION {
            // The snapshot carries the seen set as pairs in key order (decisions/056); the reader
            // checked their shape. Each user's go in as one chunk.
            let (user, item) = key.split_at(key.len() - 8);
            if user != self.seen_user.as_slice() {
                self.seen_chunk()?;
                self.seen_user.extend_from_slice(user);
            }
            self.seen_items.push(keys::item_of_key(item).ok_or_else(|| super::corrupt("seen", "bad item"))?);
            return Ok(());
        }
        if section != TRENDING_SECTION && section != COUNTERS_SECTION {
            self.write_block()?;
        }
        match section {
            0 => self.meta.push((key.to_vec(), value.to_vec())),
            TRENDING_SECTION => self.trend(key, value)?,
            COUNTERS_SECTION => self.count(key, value)?,
            NEGATIVES_SECTION => {
                let user =
                    std::str::from_utf8(key).map_err(|_| super::corrupt("negatives", "user is not UTF-8"))?;
                let state =
                    NegativesState::from_bytes(value).map_err(|reason| Error::InvalidNegatives { reason })?;
                self.negatives.push((user.to_owned(), state));
                if self.negatives.len() >= INSTALL_NEGATIVES_USERS_MAX {
                    self.merge_negatives()?;
                }
            }
            index => {
                let (name, keyspace) = stores.log_derived()[index];
                debug_assert_eq!(name, SECTIONS[index]);
                self.batch.insert(keyspace, key, value);
                self.batch_bytes += key.len() + value.len();
                if self.batch_bytes >= INSTALL_BATCH_BYTES_MAX {
                    self.commit()?;
                }
            }
        }
        Ok(())
    }

    /// One trending entry: gathered into its block, written once the next item is in another.
    fn trend(&mut self, key: &[u8], value: &[u8]) -> Result<(), SnapshotError> {
        // The reader checked the shape of both.
        let item = keys::item_of_key(key).ok_or_else(|| super::corrupt("trending", "bad item"))?;
        let trend = Trend::decode(value).ok_or_else(|| super::corrupt("trending", "bad trend"))?;
        if self
            .block
            .first()
            .is_some_and(|first| trend_blocks::block_of(first.item) != trend_blocks::block_of(item))
        {
            self.write_block()?;
        }
        self.block.push(ItemState { item, trend, counts: Vec::new() });
        Ok(())
    }

    /// One counter: added to its item in the stored block (the trending section wrote them all
    /// first), written once the next counter is of another block.
    fn count(&mut self, key: &[u8], value: &[u8]) -> Result<(), SnapshotError> {
        if !self.trending_committed {
            self.write_block()?;
            self.commit()?;
            self.trending_committed = true;
        }
        // The reader checked the shape.
        let (item, kind, count) =
            keys::split_counter(key, value).ok_or_else(|| super::corrupt("counters", "malformed counter"))?;
        let block = trend_blocks::block_of(item);
        if self.block.first().is_none_or(|first| trend_blocks::block_of(first.item) != block) {
            self.write_block()?;
            let block_key = trend_blocks::block_key(block);
            if let Some(stored) = self.db.stores.trend_blocks.get(block_key)? {
                self.block = trend_blocks::decode_block(&block_key, &stored)?;
            }
        }
        let Ok(at) = self.block.binary_search_by_key(&item, |state| state.item) else {
            return Err(super::corrupt(
                "counters",
                &format!("item {item} has a count but no trending score"),
            )
            .into());
        };
        self.block[at].counts.push((kind.into(), count));
        Ok(())
    }

    /// Writes the gathered trend block, if any.
    fn write_block(&mut self) -> Result<(), SnapshotError> {
        let Some(first) = self.block.first() else { return Ok(()) };
        let key = trend_blocks::block_key(trend_blocks::block_of(first.item));
        let value = trend_blocks::encode_block(&self.block);
        self.block.clear();
        self.batch_bytes += key.len() + value.len();
        self.batch.insert(&self.db.stores.trend_blocks, key, value);
        if self.batch_bytes >= INSTALL_BATCH_BYTES_MAX {
            self.commit()?;
        }
        Ok(())
    }

    /// Writes the gathered user's seen items as one chunk, if any.
    fn seen_chunk(&mut self) -> Result<(), SnapshotError> {
        if !self.seen_items.is_empty() {
            self.seen_items.sort_unstable();
            self.seen_items.dedup();
            let key = seen::chunk_key_after(std::mem::take(&mut self.seen_user), self.chunk);
            let value = seen::encode_chunk(&self.seen_items);
            self.batch_bytes += key.len() + value.len();
            self.batch.insert(&self.db.stores.seen, key, value);
            self.seen_items.clear();
            if self.batch_bytes >= INSTALL_BATCH_BYTES_MAX {
                self.commit()?;
            }
        }
        self.seen_user.clear();
        Ok(())
    }

    fn commit(&mut self) -> Result<(), SnapshotError> {
        std::mem::replace(&mut self.batch, self.db.stores.database.batch()).commit()?;
        self.batch_bytes = 0;
        Ok(())
    }

    /// Joins the pending users' snapshot negatives into ours, fsynced.
    fn merge_negatives(&mut self) -> Result<(), SnapshotError> {
        let db = self.db;
        let _lock = db.negatives_lock.lock().expect("negatives lock poisoned");
        let mut writes = db.stores.database.batch().durability(Some(PersistMode::SyncAll));
        for (user, remote) in self.negatives.drain(..) {
            let mut local = db.load_negatives(&user)?;
            let before = local.clone();
            local.merge(&remote);
            if local != before {
                writes.insert(&db.stores.negatives, user.as_bytes(), local.to_bytes());
            }
        }
        writes.commit()?;
        Ok(())
    }

    /// Commits the rest, then the snapshot's meta with the marker's removal in ONE batch.
    fn finish(mut self) -> Result<(), SnapshotError> {
        self.write_block()?;
        self.seen_chunk()?;
        self.commit()?;
        self.merge_negatives()?;
        let stores = &self.db.stores;
        let mut last = stores.database.batch();
        for guard in stores.meta.iter() {
            let key = guard.key()?;
            if !self.meta.iter().any(|(ours, _)| ours.as_slice() == &*key) {
                last.remove(&stores.meta, key);
            }
        }
        for (key, value) in self.meta {
            last.insert(&stores.meta, key, value);
        }
        last.commit()?;
        Ok(())
    }
}

fn open_file(path: &Path) -> Result<BufReader<File>, SnapshotError> {
    Ok(BufReader::with_capacity(READ_BUFFER_BYTES, File::open(path)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_sections_are_the_digests_keyspaces_in_order() {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = TidalDb::open(dir.path(), crate::EngineConfig::default()).expect("open");
        let names: Vec<&str> = db.stores.log_derived().iter().map(|(name, _)| *name).collect();
        assert_eq!(names, SECTIONS[..NEGATIVES_SECTION]);
        assert_eq!(SECTIONS[NEGATIVES_SECTION], NEGATIVES);
        assert_eq!(SECTIONS[SEEN_SECTION], "seen");
    }
}
