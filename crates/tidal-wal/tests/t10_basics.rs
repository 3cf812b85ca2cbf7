//! Basics: seqno assignment, restart, read-back, rotation, purge, terms, logged time, refusals.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::*;
use tidal_types::{RecordKind, Seqno, Term, TermSeqno};
use tidal_wal::{
    Error, ManualClock, NoopHook, SimIo, StdIo, SubmitError, SystemClock, Wal, WalConfig, HEADER_LEN,
};

#[test]
fn seqnos_are_contiguous_and_continue_after_restart() {
    let io = SimIo::new();
    let clock = Arc::new(ManualClock::new(1_000));
    let recorded_before;
    {
        tracing::info!("phase: a fresh WAL assigns seqnos from 1");
        let (wal, recovery, recorded) = open(&io, small_config(1 << 20), &clock);
        assert_eq!(recovery.durable, Seqno(0));
        assert_eq!(recovery.truncated, None);
        let a = wal.append_blocking(request(RecordKind::Signal, 3, b"abc")).unwrap();
        let b = wal.append_blocking(request(RecordKind::ItemMetadata, 1, b"meta")).unwrap();
        assert_eq!((a.first, a.last), (Seqno(1), Seqno(3)));
        assert_eq!((b.first, b.last), (Seqno(4), Seqno(4)));
        assert_eq!(wal.durable_seqno(), Seqno(4));
        wal.shutdown();
        recorded_before = recorded.batches();
        assert_eq!(recorded_before.len(), 2);
    }
    {
        tracing::info!("phase: a reopened WAL continues from the durable frontier");
        let (wal, recovery, recorded) = open(&io, small_config(1 << 20), &clock);
        assert_eq!(recovery.durable, Seqno(4));
        assert_eq!(recovery.batches, 2);
        assert_eq!(recovery.last_time_ms, 1_000);
        let c = wal.append_blocking(request(RecordKind::Control, 1, b"c")).unwrap();
        assert_eq!((c.first, c.last), (Seqno(5), Seqno(5)));
        let all = read_all(&wal, 1);
        assert_eq!(&all[..2], &recorded_before[..]);
        assert_eq!(all[2], recorded.batches()[0]);
    }
}

#[test]
fn read_from_every_seqno_returns_the_containing_batch_onwards_byte_identical() {
    let io = SimIo::new();
    let clock = Arc::new(ManualClock::new(5));
    let (wal, _, recorded) = open(&io, small_config(400), &clock);
    for index in 0..40u32 {
        let body = vec![index as u8; (index as usize * 7) % 90];
        wal.append_blocking(request(RecordKind::ALL[index as usize % 9], index % 4 + 1, &body)).unwrap();
    }
    let segments = wal.list_segments().unwrap();
    assert!(segments.len() > 3, "rotation made {} segments", segments.len());
    for pair in segments.windows(2) {
        assert_eq!(pair[1].first_seqno, pair[0].last_seqno.unwrap().next());
    }
    let hooked = recorded.batches();
    let durable = wal.durable_seqno().get();
    for from in 0..=durable + 2 {
        let got = read_all(&wal, from);
        let expected: Vec<_> =
            hooked.iter().filter(|batch| batch.last_seqno().get() >= from).cloned().collect();
        assert_eq!(got, expected, "read_from({from})");
        if let Some(first) = got.first() {
            assert!(first.first_seqno().get() <= from.max(1) && from.max(1) <= first.last_seqno().get());
        }
    }
    {
        tracing::info!("phase: the files hold exactly the hooked bytes, in order");
        let mut on_disk: Vec<u8> = Vec::new();
        for segment in &segments {
            // The active segment's file goes on with preallocated zeros (decisions/017).
            on_disk.extend(&io.synced_bytes(&segment.path).unwrap()[..segment.bytes as usize]);
        }
        let concatenated: Vec<u8> = hooked.iter().flat_map(|batch| batch.encoded().to_vec()).collect();
        assert_eq!(on_disk, concatenated);
    }
}

