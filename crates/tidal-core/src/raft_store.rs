//! The control plane's durable store: a small fjall database of its own (`DATA_DIR/raft`), holding
//! openraft's vote, log and state-machine snapshot, and the commit hint (DESIGN.md, "Control
//! plane": openraft's storage is a fjall-backed store that tidal-core exposes and tidal-cluster
//! adapts).
//!
//! Its own database, not a keyspace of the engine's: openraft calls the store inline on its core
//! task, and a keyspace in the engine's database shared that database's journal and write stalls
//! with the overlay flushes of a heavy load, so a 64 MiB flush could hold up a heartbeat's commit
//! or a vote long enough for the followers to campaign against a healthy leader (decisions/012).
//! Data dirs from before the split hold the store in the engine's `raft` keyspace;
//! [`RaftStore::migrate_from`] moves it over once.
//!
//! Bytes in, bytes out: tidal-core does not know openraft's types. Every write that must survive a
//! crash (`write_sync`) is one fjall batch persisted with `SyncAll` before it returns. The keyspace
//! is NOT log-derived state: it is never part of the digest or of a snapshot of the engine.

use crate::error::Error;
use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};
use std::path::Path;

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

/// Handle on the `raft` keyspace. Cheap to clone.
#[derive(Clone)]
pub struct RaftStore {
    database: Database,
    keyspace: Keyspace,
}

impl RaftStore {
    pub(crate) fn open(database: &Database) -> Result<RaftStore, Error> {
        let keyspace = database.keyspace("raft", KeyspaceCreateOptions::default)?;
        Ok(RaftStore { database: database.clone(), keyspace })
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

    /// Moves everything `legacy` holds into this (empty) store: one fsynced batch here first, then
    /// `legacy` is emptied (fsynced). A crash between the two leaves both full and equal, and the
    /// next start sees this store non-empty and only empties `legacy` again. Returns how many
    /// entries moved.
    pub fn migrate_from(&self, legacy: &RaftStore) -> Result<usize, Error> {
        let entries = legacy.all()?;
        if entries.is_empty() {
            return Ok(0);
        }
        if self.is_empty()? {
            self.write(entries.iter().map(|(k, v)| RaftWrite::Put(k.clone(), v.clone())).collect(), true)?;
        }
        legacy.write(entries.iter().map(|(k, _)| RaftWrite::Remove(k.clone())).collect(), true)?;
        Ok(entries.len())
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

    /// Every entry, in key order.
    fn all(&self) -> Result<Entries, Error> {
        let mut entries = Vec::new();
        for guard in self.keyspace.iter() {
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
        let durability = if sync { Some(PersistMode::SyncAll) } else { None };
        let mut batch = self.database.batch().durability(durability);
        for write in writes {
            match write {
                RaftWrite::Put(key, value) => batch.insert(&self.keyspace, key, value),
                RaftWrite::Remove(key) => batch.remove(&self.keyspace, key),
            }
        }
        batch.commit()?;
        Ok(())
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
            let db = TidalDb::open(dir.path(), EngineConfig::default()).unwrap();
            let store = db.raft_store().unwrap();
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
        let db = TidalDb::open(dir.path(), EngineConfig::default()).unwrap();
        let store = db.raft_store().unwrap();
        assert_eq!(store.get(b"vote").unwrap(), None);
        assert!(!store.is_empty().unwrap());
        let log = store.range(b"log/", b"log0").unwrap();
        assert_eq!(log.iter().map(|(_, v)| v.as_slice()).collect::<Vec<_>>(), [b"one", b"two"]);
        // The control plane's keyspace is not log-derived state.
        let before = db.digest().unwrap();
        store.write(vec![RaftWrite::Put(b"x".to_vec(), b"y".to_vec())], false).unwrap();
        assert_eq!(db.digest().unwrap(), before);
    }

    #[test]
    fn own_database_survives_reopen_and_migration_moves_everything_once() {
        let dir = tempfile::tempdir().unwrap();
        let db = TidalDb::open(&dir.path().join("state"), EngineConfig::default()).unwrap();
        let legacy = db.raft_store().unwrap();
        let old = vec![
            RaftWrite::Put(b"vote".to_vec(), b"T3-N2".to_vec()),
            RaftWrite::Put(b"log/\x00\x01".to_vec(), b"one".to_vec()),
        ];
        legacy.write(old, true).unwrap();
        {
            let store = RaftStore::open_dir(&dir.path().join("raft")).unwrap();
            assert!(store.is_empty().unwrap());
            assert_eq!(store.migrate_from(&legacy).unwrap(), 2);
            assert!(legacy.is_empty().unwrap(), "the legacy keyspace is emptied");
            assert_eq!(store.migrate_from(&legacy).unwrap(), 0, "nothing moves twice");
        }
        // A crash after the copy but before the legacy keyspace was emptied: the copy is not
        // overwritten by the stale legacy entries, and they are removed.
        let store = RaftStore::open_dir(&dir.path().join("raft")).unwrap();
        store.write(vec![RaftWrite::Put(b"vote".to_vec(), b"T4-N1".to_vec())], true).unwrap();
        legacy.write(vec![RaftWrite::Put(b"vote".to_vec(), b"T3-N2".to_vec())], true).unwrap();
        assert_eq!(store.migrate_from(&legacy).unwrap(), 1);
        assert_eq!(store.get(b"vote").unwrap().as_deref(), Some(&b"T4-N1"[..]));
        assert_eq!(store.get(b"log/\x00\x01").unwrap().as_deref(), Some(&b"one"[..]));
        assert!(legacy.is_empty().unwrap());
    }
}
