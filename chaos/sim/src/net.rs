//! The node's transport seams over turmoil's simulated TCP: a listener for `tidal_server::run_on`
//! and a connector for replication and control-plane peers.

use std::net::SocketAddr;
use std::time::Duration;
use tidal_net::connector::BoxStream;

/// Port of every node's HTTP API.
pub const HTTP_PORT: u16 = 7070;
/// Port of every node's replication RPCs.
pub const RPC_PORT: u16 = 9090;

/// A turmoil listener as the node's [`tidal_server::Listener`].
pub struct SimListener(pub turmoil::net::TcpListener);

impl tidal_server::Listener for SimListener {
    type Io = turmoil::net::TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.0.accept().await {
                Ok(accepted) => return accepted,
                Err(error) => {
                    tracing::debug!("simulated accept failed: {error}");
                    // Back-off between retries of a failed accept (simulated time).
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

/// Binds a simulated listener on `port` of the current host.
pub async fn bind(port: u16) -> std::io::Result<SimListener> {
    let listener = turmoil::net::TcpListener::bind((std::net::IpAddr::from([0u8, 0, 0, 0]), port)).await?;
    Ok(SimListener(listener))
}

/// Dials peers over turmoil's network (`host:port`, resolved by turmoil's DNS).
pub fn connector() -> tidal_net::Connector {
    tidal_net::Connector::new(|address: String| {
        Box::pin(async move {
            let stream = turmoil::net::TcpStream::connect(address.as_str()).await?;
            Ok(Box::new(stream) as BoxStream)
        })
    })
}
