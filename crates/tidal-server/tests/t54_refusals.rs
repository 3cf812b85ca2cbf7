//! Bad replication input on a real cluster (tonic on loopback): a wrong cluster secret, another
//! cluster's id, a malformed request, and a node of an older term shipping a batch after a failover
//! are each refused, counted in `tidal_replication_refusals_total{reason}`, and change nothing on the
//! node that refused them.

#![allow(clippy::unwrap_used)] // tests may unwrap; helpers outside #[test] are not covered by allow-unwrap-in-tests

mod common;

use common::cluster::{metric, same, Cluster};
use serde_json::json;
use tidal_cluster::Durability;
use tidal_core::{encode_payload, ControlRecord, Envelope, Records};
use tidal_net::{Peer, Ship, ShipOutcome};
use tidal_types::{Seqno, Term, TermSeqno};

/// The node's `tidal_replication_refusals_total{reason}`.
async fn refusals(cluster: &Cluster, index: usize, reason: &str) -> u64 {
    let name = format!("tidal_replication_refusals_total{{reason=\"{reason}\"}}");
    metric(cluster.client(index), &name).await.unwrap_or_else(|| panic!("no {name} in the metrics")) as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_rpcs_and_a_stale_leaders_ship_are_refused_counted_and_change_nothing() {
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(root.path(), 3, Durability::Quorum, |_| {});
    cluster.start_all().await;
    for id in 0..10 {
        cluster.put_acked(id, json!({"id": id})).await;
    }
    let old = cluster.leader().await;
    let old_id = cluster.spec.nodes[old].id;
    let old_term = cluster.client(old).status().await.unwrap().term;

    // Another cluster's id, the wrong secret, a malformed request: refused by the RPC service.
    let target = cluster.followers_of(old)[0];
    let rpc = cluster.spec.nodes[target].rpc.clone();
    let secret = cluster.spec.secret.clone();
    let wrong_cluster = Peer::connect_lazy(&rpc, &secret, "another-cluster").unwrap();
    assert!(wrong_cluster.negatives("", 1).await.is_err());
    let wrong_secret =
        Peer::connect_lazy(&rpc, "not-the-cluster-secret-at-all", &cluster.spec.cluster_id).unwrap();
    assert!(wrong_secret.negatives("", 1).await.is_err());
    let peer = Peer::connect_lazy(&rpc, &secret, &cluster.spec.cluster_id).unwrap();
    assert!(peer.negatives("", tidal_net::NEGATIVES_PAGE_MAX + 1).await.is_err());
    assert!(refusals(&cluster, target, "wrong_cluster").await >= 1);
    assert!(refusals(&cluster, target, "wrong_secret").await >= 1);
    assert!(refusals(&cluster, target, "malformed").await >= 1);

    // Failover: the old leader stops, another takes office in a higher term.
    cluster.stop(old).await;
    let new = cluster.leader().await;
    let status = cluster.client(new).status().await.unwrap();
    assert!(status.term > old_term);
    let last = cluster.put_acked(50, json!({"after": "failover"})).await.seqno;
    let before = cluster.digests_at(last).await;
    assert!(same(&before));

    // The old leader's term ships a batch (its own LeaderStart after the new term's last seqno) to
    // every live node: each refuses it as from an older term and holds exactly what it held.
    let envelope = Envelope { time_ms: 0, principal: String::new(), idempotency_key: String::new() };
    let records = Records::Control(ControlRecord::LeaderStart {
        term: Term(old_term),
        leader: old_id,
        baseline: Seqno(last),
    });
    let encoded = encode_payload(&envelope, &records);
    let batch = tidal_wal::Batch::new(
        encoded.kind,
        Term(old_term),
        Seqno(last + 1),
        encoded.event_count,
        &encoded.payload,
    );
    for index in [new, cluster.followers_of(new)[0]] {
        let node = &cluster.spec.nodes[index];
        let stale = Peer::connect_lazy(&node.rpc, &secret, &cluster.spec.cluster_id).unwrap();
        let before_count = refusals(&cluster, index, "stale_term").await;
        let ship = Ship {
            cluster_id: cluster.spec.cluster_id.clone(),
            term: Term(old_term),
            leader: old_id,
            prev: TermSeqno { term: Term(old_term), seqno: Seqno(last) },
            commit: Seqno(last + 1),
            baseline: TermSeqno { term: Term(old_term), seqno: Seqno(0) },
            batches: vec![batch.clone()],
        };
        let answer = stale.ship(&ship).await.unwrap();
        assert_eq!(answer.outcome, ShipOutcome::Fenced, "node {} took a stale ship", node.id);
        assert!(answer.term > Term(old_term));
        assert_eq!(answer.durable, Seqno(last), "node {} appended a stale batch", node.id);
        assert_eq!(refusals(&cluster, index, "stale_term").await, before_count + 1);
        let status = cluster.client(index).status().await.unwrap();
        assert_eq!(status.durable_seqno, last);
        assert_eq!(status.commit_seqno, last);
    }
    assert_eq!(cluster.digests_at(last).await, before);
    // The cluster still takes writes in its term.
    cluster.put_acked(51, json!({"still": "writable"})).await;
    cluster.stop_all().await;
}

/// Finding 9 of the safety review: with the cluster secret, a node id that is not a member pulled
/// the whole log and a snapshot, shipped at the current term (a follower accepted it and named it
/// leader) and forced an election. Each is refused and counted now, and changes nothing; so is a
/// ship of the current term from a member that does not lead it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_with_the_secret_and_a_member_that_does_not_lead_are_refused() {
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(root.path(), 3, Durability::Quorum, |_| {});
    cluster.start_all().await;
    let mut last = 0;
    for id in 0..5 {
        last = cluster.put_acked(id, json!({"id": id})).await.seqno;
    }
    let leader = cluster.leader().await;
    let target = cluster.followers_of(leader)[0];
    let other = cluster.followers_of(leader)[1];
    let status = cluster.client(target).status().await.unwrap();
    let term = Term(status.term);
    let before = cluster.digests_at(last).await;
    let node = &cluster.spec.nodes[target];
    let peer = Peer::connect_lazy(&node.rpc, &cluster.spec.secret, &cluster.spec.cluster_id).unwrap();
    let stranger = tidal_types::NodeId(99);

    // A ship of the current term from the stranger, then from a member that does not lead it.
    let envelope = Envelope { time_ms: 0, principal: String::new(), idempotency_key: String::new() };
    let records =
        Records::Control(ControlRecord::LeaderStart { term, leader: stranger, baseline: Seqno(last) });
    let encoded = encode_payload(&envelope, &records);
    let batch =
        tidal_wal::Batch::new(encoded.kind, term, Seqno(last + 1), encoded.event_count, &encoded.payload);
    let prev = TermSeqno { term, seqno: Seqno(last) };
    for (sender, class) in [(stranger, "not_member"), (cluster.spec.nodes[other].id, "not_leader")] {
        let counted = refusals(&cluster, target, class).await;
        let ship = Ship {
            cluster_id: cluster.spec.cluster_id.clone(),
            term,
            leader: sender,
            prev,
            commit: Seqno(last + 1),
            baseline: prev,
            batches: vec![batch.clone()],
        };
        let answer = peer.ship(&ship).await.unwrap();
        assert!(matches!(answer.outcome, ShipOutcome::Refused(_)), "{sender}: {:?}", answer.outcome);
        assert_eq!(answer.durable, Seqno(last), "a ship from {sender} was appended");
        assert_eq!(refusals(&cluster, target, class).await, counted + 1, "{class} not counted");
    }

    // A pull, a snapshot, an election request and an openraft vote from the stranger.
    let counted = refusals(&cluster, target, "not_member").await;
    let pull = tidal_net::Pull {
        cluster_id: cluster.spec.cluster_id.clone(),
        term,
        node: stranger,
        from: TermSeqno::default(),
        chunk_bytes_max: 1 << 20,
    };
    assert!(peer.pull(&pull, std::time::Duration::from_secs(5)).await.is_err(), "the stranger pulled");
    assert!(peer.snapshot(stranger, std::time::Duration::from_secs(5)).await.is_err(), "snapshot served");
    // A stranger may neither ask a voter to stand nor to release the lease it grants (decisions/068).
    for mode in
        [tidal_net::ElectMode::Stand, tidal_net::ElectMode::Release, tidal_net::ElectMode::StandPastReleased]
    {
        let elected = peer.elect(term.get(), stranger.0, std::time::Duration::ZERO, mode).await.unwrap();
        assert!(matches!(elected, tidal_net::Election::Refused(_)), "{mode:?} at a stranger's request");
    }
    let vote = json!({"vote": {"leader_id": {"term": term.get() + 5, "voted_for": 99}, "committed": false},
                      "last_log_id": null});
    let call = tidal_net::RaftCall {
        kind: tidal_cluster::control::network::KIND_VOTE.to_string(),
        payload: serde_json::to_vec(&vote).unwrap(),
    };
    assert!(peer.raft(call, std::time::Duration::from_secs(5)).await.is_err(), "a stranger's vote request");
    assert_eq!(refusals(&cluster, target, "not_member").await, counted + 6);

    // Nothing moved: same term, same log, and the cluster still writes.
    assert_eq!(cluster.client(target).status().await.unwrap().term, status.term);
    assert_eq!(cluster.digests_at(last).await, before);
    cluster.put_acked(100, json!({"still": "writable"})).await;
    cluster.stop_all().await;
}

