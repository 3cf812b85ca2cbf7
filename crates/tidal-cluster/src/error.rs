//! The errors of this crate: one enum, with the values an operator (or a test) needs to act on.
//!
//! Refusals of replication input are not errors: a refused ship is an answer
//! ([`tidal_net::ShipOutcome`]) counted by class ([`crate::Refusal`]). What is here ends an
//! operation: an operator request that cannot run, an office that could not be taken, a pull or
//! install that failed, a store or file that could not be written.

use std::path::PathBuf;
use std::time::Duration;
use tidal_types::{NodeId, Seqno, Term};

/// Why an operation of the replication side did not complete.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An operator request that cannot succeed as asked (e.g. the target is not a voter): fix the
    /// request.
    #[error("{0}")]
    Invalid(String),
    /// An operator request that cannot run now (another change runs, a learner still catches up,
    /// the target is silent, the attempt failed): retry.
    #[error("{0}")]
    Unavailable(String),
    /// An operator verb that only the serving leader runs reached another node.
    #[error("node {me} is not the serving leader; ask the leader ({leader:?})")]
    NotLeader {
        /// This node.
        me: NodeId,
        /// The leader it knows, if any.
        leader: Option<NodeId>,
    },
    /// A follower's verb reached the leader.
    #[error("the leader has nothing to catch up from")]
    IsLeader,
    /// No leader is known yet.
    #[error("no leader is known yet")]
    NoLeaderKnown,
    /// The node named is not another member of this cluster.
    #[error("node {0} is not a peer")]
    NotAPeer(NodeId),
    /// The cluster file (or the membership it seeds) is not usable.
    #[error("{0}")]
    Spec(String),
    /// The office of `term` ended before this step (stopped, or the term moved on).
    #[error("the office of term {term} ended: {why}")]
    OfficeEnded {
        /// The office's term.
        term: Term,
        /// What ended it.
        why: String,
    },
    /// A voter answered the office's probe from a higher term: another node was elected, which is
    /// the protocol working (not a fault), so it is logged at WARN.
    #[error("a voter is at term {higher}: stepping down from term {term}")]
    Superseded {
        /// The office's term.
        term: Term,
        /// The voter's term.
        higher: Term,
    },
    /// openraft restored our leadership of `term` after a restart, and a term is never resumed
    /// across a restart: the office is handed over (decisions/068).
    #[error("could not take office of term {term}: openraft restored our leadership of it after a restart; a term is never resumed across a restart")]
    ResumedTerm {
        /// The restored term.
        term: Term,
    },
    /// The office could not be taken (the deadline passed).
    #[error("could not take office of term {term}: {why}")]
    NoOffice {
        /// The office's term.
        term: Term,
        /// Why.
        why: String,
    },
    /// The WAL refused or failed an operation.
    #[error("{during}: {why}")]
    Wal {
        /// What was being done.
        during: String,
        /// The WAL's error.
        why: String,
    },
    /// A call to another node failed.
    #[error("node {peer}: {why}")]
    Net {
        /// The node called.
        peer: NodeId,
        /// The transport's error.
        why: String,
    },
    /// A pull ended without bringing this node's log to the source's.
    #[error("pull from node {from}: {why}")]
    Pull {
        /// The node pulled from.
        from: NodeId,
        /// Why it ended.
        why: String,
    },
    /// A snapshot could not be fetched or installed.
    #[error("snapshot from node {from}: {why}")]
    Snapshot {
        /// The node it was fetched from.
        from: NodeId,
        /// Why.
        why: String,
    },
    /// Another snapshot install runs on this node.
    #[error("a snapshot install is already running")]
    InstallRunning,
    /// Installs start at most once per interval; the last one started `ago`.
    #[error("needs a snapshot ({why}), but the last install started {ago:?} ago (at most one every {interval:?}); retrying later")]
    InstallTooSoon {
        /// Why a snapshot is needed.
        why: String,
        /// When the last install started.
        ago: Duration,
        /// The least time between installs.
        interval: Duration,
    },
    /// The LeaderStart did not land right after the baseline (the WAL numbers batches: a bug).
    #[error("LeaderStart landed at {at}, expected {expected}")]
    LeaderStartMisplaced {
        /// Where it landed.
        at: Seqno,
        /// Baseline + 1.
        expected: Seqno,
    },
    /// openraft refused or failed.
    #[error("openraft: {0}")]
    Control(String),
    /// The control plane's store or the engine failed.
    #[error("store: {0}")]
    Store(String),
    /// A file of the data directory could not be written.
    #[error("{path}: {why}")]
    File {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        why: String,
    },
}

impl Error {
    /// Whether retrying may succeed (everything but a request that is invalid as asked).
    pub fn is_invalid_request(&self) -> bool {
        matches!(self, Error::Invalid(_))
    }

    /// A WAL error while doing `during`.
    pub(crate) fn wal(during: impl Into<String>, why: impl std::fmt::Display) -> Error {
        Error::Wal { during: during.into(), why: why.to_string() }
    }

    /// A failed call to `peer`.
    pub(crate) fn net(peer: NodeId, why: impl std::fmt::Display) -> Error {
        Error::Net { peer, why: why.to_string() }
    }
}

/// The crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
