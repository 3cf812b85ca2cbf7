//! What the ship tests share: a handler that matches every ship (and can hold one), a server on a
//! fresh loopback port, and ships of one small batch.
#![allow(dead_code)] // each test binary uses its own share of these
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tidal_net::{ChunkStream, Handler, Pull, ServiceRefusal, Ship, ShipAnswer, ShipOutcome};
use tidal_types::{NodeId, RecordKind, Seqno, Term, TermSeqno};
use tidal_wal::Batch;

/// The cluster secret of every test server here.
pub const SECRET: &str = "secret-secret";

/// Answers each ship with the position of its last batch, counting ships and refusals; a ship whose
/// first seqno is `hold_at` waits until `release` is notified.
#[derive(Default)]
pub struct Matcher {
    pub ships: AtomicUsize,
    pub wrong_secret: AtomicUsize,
    pub hold_at: u64,
    pub release: tokio::sync::Notify,
}

#[tonic::async_trait]
impl Handler for Matcher {
    fn cluster_id(&self) -> &str {
        "test-cluster"
    }

    fn refused(&self, why: ServiceRefusal) {
        if why == ServiceRefusal::WrongSecret {
            self.wrong_secret.fetch_add(1, Ordering::SeqCst);
        }
    }

    async fn ship(&self, ship: Ship) -> Result<ShipAnswer, tidal_net::ServiceError> {
        self.ships.fetch_add(1, Ordering::SeqCst);
        if ship.batches.first().is_some_and(|b| b.first_seqno().get() == self.hold_at) {
            self.release.notified().await;
        }
        Ok(matched_answer(&ship))
    }

    async fn pull(&self, _pull: Pull) -> Result<ChunkStream, tidal_net::ServiceError> {
        Err(tidal_net::ServiceError::Unimplemented("no pulls here".into()))
    }

    async fn nudge(&self, _reason: String) -> Result<bool, tidal_net::ServiceError> {
        Ok(false)
    }
}

/// A server on a fresh port; it stops when the returned sender drops.
pub async fn start(hold_at: u64) -> (String, Arc<Matcher>, tokio::sync::oneshot::Sender<()>) {
    let (address, handler, stop, _served) = start_serving(hold_at).await;
    (address, handler, stop)
}

/// [`start`], with the server's task.
pub async fn start_serving(
    hold_at: u64,
) -> (String, Arc<Matcher>, tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let handler = Arc::new(Matcher { hold_at, ..Matcher::default() });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = handler.clone();
    let served = tokio::spawn(async move {
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tidal_net::serve(serving, SECRET, incoming, async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    (address, handler, stop, served)
}

/// A ship of one batch of 3 events at `first`.
pub fn ship_at(first: u64) -> Ship {
    Ship {
        cluster_id: "test-cluster".into(),
        term: Term(1),
        leader: NodeId(1),
        prev: TermSeqno { term: Term(1), seqno: Seqno(first - 1) },
        commit: Seqno(first - 1),
        baseline: TermSeqno::default(),
        batches: vec![Batch::new(RecordKind::Signal, Term(1), Seqno(first), 3, &[7u8; 40])],
    }
}

/// What the matcher answers to [`ship_at`]`(first)`.
pub fn matched(first: u64) -> ShipOutcome {
    ShipOutcome::Matched(TermSeqno { term: Term(1), seqno: Seqno(first + 2) })
}

/// The answer of a follower that holds everything `ship` brings: matched at its last batch (at its
/// `prev` for an empty ship), durable there, applied to the ship's commit.
pub fn matched_answer(ship: &Ship) -> ShipAnswer {
    let matched =
        ship.batches.last().map_or(ship.prev, |b| TermSeqno { term: b.term(), seqno: b.last_seqno() });
    ShipAnswer {
        term: ship.term,
        durable: matched.seqno,
        applied: ship.commit,
        outcome: ShipOutcome::Matched(matched),
    }
}
