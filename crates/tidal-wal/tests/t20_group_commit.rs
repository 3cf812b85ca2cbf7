//! Group commit: many concurrent writers, one fsync per drain, nothing completes before its fsync.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use tidal_types::{RecordKind, Seqno};
use tidal_wal::{Appended, Completion, ManualClock, SimIo, SubmitError};

const THREADS: usize = 16;
const PER_THREAD: usize = 60;

/// The unique body of request `index` of thread `thread`.
fn body(thread: usize, index: usize) -> Vec<u8> {
    format!("thread {thread:02} request {index:04} /").into_bytes()
}

#[test]
fn concurrent_submits_get_distinct_contiguous_ranges_and_share_fsyncs() {
    concurrent_submits(small_config(4096));
}

/// The same with the adaptive gather after every drain of 2 or more (experiments/021), and a bound
/// far above the fsync's 2 ms (the wait is capped by the last fsync's duration anyway): waiting for
/// stragglers changes which requests share an fsync, never what completes when.
#[test]
fn concurrent_submits_with_an_eager_gather() {
    let mut config = small_config(4096);
    config.gather_min_requests = 2;
    config.gather_wait_max = Duration::from_millis(50);
    concurrent_submits(config);
}

/// And with the gather off.
#[test]
fn concurrent_submits_without_gather() {
    let mut config = small_config(4096);
    config.gather_min_requests = 0;
    concurrent_submits(config);
}

fn concurrent_submits(config: tidal_wal::WalConfig) {
    let io = SimIo::new();
    io.set_sync_delay(Duration::from_millis(2));
    let clock = Arc::new(ManualClock::new(1));
    let gather_min = config.gather_min_requests;
    let (wal, _, recorded) = open(&io, config, &clock);
    let results: Arc<Mutex<Vec<(usize, usize, Appended)>>> = Arc::default();
    let violations: Arc<Mutex<Vec<String>>> = Arc::default();
    let threads: Vec<_> = (0..THREADS)
        .map(|thread| {
            let wal = wal.clone();
            let io = io.clone();
            let results = results.clone();
            let violations = violations.clone();
            std::thread::spawn(move || {
                let (sender, receiver) = std::sync::mpsc::channel();
                for index in 0..PER_THREAD {
                    let events = (index % 5 + 1) as u32;
                    let make_done = || -> Completion {
                        let (io, sender, violations) = (io.clone(), sender.clone(), violations.clone());
                        Box::new(move |result: Result<Appended, tidal_wal::Error>| {
                            let appended = result.expect("append");
                            // Nothing completes before its fsync: the body must be in SYNCED bytes.
                            let synced = segment_paths(&io)
                                .iter()
                                .any(|path| contains(&io.synced_bytes(path).unwrap(), &body(thread, index)));
                            if !synced {
                                violations
                                    .lock()
                                    .unwrap()
                                    .push(format!("{thread}/{index} completed before its fsync"));
                            }
                            sender.send((thread, index, appended)).unwrap();
                        })
                    };
                    // Alternate blocking appends and async submits.
                    if index % 3 == 0 {
                        let req = request(RecordKind::Signal, events, &body(thread, index));
                        let appended = wal.append_blocking(req).unwrap();
                        make_done()(Ok(appended));
                        continue;
                    }
                    let mut req = request(RecordKind::Signal, events, &body(thread, index));
                    loop {
                        match wal.submit(req, make_done()) {
                            Ok(()) => break,
                            Err(SubmitError::QueueFull(back)) => {
                                req = back;
                                std::thread::sleep(Duration::from_micros(200));
                            }
                            Err(other) => panic!("{other}"),
                        }
                    }
                }
                drop(sender);
                results.lock().unwrap().extend(receiver.iter().take(PER_THREAD));
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let violations = violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "{violations:?}");
    let mut results = results.lock().unwrap().clone();
    assert_eq!(results.len(), THREADS * PER_THREAD);
    results.sort_by_key(|(_, _, appended)| appended.first);
    let mut next = Seqno(1);
    for (thread, index, appended) in &results {
        assert_eq!(appended.first, next, "ranges overlap or leave a gap");
        assert_eq!(appended.last.get() - appended.first.get() + 1, (index % 5 + 1) as u64);
        next = appended.last.next();
        let batch = read_all(&wal, appended.first.get()).remove(0);
        assert_eq!(
            batch.payload()[8..],
            body(*thread, *index)[..],
            "batch at {} holds another payload",
            appended.first
        );
    }
    assert_eq!(wal.durable_seqno(), Seqno(next.get() - 1));
    let stats = wal.stats();
    let batches = (THREADS * PER_THREAD) as u64;
    assert_eq!(stats.batches, batches);
    assert_eq!(recorded.batches().len() as u64, batches);
    assert!(
        stats.fsyncs * 3 < batches,
        "group commit should share fsyncs: {} fsyncs for {batches} batches",
        stats.fsyncs
    );
    assert!(stats.rotations > 0);
    // Every request was one batch, and every drain is counted once in the histogram.
    assert_eq!(stats.drain_requests_sum, batches);
    assert_eq!(stats.drain_requests_buckets.iter().sum::<u64>(), stats.drains);
    if gather_min == 0 {
        assert_eq!(stats.gathers, 0);
    }
    tracing::info!(fsyncs = stats.fsyncs, batches, "group commit");
}
