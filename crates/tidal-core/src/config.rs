//! Engine configuration: [`EngineConfig`].
//!
//! Delicate: every field except `node_actor` and the overlay bounds shapes the log-derived state
//! (decay, pruning), so all nodes of a cluster MUST run with equal values, or their digests and feeds
//! diverge. The overlay bounds only decide when applied state is flushed to fjall; nodes may differ. `dimension` is
//! persisted on first open and checked on every later open; the others are the operator's job.

use crate::error::Error;

/// Largest embedding dimension: bounds every vector the engine allocates and keeps one embedding
/// (16 KiB at f32) far below any batch limit.
pub const DIMENSION_MAX: u32 = 4096;
/// Default embedding dimension.
pub const DIMENSION_DEFAULT: u32 = 128;
/// Default trending half-life: 6 hours.
pub const HALF_LIFE_MS_DEFAULT: u64 = 6 * 60 * 60 * 1000;
/// Default profile half-life: 7 days.
pub const PROFILE_HALF_LIFE_MS_DEFAULT: u64 = 7 * 24 * 60 * 60 * 1000;
/// Default idempotency window: 24 hours.
pub const IDEMPOTENCY_WINDOW_MS_DEFAULT: u64 = 24 * 60 * 60 * 1000;
/// Default bound on idempotency keys kept per principal.
pub const IDEMPOTENCY_KEYS_MAX_DEFAULT: usize = 100_000;
/// Default bound on the write-back overlay's estimated size: 64 MiB keeps the memory of dirty state
/// and of one flush's fjall batch modest, and a flush rare enough (tens of thousands of signal
/// batches) that its per-key cost is spread over many applies.
pub const OVERLAY_BYTES_MAX_DEFAULT: usize = 64 * 1024 * 1024;
/// Default of [`EngineConfig::flush_ingest_bytes_min`]: a flush this large would cost a crashed
/// node's open tens of milliseconds in fjall's journal; a smaller one costs less as a batch than an
/// ingestion's fsyncs (about six per keyspace).
pub const FLUSH_INGEST_BYTES_MIN_DEFAULT: usize = 1024 * 1024;
/// Default bound on applies held in the overlay: bounds the WAL replay after a crash (replay
/// re-folds at most twice this many batches past fjall's applied seqno: the overlay being flushed
/// and the active one) even when batches are tiny. A startup replay does not count it (only the
/// bytes bound): a crash during it, or after it before the next flush, replays that replay again
/// plus the writes since, no more.
pub const OVERLAY_BATCHES_MAX_DEFAULT: usize = 100_000;
/// Default number of lists of the approximate feed index (decisions/067): at a million items a
/// list holds about a thousand rows, so a query of [`ANN_PROBES_DEFAULT`] lists reads about 6% of
/// the catalogue (8-bit copies), and the centroids cost 512 KiB at 128 dimensions.
pub const ANN_LISTS_DEFAULT: usize = 1024;
/// Most lists: bounds the centroids' memory (64 MiB at the largest dimension) and the per-write
/// cost of finding a vector's list (one dot product per list).
pub const ANN_LISTS_MAX: usize = 4096;
/// Default catalogue size at which the centroids are chosen: sixteen embeddings per list is a
/// sample that covers the catalogue's regions, and choosing them (one dot product per row and list)
/// pauses that one apply for about a quarter of a second at the default lists.
pub const ANN_CENTROIDS_AT_DEFAULT: usize = 16 * ANN_LISTS_DEFAULT;
/// Default catalogue size from which feeds and similar items use the approximate index: below it
/// the exact scan answers within a few ms (p99 6.5 ms at 100k x 128).
pub const ANN_THRESHOLD_DEFAULT: usize = 100_000;
/// Default lists a query reads at least (more while fewer than `limit` candidates survive the
/// exclusions): at 1M x 128 clustered embeddings, 32 lists gave recall@20 0.941 and 64 gave 0.955
/// at p50 2.8 ms (`docs/measurements.md`).
pub const ANN_PROBES_DEFAULT: usize = 64;