#[test]
fn purge_removes_whole_old_segments_and_survives_restart() {
    let io = SimIo::new();
    let clock = Arc::new(ManualClock::new(5));
    let config = small_config(300);
    let (wal, _, _) = open(&io, config.clone(), &clock);
    wal.set_term(Term(1));
    for index in 0..30u8 {
        if index == 12 {
            wal.set_term(Term(2));
        }
        wal.append_blocking(request(RecordKind::Signal, 2, &[index; 50])).unwrap();
    }
    let segments = wal.list_segments().unwrap();
    assert!(segments.len() >= 5);
    let horizon = segments[3].first_seqno.add(1);
    {
        tracing::info!("phase: purge below a seqno inside segment 3 removes segments 0..3 only");
        let report = wal.purge_below(horizon).unwrap();
        assert_eq!(report.segments_removed, 3);
        assert_eq!(report.purged.seqno, segments[2].last_seqno.unwrap());
        assert_eq!(report.first_retained, segments[3].first_seqno);
        assert_eq!(wal.list_segments().unwrap(), segments[3..].to_vec());
        for segment in &segments[..3] {
            assert!(io.file_bytes(&segment.path).is_err(), "{} still exists", segment.path.display());
        }
        let err = wal.read_from(Seqno(1)).err().unwrap();
        assert!(
            matches!(err, Error::Purged { requested: Seqno(1), first_retained } if first_retained == segments[3].first_seqno),
            "{err}"
        );
        let first = read_all(&wal, segments[3].first_seqno.get()).remove(0);
        assert_eq!(first.first_seqno(), segments[3].first_seqno);
    }
    {
        tracing::info!("phase: purging the active segment is never done, a second purge is a no-op");
        let report = wal.purge_below(Seqno(u64::MAX)).unwrap();
        assert_eq!(wal.list_segments().unwrap().len(), 1);
        assert!(report.segments_removed >= 1);
        let again = wal.purge_below(Seqno(u64::MAX)).unwrap();
        assert_eq!(again.segments_removed, 0);
    }
    let history = wal.term_history();
    let purged = wal.purged();
    assert_eq!(
        history,
        vec![TermSeqno { term: Term(1), seqno: Seqno(1) }, TermSeqno { term: Term(2), seqno: Seqno(25) }]
    );
    let durable = wal.durable_seqno();
    drop(wal);
    {
        tracing::info!("phase: after a crash and reopen, the purge point and term history are kept");
        io.crash(tidal_wal::CrashMode::LoseUnsynced);
        let (wal, recovery, _) = open(&io, config, &clock);
        assert_eq!(recovery.durable, durable);
        assert_eq!(recovery.last_term, Term(2));
        assert_eq!(wal.term_history(), history);
        assert_eq!(wal.purged(), purged);
        assert!(matches!(wal.read_from(Seqno(1)), Err(Error::Purged { .. })));
        let next = wal.append_blocking(request(RecordKind::Signal, 1, b"x")).unwrap();
        assert_eq!(next.first, durable.next());
        assert_eq!(next.term, Term(2));
    }
}

#[test]
fn terms_are_stamped_monotone_and_recorded_in_the_history() {
    let io = SimIo::new();
    let clock = Arc::new(ManualClock::new(5));
    let (wal, _, _) = open(&io, small_config(1 << 20), &clock);
    assert_eq!(wal.term(), Term(0));
    wal.append_blocking(request(RecordKind::Control, 1, b"")).unwrap();
    wal.set_term(Term(3));
    let a = wal.append_blocking(request(RecordKind::Control, 1, b"")).unwrap();
    wal.set_term(Term(2));
    assert_eq!(wal.term(), Term(3), "a lower term is ignored");
    let b = wal.append_blocking(request(RecordKind::Control, 1, b"")).unwrap();
    wal.set_term(Term(7));
    let c = wal.append_blocking(request(RecordKind::Signal, 4, b"")).unwrap();
    assert_eq!((a.term, b.term, c.term), (Term(3), Term(3), Term(7)));
    let expected =
        vec![TermSeqno { term: Term(3), seqno: Seqno(2) }, TermSeqno { term: Term(7), seqno: Seqno(4) }];
    assert_eq!(wal.term_history(), expected);
    let terms: Vec<Term> = read_all(&wal, 1).iter().map(|batch| batch.term()).collect();
    assert_eq!(terms, vec![Term(0), Term(3), Term(3), Term(7)]);
    drop(wal);
    let (wal, recovery, _) = open(&io, small_config(1 << 20), &clock);
    assert_eq!(recovery.last_term, Term(7));
    assert_eq!(wal.term(), Term(7));
    assert_eq!(wal.term_history(), expected);
}