/// Fails the first fsync of each registered node's stream baseline, and counts them.
#[derive(Default)]
struct FailFirstBaseline {
    failed: std::sync::Mutex<Vec<std::path::PathBuf>>,
}

impl tidal_cluster::files::FileFaults for FailFirstBaseline {
    fn before(
        &self,
        step: tidal_cluster::files::FileStep,
        path: &std::path::Path,
        _contents: &[u8],
    ) -> std::io::Result<()> {
        let baseline = path.file_name().is_some_and(|name| name == "stream_baseline");
        let mut failed = self.failed.lock().unwrap();
        if baseline && step == tidal_cluster::files::FileStep::Fsync && !failed.iter().any(|p| p == path) {
            failed.push(path.to_path_buf());
            return Err(std::io::Error::other("injected: fsync of the stream baseline failed"));
        }
        Ok(())
    }
}

/// A node elected in openraft that cannot write its stream baseline must not serve (fail closed),
/// and must not keep the cluster from electing another node either: it switches its heartbeats
/// off so the others stand (decisions/022). Here each of the two nodes left after the leader
/// stops fails its first baseline write; before the fix the first of them to win stayed leader
/// without serving and no write was ever acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_cannot_write_its_baseline_hands_over_instead_of_blocking_writes() {
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(root.path(), 3, Durability::Quorum, |_| {});
    cluster.start_all().await;
    for id in 0..5 {
        cluster.put_acked(id, json!({"id": id})).await;
    }
    let old = cluster.leader().await;
    let old_term = cluster.client(old).status().await.unwrap().term;
    let faults = std::sync::Arc::new(FailFirstBaseline::default());
    for index in cluster.followers_of(old) {
        tidal_cluster::files::register_faults(&cluster.dirs[index], Some(faults.clone()));
    }
    cluster.stop(old).await;
    let last = cluster.put_acked(100, json!({"after": "a failed office"})).await.seqno;
    assert!(!faults.failed.lock().unwrap().is_empty(), "no baseline write failed: the test did not test");
    let new = cluster.leader().await;
    assert!(cluster.client(new).status().await.unwrap().term > old_term);
    assert!(same(&cluster.digests_at(last).await));
    cluster.stop_all().await;
}

