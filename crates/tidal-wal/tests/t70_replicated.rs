//! Follower appends: replicated batches are written byte-identical to the leader's WAL, refused
//! (with nothing written) when they do not continue the log, and the batch index answers positions
//! after recovery and purge with memory bounded by the retained batches.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::*;
use tidal_types::{RecordKind, Seqno, Term, TermSeqno};
use tidal_wal::{Batch, Error, ManualClock, Position, ReplicatedSubmitError, SimIo, Wal};

const SEGMENT_BYTES_MAX: u64 = 600;

fn body(index: usize) -> Vec<u8> {
    let mut body = format!("write {index:03}:").into_bytes();
    body.resize(10 + (index * 29) % 90, b'a' + (index % 26) as u8);
    body
}

/// Writes `count` leader batches, switching to term 3 at write 10 and term 4 at write 25.
fn leader_writes(wal: &Wal, count: usize) {
    wal.set_term(Term(1));
    for index in 0..count {
        if index == 10 {
            wal.set_term(Term(3));
        }
        if index == 25 {
            wal.set_term(Term(4));
        }
        let kind = RecordKind::ALL[index % RecordKind::ALL.len()];
        wal.append_blocking(request(kind, (index % 4 + 1) as u32, &body(index))).unwrap();
    }
}

/// A hand-made replicated batch: 8-byte logged time then `body`.
fn batch(term: u64, first: u64, count: u32, time_ms: u64) -> Batch {
    let mut payload = time_ms.to_le_bytes().to_vec();
    payload.extend_from_slice(b"replicated");
    Batch::new(RecordKind::Signal, Term(term), Seqno(first), count, &payload)
}

fn files(io: &SimIo) -> Vec<(String, Vec<u8>)> {
    io.paths().iter().map(|path| (file_name(path), io.file_bytes(path).unwrap())).collect()
}

/// The files as the log holds them: each segment cut to its logical length and no `segment.prep`
/// or `segment.ready` (preallocated zeros depend on when each writer was idle, decisions/017, 033).
fn log_files(io: &SimIo, wal: &Wal) -> Vec<(String, Vec<u8>)> {
    let segments = wal.list_segments().unwrap();
    files(io)
        .into_iter()
        .filter(|(name, _)| name != "segment.prep" && name != "segment.ready")
        .map(|(name, mut bytes)| {
            if let Some(segment) = segments.iter().find(|segment| file_name(&segment.path) == name) {
                bytes.truncate(segment.bytes as usize);
            }
            (name, bytes)
        })
        .collect()
}

#[test]
fn replicated_appends_are_byte_identical_to_the_leader() {
    let leader_io = SimIo::new();
    let follower_io = SimIo::new();
    let leader_clock = Arc::new(ManualClock::new(5_000));
    // The follower's clock is far ahead: nothing it holds may carry its own time.
    let follower_clock = Arc::new(ManualClock::new(9_999_999));
    let (leader, _, leader_flushed) = open(&leader_io, small_config(SEGMENT_BYTES_MAX), &leader_clock);
    let (follower, _, follower_flushed) =
        open(&follower_io, small_config(SEGMENT_BYTES_MAX), &follower_clock);
    {
        tracing::info!("the leader writes 40 batches over three terms, rotating segments");
        leader_writes(&leader, 40);
        assert!(leader.list_segments().unwrap().len() > 3, "the workload must rotate");
    }
    {
        tracing::info!("the follower receives them in uneven chunks, in one case through submit_replicated");
        let batches = leader_flushed.batches();
        let mut at = 0;
        for chunk_len in [1, 3, 7, 2, 11, 5, 100].iter().cycle() {
            if at == batches.len() {
                break;
            }
            let end = (at + chunk_len).min(batches.len());
            let appended = follower.append_replicated_blocking(batches[at..end].to_vec()).unwrap();
            assert_eq!(appended.first, batches[at].first_seqno());
            assert_eq!(appended.last.seqno, batches[end - 1].last_seqno());
            assert_eq!(appended.last.term, batches[end - 1].term());
            at = end;
        }
    }
    {
        tracing::info!("every file, the read-back, the hook and the positions are identical");
        assert_eq!(log_files(&follower_io, &follower), log_files(&leader_io, &leader));
        assert_eq!(read_all(&follower, 1), read_all(&leader, 1));
        assert_eq!(follower_flushed.batches(), leader_flushed.batches());
        assert_eq!(follower.term_history(), leader.term_history());
        assert_eq!(follower.last_position(), leader.last_position());
        assert_eq!(follower.durable_seqno(), leader.durable_seqno());
        assert_eq!(follower.term(), Term(0), "replicated batches do not move the WAL's own term");
    }
    {
        tracing::info!("after a reopen the follower continues and promotion works: its own append follows");
        follower.shutdown();
        drop(follower);
        let (follower, recovery, _) = open(&follower_io, small_config(SEGMENT_BYTES_MAX), &follower_clock);
        assert_eq!(recovery.durable, leader.durable_seqno());
        assert_eq!(recovery.last_term, Term(4));
        follower.set_term(Term(5));
        let appended = follower.append_blocking(request(RecordKind::Control, 1, b"leader start")).unwrap();
        assert_eq!(appended.first, leader.durable_seqno().next());
        assert_eq!(appended.time_ms, 9_999_999);
    }
}

