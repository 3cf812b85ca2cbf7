//! [`Load`]: writers that put items with unique ids through every node, each write carrying an
//! Idempotency-Key, and the ledger of what was acknowledged.
//!
//! Each writer sticks to one node while it answers, and moves to the next node when a write to it
//! fails, as a client with a list of nodes would; so a node that cannot serve costs a writer one
//! timeout, not one per write. A write whose outcome is unknown (timeout, connection cut, a node
//! that answered with an error) is retried with the same id and key on the next node, a few times;
//! then it is abandoned and counted as unknown. Only a 2xx reply with a seqno enters the ledger: those are the writes the
//! cluster promised to keep.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tidal_client::Client;
use tokio::sync::RwLock;

/// A write gives up after this long (its outcome is then unknown).
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);
/// Attempts of one write (each on the next node) before it is abandoned.
const ATTEMPTS: usize = 4;
/// Pause between attempts, so a cluster without a leader is not asked thousands of times a second.
const RETRY_PAUSE: Duration = Duration::from_millis(50);
/// Bound on any one writer's writes, so the loop ends even if nothing stops it.
const WRITES_PER_WRITER_MAX: u64 = 10_000_000;

/// One acknowledged write.
#[derive(Clone, Copy, Debug)]
pub struct Ack {
    pub id: u64,
    pub seqno: u64,
    pub at: Instant,
}

/// The writers' shared state.
pub struct Load {
    clients: Vec<Client>,
    tag: String,
    acks: Mutex<Vec<Ack>>,
    next_id: AtomicU64,
    unknown: AtomicU64,
    stop: AtomicBool,
    /// Writers hold it shared for each attempt; [`Load::pause`] takes it exclusively, so the
    /// digests can be compared while nothing is written.
    gate: RwLock<()>,
}

impl Load {
    /// A load through the nodes at `bases`; `tag` makes the idempotency keys unique to the run.
    pub fn new(bases: &[String], tag: &str) -> Arc<Load> {
        Arc::new(Load {
            clients: bases
                .iter()
                .map(|base| Client::with_timeout(base.clone(), None, WRITE_TIMEOUT))
                .collect(),
            tag: tag.to_string(),
            acks: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(1),
            unknown: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            gate: RwLock::new(()),
        })
    }

    /// Starts `writers` writer tasks.
    pub fn spawn(self: &Arc<Load>, writers: usize) -> Vec<tokio::task::JoinHandle<()>> {
        (0..writers)
            .map(|writer| {
                let load = self.clone();
                tokio::spawn(async move { load.write_until_stopped(writer).await })
            })
            .collect()
    }

    async fn write_until_stopped(&self, writer: usize) {
        let mut node = writer % self.clients.len();
        for _ in 0..WRITES_PER_WRITER_MAX {
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            if !self.write(writer, &mut node, id).await {
                self.unknown.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Writes item `id`, starting at node index `node` and moving on at each failure, until a node
    /// acknowledges it (true) or the attempts run out (false).
    async fn write(&self, writer: usize, node: &mut usize, id: u64) -> bool {
        let key = format!("netchaos-{}-{id}", self.tag);
        let metadata = serde_json::json!({ "id": id, "writer": writer });
        for _ in 0..ATTEMPTS {
            let client = &self.clients[*node % self.clients.len()];
            let reply = {
                let _open = self.gate.read().await;
                client.put_item(id, metadata.clone(), Some(&key)).await
            };
            if let Ok(reply) = reply {
                self.ledger().push(Ack { id, seqno: reply.seqno, at: Instant::now() });
                return true;
            }
            *node = (*node + 1) % self.clients.len();
            if self.stop.load(Ordering::Relaxed) {
                return false;
            }
            tokio::time::sleep(RETRY_PAUSE).await;
        }
        false
    }

    /// Holds every writer back (after their writes in flight end) until the guard is dropped.
    pub async fn pause(&self) -> tokio::sync::RwLockWriteGuard<'_, ()> {
        self.gate.write().await
    }

    /// Tells the writers to stop after their current write.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// A copy of the acknowledged writes so far.
    pub fn acks(&self) -> Vec<Ack> {
        self.ledger().clone()
    }

    /// Writes abandoned with an unknown outcome.
    pub fn unknown(&self) -> u64 {
        self.unknown.load(Ordering::Relaxed)
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Vec<Ack>> {
        self.acks.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
