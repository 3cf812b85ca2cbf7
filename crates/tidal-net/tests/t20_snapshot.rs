//! The Snapshot RPC over the real tonic stack on loopback: chunks arrive in order and checked, a
//! server that sends an inconsistent chunk is caught by the client's decoder, and calls without the
//! secret, for another cluster, or to a node that serves no snapshots are refused.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;
use tidal_net::{
    ChunkStream, Handler, NetError, Peer, Pull, Ship, ShipAnswer, SnapshotChunk, SnapshotRequest,
    SnapshotStream,
};
use tidal_types::{NodeId, Seqno, Term, TermSeqno};
use tokio_stream::StreamExt;

const SECRET: &str = "secret-secret";
const DEADLINE: Duration = Duration::from_secs(30);

/// Serves `data` as a snapshot at (2, 77), in chunks of `chunk` bytes; `broken` marks a middle
/// chunk as the last one.
struct Source {
    data: Vec<u8>,
    chunk: usize,
    broken: bool,
    serves: bool,
}

fn position() -> TermSeqno {
    TermSeqno { term: Term(2), seqno: Seqno(77) }
}

#[tonic::async_trait]
impl Handler for Source {
    fn cluster_id(&self) -> &str {
        "test-cluster"
    }

    async fn ship(&self, _ship: Ship) -> Result<ShipAnswer, tidal_net::ServiceError> {
        Err(tidal_net::ServiceError::Unimplemented("not in this test".into()))
    }

    async fn pull(&self, _pull: Pull) -> Result<ChunkStream, tidal_net::ServiceError> {
        Err(tidal_net::ServiceError::Unimplemented("not in this test".into()))
    }

    async fn nudge(&self, _reason: String) -> Result<bool, tidal_net::ServiceError> {
        Ok(false)
    }

    async fn snapshot(&self, request: SnapshotRequest) -> Result<SnapshotStream, tidal_net::ServiceError> {
        if !self.serves {
            return Err(tidal_net::ServiceError::Unimplemented("this node serves no snapshots".into()));
        }
        assert_eq!(request.node, NodeId(9));
        let total = self.data.len() as u64;
        let chunks: Vec<Result<SnapshotChunk, tidal_net::ServiceError>> = self
            .data
            .chunks(self.chunk)
            .enumerate()
            .map(|(i, data)| {
                let offset = (i * self.chunk) as u64;
                let end = offset + data.len() as u64;
                Ok(SnapshotChunk {
                    position: position(),
                    history: (offset == 0).then(|| {
                        vec![
                            TermSeqno { term: Term(1), seqno: Seqno(1) },
                            TermSeqno { term: Term(2), seqno: Seqno(50) },
                        ]
                    }),
                    offset,
                    total_bytes: total,
                    data: data.to_vec(),
                    last: end == total || (self.broken && i == 1),
                })
            })
            .collect();
        Ok(Box::pin(tokio_stream::iter(chunks)))
    }
}

async fn start(source: Source) -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tidal_net::serve(Arc::new(source), SECRET, incoming, async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    (address, stop)
}

fn data() -> Vec<u8> {
    (0..3_000_000u32).map(|i| (i % 251) as u8).collect()
}

#[tokio::test]
async fn a_snapshot_streams_in_checked_chunks() {
    let (address, _stop) = start(Source { data: data(), chunk: 1 << 20, broken: false, serves: true }).await;
    let peer = Peer::connect_lazy(&address, SECRET, "test-cluster").unwrap();
    let mut stream = Box::pin(peer.snapshot(NodeId(9), DEADLINE).await.unwrap());
    let mut received = Vec::new();
    let mut chunks = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.unwrap();
        assert_eq!(chunk.offset, received.len() as u64);
        assert_eq!(chunk.position, position());
        received.extend_from_slice(&chunk.data);
        chunks.push((chunk.history.is_some(), chunk.last));
    }
    assert_eq!(received, data());
    assert_eq!(chunks, vec![(true, false), (false, false), (false, true)]);
}

#[tokio::test]
async fn an_inconsistent_chunk_fails_the_stream_at_the_client() {
    let (address, _stop) = start(Source { data: data(), chunk: 1 << 20, broken: true, serves: true }).await;
    let peer = Peer::connect_lazy(&address, SECRET, "test-cluster").unwrap();
    let results: Vec<_> = peer.snapshot(NodeId(9), DEADLINE).await.unwrap().collect().await;
    assert!(results[0].is_ok());
    assert!(matches!(results[1], Err(NetError::Wire(_))), "{:?}", results[1].as_ref().err());
}

#[tokio::test]
async fn wrong_secret_other_cluster_and_no_snapshots_are_refused() {
    let (address, _stop) = start(Source { data: data(), chunk: 1 << 20, broken: false, serves: true }).await;
    let code = |result: Result<_, NetError>| match result {
        Err(NetError::Status(status)) => status.code(),
        other => panic!("expected a status, got {:?}", other.map(|_| ()).err()),
    };
    let wrong_secret = Peer::connect_lazy(&address, "other-secret", "test-cluster").unwrap();
    assert_eq!(
        code(wrong_secret.snapshot(NodeId(9), DEADLINE).await.map(|_| ())),
        tonic::Code::Unauthenticated
    );
    let other_cluster = Peer::connect_lazy(&address, SECRET, "other-cluster").unwrap();
    assert_eq!(
        code(other_cluster.snapshot(NodeId(9), DEADLINE).await.map(|_| ())),
        tonic::Code::PermissionDenied
    );
    let (address, _stop_too) =
        start(Source { data: data(), chunk: 1 << 20, broken: false, serves: false }).await;
    let peer = Peer::connect_lazy(&address, SECRET, "test-cluster").unwrap();
    assert_eq!(code(peer.snapshot(NodeId(9), DEADLINE).await.map(|_| ())), tonic::Code::Unimplemented);
}
