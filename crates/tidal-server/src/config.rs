//! Serve configuration: command line, environment and a TOML file, merged in that order of precedence.
//!
//! Every knob has a default that works on a laptop; the file lets operators keep them in one place.
//! Unknown keys in the file are an error, so a typo is never silently ignored.

use anyhow::Context;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use tidal_cluster::ship_feed::{TAIL_BATCHES_MAX_DEFAULT, TAIL_BYTES_MAX_DEFAULT};

/// Default signal kinds and weights. Weights are resolved at the API and logged, so changing them
/// later never changes how existing log entries fold.
pub const DEFAULT_SIGNAL_KINDS: [(&str, f64); 6] =
    [("view", 0.2), ("click", 1.0), ("like", 2.0), ("share", 3.0), ("purchase", 5.0), ("skip", -0.5)];

/// Default of `checkpoint_engine_bytes_max`. A crashed node's open inserts the journal entries no
/// table holds again at about 15-30 MB/s for our small entries (experiments/034), and skips the
/// others at about 40 MB/s: 16 MiB keeps the inserted part under about a second. It does not bound
/// the journal file itself, which fjall rotates only past 64 MB (docs/measurements.md, issue 43).
pub const CHECKPOINT_ENGINE_BYTES_MAX_DEFAULT: u64 = 16 * 1024 * 1024;
/// Default of `engine_flush_ingest_bytes_min`.
const FLUSH_INGEST_MIN: usize = tidal_core::FLUSH_INGEST_BYTES_MIN_DEFAULT;
/// Default of `checkpoint_wal_bytes_max`: a startup replays the WAL at 80-100 MB/s here, so the
/// WAL past an fsynced checkpoint stays under a second of replay.
pub const CHECKPOINT_WAL_BYTES_MAX_DEFAULT: u64 = 64 * 1024 * 1024;
/// The least either checkpoint byte bound may be: below it the checkpointer would run on every
/// tick of a busy node and write tables of a few entries.
pub const CHECKPOINT_BYTES_MIN: u64 = 64 * 1024;

/// Nice levels the engine's background threads run below the node's request path once it serves:
/// at 10 the scheduler weighs them about a tenth of a request thread; at 5 the ack's p99 at 50
/// clients did not move (docs/measurements.md, 2026-12-07 10:11 UTC).
pub const ENGINE_BACKGROUND_NICE_DEFAULT: i32 = 10;

/// Bytes the ranking index takes per embedding and dimension, for [`embeddings_max_default`]: 4 of
/// the f32 row and 1 of the approximate index's 8-bit copy, doubled for what growing vectors
/// allocate ahead, plus the per-item fields (ids, norm, row map, list entry) folded in. Measured:
/// 879 bytes per item at 128 dimensions by allocation sizes (`docs/measurements.md`).
pub const EMBEDDING_BYTES_PER_DIMENSION: u64 = 10;

/// The default `embeddings_max`: a quarter of the machine's memory at
/// [`EMBEDDING_BYTES_PER_DIMENSION`] bytes per dimension (about 1,280 bytes per embedding of 128
/// dimensions: 5M of them on 24 GiB, or 10M of 64 dimensions), leaving the rest to fjall, the WAL
/// buffers and the OS. At least 1,000.
pub fn embeddings_max_default(memory_bytes: u64, dimension: u32) -> u64 {
    let per_embedding = EMBEDDING_BYTES_PER_DIMENSION * u64::from(dimension.max(1));
    (memory_bytes / 4 / per_embedding).max(1_000)
}

/// The machine's memory (`MemTotal` of `/proc/meminfo`); 16 GiB where it cannot be read.
fn machine_memory_bytes() -> u64 {
    const UNKNOWN: u64 = 16 << 30;
    let Ok(text) = std::fs::read_to_string("/proc/meminfo") else {
        return UNKNOWN;
    };
    let kib = text
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
    kib.map_or(UNKNOWN, |kib| kib * 1024)
}

/// The `tidal serve` options that may also come from the config file or the environment.
#[derive(Debug, Default, Clone, clap::Args)]
pub struct ServeArgs {
    /// Data directory (WAL and state).
    #[arg(long, env = "TIDAL_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// HTTP listen address.
    #[arg(long, env = "TIDAL_HTTP")]
    pub http: Option<SocketAddr>,
    /// TOML config file (command line and environment override it).
    #[arg(long, env = "TIDAL_CONFIG")]
    pub config: Option<PathBuf>,
    /// Token file (TOML: [[token]] name, token, scopes).
    #[arg(long, env = "TIDAL_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Allow a non-loopback bind without tokens or without TLS.
    #[arg(long)]
    pub insecure: bool,
    /// TLS certificate chain (PEM) for the HTTP and RPC ports; with `--tls-key`.
    #[arg(long, env = "TIDAL_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM), mode 0600.
    #[arg(long, env = "TIDAL_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// The cluster CA (PEM) that verifies peers' certificates.
    #[arg(long, env = "TIDAL_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Mutual TLS between peers: the RPC port requires a certificate of the cluster CA naming a
    /// node (`node-<id>`), and this node presents its own when it dials one.
    #[arg(long, env = "TIDAL_TLS_PEER_AUTH")]
    pub tls_peer_auth: bool,
    /// Embedding dimension (fixed per database).
    #[arg(long, env = "TIDAL_DIMENSION")]
    pub dimension: Option<u32>,
    /// Cluster file (TOML shared by every node); with it this node serves as one member.
    #[arg(long, env = "TIDAL_CLUSTER", requires = "node_id")]
    pub cluster: Option<PathBuf>,
    /// This node's id in the cluster file.
    #[arg(long, env = "TIDAL_NODE_ID")]
    pub node_id: Option<u64>,
    /// Override the cluster file's durability: `quorum` (acknowledge once a majority fsynced) or
    /// `leader` (after the leader's fsync; a failover can lose acknowledged writes). Every member
    /// must use the same mode.
    #[arg(long, env = "TIDAL_DURABILITY")]
    pub durability: Option<String>,
    /// Dial override `ID=HOST:PORT` (repeatable; env `TIDAL_DIAL="2=10.0.0.2:7170,3=..."`): reach
    /// member ID's RPC server at this address instead of the cluster file's `rpc`. Only this node
    /// uses it (a relay, NAT, its own view of the network); the others still see the file's address.
    #[arg(long = "dial", env = "TIDAL_DIAL", value_delimiter = ',', value_name = "ID=HOST:PORT")]
    pub dial: Vec<String>,
    /// Join a running cluster: with an empty data directory, wait to be added (`tidal members add`
    /// on the leader) instead of writing the cluster file's membership as the first control entry.
    /// Needed for every node started after the cluster was created.
    #[arg(long, env = "TIDAL_JOIN")]
    pub join: bool,
}

