//! Snapshot catch-up over real gRPC on loopback: a follower behind the leader's purge point installs
//! the leader's snapshot (same digest at S), its WAL continues at S + 1, a crash in the middle of
//! the install is resumed at restart, and a bad snapshot changes nothing.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use tidal_cluster::snapshot::{simulate_interrupted_install, INSTALL_PENDING_FILE};
use tidal_cluster::{
    install_snapshot, pending_install_position, resume_pending_install, InstallError, InstallOutcome,
    InstallProgress, SnapshotPins, SnapshotSource,
};
use tidal_core::{encode_payload, EngineConfig, Envelope, Records, SignalEvent, TidalDb};
use tidal_net::{
    ChunkStream, Handler, Peer, Pull, Ship, ShipAnswer, SnapshotChunk, SnapshotRequest, SnapshotStream,
};
use tidal_types::{NodeId, Seqno, Term, TermSeqno};
use tidal_wal::{AppendRequest, Batch, NoopHook, StdIo, SystemClock, Wal, WalConfig};

const SECRET: &str = "secret-secret";
const CLUSTER: &str = "snap-cluster";
const DIM: u32 = 8;
const T0: u64 = 1_700_000_000_000;

/// One node's engine and WAL in `dir` (state/ and wal/, as tidal-server lays them out).
struct Node {
    db: Arc<TidalDb>,
    wal: Wal,
}

fn open(dir: &Path, node: u64) -> Node {
    let config = EngineConfig { node_actor: (node, 1), ..EngineConfig::with_dimension(DIM) };
    let db = Arc::new(TidalDb::open(&dir.join("state"), config).unwrap());
    let mut wal_config = WalConfig::new(dir.join("wal"));
    // Small segments, so a purge can remove most of the log.
    wal_config.segment_bytes_max = 256 * 1024;
    let (wal, _) = Wal::open(wal_config, Arc::new(StdIo), Arc::new(SystemClock), Box::new(NoopHook)).unwrap();
    Node { db, wal }
}

impl Node {
    /// The leader's write path, compressed: append (sequencing) then apply what was appended.
    fn write(&self, records: Records) {
        let encoded = encode_payload(
            &Envelope { time_ms: T0, principal: "test".into(), idempotency_key: String::new() },
            &records,
        );
        let request =
            AppendRequest { kind: encoded.kind, event_count: encoded.event_count, payload: encoded.payload };
        let appended = self.wal.append_blocking(request).unwrap();
        for batch in self.wal.read_from(appended.first).unwrap() {
            self.db.apply(&batch.unwrap()).unwrap();
        }
    }

