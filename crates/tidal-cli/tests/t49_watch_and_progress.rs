//! `tidal status --watch` and the `--wait` progress lines of `tidal catchup` and `tidal heal`,
//! against three real `tidal` processes: a watch prints one table per refresh with the rates
//! column; a follower that was down while the others took writes is followed by `catchup --wait
//! --progress` until it has applied what the leader had committed, with progress lines on stderr
//! and the result on stdout; without `--progress` (stderr not a terminal) nothing goes to stderr.

#![allow(clippy::unwrap_used)] // tests may unwrap; helpers outside #[test] are not covered by allow-unwrap-in-tests

use serde_json::json;
use std::path::Path;
use std::process::{Command, Output};
use tidal_procs::{ProcessCluster, TestDir, DEADLINE, POLL};

fn tidal(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tidal")).args(args).env("RUST_LOG", "warn").output().unwrap()
}

fn text(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_refreshes_with_rates_and_catchup_wait_follows_a_follower_to_the_commit_frontier() {
    let dir = TestDir::new().unwrap();
    let cluster =
        ProcessCluster::start(Path::new(env!("CARGO_BIN_EXE_tidal")), dir.path(), 3, "quorum").await.unwrap();
    let leader = cluster.leader().await.unwrap();
    let follower = cluster.ids().into_iter().find(|id| *id != leader).unwrap();

    {
        tracing::info!("status --watch: three refreshes, each a table with the rates column");
        let watch = tidal(&["status", "--url", &cluster.url(leader), "--watch", "0.2", "--count", "3"]);
        let (stdout, stderr) = text(&watch);
        assert!(watch.status.success(), "{stdout}\n{stderr}");
        assert_eq!(stdout.matches("tidal status every 0.2 s").count(), 3, "{stdout}");
        assert_eq!(stdout.matches("applied/s").count(), 3, "{stdout}");
        assert_eq!(stdout.matches("committing").count(), 3, "{stdout}");
        assert!(!stdout.contains("\x1b["), "no terminal control codes into a pipe: {stdout:?}");
    }

    {
        tracing::info!("a follower down while the others take writes, then catchup --wait --progress");
        cluster.kill(follower).unwrap();
        for id in 0..300 {
            cluster.client(leader).put_item(id, json!({"id": id}), None).await.unwrap();
        }
        cluster.restart(follower).unwrap();
        cluster.wait_ready(follower).await.unwrap();
        let target = cluster.status(leader).await.unwrap().commit_seqno;
        let catchup = tidal(&["catchup", "--url", &cluster.url(follower), "--wait", "--progress"]);
        let (stdout, stderr) = text(&catchup);
        assert!(catchup.status.success(), "{stdout}\n{stderr}");
        assert!(stdout.contains(&format!("catchup: node {follower} applied seqno")), "{stdout}");
        assert!(stderr.contains("seqnos") && stderr.contains("(done)"), "progress lines: {stderr}");
        let deadline = tokio::time::Instant::now() + DEADLINE;
        while cluster.status(follower).await.map_or(0, |status| status.applied_seqno) < target {
            assert!(tokio::time::Instant::now() < deadline, "the follower never applied {target}");
            tokio::time::sleep(POLL).await;
        }
    }

    {
        tracing::info!("heal --wait without --progress into a pipe: the result only");
        let heal = tidal(&["heal", "--url", &cluster.url(leader), "--node", &follower.to_string(), "--wait"]);
        let (stdout, stderr) = text(&heal);
        assert!(heal.status.success(), "{stdout}\n{stderr}");
        assert!(stdout.contains(&format!("heal: node {follower} applied seqno")), "{stdout}");
        assert!(stderr.is_empty(), "no progress lines unless asked for: {stderr}");
    }
}