/// Parses `--dial` values (`ID=HOST:PORT`) into overrides.
fn parse_dial(values: &[String]) -> anyhow::Result<BTreeMap<tidal_types::NodeId, String>> {
    let mut dial = BTreeMap::new();
    for value in values.iter().map(|value| value.trim()).filter(|value| !value.is_empty()) {
        let (id, address) =
            value.split_once('=').with_context(|| format!("--dial {value:?}: expected ID=HOST:PORT"))?;
        let id: u64 = id.trim().parse().with_context(|| format!("--dial {value:?}: node id"))?;
        let address = address.trim();
        anyhow::ensure!(
            address
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok()),
            "--dial {value:?}: expected ID=HOST:PORT"
        );
        let previous = dial.insert(tidal_types::NodeId(id), address.to_string());
        anyhow::ensure!(previous.is_none(), "--dial names node {id} twice");
    }
    Ok(dial)
}

/// The cluster file: `cluster_id`, `secret_file`, `durability`, and `[[node]]` tables.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClusterFile {
    cluster_id: String,
    secret_file: PathBuf,
    #[serde(default = "default_durability")]
    durability: String,
    /// openraft heartbeat interval (ms).
    heartbeat_ms: Option<u64>,
    /// Election timeout, lower bound (ms).
    election_timeout_min_ms: Option<u64>,
    /// Election timeout, upper bound (ms).
    election_timeout_max_ms: Option<u64>,
    node: Vec<ClusterFileNode>,
}

/// Signal kind names are 1..=64 bytes and their weights finite and within the bound the API puts on
/// a signal's own weight ([`tidal_types::SIGNAL_WEIGHT_MAX`]): a kind's weight is what a signal
/// without one folds.
fn check_signal_kinds(signal_kinds: &BTreeMap<String, f64>) -> anyhow::Result<()> {
    for (name, weight) in signal_kinds {
        anyhow::ensure!(
            !name.is_empty() && name.len() <= 64,
            "signal kind name {name:?} must be 1..=64 bytes"
        );
        anyhow::ensure!(weight.is_finite(), "signal kind {name} has a non-finite weight");
        anyhow::ensure!(
            weight.abs() <= tidal_types::SIGNAL_WEIGHT_MAX,
            "signal kind {name} has a weight outside -1e6..=1e6"
        );
    }
    Ok(())
}

fn default_durability() -> String {
    "quorum".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClusterFileNode {
    id: u64,
    http: String,
    rpc: String,
}

/// A node's place in a cluster.
#[derive(Debug, Clone)]
pub struct ClusterMembership {
    /// The cluster.
    pub spec: tidal_cluster::ClusterSpec,
    /// This node.
    pub me: tidal_types::NodeId,
    /// Election and heartbeat timing.
    pub timing: tidal_cluster::ControlTiming,
    /// Join a running cluster (`--join`): never write the cluster file's membership as the first
    /// control entry.
    pub join: bool,
}

/// The durability a cluster file or `--durability` names: `quorum` or `leader`.
pub fn parse_durability(mode: &str) -> anyhow::Result<tidal_cluster::Durability> {
    match mode {
        "quorum" => Ok(tidal_cluster::Durability::Quorum),
        "leader" => Ok(tidal_cluster::Durability::Leader),
        other => anyhow::bail!("durability must be \"quorum\" or \"leader\", got {other:?}"),
    }
}

/// Reads a cluster file; a relative `secret_file` is relative to the cluster file.
pub fn load_cluster(path: &Path, node_id: u64) -> anyhow::Result<ClusterMembership> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("read cluster file {}", path.display()))?;
    let file: ClusterFile =
        toml::from_str(&text).with_context(|| format!("parse cluster file {}", path.display()))?;
    let secret_path = path.parent().unwrap_or(Path::new(".")).join(&file.secret_file);
    // Refused if group or others may read it, as a token file is.
    let secret = crate::auth::read_private_file(&secret_path, "cluster secret file")?.trim().to_string();
    let durability = parse_durability(&file.durability)?;
    let defaults = tidal_cluster::ControlTiming::default();
    let ms = |value: Option<u64>, default: std::time::Duration| {
        value.map_or(default, std::time::Duration::from_millis)
    };
    let timing = tidal_cluster::ControlTiming {
        heartbeat: ms(file.heartbeat_ms, defaults.heartbeat),
        election_min: ms(file.election_timeout_min_ms, defaults.election_min),
        election_max: ms(file.election_timeout_max_ms, defaults.election_max),
    };
    anyhow::ensure!(
        timing.heartbeat < timing.election_min && timing.election_min < timing.election_max,
        "cluster file {}: need heartbeat_ms < election_timeout_min_ms < election_timeout_max_ms",
        path.display()
    );
    let spec = tidal_cluster::ClusterSpec {
        cluster_id: file.cluster_id,
        secret,
        durability,
        nodes: file
            .node
            .into_iter()
            .map(|n| tidal_cluster::NodeSpec { id: tidal_types::NodeId(n.id), http: n.http, rpc: n.rpc })
            .collect(),
        dial: BTreeMap::new(),
    };
    spec.validate().map_err(|why| anyhow::anyhow!("cluster file {}: {why}", path.display()))?;
    let me = tidal_types::NodeId(node_id);
    anyhow::ensure!(spec.node(me).is_some(), "node id {node_id} is not in cluster file {}", path.display());
    Ok(ClusterMembership { spec, me, timing, join: false })
}

