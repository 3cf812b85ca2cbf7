//! `Wal::holds` and `Wal::read_raw_after`: a pull is served only after a position this log holds,
//! checked under the log lock together with the reader's start (decisions/057, finding 2 of the
//! safety review). A source that quarantines and refills between a caller's own check and the
//! reader's start must not pair the old `prev` with batches of the new log.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::*;
use tidal_types::{RecordKind, Seqno, Term, TermSeqno};
use tidal_wal::{Batch, Error, FlushedHook, ManualClock, SimIo, Wal};

/// A hook that keeps nothing (the common one asserts seqno order, which a truncation breaks).
struct NoHook;

impl FlushedHook for NoHook {
    fn flushed(&mut self, _batches: &[Batch]) {}
}

fn open_plain(io: &SimIo, clock: u64) -> Wal {
    let clock = Arc::new(ManualClock::new(clock));
    Wal::open(small_config(1 << 20), Arc::new(io.clone()), clock, Box::new(NoHook)).unwrap().0
}

fn t(term: u64, seqno: u64) -> TermSeqno {
    TermSeqno { term: Term(term), seqno: Seqno(seqno) }
}

/// A log of term 1: seqnos 1..=10 in batches of 2.
fn term_one_log(io: &SimIo) -> Wal {
    let wal = open_plain(io, 1_000);
    wal.set_term(Term(1));
    for index in 0..5 {
        wal.append_blocking(request(RecordKind::Signal, 2, format!("t1 {index}").as_bytes())).unwrap();
    }
    wal
}

/// Batches of another log: term 1 through seqno 6, then term 2 from 7 (a new leader's log).
fn term_two_suffix(from_log: &Wal) -> Vec<Batch> {
    let io = SimIo::new();
    let other = open_plain(&io, 2_000);
    other.append_replicated_blocking(read_all(from_log, 1)[..3].to_vec()).unwrap();
    other.set_term(Term(2));
    other.append_blocking(request(RecordKind::Control, 1, b"LeaderStart t2")).unwrap();
    for index in 0..3 {
        other.append_blocking(request(RecordKind::Signal, 1, format!("t2 {index}").as_bytes())).unwrap();
    }
    read_all(&other, 7)
}

#[test]
fn holds_knows_batch_ends_with_their_terms() {
    let io = SimIo::new();
    let wal = term_one_log(&io);
    assert!(wal.holds(t(0, 0)));
    assert!(wal.holds(t(1, 2)) && wal.holds(t(1, 10)));
    assert!(!wal.holds(t(1, 3)), "inside a batch");
    assert!(!wal.holds(t(2, 4)), "another term");
    assert!(!wal.holds(t(1, 12)), "past the end");
    assert!(!wal.holds(t(1, 0)), "seqno 0 has term 0");
}

#[test]
fn read_raw_after_refuses_a_position_the_log_does_not_hold() {
    let io = SimIo::new();
    let wal = term_one_log(&io);
    let mut reader = wal.read_raw_after(t(1, 6)).unwrap();
    let run = reader.next_run(1 << 20).unwrap().unwrap();
    assert_eq!((run.last, run.batches), (t(1, 10), 2));
    assert!(matches!(wal.read_raw_after(t(2, 6)), Err(Error::NotInLog { position }) if position == t(2, 6)));
    assert!(matches!(wal.read_raw_after(t(1, 5)), Err(Error::NotInLog { .. })));
}

/// The interleaving of finding 2, in order: the server checks `prev`, the log is quarantined and
/// refilled with another log's batches, then the reader starts. `read_raw_from` (what a57b07b
/// served pulls with) reads the new batches after the stale `prev`; `read_raw_after` refuses.
#[test]
fn a_quarantine_and_refill_after_the_check_is_caught_at_the_start() {
    let io = SimIo::new();
    let wal = term_one_log(&io);
    let replacement = term_two_suffix(&wal);
    let prev = t(1, 8);
    assert!(wal.holds(prev), "the server's first check passes");
    wal.quarantine_from(Seqno(7)).unwrap();
    wal.append_replicated_blocking(replacement).unwrap();
    assert!(!wal.holds(prev));
    assert!(matches!(wal.read_raw_after(prev), Err(Error::NotInLog { .. })));
    let mut stale = wal.read_raw_from(prev.seqno.next()).unwrap();
    let run = stale.next_run(1 << 20).unwrap().unwrap();
    assert_eq!(run.last.term, Term(2), "the unchecked reader serves the new log after the old prev");
}

/// The same race with real threads: one thread flips the log between the term-1 suffix and the
/// term-2 one; the other starts readers after (1, 8) and reads. Every run it gets must be the
/// term-1 batches that followed (1, 8); anything else is refused or ends with a truncation error.
#[test]
fn a_reader_never_serves_another_log_after_its_prev_under_concurrent_truncation() {
    let io = SimIo::new();
    let wal = term_one_log(&io);
    let original = read_all(&wal, 7);
    let replacement = term_two_suffix(&wal);
    let done = Arc::new(AtomicBool::new(false));
    let flipper = {
        let (wal, done) = (wal.clone(), done.clone());
        std::thread::spawn(move || {
            for _ in 0..200 {
                wal.quarantine_from(Seqno(7)).unwrap();
                wal.append_replicated_blocking(replacement.clone()).unwrap();
                wal.quarantine_from(Seqno(7)).unwrap();
                wal.append_replicated_blocking(original.clone()).unwrap();
            }
            done.store(true, Ordering::SeqCst);
        })
    };
    let (mut served, mut refused) = (0u64, 0u64);
    while !done.load(Ordering::SeqCst) {
        let Ok(mut reader) = wal.read_raw_after(t(1, 8)) else {
            refused += 1;
            continue;
        };
        match reader.next_run(1 << 20) {
            Ok(Some(run)) => {
                assert_eq!(run.last, t(1, 10), "a run after (1, 8) must be the term-1 batch 9..=10");
                served += 1;
            }
            Ok(None) => {}
            Err(Error::TruncatedWhileReading { .. }) => refused += 1,
            Err(error) => panic!("unexpected read error: {error}"),
        }
    }
    flipper.join().unwrap();
    assert!(served + refused > 0, "the reader ran: served {served}, refused {refused}");
}
