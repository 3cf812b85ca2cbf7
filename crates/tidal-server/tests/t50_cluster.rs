//! A 3-node cluster in-process over real tonic and HTTP on loopback, leadership decided by openraft:
//! writes on the leader and through a follower converge on every node (same digest, same feed); a
//! follower stopped through writes catches up by its pull; in quorum mode a leader without a
//! majority acknowledges nothing; when the leader stops, another takes office without losing an
//! acknowledged write, and the old leader rejoins as a follower and converges.

#![allow(clippy::unwrap_used)] // tests may unwrap; helpers outside #[test] are not covered by allow-unwrap-in-tests

mod common;

use common::cluster::{retrying, same, Cluster, DEADLINE, POLL};
use serde_json::json;
use std::time::Duration;
use tidal_cluster::Durability;
use tidal_types::SignalIn;

fn signals(n: u64) -> Vec<SignalIn> {
    (0..n)
        .map(|i| SignalIn {
            user: format!("u{}", i % 7),
            item: i % 5,
            kind: "click".into(),
            weight: None,
            ts: None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_on_leader_and_follower_converge_and_a_restarted_follower_catches_up() {
    common::trace();
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(root.path(), 3, Durability::Quorum, |_| {});
    cluster.start_all().await;
    let l = cluster.leader().await;
    let followers = cluster.followers_of(l);
    let (f1, f2) = (followers[0], followers[1]);
    {
        tracing::info!("phase 1: writes on the leader and through a follower");
        let leader = cluster.client(l).clone();
        for id in 0..5u64 {
            retrying(|| leader.put_item(id, json!({"n": id}), None)).await;
            retrying(|| leader.put_embedding(id, vec![1.0, id as f64, 0.5, -1.0])).await;
        }
        retrying(|| leader.post_signals(signals(100), None)).await;
        let via_follower =
            retrying(|| cluster.client(f2).put_item(42, json!({"via": "follower"}), Some("k-42"))).await;
        let retried =
            retrying(|| cluster.client(f1).put_item(42, json!({"via": "follower"}), Some("k-42"))).await;
        assert_eq!(via_follower, retried, "the idempotency key holds across nodes");
        let digests = cluster.digests_at(via_follower.seqno).await;
        assert!(same(&digests), "replicas differ: {digests:?}");
        let feeds: Vec<_> = futures_feeds(&cluster, "u3").await;
        assert!(feeds.windows(2).all(|w| w[0] == w[1]), "feeds differ: {feeds:?}");
        let item = cluster.client(f1).get_item(42).await.unwrap();
        assert_eq!(item.metadata, json!({"via": "follower"}));
        let metrics = metrics_text(&cluster, l).await;
        for line in [
            format!("tidal_commit_seqno {}", via_follower.seqno),
            "tidal_is_leader 1".to_string(),
            format!(
                "tidal_follower_matched_seqno{{node=\"{}\"}} {}",
                cluster.spec.nodes[f1].id.0, via_follower.seqno
            ),
        ] {
            assert!(metrics.contains(&line), "metrics lack {line:?}:\n{metrics}");
        }
    }
    {
        tracing::info!("phase 2: a follower stopped through writes catches up (boot-time pull or ship)");
        cluster.stop(f2).await;
        let leader = cluster.client(l).clone();
        let mut last = 0;
        for round in 0..20u64 {
            last = retrying(|| leader.post_signals(signals(50 + round), None)).await.seqno;
        }
        cluster.start(f2).await;
        let digests = cluster.digests_at(last).await;
        assert!(same(&digests), "replicas differ after catch-up: {digests:?}");
        // The restarted follower appended the 20 batches it missed, by its boot-time pull or by the
        // leader's next ship from its tail, whichever reached it first (both are the protocol's;
        // since the ship link, decisions/071, a ship often comes first). What a pull brought is
        // counted as pulled (`a_follower_behind_the_ship_tail_pulls` forces the pull).
        let metrics = metrics_text(&cluster, f2).await;
        let value = |name: &str| metric_value(&metrics, name);
        let (appended, pulled) = (value("tidal_wal_batches_total"), value("tidal_pull_batches_total"));
        assert!(appended >= 20.0 && pulled <= appended, "{metrics}");
        if pulled > 0.0 {
            assert!(value("tidal_pulls_total") >= 1.0, "{metrics}");
            assert!(value("tidal_pull_bytes_total") > 0.0, "{metrics}");
        }
        // Lag is known only where acks are heard: the leader hears f1's; a follower hears nobody's.
        let (f1_id, f2_id) = (cluster.spec.nodes[f1].id.0, cluster.spec.nodes[f2].id.0);
        let on_leader = cluster.client(l).status().await.unwrap();
        let f1_lag = on_leader.nodes.iter().find(|node| node.id == f1_id).unwrap().lag_ms;
        assert!(f1_lag.is_some(), "the leader has heard f1: {on_leader:?}");
        let on_f2 = cluster.client(f2).status().await.unwrap();
        for node in &on_f2.nodes {
            let expected = if node.id == f2_id { Some(0) } else { None };
            assert_eq!(node.lag_ms, expected, "{on_f2:?}");
        }
    }
    {
        tracing::info!("phase 3: without a majority the leader acknowledges nothing; with one it does");
        cluster.stop(f1).await;
        cluster.stop(f2).await;
        let leader = cluster.client(l).clone();
        let pending = tokio::spawn(async move { leader.put_item(7, json!({"late": true}), None).await });
        // The write cannot be acknowledged while no follower runs: it is still pending when a
        // follower comes back, and acknowledged after.
        tokio::time::sleep(Duration::from_millis(300)).await;
        // (A 503 is not an acknowledgement: an election may have begun meanwhile.)
        if pending.is_finished() {
            let early = pending.await.unwrap();
            assert!(early.is_err(), "a write was acknowledged without a majority: {early:?}");
            cluster.start(f1).await;
        } else {
            // Appended on the leader and waiting for a majority: the gauge counts it.
            let metrics = format!("{}/metrics", cluster.client(l).base());
            metric_line_appears(&metrics, "tidal_writes_waiting 1").await;
            cluster.start(f1).await;
            let _ = tokio::time::timeout(Duration::from_secs(20), pending).await.unwrap().unwrap();
            metric_line_appears(&metrics, "tidal_writes_waiting 0").await;
        }
        let leader = cluster.client(l).clone();
        let reply = retrying(|| leader.put_item(7, json!({"late": true}), None)).await;
        let item = cluster
            .client(f1)
            .json::<(), tidal_types::ItemView>(
                reqwest::Method::GET,
                &format!("/v1/items/7?min_seqno={}", reply.seqno),
                None,
            )
            .await
            .unwrap();
        assert_eq!(item.seqno, reply.seqno);
    }
    for i in [l, f1] {
        cluster.stop(i).await;
    }
}

/// The leader stops under writes: the others elect a new leader, which takes office (probe, adopt,
/// LeaderStart) and accepts writes; every acknowledged write is still there; the old leader
/// restarts as a follower and converges to the same digest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_keeps_acknowledged_writes_and_the_old_leader_rejoins() {
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(root.path(), 3, Durability::Quorum, |_| {});
    cluster.start_all().await;
    let mut acknowledged = Vec::new();
    for id in 0..20u64 {
        acknowledged.push((id, cluster.put_acked(id, json!({"term": "first"})).await));
    }
    let old = cluster.leader().await;
    cluster.stop(old).await;
    let new = cluster.leader().await;
    assert_ne!(new, old);
    let status = cluster.client(new).status().await.unwrap();
    assert!(status.term >= 2, "a new leader runs in a new term: {status:?}");
    assert_eq!(status.baseline_term, status.term, "the new leader's baseline names its term: {status:?}");
    assert!(status.baseline_seqno >= acknowledged.last().unwrap().1.seqno, "{status:?}");
    for id in 20..30u64 {
        acknowledged.push((id, cluster.put_acked(id, json!({"term": "second"})).await));
    }
    let last = acknowledged.last().unwrap().1.seqno;
    for (id, reply) in &acknowledged {
        let item = cluster.client(new).get_item(*id).await.unwrap();
        assert_eq!(item.seqno, reply.seqno, "acknowledged write of item {id} lost or moved");
    }
    cluster.start(old).await;
    let digests = cluster.digests_at(last).await;
    assert_eq!(digests.len(), 3);
    assert!(same(&digests), "replicas differ after failover: {digests:?}");
    cluster.stop_all().await;
}

/// A follower stopped while the leader wrote more batches than its ship tail holds (4 here) cannot
/// be served from the tail: whichever path reaches it first (its boot-time pull, a Gap's pull, the
/// leader's nudge, a ship), at least the batches beyond the tail come by pull, and the pull
/// counters say so. (With the default tail a ship from it may bring everything and pull nothing,
/// so `phase 2` above cannot pin these counters.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_behind_the_ship_tail_pulls() {
    const TAIL: usize = 4;
    const ROUNDS: u64 = 20;
    common::trace();
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(root.path(), 3, Durability::Quorum, |config| {
        config.ship_tail_batches_max = TAIL;
    });
    cluster.start_all().await;
    let l = cluster.leader().await;
    let f = cluster.followers_of(l)[0];
    retrying(|| cluster.client(l).put_item(1, json!({"n": 1}), None)).await;
    cluster.stop(f).await;
    let leader = cluster.client(l).clone();
    let mut last = 0;
    for round in 0..ROUNDS {
        last = retrying(|| leader.post_signals(signals(10 + round), None)).await.seqno;
    }
    cluster.start(f).await;
    let digests = cluster.digests_at(last).await;
    assert!(same(&digests), "replicas differ after catch-up: {digests:?}");
    let metrics = metrics_text(&cluster, f).await;
    let value = |name: &str| metric_value(&metrics, name);
    // At most TAIL of the batches it missed could have come in a ship; the rest came by pull.
    let missed_beyond_tail = (ROUNDS as usize - TAIL) as f64;
    assert!(value("tidal_pull_batches_total") >= missed_beyond_tail, "{metrics}");
    assert!(value("tidal_pulls_total") >= 1.0, "{metrics}");
    assert!(value("tidal_pull_bytes_total") > 0.0, "{metrics}");
    // The bound is the node's setting, not the default.
    let on_leader = metrics_text(&cluster, l).await;
    assert_eq!(metric_value(&on_leader, "tidal_ship_tail_batches"), TAIL as f64, "{on_leader}");
    assert!(metric_value(&on_leader, "tidal_ship_tail_bytes") > 0.0, "{on_leader}");
    cluster.stop_all().await;
}

/// The value of an unlabelled metric in a Prometheus text page.
fn metric_value(metrics: &str, name: &str) -> f64 {
    let line = metrics.lines().find(|line| line.starts_with(&format!("{name} ")));
    line.and_then(|line| line.split(' ').nth(1)?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in:\n{metrics}"))
}

/// Node `i`'s `/metrics` text.
async fn metrics_text(cluster: &Cluster, i: usize) -> String {
    let url = format!("{}/metrics", cluster.client(i).base());
    reqwest::get(url).await.unwrap().text().await.unwrap()
}

/// Polls `url` (a node's `/metrics`) until it has exactly `line`; fails after 10 s.
async fn metric_line_appears(url: &str, line: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = reqwest::get(url).await.unwrap().text().await.unwrap();
        if text.lines().any(|l| l == line) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "no {line:?} in the metrics:\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn futures_feeds(cluster: &Cluster, user: &str) -> Vec<Vec<(u64, String)>> {
    let mut feeds = Vec::new();
    for member in cluster.members.iter().flatten() {
        let feed = member.client.feed(user, 10).await.unwrap();
        feeds.push(feed.items.iter().map(|i| (i.item, format!("{:.9}", i.score))).collect());
    }
    feeds
}

/// The counterpart of phase 3 above: in `leader` durability the same write, with both followers
/// down, is acknowledged after the leader's own fsync — so the quorum test is not passing by
/// accident — and the followers converge once they are back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_durability_acknowledges_without_followers_and_they_converge_later() {
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(root.path(), 3, Durability::Leader, |_| {});
    cluster.start_all().await;
    let l = cluster.leader().await;
    let followers = cluster.followers_of(l);
    for f in &followers {
        cluster.stop(*f).await;
    }
    let leader = cluster.client(l).clone();
    let reply =
        tokio::time::timeout(Duration::from_secs(20), leader.put_item(9, json!({"alone": true}), None))
            .await
            .expect("leader durability must not wait for followers")
            .unwrap();
    for f in &followers {
        cluster.start(*f).await;
    }
    let digests = cluster.digests_at(reply.seqno).await;
    assert!(same(&digests), "replicas differ: {digests:?}");
    cluster.stop_all().await;
}

/// The operator verbs over HTTP: `heal` on the leader (dry run says what it would do and changes
/// nothing; the real one resets the queue and the follower still converges), `heal` sent to a
/// follower is forwarded to the leader, `catchup` on a follower starts (or joins) a pull, and is
/// refused on the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heal_and_catchup_verbs() {
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(root.path(), 3, Durability::Quorum, |_| {});
    cluster.start_all().await;
    let l = cluster.leader().await;
    let f = cluster.followers_of(l)[0];
    let f_id = cluster.spec.nodes[f].id.0;
    let written = retrying(|| cluster.client(l).put_item(1, json!({"x": 1}), None)).await;
    let post = |index: usize, path: String| {
        let client = cluster.client(index).clone();
        async move { client.json::<(), serde_json::Value>(reqwest::Method::POST, &path, None).await }
    };
    let dry = post(l, format!("/cluster/heal?node={f_id}&dry_run=true")).await.unwrap();
    assert_eq!(dry["dry_run"], json!(true));
    assert!(dry["action"].as_str().unwrap().starts_with("would reset"), "{dry}");
    let healed = post(l, format!("/cluster/heal?node={f_id}")).await.unwrap();
    assert!(healed["action"].as_str().unwrap().starts_with("reset"), "{healed}");
    for bad in ["/cluster/heal", "/cluster/heal?node=x"] {
        let error = post(l, bad.to_string()).await.unwrap_err();
        assert_eq!(error.code(), Some("invalid_argument"), "{bad}: {error:?}");
    }
    let ready = reqwest::get(format!("{}/readyz?max_lag_ms=soon", cluster.client(f).base())).await.unwrap();
    assert_eq!(ready.status(), reqwest::StatusCode::BAD_REQUEST);
    // A follower forwards heal to its leader (the verb is the leader's).
    let forwarded = post(f, format!("/cluster/heal?node={f_id}")).await.unwrap();
    assert!(forwarded["action"].as_str().unwrap().starts_with("reset"), "{forwarded}");
    let catchup = post(f, "/cluster/catchup".to_string()).await.unwrap();
    assert_eq!(catchup["leader"], json!(cluster.spec.nodes[l].id.0), "{catchup}");
    assert!(
        post(l, "/cluster/catchup".to_string()).await.is_err(),
        "the leader has nothing to catch up from"
    );
    let after = retrying(|| cluster.client(l).put_item(2, json!({"x": 2}), None)).await;
    assert!(after.seqno > written.seqno);
    let digests = cluster.digests_at(after.seqno).await;
    assert!(same(&digests), "replicas differ after heal: {digests:?}");
    cluster.stop_all().await;
}

