//! The HTTP port: accepts connections under the port's cap ([`super::conns`]), optionally wraps
//! them in TLS, and serves the axum router on each over hyper's HTTP/1.1 with a deadline on every
//! request head.
//!
//! Why not `axum::serve`: it gives no hold on a connection, so it can neither cap them, nor time
//! out one that sends nothing (hyper's header-read timer needs a timer that `axum::serve` does not
//! set), nor close the idle ones to make room.

use super::conns::{Admitted, BusyGuard, Conns};
use super::tls::TlsServer;
use axum::body::Body;
use axum::extract::ConnectInfo;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tower_service::Service as _;

/// What the HTTP port applies to every connection.
#[derive(Clone)]
pub struct HttpPort {
    /// The port's connection table.
    pub conns: Arc<Conns>,
    /// How long a connection may take to deliver a complete request head, counted from when it
    /// opened or finished its previous reply: both the idle keep-alive bound and the slow-header one.
    pub idle_timeout: Duration,
    /// TLS, when configured.
    pub tls: Option<Arc<TlsServer>>,
}

/// Serves `router` on `listener` until `stop` resolves; then stops accepting, asks every
/// connection to finish its request in flight and close, and returns once all have.
pub async fn serve<L>(
    mut listener: L,
    router: axum::Router,
    port: HttpPort,
    stop: impl Future<Output = ()> + Send,
) -> std::io::Result<()>
where
    L: axum::serve::Listener<Addr = SocketAddr>,
{
    let (close, closing) = tokio::sync::watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    tokio::pin!(stop);
    loop {
        let (io, remote) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut stop => break,
        };
        while connections.try_join_next().is_some() {}
        let Some(admitted) = port.conns.admit() else {
            continue;
        };
        let connection = Connection { admitted, remote, port: port.clone(), closing: closing.clone() };
        connections.spawn(connection.serve(io, router.clone()));
    }
    drop(listener);
    let _ = close.send(true);
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// One accepted connection.
struct Connection {
    admitted: Admitted,
    remote: SocketAddr,
    port: HttpPort,
    closing: tokio::sync::watch::Receiver<bool>,
}

impl Connection {
    async fn serve<IO>(self, io: IO, router: axum::Router)
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let io: tidal_net::BoxStream = match &self.port.tls {
            None => Box::new(io),
            // The handshake counts against the same deadline as a request head.
            Some(tls) => match tokio::time::timeout(self.port.idle_timeout, tls.accept(io)).await {
                Ok(Ok(stream)) => Box::new(stream),
                Ok(Err(error)) => {
                    tracing::debug!(remote = %self.remote, "TLS handshake failed: {error}");
                    return;
                }
                Err(_) => return,
            },
        };
        let admitted = Arc::new(self.admitted);
        let slot = admitted.slot.clone();
        let remote = self.remote;
        let held = admitted.clone();
        let service =
            hyper::service::service_fn(move |mut request: axum::http::Request<hyper::body::Incoming>| {
                let busy = slot.begin();
                request.extensions_mut().insert(ConnectInfo(remote));
                if request.uri().path() == tidal_types::link::LINK_PATH {
                    // A write link outlives the HTTP connection it upgrades: it keeps its place in
                    // the port's table, busy, until it ends.
                    let hold = (held.clone(), slot.begin());
                    request.extensions_mut().insert(crate::http::link::ConnHold(Arc::new(hold)));
                }
                let mut router = router.clone();
                async move {
                    let response = router.call(request).await?;
                    Ok::<_, Infallible>(response.map(|body| Body::new(Tracked { body, _busy: busy })))
                }
            });
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(self.port.idle_timeout);
        let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(io), service).with_upgrades();
        tokio::pin!(conn);
        let mut closing = self.closing;
        let mut asked_to_close = false;
        loop {
            tokio::select! {
                served = conn.as_mut() => {
                    if let Err(error) = served {
                        tracing::debug!(remote = %remote, "HTTP connection ended: {error}");
                    }
                    return;
                }
                () = admitted.slot.evicted(), if !asked_to_close => {
                    asked_to_close = true;
                    conn.as_mut().graceful_shutdown();
                }
                _ = closing.wait_for(|closing| *closing), if !asked_to_close => {
                    asked_to_close = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// A reply body that keeps its connection busy (not evictable) until it is sent or dropped: a
/// stream subscription is a request in flight for as long as it streams.
struct Tracked {
    body: Body,
    _busy: BusyGuard,
}

impl http_body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
