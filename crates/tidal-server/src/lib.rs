//! The Tidal server: configuration, the HTTP API and the wiring of WAL, engine and applier.
//!
//! # Layout
//! - `config`: command line / environment / TOML file.
//! - `auth`: bearer tokens with scopes.
//! - `node`: the WAL, the engine, the applier thread and the write path.
//! - `http`: the axum router (the API contract).
//! - `metrics`: Prometheus text.
//! - `error`: the API's error replies.
//!
//! This crate is the server only: the `tidal` binary and its tooling (bench, gates, demo, local
//! clusters, operator verbs) are `tidal-cli`. It takes its listener and shutdown signal from the
//! caller (`run`), so tests, the simulation and the binary's `tidal serve` all drive it the same way.
#![deny(missing_docs)]

pub mod auth;
pub mod config;
pub mod error;
pub mod http;
pub mod inbox_ttl;
pub mod metrics;
pub mod node;
pub mod retention;
pub mod transport;

use anyhow::Context;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// Whether a node may serve on `addr` with the given token and TLS settings: off loopback, a node
/// without tokens lets anyone in and a node without TLS sends tokens and data in cleartext, so
/// either needs `--insecure`.
pub fn check_bind_policy(
    addr: std::net::SocketAddr,
    has_tokens: bool,
    has_tls: bool,
    insecure: bool,
) -> anyhow::Result<()> {
    if addr.ip().is_loopback() || insecure {
        return Ok(());
    }
    if !has_tokens {
        anyhow::bail!(
            "refusing to serve on non-loopback address {addr} without a token file: every route would be \
             open to the network. Pass --token-file FILE, or --insecure if that is really what you want"
        );
    }
    if !has_tls {
        anyhow::bail!(
            "refusing to serve on non-loopback address {addr} without TLS: tokens, the cluster secret and \
             all data would cross the network in cleartext. Pass --tls-cert and --tls-key (and --tls-ca on \
             a cluster), or --insecure if the network is private"
        );
    }
    Ok(())
}

/// A source of accepted connections: the OS's TCP listener, or the simulation's (chaos/sim). It
/// retries (and logs) accept errors itself.
pub use axum::serve::Listener;

/// Runs a node on `listener` (HTTP) and, for a cluster member, `rpc_listener` (replication) until
/// `shutdown` resolves, then drains writes and checkpoints.
pub async fn run(
    config: config::ServeConfig,
    listener: tokio::net::TcpListener,
    rpc_listener: Option<tokio::net::TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    use axum::serve::ListenerExt;
    // Small replies (an ack, a ship answer, a read) must leave at once: without TCP_NODELAY, Nagle
    // holds a reply's second segment behind the peer's delayed ACK, a 40 ms stall that was the whole
    // replication-lag tail (tonic's own `tcp_nodelay` does not reach connections we accept ourselves).
    let nodelay = |tcp: &mut tokio::net::TcpStream| {
        if let Err(error) = tcp.set_nodelay(true) {
            tracing::warn!("could not set TCP_NODELAY on an accepted connection: {error}");
        }
    };
    run_on(config, listener.tap_io(nodelay), rpc_listener.map(|rpc| rpc.tap_io(nodelay)), shutdown).await
}

