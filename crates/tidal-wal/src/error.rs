//! The WAL's errors: [`Error`] for operations and completions, [`SubmitError`] for refused submits.
//!
//! `Error` is `Clone` (I/O causes sit behind an `Arc`) because one failed fsync must be reported to
//! every completion of its drain. A refusal to queue is a [`SubmitError`], not an `Error`: it hands the
//! request back so the caller can retry or answer "overloaded".

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use tidal_types::{Seqno, Term};

use crate::batch::Batch;
use crate::writer::AppendRequest;

/// What went wrong in the WAL.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// A file operation failed (outside the fsync of a drain). The WAL is NOT poisoned by it.
    ///
    /// As the outcome of an append or a replicated append it means the writer could not get the
    /// next segment (issue 37, finding 11; decisions/058): creating its file, renaming the prepared
    /// one into place, or opening the directory to fsync its name failed (typically EMFILE, no
    /// file descriptor left). Nothing of that request was written; for a replicated request, its
    /// batches before the failed rotation were (they are durable and announced, as
    /// [`crate::Wal::last_position`] shows). Later requests are taken as usual: retry once the
    /// resource is back.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done ("read segment", "create segment"...).
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: Arc<io::Error>,
    },
    /// An fsync or a write of the writer failed: the WAL is now poisoned, nothing more is appended.
    #[error("{op} {path} failed; the WAL is poisoned: {source}")]
    Fatal {
        /// What was being done ("fsync segment", "write segment"...).
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: Arc<io::Error>,
    },
    /// Bytes on disk are damaged (not a torn tail): the WAL refuses to open or to read them.
    #[error("corrupt WAL file {path} at offset {offset}: {reason}")]
    Corrupt {
        /// The damaged file.
        path: PathBuf,
        /// Byte offset of the damaged batch (or field) in that file.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// An earlier fsync or write failure poisoned the WAL; restart and recover.
    #[error("the WAL is poisoned by an earlier fsync or write failure")]
    Poisoned,
    /// The WAL was shut down.
    #[error("the WAL is shut down")]
    Closed,
    /// The requested seqno lies below the retained segments.
    #[error("seqno {requested} is purged; the WAL retains seqnos from {first_retained}")]
    Purged {
        /// What was asked for.
        requested: Seqno,
        /// The first seqno still retained.
        first_retained: Seqno,
    },
    /// The request breaks the format (empty, too large, zero events...).
    #[error("invalid append request: {0}")]
    Invalid(String),
    /// The writer thread could not be started.
    #[error("start the WAL writer thread: {0}")]
    Spawn(Arc<io::Error>),
    /// Replicated batches do not continue the log; nothing of the request was written.
    #[error(
        "replicated batch starts at seqno {got} but the WAL continues at {expected}; nothing was written"
    )]
    NotContiguous {
        /// The seqno the log continues at (durable + 1 plus what this drain already wrote).
        expected: Seqno,
        /// The first seqno of the refused request.
        got: Seqno,
    },
    /// A batch's term is below the term of the log's last batch; nothing of the request was written.
    /// For a leader append this means the node's term is behind a replicated term it holds.
    #[error("batch term {term} is below the log's last term {last_term}; nothing was written")]
    TermRegression {
        /// The refused batch's term.
        term: Term,
        /// Term of the last batch in the log.
        last_term: Term,
    },
    /// A truncation must start exactly at a retained batch's first seqno.
    #[error("seqno {seqno} is not the first seqno of a retained batch")]
    NotBatchStart {
        /// What was asked for.
        seqno: Seqno,
    },
    /// The log was truncated (quarantine or reset) while a reader was on its way; read again.
    #[error("the WAL was truncated while reading from seqno {requested}; read again")]
    TruncatedWhileReading {
        /// Where the reader started.
        requested: Seqno,
    },
    /// A read was asked to start after a position this log does not hold (not the end of a retained
    /// batch with that term, nor the purge point): the caller's log and this one differ there.
    #[error("position {position} is not in this log; its history differs there")]
    NotInLog {
        /// The position asked for.
        position: tidal_types::TermSeqno,
    },
    /// A reset was given a term history that does not fit its position.
    #[error("invalid reset: {0}")]
    InvalidReset(String),
}

impl Error {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Error {
        Error::Io { op, path: path.into(), source: Arc::new(source) }
    }

    pub(crate) fn fatal(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Error {
        Error::Fatal { op, path: path.into(), source: Arc::new(source) }
    }

    pub(crate) fn corrupt(path: impl Into<PathBuf>, offset: u64, reason: impl Into<String>) -> Error {
        Error::Corrupt { path: path.into(), offset, reason: reason.into() }
    }

    /// Whether a file operation failed because no file descriptor was left (EMFILE, ENFILE).
    pub(crate) fn is_out_of_descriptors(&self) -> bool {
        match self {
            Error::Io { source, .. } | Error::Fatal { source, .. } => {
                crate::io::is_out_of_descriptors(source)
            }
            _ => false,
        }
    }
}

/// Why [`crate::Wal::submit`] refused a request. Nothing was queued.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// The queue is at its batch or byte bound; the request is handed back (back off and retry).
    #[error("the WAL queue is full")]
    QueueFull(AppendRequest),
    /// The WAL is poisoned by an fsync or write failure.
    #[error("the WAL is poisoned by an earlier fsync or write failure")]
    Poisoned,
    /// The WAL is shut down.
    #[error("the WAL is shut down")]
    Closed,
    /// The request breaks the format (empty, too large, zero events...).
    #[error("invalid append request: {0}")]
    Invalid(String),
}

/// Why [`crate::Wal::submit_replicated`] refused a request. Nothing was queued.
#[derive(Debug, thiserror::Error)]
pub enum ReplicatedSubmitError {
    /// The queue is at its batch or byte bound; the batches are handed back (back off and retry).
    #[error("the WAL queue is full")]
    QueueFull(Vec<Batch>),
    /// The WAL is poisoned by an fsync or write failure.
    #[error("the WAL is poisoned by an earlier fsync or write failure")]
    Poisoned,
    /// The WAL is shut down.
    #[error("the WAL is shut down")]
    Closed,
    /// The batches are not a contiguous run of non-decreasing terms, or there are none.
    #[error("invalid replicated request: {0}")]
    Invalid(String),
}