/// Where a cluster member's HTTP server listens: its own `http` address in the cluster file when
/// that is an IP address and port, as on machines with fixed addresses. A host name there (a
/// Kubernetes pod's stable DNS name, a compose service name: the address peers and clients use,
/// while the IP behind it changes) cannot be bound, so `listen` (`--http`) must then say where.
fn member_http_listen(
    cluster: Option<&ClusterMembership>,
    listen: Option<SocketAddr>,
) -> anyhow::Result<Option<SocketAddr>> {
    let Some(membership) = cluster else { return Ok(None) };
    let node = membership.spec.node(membership.me).expect("load_cluster checked the id");
    if let Ok(address) = node.http.parse::<SocketAddr>() {
        return Ok(Some(address));
    }
    anyhow::ensure!(
        node.http
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok()),
        "http address {:?} of node {} in the cluster file: expected HOST:PORT",
        node.http,
        membership.me
    );
    anyhow::ensure!(
        listen.is_some(),
        "the cluster file names node {}'s http address by host name ({:?}): give the address to listen \
         on with --http (for example 0.0.0.0:{})",
        membership.me,
        node.http,
        node.http.rsplit_once(':').map_or("7070", |(_, port)| port)
    );
    Ok(listen)
}

/// The config file. Every field optional; the command line wins.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    data_dir: Option<PathBuf>,
    http: Option<SocketAddr>,
    token_file: Option<PathBuf>,
    insecure: Option<bool>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    tls_ca: Option<PathBuf>,
    tls_peer_auth: Option<bool>,
    http_connections_max: Option<usize>,
    rpc_connections_max: Option<usize>,
    idle_timeout_ms: Option<u64>,
    body_timeout_ms: Option<u64>,
    inflight_body_bytes_max: Option<usize>,
    dimension: Option<u32>,
    half_life_ms: Option<u64>,
    profile_half_life_ms: Option<u64>,
    similarity_weight: Option<f64>,
    trending_weight: Option<f64>,
    body_bytes_max: Option<usize>,
    signals_per_request_max: Option<usize>,
    stream_event_bytes_max: Option<usize>,
    stream_events_per_request_max: Option<usize>,
    stream_subscribers_max: Option<usize>,
    stream_retention_events_max: Option<u64>,
    stream_retention_age_s: Option<u64>,
    stream_retention_interval_ms: Option<u64>,
    inbox_payload_bytes_max: Option<u32>,
    inbox_backlog_max: Option<u32>,
    inbox_topics_max: Option<u32>,
    inbox_dedupe_max: Option<u32>,
    inbox_dedupe_age_s: Option<u32>,
    inbox_receipts_max: Option<u32>,
    inbox_receipt_age_s: Option<u32>,
    inbox_ttl_s: Option<u32>,
    inbox_topic_ttl_s: Option<BTreeMap<String, u32>>,
    segment_bytes_max: Option<u64>,
    write_inflight_bytes_max: Option<usize>,
    wal_retention_bytes: Option<u64>,
    read_wait_ms_max: Option<u64>,
    fatal_exit_grace_ms: Option<u64>,
    checkpoint_interval_ms: Option<u64>,
    checkpoint_engine_bytes_max: Option<u64>,
    checkpoint_wal_bytes_max: Option<u64>,
    engine_overlay_bytes_max: Option<usize>,
    engine_background_nice: Option<i32>,
    engine_flush_ingest_bytes_min: Option<usize>,
    ship_tail_bytes_max: Option<usize>,
    ship_tail_batches_max: Option<usize>,
    feed_ann_lists: Option<usize>,
    feed_ann_centroids_at: Option<usize>,
    feed_ann_threshold: Option<usize>,
    feed_ann_probes: Option<usize>,
    embeddings_max: Option<u64>,
    signal_kinds: Option<BTreeMap<String, f64>>,
}