/// [`run`] over any [`Listener`]s: the transport seam the simulation uses. Peers are dialled with
/// `config.io.connector`.
pub async fn run_on<H, R>(
    config: config::ServeConfig,
    listener: H,
    rpc_listener: Option<R>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()>
where
    H: Listener<Addr = std::net::SocketAddr>,
    R: Listener<Addr = std::net::SocketAddr>,
{
    let mut config = config;
    let tokens = config.token_file.as_deref().map(auth::Tokens::load).transpose()?;
    check_bind_policy(listener.local_addr()?, tokens.is_some(), config.net.tls.is_some(), config.insecure)?;
    let tls = transport::Tls::load(&mut config)?;
    let net = Arc::new(transport::NetState::new(&config.net));
    let node = open_node(config.clone()).await?;
    let replication = Replication::start(&node, rpc_listener, &net, tls.rpc.clone()).await?;
    let forward = http::Forwarder::new(&node, tls.forward.clone());
    let state = Arc::new(http::AppState {
        node: node.clone(),
        tokens,
        metrics: Default::default(),
        forward,
        streams: Default::default(),
        inboxes: Default::default(),
        net,
        history: Default::default(),
        links: Default::default(),
    });
    let inboxes = state.inboxes.clone();
    node.db().set_inbox_listener(Arc::new(move |owner: &str| inboxes.changed(owner)));
    // A stopping leader hands its office over while it still serves (requests that arrive meanwhile
    // are forwarded to the new leader). Stream subscriptions never end on their own: the stop ends
    // them so the HTTP drain can finish.
    let shutdown = {
        let state = state.clone();
        async move {
            shutdown.await;
            hand_off_leadership(&state.node).await;
            state.streams.close();
            state.links.close();
        }
    };
    let background = Background::start(&node, &state.history);
    tracing::info!(addr = %listener.local_addr()?, data_dir = %config.data_dir.display(), "serving");
    let grace = Duration::from_millis(config.fatal_exit_grace_ms);
    let port = transport::http::HttpPort {
        conns: state.net.http_conns.clone(),
        idle_timeout: config.net.idle_timeout,
        tls: tls.http.clone(),
    };
    let reload = tls.spawn_reload();
    let links = state.links.clone();
    let served = serve_http(listener, http::router(state), port, node.fatal_state(), grace, shutdown).await;
    // Also after a fatal fault, where the shutdown above does not run.
    links.close();
    if let Some((stop, task)) = reload {
        let _ = stop.send(true);
        let _ = task.await;
    }
    background.stop().await;
    if let Some(fatal) = node.fatal_state().get() {
        return Err(stop_after_fatal(node, replication, fatal).await);
    }
    let fatal = stop(node, replication, &config.data_dir).await?;
    served.context("HTTP server")?;
    // A fault during the stop itself (the WAL's last fsync, say) is still one: exit non-zero.
    match fatal {
        Some(fatal) => Err(FatalExit(fatal).into()),
        None => Ok(()),
    }
}

/// Opens the node off the async workers (it replays the WAL) and logs what its replay did.
async fn open_node(config: config::ServeConfig) -> anyhow::Result<Arc<node::Node>> {
    let (node, replay) = tidal_cluster::blocking::blocking(move || node::Node::open(config))
        .await
        .context("open node task")??;
    if replay.batches > 0 {
        tracing::info!(
            batches = replay.batches,
            mb_per_s = replay.bytes as f64 / 1e6 / replay.elapsed.as_secs_f64().max(1e-9),
            "startup replay"
        );
    }
    Ok(node)
}

/// A cluster member's replication side: the RPC server on its listener (and the control plane,
/// started by [`Replication::start`]); nothing on a single node.
struct Replication {
    stop: tokio::sync::watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Replication {
    /// Serves replication RPCs on `rpc_listener` and starts the control plane. If that fails the
    /// RPC server stops and the node shuts down before the error is returned.
    async fn start<R>(
        node: &Arc<node::Node>,
        rpc_listener: Option<R>,
        net: &transport::NetState,
        tls: Option<Arc<transport::tls::TlsServer>>,
    ) -> anyhow::Result<Replication>
    where
        R: Listener<Addr = std::net::SocketAddr>,
    {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let (replica, rpc_listener) = match (node.replica(), rpc_listener) {
            (Some(replica), Some(rpc_listener)) => (replica, rpc_listener),
            (Some(_), None) => anyhow::bail!("a cluster member needs an RPC listener"),
            (None, _) => return Ok(Replication { stop, task: None }),
        };
        let service = Arc::new(tidal_cluster::ReplicaService(replica.clone()));
        let secret = replica.spec().secret.clone();
        tracing::info!(addr = %rpc_listener.local_addr()?, "serving replication RPCs");
        let port = transport::rpc::RpcPort {
            conns: net.rpc_conns.clone(),
            idle_timeout: node.config().net.idle_timeout,
            tls,
        };
        let incoming = transport::rpc::accepted(rpc_listener, port, stopped.clone());
        let mut until_stopped = stopped;
        let task = tokio::spawn(async move {
            let until = async move {
                let _ = until_stopped.wait_for(|stop| *stop).await;
            };
            if let Err(error) = tidal_net::serve(service, &secret, incoming, until).await {
                tracing::error!("replication server failed: {error}");
            }
        });
        if let Err(why) = replica.start().await {
            let _ = stop.send(true);
            let closing = node.clone();
            tokio::task::spawn_blocking(tidal_types::activity::carry_awaiting_threads(move || {
                closing.shutdown()
            }))
            .await
            .context("shutdown task")?;
            anyhow::bail!("start the control plane: {why}");
        }
        Ok(Replication { stop, task: Some(task) })
    }
}

/// The node's background tasks while it serves: the checkpointer, the fatal watchdog, retention and
/// the status sampler of `GET /cluster/history`.
struct Background {
    checkpointer: (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>),
    watchdog: (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>),
    retention: (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>),
    history: (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>),
}

impl Background {
    fn start(node: &Arc<node::Node>, history: &Arc<http::history::History>) -> Background {
        let (checkpointer_stop, checkpointer_stopped) = tokio::sync::oneshot::channel();
        let (watchdog_stop, watchdog_stopped) = tokio::sync::oneshot::channel();
        let (retention_stop, retention_stopped) = tokio::sync::oneshot::channel();
        let (history_stop, history_stopped) = tokio::sync::oneshot::channel();
        Background {
            checkpointer: (checkpointer_stop, spawn_checkpointer(node.clone(), checkpointer_stopped)),
            watchdog: (watchdog_stop, spawn_fatal_watchdog(node.clone(), watchdog_stopped)),
            retention: (retention_stop, retention::spawn(node.clone(), retention_stopped)),
            history: (history_stop, http::history::spawn(node.clone(), history.clone(), history_stopped)),
        }
    }

    /// Stopped, not aborted: an abort leaves a checkpoint in flight on its blocking thread, which
    /// keeps the node (and its data dir) open past [`run_on`].
    async fn stop(self) {
        for (stop, task) in [self.checkpointer, self.watchdog, self.retention, self.history] {
            let _ = stop.send(());
            let _ = task.await;
        }
    }
}

/// Longest a stopping leader spends handing its office over before it stops anyway (a transfer takes
/// the voters' lease plus one election, well under a second on a healthy cluster).
const HANDOFF_DEADLINE: Duration = Duration::from_secs(10);

/// On a graceful stop of the serving leader: leadership transfer to the best voter first, so the
/// cluster elects in one round instead of after an election timeout (Kubernetes rolling restarts,
/// `systemctl stop`). Failure only costs that timeout, so it is logged, not fatal.
async fn hand_off_leadership(node: &node::Node) {
    let Some(replica) = node.replica().filter(|_| node.config().handoff_on_stop) else { return };
    match tokio::time::timeout(HANDOFF_DEADLINE, replica.hand_off_for_shutdown()).await {
        Ok(Ok(Some(report))) => {
            tracing::info!(new_leader = ?report.new_leader, ms = report.elapsed.as_millis() as u64, "stopping: {}", report.action)
        }
        Ok(Ok(None)) => {}
        Ok(Err(error)) => tracing::warn!("stopping without handing leadership over: {error}"),
        Err(_) => tracing::warn!(
            "stopping without handing leadership over: no new leader within {HANDOFF_DEADLINE:?}"
        ),
    }
}

/// Serves HTTP until the caller's `shutdown`, or `grace` after a fatal fault (decisions/059: out
/// of office at once, `/healthz` failing meanwhile). After a fatal fault the connections get a
/// bounded drain: the node exits whatever they do.
async fn serve_http<H>(
    listener: H,
    router: axum::Router,
    port: transport::http::HttpPort,
    fatal: &tidal_cluster::Fatal,
    grace: Duration,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    H: Listener<Addr = std::net::SocketAddr>,
{
    let stop_serving = {
        let fatal = fatal.clone();
        async move {
            tokio::select! {
                () = shutdown => {}
                reason = fatal.raised() => {
                    tracing::error!("stopping in {grace:?} after a {reason}");
                    tokio::time::sleep(grace).await;
                }
            }
        }
    };
    let serving = transport::http::serve(listener, router, port, stop_serving);
    let drain_deadline = async {
        let _ = fatal.raised().await;
        tokio::time::sleep(grace + FATAL_HTTP_DRAIN).await;
    };
    tokio::select! {
        served = serving => served,
        () = drain_deadline => {
            tracing::warn!("HTTP connections still open {FATAL_HTTP_DRAIN:?} into the stop after a fatal fault; closing them");
            Ok(())
        }
    }
}

/// The clean stop: the control plane and the RPC server stop, the WAL drains, the engine
/// checkpoints, and the node is waited for until its data dir is free. Returns a fatal fault the
/// stop itself raised.
async fn stop(
    node: Arc<node::Node>,
    replication: Replication,
    data_dir: &std::path::Path,
) -> anyhow::Result<Option<tidal_cluster::FatalReason>> {
    if let Some(replica) = node.replica() {
        replica.stop().await;
    }
    let _ = replication.stop.send(true);
    if let Some(task) = replication.task {
        let _ = task.await;
    }
    tracing::info!("shutting down: draining the WAL writer");
    let closing = node.clone();
    tokio::task::spawn_blocking(tidal_types::activity::carry_awaiting_threads(move || closing.shutdown()))
        .await
        .context("shutdown task")?;
    let release = node.take_release();
    let fatal = node.fatal_state().get();
    drop(node);
    if let Some(release) = release {
        wait_for_release(release, data_dir).await;
    }
    Ok(fatal)
}

/// How often the watchdog asks the sources no event reports (the engine's flusher, fjall's
/// workers) whether they failed.
const FATAL_POLL: Duration = Duration::from_millis(100);
/// After a fatal fault and its grace, how long open HTTP connections may take to finish.
const FATAL_HTTP_DRAIN: Duration = Duration::from_secs(2);
/// How long each step of the stop after a fatal fault may take (openraft, the RPC server, the WAL
/// and the applier): the node exits whatever is stuck on a failing disk.
const FATAL_STOP_STEP: Duration = Duration::from_secs(5);

/// What `run` returns after a fatal storage fault (decisions/059); `tidal serve` exits with
/// [`FATAL_EXIT_CODE`] on it.
#[derive(Debug, thiserror::Error)]
#[error("{0}; the node stopped (restart it: it recovers from what is on disk)")]
pub struct FatalExit(pub tidal_cluster::FatalReason);

/// The exit status of `tidal serve` after a fatal storage fault.
pub const FATAL_EXIT_CODE: i32 = 3;

/// The stop after a fatal fault: the replica is out of office already (`watch_fatal`); openraft
/// and the RPC server stop, the WAL and the applier are stopped without writing anything more to
/// the engine, each step bounded. The node is not waited for (the process exits).
async fn stop_after_fatal(
    node: Arc<node::Node>,
    replication: Replication,
    fatal: tidal_cluster::FatalReason,
) -> anyhow::Error {
    if let Some(replica) = node.replica() {
        if tokio::time::timeout(FATAL_STOP_STEP, replica.stop()).await.is_err() {
            tracing::warn!("the control plane did not stop within {FATAL_STOP_STEP:?}");
        }
    }
    let _ = replication.stop.send(true);
    if let Some(task) = replication.task {
        if tokio::time::timeout(FATAL_STOP_STEP, task).await.is_err() {
            tracing::warn!("the replication server did not stop within {FATAL_STOP_STEP:?}");
        }
    }
    let closing = node.clone();
    let stopping = tokio::task::spawn_blocking(tidal_types::activity::carry_awaiting_threads(move || {
        closing.stop_after_fatal()
    }));
    if tokio::time::timeout(FATAL_STOP_STEP, stopping).await.is_err() {
        tracing::warn!("the WAL writer and the applier did not stop within {FATAL_STOP_STEP:?}");
    }
    tracing::error!("exiting after a {fatal}");
    FatalExit(fatal).into()
}

/// Asks the node's fatal sources every [`FATAL_POLL`] (the cheap ones are asked at every request
/// too, and the WAL, a vote and openraft raise it themselves) until stopped or a fault is raised.
fn spawn_fatal_watchdog(
    node: Arc<node::Node>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(FATAL_POLL) => {}
                _ = &mut stop => return,
            }
            let asking = node.clone();
            match tidal_cluster::blocking::blocking(move || asking.check_fatal()).await {
                Ok(None) => {}
                Ok(Some(_)) => return,
                Err(error) => tracing::warn!("the fatal watchdog's check failed: {error}"),
            }
        }
    })
}

