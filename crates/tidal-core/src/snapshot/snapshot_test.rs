//! Codec tests: round trip, and every way a stream can be wrong is refused without a panic.

use super::*;
use proptest::prelude::*;

const DIM: u32 = 2;

fn position() -> TermSeqno {
    TermSeqno { term: Term(3), seqno: Seqno(42) }
}

/// A small valid snapshot with entries in every section.
fn sample() -> (Vec<u8>, SnapshotInfo) {
    let mut writer = SnapshotWriter::new(Vec::new(), position(), DIM).unwrap();
    let vector = [0u8; 16];
    for name in SECTIONS {
        writer.section(name).unwrap();
        match name {
            "meta" => {
                writer.entry(keys::META_APPLIED_SEQNO, &42u64.to_le_bytes()).unwrap();
                writer.entry(keys::META_DIMENSION, &DIM.to_le_bytes()).unwrap();
            }
            "items" => writer.entry(&keys::item_key(7), &keys::seqno_value(Seqno(5), b"{}")).unwrap(),
            "embeddings" => writer.entry(&keys::item_key(7), &vector).unwrap(),
            "trending" => writer.entry(&keys::item_key(7), &Trend::first(1, 2.0).encode()).unwrap(),
            "counters" => writer.entry(&keys::counter_key(7, "click"), &3u64.to_le_bytes()).unwrap(),
            "profiles" => writer.entry(b"u1", &vector).unwrap(),
            "seen" => writer.entry(&keys::seen_key("u1", 7), &[]).unwrap(),
            "idempotency" => writer.entry(b"k", b"v").unwrap(),
            "streams" => {
                let meta = crate::streams::StreamMeta { last_offset: 9, events: 1, ..Default::default() };
                writer.entry(&crate::streams::meta_key("s"), &meta.encode()).unwrap();
                writer.entry(&crate::streams::consumer_key("s", "c").unwrap(), &9u64.to_le_bytes()).unwrap();
            }
            "stream_events" => {
                let prefix = crate::streams::name_prefix("s").unwrap();
                let event = crate::record::PublishEvent { key: Some("k".into()), payload: b"1".to_vec() };
                let value = crate::streams::event_value(1_700_000_000, &event);
                writer.entry(&crate::streams::event_key(&prefix, 9), &value).unwrap();
            }
            "inboxes" => {
                let meta = crate::inboxes::InboxMeta { live_topics: 1, ..Default::default() };
                writer.entry(&crate::inboxes::inbox_key("o"), &meta.encode()).unwrap();
            }
            NEGATIVES => {
                let mut state = NegativesState::default();
                state.add(crate::negatives::Actor { node: 1, incarnation: 1 }, 9);
                writer.entry(b"u1", &state.to_bytes()).unwrap();
            }
            other => panic!("unknown section {other}"),
        }
        writer.end_section().unwrap();
    }
    let (info, bytes) = writer.finish().unwrap();
    (bytes, info)
}

fn read(bytes: &[u8]) -> Result<SnapshotInfo, SnapshotError> {
    read_snapshot(bytes, DIM, &mut |_, _, _| Ok(()))
}

#[test]
fn a_snapshot_round_trips_and_every_entry_is_visited() {
    let (bytes, info) = sample();
    assert_eq!(info.bytes, bytes.len() as u64);
    assert_eq!(info.entries, 14);
    let mut seen = Vec::new();
    let read_info = read_snapshot(&bytes[..], DIM, &mut |section, key, _| {
        seen.push((section, key.to_vec()));
        Ok(())
    })
    .unwrap();
    assert_eq!(read_info, info);
    assert_eq!(seen.len(), 14);
    assert_eq!(seen.last().unwrap(), &(NEGATIVES_SECTION, b"u1".to_vec()));
}

#[test]
fn every_truncation_is_refused() {
    let (bytes, _) = sample();
    for len in 0..bytes.len() {
        let error = read(&bytes[..len]).unwrap_err();
        assert!(
            matches!(error, SnapshotError::Malformed { .. } | SnapshotError::Checksum { .. }),
            "truncation at {len}: {error}"
        );
    }
}