/// The resolved configuration of a node.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Data directory.
    pub data_dir: PathBuf,
    /// HTTP listen address.
    pub http: SocketAddr,
    /// Token file, if any.
    pub token_file: Option<PathBuf>,
    /// Allow a non-loopback bind without tokens or TLS.
    pub insecure: bool,
    /// Connection bounds and TLS of both ports.
    pub net: crate::transport::NetConfig,
    /// Embedding dimension.
    pub dimension: u32,
    /// Trending half-life.
    pub half_life_ms: u64,
    /// Profile half-life.
    pub profile_half_life_ms: u64,
    /// Feed weight of similarity.
    pub similarity_weight: f64,
    /// Feed weight of trending.
    pub trending_weight: f64,
    /// Largest accepted request body.
    pub body_bytes_max: usize,
    /// Most signals in one POST (one batch).
    pub signals_per_request_max: usize,
    /// Largest stream event payload (compact JSON bytes).
    pub stream_event_bytes_max: usize,
    /// Most events in one publish (one batch).
    pub stream_events_per_request_max: usize,
    /// Most live stream subscriptions (SSE) a node serves at once.
    pub stream_subscribers_max: usize,
    /// Retention: the leader trims every stream to at most this many events (None: off).
    pub stream_retention_events_max: Option<u64>,
    /// Retention: the leader trims events older than this many seconds (None: off).
    pub stream_retention_age_s: Option<u64>,
    /// How often the leader applies the retention bounds.
    pub stream_retention_interval_ms: u64,
    /// The inbox limits (each leader writes them into its inbox records).
    pub inbox: InboxConfig,
    /// WAL segment size.
    pub segment_bytes_max: u64,
    /// Bytes of each WAL segment written with zeros before use (capped at the segment size; 0: off).
    /// `TIDAL_WAL_PREALLOCATE=0` turns it off; tests set a small value (decisions/017).
    pub wal_preallocate_bytes: u64,
    /// Bound on payload bytes submitted and not yet acknowledged; writers wait beyond it.
    pub write_inflight_bytes_max: usize,
    /// WAL bytes kept below the checkpoint before whole segments are purged.
    pub wal_retention_bytes: u64,
    /// Longest a read with `min_seqno` waits.
    pub read_wait_ms_max: u64,
    /// How often the engine state is checkpointed (fsynced) so the WAL can be purged.
    pub checkpoint_interval_ms: u64,
    /// Bytes in the engine's fjall memtables (in fjall's journal, not yet in its tables) past which
    /// the checkpointer runs at once and writes the memtables into tables: a crashed node's open
    /// inserts these entries again one by one (issue 43).
    pub checkpoint_engine_bytes_max: u64,
    /// WAL bytes written since the last checkpoint past which the checkpointer runs at once: what
    /// an open after a power loss may replay past the engine's fsynced state (issue 43).
    pub checkpoint_wal_bytes_max: u64,
    /// After a fatal storage fault (decisions/059) the node, out of office at once, keeps answering
    /// `/healthz` and `/readyz` (503, with the reason) this long, then stops and exits non-zero.
    pub fatal_exit_grace_ms: u64,
    /// Whether a graceful stop of the serving leader hands its office to another voter first
    /// (decisions/066). Always on for `tidal serve`; tests that model a leader that vanishes (a
    /// crash) by stopping it turn it off.
    pub handoff_on_stop: bool,
    /// Engine write-back overlay bound (decisions/003): larger = fewer, longer flushes.
    pub engine_overlay_bytes_max: usize,
    /// Nice levels the engine's background threads (the flusher, fjall's flushes and compactions)
    /// run below the rest of the node once it serves (`tidal_core::priority`); 0 leaves them be.
    pub engine_background_nice: i32,
    /// Engine flushes of at least this many bytes reach fjall by ingestion behind an intent file,
    /// smaller ones as one write batch (decisions/072).
    pub engine_flush_ingest_bytes_min: usize,
    /// A leader's in-memory tail of recent batches, which its ShipQueues ship from: its bounds in
    /// bytes and in batches (the oldest fall off). A follower that needs what the tail no longer
    /// holds pulls it from the leader's WAL segments.
    pub ship_tail_bytes_max: usize,
    /// See `ship_tail_bytes_max`.
    pub ship_tail_batches_max: usize,
    /// The approximate feed index (decisions/067): lists (0: off), the catalogue size at which its
    /// centroids are chosen, the size from which feeds and similar items use it, and the lists a
    /// query scores at least. Every node of a cluster must use the same values.
    pub feed_ann: FeedAnnConfig,
    /// Items with an embedding past which a new embedding is refused (507 `index_full`): the
    /// ranking index holds every embedding in memory. Default: a quarter of the machine's memory
    /// at [`EMBEDDING_BYTES_PER_DIMENSION`] bytes per dimension ([`embeddings_max_default`]).
    pub embeddings_max: u64,
    /// Signal kinds and their default weights.
    pub signal_kinds: BTreeMap<String, f64>,
    /// Cluster membership, when serving as a cluster member.
    pub cluster: Option<ClusterMembership>,
    /// What the node's disk and network I/O goes through (the OS unless a harness says otherwise).
    pub io: NodeIo,
}

/// [`ServeConfig::feed_ann`]: the `feed_ann_*` settings of the config file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeedAnnConfig {
    /// Lists (`feed_ann_lists`); 0 turns the approximate index off.
    pub lists: usize,
    /// Embeddings at which the centroids are chosen (`feed_ann_centroids_at`).
    pub centroids_at: usize,
    /// Embeddings from which queries use it (`feed_ann_threshold`).
    pub threshold: usize,
    /// Lists a query scores at least (`feed_ann_probes`).
    pub probes: usize,
}

impl FeedAnnConfig {
    /// The `feed_ann_*` settings of the file, or their defaults.
    fn from_file(file: &FileConfig) -> FeedAnnConfig {
        FeedAnnConfig {
            lists: file.feed_ann_lists.unwrap_or(tidal_core::ANN_LISTS_DEFAULT),
            centroids_at: file.feed_ann_centroids_at.unwrap_or(tidal_core::ANN_CENTROIDS_AT_DEFAULT),
            threshold: file.feed_ann_threshold.unwrap_or(tidal_core::ANN_THRESHOLD_DEFAULT),
            probes: file.feed_ann_probes.unwrap_or(tidal_core::ANN_PROBES_DEFAULT),
        }
    }
}

impl Default for FeedAnnConfig {
    fn default() -> Self {
        FeedAnnConfig {
            lists: tidal_core::ANN_LISTS_DEFAULT,
            centroids_at: tidal_core::ANN_CENTROIDS_AT_DEFAULT,
            threshold: tidal_core::ANN_THRESHOLD_DEFAULT,
            probes: tidal_core::ANN_PROBES_DEFAULT,
        }
    }
}

/// The seams through which a node reaches its disk, clock and peers. Production uses
/// [`NodeIo::default`] (real files, the system clock, the OS's TCP); the simulation (chaos/sim)
/// hands in an in-memory fault-injecting WAL file system, a simulated clock and its simulated
/// network, so the same node code runs there.
#[derive(Clone)]
pub struct NodeIo {
    /// The WAL's file I/O.
    pub wal_files: std::sync::Arc<dyn tidal_wal::FileIo>,
    /// Where the WAL writer reads the logged time.
    pub wal_clock: std::sync::Arc<dyn tidal_wal::Clock>,
    /// How replication and control-plane RPCs reach peers.
    pub connector: tidal_net::Connector,
    /// Whether a follower forwards writes to the leader (over the OS's HTTP client). The simulation
    /// turns it off: its network has no OS sockets, and a follower then answers 503 `not_ready`.
    pub forward_writes: bool,
    /// A test probe in the applier (chaos/sim's `apply` crash points); `None` in production.
    pub apply_probe: Option<std::sync::Arc<dyn tidal_cluster::ApplyProbe>>,
    /// Held until the node's engine is closed (chaos/sim waits on its receiver after a crash, so
    /// a restart never finds the old instance's data dir still open); `None` in production.
    pub close_watch: Option<std::sync::mpsc::Sender<()>>,
    /// Faults injected into the control plane's store (a failed vote fsync, say), as `wal_files`
    /// injects the WAL's; `None` in production.
    pub raft_faults: Option<std::sync::Arc<dyn tidal_core::RaftStoreFaults>>,
    /// A probe every inbox receive awaits at its steps (tests of the lost-wakeup interleavings);
    /// `None` in production.
    pub receive_probe: Option<crate::http::inboxes::ReceiveProbe>,
}