/// A term is never resumed across a restart (decisions/023): leaders ship a drain before their own
/// fsync, so a crashed leader's followers may hold batches of its term that the crash took from
/// it. The leader restarts alone, so openraft restores its leadership of the same term; the
/// followers restart and would follow it. It must hand the office over instead: the leader that
/// serves afterwards (whichever node) is in a higher term, and nothing acknowledged is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_leader_hands_its_term_over_instead_of_resuming_it() {
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(root.path(), 3, Durability::Quorum, |_| {});
    cluster.start_all().await;
    let mut last = 0;
    for id in 0..10 {
        last = cluster.put_acked(id, json!({"id": id})).await.seqno;
    }
    let old = cluster.leader().await;
    let old_term = cluster.client(old).status().await.unwrap().term;
    for index in 0..3 {
        cluster.stop(index).await;
    }
    // Alone, the old leader cannot be deposed: openraft puts it back in office in `old_term`.
    cluster.start(old).await;
    for index in (0..3).filter(|index| *index != old) {
        cluster.start(index).await;
    }
    let leader = cluster.leader().await;
    let term = cluster.client(leader).status().await.unwrap().term;
    assert!(term > old_term, "node {leader} serves in term {term}, the term led before the restart");
    for id in 10..15 {
        last = cluster.put_acked(id, json!({"id": id})).await.seqno;
    }
    for id in 0..15 {
        let item = cluster.client(leader).get_item(id).await.unwrap();
        assert_eq!(item.metadata, json!({"id": id}), "item {id}");
    }
    let digests = cluster.digests_at(last).await;
    assert!(same(&digests), "replicas differ: {digests:?}");
    cluster.stop_all().await;
}
