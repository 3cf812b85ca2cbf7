//! The real tonic stack on loopback: a ship and a pull round trip, and calls without the secret or
//! for another cluster are refused before the handler sees them.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tidal_net::{Chunk, ChunkOutcome, ChunkStream, Handler, Peer, Pull, Ship, ShipAnswer, ShipOutcome};
use tidal_types::{NodeId, RecordKind, Seqno, Term, TermSeqno};
use tidal_wal::Batch;
use tokio_stream::StreamExt;

struct Echo {
    calls: AtomicUsize,
}

#[tonic::async_trait]
impl Handler for Echo {
    fn cluster_id(&self) -> &str {
        "test-cluster"
    }

    async fn ship(&self, ship: Ship) -> Result<ShipAnswer, tidal_net::ServiceError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(common::matched_answer(&ship))
    }

    async fn pull(&self, pull: Pull) -> Result<ChunkStream, tidal_net::ServiceError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let chunks: Vec<Result<Chunk, tidal_net::ServiceError>> = (0..3u64)
            .map(|i| {
                let first = pull.from.seqno.get() + 1 + i;
                Ok(Chunk {
                    term: Term(1),
                    leader: NodeId(1),
                    baseline: TermSeqno::default(),
                    commit: Seqno(first),
                    outcome: ChunkOutcome::Batches {
                        prev: TermSeqno { term: Term(1), seqno: Seqno(first - 1) },
                        batches: vec![Batch::new(
                            RecordKind::ItemDelete,
                            Term(1),
                            Seqno(first),
                            1,
                            &[0u8; 18],
                        )],
                    },
                })
            })
            .collect();
        Ok(Box::pin(tokio_stream::iter(chunks)))
    }

    async fn nudge(&self, _reason: String) -> Result<bool, tidal_net::ServiceError> {
        Ok(true)
    }
}

