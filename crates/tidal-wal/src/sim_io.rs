//! [`SimIo`]: an in-memory file system that models what a power loss keeps, for tests and the
//! simulation.
//!
//! Model: a file (inode) holds the bytes a reader sees, the bytes a crash would leave (its durable
//! image), and the writes since the last sync, in order (appends and positioned writes, over old
//! bytes or past the end). `sync_data` makes the durable image equal to what a reader sees.
//! Directory entries (create, rename, remove) are durable only after `sync_dir` of their parent.
//! [`SimIo::crash`] reverts the namespace to its durable form, reverts every file to its durable image
//! (an overwritten range shows its old bytes again, e.g. a preallocated segment's zeros; a grown file
//! shrinks back) or, torn, lays the first `keep` bytes of its unsynced writes over that image, and
//! invalidates every open handle, as a power loss and restart would. Truncation (and growing with
//! zeros through it) is modelled as immediately durable (the WAL fsyncs right after it).
//!
//! Delicate: a failed sync leaves the unsynced bytes in place (the page cache may still show them to a
//! reader) but never makes them durable; only a crash tells the two apart.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::io::{FileIo, WalFile};

/// "Too many open files" (Linux and the BSDs).
const EMFILE: i32 = 24;
/// "Input/output error" (Linux errno 5): what a read of an unreadable sector returns.
const EIO: i32 = 5;

/// What a crash does to bytes written but not yet synced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashMode {
    /// Every unsynced byte is lost.
    LoseUnsynced,
    /// Of each file's unsynced writes, in order, the first `keep` bytes reach the disk over what was
    /// there before (a torn write).
    TornUnsynced {
        /// How many unsynced bytes of each file survive.
        keep: usize,
    },
}

/// In-memory file system with fault knobs. Cloning gives another handle to the same files.
#[derive(Clone, Default)]
pub struct SimIo {
    state: Arc<Mutex<SimState>>,
}

#[derive(Default)]
struct SimState {
    inodes: HashMap<u64, Inode>,
    inode_next: u64,
    /// The namespace as processes see it.
    entries: BTreeMap<PathBuf, u64>,
    /// The namespace as it would be after a crash.
    entries_durable: BTreeMap<PathBuf, u64>,
    dirs: BTreeSet<PathBuf>,
    /// Bumped by every crash; handles of an older epoch fail.
    epoch: u64,
    fail_next_sync: bool,
    /// The next directory sync fails (after opening the directory: an fsync error, not EMFILE).
    fail_next_dir_sync: bool,
    fail_syncs: bool,
    fail_next_write: bool,
    /// While set, every write fails (a full disk: ENOSPC).
    fail_writes: bool,
    /// While set, every call that needs a new file descriptor fails with EMFILE (see
    /// [`SimIo::fail_opens`]).
    fail_opens: bool,
    /// While set, every read fails with EIO (see [`SimIo::fail_reads`]).
    fail_reads: bool,
    /// Mutating operations so far (writes, syncs, truncations, creations, renames, removals).
    ops: u64,
    /// Crash when `ops` reaches this count.
    crash_at_op: Option<(u64, CrashMode)>,
    /// Set when a planned crash fired: the machine is down, every mutating operation fails (on any
    /// thread: a power loss stops them all) until [`SimIo::restart`].
    down: bool,
    sync_delay: Duration,
    data_syncs: u64,
    dir_syncs: u64,
}

#[derive(Default)]
struct Inode {
    /// What a reader sees.
    current: Vec<u8>,
    /// What a crash leaves.
    durable: Vec<u8>,
    /// Writes since the last sync, in order: offset and bytes.
    unsynced: Vec<(usize, Vec<u8>)>,
}

struct SimFile {
    state: Arc<Mutex<SimState>>,
    inode: u64,
    epoch: u64,
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("{} not found", path.display()))
}

fn parent_of(path: &Path) -> PathBuf {
    path.parent().map(Path::to_path_buf).unwrap_or_default()
}

/// Writes `buf` at `offset` of `bytes`, growing it (with zeros in any gap) as needed.
fn write_at(bytes: &mut Vec<u8>, offset: usize, buf: &[u8]) {
    let end = offset + buf.len();
    if bytes.len() < end {
        bytes.resize(end, 0);
    }
    bytes[offset..end].copy_from_slice(buf);
}

impl Inode {
    fn with_bytes(bytes: &[u8]) -> Inode {
        Inode { current: bytes.to_vec(), durable: bytes.to_vec(), unsynced: Vec::new() }
    }

    fn write(&mut self, offset: usize, buf: &[u8]) {
        write_at(&mut self.current, offset, buf);
        self.unsynced.push((offset, buf.to_vec()));
    }

