//! The control plane's durable store: a small fjall keyspace (`raft`) beside the engine's state,
//! holding openraft's vote, log and state-machine snapshot, and the commit hint (DESIGN.md,
//! "Control plane": openraft's storage is a fjall-backed store that tidal-core exposes and
//! tidal-cluster adapts).
//!
//! Bytes in, bytes out: tidal-core does not know openraft's types. Every write that must survive a
//! crash (`write_sync`) is one fjall batch persisted with `SyncAll` before it returns. The keyspace
//! is NOT log-derived state: it is never part of the digest or of a snapshot of the engine.

use crate::error::Error;
use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};

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
        let log = store.range(b"log/", b"log0").unwrap();
        assert_eq!(log.iter().map(|(_, v)| v.as_slice()).collect::<Vec<_>>(), [b"one", b"two"]);
        // The control plane's keyspace is not log-derived state.
        let before = db.digest().unwrap();
        store.write(vec![RaftWrite::Put(b"x".to_vec(), b"y".to_vec())], false).unwrap();
        assert_eq!(db.digest().unwrap(), before);
    }
}
