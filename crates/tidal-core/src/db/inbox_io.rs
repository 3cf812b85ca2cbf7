//! The inbox side of [`TidalDb`]: reads of the `inboxes` keyspace, what each applied inbox record
//! did (for the request that wrote it), and the listener told when an inbox changed.
//!
//! Delicate: the listener is called after the apply published its frontier, so a receiver woken by
//! it reads state that holds the change; a receiver that registers with the listener before it
//! checks the state cannot miss a change (the server's receive loop relies on both).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use tidal_types::Seqno;

use super::TidalDb;
use crate::error::Error;
use crate::inboxes::{Availability, InboxMeta, InboxOutcome, InboxState, Receipt, TopicInfo, TopicMeta};

/// Told the owner of every inbox an applied record changed (or tried to), on the applier's thread:
/// it must return at once.
pub type InboxListener = Arc<dyn Fn(&str) + Send + Sync>;

/// Outcomes kept for their writers: a writer asks right after its own apply, so this only needs to
/// cover the inbox records applied while it was being woken.
const OUTCOMES_KEPT: usize = 65_536;

/// What inbox records did, by seqno, and who to tell.
#[derive(Default)]
pub(super) struct InboxSignals {
    outcomes: Mutex<VecDeque<(Seqno, InboxOutcome)>>,
    listener: RwLock<Option<InboxListener>>,
}

impl InboxSignals {
    /// Records what the inbox record at `seqno` did and tells the listener.
    pub(super) fn applied(&self, owner: &str, seqno: Seqno, outcome: InboxOutcome) {
        {
            let mut outcomes = self.outcomes.lock().unwrap_or_else(PoisonError::into_inner);
            if outcomes.len() == OUTCOMES_KEPT {
                outcomes.pop_front();
            }
            outcomes.push_back((seqno, outcome));
        }
        if let Some(listener) = self.listener.read().unwrap_or_else(PoisonError::into_inner).as_ref() {
            listener(owner);
        }
    }
}

impl TidalDb {
    /// Sets the function told the owner of every inbox an applied record touched.
    pub fn set_inbox_listener(&self, listener: InboxListener) {
        *self.inbox_signals.listener.write().unwrap_or_else(PoisonError::into_inner) = Some(listener);
    }

    /// What the inbox record at `seqno` did, if it was applied recently (the last 65,536 inbox
    /// records are kept).
    pub fn inbox_outcome(&self, seqno: u64) -> Option<InboxOutcome> {
        let outcomes = self.inbox_signals.outcomes.lock().unwrap_or_else(PoisonError::into_inner);
        let at = outcomes.binary_search_by_key(&seqno, |(s, _)| s.0).ok()?;
        Some(outcomes[at].1.clone())
    }

    fn with_inboxes<T>(&self, read: impl FnOnce(&InboxState<'_>) -> Result<T, Error>) -> Result<T, Error> {
        let state = self.read_state();
        read(&InboxState::new(state.view(), &self.stores))
    }

    /// An inbox's meta, if it ever existed.
    pub fn inbox_meta(&self, owner: &str) -> Result<Option<InboxMeta>, Error> {
        self.with_inboxes(|inboxes| inboxes.inbox_meta(owner))
    }

    /// A topic's meta, if it is live.
    pub fn inbox_topic(&self, owner: &str, topic: &str) -> Result<Option<TopicMeta>, Error> {
        self.with_inboxes(|inboxes| inboxes.topic_meta(owner, topic))
    }

    /// An inbox's live topics, as of the last applied logged time.
    pub fn inbox_topics(&self, owner: &str) -> Result<Vec<TopicInfo>, Error> {
        let now_ms = self.last_applied_time_ms();
        self.with_inboxes(|inboxes| inboxes.topic_infos(owner, now_ms))
    }

    /// What the receive `receive_id` took, while its receipt is kept.
    pub fn inbox_receipt(&self, owner: &str, receive_id: &str) -> Result<Option<Receipt>, Error> {
        self.with_inboxes(|inboxes| inboxes.receipt(owner, receive_id))
    }

    /// Whether a receive on `topics` at logged time `now_ms` would take something, else when a
    /// lease among them ends: a waiting receiver's hint (the receive's apply decides).
    pub fn inbox_availability(
        &self,
        owner: &str,
        topics: &[String],
        now_ms: u64,
    ) -> Result<Availability, Error> {
        self.with_inboxes(|inboxes| inboxes.availability(owner, topics, now_ms))
    }

    /// Live topics of every inbox after `after` (owner, topic), at most `limit`.
    pub fn inbox_live_topics(
        &self,
        after: Option<(&str, &str)>,
        limit: usize,
    ) -> Result<Vec<(String, String, TopicMeta)>, Error> {
        self.with_inboxes(|inboxes| inboxes.all_live_topics(after, limit))
    }

    /// The last sequence of a topic's prefix created before `cutoff_ms`, looking at no more than
    /// `scan_max` messages: what a TTL expiry discards through.
    pub fn inbox_expiry_point(
        &self,
        owner: &str,
        topic: &str,
        cutoff_ms: u64,
        scan_max: usize,
    ) -> Result<Option<u64>, Error> {
        self.with_inboxes(|inboxes| inboxes.expiry_point(owner, topic, cutoff_ms, scan_max))
    }
}

impl TidalDb {
    /// Entries fjall holds in the `inboxes` keyspace (tests: consumed messages leave storage).
    #[doc(hidden)]
    pub fn inbox_entries_in_storage(&self) -> Result<usize, Error> {
        let mut count = 0;
        for guard in self.stores.inboxes.iter() {
            guard.key()?;
            count += 1;
        }
        Ok(count)
    }
}
