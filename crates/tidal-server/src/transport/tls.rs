//! TLS for both ports (rustls with ring; no OpenSSL). The node's certificate and key serve the
//! HTTP port and the RPC port; the cluster CA verifies peers. With `tls_peer_auth` the RPC port
//! asks every peer for a certificate of the cluster CA that names a node (`node-<id>`), and a node
//! presents its own when it dials one.
//!
//! Files are read again on SIGHUP or when their modification time changes ([`spawn_reload`]): a
//! renewed certificate takes effect for new connections without a restart; a reload that fails
//! keeps the old configuration and says why.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

/// Where a node's TLS material lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The node's certificate chain (PEM).
    pub cert: PathBuf,
    /// The node's private key (PEM).
    pub key: PathBuf,
    /// The cluster CA (PEM): verifies peers' certificates. Required on a cluster member.
    pub ca: Option<PathBuf>,
    /// Mutual TLS between peers: the RPC port requires a client certificate naming a node.
    pub peer_auth: bool,
}

/// A TLS failure, naming the file it concerns.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or holds no usable PEM item.
    #[error("TLS file {path}: {why}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// rustls refused the material (a key that does not match its certificate, say).
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// ring, not aws-lc-rs: it builds with the C compiler alone (aws-lc-rs wants cmake), which keeps
/// `make test` working on a machine that has only Rust. rustls deprecates it for lacking
/// post-quantum key exchange; the classical suites it offers are the ones every peer speaks today.
#[allow(deprecated)]
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn file_error(path: &Path, why: impl std::fmt::Display) -> TlsError {
    TlsError::File { path: path.to_path_buf(), why: why.to_string() }
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, e))?;
    if certs.is_empty() {
        return Err(file_error(path, "no CERTIFICATE in it"));
    }
    Ok(certs)
}

/// The private key, from a file only its owner may read (like the token file and the secret).
fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let text =
        crate::auth::read_private_file(path, "TLS key").map_err(|e| file_error(path, format!("{e:#}")))?;
    PrivateKeyDer::from_pem_slice(text.as_bytes()).map_err(|e| file_error(path, e))
}

fn read_roots(path: &Path) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in read_certs(path)? {
        roots.add(cert).map_err(|e| file_error(path, e))?;
    }
    Ok(roots)
}

fn config_error(error: impl std::fmt::Display) -> TlsError {
    TlsError::Config(error.to_string())
}

/// The server side of one port.
fn server_config(files: &TlsFiles, verify_peers: bool, port: Port) -> Result<rustls::ServerConfig, TlsError> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(config_error)?;
    let builder = match (&files.ca, verify_peers) {
        (Some(ca), true) => {
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(read_roots(ca)?),
                provider(),
            )
            .build()
            .map_err(config_error)?;
            builder.with_client_cert_verifier(verifier)
        }
        (None, true) => return Err(TlsError::Config("tls_peer_auth needs tls_ca, the cluster CA".into())),
        (_, false) => builder.with_no_client_auth(),
    };
    let mut config =
        builder.with_single_cert(read_certs(&files.cert)?, read_key(&files.key)?).map_err(config_error)?;
    // Offer only what the port speaks: a client offered h2 on the HTTP port (curl takes it) would
    // speak HTTP/2 to a port that serves HTTP/1.1.
    config.alpn_protocols = match port {
        Port::Rpc => vec![b"h2".to_vec()],
        Port::Http => vec![b"http/1.1".to_vec()],
    };
    Ok(config)
}

/// The client side a node dials its peers with.
fn client_config(files: &TlsFiles) -> Result<rustls::ClientConfig, TlsError> {
    let ca =
        files.ca.as_ref().ok_or_else(|| TlsError::Config("a cluster member with TLS needs tls_ca".into()))?;
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(config_error)?
        .with_root_certificates(read_roots(ca)?);
    let mut config = if files.peer_auth {
        builder
            .with_client_auth_cert(read_certs(&files.cert)?, read_key(&files.key)?)
            .map_err(config_error)?
    } else {
        builder.with_no_client_auth()
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// How a node's HTTP client (a follower forwarding to its leader) verifies another node's HTTP
/// port: against the cluster CA.
pub fn http_client_config(ca: &Path) -> Result<rustls::ClientConfig, TlsError> {
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(config_error)?
        .with_root_certificates(read_roots(ca)?)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Which port a server configuration is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Port {
    Http,
    Rpc,
}

/// The TLS server of one port, reloadable.
pub struct TlsServer {
    files: TlsFiles,
    verify_peers: bool,
    port: Port,
    acceptor: RwLock<tokio_rustls::TlsAcceptor>,
}

impl TlsServer {
    /// The HTTP port's TLS (clients authenticate with tokens, not certificates).
    pub fn http(files: &TlsFiles) -> Result<Arc<TlsServer>, TlsError> {
        TlsServer::new(files, false, Port::Http)
    }

    /// The RPC port's TLS: peers must present a node certificate when `peer_auth` is on.
    pub fn rpc(files: &TlsFiles) -> Result<Arc<TlsServer>, TlsError> {
        TlsServer::new(files, files.peer_auth, Port::Rpc)
    }

    fn new(files: &TlsFiles, verify_peers: bool, port: Port) -> Result<Arc<TlsServer>, TlsError> {
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_config(files, verify_peers, port)?));
        Ok(Arc::new(TlsServer { files: files.clone(), verify_peers, port, acceptor: RwLock::new(acceptor) }))
    }

    /// Reads the files again; on failure the current configuration stays.
    pub fn reload(&self) -> Result<(), TlsError> {
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_config(
            &self.files,
            self.verify_peers,
            self.port,
        )?));
        *self.acceptor.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = acceptor;
        Ok(())
    }

    /// The server handshake on an accepted connection.
    pub async fn accept<IO>(&self, io: IO) -> std::io::Result<tokio_rustls::server::TlsStream<IO>>
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let acceptor = self.acceptor.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
        acceptor.accept(io).await
    }
}

