//! `tidal backup` and `tidal restore` with the real binary (decisions/065):
//!
//! - a single node's backup, restored into a fresh data dir, starts a node at the backup's seqno
//!   with the backup's state digest and every item written before it (none written after);
//! - a restore into a non-empty dir, and of a truncated or corrupted backup, is refused with a
//!   clear error and creates nothing;
//! - a backup taken from a cluster follower, restored, started with `--join` and added with
//!   `tidal cluster add-node` catches up from the log after the backup's seqno and converges to the
//!   cluster's digest.

#![allow(clippy::unwrap_used)] // tests may unwrap; helpers outside #[test] are not covered by allow-unwrap-in-tests

use serde_json::json;
use std::path::Path;
use std::process::{Command, Output};
use tidal_client::Client;
use tidal_procs::{SingleNode, TestDir, DEADLINE, POLL};
use tidal_types::DigestView;

const DIMENSION: &str = "8";

fn tidal(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tidal")).args(args).env("RUST_LOG", "warn").output().unwrap()
}

fn text(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The value after `key ` in a backup summary line (`seqno 41`, `state digest 0a1b...`).
fn field<'a>(line: &'a str, key: &str) -> &'a str {
    let at =
        line.find(&format!("{key} ")).unwrap_or_else(|| panic!("no {key:?} in {line:?}")) + key.len() + 1;
    line[at..].split([' ', ',', ')']).next().unwrap()
}

async fn try_digest(client: &Client, min_seqno: u64) -> Result<DigestView, tidal_client::Error> {
    client
        .json::<(), DigestView>(reqwest::Method::GET, &format!("/cluster/digest?min_seqno={min_seqno}"), None)
        .await
}

async fn digest(client: &Client, min_seqno: u64) -> DigestView {
    try_digest(client, min_seqno).await.unwrap()
}

fn backup(url: &str, out: &Path) -> (u64, String) {
    let output = tidal(&["backup", "--url", url, "--out", out.to_str().unwrap()]);
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "backup failed: {stdout}\n{stderr}");
    assert!(stderr.is_empty(), "no progress lines unless asked for (not a terminal): {stderr}");
    assert!(!Path::new(&format!("{}.tmp", out.display())).exists(), "the temp file is renamed away");
    (field(&stdout, "seqno").parse().unwrap(), field(&stdout, "state digest").to_string())
}

fn restore(from: &Path, data_dir: &Path) -> Output {
    tidal(&["restore", "--from", from.to_str().unwrap(), "--data-dir", data_dir.to_str().unwrap()])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_single_node_holds_exactly_the_state_at_the_backup_seqno() {
    let dir = TestDir::new().unwrap();
    let root = dir.path();
    let binary = Path::new(env!("CARGO_BIN_EXE_tidal"));
    let source =
        SingleNode::start(binary, &root.join("n1"), &root.join("n1.log"), &["--dimension", DIMENSION])
            .await
            .unwrap();
    for id in 0..40 {
        source.client().put_item(id, json!({"id": id, "phase": "before"}), None).await.unwrap();
    }
    source.client().put_embedding(7, (0..8).map(|k| k as f64 / 8.0).collect()).await.unwrap();
    let file = root.join("n1.tbk");
    let (seqno, state_digest) = backup(source.url(), &file);
    assert_eq!(digest(source.client(), seqno).await.applied_seqno, seqno, "nothing written since");
    assert_eq!(digest(source.client(), seqno).await.digest, state_digest);
    for id in 100..110 {
        source.client().put_item(id, json!({"phase": "after"}), None).await.unwrap();
    }

    {
        tracing::info!("restore into a fresh dir and start a node on it");
        let restored = restore(&file, &root.join("r1"));
        let (stdout, stderr) = text(&restored);
        assert!(restored.status.success(), "restore failed: {stdout}\n{stderr}");
        assert!(stdout.contains(&format!("seqno {seqno} ")), "{stdout}");
        let node =
            SingleNode::start(binary, &root.join("r1"), &root.join("r1.log"), &["--dimension", DIMENSION])
                .await
                .unwrap();
        let view = digest(node.client(), 0).await;
        assert_eq!((view.applied_seqno, view.digest.as_str()), (seqno, state_digest.as_str()));
        for id in 0..40 {
            assert_eq!(
                node.client().get_item(id).await.unwrap().metadata,
                json!({"id": id, "phase": "before"})
            );
        }
        let error = node.client().get_item(100).await.unwrap_err();
        assert_eq!(error.code(), Some("not_found"), "written after the backup: {error:?}");
        let reply = node.client().put_item(200, json!({"on": "restored"}), None).await.unwrap();
        assert_eq!(reply.seqno, seqno + 1, "the restored node's log continues at the backup's seqno + 1");
        node.terminate().await.unwrap();
    }

    {
        tracing::info!(
            "refusals: a non-empty dir, a truncated file, a corrupted file; none creates anything"
        );
        let busy = root.join("busy");
        std::fs::create_dir_all(&busy).unwrap();
        std::fs::write(busy.join("keep-me"), b"x").unwrap();
        let (_, stderr) = text(&restore(&file, &busy));
        assert!(stderr.contains("is not empty"), "{stderr}");
        assert_eq!(std::fs::read_dir(&busy).unwrap().count(), 1);

        let bytes = std::fs::read(&file).unwrap();
        let truncated = root.join("truncated.tbk");
        std::fs::write(&truncated, &bytes[..bytes.len() - 100]).unwrap();
        let output = restore(&truncated, &root.join("t1"));
        let (_, stderr) = text(&output);
        assert!(!output.status.success());
        assert!(stderr.contains("is not a complete Tidal backup"), "{stderr}");
        assert!(!root.join("t1").exists());

        for at in [40, bytes.len() / 2, bytes.len() - 40] {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x20;
            let corrupted = root.join("corrupted.tbk");
            std::fs::write(&corrupted, &damaged).unwrap();
            let output = restore(&corrupted, &root.join("c1"));
            let (_, stderr) = text(&output);
            assert!(!output.status.success(), "a flip at byte {at} was restored");
            assert!(
                stderr.contains("damaged") || stderr.contains("not a complete Tidal backup"),
                "flip at byte {at}: {stderr}"
            );
            assert!(!root.join("c1").exists(), "flip at byte {at} created the data dir");
        }
    }
}

/// Stops the local cluster in the dir when dropped (by its pid files).
struct Down<'a>(&'a Path);

