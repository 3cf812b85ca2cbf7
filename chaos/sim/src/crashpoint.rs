//! Crash points: a [`FileIo`] over a node's [`SimIo`] that counts the WAL's durability boundaries
//! and, once armed, kills the node exactly at the k-th occurrence of one of them.
//!
//! No seam in production code: the WAL reaches its files only through `FileIo`, so the wrapper sees
//! every write, fsync and segment creation of the node's WAL writer thread. At the armed point the
//! wrapper crashes the disk ([`SimIo::crash`]: unsynced bytes lost or torn, handles dead) and fails
//! the operation, so the writer thread does nothing after the point (no completion, no hook: no ack,
//! no ship); from then on every file operation of the node fails until the driver has crashed its
//! host and restarts it ([`CrashPointIo::revive`]). The host is crashed at the driver's next step
//! (its async side cannot make anything durable any more: every file operation fails).
//!
//! The points, by role (the role the node had when the point was armed):
//!
//! | role | point | where the node dies |
//! | --- | --- | --- |
//! | leader | `write` | a group of client batches is about to be written to the segment (nothing on disk) |
//! | leader | `fsync` | the group is written, not yet fsynced (its bytes are lost or torn) |
//! | leader | `ship` | the group is fsynced; the writer's hook has not fed the ship tail or the commit yet |
//! | leader | `rotate` | a new segment file is created (or the prepared one renamed into place), its directory entry not yet fsynced |
//! | follower | `receive` | a shipped or pulled group is about to be appended (nothing on disk) |
//! | follower | `append` | half of the group's bytes reached the segment (a torn append) |
//! | follower | `fsync` | the group is written, not yet fsynced |
//! | follower | `ack` | the group is fsynced; the answer to the leader is not sent (no completion ran) |
//! | leader, follower | `apply` | a committed, durable batch is about to be folded by the applier |
//! | leader, follower | `applied` | the engine folded it; the applied frontier is not published (no waiter answered) |
//!
//! The apply points come through the one seam production has for them, `tidal_cluster::ApplyProbe`
//! (`ServeConfig.io.apply_probe`): the applier asks it at both points of every batch it folds, and
//! this wrapper says "die" at the armed one (the applier then does nothing more).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use tidal_wal::{CrashMode, FileIo, SimIo, WalFile};

/// A physical place in the WAL writer's file operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// Before a segment write.
    BeforeWrite,
    /// Half-way through a segment write.
    MidWrite,
    /// A segment fsync is called (the bytes written, not durable).
    BeforeSync,
    /// After a segment fsync returned, before the caller learns it.
    AfterSync,
    /// A new segment created (or a prepared one renamed into place), before the directory fsync
    /// that makes it durable.
    NewSegment,
    /// The applier is about to fold a committed batch (`ApplyPoint::BeforeApply`).
    Apply,
    /// The applier folded it; the applied frontier is not published (`ApplyPoint::BeforePublish`).
    Publish,
}

/// Who the point is aimed at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// The node the client last saw leading.
    Leader,
    /// The first node that does not lead.
    Follower,
}

/// A named durability boundary (issue 5, item 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Boundary {
    /// The role.
    pub role: Role,
    /// Its name in the issue.
    pub name: &'static str,
    /// Where the wrapper stops the node, or `None` if the simulation cannot reach it.
    pub op: Option<Op>,
}

/// Every boundary of the issue, reachable or not.
pub const BOUNDARIES: &[Boundary] = &[
    Boundary { role: Role::Leader, name: "write", op: Some(Op::BeforeWrite) },
    Boundary { role: Role::Leader, name: "fsync", op: Some(Op::BeforeSync) },
    Boundary { role: Role::Leader, name: "ship", op: Some(Op::AfterSync) },
    Boundary { role: Role::Leader, name: "rotate", op: Some(Op::NewSegment) },
    Boundary { role: Role::Leader, name: "apply", op: Some(Op::Apply) },
    Boundary { role: Role::Leader, name: "applied", op: Some(Op::Publish) },
    Boundary { role: Role::Follower, name: "receive", op: Some(Op::BeforeWrite) },
    Boundary { role: Role::Follower, name: "append", op: Some(Op::MidWrite) },
    Boundary { role: Role::Follower, name: "fsync", op: Some(Op::BeforeSync) },
    Boundary { role: Role::Follower, name: "ack", op: Some(Op::AfterSync) },
    Boundary { role: Role::Follower, name: "apply", op: Some(Op::Apply) },
    Boundary { role: Role::Follower, name: "applied", op: Some(Op::Publish) },
];

