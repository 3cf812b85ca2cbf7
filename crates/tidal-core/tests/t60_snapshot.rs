//! Snapshots: export at a consistent seqno, install elsewhere with an equal digest, merge hard
//! negatives, refuse bad input without touching the state, and recover from an interrupted install.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};

use common::*;
use tidal_core::{EngineConfig, Error, FlushStage, SnapshotError, SnapshotInfo, TidalDb};
use tidal_types::{Seqno, Term};

fn config_b() -> EngineConfig {
    EngineConfig { node_actor: (2, 1), ..config() }
}

/// Exports `db` into a file in `dir`.
fn export(db: &TidalDb, dir: &Path) -> (PathBuf, SnapshotInfo) {
    let path = dir.join("state.snap");
    let file = std::fs::File::create(&path).unwrap();
    let (info, _) = db.export_snapshot(std::io::BufWriter::new(file), |_| Some(Term(1))).unwrap();
    (path, info)
}

/// Everything a failed install must leave as it was.
fn observed(db: &TidalDb) -> ((Seqno, [u8; 32]), [u8; 32], Vec<u64>) {
    (db.digest().unwrap(), db.negatives_digest().unwrap(), db.negatives("u1").unwrap())
}

#[test]
fn an_installed_snapshot_has_the_exporters_digest_and_the_log_continues_after_it() {
    let log = workload();
    let split = log.batches.len() * 2 / 3;
    let (dir_a, dir_b, files) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = open(dir_a.path());
    let b = open_with(dir_b.path(), config_b());
    {
        tracing::info!("a applies two thirds of the log; b holds other data and its own negatives");
        apply_all(&a, &log.batches[..split]);
        a.negatives_add("u1", 100).unwrap();
        let mut other = Log::new();
        other.item(T0, 999, r#"{"stale":true}"#);
        other.embedding(T0, 999, &[1.0, 0.0, 0.0, 0.0]);
        apply_all(&b, &other.batches);
        b.negatives_add("u1", 200).unwrap();
    }
    let (path, info) = export(&a, files.path());
    {
        tracing::info!("b installs a's snapshot: same digest at the same seqno, negatives merged");
        assert_eq!(info.position.seqno, a.applied_seqno());
        assert_eq!(info.position.term, Term(1));
        let installed = b.install_snapshot(&path).unwrap();
        assert_eq!(installed, info);
        assert_eq!(b.applied_seqno(), info.position.seqno);
        assert_eq!(b.digest().unwrap(), a.digest().unwrap());
        assert_eq!(b.digest().unwrap().1, info.digest);
        assert_eq!(b.get_item(999).unwrap(), None, "b's own state is gone");
        assert_eq!(b.negatives("u1").unwrap(), vec![100, 200], "negatives are merged, not overwritten");
        assert_eq!(b.feed("u2", 20, &[]).unwrap().items.len(), a.feed("u2", 20, &[]).unwrap().items.len());
        assert_eq!(b.similar(3, 10).unwrap(), a.similar(3, 10).unwrap());
        assert_eq!(b.stats().items, a.stats().items);
        assert_eq!(b.stats().users, a.stats().users);
    }
    {
        tracing::info!("both apply the rest of the log: still identical, also after a reopen");
        apply_all(&a, &log.batches[split..]);
        apply_all(&b, &log.batches[split..]);
        assert_eq!(b.digest().unwrap(), a.digest().unwrap());
        assert_eq!(b.trending(50).unwrap(), a.trending(50).unwrap());
        drop(b);
        let b = open_with(dir_b.path(), config_b());
        assert_eq!(b.digest().unwrap(), a.digest().unwrap());
        assert_eq!(b.feed("u3", 20, &[]).unwrap(), a.feed("u3", 20, &[]).unwrap());
    }
}

#[test]
fn an_export_during_applies_is_the_state_at_exactly_its_seqno() {
    let log = workload();
    let (dir_a, dir_b, dir_c, files) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let a = open_with(dir_a.path(), EngineConfig { overlay_batches_max: 7, ..config() });
    let (path, info) = std::thread::scope(|scope| {
        let applier = scope.spawn(|| apply_all(&a, &log.batches));
        let exported = export(&a, files.path());
        applier.join().unwrap();
        exported
    });
    tracing::info!(seqno = %info.position.seqno, "a clean database fed exactly the batches through the snapshot's seqno");
    let c = open(dir_c.path());
    let through: Vec<_> =
        log.batches.iter().filter(|batch| batch.last_seqno() <= info.position.seqno).cloned().collect();
    apply_all(&c, &through);
    assert_eq!(c.applied_seqno(), info.position.seqno, "a snapshot is cut at a batch boundary");
    let b = open(dir_b.path());
    b.install_snapshot(&path).unwrap();
    assert_eq!(b.digest().unwrap(), c.digest().unwrap());
}

#[test]
fn an_install_waits_for_the_flush_in_flight_and_resets_what_the_flusher_tracks() {
    let log = workload();
    let split = log.batches.len() / 3;
    let (dir_a, dir_b, dir_c, files) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let a = open(dir_a.path());
    apply_all(&a, &log.batches[..split]);
    let (path, info) = export(&a, files.path());
    let b = open_with(dir_b.path(), EngineConfig { overlay_batches_max: 10, ..config_b() });
    let held = {
        tracing::info!(
            "b applied a longer, different log; an overlay holding item 999 is frozen and held in flight"
        );
        let mut other = Log::new();
        let count = info.position.seqno.get() + 30;
        for n in 0..count {
            other.item(T0 + n, 1000 + n, r#"{"other":true}"#);
        }
        let (first, rest) = other.batches.split_at(other.batches.len() - 15);
        apply_all(&b, first);
        b.checkpoint().unwrap();
        let hold = b.hold_flushes(FlushStage::BeforeCommit);
        apply_all(&b, &rest[..10]);
        hold.wait_parked();
        apply_all(&b, &rest[10..]);
        assert!(b.stats().flush.in_flight);
        assert!(b.applied_seqno() > info.position.seqno, "b's frontier must go down for this test");
        assert!(b.get_item(1000 + count - 12).unwrap().is_some(), "in the frozen overlay");
        assert!(b.get_item(1000 + count - 1).unwrap().is_some(), "in the active overlay");
        hold
    };
    {
        tracing::info!(
            "the install runs while the flush is held; it must wait for it, then replace everything"
        );
        let installed = std::thread::scope(|scope| {
            let install = scope.spawn(|| b.install_snapshot(&path));
            drop(held);
            install.join().unwrap()
        });
        assert_eq!(installed.unwrap(), info);
        assert_eq!(b.applied_seqno(), info.position.seqno);
        assert_eq!(b.flushed_applied_seqno(), info.position.seqno, "fjall holds S, below b's old frontier");
        assert!(!b.stats().flush.in_flight);
        let count = info.position.seqno.get() + 30;
        assert_eq!(
            b.get_item(1000 + count - 12).unwrap(),
            None,
            "no frozen overlay of the old state is read"
        );
        assert_eq!(b.get_item(1000 + count - 1).unwrap(), None, "no active overlay of the old state is read");
        assert_eq!(b.get_item(1003).unwrap(), None);
        assert_eq!(b.digest().unwrap(), a.digest().unwrap());
    }
    {
        tracing::info!(
            "later flushes continue from S: checkpoints, the flushed seqno and a reopen are right"
        );
        for (n, batch) in log.batches[split..].iter().enumerate() {
            b.apply(batch).unwrap();
            if n % 13 == 0 {
                assert_eq!(b.checkpoint().unwrap(), batch.last_seqno());
                assert_eq!(b.flushed_applied_seqno(), batch.last_seqno());
            }
        }
        let c = open(dir_c.path());
        apply_all(&c, &log.batches);
        assert_eq!(b.digest().unwrap(), c.digest().unwrap());
        b.simulate_crash();
        let b = open_with(dir_b.path(), config_b());
        assert_eq!(b.flushed_applied_seqno(), b.applied_seqno());
        apply_all(&b, &log.batches);
        assert_eq!(b.digest().unwrap(), c.digest().unwrap());
    }
}

#[test]
fn bad_snapshots_are_refused_and_change_nothing() {
    let log = workload();
    let (dir_a, dir_b, files) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = open(dir_a.path());
    apply_all(&a, &log.batches);
    let (path, _) = export(&a, files.path());
    let good = std::fs::read(&path).unwrap();
    let b = open_with(dir_b.path(), config_b());
    apply_all(&b, &log.batches[..5]);
    b.negatives_add("u1", 300).unwrap();
    let before = observed(&b);
    let bad = files.path().join("bad.snap");
    let mut flipped = good.clone();
    flipped[good.len() / 2] ^= 0x10;
    let mut trailing = good.clone();
    trailing.extend_from_slice(b"x");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("garbage", (0..4096u32).map(|i| (i * 7919 % 251) as u8).collect()),
        ("truncated in the header", good[..20].to_vec()),
        ("truncated in the middle", good[..good.len() / 2].to_vec()),
        ("truncated before the checksum", good[..good.len() - 1].to_vec()),
        ("a flipped bit", flipped),
        ("trailing bytes", trailing),
    ];
    for (what, bytes) in cases {
        std::fs::write(&bad, &bytes).unwrap();
        let error = b.install_snapshot(&bad).unwrap_err();
        tracing::info!(what, %error, "refused");
        assert!(!matches!(error, SnapshotError::Io(_) | SnapshotError::Engine(_)), "{what}: {error}");
        assert_eq!(observed(&b), before, "{what} changed the state");
        assert!(!b.install_incomplete());
    }
    let other_dimension = tempfile::tempdir().unwrap();
    let wide = open_with(other_dimension.path(), EngineConfig::with_dimension(DIM + 1));
    assert!(matches!(wide.install_snapshot(&path), Err(SnapshotError::Incompatible { .. })));
    tracing::info!("b still applies after the refusals");
    apply_all(&b, &log.batches[5..]);
    assert_eq!(b.digest().unwrap(), a.digest().unwrap());
}

#[test]
fn an_interrupted_install_refuses_applies_until_it_is_installed_again() {
    let log = workload();
    let (dir_a, dir_b, files) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = open(dir_a.path());
    apply_all(&a, &log.batches[..40]);
    let (path, info) = export(&a, files.path());
    {
        tracing::info!("b crashes half-way through the install");
        let b = open_with(dir_b.path(), config_b());
        apply_all(&b, &log.batches[..3]);
        b.simulate_interrupted_install(&path, info.entries / 2).unwrap();
        assert!(b.install_incomplete());
        b.simulate_crash();
    }
    let b = open_with(dir_b.path(), config_b());
    {
        tracing::info!("after a restart the half state is refused: nothing applies, nothing exports");
        assert!(b.install_incomplete());
        assert!(matches!(b.apply(&log.batches[40]), Err(Error::ImportIncomplete)));
        assert!(b.export_snapshot(Vec::new(), |_| Some(Term(1))).is_err());
    }
    {
        tracing::info!("installing again completes it: the exporter's digest, and the log continues");
        b.install_snapshot(&path).unwrap();
        assert!(!b.install_incomplete());
        assert_eq!(b.digest().unwrap(), a.digest().unwrap());
        apply_all(&a, &log.batches[40..]);
        apply_all(&b, &log.batches[40..]);
        assert_eq!(b.digest().unwrap(), a.digest().unwrap());
    }
}

#[test]
fn a_verified_file_that_changes_before_the_install_is_refused_at_the_end_of_the_write_pass() {
    let log = workload();
    let (dir_a, dir_b, files) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = open(dir_a.path());
    apply_all(&a, &log.batches[..20]);
    let (path, first) = export(&a, files.path());
    let verified =
        tidal_core::snapshot::read_snapshot(std::fs::File::open(&path).unwrap(), DIM, &mut |_, _, _| Ok(()))
            .unwrap();
    assert_eq!(verified, first);
    apply_all(&a, &log.batches[20..]);
    let (_, second) = export(&a, files.path());
    assert_ne!(first, second, "the file now holds a later snapshot");
    let b = open_with(dir_b.path(), config_b());
    assert!(b.install_verified_snapshot(&path, verified).is_err());
    assert!(b.install_incomplete(), "the state was being replaced: it stays marked incomplete");
    assert_eq!(b.install_snapshot(&path).unwrap(), second);
    assert_eq!(b.digest().unwrap(), a.digest().unwrap());
}