#[test]
fn logged_time_never_goes_backwards_and_is_stamped_into_the_payload() {
    let io = SimIo::new();
    let clock = Arc::new(ManualClock::new(10_000));
    let (wal, _, _) = open(&io, small_config(1 << 20), &clock);
    let mut times = Vec::new();
    for now in [10_000, 9_000, 12_000, 11_999, 12_001] {
        clock.set(now);
        times.push(wal.append_blocking(request(RecordKind::Signal, 1, b"payload")).unwrap().time_ms);
    }
    assert_eq!(times, vec![10_000, 10_000, 12_000, 12_000, 12_001]);
    let stamped: Vec<u64> = read_all(&wal, 1)
        .iter()
        .map(|batch| u64::from_le_bytes(batch.payload()[..8].try_into().unwrap()))
        .collect();
    assert_eq!(stamped, times);
    drop(wal);
    tracing::info!("phase: the previous time survives a restart");
    clock.set(1);
    let (wal, recovery, _) = open(&io, small_config(1 << 20), &clock);
    assert_eq!(recovery.last_time_ms, 12_001);
    assert_eq!(wal.append_blocking(request(RecordKind::Signal, 1, b"p")).unwrap().time_ms, 12_001);
}

#[test]
fn invalid_requests_are_refused_and_change_nothing() {
    let io = SimIo::new();
    let clock = Arc::new(ManualClock::new(5));
    let (wal, _, _) = open(&io, small_config(1 << 20), &clock);
    let short = tidal_wal::AppendRequest { kind: RecordKind::Signal, event_count: 1, payload: vec![0; 7] };
    assert!(matches!(wal.submit(short, Box::new(|_| panic!("completed"))), Err(SubmitError::Invalid(_))));
    let zero = request(RecordKind::Signal, 0, b"");
    assert!(matches!(wal.append_blocking(zero), Err(Error::Invalid(_))));
    assert_eq!(wal.durable_seqno(), Seqno(0));
    assert_eq!(wal.append_blocking(request(RecordKind::Signal, 1, b"")).unwrap().first, Seqno(1));
}

#[test]
fn queue_full_hands_the_request_back_and_shutdown_drains_the_queue() {
    let io = SimIo::new();
    io.set_sync_delay(std::time::Duration::from_millis(20));
    let clock = Arc::new(ManualClock::new(5));
    let mut config = small_config(1 << 20);
    config.queue_batches_max = 4;
    let (wal, _, _) = open(&io, config, &clock);
    let (sender, receiver) = std::sync::mpsc::channel();
    let mut full = 0;
    let mut accepted = 0;
    for index in 0..20u8 {
        let sender = sender.clone();
        match wal.submit(
            request(RecordKind::Signal, 1, &[index]),
            Box::new(move |result| sender.send(result).unwrap()),
        ) {
            Ok(()) => accepted += 1,
            Err(SubmitError::QueueFull(back)) => {
                assert_eq!(back.payload[8], index, "the same request comes back");
                full += 1;
            }
            Err(other) => panic!("{other}"),
        }
    }
    assert!(full > 0 && accepted >= 4, "full={full} accepted={accepted}");
    wal.shutdown();
    wal.shutdown();
    drop(sender);
    let results: Vec<_> = receiver.iter().collect();
    assert_eq!(results.len(), accepted);
    assert!(results.iter().all(Result::is_ok));
    assert_eq!(wal.durable_seqno(), Seqno(accepted as u64));
    assert!(matches!(
        wal.submit(request(RecordKind::Signal, 1, b""), Box::new(|_| ())),
        Err(SubmitError::Closed)
    ));
    assert!(matches!(wal.append_blocking(request(RecordKind::Signal, 1, b"")), Err(Error::Closed)));
}

