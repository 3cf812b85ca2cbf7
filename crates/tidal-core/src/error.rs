//! The engine's one [`Error`] enum.
//!
//! Delicate: a failed `apply` leaves fjall and the in-memory index unchanged, whatever the variant;
//! callers may branch on [`Error::Gap`] (fetch the missing range) and must treat the others as fatal
//! for the apply loop (a record this node cannot fold would make it diverge).

use tidal_types::{RecordKind, Seqno};

use crate::record_error::RecordError;

/// What went wrong in the engine.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// fjall failed (I/O, or poisoned by an earlier fsync failure).
    #[error("storage: {0}")]
    Storage(#[from] fjall::Error),
    /// The engine could not start a thread it needs.
    #[error("spawn thread {name}: {source}")]
    Spawn {
        /// The thread's name.
        name: &'static str,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The engine could not change a background thread's CPU priority (`priority`).
    #[error("set the priority of thread {thread}: {source}")]
    Priority {
        /// The kernel's id of the thread (0: while listing the process's threads).
        thread: i32,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A background flush failed: fjall holds an older prefix, and the engine refuses applies until
    /// the node restarts and replays the WAL from fjall's applied seqno.
    #[error("background flush failed: {reason}")]
    FlushFailed {
        /// What failed.
        reason: String,
    },
    /// [`crate::TidalDb::flush_tables`] gave up: fjall's flush worker failed (fjall is poisoned)
    /// or wrote nothing within its bound. The memtables stay in fjall's journal (an open replays
    /// them); a poisoned engine is a fatal fault of the node.
    #[error("the engine's memtables were not written to tables ({sealed} still sealed): {reason}")]
    TablesNotWritten {
        /// Sealed memtables not yet written.
        sealed: usize,
        /// Why the wait ended.
        reason: String,
    },
    /// The batch does not start right after the applied frontier.
    #[error("batch starts at seqno {got}, expected {expected}")]
    Gap {
        /// `applied + 1`.
        expected: Seqno,
        /// The batch's first seqno.
        got: Seqno,
    },
    /// The payload of the batch at `seqno` does not decode.
    #[error("batch at seqno {seqno} ({kind}): {source}")]
    Record {
        /// First seqno of the batch.
        seqno: Seqno,
        /// Kind byte of the batch.
        kind: RecordKind,
        /// Why.
        #[source]
        source: RecordError,
    },
    /// The header's event count disagrees with the records in the payload.
    #[error("batch at seqno {seqno}: header counts {header} events, payload holds {records}")]
    EventCount {
        /// First seqno of the batch.
        seqno: Seqno,
        /// `event_count` of the header.
        header: u32,
        /// Events in the payload.
        records: u64,
    },
    /// An embedding of the wrong dimension reached the log (the API checks first).
    #[error("embedding of item {item} has dimension {got}, the database has {expected}")]
    EmbeddingDimension {
        /// Item id.
        item: u64,
        /// The database's dimension.
        expected: u32,
        /// The vector's length.
        got: usize,
    },
    /// The configured dimension differs from the one persisted at creation.
    #[error("database dimension is {persisted}, configured {configured}")]
    DimensionMismatch {
        /// Dimension stored in the database.
        persisted: u32,
        /// Dimension in the configuration.
        configured: u32,
    },
    /// The configuration is invalid.
    #[error("invalid engine configuration: {reason}")]
    Config {
        /// What is wrong.
        reason: String,
    },
    /// The flush intent file could not be written or read (issue 43, `flush_ingest`).
    #[error("flush intent {path}: {source}")]
    Intent {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A flush intent file does not decode: cut short while it was written (`flush_ingest`).
    #[error("flush intent: {reason}")]
    IntentCorrupt {
        /// What is wrong.
        reason: String,
    },
    /// A stored value does not decode: the fjall directory is damaged or from another format.
    #[error("corrupt value in keyspace {keyspace}: {reason}")]
    Corrupt {
        /// Keyspace name.
        keyspace: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A hard negatives state received from a peer breaks the CRDT's invariants.
    #[error("invalid negatives state: {reason}")]
    InvalidNegatives {
        /// What is wrong.
        reason: String,
    },
    /// A snapshot install is under way or was interrupted: the state is not a prefix of the log
    /// until an install completes (a restart resumes it).
    #[error("a snapshot install is incomplete: nothing can be applied until it is resumed")]
    ImportIncomplete,
    /// A user already has the most hard negatives allowed.
    #[error("user has {count} hard negatives, the limit")]
    NegativesFull {
        /// Entries held.
        count: usize,
    },
}