/// `promote` hands leadership to the named voter (sent to any node: followers forward it), a dry
/// run changes nothing, bad targets are refused; acknowledged writes survive the transfer and the old
/// leader follows; an Idempotency-Key retry answered by the new leader returns the first result. A
/// linearizable read sent to a follower is answered by the leader after a quorum
/// confirmed it and sees every write acknowledged before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promote_hands_over_and_linearizable_reads_see_acknowledged_writes() {
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(root.path(), 3, Durability::Quorum, |_| {});
    cluster.start_all().await;
    let l = cluster.leader().await;
    let followers = cluster.followers_of(l);
    let (f, o) = (followers[0], followers[1]);
    let (l_id, f_id) = (cluster.spec.nodes[l].id.0, cluster.spec.nodes[f].id.0);
    let first =
        retrying(|| cluster.client(l).put_item(1, json!({"before": true}), Some("promote-key"))).await;
    let post = |index: usize, path: String| {
        let client = cluster.client(index).clone();
        async move { client.json::<(), serde_json::Value>(reqwest::Method::POST, &path, None).await }
    };
    // The target must have been heard from; poll until the leader has an ack from it.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let dry = loop {
        match post(o, format!("/cluster/promote?node={f_id}&dry_run=true")).await {
            Ok(dry) => break dry,
            Err(error) => {
                assert!(tokio::time::Instant::now() < deadline, "dry run never accepted: {error:?}");
                tokio::time::sleep(POLL).await;
            }
        }
    };
    assert_eq!(dry["dry_run"], json!(true));
    assert_eq!(dry["from"], json!(l_id), "{dry}");
    assert!(dry["action"].as_str().unwrap().starts_with("would pause heartbeats"), "{dry}");
    assert_eq!(cluster.leader().await, l, "a dry run changed the leader");
    for bad in ["/cluster/promote", "/cluster/promote?node=x", "/cluster/promote?node=99"] {
        let error = post(l, bad.to_string()).await.unwrap_err();
        assert_eq!(error.code(), Some("invalid_argument"), "{bad}: {error:?}");
    }
    let same_node = post(l, format!("/cluster/promote?node={l_id}")).await.unwrap();
    assert_eq!(same_node["new_leader"], json!(l_id), "{same_node}");

    let done = retrying(|| post(o, format!("/cluster/promote?node={f_id}"))).await;
    assert_eq!(done["new_leader"], json!(f_id), "{done}");
    assert_eq!(cluster.leader().await, f, "the cluster does not follow the promoted node");
    let item = cluster.client(f).get_item(1).await.unwrap();
    assert_eq!(item.metadata, json!({"before": true}), "an acknowledged write was lost in the transfer");
    // The Idempotency-Key window rides the log: the retry, answered by the new leader, returns the
    // first result instead of writing again.
    let retried = cluster.client(o).put_item(1, json!({"before": true}), Some("promote-key")).await.unwrap();
    assert_eq!(retried.seqno, first.seqno, "a retry after the transfer wrote twice");
    // The old leader now forwards writes to the new one.
    let second = retrying(|| cluster.client(l).put_item(2, json!({"after": true}), None)).await;
    assert!(second.seqno > first.seqno);

    // Linearizable reads: forwarded by a follower, answered after the write acknowledged above.
    let url = format!("{}/v1/items/2?consistency=linearizable", cluster.client(o).base());
    let read = reqwest::get(&url).await.unwrap();
    assert_eq!(read.status(), reqwest::StatusCode::OK);
    let applied: u64 = read.headers()["Tidal-Applied-Seqno"].to_str().unwrap().parse().unwrap();
    assert!(applied >= second.seqno, "linearizable read at {applied} misses the write at {}", second.seqno);
    let bad = reqwest::get(format!("{}/v1/items/2?consistency=eventually", cluster.client(o).base()))
        .await
        .unwrap();
    assert_eq!(bad.status(), reqwest::StatusCode::BAD_REQUEST);

    // And back: the old leader's heartbeats were restored, it leads again and every node converges.
    let back = retrying(|| post(f, format!("/cluster/promote?node={l_id}"))).await;
    assert_eq!(back["new_leader"], json!(l_id), "{back}");
    assert_eq!(cluster.leader().await, l);
    let last = retrying(|| cluster.client(o).put_item(3, json!({"back": true}), None)).await;
    let digests = cluster.digests_at(last.seqno).await;
    assert!(same(&digests), "replicas differ after two transfers: {digests:?}");
    cluster.stop_all().await;
}