impl Default for NodeIo {
    fn default() -> NodeIo {
        NodeIo {
            wal_files: std::sync::Arc::new(tidal_wal::StdIo),
            wal_clock: std::sync::Arc::new(tidal_wal::SystemClock),
            connector: tidal_net::Connector::tcp(),
            forward_writes: true,
            apply_probe: None,
            close_watch: None,
            raft_faults: None,
            receive_probe: None,
        }
    }
}

impl std::fmt::Debug for NodeIo {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("NodeIo").field("connector", &self.connector).finish_non_exhaustive()
    }
}

impl ServeConfig {
    /// Resolves the configuration: command line (and environment) over file over defaults.
    pub fn resolve(args: &ServeArgs) -> anyhow::Result<ServeConfig> {
        let file = match &args.config {
            Some(path) => load_file(path)?,
            None => FileConfig::default(),
        };
        let inbox = InboxConfig::from_file(&file);
        let feed_ann = FeedAnnConfig::from_file(&file);
        let net = net_config(args, &file)?;
        let signal_kinds = file.signal_kinds.unwrap_or_else(|| {
            DEFAULT_SIGNAL_KINDS.iter().map(|(name, weight)| (name.to_string(), *weight)).collect()
        });
        check_signal_kinds(&signal_kinds)?;
        let cluster = match (&args.cluster, args.node_id) {
            (Some(path), Some(id)) => {
                let mut membership = load_cluster(path, id)?;
                if let Some(mode) = &args.durability {
                    membership.spec.durability = parse_durability(mode)?;
                }
                membership.spec.dial = parse_dial(&args.dial)?;
                membership.join = args.join;
                membership.spec.validate().map_err(|why| anyhow::anyhow!("--dial: {why}"))?;
                Some(membership)
            }
            (Some(_), None) => anyhow::bail!("--cluster needs --node-id"),
            _ => None,
        };
        anyhow::ensure!(
            cluster.is_some() || args.dial.iter().all(|value| value.trim().is_empty()),
            "--dial only applies to a cluster member (--cluster)"
        );
        anyhow::ensure!(
            cluster.is_some() || !args.join,
            "--join only applies to a cluster member (--cluster)"
        );
        let data_dir = args.data_dir.clone().or(file.data_dir);
        anyhow::ensure!(
            cluster.is_none() || data_dir.is_some(),
            "a cluster member needs its own --data-dir (nodes must never share one)"
        );
        let cluster_http = member_http_listen(cluster.as_ref(), args.http.or(file.http))?;
        let dimension = args.dimension.or(file.dimension).unwrap_or(128);
        let config = ServeConfig {
            data_dir: data_dir.unwrap_or_else(|| PathBuf::from("./tidal-data")),
            http: cluster_http
                .or(args.http)
                .or(file.http)
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 7070))),
            token_file: args.token_file.clone().or(file.token_file),
            insecure: args.insecure || file.insecure.unwrap_or(false),
            net,
            dimension,
            half_life_ms: file.half_life_ms.unwrap_or(6 * 3600 * 1000),
            profile_half_life_ms: file.profile_half_life_ms.unwrap_or(7 * 24 * 3600 * 1000),
            similarity_weight: file.similarity_weight.unwrap_or(1.0),
            trending_weight: file.trending_weight.unwrap_or(0.1),
            body_bytes_max: file.body_bytes_max.unwrap_or(16 * 1024 * 1024),
            signals_per_request_max: file.signals_per_request_max.unwrap_or(10_000),
            stream_event_bytes_max: file.stream_event_bytes_max.unwrap_or(1024 * 1024),
            stream_events_per_request_max: file.stream_events_per_request_max.unwrap_or(1_000),
            stream_subscribers_max: file.stream_subscribers_max.unwrap_or(1_024),
            stream_retention_events_max: file.stream_retention_events_max,
            stream_retention_age_s: file.stream_retention_age_s,
            stream_retention_interval_ms: file.stream_retention_interval_ms.unwrap_or(10_000),
            inbox,
            segment_bytes_max: file.segment_bytes_max.unwrap_or(64 * 1024 * 1024),
            wal_preallocate_bytes: wal_preallocate_bytes(
                std::env::var("TIDAL_WAL_PREALLOCATE").ok().as_deref(),
            )?,
            write_inflight_bytes_max: file.write_inflight_bytes_max.unwrap_or(128 * 1024 * 1024),
            wal_retention_bytes: file.wal_retention_bytes.unwrap_or(1024 * 1024 * 1024),
            read_wait_ms_max: file.read_wait_ms_max.unwrap_or(10_000),
            checkpoint_interval_ms: file.checkpoint_interval_ms.unwrap_or(30_000),
            checkpoint_engine_bytes_max: file
                .checkpoint_engine_bytes_max
                .unwrap_or(CHECKPOINT_ENGINE_BYTES_MAX_DEFAULT),
            checkpoint_wal_bytes_max: file
                .checkpoint_wal_bytes_max
                .unwrap_or(CHECKPOINT_WAL_BYTES_MAX_DEFAULT),
            fatal_exit_grace_ms: file.fatal_exit_grace_ms.unwrap_or(1_000),
            handoff_on_stop: true,
            engine_overlay_bytes_max: file
                .engine_overlay_bytes_max
                .or_else(|| std::env::var("TIDAL_ENGINE_OVERLAY_BYTES_MAX").ok().and_then(|v| v.parse().ok()))
                .unwrap_or(tidal_core::OVERLAY_BYTES_MAX_DEFAULT),
            engine_background_nice: file.engine_background_nice.unwrap_or(ENGINE_BACKGROUND_NICE_DEFAULT),
            engine_flush_ingest_bytes_min: file.engine_flush_ingest_bytes_min.unwrap_or(FLUSH_INGEST_MIN),
            ship_tail_bytes_max: file.ship_tail_bytes_max.unwrap_or(TAIL_BYTES_MAX_DEFAULT),
            ship_tail_batches_max: file.ship_tail_batches_max.unwrap_or(TAIL_BATCHES_MAX_DEFAULT),
            embeddings_max: file
                .embeddings_max
                .unwrap_or_else(|| embeddings_max_default(machine_memory_bytes(), dimension)),
            feed_ann,
            signal_kinds,
            cluster,
            io: NodeIo::default(),
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            (1..=4096).contains(&self.dimension),
            "dimension must be 1..=4096, got {}",
            self.dimension
        );
        anyhow::ensure!(
            self.half_life_ms > 0 && self.profile_half_life_ms > 0,
            "half-lives must be positive"
        );
        anyhow::ensure!(
            self.similarity_weight.is_finite() && self.trending_weight.is_finite(),
            "feed weights must be finite"
        );
        anyhow::ensure!(self.body_bytes_max >= 1024, "body_bytes_max must be at least 1024");
        let ann = self.feed_ann;
        anyhow::ensure!(
            ann.lists <= tidal_core::ANN_LISTS_MAX,
            "feed_ann_lists must be at most {}, got {}",
            tidal_core::ANN_LISTS_MAX,
            ann.lists
        );
        anyhow::ensure!(
            ann.lists == 0 || (ann.centroids_at >= ann.lists && ann.probes >= 1),
            "feed_ann_centroids_at ({}) must be at least feed_ann_lists ({}), and feed_ann_probes at least 1",
            ann.centroids_at,
            ann.lists
        );
        anyhow::ensure!(
            self.write_inflight_bytes_max >= self.body_bytes_max,
            "write_inflight_bytes_max must hold at least one whole body"
        );
        anyhow::ensure!(
            self.net.inflight_body_bytes_max >= self.body_bytes_max,
            "inflight_body_bytes_max must hold at least one whole body (body_bytes_max)"
        );
        anyhow::ensure!(self.segment_bytes_max >= 4096, "segment_bytes_max must be at least 4096");
        anyhow::ensure!(
            self.checkpoint_engine_bytes_max >= CHECKPOINT_BYTES_MIN
                && self.checkpoint_wal_bytes_max >= CHECKPOINT_BYTES_MIN,
            "checkpoint_engine_bytes_max and checkpoint_wal_bytes_max must be at least {CHECKPOINT_BYTES_MIN}"
        );
        anyhow::ensure!(
            self.stream_event_bytes_max >= 1 && self.stream_events_per_request_max >= 1,
            "stream_event_bytes_max and stream_events_per_request_max must be at least 1"
        );
        anyhow::ensure!(self.stream_subscribers_max >= 1, "stream_subscribers_max must be at least 1");
        anyhow::ensure!(
            (0..=tidal_core::priority::NICE_MAX).contains(&self.engine_background_nice),
            "engine_background_nice must be in 0..={}",
            tidal_core::priority::NICE_MAX
        );
        anyhow::ensure!(
            self.ship_tail_bytes_max >= 1 && self.ship_tail_batches_max >= 1,
            "ship_tail_bytes_max and ship_tail_batches_max must be at least 1"
        );
        self.inbox.validate()?;
        Ok(())
    }
}

