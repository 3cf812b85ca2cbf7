//! `tidal bench`: a bounded load generator that prints throughput and acknowledgement latency.
//!
//! Every run is bounded twice: by `--seconds` and by `--requests-max`. With `--spawn` it starts its
//! own node in-process on a loopback port in a temporary data dir (removed afterwards), so one
//! command measures a fresh node; otherwise it drives `--url`. Latencies are client-observed, from
//! sending the request to receiving the acknowledgement (after fsync and apply).

use crate::bench_conn::{LeanConn, Target};
use anyhow::Context;
use hyper::Method;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tidal_client::Client;
use tidal_server::config::{ServeArgs, ServeConfig};
use tidal_types::SignalIn;

pub use crate::bench_inbox::{BacklogLevel, DrainFigures, InboxFigures, LevelOutcome, ReceiveCounts};

/// Most latencies kept per worker: bounds the bench's own memory on long runs.
const LATENCIES_PER_WORKER_MAX: usize = 2_000_000;

/// What to write.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Workload {
    /// POST /v1/signals with `--batch` signals per request.
    Signals,
    /// PUT /v1/items/{id} with small metadata.
    Items,
    /// PUT /v1/items/{id}/embedding with `--dim` floats.
    Embeddings,
    /// GET /v1/users/{user}/feed after loading `--items` items with clustered embeddings and some
    /// signals; adds recall@20 against `exact=true`, the ranking index's memory and the load rate,
    /// and ends with the line `feed: items <N>, dims <D>, recall@20 <R>, p50 <X> ms, p99 <Y> ms,
    /// index <MB> MB`.
    Feed,
    /// GET /v1/items/{id}/similar, loaded and reported as the feed workload (`similar: ...`).
    Similar,
    /// Replication lag: PUT an item on `--url`, then read it with `min_seqno` from every
    /// `--followers` URL; the latency is from the write's acknowledgement until every follower has
    /// answered (it includes one HTTP round trip to each follower).
    Lag,
    /// Read anywhere: PUT an item on each node in turn (`--url`, then every `--followers` URL; a
    /// follower forwards it), then read it with `min_seqno` from EVERY node; the latency is from
    /// the write's acknowledgement until every node has answered.
    ReadAnywhere,
    /// POST /v1/streams/{stream}/events with `--batch` events per request (one batch each).
    Publish,
    /// Stream delivery: publish one event on `--url` while a subscription (SSE) on every
    /// `--followers` URL follows the stream; the latency is from the publish's acknowledgement
    /// until every subscriber has received the event (0 if they had it first).
    StreamLag,
    /// Stream reads: GET /v1/streams/{stream}/events pages of 1000 from one node, after publishing
    /// `--items` events to a fresh stream; events/s counts the events read.
    StreamRead,
    /// Inbox round trips: each worker has its own fresh inbox, sends one message (with
    /// `--payload-bytes` of padding) to it and receives it back; a request is the whole round trip.
    InboxRoundtrip,
    /// Inbox delivery: one receiver parked (30 s waits) on a fresh inbox, one message sent at a
    /// time, 10 ms after the last delivery (`--concurrency` is taken as 1); the latency is from the
    /// start of the send until the receiver has it.
    InboxLatency,
    /// Inbox drain: `--messages` sends from `--concurrency` senders to one topic of a fresh inbox
    /// while one parked receiver takes up to 1000 per receive. Adds the time from the first send,
    /// and from the last send's ack, until the receiver had every message, and the node's
    /// parked-receive wakes (`n/a` if it does not count them). Then the preloaded drain, what the
    /// peers' queue drains time: the same count sent first to another inbox, then one receiver
    /// takes them all. Fails unless every message arrived exactly once in `inbox_seq` order.
    /// Bounded by its count and 300 s per phase, not by `--seconds`.
    InboxDrain,
    /// Inbox send cost by backlog: for each of `--backlog-levels`, a fresh inbox's topic is filled
    /// to the level by `--concurrency` senders (nothing receives), then 2000 sends on top (fewer
    /// with `--requests-max`, within `--seconds`) are timed; one row per level. A level at or past
    /// the node's per-topic cap (10,000 by default) shows `capped`: for every level to count,
    /// start the nodes with the config key `inbox_backlog_max` at least the top level + 2000.
    InboxSendBacklog,
}