/// How long a stopping node waits for the tasks that still hold it (a connection being torn down,
/// a replication task winding down) before it returns with its data dir still open.
const RELEASE_WAIT: Duration = Duration::from_secs(30);

/// Returns once the node and its engine are dropped, so whoever opens the data dir next (a restart
/// in this process) finds it free; a real process exit releases it anyway.
async fn wait_for_release(release: std::sync::mpsc::Receiver<()>, data_dir: &std::path::Path) {
    let waited = tokio::task::spawn_blocking(move || release.recv_timeout(RELEASE_WAIT)).await;
    if let Ok(Err(std::sync::mpsc::RecvTimeoutError::Timeout)) = waited {
        tracing::warn!(
            data_dir = %data_dir.display(),
            "the node is still held {RELEASE_WAIT:?} after shutdown; returning with its data dir open"
        );
    }
}

/// How often the checkpointer looks at the byte bounds (issue 43). At 40 MB/s of engine writes
/// (a full signal ingest here) a bound is passed by at most 10 MB before it is seen.
const CHECKPOINT_POLL: Duration = Duration::from_millis(250);

/// The checkpointer: every [`CHECKPOINT_POLL`] it asks [`node::checkpoints::checkpoint_due`] whether
/// the interval or a byte bound calls for a checkpoint, and runs it off the async workers.
fn spawn_checkpointer(
    node: Arc<node::Node>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) -> tokio::task::JoinHandle<()> {
    let config = node.config();
    let bounds = node::checkpoints::CheckpointBounds {
        interval: Duration::from_millis(config.checkpoint_interval_ms.max(100)),
        engine_bytes_max: config.checkpoint_engine_bytes_max,
        wal_bytes_max: config.checkpoint_wal_bytes_max,
    };
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(CHECKPOINT_POLL.min(bounds.interval));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        let mut last = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = &mut stop => return,
            }
            let since = last.elapsed();
            let node = node.clone();
            let checkpoint = move || {
                let due = node::checkpoints::checkpoint_due(&bounds, &node.past_checkpoint(since));
                due.map(|reason| node.checkpoint_and_purge(reason).map(|()| reason)).transpose()
            };
            match tidal_cluster::blocking::blocking(checkpoint).await {
                Ok(Ok(None)) => continue,
                Ok(Ok(Some(reason))) => tracing::debug!(reason = reason.label(), "checkpoint"),
                Ok(Err(error)) => tracing::error!("failed to checkpoint: {error:#}"),
                Err(error) => tracing::error!("failed to checkpoint: {error}"),
            }
            last = tokio::time::Instant::now();
        }
    })
}
