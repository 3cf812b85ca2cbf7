//! Tidal's write-ahead log: segment files of BLAKE3-sealed batches, a group-commit writer thread,
//! recovery that tells a torn tail from corruption, read-back for catch-up, and purge.
//!
//! # Layout
//!
//! - [`batch`]: the binding 64-byte batch header, encode/decode.
//! - [`Wal`] (`wal.rs`): the handle; [`writer`]: the sequencer thread (leader appends and a
//!   follower's replicated appends); [`recovery`]: open-time scan; [`WalReader`]: read-back;
//!   [`wal_meta`]: term history, purge point and a pending truncation (`wal.meta`); [`segment`]: file
//!   naming and the verifying scan; [`batch_index`]: batch boundaries of the retained log, for
//!   [`Wal::locate`]; [`quarantine`]: truncating a divergent tail or resetting to a snapshot position.
//! - [`FileIo`] / [`StdIo`] / [`SimIo`]: file I/O behind a trait, with an in-memory, fault-injecting
//!   implementation for tests and the simulation.
//!
//! # Non-goals
//!
//! It is not: a replication protocol (it only stores what it is given and says what is durable), an
//! index (read-back is a sequential scan from a segment boundary), or a store of client-visible
//! state. Payloads are opaque, except their first 8 bytes: the logged time the writer stamps.
#![deny(missing_docs)]
#![deny(unsafe_code)]
#![deny(clippy::unwrap_used)]

pub mod batch;
pub mod batch_index;
pub mod clock;
pub mod config;
pub mod error;
pub mod io;
pub mod quarantine;
pub mod reader;
pub mod recovery;
pub mod segment;
mod shared;
pub mod sim_io;
pub mod stats;
pub mod wal;
pub mod wal_meta;
pub mod writer;

pub use batch::{
    decode_batch, decode_header, encode_batch, Batch, BatchHeader, BatchRef, DecodeError, HEADER_LEN,
};
pub use batch_index::Position;
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::WalConfig;
pub use error::{Error, ReplicatedSubmitError, SubmitError};
pub use io::{FileIo, StdIo, WalFile};
pub use quarantine::{quarantine_summary, QuarantineReport, QuarantineSummary};
pub use reader::{RawReader, RawRun, WalReader};
pub use recovery::{Recovery, TornTail};
pub use segment::SegmentInfo;
pub use sim_io::{CrashMode, SimIo};
pub use stats::WalStats;
pub use wal::{DurableView, PurgeReport, RecoveredWal, Wal};
pub use writer::{
    AppendRequest, Appended, Completion, FlushedHook, NoopHook, ReplicatedAppended, ReplicatedCompletion,
    WrittenCallback,
};