impl Drop for Down<'_> {
    fn drop(&mut self) {
        let _ =
            Command::new(env!("CARGO_BIN_EXE_tidal")).args(["cluster", "down", "--dir"]).arg(self.0).output();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restored_from_a_followers_backup_joins_and_converges() {
    let dir = TestDir::new().unwrap();
    let root = dir.path();
    let ports = tidal_procs::PortLease::take_block(4, tidal_cli::cluster_cmd::RPC_PORT_OFFSET).unwrap();
    let port_base = ports.port(0);
    let in_dir = |args: &[&str]| {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--dir", root.to_str().unwrap()]);
        tidal(&all)
    };
    let up = in_dir(&["cluster", "up", "--nodes", "3", "--port-base", &port_base.to_string()]);
    let _down = Down(root);
    assert!(up.status.success(), "cluster up failed: {}", text(&up).1);
    let url = |id: u64| format!("http://127.0.0.1:{}", port_base + id as u16 - 1);
    let node = |id: u64| Client::new(url(id), None);
    for id in 0..30 {
        node(1).put_item(id, json!({"id": id}), None).await.unwrap();
    }
    let leader = node(1).status().await.unwrap().leader_id.unwrap();
    let follower = (1..=3).find(|id| *id != leader).unwrap();

    // A follower's backup: handed out only once its seqno is committed.
    let file = root.join("follower.tbk");
    let (seqno, _) = backup(&url(follower), &file);
    assert!(seqno >= 30, "the follower applied the writes before the backup: {seqno}");
    let mut last = 0;
    for id in 30..50 {
        last = node(1).put_item(id, json!({"id": id, "after": "backup"}), None).await.unwrap().seqno;
    }
    let restored = restore(&file, &root.join("n4"));
    assert!(restored.status.success(), "restore failed: {}", text(&restored).1);

    // `cluster add-node` starts n4 on its (restored) data dir with --join and adds it.
    let added = in_dir(&["cluster", "add-node"]);
    let (stdout, stderr) = text(&added);
    assert!(added.status.success(), "add-node failed: {stdout}\n{stderr}");
    assert!(stdout.contains("is now a voter"), "{stdout}");
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let (mine, theirs) = (try_digest(&node(4), last).await, try_digest(&node(1), last).await);
        if let (Ok(mine), Ok(theirs)) = (&mine, &theirs) {
            if mine.applied_seqno == theirs.applied_seqno && mine.digest == theirs.digest {
                break;
            }
        }
        assert!(tokio::time::Instant::now() < deadline, "node 4 never converged: {mine:?} vs {theirs:?}");
        tokio::time::sleep(POLL).await;
    }
    for id in [0, 29, 30, 49] {
        assert_eq!(node(4).get_item(id).await.unwrap().metadata["id"], json!(id));
    }
    // It started from the backup and caught up through the log: one WAL reset to a snapshot
    // position (the restore's own, at the backup's seqno), no install from the leader. (The nodes
    // log at warn here: RUST_LOG reaches them through `cluster add-node`.)
    let log = std::fs::read_to_string(root.join("n4.log")).unwrap();
    let resets: Vec<&str> =
        log.lines().filter(|line| line.contains("reset the WAL to a snapshot position")).collect();
    assert_eq!(resets.len(), 1, "{resets:?}");
    assert!(resets[0].contains(&format!(", {seqno})")), "{resets:?}");
    assert_eq!(log.matches("finishing a pending snapshot install").count(), 1, "{log}");
}
