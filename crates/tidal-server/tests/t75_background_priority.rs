//! The engine's background threads yield the cores to the request path (issue 43): once a node
//! serves, its flusher and fjall's workers run `engine_background_nice` levels below the threads
//! that answer requests, and 0 leaves them where they were. One test per binary: the nice values
//! read here are the whole process's threads.
#![allow(clippy::unwrap_used)]

mod common;

use common::TestNode;
use tidal_core::priority;

/// The nice value of every thread of this process named `name` (at least one must exist).
fn nices_of(name: &str) -> Vec<i32> {
    let threads = priority::threads_named(name).unwrap();
    assert!(!threads.is_empty(), "no thread named {name}");
    threads.into_iter().filter_map(|tid| priority::nice_of(tid).ok()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_threads_run_below_the_request_path_once_serving() {
    common::trace();
    let base = priority::nice_of(priority::this_thread().unwrap()).unwrap();
    let expected = (base + 10).min(priority::NICE_MAX);
    {
        let dir = tempfile::tempdir().unwrap();
        let mut config = common::config(dir.path(), 4);
        config.engine_background_nice = 0;
        let node = TestNode::start(config).await;
        assert_eq!(nices_of("tidal-flusher"), vec![base], "0 leaves the flusher be");
        assert!(nices_of("fjall:worker").iter().all(|nice| *nice == base), "0 leaves fjall's workers be");
        node.stop().await;
    }
    {
        let dir = tempfile::tempdir().unwrap();
        let config = common::config(dir.path(), 4);
        assert_eq!(config.engine_background_nice, 10, "the default");
        let node = TestNode::start(config).await;
        let (status, reply) =
            node.request(reqwest::Method::PUT, "/v1/items/1", Some(r#"{"metadata":{"t":1}}"#), &[]).await;
        assert_eq!(status, 200, "{reply}");
        assert_eq!(nices_of("tidal-flusher"), vec![expected], "the flusher");
        let workers = nices_of("fjall:worker");
        assert!(
            workers.iter().all(|nice| *nice == expected),
            "fjall's workers at {workers:?}, not {expected}"
        );
        let applier = nices_of("tidal-applier");
        assert_eq!(applier, vec![base], "the applier answers writes: it keeps the node's priority");
        let wal = nices_of("tidal-wal-write");
        assert_eq!(wal, vec![base], "so does the WAL writer");
        node.stop().await;
    }
}