/// The connection bounds and TLS: the command line's TLS files win over the config file's.
fn net_config(args: &ServeArgs, file: &FileConfig) -> anyhow::Result<crate::transport::NetConfig> {
    let defaults = crate::transport::NetConfig::default();
    let tls = crate::transport::TlsKeys {
        cert: args.tls_cert.clone().or_else(|| file.tls_cert.clone()),
        key: args.tls_key.clone().or_else(|| file.tls_key.clone()),
        ca: args.tls_ca.clone().or_else(|| file.tls_ca.clone()),
        peer_auth: args.tls_peer_auth || file.tls_peer_auth.unwrap_or(false),
    };
    let net = crate::transport::NetConfig {
        http_connections_max: file.http_connections_max.unwrap_or(defaults.http_connections_max),
        rpc_connections_max: file.rpc_connections_max.unwrap_or(defaults.rpc_connections_max),
        idle_timeout: file.idle_timeout_ms.map_or(defaults.idle_timeout, std::time::Duration::from_millis),
        body_timeout: file.body_timeout_ms.map_or(defaults.body_timeout, std::time::Duration::from_millis),
        inflight_body_bytes_max: file.inflight_body_bytes_max.unwrap_or(defaults.inflight_body_bytes_max),
        tls: tls.resolve()?,
    };
    anyhow::ensure!(
        net.http_connections_max >= 1 && net.rpc_connections_max >= 1,
        "http_connections_max and rpc_connections_max must be at least 1"
    );
    anyhow::ensure!(
        net.idle_timeout >= std::time::Duration::from_millis(100)
            && net.body_timeout >= std::time::Duration::from_millis(100),
        "idle_timeout_ms and body_timeout_ms must be at least 100"
    );
    Ok(net)
}