#[test]
fn a_request_that_does_not_continue_the_log_writes_nothing() {
    let io = SimIo::new();
    let clock = Arc::new(ManualClock::new(1_000));
    let (wal, _, flushed) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
    wal.append_replicated_blocking(vec![batch(2, 1, 3, 10), batch(2, 4, 2, 11)]).unwrap();
    // The writer prepares its next segment while idle (decisions/017): let it finish first.
    assert!(wal.wait_segment_prepared(std::time::Duration::from_secs(30)));
    let before = files(&io);
    let refused = |failed: bool| {
        assert!(failed);
        assert_eq!(files(&io), before, "a refused request wrote something");
        assert_eq!(wal.durable_seqno(), Seqno(5));
        assert!(!wal.is_poisoned(), "a refusal does not poison");
    };
    {
        tracing::info!("a gap, an overlap, a lower term: refused at sequencing time");
        let gap = wal.append_replicated_blocking(vec![batch(2, 7, 1, 12)]);
        assert!(matches!(gap, Err(Error::NotContiguous { expected: Seqno(6), got: Seqno(7) })), "{gap:?}");
        refused(gap.is_err());
        let overlap = wal.append_replicated_blocking(vec![batch(2, 4, 2, 12)]);
        assert!(matches!(overlap, Err(Error::NotContiguous { .. })));
        refused(overlap.is_err());
        let lower = wal.append_replicated_blocking(vec![batch(1, 6, 1, 12)]);
        assert!(matches!(lower, Err(Error::TermRegression { term: Term(1), last_term: Term(2) })));
        refused(lower.is_err());
    }
    {
        tracing::info!(
            "a malformed request is refused at submit: not contiguous inside, terms going down, empty"
        );
        let inner_gap = wal.submit_replicated(vec![batch(2, 6, 1, 12), batch(2, 8, 1, 12)], Box::new(|_| {}));
        assert!(matches!(inner_gap, Err(ReplicatedSubmitError::Invalid(_))));
        let inner_down =
            wal.submit_replicated(vec![batch(3, 6, 1, 12), batch(2, 7, 1, 12)], Box::new(|_| {}));
        assert!(matches!(inner_down, Err(ReplicatedSubmitError::Invalid(_))));
        assert!(matches!(
            wal.submit_replicated(Vec::new(), Box::new(|_| {})),
            Err(ReplicatedSubmitError::Invalid(_))
        ));
        assert_eq!(files(&io), before);
    }
    {
        tracing::info!("a leader append below the log's last term is refused: a follower must not sequence");
        let stale = wal.append_blocking(request(RecordKind::Signal, 1, b"stray"));
        assert!(
            matches!(stale, Err(Error::TermRegression { term: Term(0), last_term: Term(2) })),
            "{stale:?}"
        );
        refused(stale.is_err());
    }
    {
        tracing::info!(
            "a stray leader append in the right term takes the next seqno; the replicated one then fails"
        );
        wal.set_term(Term(2));
        wal.append_blocking(request(RecordKind::Signal, 1, b"stray")).unwrap();
        let after_stray = wal.append_replicated_blocking(vec![batch(2, 6, 1, 12)]);
        assert!(matches!(after_stray, Err(Error::NotContiguous { expected: Seqno(7), got: Seqno(6) })));
    }
    {
        tracing::info!("in one drain, a refused request does not stop the others");
        let results = Arc::new(std::sync::Mutex::new(Vec::new()));
        for (first, term) in [(7, 2), (9, 2), (8, 3)] {
            let results = results.clone();
            let done = Box::new(move |result: Result<tidal_wal::ReplicatedAppended, Error>| {
                results.lock().unwrap().push((first, result.is_ok()));
            });
            wal.submit_replicated(vec![batch(term, first, 1, 13)], done).unwrap();
        }
        wal.shutdown();
        assert_eq!(*results.lock().unwrap(), vec![(7, true), (9, false), (8, true)]);
        let seqnos: Vec<u64> = flushed.batches().iter().map(|b| b.first_seqno().get()).collect();
        assert_eq!(seqnos, vec![1, 4, 6, 7, 8]);
        assert_eq!(wal.term_history().last(), Some(&TermSeqno { term: Term(3), seqno: Seqno(8) }));
    }
}