async fn start() -> (String, Arc<Echo>, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let handler = Arc::new(Echo { calls: AtomicUsize::new(0) });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = handler.clone();
    tokio::spawn(async move {
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tidal_net::serve(serving, "secret-secret", incoming, async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    (address, handler, stop)
}

fn ship() -> Ship {
    Ship {
        cluster_id: "test-cluster".into(),
        term: Term(1),
        leader: NodeId(1),
        prev: TermSeqno::default(),
        commit: Seqno(0),
        baseline: TermSeqno::default(),
        batches: vec![Batch::new(RecordKind::Signal, Term(1), Seqno(1), 3, &[7u8; 40])],
    }
}

#[tokio::test]
async fn ship_and_pull_round_trip() {
    let (address, handler, _stop) = start().await;
    let peer = Peer::connect_lazy(&address, "secret-secret", "test-cluster").unwrap();
    let answer = peer.ship(&ship()).await.unwrap();
    assert_eq!(answer.outcome, ShipOutcome::Matched(TermSeqno { term: Term(1), seqno: Seqno(3) }));
    let pull = Pull {
        cluster_id: "test-cluster".into(),
        term: Term(1),
        node: NodeId(2),
        from: TermSeqno { term: Term(1), seqno: Seqno(3) },
        chunk_bytes_max: 1 << 20,
    };
    let chunks: Vec<Chunk> =
        peer.pull(&pull, Duration::from_secs(5)).await.unwrap().map(|c| c.unwrap()).collect().await;
    assert_eq!(chunks.len(), 3);
    assert_eq!(chunks[2].commit, Seqno(6));
    assert_eq!(handler.calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn wrong_secret_or_cluster_never_reaches_the_handler() {
    let (address, handler, _stop) = start().await;
    let wrong_secret = Peer::connect_lazy(&address, "guess", "test-cluster").unwrap();
    let error = wrong_secret.ship(&ship()).await.unwrap_err();
    assert!(
        matches!(&error, tidal_net::NetError::Status(s) if s.code() == tonic::Code::Unauthenticated),
        "{error}"
    );
    let wrong_cluster = Peer::connect_lazy(&address, "secret-secret", "other").unwrap();
    let mut other = ship();
    other.cluster_id = "other".into();
    let error = wrong_cluster.ship(&other).await.unwrap_err();
    assert!(
        matches!(&error, tidal_net::NetError::Status(s) if s.code() == tonic::Code::PermissionDenied),
        "{error}"
    );
    assert_eq!(handler.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_dead_peer_fails_within_the_deadline() {
    let address = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().to_string()
    };
    let peer = Peer::connect_lazy(&address, "secret-secret", "test-cluster").unwrap();
    assert!(peer.ship(&ship()).await.is_err());
}

/// The simulation's seam: a tap sees each ship once its answer is back and may send a copy through
/// the untapped peer; the caller gets its own answer, the copy reaches the server as a separate
/// request, and the copy does not reach the tap again.
#[tokio::test]
async fn a_ship_tap_sees_each_ship_and_its_copies_bypass_it() {
    struct CopyOnce {
        seen: AtomicUsize,
        answers: tokio::sync::mpsc::UnboundedSender<Result<ShipAnswer, String>>,
    }
    impl tidal_net::ShipTap for CopyOnce {
        fn shipped(&self, untapped: &Peer, ship: &Ship) {
            self.seen.fetch_add(1, Ordering::SeqCst);
            let (peer, copy, answers) = (untapped.clone(), ship.clone(), self.answers.clone());
            tokio::spawn(async move {
                let _ = answers.send(peer.ship(&copy).await.map_err(|error| error.to_string()));
            });
        }
    }
    let (address, handler, _stop) = start().await;
    let (answers, mut copies) = tokio::sync::mpsc::unbounded_channel();
    let tap = Arc::new(CopyOnce { seen: AtomicUsize::new(0), answers });
    let connector = tidal_net::Connector::tcp().with_ship_tap(tap.clone());
    let peer = Peer::connect_lazy_with(&address, "secret-secret", "test-cluster", &connector).unwrap();
    let answer = peer.ship(&ship()).await.unwrap();
    assert_eq!(answer.outcome, ShipOutcome::Matched(TermSeqno { term: Term(1), seqno: Seqno(3) }));
    let copy = copies.recv().await.unwrap().unwrap();
    assert_eq!(copy, answer, "the copy is the same request");
    assert_eq!(handler.calls.load(Ordering::SeqCst), 2, "the original and its copy");
    assert_eq!(tap.seen.load(Ordering::SeqCst), 1, "the copy went around the tap");
}

/// The same seam for pulls: each chunk goes through the tap, which hands the puller what it
/// returns (here every chunk twice), in order; the server streamed each chunk once.
#[tokio::test]
async fn a_ship_tap_sees_each_pulled_chunk_and_may_add_copies() {
    struct Twice {
        seen: AtomicUsize,
    }
    impl tidal_net::ShipTap for Twice {
        fn shipped(&self, _untapped: &Peer, _ship: &Ship) {}
        fn pulled(&self, _address: &str, chunk: Chunk) -> Vec<Chunk> {
            self.seen.fetch_add(1, Ordering::SeqCst);
            vec![chunk.clone(), chunk]
        }
    }
    let (address, handler, _stop) = start().await;
    let tap = Arc::new(Twice { seen: AtomicUsize::new(0) });
    let connector = tidal_net::Connector::tcp().with_ship_tap(tap.clone());
    let peer = Peer::connect_lazy_with(&address, "secret-secret", "test-cluster", &connector).unwrap();
    let pull = Pull {
        cluster_id: "test-cluster".into(),
        term: Term(1),
        node: NodeId(2),
        from: TermSeqno { term: Term(1), seqno: Seqno(3) },
        chunk_bytes_max: 1 << 20,
    };
    let chunks: Vec<Chunk> =
        peer.pull(&pull, Duration::from_secs(5)).await.unwrap().map(|c| c.unwrap()).collect().await;
    let commits: Vec<u64> = chunks.iter().map(|chunk| chunk.commit.get()).collect();
    assert_eq!(commits, [4, 4, 5, 5, 6, 6]);
    assert_eq!(tap.seen.load(Ordering::SeqCst), 3);
    assert_eq!(handler.calls.load(Ordering::SeqCst), 1, "one pull on the wire");
}