/// How the engine folds and ranks.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    /// Embedding dimension, fixed per database: persisted on first open, a mismatch on reopen is an error.
    pub dimension: u32,
    /// Trending decay half-life (ms), > 0.
    pub half_life_ms: u64,
    /// Profile decay half-life (ms), > 0.
    pub profile_half_life_ms: u64,
    /// Weight `a` of the cosine similarity in the feed score.
    pub similarity_weight: f64,
    /// Weight `b` of the trending term in the feed score.
    pub trending_weight: f64,
    /// How long (logged time) an idempotency key is remembered.
    pub idempotency_window_ms: u64,
    /// Most idempotency keys remembered per principal (>= 1); the oldest go first.
    pub idempotency_keys_max: usize,
    /// `(node id, incarnation)`: this node's actor in the hard negatives CRDT. The incarnation must
    /// change whenever the node starts on a wiped data dir, so a dot is never reused.
    pub node_actor: (u64, u64),
    /// Flush the write-back overlay to fjall once its estimated size exceeds this (>= 1). Not
    /// log-derived: it changes when state reaches fjall, never what the state is.
    pub overlay_bytes_max: usize,
    /// Flush the write-back overlay to fjall once it holds this many applies (>= 1; 1 flushes every
    /// apply, in the background: fjall trails the applied frontier by at most two applies).
    pub overlay_batches_max: usize,
    /// A flush of at least this many bytes (keys and values) reaches fjall by ingestion, behind an
    /// intent file; a smaller one as one fjall write batch (decisions/072). Not log-derived.
    pub flush_ingest_bytes_min: usize,
    /// Lists of the approximate feed index (decisions/067); 0: no approximate index, every query
    /// scans. Log-shaping: the centroids are log-derived state.
    pub ann_lists: usize,
    /// Embeddings at which the centroids are chosen (>= `ann_lists`). Log-shaping.
    pub ann_centroids_at: usize,
    /// Embeddings from which feeds and similar items use the approximate index (a request may still
    /// ask for the exact scan). Equal on every node, or their answers differ.
    pub ann_threshold: usize,
    /// Lists a query scores at least (>= 1). Equal on every node, or their answers differ.
    pub ann_probes: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            dimension: DIMENSION_DEFAULT,
            half_life_ms: HALF_LIFE_MS_DEFAULT,
            profile_half_life_ms: PROFILE_HALF_LIFE_MS_DEFAULT,
            similarity_weight: 1.0,
            trending_weight: 0.1,
            idempotency_window_ms: IDEMPOTENCY_WINDOW_MS_DEFAULT,
            idempotency_keys_max: IDEMPOTENCY_KEYS_MAX_DEFAULT,
            node_actor: (0, 0),
            overlay_bytes_max: OVERLAY_BYTES_MAX_DEFAULT,
            overlay_batches_max: OVERLAY_BATCHES_MAX_DEFAULT,
            flush_ingest_bytes_min: FLUSH_INGEST_BYTES_MIN_DEFAULT,
            ann_lists: ANN_LISTS_DEFAULT,
            ann_centroids_at: ANN_CENTROIDS_AT_DEFAULT,
            ann_threshold: ANN_THRESHOLD_DEFAULT,
            ann_probes: ANN_PROBES_DEFAULT,
        }
    }
}

impl EngineConfig {
    /// The defaults with another dimension.
    pub fn with_dimension(dimension: u32) -> Self {
        EngineConfig { dimension, ..EngineConfig::default() }
    }

    /// Checks every field's domain.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |reason: String| Err(Error::Config { reason });
        if self.dimension == 0 || self.dimension > DIMENSION_MAX {
            return bad(format!("dimension {} outside 1..={DIMENSION_MAX}", self.dimension));
        }
        if self.half_life_ms == 0 || self.profile_half_life_ms == 0 {
            return bad("half-lives must be > 0".into());
        }
        if !self.similarity_weight.is_finite() || !self.trending_weight.is_finite() {
            return bad("score weights must be finite".into());
        }
        if self.idempotency_keys_max == 0 {
            return bad("idempotency_keys_max must be >= 1".into());
        }
        if self.overlay_bytes_max == 0 || self.overlay_batches_max == 0 {
            return bad("overlay bounds must be >= 1".into());
        }
        if self.ann_lists > ANN_LISTS_MAX {
            return bad(format!("ann_lists {} above {ANN_LISTS_MAX}", self.ann_lists));
        }
        if self.ann_lists > 0 && (self.ann_centroids_at < self.ann_lists || self.ann_probes == 0) {
            return bad(format!(
                "ann_centroids_at {} must be >= ann_lists {} and ann_probes {} >= 1",
                self.ann_centroids_at, self.ann_lists, self.ann_probes
            ));
        }
        Ok(())
    }
}