/// `tidal bench` options.
#[derive(Clone, Debug, clap::Args)]
pub struct BenchArgs {
    /// Node to drive (ignored with --spawn).
    #[arg(long, default_value = "http://127.0.0.1:7070")]
    pub url: String,
    /// Start a fresh node in-process in a temporary dir and drive it.
    #[arg(long)]
    pub spawn: bool,
    /// Bearer token. Prefer the TIDAL_TOKEN environment variable: a `--token` value is in the
    /// command line, which every user of the machine can read (`ps`).
    #[arg(long, env = "TIDAL_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// What to write.
    #[arg(long, value_enum, default_value = "signals")]
    pub workload: Workload,
    /// Signals per request (signals workload).
    #[arg(long, default_value_t = 1000)]
    pub batch: usize,
    /// Concurrent requests.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Duration bound.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Request count bound.
    #[arg(long, default_value_t = 1_000_000)]
    pub requests_max: u64,
    /// Embedding dimension (embeddings and feed workloads; must match the node).
    #[arg(long, default_value_t = 128)]
    pub dim: usize,
    /// Items to load first (feed workload).
    #[arg(long, default_value_t = 100_000)]
    pub items: u64,
    /// Distinct users.
    #[arg(long, default_value_t = 10_000)]
    pub users: u64,
    /// Follower URLs, comma separated (lag and read-anywhere workloads; default: every other member
    /// of the writer's cluster).
    #[arg(long, value_delimiter = ',')]
    pub followers: Vec<String>,
    /// Target request rate per second over all workers (0: as fast as the workers go). Requests are
    /// paced on a fixed schedule, so a slow reply does not lower the offered rate.
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// First item id the item, embedding, lag and read-anywhere workloads write (runs that must
    /// not overwrite each other's items pick disjoint ranges).
    #[arg(long, default_value_t = 0)]
    pub id_base: u64,
    /// Send the items, signals and publish writes on this many write links (`GET /v1/link`,
    /// shared by the workers) instead of one HTTP/1.1 connection per worker (0).
    #[arg(long, default_value_t = 0)]
    pub links: usize,
    /// No progress line on stderr.
    #[arg(long)]
    pub quiet: bool,
    /// Keep writing to `--url` when it is a follower (every write then takes the forwarding hop).
    /// Without it, a write workload aimed at a follower goes to the leader that follower names,
    /// as a client of PostgreSQL writes to the primary.
    #[arg(long)]
    pub through_follower: bool,
    /// Bytes of padding in each message's payload (inbox workloads).
    #[arg(long, default_value_t = 64)]
    pub payload_bytes: usize,
    /// Messages the inbox-drain workload sends.
    #[arg(long, default_value_t = 10_000)]
    pub messages: u64,
    /// The topic backlogs at which inbox-send-backlog times sends, comma separated.
    #[arg(long, value_delimiter = ',', default_values_t = BACKLOG_LEVELS)]
    pub backlog_levels: Vec<u64>,
    /// The stream the stream-read workload reads and its first offset (set by its preload).
    #[arg(skip)]
    pub stream_read: Option<(String, u64)>,
    /// Feed and similar workloads: every read asks for the exact scan (`exact=true`).
    #[arg(long)]
    pub exact: bool,
    /// Feed and similar workloads: new embeddings written per second during the run, beside the
    /// reads (0: none).
    #[arg(long, default_value_t = 0)]
    pub embedding_rate: u64,
    /// Feed and similar workloads: users (or items) whose recall@20 is measured before the run.
    #[arg(long, default_value_t = 200)]
    pub recall_samples: usize,
    /// With `--spawn`: the spawned node's config file (for example `feed_ann_lists = 0`, which
    /// turns the approximate feed index off).
    #[arg(long)]
    pub node_config: Option<std::path::PathBuf>,
    /// Feed and similar workloads: do not load items first (the node at `--url` holds them from
    /// an earlier run with the same `--items` and `--dim`).
    #[arg(long)]
    pub skip_load: bool,
}

/// inbox-send-backlog's levels: empty, small, the node's default per-topic cap, twice that.
const BACKLOG_LEVELS: [u64; 4] = [0, 1000, 10_000, 20_000];

impl Default for BenchArgs {
    fn default() -> BenchArgs {
        BenchArgs {
            url: "http://127.0.0.1:7070".into(),
            spawn: false,
            token: None,
            workload: Workload::Signals,
            batch: 1000,
            concurrency: 16,
            seconds: 10,
            requests_max: 1_000_000,
            dim: 128,
            items: 100_000,
            users: 10_000,
            followers: Vec::new(),
            rate: 0,
            id_base: 0,
            links: 0,
            quiet: false,
            through_follower: false,
            payload_bytes: 64,
            messages: 10_000,
            backlog_levels: BACKLOG_LEVELS.to_vec(),
            stream_read: None,
            exact: false,
            embedding_rate: 0,
            recall_samples: 200,
            node_config: None,
            skip_load: false,
        }
    }
}

/// What one bench run measured.
#[derive(Clone, Debug)]
pub struct Summary {
    /// Requests finished (acknowledged or failed).
    pub requests: u64,
    /// Events acknowledged (signals count one per signal).
    pub events: u64,
    /// Requests that failed.
    pub errors: u64,
    /// Wall time of the run.
    pub seconds: f64,
    /// Latency percentiles of the acknowledged requests, in ms: p50, p99, max.
    pub p50_ms: f64,
    /// See `p50_ms`.
    pub p99_ms: f64,
    /// See `p50_ms`.
    pub max_ms: f64,
    /// Lag and read-anywhere: p50 and p99 in ms of the time until the FIRST reader answered (the
    /// main figures wait for every reader); 0 for the other workloads. Redis's lag tool watches
    /// one replica, so this is the figure to set beside it.
    pub first_p50_ms: f64,
    /// See `first_p50_ms`.
    pub first_p99_ms: f64,
    /// The written node's WAL fsync latency over the run (from its `/metrics` before and after),
    /// when it answered both times: what the ack latency is set against.
    pub fsync: Option<FsyncWindow>,
    /// CPU this process used per finished request over the run, in µs (Linux; with `--spawn` it
    /// includes the node): the load generator shares the cores with what it measures.
    pub client_cpu_us: Option<f64>,
    /// What inbox-drain and inbox-send-backlog measured beyond the table.
    pub inbox: Option<InboxFigures>,
    /// What the feed and similar workloads measured beyond the table.
    pub feed: Option<crate::bench_feed::FeedFigures>,
}

/// The WAL fsyncs of one node between two reads of its `tidal_wal_fsync_seconds` histogram.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FsyncWindow {
    /// fsyncs in the window.
    pub count: u64,
    /// The histogram bucket holding the median: (lower, upper] in ms.
    pub p50_ms: (f64, f64),
    /// The bucket holding the 99th percentile: (lower, upper] in ms.
    pub p99_ms: (f64, f64),
}

/// Cumulative `tidal_wal_fsync_seconds` buckets from a `/metrics` text: (upper bound in s, count),
/// `+Inf` as infinity, in the text's (ascending) order.
fn fsync_buckets(metrics: &str) -> Vec<(f64, u64)> {
    metrics
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("tidal_wal_fsync_seconds_bucket{le=\"")?;
            let (bound, rest) = rest.split_once("\"}")?;
            let bound = if bound == "+Inf" { f64::INFINITY } else { bound.parse().ok()? };
            Some((bound, rest.trim().parse().ok()?))
        })
        .collect()
}

