//! The node's two listening ports: how many connections each keeps and which it closes to make
//! room ([`conns`]), how long a connection may idle, and TLS ([`tls`]). [`http`] serves the axum
//! router; [`rpc`] hands tonic its accepted connections.

pub mod conns;
pub mod http;
pub mod rpc;
pub mod tls;

use std::path::PathBuf;
use std::time::Duration;

/// The bounds and TLS of both ports (config keys in parentheses; defaults in docs/OPERATIONS.md).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetConfig {
    /// Most connections the HTTP port keeps (`http_connections_max`, 1,024).
    pub http_connections_max: usize,
    /// Most connections the RPC port keeps (`rpc_connections_max`, 256).
    pub rpc_connections_max: usize,
    /// How long a connection may wait before delivering a complete request head, counted from when
    /// it opened or finished its previous reply; on the RPC port, how long it may stay without
    /// proving itself (`idle_timeout_ms`, 60 s).
    pub idle_timeout: Duration,
    /// How long a request body may take to arrive once its head has (`body_timeout_ms`, 30 s).
    pub body_timeout: Duration,
    /// Bytes of request bodies being read at once, over all connections; a request that would pass
    /// it is refused with 503 `overloaded` (`inflight_body_bytes_max`, 256 MiB).
    pub inflight_body_bytes_max: usize,
    /// TLS on both ports (`tls_cert`, `tls_key`, `tls_ca`, `tls_peer_auth`), or none.
    pub tls: Option<tls::TlsFiles>,
}

impl Default for NetConfig {
    fn default() -> NetConfig {
        NetConfig {
            http_connections_max: 1024,
            rpc_connections_max: 256,
            idle_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(30),
            inflight_body_bytes_max: 256 * 1024 * 1024,
            tls: None,
        }
    }
}

/// The TLS keys of the config file and command line, before they are checked.
#[derive(Clone, Debug, Default)]
pub struct TlsKeys {
    /// `tls_cert`.
    pub cert: Option<PathBuf>,
    /// `tls_key`.
    pub key: Option<PathBuf>,
    /// `tls_ca`.
    pub ca: Option<PathBuf>,
    /// `tls_peer_auth`.
    pub peer_auth: bool,
}

impl TlsKeys {
    /// The TLS files, if any: a certificate needs its key and the reverse; peer authentication
    /// needs TLS and a CA.
    pub fn resolve(self) -> anyhow::Result<Option<tls::TlsFiles>> {
        match (self.cert, self.key) {
            (Some(cert), Some(key)) => {
                anyhow::ensure!(
                    !self.peer_auth || self.ca.is_some(),
                    "tls_peer_auth needs tls_ca, the cluster CA"
                );
                Ok(Some(tls::TlsFiles { cert, key, ca: self.ca, peer_auth: self.peer_auth }))
            }
            (None, None) => {
                anyhow::ensure!(!self.peer_auth, "tls_peer_auth needs tls_cert and tls_key");
                anyhow::ensure!(self.ca.is_none(), "tls_ca needs tls_cert and tls_key");
                Ok(None)
            }
            _ => anyhow::bail!("tls_cert and tls_key go together: give both or neither"),
        }
    }
}

/// The node's TLS, loaded once at start and reloaded together ([`tls::spawn_reload`]).
#[derive(Default)]
pub struct Tls {
    files: Option<tls::TlsFiles>,
    /// The HTTP port's server side.
    pub http: Option<std::sync::Arc<tls::TlsServer>>,
    /// The RPC port's server side.
    pub rpc: Option<std::sync::Arc<tls::TlsServer>>,
    /// How this node dials its peers' RPC ports.
    pub peers: Option<std::sync::Arc<tls::TlsClient>>,
    /// How a follower's forwarding client verifies the leader's HTTP port.
    pub forward: Option<rustls::ClientConfig>,
}

