//! The control plane's durable store: a small fjall database of its own (`DATA_DIR/raft`), holding
//! openraft's vote, log and state-machine snapshot, and the commit hint (openraft's storage is a
//! fjall-backed store that tidal-core exposes and tidal-cluster adapts; the vote's rules are in
//! PROTOCOL.md, "The term lock").
//!
//! Its own database, not a keyspace of the engine's: openraft calls the store inline on its core
//! task, and a keyspace in the engine's database shared that database's journal and write stalls
//! with the overlay flushes of a heavy load, so a 64 MiB flush could hold up a heartbeat's commit
//! or a vote long enough for the followers to campaign against a healthy leader (decisions/012).
//!
//! Bytes in, bytes out: tidal-core does not know openraft's types. Every write that must survive a
//! crash (`write_sync`) is one fjall batch persisted with `SyncAll` before it returns. The keyspace
//! is NOT log-derived state: it is never part of the digest or of a snapshot of the engine.

use crate::error::Error;
use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};
use std::path::Path;
use std::sync::Arc;

/// One change in a [`RaftStore::write`] batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RaftWrite {
    /// Set `key` to `value`.
    Put(Vec<u8>, Vec<u8>),
    /// Remove `key`.
    Remove(Vec<u8>),
}

/// Key-value pairs in key order.
pub type Entries = Vec<(Vec<u8>, Vec<u8>)>;

/// A step of a [`RaftStore::write`] an injector may fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RaftStep {
    /// Before the batch reaches fjall: nothing of it is written.
    Write,
    /// The fsync of a synced batch: the batch is in fjall's journal (as after a write whose fsync
    /// failed, it may or may not survive a crash), and the write returns the error.
    Sync,
}

/// A fault seam of the control plane's store, as `tidal_wal::FileIo` is the WAL's: tests and
/// chaos/sim fail a step of a write (a vote's fsync, say). Production installs none.
pub trait RaftStoreFaults: Send + Sync + 'static {
    /// Before `step` of a write of `keys`; an error fails the write there.
    fn before(&self, step: RaftStep, keys: &[&[u8]]) -> std::io::Result<()>;
}

/// Handle on the `raft` keyspace. Cheap to clone.
#[derive(Clone)]
pub struct RaftStore {
    database: Database,
    keyspace: Keyspace,
    faults: Option<Arc<dyn RaftStoreFaults>>,
}

impl RaftStore {
    pub(crate) fn open(database: &Database) -> Result<RaftStore, Error> {
        let keyspace = database.keyspace("raft", KeyspaceCreateOptions::default)?;
        Ok(RaftStore { database: database.clone(), keyspace, faults: None })
    }

    /// This store with `faults` asked before each step of every write (`None`: no injector).
    pub fn with_faults(mut self, faults: Option<Arc<dyn RaftStoreFaults>>) -> RaftStore {
        self.faults = faults;
        self
    }

    /// Why the store's database refuses writes for good, if it does: fjall poisons itself after a
    /// failed journal write or fsync, or when a background worker (flush, compaction) fails, and
    /// refuses every write from then on. Asked periodically by the node (a fatal fault).
    pub fn fault(&self) -> Option<String> {
        crate::db::database_fault(&self.database)
    }

    /// Opens (or creates) the control plane's own database at `path` (one worker thread, a small
    /// cache: it holds kilobytes).
    pub fn open_dir(path: &Path) -> Result<RaftStore, Error> {
        let database = Database::builder(path).worker_threads(1).cache_size(4 * 1024 * 1024).open()?;
        RaftStore::open(&database)
    }

    /// Whether the store holds nothing.
    pub fn is_empty(&self) -> Result<bool, Error> {
        Ok(self.keyspace.is_empty()?)
    }

