//! A WAL segment as recovery scans it: whole batches built from the input (random bytes almost never
//! carry a valid BLAKE3 seal, so the batches are encoded first and then damaged), followed by
//! preallocated zeros, then one damage: a bit flip, a cut, or bytes written over. Checked:
//!
//! - `scan_segment` never panics, and what it reports is a prefix: re-scanning exactly the bytes
//!   it accepted gives the same batches and a clean end;
//! - a flipped bit inside a batch is never accepted: the scan stops at or before that batch;
//! - a cut of the last segment never leaves a part of a batch accepted: it is reported torn at a
//!   batch boundary (or the cut landed on one);
//! - undamaged input is accepted whole;
//! - every batch a scan accepts decodes and verifies on its own.
#![no_main]

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use tidal_types::{RecordKind, Seqno, Term};
use tidal_wal::segment::{scan_segment, ScanEnd};
use tidal_wal::{decode_batch, encode_batch};

#[derive(Arbitrary, Debug)]
struct BatchSpec {
    kind: u8,
    /// Added to the previous batch's term.
    term_step: u8,
    /// Events in the batch (at least 1).
    events: u8,
    payload: Vec<u8>,
}

#[derive(Arbitrary, Debug)]
enum Damage {
    None,
    Flip { bit: u32 },
    Cut { at: u32 },
    Overwrite { at: u32, bytes: Vec<u8> },
}

#[derive(Arbitrary, Debug)]
struct Input {
    first_seqno: u16,
    first_term: u8,
    batches: Vec<BatchSpec>,
    zeros: u16,
    damage: Damage,
    is_last: bool,
}

fuzz_target!(|input: Input| {
    let first = Seqno(u64::from(input.first_seqno) + 1);
    let mut bytes = Vec::new();
    let mut starts = Vec::new();
    let mut seqno = first;
    let mut term = Term(u64::from(input.first_term));
    for spec in input.batches.iter().take(32) {
        term = Term(term.0 + u64::from(spec.term_step % 3));
        let events = u32::from(spec.events.max(1));
        let kind = RecordKind::ALL[usize::from(spec.kind) % RecordKind::ALL.len()];
        let payload = &spec.payload[..spec.payload.len().min(4096)];
        starts.push(bytes.len());
        bytes.extend(encode_batch(kind, term, seqno, events, payload));
        seqno = Seqno(seqno.0 + u64::from(events));
    }
    let data_end = bytes.len();
    bytes.resize(data_end + usize::from(input.zeros % 2048), 0);
    let start_term = Term(u64::from(input.first_term));

    let intact = scan_segment(&bytes, first, start_term, input.is_last);
    assert_eq!(intact.end, ScanEnd::Clean, "undamaged segment: {intact:?}");
    assert_eq!(intact.batches as usize, starts.len());
    assert_eq!(intact.valid_len as usize, data_end);
    assert_eq!(intact.next_seqno, seqno);

    // The batches wholly before `at` (a damaged byte or a cut) may be accepted, no more.
    let batches_before = |at: usize| {
        starts.iter().zip(starts.iter().skip(1).chain([&data_end])).filter(|(_, end)| **end <= at).count()
    };
    let (damaged_from, cut) = match &input.damage {
        Damage::None => (None, false),
        Damage::Flip { bit } => {
            if bytes.is_empty() {
                return;
            }
            let bit = *bit as usize % (bytes.len() * 8);
            bytes[bit / 8] ^= 1 << (bit % 8);
            (Some(bit / 8), false)
        }
        Damage::Cut { at } => {
            let at = *at as usize % (bytes.len() + 1);
            bytes.truncate(at);
            (Some(at), true)
        }
        Damage::Overwrite { at, bytes: new } => {
            if bytes.is_empty() {
                return;
            }
            let at = *at as usize % bytes.len();
            let end = (at + new.len()).min(bytes.len());
            // The first byte that actually changes (writing a byte over itself damages nothing).
            let first_changed = bytes[at..end].iter().zip(new).position(|(old, new)| old != new);
            bytes[at..end].copy_from_slice(&new[..end - at]);
            (first_changed.map(|index| at + index), false)
        }
    };

    let scan = scan_segment(&bytes, first, start_term, input.is_last);
    assert!(scan.valid_len as usize <= bytes.len());
    assert_eq!(scan.batch_firsts.len() as u64, scan.batches);
    if let Some(at) = damaged_from.filter(|at| *at < data_end) {
        let allowed = batches_before(at);
        assert!(
            scan.batches as usize <= allowed,
            "damage at byte {at} inside batch {allowed}, yet {} batches were accepted",
            scan.batches
        );
        if cut && input.is_last {
            assert!(
                matches!(scan.end, ScanEnd::Torn { offset } if offset == scan.valid_len)
                    || scan.end == ScanEnd::Clean,
                "a cut last segment ends torn at a boundary: {scan:?}"
            );
        }
    }
    if damaged_from.is_none() {
        assert_eq!(scan.batches as usize, starts.len());
    }
    // What was accepted is a prefix that scans clean on its own, batch by batch.
    let prefix = &bytes[..scan.valid_len as usize];
    let again = scan_segment(prefix, first, start_term, input.is_last);
    assert_eq!(again.end, ScanEnd::Clean);
    assert_eq!(
        (again.batches, again.next_seqno, again.last_term),
        (scan.batches, scan.next_seqno, scan.last_term)
    );
    let mut offset = 0;
    while offset < prefix.len() {
        let batch = decode_batch(&prefix[offset..]).expect("an accepted batch verifies on its own");
        offset += batch.encoded.len();
    }
});