/// The node a verified peer certificate names (`node-<id>` among its DNS names), if any. rustls
/// has verified the chain against the cluster CA already; this only reads the name.
pub fn peer_node_id(certs: Option<&[CertificateDer<'_>]>) -> Option<u64> {
    let leaf = certs?.first()?;
    let cert = webpki::EndEntityCert::try_from(leaf).ok()?;
    let found = cert.valid_dns_names().find_map(|name| name.strip_prefix("node-")?.parse::<u64>().ok());
    found
}

/// How a node dials its peers over TLS, reloadable like [`TlsServer`].
pub struct TlsClient {
    files: TlsFiles,
    config: RwLock<Arc<rustls::ClientConfig>>,
}

impl TlsClient {
    /// The peer-dialing side of `files`.
    pub fn new(files: &TlsFiles) -> Result<Arc<TlsClient>, TlsError> {
        Ok(Arc::new(TlsClient { files: files.clone(), config: RwLock::new(Arc::new(client_config(files)?)) }))
    }

    /// Reads the files again; on failure the current configuration stays.
    pub fn reload(&self) -> Result<(), TlsError> {
        let config = Arc::new(client_config(&self.files)?);
        *self.config.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = config;
        Ok(())
    }

    /// A connector for peers at `host:port`: TCP (no delay), then TLS verifying `host`.
    pub fn connector(self: &Arc<TlsClient>) -> tidal_net::Connector {
        let client = self.clone();
        tidal_net::Connector::new(move |address: String| {
            let config = client.config.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
            Box::pin(async move {
                let host = address.rsplit_once(':').map_or(address.as_str(), |(host, _)| host);
                let host = host.trim_start_matches('[').trim_end_matches(']');
                let name = rustls::pki_types::ServerName::try_from(host.to_string()).map_err(|e| {
                    std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("peer {address}: {e}"))
                })?;
                let tcp = tokio::net::TcpStream::connect(&address).await?;
                tcp.set_nodelay(true)?;
                let stream = tokio_rustls::TlsConnector::from(config).connect(name, tcp).await?;
                Ok(Box::new(stream) as tidal_net::BoxStream)
            })
        })
    }
}

/// Files' modification times, to notice a renewal.
fn stamps(files: &TlsFiles) -> Vec<Option<SystemTime>> {
    [Some(&files.cert), Some(&files.key), files.ca.as_ref()]
        .into_iter()
        .flatten()
        .map(|path| std::fs::metadata(path).and_then(|m| m.modified()).ok())
        .collect()
}

/// How often the files' modification times are checked.
const RELOAD_POLL: Duration = Duration::from_secs(5);

/// Reloads `reload` on SIGHUP or when a file of `files` changes, until `stop`.
pub fn spawn_reload(
    files: TlsFiles,
    reload: impl Fn() -> Result<(), TlsError> + Send + 'static,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(hangup) => Some(hangup),
            Err(error) => {
                tracing::warn!("no SIGHUP reload of the TLS files: {error}");
                None
            }
        };
        let mut seen = stamps(&files);
        loop {
            let why = tokio::select! {
                _ = async { hangup.as_mut()?.recv().await }, if hangup.is_some() => "SIGHUP",
                () = tokio::time::sleep(RELOAD_POLL) => {
                    let now = stamps(&files);
                    if now == seen { continue; }
                    seen = now;
                    "a changed file"
                }
                _ = stop.wait_for(|stop| *stop) => return,
            };
            match reload() {
                Ok(()) => tracing::info!(cert = %files.cert.display(), "reloaded the TLS files after {why}"),
                Err(error) => tracing::error!("kept the current TLS configuration after {why}: {error}"),
            }
        }
    })
}