    fn sync(&mut self) {
        for (offset, buf) in std::mem::take(&mut self.unsynced) {
            write_at(&mut self.durable, offset, &buf);
        }
        self.durable.truncate(self.current.len());
    }

    /// Reverts to the durable image, with the first `keep` unsynced bytes laid over it.
    fn crash(&mut self, keep: usize) {
        let mut left = keep;
        for (offset, buf) in std::mem::take(&mut self.unsynced) {
            if left == 0 {
                break;
            }
            let kept = left.min(buf.len());
            write_at(&mut self.durable, offset, &buf[..kept]);
            left -= kept;
        }
        self.current = self.durable.clone();
    }

    fn set_len(&mut self, len: usize) {
        self.current.resize(len, 0);
        self.durable.resize(len, 0);
        for (offset, buf) in &mut self.unsynced {
            buf.truncate(len.saturating_sub(*offset));
        }
        self.unsynced.retain(|(_, buf)| !buf.is_empty());
    }
}

impl SimState {
    /// Counts one mutating operation; at the planned point, crashes and fails the operation.
    fn tick(&mut self) -> io::Result<()> {
        if self.down {
            return Err(io::Error::other("the machine is down after a simulated power loss"));
        }
        self.ops += 1;
        match self.crash_at_op {
            Some((at, mode)) if self.ops >= at => {
                self.crash_at_op = None;
                self.crash(mode);
                self.down = true;
                Err(io::Error::other("simulated power loss"))
            }
            _ => Ok(()),
        }
    }

    fn crash(&mut self, mode: CrashMode) {
        let keep = match mode {
            CrashMode::LoseUnsynced => 0,
            CrashMode::TornUnsynced { keep } => keep,
        };
        for inode in self.inodes.values_mut() {
            inode.crash(keep);
        }
        self.entries = self.entries_durable.clone();
        let live: BTreeSet<u64> = self.entries.values().copied().collect();
        self.inodes.retain(|id, _| live.contains(id));
        self.epoch += 1;
        self.fail_next_sync = false;
        self.fail_next_dir_sync = false;
        self.fail_syncs = false;
        self.fail_next_write = false;
        self.fail_writes = false;
    }

    fn take_sync_fault(&mut self) -> io::Result<()> {
        if self.fail_syncs || std::mem::take(&mut self.fail_next_sync) {
            return Err(io::Error::other("injected fsync failure"));
        }
        Ok(())
    }

    /// EMFILE while [`SimIo::fail_opens`] is set.
    fn take_open_fault(&self) -> io::Result<()> {
        if self.fail_opens {
            return Err(io::Error::from_raw_os_error(EMFILE));
        }
        Ok(())
    }

    fn inode_of(&mut self, path: &Path) -> io::Result<&mut Inode> {
        let id = *self.entries.get(path).ok_or_else(|| not_found(path))?;
        self.inodes.get_mut(&id).ok_or_else(|| not_found(path))
    }
}

impl SimIo {
    /// An empty file system.
    pub fn new() -> SimIo {
        SimIo::default()
    }

    fn lock(&self) -> MutexGuard<'_, SimState> {
        // A panicking test thread must not hide the state from the others.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The next data or directory sync fails.
    pub fn fail_next_sync(&self) {
        self.lock().fail_next_sync = true;
    }

    /// The next directory sync fails (an I/O error of the fsync itself; data syncs are not
    /// affected).
    pub fn fail_next_dir_sync(&self) {
        self.lock().fail_next_dir_sync = true;
    }

    /// While `fail` is set, every data and directory sync fails.
    pub fn fail_syncs(&self, fail: bool) {
        self.lock().fail_syncs = fail;
    }

    /// The next `write_all` fails without writing anything.
    pub fn fail_next_write(&self) {
        self.lock().fail_next_write = true;
    }

    /// While `fail` is set, every `write_all` fails without writing anything (a full disk).
    pub fn fail_writes(&self, fail: bool) {
        self.lock().fail_writes = fail;
    }

    /// While `fail` is set, every call that opens a file or directory fails with EMFILE ("too many
    /// open files": the process used up its descriptors), before it does anything: `open_append`
    /// (creating or opening), the reads, and `sync_dir` (which opens the directory). Handles that
    /// are already open keep working. Not cleared by a crash: descriptors are a process's, but the
    /// knob is the test's to turn off.
    pub fn fail_opens(&self, fail: bool) {
        self.lock().fail_opens = fail;
    }

    /// While `fail` is set, every read of a file's bytes fails with EIO (a disk that can no longer
    /// read what it holds: a bad sector, a failing controller); writes and syncs go on. Not
    /// cleared by a crash: the knob is the test's to turn off.
    pub fn fail_reads(&self, fail: bool) {
        self.lock().fail_reads = fail;
    }