/// One crash point: the k-th occurrence (from arming) of a boundary, and what the crash keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CrashPoint {
    /// The boundary.
    pub boundary: Boundary,
    /// Which occurrence after arming (1-based).
    pub k: u64,
    /// Lost or torn unsynced bytes.
    pub mode: CrashMode,
}

impl CrashPoint {
    /// `leader/fsync#3/torn`.
    pub fn label(&self) -> String {
        let role = match self.boundary.role {
            Role::Leader => "leader",
            Role::Follower => "follower",
        };
        let mode = match self.mode {
            CrashMode::LoseUnsynced => "lost".to_string(),
            CrashMode::TornUnsynced { keep } => format!("torn{keep}"),
        };
        format!("{role}/{}#{}/{mode}", self.boundary.name, self.k)
    }
}

#[derive(Default)]
struct State {
    /// The armed op, its k, the crash mode and how many times the op was seen since arming.
    armed: Option<(Op, u64, CrashMode, u64)>,
    /// Set when the armed point was reached (what happened); the node is dead until revived.
    fired: Option<String>,
    dead: bool,
    /// Renames fail while set (a rename error: the node must fail closed).
    fail_renames: bool,
    renames_failed: u64,
    /// The path of every open file, by handle: a rename moves the handles open on its source, as
    /// a POSIX rename moves the inode they hold. A prepared next segment (`segment.prep`, then
    /// `segment.ready`) is opened under a name that is not a segment's and only becomes one when a
    /// rotation renames it into place; its later writes and fsyncs are the segment's.
    open: Vec<std::sync::Weak<Mutex<PathBuf>>>,
}

/// The wrapper: a [`FileIo`] over a node's [`SimIo`]. Cloning shares the state.
#[derive(Clone)]
pub struct CrashPointIo {
    inner: SimIo,
    state: Arc<Mutex<State>>,
}

impl CrashPointIo {
    /// Over `inner`, unarmed (a pass-through).
    pub fn new(inner: SimIo) -> CrashPointIo {
        CrashPointIo { inner, state: Arc::default() }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Arms the point: the node dies at the k-th `op` from now.
    pub fn arm(&self, op: Op, k: u64, mode: CrashMode) {
        self.lock().armed = Some((op, k.max(1), mode, 0));
    }

    /// Disarms a point not reached yet (a scripted plan armed it on several nodes; another one's
    /// fired first).
    pub fn disarm(&self) {
        self.lock().armed = None;
    }

    /// What happened, once the armed point was reached.
    pub fn fired(&self) -> Option<String> {
        self.lock().fired.clone()
    }

    /// Whether the node is dead (fired, not revived yet).
    pub fn is_dead(&self) -> bool {
        self.lock().dead
    }

    /// The host was crashed: file operations work again (for the restart).
    pub fn revive(&self) {
        self.lock().dead = false;
    }

    /// Renames fail while `fail` is set.
    pub fn fail_renames(&self, fail: bool) {
        self.lock().fail_renames = fail;
    }

    /// Renames failed so far.
    pub fn renames_failed(&self) -> u64 {
        self.lock().renames_failed
    }

    fn check_dead(&self) -> io::Result<()> {
        if self.lock().dead {
            return Err(io::Error::other("crash point: the node is dead"));
        }
        Ok(())
    }

    /// Counts one `op`; true if this is the armed point (the caller then dies there).
    fn reached(&self, op: Op, what: &dyn std::fmt::Display) -> Option<CrashMode> {
        let mut state = self.lock();
        let (armed, k, mode, seen) = state.armed.as_mut()?;
        if *armed != op {
            return None;
        }
        *seen += 1;
        if *seen < *k {
            return None;
        }
        let mode = *mode;
        state.fired = Some(format!("{op:?} #{k} on {what}"));
        state.armed = None;
        state.dead = true;
        Some(mode)
    }

    fn die(&self, mode: CrashMode) -> io::Error {
        self.inner.crash(mode);
        io::Error::other("crash point: simulated process death")
    }
}

fn is_segment(path: &Path) -> bool {
    tidal_wal::segment::parse_segment_file_name(path).is_some()
}

struct PointFile {
    io: CrashPointIo,
    inner: Box<dyn WalFile>,
    /// Where the file is now (renames move it).
    path: Arc<Mutex<PathBuf>>,
}

impl PointFile {
    /// The file's path now, if it is a segment's.
    fn segment(&self) -> Option<PathBuf> {
        let path = self.path.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        is_segment(&path).then(|| path.clone())
    }

