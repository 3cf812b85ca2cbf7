//! openraft's storage over the node's fjall `raft` keyspace, and the term gate.
//!
//! Delicate (PROTOCOL.md, "The term lock"): `save_vote` takes the node's term gate, persists the
//! vote with an fsync, and only then publishes the new term to the data path. Terms reach the data
//! path ONLY through here, so a node never refuses or accepts a ship by a term openraft does not
//! know durably.

// openraft's trait signatures fix the error types; they are large by its design.
#![allow(clippy::result_large_err)]

use super::types::{ControlCmd, NodeInfo, TypeConfig};
use crate::error::{Error, Result};
use crate::fatal::{Fatal, FatalSource};
use openraft::storage::{LogFlushed, RaftLogStorage, RaftStateMachine};
use openraft::{
    Entry, EntryPayload, LogId, LogState, OptionalSend, RaftLogReader, RaftSnapshotBuilder, Snapshot,
    SnapshotMeta, StorageError, StorageIOError, StoredMembership, Vote,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io::Cursor;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tidal_core::{RaftStore, RaftWrite};
use tidal_types::Term;

type StorageResult<T> = Result<T, StorageError<u64>>;

const KEY_VOTE: &[u8] = b"vote";
const KEY_COMMITTED: &[u8] = b"committed";
const KEY_PURGED: &[u8] = b"purged";
const KEY_STATE: &[u8] = b"state";
const KEY_SNAPSHOT: &[u8] = b"snapshot";
const LOG_PREFIX: &[u8] = b"log/";
const LOG_END: &[u8] = b"log0";

/// The node's term lock and its current (persisted vote) term.
///
/// One lock serializes persisting a vote, answering a probe, a follower's whole receive (decide,
/// append, fsync, ack: it is held across the fsync) and a leader's opening of a term.
#[derive(Default)]
pub struct TermGate {
    lock: tokio::sync::Mutex<()>,
    term: AtomicU64,
    changed: tokio::sync::Notify,
    on_raise: Mutex<Vec<TermListener>>,
}

/// Called, under the term lock, when a higher term has been persisted.
pub type TermListener = Box<dyn Fn(Term) + Send + Sync>;

impl TermGate {
    /// A gate at `term` (the persisted vote's term at boot).
    pub fn new(term: Term) -> Arc<TermGate> {
        Arc::new(TermGate { term: AtomicU64::new(term.get()), ..TermGate::default() })
    }

    /// Takes the term lock.
    pub async fn lock(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.lock.lock().await
    }

    /// The current term. Read it under the lock when the answer decides anything.
    pub fn term(&self) -> Term {
        Term(self.term.load(Ordering::SeqCst))
    }

    /// Registers `listener`, called synchronously (under the term lock, before the vote that raised
    /// the term is answered) at every term raise.
    pub fn on_raise(&self, listener: TermListener) {
        self.on_raise.lock().expect("listener lock is never held across a panic").push(listener);
    }

    /// Raises the term (the caller holds the lock and has persisted it).
    fn raise(&self, term: Term) {
        if self.term.fetch_max(term.get(), Ordering::SeqCst) < term.get() {
            for listener in self.on_raise.lock().expect("listener lock is never held across a panic").iter() {
                listener(term);
            }
            self.changed.notify_waiters();
        }
    }

    /// Resolves at the next term change.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }
}

fn log_key(index: u64) -> Vec<u8> {
    let mut key = LOG_PREFIX.to_vec();
    key.extend_from_slice(&index.to_be_bytes());
    key
}

fn read_err(error: impl std::error::Error + 'static) -> StorageError<u64> {
    StorageIOError::read(&error).into()
}

fn write_err(error: impl std::error::Error + 'static) -> StorageError<u64> {
    StorageIOError::write(&error).into()
}

fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> StorageResult<T> {
    serde_json::from_slice(bytes).map_err(read_err)
}

fn encode<T: Serialize>(value: &T) -> StorageResult<Vec<u8>> {
    serde_json::to_vec(value).map_err(write_err)
}

/// openraft's log and vote, in fjall.
#[derive(Clone)]
pub struct LogStore {
    store: RaftStore,
    gate: Arc<TermGate>,
    fatal: Fatal,
}

impl LogStore {
    /// A log store over `store`; votes go through `gate`; a vote that cannot be persisted raises
    /// `fatal` (openraft's core then stops too).
    pub fn new(store: RaftStore, gate: Arc<TermGate>, fatal: Fatal) -> LogStore {
        LogStore { store, gate, fatal }
    }

    /// The persisted vote's term (0 before any vote).
    pub fn persisted_term(store: &RaftStore) -> Result<Term> {
        match store.get(KEY_VOTE).map_err(|e| Error::Store(e.to_string()))? {
            None => Ok(Term(0)),
            Some(bytes) => {
                let vote: Vote<u64> =
                    serde_json::from_slice(&bytes).map_err(|e| Error::Store(format!("the vote: {e}")))?;
                Ok(Term(vote.leader_id.term))
            }
        }
    }

    /// Whether openraft has anything stored (a log entry or a vote).
    pub fn is_fresh(store: &RaftStore) -> Result<bool> {
        let vote = store.get(KEY_VOTE).map_err(|e| Error::Store(e.to_string()))?;
        let log = store.keys(LOG_PREFIX, LOG_END).map_err(|e| Error::Store(e.to_string()))?;
        Ok(vote.is_none() && log.is_empty())
    }
}

fn bounds(range: &impl RangeBounds<u64>) -> (u64, Option<u64>) {
    let start = match range.start_bound() {
        Bound::Included(&start) => start,
        Bound::Excluded(&start) => start.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&end) => end.checked_add(1),
        Bound::Excluded(&end) => Some(end),
        Bound::Unbounded => None,
    };
    (start, end)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry<TypeConfig>>> {
        let (start, end) = bounds(&range);
        let to = end.map_or_else(|| LOG_END.to_vec(), log_key);
        if end.is_some_and(|end| end <= start) {
            return Ok(Vec::new());
        }
        let entries = self.store.range(&log_key(start), &to).map_err(read_err)?;
        entries.iter().map(|(_, value)| decode(value)).collect()
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> StorageResult<LogState<TypeConfig>> {
        let purged: Option<LogId<u64>> = match self.store.get(KEY_PURGED).map_err(read_err)? {
            Some(bytes) => decode(&bytes)?,
            None => None,
        };
        let entries = self.store.range(LOG_PREFIX, LOG_END).map_err(read_err)?;
        let last = match entries.last() {
            Some((_, value)) => Some(decode::<Entry<TypeConfig>>(value)?.log_id),
            None => purged,
        };
        Ok(LogState { last_purged_log_id: purged, last_log_id: last })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> StorageResult<()> {
        let bytes = encode(vote)?;
        let _term_lock = self.gate.lock().await;
        let store = self.store.clone();
        let saved = crate::blocking::blocking(move || {
            store.write(vec![RaftWrite::Put(KEY_VOTE.to_vec(), bytes)], true).map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|written| written);
        if let Err(why) = saved {
            // Fatal (PROTOCOL.md, "Storage errors"): after a failed fsync nothing says what the disk
            // holds; the term is not raised (nothing is answered by it) and openraft's core stops on
            // this error.
            self.fatal.raise(FatalSource::Vote, format!("persist the vote {vote}: {why}"));
            return Err(StorageIOError::write_vote(&std::io::Error::other(why)).into());
        }
        self.gate.raise(Term(vote.leader_id.term));
        Ok(())
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote<u64>>> {
        match self.store.get(KEY_VOTE).map_err(read_err)? {
            Some(bytes) => Ok(Some(decode(&bytes)?)),
            None => Ok(None),
        }
    }

    async fn save_committed(&mut self, committed: Option<LogId<u64>>) -> StorageResult<()> {
        let bytes = encode(&committed)?;
        self.store.write(vec![RaftWrite::Put(KEY_COMMITTED.to_vec(), bytes)], false).map_err(write_err)
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId<u64>>> {
        match self.store.get(KEY_COMMITTED).map_err(read_err)? {
            Some(bytes) => decode(&bytes),
            None => Ok(None),
        }
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut writes = Vec::new();
        for entry in entries {
            writes.push(RaftWrite::Put(log_key(entry.log_id.index), encode(&entry)?));
        }
        let store = self.store.clone();
        let result = crate::blocking::blocking(move || store.write(writes, true))
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))
            .and_then(|written| written.map_err(|e| std::io::Error::other(e.to_string())));
        let failed = result.as_ref().err().map(|e| e.to_string());
        callback.log_io_completed(result);
        match failed {
            None => Ok(()),
            Some(reason) => Err(StorageIOError::write_logs(&std::io::Error::other(reason)).into()),
        }
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> StorageResult<()> {
        let keys = self.store.keys(&log_key(log_id.index), LOG_END).map_err(read_err)?;
        self.store.write(keys.into_iter().map(RaftWrite::Remove).collect(), true).map_err(write_err)
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> StorageResult<()> {
        let mut writes = vec![RaftWrite::Put(KEY_PURGED.to_vec(), encode(&Some(log_id))?)];
        let keys = self.store.keys(LOG_PREFIX, &log_key(log_id.index.saturating_add(1))).map_err(read_err)?;
        writes.extend(keys.into_iter().map(RaftWrite::Remove));
        self.store.write(writes, true).map_err(write_err)
    }
}

/// One LeaderStart as the control log recorded it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderStartRecord {
    /// Leader.
    pub leader: u64,
    /// Stream baseline.
    pub baseline: u64,
}

/// Terms whose LeaderStart the state machine keeps (for status).
const LEADER_STARTS_KEPT: usize = 32;

/// The control state machine: membership and the recent LeaderStarts.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ControlState {
    /// Last applied control-log entry.
    pub last_applied: Option<LogId<u64>>,
    /// Membership.
    pub membership: StoredMembership<u64, NodeInfo>,
    /// term → LeaderStart.
    pub leader_starts: BTreeMap<u64, LeaderStartRecord>,
}

#[derive(Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta<u64, NodeInfo>,
    data: Vec<u8>,
}

/// The state machine, persisted in the same keyspace (unsynced: the log is the truth; a lost
/// write is re-applied from it).
#[derive(Clone)]
pub struct StateMachine {
    store: RaftStore,
    state: Arc<Mutex<ControlState>>,
}

impl StateMachine {
    /// Loads the state machine.
    pub fn open(store: RaftStore) -> Result<StateMachine> {
        let state = match store.get(KEY_STATE).map_err(|e| Error::Store(e.to_string()))? {
            Some(bytes) => {
                serde_json::from_slice(&bytes).map_err(|e| Error::Store(format!("control state: {e}")))?
            }
            None => ControlState::default(),
        };
        Ok(StateMachine { store, state: Arc::new(Mutex::new(state)) })
    }

    /// A copy of the state.
    pub fn state(&self) -> ControlState {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ControlState> {
        self.state.lock().expect("control state lock is never held across a panic")
    }

    fn persist(&self, state: &ControlState) -> StorageResult<()> {
        let bytes = encode(state)?;
        self.store.write(vec![RaftWrite::Put(KEY_STATE.to_vec(), bytes)], false).map_err(write_err)
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> StorageResult<Snapshot<TypeConfig>> {
        let state = self.state();
        let data = encode(&state)?;
        let snapshot_id = format!(
            "{}-{}",
            state.last_applied.map_or(0, |id| id.leader_id.term),
            state.last_applied.map_or(0, |id| id.index)
        );
        let meta =
            SnapshotMeta { last_log_id: state.last_applied, last_membership: state.membership, snapshot_id };
        let stored = StoredSnapshot { meta: meta.clone(), data: data.clone() };
        self.store
            .write(vec![RaftWrite::Put(KEY_SNAPSHOT.to_vec(), encode(&stored)?)], true)
            .map_err(write_err)?;
        Ok(Snapshot { meta, snapshot: Box::new(Cursor::new(data)) })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(
        &mut self,
    ) -> StorageResult<(Option<LogId<u64>>, StoredMembership<u64, NodeInfo>)> {
        let state = self.lock();
        Ok((state.last_applied, state.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> StorageResult<Vec<()>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut replies = Vec::new();
        let snapshot = {
            let mut state = self.lock();
            for entry in entries {
                state.last_applied = Some(entry.log_id);
                match entry.payload {
                    EntryPayload::Blank => {}
                    EntryPayload::Normal(ControlCmd::LeaderStart { term, leader, baseline }) => {
                        state.leader_starts.insert(term, LeaderStartRecord { leader, baseline });
                        while state.leader_starts.len() > LEADER_STARTS_KEPT {
                            state.leader_starts.pop_first();
                        }
                    }
                    EntryPayload::Membership(membership) => {
                        state.membership = StoredMembership::new(Some(entry.log_id), membership);
                    }
                }
                replies.push(());
            }
            state.clone()
        };
        self.persist(&snapshot)?;
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> StorageResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, NodeInfo>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> StorageResult<()> {
        let data = snapshot.into_inner();
        let mut state: ControlState = decode(&data)?;
        state.last_applied = meta.last_log_id;
        state.membership = meta.last_membership.clone();
        let stored = StoredSnapshot { meta: meta.clone(), data };
        self.store
            .write(vec![RaftWrite::Put(KEY_SNAPSHOT.to_vec(), encode(&stored)?)], true)
            .map_err(write_err)?;
        self.persist(&state)?;
        *self.lock() = state;
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StorageResult<Option<Snapshot<TypeConfig>>> {
        match self.store.get(KEY_SNAPSHOT).map_err(read_err)? {
            None => Ok(None),
            Some(bytes) => {
                let stored: StoredSnapshot = decode(&bytes)?;
                Ok(Some(Snapshot { meta: stored.meta, snapshot: Box::new(Cursor::new(stored.data)) }))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use openraft::Vote;

    /// The replication protocol names a batch by (term, seqno) and relies on ONE leader per term
    /// (PROTOCOL.md, "Log matching"). openraft's default mode orders votes by (term, node id), so a
    /// voter that granted T1-N1 would then grant T1-N2 and two leaders would write different
    /// batches at the same (term, seqno); the simulation found exactly that (decisions/008). The
    /// `single-term-leader` feature gives the standard rule; this test breaks if it is dropped.
    #[test]
    fn one_leader_per_term() {
        let granted = Vote::<u64>::new(1, 1);
        let rival = Vote::<u64>::new(1, 2);
        assert!(
            rival.partial_cmp(&granted).is_none(),
            "a second candidate of the same term must not win a vote"
        );
        assert_ne!(rival.partial_cmp(&granted), Some(std::cmp::Ordering::Greater));
        assert!(Vote::<u64>::new(2, 2) > granted, "a higher term still wins");
    }
}