    /// Simulates a power loss and restart (see the module docs). Old handles fail from now on.
    pub fn crash(&self, mode: CrashMode) {
        self.lock().crash(mode);
    }

    /// Plans a crash: the `n`-th mutating operation from now (1-based; writes, syncs, truncations,
    /// file creations, renames, removals) crashes with `mode` instead. A crashing write first lays
    /// down its bytes, so `TornUnsynced` can keep part of it. The operation then fails, and so does
    /// every mutating operation after it, from any thread, until [`SimIo::restart`]: the machine is
    /// down (a WAL writer still running must not make anything durable after the power loss).
    pub fn crash_at_op(&self, n: u64, mode: CrashMode) {
        let mut state = self.lock();
        state.crash_at_op = Some((state.ops + n, mode));
    }

    /// Brings the machine back up after a planned crash (see [`SimIo::crash_at_op`]).
    pub fn restart(&self) {
        self.lock().down = false;
    }

    /// Whether a planned crash is still pending.
    pub fn crash_pending(&self) -> bool {
        self.lock().crash_at_op.is_some()
    }

    /// Mutating operations performed so far.
    pub fn op_count(&self) -> u64 {
        self.lock().ops
    }

    /// Makes every data sync take at least `delay` (outside the file system's lock), like a disk.
    pub fn set_sync_delay(&self, delay: Duration) {
        self.lock().sync_delay = delay;
    }

    /// Flips one bit of a file (bit `bit_index % 8` of byte `bit_index / 8`), durably.
    pub fn flip_bit(&self, path: &Path, bit_index: u64) -> io::Result<()> {
        let mut state = self.lock();
        let inode = state.inode_of(path)?;
        let byte = usize::try_from(bit_index / 8).map_err(io::Error::other)?;
        let mask = 1u8 << (bit_index % 8);
        let target = inode
            .current
            .get_mut(byte)
            .ok_or_else(|| io::Error::other("bit index past the end of the file"))?;
        *target ^= mask;
        if let Some(durable) = inode.durable.get_mut(byte) {
            *durable ^= mask;
        }
        Ok(())
    }

    /// Sets a file's length to `len` bytes (cut, or grown with zeros), durably.
    pub fn truncate_file(&self, path: &Path, len: u64) -> io::Result<()> {
        let len = usize::try_from(len).map_err(io::Error::other)?;
        self.lock().inode_of(path)?.set_len(len);
        Ok(())
    }

    /// The file's bytes as a reader sees them (synced or not).
    pub fn file_bytes(&self, path: &Path) -> io::Result<Vec<u8>> {
        Ok(self.lock().inode_of(path)?.current.clone())
    }

    /// The file's bytes as a crash would leave them if no unsynced byte survived.
    pub fn synced_bytes(&self, path: &Path) -> io::Result<Vec<u8>> {
        Ok(self.lock().inode_of(path)?.durable.clone())
    }

    /// Whether the file's directory entry would survive a crash.
    pub fn is_entry_durable(&self, path: &Path) -> bool {
        let state = self.lock();
        let durable = state.entries_durable.get(path);
        durable.is_some() && durable == state.entries.get(path)
    }

    /// Creates or replaces a file with `bytes`, all of it durable (entry included); creates parents.
    pub fn write_file(&self, path: &Path, bytes: &[u8]) {
        let mut state = self.lock();
        let mut dir = parent_of(path);
        loop {
            state.dirs.insert(dir.clone());
            match dir.parent() {
                Some(parent) => dir = parent.to_path_buf(),
                None => break,
            }
        }
        let id = state.inode_next;
        state.inode_next += 1;
        state.inodes.insert(id, Inode::with_bytes(bytes));
        state.entries.insert(path.to_path_buf(), id);
        state.entries_durable.insert(path.to_path_buf(), id);
    }

    /// Removes a file, durably (entry included).
    pub fn remove_file_for_test(&self, path: &Path) {
        let mut state = self.lock();
        state.entries.remove(path);
        state.entries_durable.remove(path);
    }

    /// Every file path, sorted.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.lock().entries.keys().cloned().collect()
    }

    /// Data syncs that succeeded so far.
    pub fn data_sync_count(&self) -> u64 {
        self.lock().data_syncs
    }

    /// Directory syncs that succeeded so far.
    pub fn dir_sync_count(&self) -> u64 {
        self.lock().dir_syncs
    }
}

