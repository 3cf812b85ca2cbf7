//! How a [`crate::Peer`] reaches its address: [`Connector::tcp`] (the OS's TCP, the production
//! default) or any function that opens a byte stream to `host:port`. The simulation hands in one
//! over its simulated network, so the same client code runs there.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite};

/// A connected byte stream.
pub trait Stream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Stream for T {}

/// A boxed connected stream.
pub type BoxStream = Box<dyn Stream>;
/// The future a connect function returns.
pub type ConnectFuture = Pin<Box<dyn Future<Output = io::Result<BoxStream>> + Send>>;
pub(crate) type ConnectFn = dyn Fn(String) -> ConnectFuture + Send + Sync;

/// Opens connections to peers.
#[derive(Clone, Default)]
pub struct Connector {
    /// `None`: the OS's TCP through tonic's own connector (socket options included).
    custom: Option<Arc<ConnectFn>>,
    /// Simulation only ([`Connector::with_ship_tap`]); `None` in production.
    ship_tap: Option<Arc<dyn ShipTap>>,
    /// Simulation only ([`Connector::with_control_tap`]); `None` in production.
    control_tap: Option<Arc<dyn ControlTap>>,
}

/// A simulation seam (chaos/sim's duplicated and reordered delivery; production never sets
/// one): sees every ship a [`crate::Peer`] of this connector sent, once its answer (or error) is
/// back, and may send copies of it again later through `untapped` (the same peer without the tap)
/// as separate requests. The caller of [`crate::Peer::ship`] never sees those copies or their
/// answers: its own ship and answer are unchanged.
///
/// The same tap sees every chunk of a pull ([`ShipTap::pulled`]) and may hand the puller copies
/// with it: a chunk twice, or a chunk held from an earlier pull of the same peer.
pub trait ShipTap: Send + Sync + 'static {
    /// `ship` was sent to `untapped.address()` and answered (or failed).
    fn shipped(&self, untapped: &crate::Peer, ship: &crate::Ship);

    /// A chunk of a pull from `address` arrived: what the puller receives in its place, in order.
    /// The chunk itself must be among them (the tap adds copies, it never drops or alters what
    /// the server sent). The default hands over the chunk alone.
    fn pulled(&self, address: &str, chunk: crate::Chunk) -> Vec<crate::Chunk> {
        let _ = address;
        vec![chunk]
    }
}

/// A simulation seam for the control plane (chaos/sim's duplicated and reordered delivery of
/// openraft's RPCs and of the office probe; production never sets one), of the same kind as
/// [`ShipTap`]: sees every openraft RPC ([`crate::Peer::raft`]) and every probe
/// ([`crate::Peer::probe`]) a peer of this connector sent, once its answer (or error) is back, and
/// may send copies of it again later through `untapped` (the same peer without the tap) as separate
/// requests. The caller never sees those copies or their answers: its own call and answer are
/// unchanged.
pub trait ControlTap: Send + Sync + 'static {
    /// The openraft RPC `call` was sent to `untapped.address()` with `timeout` and answered (or
    /// failed).
    fn raft_sent(&self, untapped: &crate::Peer, call: &crate::RaftCall, timeout: std::time::Duration);

    /// `probe` was sent to `untapped.address()` with `timeout` and answered (or failed). The
    /// default does nothing.
    fn probed(&self, untapped: &crate::Peer, probe: &crate::Probe, timeout: std::time::Duration) {
        let _ = (untapped, probe, timeout);
    }
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(if self.custom.is_some() { "Connector(custom)" } else { "Connector(tcp)" })?;
        if self.ship_tap.is_some() {
            formatter.write_str("+ship_tap")?;
        }
        if self.control_tap.is_some() {
            formatter.write_str("+control_tap")?;
        }
        Ok(())
    }
}

impl Connector {
    /// The OS's TCP (what production uses).
    pub fn tcp() -> Connector {
        Connector { custom: None, ship_tap: None, control_tap: None }
    }

    /// This connector with `other`'s way of opening connections (its taps stay).
    pub fn with_connect_of(mut self, other: &Connector) -> Connector {
        self.custom = other.custom.clone();
        self
    }

    /// Connections opened by `connect`, called with the peer's `host:port`.
    pub fn new<F>(connect: F) -> Connector
    where
        F: Fn(String) -> ConnectFuture + Send + Sync + 'static,
    {
        Connector { custom: Some(Arc::new(connect)), ship_tap: None, control_tap: None }
    }

    /// The same connector whose peers report every ship to `tap` (simulation only, see
    /// [`ShipTap`]).
    pub fn with_ship_tap(mut self, tap: Arc<dyn ShipTap>) -> Connector {
        self.ship_tap = Some(tap);
        self
    }

    pub(crate) fn ship_tap(&self) -> Option<Arc<dyn ShipTap>> {
        self.ship_tap.clone()
    }

    /// The same connector whose peers report every openraft RPC and probe to `tap` (simulation
    /// only, see [`ControlTap`]).
    pub fn with_control_tap(mut self, tap: Arc<dyn ControlTap>) -> Connector {
        self.control_tap = Some(tap);
        self
    }

    pub(crate) fn control_tap(&self) -> Option<Arc<dyn ControlTap>> {
        self.control_tap.clone()
    }

    /// The connect function, if not the OS's TCP.
    pub(crate) fn connect_fn(&self) -> Option<Arc<ConnectFn>> {
        self.custom.clone()
    }

    pub(crate) fn custom(&self) -> Option<Service> {
        self.custom.clone().map(Service)
    }
}

/// The connect function as the tower service tonic's channel calls with the endpoint's URI.
#[derive(Clone)]
pub(crate) struct Service(Arc<ConnectFn>);

impl tower_service::Service<tonic::codegen::http::Uri> for Service {
    type Response = hyper_util::rt::TokioIo<BoxStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: tonic::codegen::http::Uri) -> Self::Future {
        let connect = self.0.clone();
        Box::pin(async move {
            let authority = uri.authority().map(|authority| authority.to_string()).ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, format!("peer uri {uri} has no host:port"))
            })?;
            let stream = connect(authority).await?;
            Ok(hyper_util::rt::TokioIo::new(stream))
        })
    }
}

/// An accepted stream for [`crate::serve`] when the transport is not tonic's own TCP listener. Its
/// connection info is the [`Proof`] the server calls once a request on it carried the cluster
/// secret (the accepting side uses that to protect proven connections from eviction).
pub struct Accepted<T>(pub T, pub Proof);

/// Told once a connection carried a request with the cluster secret.
#[derive(Clone, Default)]
pub struct Proof(Option<Arc<dyn Fn() + Send + Sync>>);

impl Proof {
    /// A proof that calls `proven` (possibly many times: once per request that carried the secret).
    pub fn new(proven: impl Fn() + Send + Sync + 'static) -> Proof {
        Proof(Some(Arc::new(proven)))
    }

    /// The connection proved itself.
    pub fn proven(&self) {
        if let Some(proven) = &self.0 {
            proven();
        }
    }
}

impl<T> tonic::transport::server::Connected for Accepted<T> {
    type ConnectInfo = Proof;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.1.clone()
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Accepted<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Accepted<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
