//! The raw reader (serving a pull): runs of segment bytes, cut at batch boundaries, byte-identical
//! to what the verifying reader returns, bounded in size, and refusing damaged framing.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::*;
use tidal_types::{RecordKind, Seqno, TermSeqno};
use tidal_wal::{decode_batch, Error, ManualClock, RawRun, SimIo, Wal, HEADER_LEN};

fn runs(wal: &Wal, from: u64, bytes_max: usize) -> Result<Vec<RawRun>, Error> {
    let mut reader = wal.read_raw_from(Seqno(from))?;
    let mut runs = Vec::new();
    while let Some(run) = reader.next_run(bytes_max)? {
        runs.push(run);
    }
    Ok(runs)
}

/// Splits a run into its batches (verifying each one) and checks its `last` and `batches`.
fn batches_of(run: &RawRun) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < run.bytes.len() {
        let batch = decode_batch(&run.bytes[at..]).unwrap();
        out.push(batch.encoded.to_vec());
        at += batch.encoded.len();
        if at == run.bytes.len() {
            assert_eq!(run.last, TermSeqno { term: batch.header.term, seqno: batch.header.last_seqno() });
        }
    }
    assert_eq!(out.len(), run.batches);
    out
}

#[test]
fn runs_are_the_verified_batches_cut_at_boundaries_and_bounded() {
    let io = SimIo::new();
    let clock = Arc::new(ManualClock::new(5));
    let (wal, _, _) = open(&io, small_config(700), &clock);
    for index in 0..60u32 {
        // A few batches longer than the smaller bounds below: a run then holds that one batch.
        let len = if index % 17 == 5 { 300 } else { (index as usize * 13) % 120 };
        wal.append_blocking(request(
            RecordKind::ALL[index as usize % 9],
            index % 3 + 1,
            &vec![index as u8; len],
        ))
        .unwrap();
    }
    assert!(wal.list_segments().unwrap().len() > 3, "rotation");
    let durable = wal.durable_seqno().get();
    for bytes_max in [1, HEADER_LEN, 100, 250, 500, 1 << 20] {
        for from in 0..=durable + 1 {
            let expected: Vec<Vec<u8>> = read_all(&wal, from).iter().map(|b| b.encoded().to_vec()).collect();
            let runs = runs(&wal, from, bytes_max).unwrap();
            let mut got = Vec::new();
            for run in &runs {
                let batches = batches_of(run);
                assert!(
                    run.bytes.len() <= bytes_max.max(HEADER_LEN) || batches.len() == 1,
                    "a run of {} bytes and {} batches over the bound {bytes_max}",
                    run.bytes.len(),
                    batches.len()
                );
                got.extend(batches);
            }
            assert_eq!(got, expected, "from {from}, bound {bytes_max}");
        }
    }
}

#[test]
fn damaged_framing_is_corruption_and_a_purge_is_reported() {
    let io = SimIo::new();
    let clock = Arc::new(ManualClock::new(5));
    let (wal, _, _) = open(&io, small_config(400), &clock);
    for index in 0..20u8 {
        wal.append_blocking(request(RecordKind::Signal, 2, &[index; 40])).unwrap();
    }
    let segments = wal.list_segments().unwrap();
    {
        tracing::info!("phase: a flipped bit in a payload passes here (the receiver checks seals)");
        io.flip_bit(&segments[1].path, (HEADER_LEN as u64 + 3) * 8).unwrap();
        assert_eq!(runs(&wal, 1, 1 << 20).unwrap().iter().map(|r| r.batches).sum::<usize>(), 20);
        let bad = runs(&wal, 1, 1 << 20).unwrap().into_iter().flat_map(|run| run.bytes).collect::<Vec<u8>>();
        assert!(decode_batch(&bad[segments[0].bytes as usize..]).is_err(), "the receiver's check fails");
    }
    {
        tracing::info!("phase: a flipped bit in a header's length or seqno is corruption, named by file");
        io.flip_bit(&segments[2].path, 17 * 8).unwrap();
        let err = runs(&wal, 1, 1 << 20).unwrap_err();
        assert!(matches!(&err, Error::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains(&file_name(&segments[2].path)), "{err}");
        let cut = segments[3].bytes - 10;
        io.truncate_file(&segments[3].path, cut).unwrap();
        let err = runs(&wal, segments[3].first_seqno.get(), 1 << 20).unwrap_err();
        assert!(matches!(&err, Error::Corrupt { .. }), "a cut segment: {err}");
    }
    {
        tracing::info!("phase: a purge before the read is Purged");
        wal.purge_below(segments[4].first_seqno).unwrap();
        assert!(matches!(runs(&wal, 1, 1 << 20), Err(Error::Purged { .. })));
    }
}