    /// A segment write at `offset` (its end if `None`), with the write points.
    fn write(&mut self, offset: Option<u64>, buf: &[u8]) -> io::Result<()> {
        self.io.check_dead()?;
        let write = |file: &mut Box<dyn WalFile>, bytes: &[u8]| match offset {
            Some(offset) => file.write_all_at(offset, bytes),
            None => file.write_all(bytes),
        };
        if let Some(path) = self.segment() {
            if let Some(mode) = self.io.reached(Op::BeforeWrite, &path.display()) {
                return Err(self.io.die(mode));
            }
            if let Some(mode) = self.io.reached(Op::MidWrite, &path.display()) {
                let _ = write(&mut self.inner, &buf[..buf.len() / 2]);
                return Err(self.io.die(mode));
            }
        }
        write(&mut self.inner, buf)
    }
}

impl WalFile for PointFile {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.write(None, buf)
    }

    fn write_all_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.write(Some(offset), buf)
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.io.check_dead()?;
        let segment = self.segment();
        if let Some(path) = &segment {
            if let Some(mode) = self.io.reached(Op::BeforeSync, &path.display()) {
                // The fsync is called; the power goes before it returns.
                return Err(self.io.die(mode));
            }
        }
        self.inner.sync_data()?;
        if let Some(path) = &segment {
            if let Some(mode) = self.io.reached(Op::AfterSync, &path.display()) {
                // Durable on disk; the process dies before anyone learns it.
                return Err(self.io.die(mode));
            }
        }
        Ok(())
    }

    fn truncate(&mut self, len: u64) -> io::Result<()> {
        self.io.check_dead()?;
        self.inner.truncate(len)
    }

    fn len(&self) -> io::Result<u64> {
        self.io.check_dead()?;
        self.inner.len()
    }
}

impl FileIo for CrashPointIo {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.check_dead()?;
        self.inner.create_dir_all(path)
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
        self.check_dead()?;
        self.inner.list_dir(path)
    }

    fn open_append(&self, path: &Path) -> io::Result<Box<dyn WalFile>> {
        self.check_dead()?;
        let segment = is_segment(path);
        let created = segment && self.inner.file_bytes(path).is_err();
        let inner = self.inner.open_append(path)?;
        if created {
            if let Some(mode) = self.reached(Op::NewSegment, &path.display()) {
                // Created, its directory entry not fsynced: the crash takes the entry away.
                return Err(self.die(mode));
            }
        }
        let handle = Arc::new(Mutex::new(path.to_path_buf()));
        {
            let mut state = self.lock();
            state.open.retain(|open| open.strong_count() > 0);
            state.open.push(Arc::downgrade(&handle));
        }
        Ok(Box::new(PointFile { io: self.clone(), inner, path: handle }))
    }

    fn read_all(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.check_dead()?;
        self.inner.read_all(path)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.check_dead()?;
        self.inner.remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.check_dead()?;
        {
            let mut state = self.lock();
            if state.fail_renames {
                state.renames_failed += 1;
                return Err(io::Error::other(format!(
                    "simulated rename error: {} -> {}",
                    from.display(),
                    to.display()
                )));
            }
        }
        self.inner.rename(from, to)?;
        for open in self.lock().open.iter().filter_map(std::sync::Weak::upgrade) {
            let mut path = open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if *path == from {
                *path = to.to_path_buf();
            }
        }
        if is_segment(to) {
            // A prepared segment renamed into place (a rotation), its directory entry not fsynced.
            if let Some(mode) = self.reached(Op::NewSegment, &to.display()) {
                return Err(self.die(mode));
            }
        }
        Ok(())
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.check_dead()?;
        self.inner.sync_dir(path)
    }
}

