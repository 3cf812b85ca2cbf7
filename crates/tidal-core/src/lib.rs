//! Tidal's engine: folds WAL batches into fjall and serves ranked reads.
//!
//! fjall is a materialization of the log, never the source of truth: [`TidalDb::apply`] folds into
//! an in-memory write-back overlay, and a flush writes the overlay with its applied seqno in one
//! atomic fjall batch. After a crash the caller replays the WAL from [`TidalDb::applied_seqno`] + 1
//! (fjall's, after `open`); WAL purge may not pass what [`TidalDb::checkpoint`] returned. The fold is deterministic (same log ⇒
//! bit-identical state and [`TidalDb::digest`]); time is only ever the logged time.
//!
//! # Layout
//! - [`record`]: the payload codec (envelope + records), binding for every node.
//! - `db`: [`TidalDb`], the one apply path and the reads.
//! - `fold`: what a batch changes; `overlay`: dirty state not yet in fjall; `flusher`: the thread
//!   that writes frozen overlays to fjall; `counters`: all per-kind counters; `trend_blocks`: how
//!   trending scores and counters are stored, 16 items per fjall entry (decisions/070);
//!   `idempotency`: the replicated idempotency table; [`priority`]: the background threads' nice
//!   value.
//! - `feed_index`, `ranked`: the in-memory ranking index and the feed / similar / trending loops;
//!   `ann_index`, `trend_order`: the approximate index large catalogues rank with (decisions/067).
//! - `negatives`: the hard negatives ORSWOT (outside the log); `digest`: state digests.
//! - [`snapshot`]: the snapshot format; `db/snapshot_io`: [`TidalDb::export_snapshot`] and
//!   [`TidalDb::install_snapshot`].
//!
//! Non-goals: this crate does no networking, reads no clock for state (a monotonic clock only
//! times flushes for metrics) and knows no WAL files; it takes batches. It runs one thread of its
//! own, the flusher. fjall is named only here, and fjall's sequence numbers never leave it.
#![deny(missing_docs)]
#![deny(unsafe_code)]
#![deny(clippy::unwrap_used)]

mod ann_index;
mod config;
mod counters;
mod db;
mod digest;
mod dirty_set;
mod error;
mod fast_hash;
mod feed_index;
mod flush_ingest;
mod flusher;
mod fold;
mod idempotency;
mod inboxes;
mod keys;
mod layers;
mod negatives;
mod overlay;
mod prefetch;
pub mod priority;
mod raft_store;
mod ranked;
pub mod record;
mod record_error;
mod seen;
pub mod snapshot;
mod stores;
mod streams;
mod trend;
mod trend_blocks;
mod trend_order;

pub use config::{
    EngineConfig, ANN_CENTROIDS_AT_DEFAULT, ANN_LISTS_DEFAULT, ANN_LISTS_MAX, ANN_PROBES_DEFAULT,
    ANN_THRESHOLD_DEFAULT, DIMENSION_DEFAULT, DIMENSION_MAX, FLUSH_INGEST_BYTES_MIN_DEFAULT,
    HALF_LIFE_MS_DEFAULT, IDEMPOTENCY_KEYS_MAX_DEFAULT, IDEMPOTENCY_WINDOW_MS_DEFAULT,
    OVERLAY_BATCHES_MAX_DEFAULT, OVERLAY_BYTES_MAX_DEFAULT, PROFILE_HALF_LIFE_MS_DEFAULT,
};
pub use db::{ApplyOutcome, DecodedBatch, EngineStats, InboxListener, ItemState, TidalDb};
pub use error::Error;
#[doc(hidden)]
pub use flusher::{DurableGate, FlushHold, FlushStage, GateWait};
pub use flusher::{FlushStats, FLUSH_DURATION_BUCKETS_MS};
pub use idempotency::{IdempotencyRecord, PRUNE_PER_APPLY_MAX};
pub use inboxes::{Availability, InboxMeta, InboxOutcome, Receipt, StoredMessage, TopicInfo, TopicMeta};
pub use negatives::{Actor, NegativesState, NEGATIVES_PER_USER_MAX};
pub use raft_store::{RaftStep, RaftStore, RaftStoreFaults, RaftWrite};
pub use ranked::{Ranked, RankedEntry, RANKED_LIMIT_MAX};
pub use record::{
    decode_payload, encode_payload, records_fingerprint, ControlRecord, EncodedPayload, Envelope,
    InboxConsume, InboxSend, PublishEvent, ReceiveLimits, Records, SendLimits, SignalEvent, StreamControl,
    INBOX_NAME_BYTES_MAX,
};
pub use record_error::RecordError;
pub use snapshot::{SnapshotError, SnapshotInfo};
pub use streams::{StoredEvent, StreamInfo, StreamMeta, STREAM_NAME_BYTES_MAX};
pub use trend::Trend;
