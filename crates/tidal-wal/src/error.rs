//! The WAL's errors: [`Error`] for operations and completions, [`SubmitError`] for refused submits.
//!
//! `Error` is `Clone` (I/O causes sit behind an `Arc`) because one failed fsync must be reported to
//! every completion of its drain. A refusal to queue is a [`SubmitError`], not an `Error`: it hands the
//! request back so the caller can retry or answer "overloaded".

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use tidal_types::Seqno;

use crate::writer::AppendRequest;

/// What went wrong in the WAL.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// A file operation failed (outside the fsync of a drain).
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
