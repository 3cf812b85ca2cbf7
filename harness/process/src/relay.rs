//! A TCP relay for one directed link A→B: node A dials the relay instead of B's RPC address, and the
//! relay forwards bytes both ways. [`Relay::cut`] drops every live connection and refuses new ones
//! (accepted and closed at once, so the dialer fails fast instead of waiting for a timeout);
//! [`Relay::restore`] forwards again.
//!
//! A gRPC connection carries the dialer's requests AND their answers, so cutting A→B stops A's
//! calls to B; B's calls to A ride the relay B→A. Cutting a node off is cutting both directions
//! of each of its links.

use std::net::SocketAddr;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// One directed link's relay. Dropping it stops it and drops its connections.
pub struct Relay {
    address: SocketAddr,
    target: SocketAddr,
    cut: watch::Sender<bool>,
    accept: JoinHandle<()>,
}

impl Relay {
    /// Listens on a fresh loopback port and forwards every connection to `target`.
    pub async fn start(target: SocketAddr) -> anyhow::Result<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let (cut, _) = watch::channel(false);
        let accept = tokio::spawn(accept_loop(listener, target, cut.clone()));
        Ok(Relay { address, target, cut, accept })
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

async fn accept_loop(listener: TcpListener, target: SocketAddr, cut: watch::Sender<bool>) {
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
        tokio::spawn(async move {
            let Ok(outbound) = TcpStream::connect(target).await else {
                return; // the target is down: the dialer sees its connection closed
            };
            forward(inbound, outbound, &mut on_cut).await;
        });
    }
}

async fn forward(mut inbound: TcpStream, mut outbound: TcpStream, on_cut: &mut watch::Receiver<bool>) {
    // Replication latency matters to the tests' deadlines; do not let Nagle batch small frames.
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
        // A cut (or the relay dropped: the sender is gone) ends the connection; dropping both
        // sockets closes them.
        _ = on_cut.wait_for(|cut| *cut) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

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
