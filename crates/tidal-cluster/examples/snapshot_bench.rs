//! Snapshot throughput: cut, verify and install a state of N items with 128-dim embeddings (plus
//! users' profiles and seen sets), at the engine level and end to end over loopback gRPC.
//!
//! `cargo run --release -p tidal-cluster --example snapshot_bench -- [items]` (default 100000).
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use tidal_cluster::{install_snapshot, InstallOutcome, SnapshotPins, SnapshotSource};
use tidal_core::snapshot::read_snapshot;
use tidal_core::{encode_payload, EngineConfig, Envelope, Records, SignalEvent, TidalDb};
use tidal_net::{ChunkStream, Handler, Peer, Pull, Ship, ShipAnswer, SnapshotRequest, SnapshotStream};
use tidal_types::{NodeId, Seqno, Term};
use tidal_wal::{Batch, NoopHook, StdIo, SystemClock, Wal, WalConfig};

const DIM: u32 = 128;
const USERS: u64 = 10_000;
const SECRET: &str = "bench-secret";

struct Node {
    db: Arc<TidalDb>,
    wal: Wal,
}

fn open(dir: &Path, node: u64) -> Node {
    let config = EngineConfig { node_actor: (node, 1), ..EngineConfig::with_dimension(DIM) };
    let db = Arc::new(TidalDb::open(&dir.join("state"), config).unwrap());
    let (wal, _) = Wal::open(
        WalConfig::new(dir.join("wal")),
        Arc::new(StdIo),
        Arc::new(SystemClock),
        Box::new(NoopHook),
    )
    .unwrap();
    Node { db, wal }
}

/// Writes `items` items (metadata + embedding) and a signal per item through the WAL (replicated
/// appends of prebuilt batches, 1,000 per fsync) and applies them.
fn fill(node: &Node, items: u64) {
    let mut next = 1u64;
    let mut pending = Vec::new();
    let mut push = |records: Records, pending: &mut Vec<Batch>| {
        let envelope = Envelope {
            time_ms: 1_700_000_000_000 + next,
            principal: "bench".into(),
            idempotency_key: String::new(),
        };
        let encoded = encode_payload(&envelope, &records);
        pending.push(Batch::new(encoded.kind, Term(1), Seqno(next), encoded.event_count, &encoded.payload));
        next += u64::from(encoded.event_count);
    };
    let flush = |pending: &mut Vec<Batch>| {
        let batches = std::mem::take(pending);
        if batches.is_empty() {
            return;
        }
        node.wal.append_replicated_blocking(batches.clone()).unwrap();
        for batch in &batches {
            node.db.apply(batch).unwrap();
        }
    };
    for item in 0..items {
        push(
            Records::ItemMetadata { item, metadata: format!(r#"{{"title":"item {item}"}}"#).into_bytes() },
            &mut pending,
        );
        let vector: Vec<f32> =
            (0..DIM).map(|d| ((item * 131 + u64::from(d) * 7) % 1000) as f32 / 500.0 - 1.0).collect();
        push(Records::ItemEmbedding { item, vector }, &mut pending);
        if item % 1000 == 999 {
            let events = (item - 999..=item)
                .map(|i| SignalEvent {
                    user: format!("user{}", i % USERS),
                    item: i,
                    kind: "click".into(),
                    weight: 1.0,
                    ts_ms: None,
                })
                .collect();
            push(Records::Signals(events), &mut pending);
            flush(&mut pending);
        }
    }
    flush(&mut pending);
}

struct Leader(SnapshotSource);

#[tidal_net::async_trait]
impl Handler for Leader {
    fn cluster_id(&self) -> &str {
        "bench"
    }
    async fn ship(&self, _ship: Ship) -> Result<ShipAnswer, tidal_net::ServiceError> {
        Err(tidal_net::ServiceError::Unimplemented("bench".into()))
    }
    async fn pull(&self, _pull: Pull) -> Result<ChunkStream, tidal_net::ServiceError> {
        Err(tidal_net::ServiceError::Unimplemented("bench".into()))
    }
    async fn nudge(&self, _reason: String) -> Result<bool, tidal_net::ServiceError> {
        Ok(false)
    }
    async fn snapshot(&self, request: SnapshotRequest) -> Result<SnapshotStream, tidal_net::ServiceError> {
        self.0.serve(request)
    }
}

fn mib_per_s(bytes: u64, started: Instant) -> f64 {
    bytes as f64 / (1024.0 * 1024.0) / started.elapsed().as_secs_f64()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let items: u64 = std::env::args().nth(1).map_or(100_000, |arg| arg.parse().unwrap());
    let root = tempfile::tempdir_in(std::env::var("BENCH_DIR").unwrap_or_else(|_| ".".into())).unwrap();
    let (dir_a, dir_b, dir_c) = (root.path().join("a"), root.path().join("b"), root.path().join("c"));
    let a = open(&dir_a, 1);
    let started = Instant::now();
    fill(&a, items);
    a.db.checkpoint().unwrap();
    println!(
        "filled {items} items, {} users, applied {} in {:?}",
        a.db.stats().users,
        a.db.applied_seqno(),
        started.elapsed()
    );

    let file = root.path().join("cut.snap");
    let started = Instant::now();
    let out = std::io::BufWriter::new(std::fs::File::create(&file).unwrap());
    let (info, _) = a.db.export_snapshot(out, |seqno| a.wal.term_at(seqno)).unwrap();
    println!(
        "export:  {:>7.1} MiB, {} entries, {:?}, {:.0} MiB/s",
        info.bytes as f64 / 1048576.0,
        info.entries,
        started.elapsed(),
        mib_per_s(info.bytes, started)
    );

    let started = Instant::now();
    let reader = std::io::BufReader::with_capacity(256 * 1024, std::fs::File::open(&file).unwrap());
    read_snapshot(reader, DIM, &mut |_, _, _| Ok(())).unwrap();
    println!("verify:  {:?}, {:.0} MiB/s", started.elapsed(), mib_per_s(info.bytes, started));

    let c = open(&dir_c, 3);
    let started = Instant::now();
    c.db.install_snapshot(&file).unwrap();
    println!(
        "install: {:?}, {:.0} MiB/s (verify pass + replace + fsync + reload + digest check)",
        started.elapsed(),
        mib_per_s(info.bytes, started)
    );
    assert_eq!(c.db.digest().unwrap(), a.db.digest().unwrap());

    let source = SnapshotSource::new(a.db.clone(), a.wal.clone(), &dir_a, SnapshotPins::default()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tidal_net::serve(Arc::new(Leader(source)), SECRET, incoming, std::future::pending()).await.unwrap();
    });
    let peer = Peer::connect_lazy(&address, SECRET, "bench").unwrap();
    let b = open(&dir_b, 2);
    let started = Instant::now();
    let outcome = install_snapshot(&peer, NodeId(2), &b.wal, &b.db, None, &dir_b, &mut |_| {}).await.unwrap();
    let InstallOutcome::Installed(report) = outcome else { panic!("{outcome:?}") };
    println!("end to end over loopback gRPC: {:?}, {:.0} MiB/s (cut + stream + fsync + verify + WAL reset + install)", started.elapsed(), mib_per_s(report.bytes, started));
    assert_eq!(b.db.digest().unwrap(), a.db.digest().unwrap());
    assert_eq!(b.wal.last_position().seqno, a.db.applied_seqno());
}