impl FileIo for SimIo {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut state = self.lock();
        let mut dir = path.to_path_buf();
        loop {
            state.dirs.insert(dir.clone());
            match dir.parent() {
                Some(parent) => dir = parent.to_path_buf(),
                None => break,
            }
        }
        Ok(())
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
        let state = self.lock();
        if !state.dirs.contains(path) {
            return Err(not_found(path));
        }
        Ok(state.entries.keys().filter(|entry| entry.parent() == Some(path)).cloned().collect())
    }

    fn open_append(&self, path: &Path) -> io::Result<Box<dyn WalFile>> {
        let mut state = self.lock();
        state.take_open_fault()?;
        let id = match state.entries.get(path) {
            Some(id) => *id,
            None => {
                if !state.dirs.contains(&parent_of(path)) {
                    return Err(not_found(&parent_of(path)));
                }
                state.tick()?;
                let id = state.inode_next;
                state.inode_next += 1;
                state.inodes.insert(id, Inode::default());
                state.entries.insert(path.to_path_buf(), id);
                id
            }
        };
        Ok(Box::new(SimFile { state: self.state.clone(), inode: id, epoch: state.epoch }))
    }

    fn read_all(&self, path: &Path) -> io::Result<Vec<u8>> {
        {
            let state = self.lock();
            state.take_open_fault()?;
            if state.fail_reads {
                return Err(io::Error::from_raw_os_error(EIO));
            }
        }
        self.file_bytes(path)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut state = self.lock();
        if !state.entries.contains_key(path) {
            return Err(not_found(path));
        }
        state.tick()?;
        state.entries.remove(path);
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut state = self.lock();
        if !state.entries.contains_key(from) {
            return Err(not_found(from));
        }
        state.tick()?;
        let id = state.entries.remove(from).ok_or_else(|| not_found(from))?;
        state.entries.insert(to.to_path_buf(), id);
        Ok(())
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let mut state = self.lock();
        state.take_open_fault()?;
        if !state.dirs.contains(path) {
            return Err(not_found(path));
        }
        state.tick()?;
        state.take_sync_fault()?;
        if std::mem::take(&mut state.fail_next_dir_sync) {
            return Err(io::Error::other("injected directory fsync failure"));
        }
        let in_dir = |entry: &PathBuf| entry.parent() == Some(path);
        let current: Vec<(PathBuf, u64)> =
            state.entries.iter().filter(|(entry, _)| in_dir(entry)).map(|(p, id)| (p.clone(), *id)).collect();
        state.entries_durable.retain(|entry, _| !in_dir(entry));
        state.entries_durable.extend(current);
        state.dir_syncs += 1;
        Ok(())
    }
}

impl SimFile {
    fn with_inode<T>(&self, op: impl FnOnce(&mut SimState, u64) -> io::Result<T>) -> io::Result<T> {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if state.epoch != self.epoch {
            return Err(io::Error::other("file handle from before a crash"));
        }
        op(&mut state, self.inode)
    }
}

fn inode_mut(state: &mut SimState, id: u64) -> io::Result<&mut Inode> {
    state.inodes.get_mut(&id).ok_or_else(|| io::Error::other("file was removed"))
}

impl SimFile {
    /// Writes at `offset`, or at the end if `None`.
    fn write(&mut self, offset: Option<u64>, buf: &[u8]) -> io::Result<()> {
        self.with_inode(|state, id| {
            if std::mem::take(&mut state.fail_next_write) {
                return Err(io::Error::other("injected write failure"));
            }
            if state.fail_writes {
                return Err(io::Error::other("injected write failure: no space left on device"));
            }
            let inode = inode_mut(state, id)?;
            let offset = match offset {
                Some(offset) => usize::try_from(offset).map_err(io::Error::other)?,
                None => inode.current.len(),
            };
            inode.write(offset, buf);
            state.tick()
        })
    }
}

impl WalFile for SimFile {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.write(None, buf)
    }

    fn write_all_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.write(Some(offset), buf)
    }

    fn sync_data(&mut self) -> io::Result<()> {
        let delay = self.with_inode(|state, _| Ok(state.sync_delay))?;
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        self.with_inode(|state, id| {
            state.tick()?;
            state.take_sync_fault()?;
            inode_mut(state, id)?.sync();
            state.data_syncs += 1;
            Ok(())
        })
    }

    fn truncate(&mut self, len: u64) -> io::Result<()> {
        let len = usize::try_from(len).map_err(io::Error::other)?;
        self.with_inode(|state, id| {
            state.tick()?;
            inode_mut(state, id)?.set_len(len);
            Ok(())
        })
    }

    fn len(&self) -> io::Result<u64> {
        self.with_inode(|state, id| Ok(inode_mut(state, id)?.current.len() as u64))
    }
}