/// The fsyncs between two histogram reads (`before`, `after`: [`fsync_buckets`]); None when the
/// buckets differ or nothing was fsynced.
fn fsync_window(before: &[(f64, u64)], after: &[(f64, u64)]) -> Option<FsyncWindow> {
    if before.len() != after.len() || before.iter().zip(after).any(|(b, a)| b.0 != a.0 || a.1 < b.1) {
        return None;
    }
    let cumulative: Vec<(f64, u64)> = before.iter().zip(after).map(|(b, a)| (a.0, a.1 - b.1)).collect();
    let count = cumulative.last()?.1;
    if count == 0 {
        return None;
    }
    let bucket_of = |q: f64| {
        let rank = (q * count as f64).ceil().max(1.0) as u64;
        let at = cumulative.iter().position(|(_, n)| *n >= rank)?;
        let lower = if at == 0 { 0.0 } else { cumulative[at - 1].0 * 1000.0 };
        Some((lower, cumulative[at].0 * 1000.0))
    };
    Some(FsyncWindow { count, p50_ms: bucket_of(0.50)?, p99_ms: bucket_of(0.99)? })
}

/// `GET {url}/metrics` as text, with `token` as the bearer credential when given.
pub(crate) async fn fetch_metrics(url: &str, token: Option<&str>) -> anyhow::Result<String> {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
    let mut request = http.get(format!("{url}/metrics"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let reply = request.send().await.with_context(|| format!("GET {url}/metrics"))?;
    anyhow::ensure!(reply.status().is_success(), "GET {url}/metrics: {}", reply.status());
    reply.text().await.context("read /metrics")
}

impl Summary {
    /// Acknowledged requests per second (failed ones excluded).
    pub fn acked_per_second(&self) -> f64 {
        self.requests.saturating_sub(self.errors) as f64 / self.seconds.max(1e-9)
    }
}

/// Runs the bench and prints its table.
pub async fn run(mut args: BenchArgs) -> anyhow::Result<()> {
    if let Workload::InboxLatency = args.workload {
        // One sender at a time: a sample is one message from its send to its delivery.
        args.concurrency = 1;
    }
    let summary = measure(&args).await?;
    summary.print(&args);
    Ok(())
}

/// Runs the bench and returns what it measured (`tidal gates` builds on this).
pub async fn measure(args: &BenchArgs) -> anyhow::Result<Summary> {
    anyhow::ensure!(args.concurrency >= 1 && args.concurrency <= 4096, "concurrency must be 1..=4096");
    anyhow::ensure!(args.batch >= 1, "batch must be at least 1");
    anyhow::ensure!(
        !matches!(args.workload, Workload::InboxLatency) || args.concurrency == 1,
        "inbox-latency sends one message at a time: concurrency must be 1"
    );
    let mut spawned = None;
    let url = if args.spawn {
        let (url, handle) = spawn_node_with(args.dim as u32, args.node_config.clone()).await?;
        spawned = Some(handle);
        url
    } else if args.through_follower || matches!(args.workload, Workload::Feed | Workload::Similar) {
        args.url.clone()
    } else {
        writer_url(&args.url, args.token.clone(), args.quiet).await
    };
    let client = Client::new(url.clone(), args.token.clone());
    let mut args = args.clone();
    let mut feed = None;
    match args.workload {
        Workload::Feed | Workload::Similar => {
            let load_per_second =
                if args.skip_load { 0.0 } else { crate::bench_feed::preload(&client, &args).await? };
            let recall = crate::bench_feed::recall(&client, &args, args.recall_samples).await?;
            feed = Some(crate::bench_feed::FeedFigures {
                recall,
                samples: args.recall_samples,
                load_per_second,
                index_mb: 0.0,
                ann_mb: 0.0,
                writes_per_second: 0.0,
            });
        }
        Workload::StreamRead => args.stream_read = Some(crate::bench_streams::preload(&client, &args).await?),
        _ => {}
    }
    if let Workload::Lag | Workload::ReadAnywhere | Workload::StreamLag = args.workload {
        if args.followers.is_empty() {
            // Every other member of the cluster the writer belongs to.
            if let Ok(status) = client.status().await {
                let scheme = url.split_once("://").map_or("http", |(scheme, _)| scheme);
                args.followers = status
                    .nodes
                    .iter()
                    .filter(|node| node.id != status.node_id)
                    .map(|node| format!("{scheme}://{}", node.http))
                    .collect();
            }
        }
        anyhow::ensure!(
            !args.followers.is_empty(),
            "the lag and read-anywhere workloads need --followers URL[,URL...] (or a cluster member to ask)"
        );
    }
    let args = &args;
    if !args.quiet {
        eprintln!(
            "bench: {:?} against {url}, concurrency {}, {} s or {} requests",
            args.workload, args.concurrency, args.seconds, args.requests_max
        );
    }
    // Not a Tidal node, a token without the scope, unreachable: no fsync line, the bench still runs.
    let fsync_histogram =
        || async { fetch_metrics(client.base(), client.token()).await.ok().map(|text| fsync_buckets(&text)) };
    let before = fsync_histogram().await;
    let cpu_before = process_cpu_seconds();
    let stop_writes = Arc::new(AtomicBool::new(false));
    let writes = feed.is_some().then(|| crate::bench_feed::spawn_writes(&client, args, stop_writes.clone()));
    let report = match args.workload {
        Workload::InboxDrain => crate::bench_inbox::drain(&client, args).await,
        Workload::InboxSendBacklog => crate::bench_inbox::send_backlog(&client, args).await,
        _ => drive(&client, args).await,
    };
    stop_writes.store(true, Ordering::Relaxed);
    if let (Some(figures), Some(writes), Ok(report)) = (feed.as_mut(), writes, report.as_ref()) {
        let written = writes.await.context("embedding writer")?;
        figures.writes_per_second = written as f64 / report.elapsed.as_secs_f64().max(1e-9);
        (figures.index_mb, figures.ann_mb) = crate::bench_feed::index_mb(&client).await;
    }
    let cpu_after = process_cpu_seconds();
    let after = fsync_histogram().await;
    if let Some(handle) = spawned {
        handle.stop().await?;
    }
    let mut summary = report?.summary();
    summary.feed = feed;
    summary.fsync = before.zip(after).and_then(|(before, after)| fsync_window(&before, &after));
    summary.client_cpu_us = cpu_before
        .zip(cpu_after)
        .filter(|_| summary.requests > 0)
        .map(|(before, after)| (after - before) * 1e6 / summary.requests as f64);
    Ok(summary)
}

/// CPU seconds (user + system) this process has used, all its threads included, from
/// `/proc/self/stat`; `None` where that file does not exist.
fn process_cpu_seconds() -> Option<f64> {
    cpu_seconds_of_stat(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

/// `utime + stime` of a `/proc/PID/stat` line, in seconds. The times are in USER_HZ, 100 per
/// second in Linux's ABI. The command name (field 2) is in parentheses and may hold spaces and
/// parentheses itself, so the fields are counted from the last `)`.
fn cpu_seconds_of_stat(stat: &str) -> Option<f64> {
    const USER_HZ: f64 = 100.0;
    let mut fields = stat.get(stat.rfind(')')? + 1..)?.split_ascii_whitespace();
    // After the name: state (field 3) ... utime (14), stime (15).
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 / USER_HZ)
}

/// Where a write workload sends its writes: `url`, or the leader it names when it is a cluster
/// follower. A node that does not answer `/cluster/status` (a single node, an old build) is driven
/// as given.
async fn writer_url(url: &str, token: Option<String>, quiet: bool) -> String {
    let Ok(status) = Client::new(url.to_string(), token).status().await else {
        return url.to_string();
    };
    match leader_address(url, &status) {
        Some(leader) if leader != url.trim_end_matches('/') => {
            if !quiet {
                eprintln!(
                    "bench: {url} is n{} ({}); writing to the leader n{} at {leader} (--through-follower keeps {url})",
                    status.node_id,
                    status.role,
                    status.leader_id.unwrap_or_default()
                );
            }
            leader
        }
        _ => url.to_string(),
    }
}

/// The leader's URL from a node's status, with the scheme of `url`; None when no leader is known.
fn leader_address(url: &str, status: &tidal_types::ClusterStatus) -> Option<String> {
    let leader = status.leader_id?;
    let node = status.nodes.iter().find(|node| node.id == leader)?;
    let scheme = url.split_once("://").map_or("http", |(scheme, _)| scheme);
    Some(format!("{scheme}://{}", node.http))
}

pub(crate) struct SpawnedNode {
    shutdown: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    _dir: tempfile::TempDir,
}

impl SpawnedNode {
    pub(crate) async fn stop(self) -> anyhow::Result<()> {
        let _ = self.shutdown.send(());
        self.task.await.context("spawned node task")?
    }
}

#[cfg(test)]
pub(crate) async fn spawn_node(dim: u32) -> anyhow::Result<(String, SpawnedNode)> {
    spawn_node_with(dim, None).await
}

/// [`spawn_node`] with the config file `config_path` if given.
pub(crate) async fn spawn_node_with(
    dim: u32,
    config_path: Option<std::path::PathBuf>,
) -> anyhow::Result<(String, SpawnedNode)> {
    let dir = tempfile::Builder::new().prefix("tidal-bench").tempdir().context("create bench data dir")?;
    let data_dir = dir.path().join("data");
    let args = ServeArgs {
        data_dir: Some(data_dir),
        dimension: Some(dim),
        config: config_path,
        ..Default::default()
    };
    let config = ServeConfig::resolve(&args)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.context("bind bench node")?;
    let url = format!("http://{}", listener.local_addr()?);
    let (shutdown, on_shutdown) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(tidal_server::run(config, listener, None, async move {
        let _ = on_shutdown.await;
    }));
    let client = Client::new(url.clone(), None);
    let deadline = Instant::now() + Duration::from_secs(30);
    while client.status().await.is_err() {
        anyhow::ensure!(Instant::now() < deadline, "spawned node did not come up within 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok((url, SpawnedNode { shutdown, task, _dir: dir }))
}

fn embedding(seed: u64, dim: usize) -> Vec<f64> {
    // SplitMix64: deterministic pseudo-random vectors without a dependency.
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..dim)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        })
        .collect()
}

/// What a run measured, before its summary: per-request latencies in µs, unsorted.
pub(crate) struct Report {
    pub(crate) requests: u64,
    pub(crate) events: u64,
    pub(crate) errors: u64,
    pub(crate) elapsed: Duration,
    pub(crate) latencies_us: Vec<u32>,
    pub(crate) first_reader_us: Vec<u32>,
    pub(crate) inbox: Option<InboxFigures>,
}

async fn drive(client: &Client, args: &BenchArgs) -> anyhow::Result<Report> {
    // Signal and embedding bodies are encoded before the clock starts, and writes go out on one lean
    // connection per worker (`bench_conn`), so the load generator spends its CPU on sending, not on
    // building JSON and pooling connections (it shares the cores with the nodes it measures).
    let bodies = match args.workload {
        Workload::Signals => Some(Arc::new(signal_bodies(args)?)),
        Workload::Embeddings => Some(Arc::new(embedding_bodies(args)?)),
        Workload::Publish => Some(Arc::new(crate::bench_streams::publish_bodies(args)?)),
        _ => None,
    };
    let board = match args.workload {
        Workload::StreamLag => {
            Some(crate::bench_streams::LagBoard::follow(&args.followers, args.token.clone()).await?)
        }
        _ => None,
    };
    let inbox = crate::bench_inbox::InboxLoad::start(client, args).await;
    let target = Target::new(client.base(), client.token())?;
    let counters = Arc::new(Counters::default());
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.seconds);
    // Lag writes on `--url` and reads every follower; read-anywhere writes on each node in turn
    // and reads every node.
    let followers: Vec<Client> =
        args.followers.iter().map(|url| Client::new(url.clone(), args.token.clone())).collect();
    let everyone: Arc<Vec<Client>> =
        Arc::new(std::iter::once(client.clone()).chain(followers.clone()).collect());
    let followers = Arc::new(followers);
    // A link is served where it is opened, never forwarded (decisions/073).
    anyhow::ensure!(
        args.links == 0 || !args.through_follower,
        "--links writes on the leader; --through-follower needs HTTP (--links 0)"
    );
    let mut links = Vec::with_capacity(args.links);
    for _ in 0..args.links {
        links.push(tidal_client::Link::connect(client.base(), client.token()).await?);
    }
    let workers: Vec<_> = (0..args.concurrency as u64)
        .map(|index| {
            let mut conn = LeanConn::new(target.clone());
            conn.link = links.get(index as usize % links.len().max(1)).cloned();
            let worker = Worker {
                index,
                client: client.clone(),
                args: args.clone(),
                followers: followers.clone(),
                everyone: everyone.clone(),
                bodies: bodies.clone(),
                board: board.clone(),
                inbox: inbox.clone(),
                conn,
                counters: counters.clone(),
                started,
                deadline,
            };
            tokio::spawn(worker.run())
        })
        .collect();
    let progress = spawn_progress(counters.clone(), started, args.seconds, args.quiet);
    let (mut latencies_us, mut first_reader_us) = (Vec::new(), Vec::new());
    for worker in workers {
        let (latencies, first_reader) = worker.await.context("bench worker")?;
        latencies_us.extend(latencies);
        first_reader_us.extend(first_reader);
    }
    counters.stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed();
    progress.abort();
    if !args.quiet {
        eprintln!();
    }
    if let Some(inbox) = inbox {
        inbox.close(client, args.concurrency as u64).await;
    }
    Ok(Report {
        requests: counters.done.load(Ordering::Relaxed),
        events: counters.events.load(Ordering::Relaxed),
        errors: counters.errors.load(Ordering::Relaxed),
        elapsed,
        latencies_us,
        first_reader_us,
        inbox: None,
    })
}

/// What the workers count together, and the flag that stops them.
#[derive(Default)]
struct Counters {
    /// Requests handed out (the next request's number).
    issued: AtomicU64,
    /// Requests answered or failed.
    done: AtomicU64,
    /// Events acknowledged.
    events: AtomicU64,
    /// Requests failed.
    errors: AtomicU64,
    stop: AtomicBool,
}

/// One load worker: its own lean connection, the run's schedule and the shared counters.
struct Worker {
    index: u64,
    client: Client,
    args: BenchArgs,
    followers: Arc<Vec<Client>>,
    everyone: Arc<Vec<Client>>,
    bodies: Option<Arc<Vec<bytes::Bytes>>>,
    /// The followers' subscriptions (stream-lag).
    board: Option<Arc<crate::bench_streams::LagBoard>>,
    /// The run's inboxes (inbox-roundtrip, inbox-latency).
    inbox: Option<Arc<crate::bench_inbox::InboxLoad>>,
    conn: LeanConn,
    counters: Arc<Counters>,
    started: Instant,
    deadline: Instant,
}

impl Worker {
    /// Sends requests until the deadline, `--requests-max` or a stop; returns the latencies of the
    /// answered ones and, for the lag workloads, the lag to the first reader.
    async fn run(mut self) -> (Vec<u32>, Vec<u32>) {
        let (mut latencies, mut first_reader) = (Vec::new(), Vec::new());
        loop {
            let n = self.counters.issued.fetch_add(1, Ordering::Relaxed);
            if n >= self.args.requests_max
                || Instant::now() >= self.deadline
                || self.counters.stop.load(Ordering::Relaxed)
            {
                return (latencies, first_reader);
            }
            if self.args.rate > 0 {
                // Request n is due at n / rate seconds: an open-loop schedule.
                let due = self.started + Duration::from_secs_f64(n as f64 / self.args.rate as f64);
                if due >= self.deadline {
                    return (latencies, first_reader);
                }
                tokio::time::sleep_until(due.into()).await;
            }
            match self.request(n, &mut first_reader).await {
                Ok((count, micros)) => {
                    self.counters.events.fetch_add(count, Ordering::Relaxed);
                    if latencies.len() < LATENCIES_PER_WORKER_MAX {
                        latencies.push(micros);
                    }
                }
                Err(error) => {
                    if self.counters.errors.fetch_add(1, Ordering::Relaxed) < 5 {
                        eprintln!("\nbench: request failed: {error}");
                    }
                }
            }
            self.counters.done.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Request `n`: its events and latency in µs (for the lag workloads the lag to the last reader,
    /// and the first reader's goes to `first_reader`).
    async fn request(&mut self, n: u64, first_reader: &mut Vec<u32>) -> anyhow::Result<(u64, u32)> {
        let sent = Instant::now();
        let id = self.args.id_base + n;
        let lag = match self.args.workload {
            Workload::Lag => {
                lag_request(&self.client, &self.followers, id).await.map_err(anyhow::Error::from)
            }
            Workload::ReadAnywhere => {
                let writer = &self.everyone[(n % self.everyone.len() as u64) as usize];
                lag_request(writer, &self.everyone, id).await.map_err(anyhow::Error::from)
            }
            Workload::StreamLag => {
                let board = self.board.as_ref().expect("stream-lag follows the followers");
                board.publish_and_wait(&self.client).await
            }
            Workload::InboxRoundtrip | Workload::InboxLatency => {
                let inbox = self.inbox.as_ref().expect("the inbox workloads start their inboxes first");
                return Ok((1, inbox.request(&self.client, self.index, n).await?));
            }
            _ => {
                let request = Request {
                    worker: self.index,
                    n,
                    bodies: self.bodies.as_ref().map(|bodies| bodies.as_slice()),
                };
                let count = one_request(&self.client, &mut self.conn, &self.args, request).await?;
                return Ok((count, u32::try_from(sent.elapsed().as_micros()).unwrap_or(u32::MAX)));
            }
        };
        let (lag, first) = lag?;
        if first_reader.len() < LATENCIES_PER_WORKER_MAX {
            first_reader.push(first);
        }
        Ok((1, lag))
    }
}

/// Prints the run's progress once a second on stderr (unless `quiet`) until stopped or aborted:
/// elapsed of `seconds`, requests, events, the last second's rate and the time left.
fn spawn_progress(
    counters: Arc<Counters>,
    started: Instant,
    seconds: u64,
    quiet: bool,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut last = (Instant::now(), 0u64);
        while !counters.stop.load(Ordering::Relaxed) && !quiet {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let now = Instant::now();
            let total = counters.events.load(Ordering::Relaxed);
            let rate = (total - last.1) as f64 / (now - last.0).as_secs_f64();
            last = (now, total);
            let elapsed = (now - started).as_secs_f64();
            eprint!(
                "\r[{:>4.0}/{} s] {:>10} requests {:>12} events {:>12.0} events/s, ~{:.0} s left   ",
                elapsed,
                seconds,
                counters.done.load(Ordering::Relaxed),
                total,
                rate,
                (seconds as f64 - elapsed).max(0.0)
            );
        }
    })
}

/// Distinct pre-encoded signal bodies; request `n` sends body `n % SIGNAL_BODIES`.
const SIGNAL_BODIES: u64 = 512;

/// The JSON bodies of the signals workload, encoded once: body `n` holds the signals request `n`
/// used to build on the fly (users `(31n + i) % users`, items `(1,000,003n + 7,919i) % 1,000,000`).
fn signal_bodies(args: &BenchArgs) -> anyhow::Result<Vec<bytes::Bytes>> {
    let count = SIGNAL_BODIES.min(args.requests_max.max(1));
    if !args.quiet {
        eprintln!(
            "bench: {count} distinct request bodies of {} signals, encoded before the clock starts",
            args.batch
        );
    }
    (0..count)
        .map(|n| {
            let signals: Vec<SignalIn> = (0..args.batch as u64)
                .map(|i| SignalIn {
                    user: format!("u{}", (n * 31 + i) % args.users.max(1)),
                    item: (n * 1_000_003 + i * 7919) % 1_000_000,
                    kind: "click".into(),
                    weight: None,
                    ts: None,
                })
                .collect();
            let body = serde_json::to_vec(&tidal_types::SignalsRequest { signals })?;
            Ok(bytes::Bytes::from(body))
        })
        .collect()
}

/// Distinct pre-encoded embedding bodies; request `n` sends body `n % SIGNAL_BODIES` (the vector
/// `embedding(n, dim)`), so the bench does not format `dim` floats per request.
fn embedding_bodies(args: &BenchArgs) -> anyhow::Result<Vec<bytes::Bytes>> {
    (0..SIGNAL_BODIES.min(args.requests_max.max(1)))
        .map(|n| {
            let body = serde_json::to_vec(&tidal_types::EmbeddingPut { vector: embedding(n, args.dim) })?;
            Ok(bytes::Bytes::from(body))
        })
        .collect()
}

/// One request of a worker: its index `n` over all workers and the pre-encoded bodies, if any.
struct Request<'a> {
    worker: u64,
    n: u64,
    bodies: Option<&'a [bytes::Bytes]>,
}

impl Request<'_> {
    fn body(&self) -> bytes::Bytes {
        let bodies = self.bodies.expect("this workload pre-encodes its bodies");
        bodies[(self.n % bodies.len() as u64) as usize].clone()
    }
}