#[test]
fn every_bit_flip_is_refused() {
    let (bytes, _) = sample();
    for bit in 0..bytes.len() * 8 {
        let mut flipped = bytes.clone();
        flipped[bit / 8] ^= 1 << (bit % 8);
        assert!(read(&flipped).is_err(), "flip of bit {bit} accepted");
    }
}

#[test]
fn trailing_bytes_another_dimension_and_other_versions_are_refused() {
    let (mut bytes, _) = sample();
    assert!(matches!(
        read_snapshot(&bytes[..], DIM + 1, &mut |_, _, _| Ok(())),
        Err(SnapshotError::Incompatible { .. })
    ));
    for version in [1u8, 2, 4] {
        // Version 1 had no stream sections, version 2 no inbox section: their sections would be
        // read as the wrong keyspaces.
        let mut other = bytes.clone();
        other[8] = version;
        assert!(matches!(read(&other), Err(SnapshotError::Incompatible { .. })), "version {version}");
    }
    bytes.push(0);
    assert!(
        matches!(read(&bytes), Err(SnapshotError::Malformed { reason, .. }) if reason.contains("after the trailer"))
    );
}

#[test]
fn an_oversize_length_is_refused_before_anything_is_allocated() {
    let mut writer = SnapshotWriter::new(Vec::new(), position(), DIM).unwrap();
    writer.section("meta").unwrap();
    // Right after the section header, claim a 4 GiB key.
    let mut bytes = writer.out.clone();
    bytes.push(TAG_ENTRY);
    bytes.extend_from_slice(&u32::MAX.to_le_bytes());
    let error = read(&bytes).unwrap_err();
    assert!(
        matches!(&error, SnapshotError::Malformed { reason, .. } if reason.contains("over the limit")),
        "{error}"
    );
}

#[test]
fn records_that_do_not_reproduce_the_trailer_digest_are_refused() {
    // A writer whose state hasher saw something else: the checksum is right, the digest is not.
    let (bytes, _) = sample();
    let digest_at = bytes.len() - 64;
    let mut forged = bytes[..digest_at].to_vec();
    forged.extend_from_slice(&[7u8; 32]);
    let checksum = blake3::hash(&forged);
    forged.extend_from_slice(checksum.as_bytes());
    assert!(matches!(read(&forged), Err(SnapshotError::Digest { .. })));
}

#[test]
fn out_of_order_keys_and_bad_shapes_are_refused() {
    let check = |section: &str, entries: &[(&[u8], &[u8])]| {
        let index = SECTIONS.iter().position(|name| *name == section).unwrap();
        let mut check = SectionCheck::new(index, position(), DIM);
        entries.iter().try_for_each(|(key, value)| check.entry(key, value))
    };
    let vector = [0u8; 16];
    assert!(check("items", &[(&keys::item_key(2), b"12345678"), (&keys::item_key(1), b"12345678")]).is_err());
    assert!(check("items", &[(&keys::item_key(1), b"12345678"), (&keys::item_key(1), b"12345678")]).is_err());
    assert!(check("embeddings", &[(&keys::item_key(1), &vector[..15])]).is_err());
    assert!(check("embeddings", &[(b"short", &vector)]).is_err());
    assert!(check("trending", &[(&keys::item_key(1), &[0u8; 15])]).is_err());
    assert!(check("counters", &[(&keys::item_key(1), &[0u8; 8])]).is_err());
    assert!(check("seen", &[(b"\x00\x05u1", &[])]).is_err());
    assert!(check("negatives", &[(b"u1", b"garbage")]).is_err());
    assert!(check("meta", &[(META_IMPORT_PENDING, &[0u8; 8])]).is_err());
    assert!(check("profiles", &[(b"u1", &vector)]).is_ok());
}

proptest! {
    #[test]
    fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        prop_assert!(read(&bytes).is_err());
    }

    #[test]
    fn a_valid_prefix_with_garbage_never_panics(cut in 0usize..300, tail in proptest::collection::vec(any::<u8>(), 0..256)) {
        let (bytes, _) = sample();
        let mut mixed = bytes[..cut.min(bytes.len())].to_vec();
        mixed.extend_from_slice(&tail);
        prop_assert!(read(&mixed).is_err());
    }
}