/// Checks `locate` and `term_at` for every seqno around the retained range.
fn check_positions(wal: &Wal) {
    let purged = wal.purged().seqno;
    let durable = wal.durable_seqno();
    let batches = read_all(wal, purged.get() + 1);
    assert_eq!(wal.indexed_batches(), batches.len(), "index holds exactly the retained batches");
    assert_eq!(wal.index_bytes(), 8 * batches.len());
    for seqno in 0..=purged.get() {
        assert_eq!(wal.locate(Seqno(seqno)), Position::Purged, "seqno {seqno}");
    }
    for batch in &batches {
        for seqno in batch.first_seqno().get()..=batch.last_seqno().get() {
            let expected =
                Position::In { term: batch.term(), first: batch.first_seqno(), last: batch.last_seqno() };
            assert_eq!(wal.locate(Seqno(seqno)), expected, "seqno {seqno}");
            assert_eq!(wal.term_at(Seqno(seqno)), Some(batch.term()));
        }
    }
    assert_eq!(wal.locate(durable.next()), Position::Beyond);
    assert_eq!(wal.term_at(durable.next()), None);
    assert_eq!(wal.term_at(Seqno(0)), None);
    let last_term = batches.last().map_or(wal.purged().term, |batch| batch.term());
    assert_eq!(wal.last_position(), TermSeqno { term: last_term, seqno: durable });
}

#[test]
fn positions_after_recovery_and_purge_and_the_index_stays_bounded() {
    let io = SimIo::new();
    let clock = Arc::new(ManualClock::new(1_000));
    {
        tracing::info!("an empty log: everything is beyond, the last position is (0, 0)");
        let (wal, _, _) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
        assert_eq!(wal.last_position(), TermSeqno::default());
        assert_eq!(wal.locate(Seqno(1)), Position::Beyond);
        assert_eq!(wal.locate(Seqno(0)), Position::Purged);
        leader_writes(&wal, 40);
        check_positions(&wal);
    }
    let (wal, _, _) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
    {
        tracing::info!("recovery rebuilds the same index");
        check_positions(&wal);
        assert_eq!(wal.last_position().term, Term(4));
    }
    {
        tracing::info!("purges release index entries; purged seqnos still have a term from the history");
        let total = wal.indexed_batches();
        let mut horizon = 1;
        while horizon < wal.durable_seqno().get() {
            horizon += 13;
            wal.purge_below(Seqno(horizon)).unwrap();
            check_positions(&wal);
        }
        assert!(wal.indexed_batches() < total / 3, "purge must release most of the index");
        assert_eq!(wal.term_at(Seqno(1)), Some(Term(1)));
    }
    {
        tracing::info!("and a reopen after purges agrees");
        let expected = (wal.indexed_batches(), wal.last_position(), wal.purged());
        wal.shutdown();
        drop(wal);
        let (wal, _, _) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
        assert_eq!((wal.indexed_batches(), wal.last_position(), wal.purged()), expected);
        check_positions(&wal);
    }
}

/// What the callbacks of one replicated request saw, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seen {
    /// `on_written`, with the WAL's durable frontier at that moment.
    Written { durable: Seqno },
    /// The completion: the last seqno, or the error's text.
    Done(Result<Seqno, String>),
}

/// Submits `batches` and returns what the callbacks saw, in order, once the completion ran.
fn submit_watched(wal: &Wal, batches: Vec<Batch>) -> Vec<Seen> {
    let (seen, calls) = std::sync::mpsc::channel();
    let (on_written, done) = (seen.clone(), seen);
    let probe = wal.clone();
    wal.submit_replicated_with(
        batches,
        Some(Box::new(move || on_written.send(Seen::Written { durable: probe.durable_seqno() }).unwrap())),
        Box::new(move |result| {
            done.send(Seen::Done(result.map(|a| a.last.seqno).map_err(|e| e.to_string()))).unwrap()
        }),
    )
    .unwrap();
    let mut now = Vec::new();
    while !now.iter().any(|s| matches!(s, Seen::Done(_))) {
        now.push(calls.recv_timeout(std::time::Duration::from_secs(10)).expect("a callback"));
    }
    now
}

#[test]
fn on_written_runs_before_the_fsync_and_never_for_a_refused_request() {
    let io = SimIo::new();
    let clock = Arc::new(ManualClock::new(5_000));
    let (wal, _, _) = open(&io, small_config(SEGMENT_BYTES_MAX), &clock);
    {
        tracing::info!("accepted: written first (not durable yet), then completed once durable");
        assert_eq!(
            submit_watched(&wal, vec![batch(1, 1, 2, 10), batch(1, 3, 1, 11)]),
            vec![Seen::Written { durable: Seqno::ZERO }, Seen::Done(Ok(Seqno(3)))],
            "on_written runs after the write and before the fsync publishes seqno 3"
        );
    }
    {
        tracing::info!("refused (a gap): no on_written, the completion says why");
        let now = submit_watched(&wal, vec![batch(1, 9, 1, 12)]);
        assert!(matches!(now.as_slice(), [Seen::Done(Err(_))]), "{now:?}");
    }
    {
        tracing::info!("a failed fsync: written (on_written ran), then the completion fails");
        io.fail_next_sync();
        let now = submit_watched(&wal, vec![batch(1, 4, 1, 13)]);
        assert!(
            matches!(now.as_slice(), [Seen::Written { durable: Seqno(3) }, Seen::Done(Err(_))]),
            "{now:?}"
        );
        assert!(wal.is_poisoned());
    }
}
