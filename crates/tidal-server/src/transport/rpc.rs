//! The RPC port's accepted connections, handed to tonic as a stream: each admitted under the
//! port's cap ([`super::conns`]), optionally through TLS, and closed if it neither proves itself
//! (a request with the cluster secret, or a peer certificate naming a node) within the idle
//! timeout nor escapes eviction.

use super::conns::{Admitted, Conns, Slot};
use super::tls::{peer_node_id, TlsServer};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tidal_net::{Accepted, BoxStream, Proof};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What the RPC port applies to every connection.
#[derive(Clone)]
pub struct RpcPort {
    /// The port's connection table.
    pub conns: Arc<Conns>,
    /// How long a connection may stay unproven (and how long its TLS handshake may take).
    pub idle_timeout: Duration,
    /// TLS, when configured.
    pub tls: Option<Arc<TlsServer>>,
}

/// The stream of connections tonic serves, until `stop` is set.
pub fn accepted<L: axum::serve::Listener>(
    mut listener: L,
    port: RpcPort,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> tokio_stream::wrappers::ReceiverStream<std::io::Result<Accepted<Guarded>>> {
    let (sender, receiver) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let (io, _) = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = stop.wait_for(|stop| *stop) => return,
            };
            let Some(admitted) = port.conns.admit() else {
                continue;
            };
            // Handshakes run beside the accept loop: a slow one must not hold up the next peer.
            let (sender, port) = (sender.clone(), port.clone());
            tokio::spawn(async move {
                if let Some(accepted) = handshake(io, admitted, &port).await {
                    let _ = sender.send(Ok(accepted)).await;
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(receiver)
}

/// TLS (when on) and the connection's guard. `None`: the handshake failed or timed out, or
/// mutual TLS is on and the certificate names no node.
async fn handshake<IO>(io: IO, admitted: Admitted, port: &RpcPort) -> Option<Accepted<Guarded>>
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let stream: BoxStream = match &port.tls {
        None => Box::new(io),
        Some(tls) => {
            let stream = match tokio::time::timeout(port.idle_timeout, tls.accept(io)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(error)) => {
                    tracing::warn!("refused an RPC connection: TLS handshake failed: {error}");
                    return None;
                }
                Err(_) => return None,
            };
            let certs = stream.get_ref().1.peer_certificates();
            match (certs.is_some(), peer_node_id(certs)) {
                (false, _) => {}
                (true, Some(node)) => {
                    tracing::debug!(node, "peer certificate names node {node}");
                    admitted.slot.trust();
                }
                (true, None) => {
                    tracing::warn!("refused an RPC connection: its certificate names no node (node-<id>)");
                    return None;
                }
            }
            Box::new(stream)
        }
    };
    let slot = admitted.slot.clone();
    let proof = Proof::new(move || slot.trust());
    let closed = Box::pin(closed(admitted.slot.clone(), port.idle_timeout));
    Some(Accepted(Guarded { stream, _admitted: admitted, closed }, proof))
}

/// Resolves when the connection must close: it was evicted, or it has not proved itself within
/// `idle_timeout` of being accepted.
async fn closed(slot: Arc<Slot>, idle_timeout: Duration) {
    let unproven = async {
        tokio::time::sleep(idle_timeout).await;
        if slot.is_trusted() {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        () = slot.evicted() => {}
        () = unproven => {}
    }
}

/// An accepted RPC connection that holds its slot, and fails its reads (so tonic closes it) once
/// it must close.
pub struct Guarded {
    stream: BoxStream,
    _admitted: Admitted,
    closed: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl AsyncRead for Guarded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.closed.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "closed: idle without the cluster secret, or evicted to make room",
            )));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
