//! Property tests: decoding and the recovery scan never panic on garbage, truncated or mutated bytes,
//! and a mutated batch is never accepted as the original.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::*;
use proptest::prelude::*;
use tidal_types::{RecordKind, Seqno, Term};
use tidal_wal::batch::decode_header;
use tidal_wal::segment::{scan_segment, segment_file_name};
use tidal_wal::{decode_batch, encode_batch, ManualClock, SimIo};

fn valid_segment(bodies: &[Vec<u8>]) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut next = 1u64;
    for (index, body) in bodies.iter().enumerate() {
        let events = (index % 3 + 1) as u32;
        bytes.extend(encode_batch(RecordKind::ALL[index % 9], Term(1), Seqno(next), events, body));
        next += u64::from(events);
    }
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn decoding_garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = decode_header(&bytes);
        let _ = decode_batch(&bytes);
        let _ = scan_segment(&bytes, Seqno(1), Term(0), true);
        let _ = scan_segment(&bytes, Seqno(u64::MAX), Term(u64::MAX), false);
    }

    #[test]
    fn garbage_with_a_valid_magic_never_panics(mut bytes in proptest::collection::vec(any::<u8>(), 64..300), version in 0u8..3) {
        bytes[0..4].copy_from_slice(b"TDLW");
        bytes[4] = version;
        bytes[6] = 0;
        bytes[7] = 0;
        let _ = decode_batch(&bytes);
        let _ = scan_segment(&bytes, Seqno(1), Term(0), true);
    }

    #[test]
    fn a_mutated_batch_is_never_accepted_as_the_original(
        body in proptest::collection::vec(any::<u8>(), 0..200),
        at in any::<prop::sample::Index>(),
        value in any::<u8>(),
    ) {
        let original = encode_batch(RecordKind::Signal, Term(2), Seqno(9), 4, &body);
        let mut mutated = original.clone();
        let at = at.index(mutated.len());
        prop_assume!(mutated[at] != value);
        mutated[at] = value;
        prop_assert!(decode_batch(&mutated).is_err());
        for len in [0, at, mutated.len() - 1] {
            prop_assert!(decode_batch(&original[..len]).is_err());
        }
    }

    #[test]
    fn recovery_of_random_segment_files_never_panics(
        bodies in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..80), 0..6),
        cut in any::<prop::sample::Index>(),
        garbage in proptest::collection::vec(any::<u8>(), 0..120),
        flip in any::<Option<prop::sample::Index>>(),
        second_first in 1u64..20,
    ) {
        let mut first = valid_segment(&bodies);
        let cut = cut.index(first.len() + 1);
        first.truncate(cut);
        first.extend_from_slice(&garbage);
        if let Some(flip) = flip {
            if !first.is_empty() {
                let at = flip.index(first.len());
                first[at] ^= 0x10;
            }
        }
        let io = SimIo::new();
        io.write_file(&dir().join(segment_file_name(Seqno(1))), &first);
        if second_first % 2 == 0 {
            io.write_file(&dir().join(segment_file_name(Seqno(second_first))), &garbage);
        }
        let clock = Arc::new(ManualClock::new(0));
        if let Ok((wal, recovery, _)) = try_open(&io, small_config(1 << 20), &clock) {
            let batches: Vec<_> = wal.read_from(Seqno(1)).unwrap().collect::<Result<_, _>>().unwrap();
            prop_assert_eq!(batches.last().map_or(Seqno(0), |batch| batch.last_seqno()), recovery.durable);
            assert_chain_from_one(&batches);
        }
    }
}