    /// The value at `key`.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        Ok(self.keyspace.get(key)?.map(|value| value.to_vec()))
    }

    /// Entries with `from <= key < to`, in key order.
    pub fn range(&self, from: &[u8], to: &[u8]) -> Result<Entries, Error> {
        let mut entries = Vec::new();
        for guard in self.keyspace.range(from.to_vec()..to.to_vec()) {
            let (key, value) = guard.into_inner()?;
            entries.push((key.to_vec(), value.to_vec()));
        }
        Ok(entries)
    }

    /// Keys with `from <= key < to`, in key order.
    pub fn keys(&self, from: &[u8], to: &[u8]) -> Result<Vec<Vec<u8>>, Error> {
        Ok(self.range(from, to)?.into_iter().map(|(key, _)| key).collect())
    }

    /// Applies `writes` as one atomic batch; with `sync` it is fsynced before this returns.
    pub fn write(&self, writes: Vec<RaftWrite>, sync: bool) -> Result<(), Error> {
        let mut sync_fails = None;
        if let Some(faults) = &self.faults {
            let keys: Vec<&[u8]> = writes
                .iter()
                .map(|write| match write {
                    RaftWrite::Put(key, _) | RaftWrite::Remove(key) => key.as_slice(),
                })
                .collect();
            faults.before(RaftStep::Write, &keys).map_err(fjall::Error::Io)?;
            if sync {
                sync_fails = faults.before(RaftStep::Sync, &keys).err();
            }
        }
        let durability = if sync && sync_fails.is_none() { Some(PersistMode::SyncAll) } else { None };
        let mut batch = self.database.batch().durability(durability);
        for write in writes {
            match write {
                RaftWrite::Put(key, value) => batch.insert(&self.keyspace, key, value),
                RaftWrite::Remove(key) => batch.remove(&self.keyspace, key),
            }
        }
        batch.commit()?;
        match sync_fails {
            None => Ok(()),
            Some(error) => Err(fjall::Error::Io(error).into()),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::{EngineConfig, TidalDb};

    #[test]
    fn writes_survive_reopen_and_ranges_are_ordered() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = RaftStore::open_dir(&dir.path().join("raft")).unwrap();
            store
                .write(
                    vec![
                        RaftWrite::Put(b"log/\x00\x02".to_vec(), b"two".to_vec()),
                        RaftWrite::Put(b"log/\x00\x01".to_vec(), b"one".to_vec()),
                        RaftWrite::Put(b"vote".to_vec(), b"v".to_vec()),
                    ],
                    true,
                )
                .unwrap();
            store.write(vec![RaftWrite::Remove(b"vote".to_vec())], true).unwrap();
        }
        let store = RaftStore::open_dir(&dir.path().join("raft")).unwrap();
        assert_eq!(store.get(b"vote").unwrap(), None);
        assert!(!store.is_empty().unwrap());
        let log = store.range(b"log/", b"log0").unwrap();
        assert_eq!(log.iter().map(|(_, v)| v.as_slice()).collect::<Vec<_>>(), [b"one", b"two"]);
        // The control plane's store is not log-derived state: the engine's digest ignores it.
        let db = TidalDb::open(&dir.path().join("state"), EngineConfig::default()).unwrap();
        let before = db.digest().unwrap();
        store.write(vec![RaftWrite::Put(b"x".to_vec(), b"y".to_vec())], false).unwrap();
        assert_eq!(db.digest().unwrap(), before);
    }

    /// Fails the step it is armed with for writes of the key `vote`.
    struct FailVote(RaftStep);

    impl RaftStoreFaults for FailVote {
        fn before(&self, step: RaftStep, keys: &[&[u8]]) -> std::io::Result<()> {
            if step == self.0 && keys.contains(&&b"vote"[..]) {
                return Err(std::io::Error::other("injected"));
            }
            Ok(())
        }
    }

    #[test]
    fn injected_faults_fail_a_write_before_it_or_at_its_fsync() {
        let dir = tempfile::tempdir().unwrap();
        let store = RaftStore::open_dir(dir.path()).unwrap();
        let put = |key: &[u8], value: &[u8]| vec![RaftWrite::Put(key.to_vec(), value.to_vec())];
        let failing = store.clone().with_faults(Some(Arc::new(FailVote(RaftStep::Write))));
        assert!(failing.write(put(b"vote", b"T2"), true).is_err());
        assert_eq!(store.get(b"vote").unwrap(), None, "a write failed before it wrote something");
        failing.write(put(b"log/1", b"entry"), true).unwrap();
        let failing = store.clone().with_faults(Some(Arc::new(FailVote(RaftStep::Sync))));
        let error = failing.write(put(b"vote", b"T3"), true).unwrap_err();
        assert!(error.to_string().contains("injected"), "{error}");
        // As after a real failed fsync, the batch may be there: it is in fjall's journal.
        assert_eq!(store.get(b"vote").unwrap().as_deref(), Some(&b"T3"[..]));
        failing.write(put(b"vote", b"T4"), false).unwrap();
        assert_eq!(store.fault(), None, "an injected failure does not poison fjall");
    }
}
