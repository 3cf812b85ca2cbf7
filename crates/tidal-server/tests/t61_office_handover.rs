//! Taking office has a deadline (issue 37, finding 7; PROTOCOL.md, "Taking office"), on a real
//! cluster (tonic and HTTP on loopback, quorum durability). A node S that was down comes back
//! and wins an election while the only voter that holds the committed log, B, cannot read its WAL
//! segments (its disk answers EIO): S must adopt B's log and its pull can never succeed. At
//! a57b07b S looped probe, pull, probe with its heartbeats on, forever, and nobody else could
//! campaign. Now S gives up at the deadline, asks B (the voter with the greatest log) to stand,
//! and B leads: a write is acknowledged once B's disk reads again, and every node converges.
//!
//! B's own election timeout is long (never below 12 s, and it rejects votes for its lease after
//! the last heartbeat it heard), so B leads here only because S handed the office to it: S's
//! heartbeats would keep B's timer from ever firing.

#![allow(clippy::unwrap_used)] // tests may unwrap; helpers outside #[test] are not covered by allow-unwrap-in-tests

mod common;

use common::cluster::{metric, same, Cluster, DEADLINE, POLL};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tidal_cluster::Durability;
use tidal_wal::SimIo;

/// The node whose disk stops reading; it never campaigns on its own within the test.
const B: usize = 1;

/// Waits until node `index` leads a term above `above`; returns that term.
async fn leads_above(cluster: &Cluster, index: usize, above: u64) -> u64 {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Ok(status) = cluster.client(index).status().await {
            if status.role == "leader" && status.term > above {
                return status.term;
            }
        }
        assert!(tokio::time::Instant::now() < deadline, "node {} never led a term above {above}", index + 1);
        tokio::time::sleep(POLL).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_cannot_adopt_the_log_hands_its_office_to_the_voter_that_holds_it() {
    common::trace();
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(root.path(), 3, Durability::Quorum, |_| {});
    let disk = SimIo::new();
    let b_disk = disk.clone();
    // The old leader must vanish as in a crash: a graceful stop would hand its office to B itself
    // (decisions/066) and S would never face the log it cannot adopt.
    for index in 0..3 {
        cluster.node_tweaks[index] = Some(Arc::new(|config| config.handoff_on_stop = false));
    }
    cluster.node_tweaks[B] = Some(Arc::new(move |config| {
        config.handoff_on_stop = false;
        config.io.wal_files = Arc::new(b_disk.clone());
        if let Some(cluster) = config.cluster.as_mut() {
            cluster.timing.election_min = Duration::from_secs(12);
            cluster.timing.election_max = Duration::from_millis(12_500);
        }
    }));
    cluster.start_all().await;
    cluster.put_acked(1, json!({"everyone": true})).await;
    let first = cluster.leader().await;
    assert_ne!(first, B, "B never campaigns on its own within the test");
    let first_term = cluster.client(first).status().await.unwrap().term;
    let stale = if first == 0 { 2 } else { 0 };

    // S goes down; the leader and B commit more without it.
    cluster.stop(stale).await;
    for id in 2..=20 {
        cluster.put_acked(id, json!({"without": "S"})).await;
    }
    // B's disk stops reading; the leader goes down; S comes back and is elected (B votes for it
    // once its lease on the old leader ran out). S must adopt B's log and cannot.
    disk.fail_reads(true);
    cluster.stop(first).await;
    cluster.start(stale).await;

    let handed_to_term = leads_above(&cluster, B, first_term).await;
    let handovers = metric(cluster.client(stale), "tidal_office_handovers_total").await;
    assert!(
        handovers >= Some(1.0),
        "B leads term {handed_to_term}, but S handed nothing over: {handovers:?}"
    );

    // B's disk reads again: S catches up from it, and a write is acknowledged by quorum.
    disk.fail_reads(false);
    let last = cluster.put_acked(21, json!({"after": "handover"})).await.seqno;
    cluster.start(first).await;
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let digests = cluster.digests_at(last).await;
        if digests.len() == 3 && same(&digests) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no convergence: {digests:?}");
        tokio::time::sleep(POLL).await;
    }
    cluster.stop_all().await;
}