/// Sends one request of a write workload on `conn` (the feed's reads go through `client`); returns
/// the events it carried.
async fn one_request(
    client: &Client,
    conn: &mut LeanConn,
    args: &BenchArgs,
    request: Request<'_>,
) -> anyhow::Result<u64> {
    let id = args.id_base + request.n;
    match args.workload {
        Workload::Signals => {
            match &conn.link {
                Some(link) => drop(link.post_signals(&request.body(), None).await?),
                None => drop(conn.send(Method::POST, "/v1/signals", request.body()).await?),
            }
            Ok(args.batch as u64)
        }
        Workload::Items => {
            let body =
                format!(r#"{{"metadata":{{"title":"item {}","worker":{}}}}}"#, request.n, request.worker);
            match &conn.link {
                Some(link) => drop(link.put_item(id, body.as_bytes(), None).await?),
                None => drop(conn.send(Method::PUT, &format!("/v1/items/{id}"), body.into()).await?),
            }
            Ok(1)
        }
        Workload::Embeddings => {
            conn.send(Method::PUT, &format!("/v1/items/{id}/embedding"), request.body()).await?;
            Ok(1)
        }
        Workload::Feed => {
            client.feed_with(&format!("u{}", (request.n * 7) % args.users.max(1)), 20, args.exact).await?;
            Ok(1)
        }
        Workload::Similar => {
            client.similar((request.n * 7_919) % args.items.max(1), 20, args.exact).await?;
            Ok(1)
        }
        Workload::Publish => {
            match &conn.link {
                Some(link) => {
                    drop(link.publish(crate::bench_streams::PUBLISH_STREAM, &request.body(), None).await?)
                }
                None => {
                    drop(conn.send(Method::POST, crate::bench_streams::PUBLISH_PATH, request.body()).await?)
                }
            }
            Ok(args.batch as u64)
        }
        Workload::StreamRead => crate::bench_streams::read_page(conn, args, request.n).await,
        Workload::Lag | Workload::ReadAnywhere | Workload::StreamLag => {
            unreachable!("lag requests are timed by their own functions")
        }
        Workload::InboxRoundtrip | Workload::InboxLatency => {
            unreachable!("inbox requests are timed by their own functions")
        }
        Workload::InboxDrain | Workload::InboxSendBacklog => {
            unreachable!("these inbox workloads run without the workers")
        }
    }
}

/// `TIDAL_BENCH_SLOW_US`: lag samples slower than this are printed one by one (with each reader's
/// time), to tell a periodic stall from a broad tail.
fn slow_sample_us() -> Option<u128> {
    static SLOW: std::sync::OnceLock<Option<u128>> = std::sync::OnceLock::new();
    *SLOW.get_or_init(|| std::env::var("TIDAL_BENCH_SLOW_US").ok().and_then(|v| v.parse().ok()))
}

/// One lag sample: writes item `id` through `writer`, then reads it with `min_seqno` from every
/// reader at once; returns the times in µs from the write's acknowledgement until every reader,
/// and until the first reader, has answered.
async fn lag_request(
    writer: &Client,
    readers: &[Client],
    id: u64,
) -> Result<(u32, u32), tidal_client::Error> {
    let reply = writer.put_item(id, serde_json::json!({"lag": id}), None).await?;
    let acked = Instant::now();
    let path = format!("/v1/items/{id}?min_seqno={}", reply.seqno);
    let reads = readers.iter().map(|reader| {
        let (reader, path) = (reader.clone(), path.clone());
        tokio::spawn(async move {
            let read = reader.json::<(), tidal_types::ItemView>(reqwest::Method::GET, &path, None).await;
            read.map(|_| acked.elapsed().as_micros())
        })
    });
    // Each reader's own time until its answer, in reader order.
    let mut each_us = Vec::new();
    for read in reads.collect::<Vec<_>>() {
        each_us.push(read.await.expect("lag read task")?);
    }
    let total = acked.elapsed().as_micros();
    let first = each_us.iter().copied().min().unwrap_or(total);
    if slow_sample_us().is_some_and(|slow| total > slow) {
        eprintln!("bench: slow lag sample: seqno {} took {total} us; readers at {each_us:?} us", reply.seqno);
    }
    let micros = |us: u128| u32::try_from(us).unwrap_or(u32::MAX);
    Ok((micros(total), micros(first)))
}

/// The `p` quantile (0 to 1) of latencies in µs sorted ascending, in ms; 0 when there are none.
pub(crate) fn percentile(sorted_us: &[u32], p: f64) -> f64 {
    if sorted_us.is_empty() {
        return 0.0;
    }
    let index = ((sorted_us.len() as f64 - 1.0) * p).round() as usize;
    f64::from(sorted_us[index]) / 1000.0
}

impl Report {
    fn summary(mut self) -> Summary {
        self.latencies_us.sort_unstable();
        self.first_reader_us.sort_unstable();
        Summary {
            first_p50_ms: percentile(&self.first_reader_us, 0.50),
            first_p99_ms: percentile(&self.first_reader_us, 0.99),
            requests: self.requests,
            events: self.events,
            errors: self.errors,
            seconds: self.elapsed.as_secs_f64().max(1e-9),
            p50_ms: percentile(&self.latencies_us, 0.50),
            p99_ms: percentile(&self.latencies_us, 0.99),
            max_ms: percentile(&self.latencies_us, 1.0),
            fsync: None,
            client_cpu_us: None,
            inbox: self.inbox,
            feed: None,
        }
    }
}

impl Summary {
    fn print(&self, args: &BenchArgs) {
        println!("| workload | concurrency | batch | requests | errors | seconds | requests/s | events/s | p50 ms | p99 ms | max ms |");
        println!("|---|---|---|---|---|---|---|---|---|---|---|");
        println!(
            "| {:?} | {} | {} | {} | {} | {:.1} | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} |",
            args.workload,
            args.concurrency,
            if matches!(args.workload, Workload::Signals | Workload::Publish) { args.batch } else { 1 },
            self.requests,
            self.errors,
            self.seconds,
            self.requests as f64 / self.seconds,
            self.events as f64 / self.seconds,
            self.p50_ms,
            self.p99_ms,
            self.max_ms,
        );
        if args.links > 0 && matches!(args.workload, Workload::Items | Workload::Signals | Workload::Publish)
        {
            println!("\nWrites sent on {} write link(s) (GET /v1/link), shared by the workers.", args.links);
        }
        if let Some(fsync) = self.fsync {
            let (p50, p99) = (fsync.p50_ms, fsync.p99_ms);
            let ratio = |bound: f64| {
                if bound > 0.0 && bound.is_finite() {
                    format!("{:.1}", self.p99_ms / bound)
                } else {
                    "-".into()
                }
            };
            println!(
                "\nWAL fsync on the written node during the run: {} fsyncs, p50 in ({:.3}, {:.3}] ms, \
                 p99 in ({:.3}, {:.3}] ms; ack p99 / fsync p99: {}x to {}x",
                fsync.count,
                p50.0,
                p50.1,
                p99.0,
                p99.1,
                ratio(p99.1),
                ratio(p99.0)
            );
        }
        if let Some(cpu) = self.client_cpu_us {
            let whose =
                if args.spawn { "this process, the spawned node included" } else { "the load generator" };
            println!("\nCPU of {whose}: {cpu:.0} µs per request");
        }
        if let Some(inbox) = &self.inbox {
            inbox.print(args.workload, args.concurrency);
        }
        // Last: its final line is the one scripts read.
        if let Some(feed) = &self.feed {
            feed.print(args, self.p50_ms, self.p99_ms);
        }
        if matches!(args.workload, Workload::Lag | Workload::ReadAnywhere) {
            println!(
                "\nuntil the FIRST reader answered (the table waits for every reader): p50 {:.2} ms, p99 {:.2} ms",
                self.first_p50_ms, self.first_p99_ms
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{cpu_seconds_of_stat, fsync_buckets, fsync_window, leader_address, FsyncWindow};

    #[test]
    fn cpu_time_is_read_after_the_command_name() {
        // Fields 14 and 15 (utime, stime) are 250 and 50 ticks; the name holds spaces and a ')'.
        let stat = "4242 (tidal bench) x)) S 1 4242 4242 0 -1 4194304 900 0 0 0 250 50 0 0 20 0 3 0 77 0 0";
        assert_eq!(cpu_seconds_of_stat(stat), Some(3.0));
        assert_eq!(cpu_seconds_of_stat("4242 (tidal) S 1 2 3"), None, "too few fields");
        assert_eq!(cpu_seconds_of_stat("no name here"), None);
        assert_eq!(cpu_seconds_of_stat("1 (t) S 1 1 1 0 -1 0 0 0 0 0 x 5 0"), None, "not a number");
        let own = super::process_cpu_seconds().expect("this test runs on Linux");
        assert!(own >= 0.0 && own.is_finite(), "{own}");
    }

    fn histogram(counts: &[u64]) -> String {
        let bounds = ["0.0001", "0.0002", "0.0004", "+Inf"];
        let mut text = String::from("# TYPE tidal_wal_fsync_seconds histogram\n");
        for (bound, count) in bounds.iter().zip(counts) {
            text.push_str(&format!("tidal_wal_fsync_seconds_bucket{{le=\"{bound}\"}} {count}\n"));
        }
        text + "tidal_wal_fsync_seconds_sum 0.1\ntidal_wal_fsync_seconds_count 9\nother_metric 3\n"
    }

    #[test]
    fn the_fsync_window_is_the_difference_of_two_histograms() {
        let before = fsync_buckets(&histogram(&[5, 8, 9, 9]));
        assert_eq!(before.len(), 4);
        assert_eq!(before[3], (f64::INFINITY, 9));
        // 100 fsyncs in the window: 40 up to 0.1 ms, 59 in (0.1, 0.2], 1 in (0.2, 0.4].
        let after = fsync_buckets(&histogram(&[45, 107, 109, 109]));
        let close = |(a, b): (f64, f64), (c, d): (f64, f64)| (a - c).abs() < 1e-9 && (b - d).abs() < 1e-9;
        let FsyncWindow { count, p50_ms, p99_ms } = fsync_window(&before, &after).unwrap();
        assert_eq!(count, 100);
        assert!(close(p50_ms, (0.1, 0.2)) && close(p99_ms, (0.1, 0.2)), "{p50_ms:?} {p99_ms:?}");
        let after = fsync_buckets(&histogram(&[45, 106, 109, 109]));
        let p99_ms = fsync_window(&before, &after).unwrap().p99_ms;
        assert!(close(p99_ms, (0.2, 0.4)), "{p99_ms:?}");
        let after = fsync_buckets(&histogram(&[100, 107, 109, 109]));
        let p50_ms = fsync_window(&before, &after).unwrap().p50_ms;
        assert!(close(p50_ms, (0.0, 0.1)), "the first bucket starts at 0: {p50_ms:?}");
        // Nothing fsynced, a counter that went back (a restart), other buckets, no histogram: none.
        assert_eq!(fsync_window(&before, &before), None);
        assert_eq!(fsync_window(&after, &before), None);
        assert_eq!(fsync_window(&before, &before[..3]), None);
        assert!(fsync_buckets("garbage\ntidal_wal_fsync_seconds_bucket{le=\"x\"} 1\n").is_empty());
    }

    use tidal_types::{ClusterStatus, NodeStatus};

    fn node(id: u64, http: &str) -> NodeStatus {
        serde_json::from_value(serde_json::json!({
            "id": id, "role": "follower", "http": http, "durable_seqno": 0, "applied_seqno": 0,
            "lag_ms": 0, "matched_seqno": 0, "pulling": false, "snapshot": false
        }))
        .expect("a node status")
    }

    fn status(leader: Option<u64>) -> ClusterStatus {
        serde_json::from_value(serde_json::json!({
            "node_id": 1, "role": "follower", "term": 2, "leader_id": leader, "durable_seqno": 0,
            "commit_seqno": 0, "applied_seqno": 0, "nodes": [node(1, "127.0.0.1:7070"), node(3, "127.0.0.1:7072")]
        }))
        .expect("a cluster status")
    }

    #[test]
    fn writes_go_to_the_leader_a_follower_names_with_the_callers_scheme() {
        assert_eq!(
            leader_address("http://127.0.0.1:7070", &status(Some(3))).as_deref(),
            Some("http://127.0.0.1:7072")
        );
        assert_eq!(
            leader_address("https://a:1/", &status(Some(1))).as_deref(),
            Some("https://127.0.0.1:7070")
        );
        // No leader known, or one the status does not list: no address.
        assert_eq!(leader_address("http://127.0.0.1:7070", &status(None)), None);
        assert_eq!(leader_address("http://127.0.0.1:7070", &status(Some(9))), None);
    }
}
