//! Failed writes, fsyncs and renames of the small files a node writes write-then-rename in its
//! data dir outside the WAL (the stream baseline, the CRDT incarnation, the snapshot install marker
//! and a received snapshot), through `tidal_cluster::files` (the one seam: an injector registered
//! for the node's data dir; production registers none).
//!
//! The `disk` family draws, from a stream of its own (the family's fault plans stay as recorded):
//!
//! - **a file-fault window** ([`FilePlan::window`]; one window of the family's plan, picked by
//!   this stream, becomes it, keeping its time): from its start every node's step fails (write,
//!   fsync, rename or the directory fsync, drawn per seed), and the leader is crashed and
//!   restarted, so an election follows and the new leader writes its stream baseline while taking
//!   office. It must fail closed: never serve the term whose baseline it could not write (checked
//!   against the client's acknowledgements and the logs). At the window's end a supervisor
//!   restarts every node whose write failed (a restart must recover: the heal gates check it);
//! - **a failed first start** ([`FilePlan::boot`]): one node's first write of its CRDT incarnation
//!   fails at a drawn step; `run_on` must return the error (the node refuses to start), and the
//!   supervisor starts it again.

use crate::rng::Rng;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tidal_cluster::files::{FileFaults, FileStep};

/// A failed step, as recorded by the injector.
#[derive(Clone, Debug)]
pub struct Failed {
    /// The step.
    pub step: FileStep,
    /// The file's name.
    pub file: String,
    /// For a stream baseline: the term it was for.
    pub term: Option<u64>,
    /// Which start of the node's process it happened in (1: the first).
    pub start: u64,
}

#[derive(Default)]
struct State {
    /// The step that fails while the window is open.
    failing: Option<FileStep>,
    /// One failure of this step on the next write of the CRDT incarnation.
    boot: Option<FileStep>,
    failed: Vec<Failed>,
}

/// One node's injector (registered for its data dir for the run).
#[derive(Clone)]
pub struct DataDirFaults(Arc<Mutex<State>>, Arc<AtomicU64>);

impl DataDirFaults {
    /// An injector that stamps each failure with `starts` (the node's process starts so far).
    pub fn new(starts: Arc<AtomicU64>) -> DataDirFaults {
        DataDirFaults(Arc::default(), starts)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// From now on `step` fails on every file (`None`: nothing fails).
    pub fn fail(&self, step: Option<FileStep>) {
        self.lock().failing = step;
    }

    /// The next write of the CRDT incarnation fails at `step`, once.
    pub fn fail_boot(&self, step: FileStep) {
        self.lock().boot = Some(step);
    }

    /// Every failed step so far.
    pub fn failed(&self) -> Vec<Failed> {
        self.lock().failed.clone()
    }
}

impl FileFaults for DataDirFaults {
    fn before(&self, step: FileStep, path: &Path, contents: &[u8]) -> std::io::Result<()> {
        let file = path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
        let mut state = self.lock();
        let boot = file == "incarnation" && state.boot == Some(step);
        if !boot && state.failing != Some(step) {
            return Ok(());
        }
        if boot {
            state.boot = None;
        }
        let term = (file == "stream_baseline")
            .then(|| std::str::from_utf8(contents).ok()?.split_whitespace().next()?.parse().ok())
            .flatten();
        let start = self.1.load(Ordering::SeqCst);
        state.failed.push(Failed { step, file: file.clone(), term, start });
        Err(std::io::Error::other(format!("simulated file error: {step:?} of {file}")))
    }
}

/// A seed's file faults (`disk` family).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FilePlan {
    /// `(pick, failing step)`: the plan's window `pick % windows` becomes the file-fault window.
    pub window: Option<(u64, FileStep)>,
    /// `(node, step)`: that node's first start fails writing its CRDT incarnation.
    pub boot: Option<(usize, FileStep)>,
}

impl FilePlan {
    /// Draws a seed's plan (a stream of its own) for `nodes` nodes.
    pub fn draw(seed: u64, nodes: usize) -> FilePlan {
        let mut rng = Rng::new(seed ^ 0x0f11_e5fa_0175_0000);
        let step = |rng: &mut Rng| match rng.range(0, 4) {
            0 => FileStep::Write,
            1 => FileStep::Fsync,
            2 => FileStep::Rename,
            _ => FileStep::SyncDir,
        };
        let window = rng.chance(0.6).then(|| (rng.next_u64(), step(&mut rng)));
        let boot = rng
            .chance(0.4)
            .then(|| (usize::try_from(rng.range(0, nodes as u64)).unwrap_or(0), step(&mut rng)));
        FilePlan { window, boot }
    }

    /// Whether anything is drawn.
    pub fn any(&self) -> bool {
        self.window.is_some() || self.boot.is_some()
    }
}

/// The counter class of a failed step.
pub fn class(failed: &Failed) -> &'static str {
    match (failed.file.as_str(), failed.step) {
        ("incarnation", FileStep::Write) => "file_incarnation_write_fail",
        ("incarnation", FileStep::Fsync) => "file_incarnation_fsync_fail",
        ("incarnation", FileStep::Rename) => "file_incarnation_rename_fail",
        ("incarnation", FileStep::SyncDir) => "file_incarnation_dirsync_fail",
        ("stream_baseline", FileStep::Write) => "file_baseline_write_fail",
        ("stream_baseline", FileStep::Fsync) => "file_baseline_fsync_fail",
        ("stream_baseline", FileStep::Rename) => "file_baseline_rename_fail",
        ("stream_baseline", FileStep::SyncDir) => "file_baseline_dirsync_fail",
        _ => "file_other_fail",
    }
}
