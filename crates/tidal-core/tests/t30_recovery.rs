//! Crash recovery and determinism: reopen at every point of the log, replay, compare digests and
//! feeds with a clean run; a real process abort mid-log.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

mod common;

use std::path::Path;

use common::*;
use tidal_core::{ApplyOutcome, EngineConfig, Ranked, TidalDb};
use tidal_types::Seqno;

const USERS: [&str; 8] = ["u0", "u1", "u2", "u3", "u4", "u5", "u6", "nobody"];

fn feeds(db: &TidalDb) -> Vec<Ranked> {
    let mut out: Vec<Ranked> = USERS.iter().map(|user| db.feed(user, 50, &[]).unwrap()).collect();
    out.push(db.trending(50).unwrap());
    out.push(db.similar(3, 50).unwrap().unwrap());
    out
}

fn clean_run(log: &Log) -> ((Seqno, [u8; 32]), Vec<Ranked>) {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    apply_all(&db, &log.batches);
    (db.digest().unwrap(), feeds(&db))
}

#[test]
fn two_databases_fed_the_same_log_are_identical_and_reopening_changes_no_score() {
    let log = workload();
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (open(dir_a.path()), open(dir_b.path()));
    apply_all(&a, &log.batches);
    // b applies in another rhythm: with replays of old batches interleaved.
    for (n, batch) in log.batches.iter().enumerate() {
        b.apply(batch).unwrap();
        assert_eq!(b.apply(&log.batches[n / 2]).unwrap(), ApplyOutcome::Skipped);
    }
    assert_eq!(a.digest().unwrap(), b.digest().unwrap());
    let feeds_a = feeds(&a);
    assert_eq!(feeds_a, feeds(&b));
    // Most users have seen everything in this small catalogue; "nobody", trending and similar have not.
    assert!(feeds_a[USERS.len() - 1..].iter().all(|ranked| !ranked.items.is_empty()));
    assert_eq!(sizes(&a), sizes(&b));

    let stats = sizes(&a);
    drop(a);
    let a = open(dir_a.path());
    assert_eq!(feeds(&a), feeds_a, "a reopen must not change any score");
    assert_eq!(sizes(&a), stats);
    assert_eq!(a.digest().unwrap(), b.digest().unwrap());
}

#[test]
fn a_crash_at_every_point_of_the_log_recovers_by_replay() {
    let log = workload();
    let clean = clean_run(&log);
    // Creating a database fsyncs a lot; start every run from a copy of one fresh, closed database.
    let template = tempfile::tempdir().unwrap();
    drop(open(template.path()));
    for crash_after in 0..=log.batches.len() {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(template.path(), dir.path());
        {
            let db = open(dir.path());
            apply_all(&db, &log.batches[..crash_after]);
            // Dropped without checkpoint: recovery relies on fjall's journal plus WAL replay.
        }
        let db = open(dir.path());
        let applied = db.applied_seqno();
        let expected = log.batches[..crash_after].last().map_or(Seqno::ZERO, |b| b.last_seqno());
        assert_eq!(applied, expected, "crash after {crash_after} batches");
        // Replay the whole log, as startup does from the WAL.
        apply_all(&db, &log.batches);
        assert_eq!(db.digest().unwrap(), clean.0, "crash after {crash_after} batches");
        assert_eq!(feeds(&db), clean.1, "crash after {crash_after} batches");
    }
}

#[test]
fn checkpoint_returns_the_durable_applied_seqno() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    assert_eq!(db.checkpoint().unwrap(), Seqno::ZERO);
    let log = workload();
    apply_all(&db, &log.batches[..10]);
    assert_eq!(db.checkpoint().unwrap(), log.batches[9].last_seqno());
}

const CRASH_DIR_ENV: &str = "TIDAL_CORE_CRASH_DIR";
const CRASH_AFTER_ENV: &str = "TIDAL_CORE_CRASH_AFTER";
/// Set: the child flushes every apply to fjall (in the background, at most one in flight); unset:
/// it checkpoints half-way and keeps the rest in the overlay.
const CRASH_WRITE_THROUGH_ENV: &str = "TIDAL_CORE_CRASH_WRITE_THROUGH";

