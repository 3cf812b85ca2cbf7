//! A 3-node cluster in-process over real tonic and HTTP on loopback: a follower stopped while the
//! others checkpoint and purge their WALs past the follower's position (and restart, so no
//! in-memory ship tail covers the gap) cannot catch up from the log (the leader answers `Purged`);
//! on restart it fetches and installs the leader's snapshot on its
//! own, pulls on from the snapshot's seqno, and reaches the same digest as the others.

#![allow(clippy::unwrap_used)] // tests may unwrap; helpers outside #[test] are not covered by allow-unwrap-in-tests

mod common;

use common::cluster::{metric, same, Cluster, DEADLINE, POLL};
use tidal_cluster::Durability;
use tidal_server::config::ServeConfig;
use tidal_types::SignalIn;

/// Tiny segments, a tiny retention budget and frequent checkpoints: the WAL is purged soon after
/// every few writes.
fn purge_often(config: &mut ServeConfig) {
    config.segment_bytes_max = 4096;
    config.wal_retention_bytes = 8192;
    config.checkpoint_interval_ms = 100;
}

fn signals(n: u64, round: u64) -> Vec<SignalIn> {
    (0..n)
        .map(|i| SignalIn {
            user: format!("u{}", (i + round) % 11),
            item: (i * 7 + round) % 13,
            kind: "click".into(),
            weight: None,
            ts: None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_behind_the_leaders_purge_point_installs_a_snapshot_and_converges() {
    common::trace();
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(root.path(), 3, Durability::Quorum, purge_often);
    for i in 0..3 {
        cluster.start(i).await;
    }
    let l = cluster.leader().await;
    let f = (l + 1) % 3;
    let other = (l + 2) % 3;
    let leader = cluster.client(l).clone();
    let stopped_at = {
        tracing::info!("phase 1: a few writes reach every node, then the follower stops");
        let mut last = 0;
        for round in 0..5 {
            last = leader.post_signals(signals(20, round), None).await.unwrap().seqno;
        }
        let digests = cluster.digests_at(last).await;
        assert!(same(&digests), "replicas differ: {digests:?}");
        cluster.stop(f).await;
        last
    };
    let last = {
        tracing::info!(
            "phase 2: the leader writes on until its checkpointer purged the WAL past the follower"
        );
        let deadline = tokio::time::Instant::now() + DEADLINE;
        let mut round = 5;
        let mut last;
        loop {
            last = leader.post_signals(signals(40, round), None).await.unwrap().seqno;
            round += 1;
            let mut purged = f64::MAX;
            for running in [l, other] {
                let node = metric(cluster.client(running), "tidal_wal_purged_seqno").await.unwrap_or(0.0);
                purged = purged.min(node);
            }
            if purged > (stopped_at + 1) as f64 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the leader did not purge past {stopped_at} (purged through {purged})"
            );
        }
        // A few more writes after the purge, so the follower must also pull after its install.
        for _ in 0..3 {
            last = leader.post_signals(signals(40, round), None).await.unwrap().seqno;
            round += 1;
        }
        last
    };
    let (leader, last) = {
        tracing::info!(
            "phase 3: the two running nodes restart, so no in-memory ship tail still covers the gap"
        );
        for running in [l, other] {
            cluster.stop(running).await;
        }
        for running in [l, other] {
            cluster.start(running).await;
        }
        let l = cluster.leader().await;
        let leader = cluster.client(l).clone();
        // The restarted leader opens a new term (a term is never resumed across a restart,
        // decisions/023): its LeaderStart follows `last`. One more write marks the end of the log.
        let end = leader.post_signals(signals(10, 500), None).await.unwrap().seqno;
        assert!(end > last, "{end} <= {last}");
        (leader, end)
    };
    {
        tracing::info!("phase 4: the follower restarts, installs the leader's snapshot and converges");
        assert_eq!(metric(&leader, "tidal_snapshot_installs_total").await, Some(0.0));
        cluster.start(f).await;
        let follower = cluster.client(f).clone();
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let installs = metric(&follower, "tidal_snapshot_installs_total").await.unwrap_or(0.0);
            if installs >= 1.0 {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "the follower installed no snapshot");
            tokio::time::sleep(POLL).await;
        }
        let digests = cluster.digests_at(last).await;
        assert_eq!(digests.len(), 3);
        assert!(same(&digests), "replicas differ after the install: {digests:?}");
        let quarantine = cluster.dirs[f].join("wal").join("quarantine");
        assert!(
            std::fs::read_dir(&quarantine).map(|entries| entries.count()).unwrap_or(0) > 0,
            "the follower's old WAL was not moved to {}",
            quarantine.display()
        );
        assert_eq!(metric(&follower, "tidal_snapshot_install_failures_total").await, Some(0.0));
    }
    {
        tracing::info!("phase 5: writes after the install reach the follower through the log");
        let reply = leader.post_signals(signals(10, 999), None).await.unwrap();
        let digests = cluster.digests_at(reply.seqno).await;
        assert!(same(&digests), "replicas differ: {digests:?}");
    }
    for i in 0..3 {
        cluster.stop(i).await;
    }
}