impl Tls {
    /// Reads the TLS files of `config` (none: no TLS) and, on a cluster member, makes its peer
    /// connector dial over TLS.
    pub fn load(config: &mut crate::config::ServeConfig) -> anyhow::Result<Tls> {
        let Some(files) = config.net.tls.clone() else {
            return Ok(Tls::default());
        };
        let mut loaded = Tls {
            http: Some(tls::TlsServer::http(&files)?),
            rpc: None,
            peers: None,
            forward: files.ca.as_deref().map(tls::http_client_config).transpose()?,
            files: Some(files.clone()),
        };
        if config.cluster.is_some() {
            anyhow::ensure!(
                files.ca.is_some(),
                "a cluster member with TLS needs tls_ca (the cluster CA) to verify its peers"
            );
            let peers = tls::TlsClient::new(&files)?;
            config.io.connector = config.io.connector.clone().with_connect_of(&peers.connector());
            loaded.rpc = Some(tls::TlsServer::rpc(&files)?);
            loaded.peers = Some(peers);
        }
        Ok(loaded)
    }

    /// Reloads every part on SIGHUP or a changed file until the returned sender is set.
    pub fn spawn_reload(&self) -> Option<(tokio::sync::watch::Sender<bool>, tokio::task::JoinHandle<()>)> {
        let files = self.files.clone()?;
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let (http, rpc, peers) = (self.http.clone(), self.rpc.clone(), self.peers.clone());
        let reload = move || {
            if let Some(http) = &http {
                http.reload()?;
            }
            if let Some(rpc) = &rpc {
                rpc.reload()?;
            }
            if let Some(peers) = &peers {
                peers.reload()?;
            }
            Ok(())
        };
        Some((stop, tls::spawn_reload(files, reload, stopped)))
    }
}

/// The state both ports share with the HTTP layer: their connection tables and the in-flight body
/// budget.
pub struct NetState {
    /// The HTTP port's connections.
    pub http_conns: std::sync::Arc<conns::Conns>,
    /// The RPC port's connections.
    pub rpc_conns: std::sync::Arc<conns::Conns>,
    /// Request body bytes being read now, over all connections: one permit per byte.
    pub body_budget: std::sync::Arc<tokio::sync::Semaphore>,
    /// The budget's size.
    pub body_budget_max: usize,
    /// How long a body may take to arrive.
    pub body_timeout: Duration,
}

impl NetState {
    /// The tables and budget of `net`.
    pub fn new(net: &NetConfig) -> NetState {
        NetState {
            http_conns: conns::Conns::new("http", net.http_connections_max),
            rpc_conns: conns::Conns::new("rpc", net.rpc_connections_max),
            body_budget: std::sync::Arc::new(tokio::sync::Semaphore::new(net.inflight_body_bytes_max)),
            body_budget_max: net.inflight_body_bytes_max,
            body_timeout: net.body_timeout,
        }
    }

    /// The ports' gauges and counters in Prometheus text.
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write as _;
        use std::sync::atomic::Ordering::Relaxed;
        let _ = writeln!(out, "# HELP tidal_connections_open Connections a port holds open.");
        let _ = writeln!(out, "# TYPE tidal_connections_open gauge");
        for conns in [&self.http_conns, &self.rpc_conns] {
            let _ = writeln!(out, "tidal_connections_open{{port=\"{}\"}} {}", conns.port(), conns.open());
        }
        let _ = writeln!(
            out,
            "# HELP tidal_connections_evicted_total Idle connections closed to make room for a new one."
        );
        let _ = writeln!(out, "# TYPE tidal_connections_evicted_total counter");
        for conns in [&self.http_conns, &self.rpc_conns] {
            let _ = writeln!(
                out,
                "tidal_connections_evicted_total{{port=\"{}\"}} {}",
                conns.port(),
                conns.evicted.load(Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP tidal_connections_refused_total Connections refused: every slot busy or trusted."
        );
        let _ = writeln!(out, "# TYPE tidal_connections_refused_total counter");
        for conns in [&self.http_conns, &self.rpc_conns] {
            let _ = writeln!(
                out,
                "tidal_connections_refused_total{{port=\"{}\"}} {}",
                conns.port(),
                conns.refused.load(Relaxed)
            );
        }
        let in_use = self.body_budget_max.saturating_sub(self.body_budget.available_permits());
        let _ = writeln!(out, "# HELP tidal_http_inflight_body_bytes Request body bytes being read now.");
        let _ = writeln!(out, "# TYPE tidal_http_inflight_body_bytes gauge");
        let _ = writeln!(out, "tidal_http_inflight_body_bytes {in_use}");
    }
}
