//! `tidal demo`: a guided tour on a throwaway local cluster: write, replicate, kill the leader,
//! fail over, restart and heal, prove the replicas identical, stop.
//!
//! Every step prints what it did and what it saw; every wait polls observable state (readiness,
//! frontiers, digests) with a deadline. The cluster lives in a temporary folder that is removed at
//! the end (`--keep` leaves it, with the node logs). The processes are stopped even when a step
//! fails.

use crate::cluster_cmd;
use anyhow::Context;
use std::path::Path;
use std::time::{Duration, Instant};
use tidal_client::Client;

/// How long any one step may wait for the cluster.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);
/// Poll interval while waiting.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// `tidal demo` options.
#[derive(Clone, Debug, clap::Args)]
pub struct DemoArgs {
    /// HTTP port of node 1 (nodes use base..base+2, RPC 100 higher); if taken, the next free base 1000 up.
    #[arg(long, default_value_t = 26070)]
    pub port_base: u16,
    /// Keep the cluster folder (data dirs and logs) afterwards.
    #[arg(long)]
    pub keep: bool,
}

/// Runs the tour.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let folder = tempfile::Builder::new().prefix("tidal-demo").tempdir().context("create the demo folder")?;
    let dir = folder.path().to_path_buf();
    let toured = tour(&dir, args.port_base).await;
    step("stop", "stopping every node");
    let stopped = cluster_cmd::stop(&dir, |line| say(&line));
    if args.keep {
        say(&format!("kept {} (node logs nN.log)", folder.keep().display()));
    }
    toured?;
    stopped?;
    println!("\ndemo finished: every step behaved as described.");
    Ok(())
}

fn step(title: &str, what: &str) {
    println!("\n== {title}: {what}");
}

fn say(line: &str) {
    println!("   {line}");
}

async fn tour(dir: &Path, port_base: u16) -> anyhow::Result<()> {
    step("1 start", &format!("a 3-node cluster on loopback in {}", dir.display()));
    let port_base = cluster_cmd::free_port_base(port_base, 3)?;
    let (membership, started) = cluster_cmd::start(3, dir, port_base).await?;
    for (name, pid) in &started {
        say(&format!("{name}: pid {}", pid.map_or("?".into(), |pid| pid.to_string())));
    }
    let nodes: Vec<(u64, Client)> = membership
        .spec
        .nodes
        .iter()
        .map(|node| (node.id.0, Client::new(format!("http://{}", node.http), None)))
        .collect();
    let leader = wait_leader(&nodes, None).await?;
    say(&format!("every node is ready; openraft elected n{leader} leader (quorum durability)"));
    write_and_read_everywhere(&nodes, leader).await?;
    let new_leader = kill_the_leader(dir, &nodes, leader).await?;
    let http =
        membership.spec.node(tidal_types::NodeId(leader)).context("node in the cluster file")?.http.clone();
    restart_and_heal(dir, &nodes, leader, &http, new_leader).await?;
    verify_digests(&nodes).await
}

/// Steps 2 and 3: a write on the leader and one through a follower, read back on every node.
async fn write_and_read_everywhere(nodes: &[(u64, Client)], leader: u64) -> anyhow::Result<()> {
    let follower = nodes.iter().map(|(id, _)| *id).find(|id| *id != leader).context("no follower")?;
    step(
        "2 write",
        &format!("PUT item 1 on the leader n{leader}, item 2 on follower n{follower} (it forwards)"),
    );
    let first = client(nodes, leader).put_item(1, serde_json::json!({"title": "hello"}), None).await?;
    say(&format!("n{leader} acknowledged item 1 at seqno {} (fsynced on a majority, applied)", first.seqno));
    let second =
        client(nodes, follower).put_item(2, serde_json::json!({"title": "via a follower"}), None).await?;
    say(&format!("n{follower} forwarded item 2; acknowledged at seqno {}", second.seqno));

    step("3 replicate", "read both items on every node with min_seqno (read-your-writes anywhere)");
    for (id, node) in nodes {
        for (item, seqno) in [(1, first.seqno), (2, second.seqno)] {
            let view: tidal_types::ItemView = node
                .json::<(), _>(reqwest::Method::GET, &format!("/v1/items/{item}?min_seqno={seqno}"), None)
                .await
                .with_context(|| format!("read item {item} on n{id}"))?;
            say(&format!("n{id}: item {item} = {}", view.metadata));
        }
    }
    Ok(())
}