/// The inbox limits. The leader writes them into every send and receive it logs, so a change takes
/// effect from the records written after it and every node judges a record by the same limits.
#[derive(Debug, Clone)]
pub struct InboxConfig {
    /// Largest message payload (compact JSON bytes); 64 KiB.
    pub payload_bytes_max: u32,
    /// Most unconsumed messages per topic; a send past it is 429 `inbox_full`. 10,000.
    pub backlog_max: u32,
    /// Most topics with unconsumed messages per inbox; a send opening another is 429
    /// `too_many_topics`. 64.
    pub topics_max: u32,
    /// Most (sender, message_id) pairs an inbox remembers for dedupe; 16,384.
    pub dedupe_max: u32,
    /// How long (seconds of logged time) a pair is remembered; one day.
    pub dedupe_age_s: u32,
    /// Most receipts (what each receive_id took) an inbox keeps for retries; 1,024.
    pub receipts_max: u32,
    /// How long (seconds of logged time) a receipt is kept; one hour.
    pub receipt_age_s: u32,
    /// Messages older than this (seconds) are dropped by the leader (None: never).
    pub ttl_s: Option<u32>,
    /// Per-topic TTLs over `ttl_s` (0: never, for that topic).
    pub topic_ttl_s: BTreeMap<String, u32>,
}

impl InboxConfig {
    fn from_file(file: &FileConfig) -> InboxConfig {
        InboxConfig {
            payload_bytes_max: file.inbox_payload_bytes_max.unwrap_or(64 * 1024),
            backlog_max: file.inbox_backlog_max.unwrap_or(10_000),
            topics_max: file.inbox_topics_max.unwrap_or(64),
            dedupe_max: file.inbox_dedupe_max.unwrap_or(16_384),
            dedupe_age_s: file.inbox_dedupe_age_s.unwrap_or(86_400),
            receipts_max: file.inbox_receipts_max.unwrap_or(1_024),
            receipt_age_s: file.inbox_receipt_age_s.unwrap_or(3_600),
            ttl_s: file.inbox_ttl_s,
            topic_ttl_s: file.inbox_topic_ttl_s.clone().unwrap_or_default(),
        }
    }

    fn validate(&self) -> anyhow::Result<()> {
        let fields = [
            ("inbox_payload_bytes_max", self.payload_bytes_max),
            ("inbox_backlog_max", self.backlog_max),
            ("inbox_topics_max", self.topics_max),
            ("inbox_dedupe_max", self.dedupe_max),
            ("inbox_dedupe_age_s", self.dedupe_age_s),
            ("inbox_receipts_max", self.receipts_max),
            ("inbox_receipt_age_s", self.receipt_age_s),
        ];
        for (name, value) in fields {
            anyhow::ensure!(value >= 1, "{name} must be at least 1");
        }
        anyhow::ensure!(self.ttl_s != Some(0), "inbox_ttl_s must be at least 1 (leave it out for no TTL)");
        Ok(())
    }

    /// The TTL of `topic`, in seconds (None: its messages never expire).
    pub fn ttl_of(&self, topic: &str) -> Option<u32> {
        match self.topic_ttl_s.get(topic) {
            Some(0) => None,
            Some(ttl) => Some(*ttl),
            None => self.ttl_s,
        }
    }

    /// Whether any topic has a TTL.
    pub fn expires(&self) -> bool {
        self.ttl_s.is_some() || self.topic_ttl_s.values().any(|ttl| *ttl > 0)
    }
}

/// `TIDAL_WAL_PREALLOCATE`: unset or `1` preallocates whole segments, `0` turns it off.
fn wal_preallocate_bytes(value: Option<&str>) -> anyhow::Result<u64> {
    match value.map(str::trim) {
        None | Some("1") => Ok(u64::MAX),
        Some("0") => Ok(0),
        Some(other) => anyhow::bail!("TIDAL_WAL_PREALLOCATE must be 0 or 1, got {other:?}"),
    }
}