    fn write_items(&self, items: std::ops::Range<u64>) {
        for item in items {
            // 8 KiB of metadata per item, so the snapshot spans several 1 MiB chunks.
            let metadata = format!(r#"{{"n":{item},"pad":"{}"}}"#, "x".repeat(8 * 1024));
            self.write(Records::ItemMetadata { item, metadata: metadata.into_bytes() });
            let vector: Vec<f32> = (0..DIM).map(|d| ((item * 31 + u64::from(d)) % 17) as f32 - 8.0).collect();
            self.write(Records::ItemEmbedding { item, vector });
            if item % 10 == 0 {
                let events = (0..20)
                    .map(|n| SignalEvent {
                        user: format!("u{}", n % 7),
                        item: item.saturating_sub(n % 5),
                        kind: "click".into(),
                        weight: 1.0,
                        ts_ms: None,
                    })
                    .collect();
                self.write(Records::Signals(events));
            }
        }
    }

    /// Batches after `after` in this node's WAL.
    fn batches_after(&self, after: Seqno) -> Vec<Batch> {
        self.wal.read_from(after.next()).unwrap().map(|batch| batch.unwrap()).collect()
    }

    /// A follower's receive path, compressed: append byte-identical batches, then apply them.
    fn receive(&self, batches: Vec<Batch>) {
        self.wal.append_replicated_blocking(batches.clone()).unwrap();
        for batch in &batches {
            self.db.apply(batch).unwrap();
        }
    }
}

/// The leader's replication service, reduced to what this test needs: snapshots.
struct Leader {
    snapshots: SnapshotSource,
}

#[tidal_net::async_trait]
impl Handler for Leader {
    fn cluster_id(&self) -> &str {
        CLUSTER
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
        self.snapshots.serve(request)
    }
}

async fn serve(handler: impl Handler) -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let handler = Arc::new(handler);
    tokio::spawn(async move {
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tidal_net::serve(handler, SECRET, incoming, async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    (address, stop)
}

/// A leader with 300 items written over two terms and its WAL purged up to its checkpoint.
fn leader(dir: &Path) -> Node {
    let a = open(dir, 1);
    a.wal.set_term(Term(1));
    a.write_items(0..150);
    a.wal.set_term(Term(2));
    a.write_items(150..300);
    a.db.negatives_add("u1", 7).unwrap();
    let checkpoint = a.db.checkpoint().unwrap();
    let report = a.wal.purge_below(checkpoint.next()).unwrap();
    assert!(report.segments_removed >= 3, "{report:?}");
    assert!(a.wal.read_from(Seqno(1)).is_err(), "the start of the log is purged");
    a
}

fn digest(node: &Node) -> (Seqno, [u8; 32]) {
    node.db.digest().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_behind_the_purge_point_installs_the_snapshot_and_continues_from_the_log() {
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = leader(dir_a.path());
    let pins = SnapshotPins::default();
    let snapshots = SnapshotSource::new(a.db.clone(), a.wal.clone(), dir_a.path(), pins.clone()).unwrap();
    let (address, _stop) = serve(Leader { snapshots }).await;
    let peer = Peer::connect_lazy(&address, SECRET, CLUSTER).unwrap();
    let b = open(dir_b.path(), 2);
    b.db.negatives_add("u1", 8).unwrap();
    let s = a.db.applied_seqno();
    let mut progress: Vec<InstallProgress> = Vec::new();
    {
        tracing::info!("b, with an empty log, installs a's snapshot");
        let outcome = install_snapshot(&peer, NodeId(2), &b.wal, &b.db, None, dir_b.path(), &mut |step| {
            progress.push(step)
        })
        .await
        .unwrap();
        let InstallOutcome::Installed(report) = outcome else { panic!("not installed: {outcome:?}") };
        let position = TermSeqno { term: Term(2), seqno: s };
        assert_eq!(report.position, position);
        assert_eq!(digest(&b), digest(&a), "same digest at the same seqno");
        assert_eq!(b.db.negatives("u1").unwrap(), vec![7, 8], "negatives merged");
        assert_eq!(b.wal.last_position(), position);
        assert_eq!(b.wal.purged(), position);
        assert_eq!(b.wal.term_history(), a.wal.term_history());
        assert!(!dir_b.path().join(INSTALL_PENDING_FILE).exists());
        let last = progress.last().unwrap();
        assert_eq!((last.received_bytes, last.total_bytes), (report.bytes, report.bytes));
        assert!(progress.windows(2).all(|pair| pair[0].received_bytes < pair[1].received_bytes));
        assert!(progress.len() > 1, "streamed in several chunks: {} bytes", report.bytes);
        tracing::info!(bytes = report.bytes, elapsed = ?report.elapsed, "installed");
    }
    {
        tracing::info!("a's purge horizon stays pinned at S + 1 until b matched S");
        assert_eq!(pins.purge_horizon(Seqno(u64::MAX), Instant::now()), s.next());
        pins.follower_matched(NodeId(2), s);
        assert_eq!(pins.purge_horizon(Seqno(u64::MAX), Instant::now()), Seqno(u64::MAX));
    }
    {
        tracing::info!("a writes on; b's WAL continues at S + 1 with a's batches");
        a.write_items(300..320);
        let batches = a.batches_after(s);
        assert_eq!(batches[0].first_seqno(), s.next());
        b.receive(batches);
        assert_eq!(digest(&b), digest(&a));
        assert_eq!(b.wal.last_position(), a.wal.last_position());
    }
    {
        tracing::info!("b holds a's next snapshot position with its term: not needed");
        let outcome =
            install_snapshot(&peer, NodeId(2), &b.wal, &b.db, None, dir_b.path(), &mut |_| {}).await.unwrap();
        assert!(matches!(outcome, InstallOutcome::NotNeeded { .. }), "{outcome:?}");
        assert_eq!(digest(&b), digest(&a));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_in_the_middle_of_an_install_is_resumed_at_restart() {
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = leader(dir_a.path());
    let snapshots =
        SnapshotSource::new(a.db.clone(), a.wal.clone(), dir_a.path(), SnapshotPins::default()).unwrap();
    let (address, _stop) = serve(Leader { snapshots }).await;
    let peer = Peer::connect_lazy(&address, SECRET, CLUSTER).unwrap();
    let s = a.db.applied_seqno();
    {
        tracing::info!("b has a log of its own and crashes half-way through replacing its state");
        let b = open(dir_b.path(), 2);
        b.wal.set_term(Term(1));
        b.write_items(1000..1010);
        simulate_interrupted_install(&peer, NodeId(2), &b.wal, &b.db, dir_b.path(), 500).await.unwrap();
        assert!(dir_b.path().join(INSTALL_PENDING_FILE).exists());
        assert!(b.db.install_incomplete());
        b.wal.shutdown();
        Arc::try_unwrap(b.db).ok().unwrap().simulate_crash();
    }
    let b = open(dir_b.path(), 2);
    {
        tracing::info!("at restart the marker is found and the install resumed: a's digest at S");
        assert!(b.db.install_incomplete());
        let pending = pending_install_position(dir_b.path()).unwrap();
        assert_eq!(pending, Some(TermSeqno { term: Term(2), seqno: s }));
        let report = tokio::task::block_in_place(|| resume_pending_install(dir_b.path(), &b.wal, &b.db))
            .unwrap()
            .unwrap();
        assert_eq!(report.position.seqno, s);
        assert!(!b.db.install_incomplete());
        assert_eq!(digest(&b), digest(&a));
        assert!(!dir_b.path().join(INSTALL_PENDING_FILE).exists());
        assert_eq!(pending_install_position(dir_b.path()).unwrap(), None);
        assert!(tokio::task::block_in_place(|| resume_pending_install(dir_b.path(), &b.wal, &b.db))
            .unwrap()
            .is_none());
    }
    {
        tracing::info!("b's log continues at S + 1");
        a.write_items(300..310);
        b.receive(a.batches_after(s));
        assert_eq!(digest(&b), digest(&a));
    }
}

/// Serves well-framed chunks of bytes that are not a snapshot.
struct Garbage;

#[tidal_net::async_trait]
impl Handler for Garbage {
    fn cluster_id(&self) -> &str {
        CLUSTER
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

    async fn snapshot(&self, _request: SnapshotRequest) -> Result<SnapshotStream, tidal_net::ServiceError> {
        let position = TermSeqno { term: Term(5), seqno: Seqno(100_000) };
        let data: Vec<u8> = (0..3000u32).map(|i| (i * 7919 % 253) as u8).collect();
        let chunks = data
            .chunks(1000)
            .enumerate()
            .map(|(i, data)| {
                Ok(SnapshotChunk {
                    position,
                    history: (i == 0).then(|| vec![TermSeqno { term: Term(5), seqno: Seqno(1) }]),
                    offset: i as u64 * 1000,
                    total_bytes: 3000,
                    data: data.to_vec(),
                    last: i == 2,
                })
            })
            .collect::<Vec<_>>();
        Ok(Box::pin(tokio_stream::iter(chunks)))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_snapshot_or_a_wrong_secret_changes_nothing() {
    let dir_b = tempfile::tempdir().unwrap();
    let b = open(dir_b.path(), 2);
    b.wal.set_term(Term(1));
    b.write_items(0..20);
    let before = (digest(&b), b.wal.last_position(), b.wal.purged());
    let (address, _stop) = serve(Garbage).await;
    {
        tracing::info!("garbage bytes are refused before anything is touched");
        let peer = Peer::connect_lazy(&address, SECRET, CLUSTER).unwrap();
        let error = install_snapshot(&peer, NodeId(2), &b.wal, &b.db, None, dir_b.path(), &mut |_| {})
            .await
            .unwrap_err();
        assert!(matches!(error, InstallError::Snapshot(_)), "{error}");
    }
    {
        tracing::info!("a wrong secret is refused by the server");
        let peer = Peer::connect_lazy(&address, "wrong-secret", CLUSTER).unwrap();
        let error = install_snapshot(&peer, NodeId(2), &b.wal, &b.db, None, dir_b.path(), &mut |_| {})
            .await
            .unwrap_err();
        assert!(matches!(error, InstallError::Net(_)), "{error}");
    }
    assert_eq!((digest(&b), b.wal.last_position(), b.wal.purged()), before);
    assert!(!dir_b.path().join(INSTALL_PENDING_FILE).exists());
    assert!(!b.db.install_incomplete());
    b.write_items(20..25);
}