/// Hard negatives (a CRDT outside the log) added and removed on different nodes converge through
/// anti-entropy: `POST /cluster/reconcile?dry_run=true` reports the difference and changes nothing;
/// reconciling on every node makes every node's negatives digest and lists equal, add-wins for a
/// concurrent add and remove of the same item.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_converges_hard_negatives_added_on_different_nodes() {
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(root.path(), 3, Durability::Quorum, |_| {});
    cluster.start_all().await;
    let post = |index: usize, path: String, body: Option<serde_json::Value>| {
        let client = cluster.client(index).clone();
        async move {
            client
                .json::<serde_json::Value, serde_json::Value>(reqwest::Method::POST, &path, body.as_ref())
                .await
        }
    };
    post(0, "/v1/users/u1/negatives".into(), Some(json!({"item": 5}))).await.unwrap();
    post(1, "/v1/users/u1/negatives".into(), Some(json!({"item": 6}))).await.unwrap();
    post(2, "/v1/users/u2/negatives".into(), Some(json!({"item": 7}))).await.unwrap();
    // Node 3 adds 8 for u1 while node 1 has never seen it: the add survives the merge.
    post(2, "/v1/users/u1/negatives".into(), Some(json!({"item": 8}))).await.unwrap();
    let negatives_digest = |index: usize| {
        let client = cluster.client(index).clone();
        async move {
            let view: tidal_types::DigestView =
                client.json::<(), _>(reqwest::Method::GET, "/cluster/digest", None).await.unwrap();
            view.negatives_digest
        }
    };
    let before = negatives_digest(0).await;
    let dry = post(0, "/cluster/reconcile?dry_run=true".into(), None).await.unwrap();
    assert_eq!(dry["dry_run"], json!(true));
    assert!(dry["peers"].as_array().unwrap().iter().all(|p| p["differed"] == json!(true)), "{dry}");
    assert_eq!(negatives_digest(0).await, before, "a dry run merged");
    for i in 0..3 {
        let done = post(i, "/cluster/reconcile".into(), None).await.unwrap();
        assert!(
            done["peers"]
                .as_array()
                .unwrap()
                .iter()
                .all(|p| !p["outcome"].as_str().unwrap().starts_with("unreachable")),
            "{done}"
        );
    }
    // Nodes 1 and 2 reconciled before node 3 pulled everything; one more round on them closes it.
    for i in 0..2 {
        post(i, "/cluster/reconcile".into(), None).await.unwrap();
    }
    let digests = [negatives_digest(0).await, negatives_digest(1).await, negatives_digest(2).await];
    assert!(digests.windows(2).all(|w| w[0] == w[1]), "negatives differ after reconcile: {digests:?}");
    for i in 0..3 {
        let u1: tidal_types::NegativesView = cluster
            .client(i)
            .json::<(), _>(reqwest::Method::GET, "/v1/users/u1/negatives", None)
            .await
            .unwrap();
        assert_eq!(u1.items, vec![5, 6, 8], "node {i}");
        let u2: tidal_types::NegativesView = cluster
            .client(i)
            .json::<(), _>(reqwest::Method::GET, "/v1/users/u2/negatives", None)
            .await
            .unwrap();
        assert_eq!(u2.items, vec![7], "node {i}");
    }
    // The RPC refuses an oversize page, and an Elect for a term that is not the node's starts nothing.
    let node = &cluster.spec.nodes[0];
    let peer =
        tidal_net::Peer::connect_lazy(&node.rpc, &cluster.spec.secret, &cluster.spec.cluster_id).unwrap();
    let oversize = peer.negatives("", tidal_net::NEGATIVES_PAGE_MAX + 1).await.unwrap_err();
    assert!(oversize.to_string().contains("limit"), "{oversize}");
    let page = peer.negatives("u1", 10).await.unwrap().1;
    assert_eq!(page.iter().map(|(user, _)| user.as_str()).collect::<Vec<_>>(), vec!["u2"], "page after u1");
    for mode in
        [tidal_net::ElectMode::Stand, tidal_net::ElectMode::Release, tidal_net::ElectMode::StandPastReleased]
    {
        let refused = peer.elect(u64::MAX, 2, std::time::Duration::ZERO, mode).await.unwrap();
        assert!(
            matches!(refused, tidal_net::Election::Refused(_)),
            "an Elect ({mode:?}) for a foreign term started an election"
        );
    }
    let same_now = post(0, "/cluster/reconcile".into(), None).await.unwrap();
    assert!(
        same_now["peers"].as_array().unwrap().iter().all(|p| p["differed"] == json!(false)),
        "{same_now}"
    );
    cluster.stop_all().await;
}