/// The child side of `a_process_abort_loses_nothing_committed`: a no-op unless the parent set the
/// environment.
#[test]
fn crash_child() {
    let (Some(dir), Some(after)) = (std::env::var_os(CRASH_DIR_ENV), std::env::var_os(CRASH_AFTER_ENV))
    else {
        return;
    };
    let after: usize = after.to_str().unwrap().parse().unwrap();
    let log = workload();
    // The engine lives until the abort: dropping it would flush the overlay.
    let db;
    if std::env::var_os(CRASH_WRITE_THROUGH_ENV).is_some() {
        db = open_with(Path::new(&dir), EngineConfig { overlay_batches_max: 1, ..config() });
        apply_all(&db, &log.batches[..after]);
    } else {
        db = open(Path::new(&dir));
        apply_all(&db, &log.batches[..after / 2]);
        db.checkpoint().unwrap();
        apply_all(&db, &log.batches[after / 2..after]);
    }
    // What fjall held just before the abort: the parent checks that none of it is lost.
    println!("{FLUSHED_PREFIX}{}", db.flushed_applied_seqno().get());
    // No drop, no checkpoint: the process dies as with kill -9.
    let _ = &db;
    std::process::abort();
}

/// The child's report of fjall's applied seqno right before it aborted.
const FLUSHED_PREFIX: &str = "crash_child flushed_applied_seqno=";

/// Runs the child, which applies `after` batches and aborts; returns the flushed applied seqno it
/// saw right before.
fn abort_child(dir: &Path, after: usize, write_through: bool) -> Seqno {
    let mut command = std::process::Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
        .env(CRASH_DIR_ENV, dir)
        .env(CRASH_AFTER_ENV, after.to_string());
    if write_through {
        command.env(CRASH_WRITE_THROUGH_ENV, "1");
    }
    let output = command.output().unwrap();
    assert!(!output.status.success(), "the child must abort");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let flushed =
        stdout.lines().find_map(|line| line.split_once(FLUSHED_PREFIX).map(|(_, seqno)| seqno.trim()));
    Seqno(flushed.unwrap_or_else(|| panic!("no report in the child's output: {stdout}")).parse().unwrap())
}

#[test]
fn a_process_abort_loses_nothing_committed() {
    let log = workload();
    let clean = clean_run(&log);
    for after in [1, log.batches.len() / 2, log.batches.len()] {
        let dir = tempfile::tempdir().unwrap();
        let flushed = abort_child(dir.path(), after, true);
        let db = open(dir.path());
        // Commits reach the OS when they complete, so a process crash keeps every one of them.
        // With one apply per flush window, fjall is at most two windows behind: the overlay in
        // flight and the full active one, whose flush waits for it.
        let recovered = db.applied_seqno();
        assert!(recovered >= flushed, "abort after {after}: recovered {recovered}, flushed {flushed}");
        let boundaries: Vec<Seqno> = log.batches[after.saturating_sub(3)..after]
            .iter()
            .map(|batch| batch.last_seqno())
            .chain((after < 3).then_some(Seqno::ZERO))
            .collect();
        assert!(
            boundaries.contains(&recovered),
            "abort after {after}: recovered {recovered}, expected one of {boundaries:?}"
        );
        apply_all(&db, &log.batches);
        assert_eq!(db.digest().unwrap(), clean.0);
        assert_eq!(feeds(&db), clean.1);
    }
}

#[test]
fn a_process_abort_loses_only_the_overlay_and_replay_restores_it() {
    let log = workload();
    let clean = clean_run(&log);
    for after in [2, log.batches.len() / 2, log.batches.len()] {
        let dir = tempfile::tempdir().unwrap();
        abort_child(dir.path(), after, false);
        let db = open(dir.path());
        // The child checkpointed after `after / 2` batches; the rest sat in the overlay.
        assert_eq!(db.applied_seqno(), log.batches[after / 2 - 1].last_seqno(), "abort after {after}");
        apply_all(&db, &log.batches);
        assert_eq!(db.digest().unwrap(), clean.0);
        assert_eq!(feeds(&db), clean.1);
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}