impl tidal_cluster::ApplyProbe for CrashPointIo {
    fn reached(
        &self,
        point: tidal_cluster::ApplyPoint,
        first: tidal_types::Seqno,
        last: tidal_types::Seqno,
    ) -> bool {
        let op = match point {
            tidal_cluster::ApplyPoint::BeforeApply => Op::Apply,
            tidal_cluster::ApplyPoint::BeforePublish => Op::Publish,
        };
        match CrashPointIo::reached(self, op, &format_args!("the batch {first}..={last}")) {
            Some(mode) => {
                // The process dies: its WAL disk loses (or tears) its unsynced bytes, and every
                // later file operation fails until the driver has crashed and restarted the host.
                let _ = self.die(mode);
                true
            }
            None => false,
        }
    }
}

/// The sweep's points: every boundary (reachable or not) x every k in `ks` x {lost, torn}.
/// Unreachable boundaries are listed too, so the sweep counts them as not covered.
pub fn sweep(ks: &[u64]) -> Vec<CrashPoint> {
    let mut points = Vec::new();
    for boundary in BOUNDARIES {
        for &k in ks {
            // A torn write keeps a prefix of the unsynced bytes: a few lengths, by k, so some cut
            // a batch header and some a payload.
            let keep = [7, 29, 61, 113, 500][usize::try_from(k).unwrap_or(0) % 5];
            for mode in [CrashMode::LoseUnsynced, CrashMode::TornUnsynced { keep }] {
                points.push(CrashPoint { boundary: *boundary, k, mode });
            }
        }
    }
    points
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A prepared next segment is opened as `segment.prep`, renamed to `segment.ready` and then
    /// into place by a rotation; the writer keeps its handle throughout. Once it is a segment, its
    /// writes and fsyncs are boundaries; before, they are not (zeros, no batch at stake).
    #[test]
    fn a_handle_renamed_into_a_segment_counts_as_one() {
        let dir = Path::new("/wal");
        let io = CrashPointIo::new(SimIo::new());
        io.create_dir_all(dir).unwrap();
        let mut file = io.open_append(&dir.join(tidal_wal::segment::PREP_FILE_NAME)).unwrap();
        io.arm(Op::BeforeWrite, 1, CrashMode::LoseUnsynced);
        file.write_all_at(0, &[0; 64]).unwrap();
        file.sync_data().unwrap();
        assert_eq!(io.fired(), None, "a prepared segment's zeros are not a boundary");
        let ready = dir.join(tidal_wal::segment::READY_FILE_NAME);
        io.rename(&dir.join(tidal_wal::segment::PREP_FILE_NAME), &ready).unwrap();
        file.write_all_at(0, &[0; 64]).unwrap();
        assert_eq!(io.fired(), None);
        let segment = dir.join(tidal_wal::segment::segment_file_name(tidal_types::Seqno(42)));
        io.rename(&ready, &segment).unwrap();
        assert!(file.write_all_at(0, b"batch").is_err(), "the node dies at the armed write");
        let fired = io.fired().unwrap();
        assert!(fired.starts_with("BeforeWrite #1 on ") && fired.ends_with(".seg"), "{fired}");
    }
}