fn load_file(path: &Path) -> anyhow::Result<FileConfig> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("read config file {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("parse config file {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_embeddings_cap_is_a_quarter_of_memory() {
        let gib = 1u64 << 30;
        assert_eq!(embeddings_max_default(24 * gib, 128), 24 * gib / 4 / 1280);
        assert_eq!(embeddings_max_default(24 * gib, 64), 24 * gib / 4 / 640);
        assert_eq!(embeddings_max_default(0, 128), 1_000, "never below 1,000");
        assert_eq!(embeddings_max_default(gib, 0), gib / 4 / 10, "dimension 0 counts as 1");
        assert!(machine_memory_bytes() > 0);
    }

    #[test]
    fn wal_preallocate_env_is_0_or_1() {
        assert_eq!(wal_preallocate_bytes(None).unwrap(), u64::MAX);
        assert_eq!(wal_preallocate_bytes(Some("1")).unwrap(), u64::MAX);
        assert_eq!(wal_preallocate_bytes(Some("0")).unwrap(), 0);
        assert!(wal_preallocate_bytes(Some("yes")).is_err());
    }

    #[test]
    fn command_line_overrides_file_and_file_overrides_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tidal.toml");
        std::fs::write(&path, "http = \"127.0.0.1:9000\"\ndimension = 8\n[signal_kinds]\nclick = 2.5\n")
            .unwrap();
        let args = ServeArgs { config: Some(path.clone()), dimension: Some(16), ..Default::default() };
        let config = ServeConfig::resolve(&args).unwrap();
        assert_eq!(config.http.port(), 9000);
        assert_eq!(config.dimension, 16);
        assert_eq!(config.signal_kinds.len(), 1);
        assert_eq!(config.data_dir, PathBuf::from("./tidal-data"));
    }

    #[test]
    fn signal_kind_weights_are_bounded_like_signal_weights() {
        let kinds = |weight: f64| [("click".to_string(), weight)].into_iter().collect();
        for ok in [0.0, -0.5, 1e6, -1e6] {
            assert!(check_signal_kinds(&kinds(ok)).is_ok(), "{ok}");
        }
        for bad in [1e6 + 1.0, -1e308, f64::NAN, f64::INFINITY] {
            assert!(check_signal_kinds(&kinds(bad)).is_err(), "{bad}");
        }
        assert!(check_signal_kinds(&[(String::new(), 1.0)].into_iter().collect()).is_err());
    }

    #[test]
    fn dial_overrides_parse_and_bad_ones_are_refused() {
        let dial = parse_dial(&["2=127.0.0.1:9002".into(), " 3 = localhost:9003 ".into()]).unwrap();
        assert_eq!(dial.get(&tidal_types::NodeId(2)).map(String::as_str), Some("127.0.0.1:9002"));
        assert_eq!(dial.get(&tidal_types::NodeId(3)).map(String::as_str), Some("localhost:9003"));
        for bad in ["2", "x=127.0.0.1:1", "2=127.0.0.1", "2=:80", "2=h:99999"] {
            assert!(parse_dial(&[bad.into()]).is_err(), "{bad} was accepted");
        }
        assert!(parse_dial(&["2=a:1".into(), "2=b:2".into()]).is_err(), "a node named twice");
        let dir = tempfile::tempdir().unwrap();
        crate::auth::write_private_file(&dir.path().join("secret"), b"0123456789abcdef0123\n").unwrap();
        let cluster = dir.path().join("cluster.toml");
        std::fs::write(
            &cluster,
            "cluster_id = \"t\"\nsecret_file = \"secret\"\n\
             [[node]]\nid = 1\nhttp = \"127.0.0.1:7070\"\nrpc = \"127.0.0.1:7170\"\n\
             [[node]]\nid = 2\nhttp = \"127.0.0.1:7071\"\nrpc = \"127.0.0.1:7171\"\n",
        )
        .unwrap();
        let mut args = ServeArgs {
            cluster: Some(cluster),
            node_id: Some(1),
            data_dir: Some(dir.path().join("n1")),
            dial: vec!["2=127.0.0.1:9999".into()],
            ..Default::default()
        };
        let spec = ServeConfig::resolve(&args).unwrap().cluster.unwrap().spec;
        let node2 = spec.node(tidal_types::NodeId(2)).unwrap();
        assert_eq!(spec.dial_address(node2), "127.0.0.1:9999");
        assert_eq!(node2.rpc, "127.0.0.1:7171", "the shared address is unchanged");
        args.dial = vec!["5=127.0.0.1:9999".into()];
        assert!(ServeConfig::resolve(&args).is_err(), "an override for a non-member");
    }

    #[test]
    fn a_member_named_by_host_name_listens_where_http_says() {
        let dir = tempfile::tempdir().unwrap();
        crate::auth::write_private_file(&dir.path().join("secret"), b"0123456789abcdef0123\n").unwrap();
        let cluster = dir.path().join("cluster.toml");
        std::fs::write(
            &cluster,
            "cluster_id = \"t\"\nsecret_file = \"secret\"\n\
             [[node]]\nid = 1\nhttp = \"tidal-0.tidal-peers:7070\"\nrpc = \"tidal-0.tidal-peers:7170\"\n\
             [[node]]\nid = 2\nhttp = \"127.0.0.1:7071\"\nrpc = \"127.0.0.1:7171\"\n",
        )
        .unwrap();
        let mut args = ServeArgs {
            cluster: Some(cluster),
            node_id: Some(1),
            data_dir: Some(dir.path().join("n1")),
            ..Default::default()
        };
        let refused = ServeConfig::resolve(&args).unwrap_err().to_string();
        assert!(refused.contains("--http"), "{refused}");
        args.http = Some("0.0.0.0:7070".parse().unwrap());
        let config = ServeConfig::resolve(&args).unwrap();
        assert_eq!(config.http, "0.0.0.0:7070".parse::<SocketAddr>().unwrap());
        let node1 = config.cluster.unwrap().spec.node(tidal_types::NodeId(1)).unwrap().clone();
        assert_eq!(node1.http, "tidal-0.tidal-peers:7070", "peers and clients still use the name");
        args.node_id = Some(2);
        args.http = Some("0.0.0.0:9999".parse().unwrap());
        let config = ServeConfig::resolve(&args).unwrap();
        assert_eq!(config.http.port(), 7071, "an IP address in the cluster file is where it listens");
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tidal.toml");
        std::fs::write(&path, "dimenson = 8\n").unwrap();
        let args = ServeArgs { config: Some(path.clone()), ..Default::default() };
        assert!(ServeConfig::resolve(&args).is_err());
        std::fs::write(&path, "dimension = 0\n").unwrap();
        assert!(ServeConfig::resolve(&args).is_err());
        for zero in ["ship_tail_bytes_max = 0\n", "ship_tail_batches_max = 0\n"] {
            std::fs::write(&path, zero).unwrap();
            let error = ServeConfig::resolve(&args).unwrap_err().to_string();
            assert!(error.contains("ship_tail"), "{zero}: {error}");
        }
        for bad in ["engine_background_nice = 20\n", "engine_background_nice = -1\n"] {
            std::fs::write(&path, bad).unwrap();
            let error = ServeConfig::resolve(&args).unwrap_err().to_string();
            assert!(error.contains("engine_background_nice must be in 0..=19"), "{bad}: {error}");
        }
        std::fs::write(&path, "engine_background_nice = 0\n").unwrap();
        assert_eq!(ServeConfig::resolve(&args).unwrap().engine_background_nice, 0);
    }

    #[test]
    fn the_ship_tail_bounds_come_from_the_file_or_default() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tidal.toml");
        std::fs::write(&path, "ship_tail_bytes_max = 1048576\nship_tail_batches_max = 64\n").unwrap();
        let args = ServeArgs { config: Some(path), ..Default::default() };
        let config = ServeConfig::resolve(&args).unwrap();
        assert_eq!((config.ship_tail_bytes_max, config.ship_tail_batches_max), (1 << 20, 64));
        let config = ServeConfig::resolve(&ServeArgs::default()).unwrap();
        assert_eq!(
            (config.ship_tail_bytes_max, config.ship_tail_batches_max),
            (TAIL_BYTES_MAX_DEFAULT, TAIL_BATCHES_MAX_DEFAULT)
        );
    }
}
