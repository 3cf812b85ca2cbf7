//! decisions/025 on a real cluster (tonic and HTTP on loopback): a follower shows a committed write
//! while its OWN fsync is still held. The follower's WAL sits on a file layer whose fdatasync waits
//! while the test holds it; the leader and the other follower fsync, so the write is committed and
//! acknowledged; the held follower has written it (not fsynced: its durable frontier is below the
//! write) and must serve it with `min_seqno`. Then the hold ends and everything converges.

#![allow(clippy::unwrap_used)] // tests may unwrap; helpers outside #[test] are not covered by allow-unwrap-in-tests

mod common;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};

use common::cluster::{same, Cluster, DEADLINE, POLL};
use serde_json::json;
use tidal_cluster::Durability;
use tidal_wal::{FileIo, StdIo, WalFile};

/// The data dir whose WAL fsyncs wait, if any.
static HELD: Mutex<Option<PathBuf>> = Mutex::new(None);
static RELEASED: Condvar = Condvar::new();

fn hold(dir: Option<PathBuf>) {
    *HELD.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = dir;
    RELEASED.notify_all();
}

/// Ends the hold when dropped, also when an assertion fails (the cluster can then stop).
struct Release;

impl Drop for Release {
    fn drop(&mut self) {
        hold(None);
    }
}

/// Real files; `sync_data` of a file under the held data dir waits until the hold ends.
struct HeldSyncIo;

struct HeldFile {
    inner: Box<dyn WalFile>,
    path: PathBuf,
}

impl WalFile for HeldFile {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.inner.write_all(buf)
    }

    fn write_all_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.inner.write_all_at(offset, buf)
    }

    fn sync_data(&mut self) -> io::Result<()> {
        let held = HELD.lock().unwrap();
        let _released = RELEASED
            .wait_while(held, |held| held.as_ref().is_some_and(|dir| self.path.starts_with(dir)))
            .unwrap();
        self.inner.sync_data()
    }

    fn truncate(&mut self, len: u64) -> io::Result<()> {
        self.inner.truncate(len)
    }

    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
}

impl FileIo for HeldSyncIo {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        StdIo.create_dir_all(path)
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
        StdIo.list_dir(path)
    }

    fn open_append(&self, path: &Path) -> io::Result<Box<dyn WalFile>> {
        Ok(Box::new(HeldFile { inner: StdIo.open_append(path)?, path: path.to_path_buf() }))
    }

    fn read_all(&self, path: &Path) -> io::Result<Vec<u8>> {
        StdIo.read_all(path)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        StdIo.remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        StdIo.rename(from, to)
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        StdIo.sync_dir(path)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_shows_a_committed_write_before_its_own_fsync() {
    common::trace();
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new(root.path(), 3, Durability::Quorum, |config| {
        config.io.wal_files = Arc::new(HeldSyncIo);
    });
    cluster.start_all().await;
    cluster.put_acked(1, json!({"before": true})).await;
    let leader = cluster.leader().await;
    let held = cluster.followers_of(leader)[0];
    // Canonical: the WAL opens its files under the data dir as given.
    hold(Some(cluster.dirs[held].clone()));
    let release = Release;

    // Committed by the leader and the other follower; the held follower has it written only.
    let reply = cluster.client(leader).put_item(2, json!({"while": "held"}), None).await.unwrap();
    let path = format!("/v1/items/2?min_seqno={}", reply.seqno);
    let item: tidal_types::ItemView =
        cluster.client(held).json(reqwest::Method::GET, &path, None::<&()>).await.unwrap();
    assert_eq!(item.metadata, json!({"while": "held"}));
    let status = cluster.client(held).status().await.unwrap();
    assert!(
        status.durable_seqno < reply.seqno && status.applied_seqno >= reply.seqno,
        "the held follower must serve seqno {} before its fsync: durable {}, applied {}",
        reply.seqno,
        status.durable_seqno,
        status.applied_seqno
    );

    // The hold ends: its fsync completes and every node holds the same state.
    drop(release);
    let last = cluster.put_acked(3, json!({"after": true})).await.seqno;
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let durable = cluster.client(held).status().await.unwrap().durable_seqno;
        let digests = cluster.digests_at(last).await;
        if durable >= last && same(&digests) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no convergence: durable {durable}, {digests:?}");
        tokio::time::sleep(POLL).await;
    }
    cluster.stop_all().await;
}
