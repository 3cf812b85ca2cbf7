//! A TCP relay for one directed link A→B: node A dials the relay instead of B's RPC address, and the
//! relay forwards bytes both ways. [`Relay::cut`] drops every live connection and refuses new ones
//! (accepted and closed at once, so the dialer fails fast instead of waiting for a timeout);
//! [`Relay::restore`] forwards again.
//!
//! A gRPC connection carries the dialer's requests AND their answers, so cutting A→B stops A's
//! calls to B; B's calls to A ride the relay B→A. Cutting a node off is cutting both directions
//! of each of its links.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// One directed link's relay. Dropping it stops it and drops its connections.
pub struct Relay {
    address: SocketAddr,
    target: SocketAddr,
    cut: watch::Sender<bool>,
    /// Bytes forwarded, both directions, every connection.
    bytes: Arc<AtomicU64>,
    accept: JoinHandle<()>,
}

/// Copy buffer per direction of a connection.
const PUMP_BUFFER_BYTES: usize = 64 * 1024;

impl Relay {
    /// Listens on a fresh loopback port and forwards every connection to `target`.
    pub async fn start(target: SocketAddr) -> anyhow::Result<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let (cut, _) = watch::channel(false);
        let bytes = Arc::new(AtomicU64::new(0));
        let accept = tokio::spawn(accept_loop(listener, target, cut.clone(), bytes.clone()));
        Ok(Relay { address, target, cut, bytes, accept })
    }

    /// Bytes forwarded so far (both directions, every connection): shows that a node dials its
    /// peer through this relay for a given kind of traffic.
    pub fn bytes_forwarded(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Where the dialing node connects.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Where the relay forwards to.
    pub fn target(&self) -> SocketAddr {
        self.target
    }

    /// Stops forwarding: live connections are dropped, new ones closed on accept.
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Forwards again.
    pub fn restore(&self) {
        self.cut.send_replace(false);
    }

    /// Whether the link is cut.
    pub fn is_cut(&self) -> bool {
        *self.cut.borrow()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut.send_replace(true);
        self.accept.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    cut: watch::Sender<bool>,
    bytes: Arc<AtomicU64>,
) {
    loop {
        let inbound = match listener.accept().await {
            Ok((inbound, _)) => inbound,
            Err(error) => {
                // EMFILE and friends: drop nothing, try again on the next connection.
                tracing::warn!("relay to {target}: failed to accept: {error}");
                tokio::task::yield_now().await;
                continue;
            }
        };
        // Subscribe before looking, so a cut that lands in between is still seen by the connection.
        let mut on_cut = cut.subscribe();
        if *on_cut.borrow_and_update() {
            drop(inbound);
            continue;
        }
        let bytes = bytes.clone();
        tokio::spawn(async move {
            let Ok(outbound) = TcpStream::connect(target).await else {
                return; // the target is down: the dialer sees its connection closed
            };
            forward(inbound, outbound, &mut on_cut, &bytes).await;
        });
    }
}

async fn forward(
    inbound: TcpStream,
    outbound: TcpStream,
    on_cut: &mut watch::Receiver<bool>,
    bytes: &AtomicU64,
) {
    // Replication latency matters to the tests' deadlines; do not let Nagle batch small frames.
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (inbound_read, inbound_write) = inbound.into_split();
    let (outbound_read, outbound_write) = outbound.into_split();
    tokio::select! {
        _ = async { tokio::join!(pump(inbound_read, outbound_write, bytes), pump(outbound_read, inbound_write, bytes)) } => {}
        // A cut (or the relay dropped: the sender is gone) ends the connection; dropping both
        // halves of both sockets closes them.
        _ = on_cut.wait_for(|cut| *cut) => {}
    }
}

/// Copies one direction until EOF (then half-closes the other side) or an error.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, bytes: &AtomicU64) {
    let mut buffer = vec![0u8; PUMP_BUFFER_BYTES];
    loop {
        match from.read(&mut buffer).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(read) => {
                // Counted before it is written, so a reader that got the bytes sees them counted.
                bytes.fetch_add(read as u64, Ordering::Relaxed);
                if to.write_all(&buffer[..read]).await.is_err() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut read, mut write) = socket.split();
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                });
            }
        });
        address
    }

    async fn round_trip(stream: &mut TcpStream, message: &[u8]) -> std::io::Result<Vec<u8>> {
        stream.write_all(message).await?;
        let mut back = vec![0u8; message.len()];
        stream.read_exact(&mut back).await?;
        Ok(back)
    }

    #[tokio::test]
    async fn forwards_until_cut_then_refuses_until_restored() {
        let relay = Relay::start(echo_server().await).await.unwrap();
        let mut live = TcpStream::connect(relay.address()).await.unwrap();
        assert_eq!(round_trip(&mut live, b"hello").await.unwrap(), b"hello");
        assert_eq!(relay.bytes_forwarded(), 10, "5 bytes each way");

        relay.cut();
        assert!(relay.is_cut());
        // The live connection is dropped by the relay: the read ends (EOF or reset), no echo.
        let mut buffer = [0u8; 8];
        let read = live.read(&mut buffer).await;
        assert!(matches!(read, Ok(0) | Err(_)), "a cut link still delivered: {read:?}");
        // A new connection is accepted and closed at once.
        let mut fresh = TcpStream::connect(relay.address()).await.unwrap();
        assert!(round_trip(&mut fresh, b"again").await.is_err(), "a cut link forwarded a new connection");

        relay.restore();
        let mut after = TcpStream::connect(relay.address()).await.unwrap();
        assert_eq!(round_trip(&mut after, b"back").await.unwrap(), b"back");
    }
}