#[test]
fn drains_are_bounded_by_bytes_but_take_at_least_one_batch() {
    let io = SimIo::new();
    io.set_sync_delay(std::time::Duration::from_millis(5));
    let clock = Arc::new(ManualClock::new(5));
    let mut config = small_config(1 << 30);
    config.drain_bytes_max = 10; // smaller than any batch
    let (wal, _, _) = open(&io, config, &clock);
    let (sender, receiver) = std::sync::mpsc::channel();
    for _ in 0..10 {
        let sender = sender.clone();
        wal.submit(request(RecordKind::Signal, 1, &[1; 100]), Box::new(move |r| sender.send(r).unwrap()))
            .unwrap();
    }
    drop(sender);
    assert_eq!(receiver.iter().filter(Result::is_ok).count(), 10);
    let stats = wal.stats();
    assert_eq!(stats.drains, 10, "one batch per drain");
    assert_eq!(stats.batches, 10);
    assert_eq!(stats.bytes, 10 * (HEADER_LEN as u64 + 108));
}

#[test]
fn std_io_round_trip_in_a_temp_dir() {
    let temp = tempfile::tempdir().unwrap();
    let mut config = WalConfig::new(temp.path().join("wal"));
    config.segment_bytes_max = 1000;
    let open = |config: WalConfig| {
        Wal::open(config, Arc::new(StdIo), Arc::new(SystemClock), Box::new(NoopHook)).unwrap()
    };
    let (wal, _) = open(config.clone());
    for index in 0..50u8 {
        wal.append_blocking(request(RecordKind::StreamEvents, 2, &[index; 60])).unwrap();
    }
    let before = read_all(&wal, 1);
    assert!(wal.list_segments().unwrap().len() > 3);
    drop(wal);
    let (wal, recovery) = open(config);
    assert_eq!(recovery.durable, Seqno(100));
    assert_eq!(read_all(&wal, 1), before);
    wal.purge_below(Seqno(50)).unwrap();
    assert!(matches!(wal.read_from(Seqno(1)), Err(Error::Purged { .. })));
    assert_eq!(read_all(&wal, 50)[0].payload()[8..], [24u8; 60]);
}

#[test]
fn the_hook_sees_a_batch_before_its_completion_runs() {
    let io = SimIo::new();
    let clock = Arc::new(ManualClock::new(5));
    let (wal, _, recorded) = open(&io, small_config(1 << 20), &clock);
    let (sender, receiver) = std::sync::mpsc::channel();
    for index in 0..20u8 {
        let (recorded, sender) = (recorded.clone(), sender.clone());
        let done = Box::new(move |result: Result<tidal_wal::Appended, Error>| {
            let appended = result.unwrap();
            let seen = recorded.batches().iter().any(|batch| batch.first_seqno() == appended.first);
            sender.send(seen).unwrap();
        });
        wal.submit(request(RecordKind::Signal, 1, &[index]), done).unwrap();
    }
    drop(sender);
    let seen: Vec<bool> = receiver.iter().collect();
    assert_eq!(seen.len(), 20);
    assert!(seen.iter().all(|seen| *seen));
}

#[test]
fn a_reader_whose_segment_is_purged_meanwhile_reports_purged() {
    let io = SimIo::new();
    let clock = Arc::new(ManualClock::new(5));
    let (wal, _, _) = open(&io, small_config(200), &clock);
    for index in 0..20u8 {
        wal.append_blocking(request(RecordKind::Signal, 1, &[index; 40])).unwrap();
    }
    let mut reader = wal.read_from(Seqno(1)).unwrap();
    assert_eq!(reader.next().unwrap().unwrap().first_seqno(), Seqno(1));
    wal.purge_below(Seqno(15)).unwrap();
    let rest: Vec<_> = reader.collect();
    assert!(matches!(rest.last(), Some(Err(Error::Purged { .. }))), "{rest:?}");
}