/// Step 4: the leader SIGKILLed, writes retried on the others until one acknowledges. Returns the
/// new leader.
async fn kill_the_leader(dir: &Path, nodes: &[(u64, Client)], leader: u64) -> anyhow::Result<u64> {
    step("4 kill", &format!("SIGKILL the leader n{leader}"));
    let pid = cluster_cmd::kill_node(dir, leader)?;
    let killed = Instant::now();
    say(&format!("n{leader} (pid {pid}) is gone; writing to the others until one acknowledges"));
    let (acked_by, reply) = write_until_acked(nodes, leader, killed).await?;
    let new_leader = wait_leader(nodes, Some(leader)).await?;
    say(&format!(
        "after {} ms n{acked_by} acknowledged item 3 at seqno {}; the new leader is n{new_leader}",
        killed.elapsed().as_millis(),
        reply.seqno
    ));
    let status = client(nodes, new_leader).status().await?;
    say(&format!("term {}, commit seqno {}", status.term, status.commit_seqno));
    Ok(new_leader)
}

/// Steps 5 and 6: the old leader (HTTP at `http`) restarted on its data dir, then healed by the
/// new leader until it has applied the commit frontier.
async fn restart_and_heal(
    dir: &Path,
    nodes: &[(u64, Client)],
    leader: u64,
    http: &str,
    new_leader: u64,
) -> anyhow::Result<()> {
    step("5 restart", &format!("start n{leader} again on its data dir"));
    let pid = cluster_cmd::start_node(dir, leader)?;
    cluster_cmd::wait_ready(dir, leader, http, STEP_TIMEOUT).await?;
    let rejoined = client(nodes, leader).status().await?;
    say(&format!(
        "n{leader} (pid {pid}) is back as {} in term {}, leader n{}",
        rejoined.role,
        rejoined.term,
        rejoined.leader_id.map_or("?".into(), |id| id.to_string())
    ));

    step(
        "6 heal",
        &format!("tidal heal --node {leader}: the leader nudges n{leader} to pull the log it missed"),
    );
    let path = format!("/cluster/heal?node={leader}");
    let healed: serde_json::Value =
        client(nodes, new_leader).json::<(), _>(reqwest::Method::POST, &path, None).await.context("heal")?;
    say(&format!("leader answered: {healed}"));
    let target = client(nodes, new_leader).status().await?.commit_seqno;
    let started = Instant::now();
    let old = client(nodes, leader);
    while !old.status().await.is_ok_and(|status| status.applied_seqno >= target) {
        waited(started, &format!("n{leader} to apply through seqno {target}")).await?;
    }
    say(&format!("n{leader} applied through seqno {target} in {} ms", started.elapsed().as_millis()));
    Ok(())
}

/// Step 7: every node's digest at the same applied seqno, all equal.
async fn verify_digests(nodes: &[(u64, Client)]) -> anyhow::Result<()> {
    step("7 verify", "every node's state digest at the same applied seqno");
    let started = Instant::now();
    let digests = loop {
        let mut digests = Vec::new();
        for (_, node) in nodes {
            digests.push(node.digest().await?);
        }
        if digests.iter().all(|d| d.applied_seqno == digests[0].applied_seqno) {
            break digests;
        }
        waited(started, "every node at the same applied seqno").await?;
    };
    for digest in &digests {
        say(&format!("n{}: applied {}  digest {}", digest.node_id, digest.applied_seqno, digest.digest));
    }
    anyhow::ensure!(
        digests.iter().all(|d| d.digest == digests[0].digest),
        "the digests differ: the replicas are NOT identical"
    );
    say("all digests are equal: the replicas hold identical state");
    Ok(())
}

fn client(nodes: &[(u64, Client)], id: u64) -> &Client {
    &nodes.iter().find(|(node, _)| *node == id).expect("ids come from the cluster file").1
}

async fn write_until_acked(
    nodes: &[(u64, Client)],
    dead: u64,
    since: Instant,
) -> anyhow::Result<(u64, tidal_types::WriteReply)> {
    loop {
        for (id, node) in nodes.iter().filter(|(id, _)| *id != dead) {
            let write = node.put_item(3, serde_json::json!({"title": "after the failover"}), None);
            if let Ok(Ok(reply)) = tokio::time::timeout(Duration::from_millis(500), write).await {
                return Ok((*id, reply));
            }
        }
        anyhow::ensure!(
            since.elapsed() < STEP_TIMEOUT,
            "no node acknowledged a write within {STEP_TIMEOUT:?}"
        );
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// The node that says it is leader (never `not`), polled until `STEP_TIMEOUT`.
async fn wait_leader(nodes: &[(u64, Client)], not: Option<u64>) -> anyhow::Result<u64> {
    let started = Instant::now();
    loop {
        for (id, node) in nodes.iter().filter(|(id, _)| Some(*id) != not) {
            if node.status().await.is_ok_and(|status| status.role == "leader") {
                return Ok(*id);
            }
        }
        waited(started, "a leader").await?;
    }
}

/// Fails once `STEP_TIMEOUT` has passed since `started`; otherwise pauses for one poll interval.
async fn waited(started: Instant, what: &str) -> anyhow::Result<()> {
    anyhow::ensure!(started.elapsed() < STEP_TIMEOUT, "waited {STEP_TIMEOUT:?} for {what}");
    tokio::time::sleep(POLL_INTERVAL).await;
    Ok(())
}
