//! The small files a node writes write-then-rename outside the WAL (the stream baseline, the CRDT
//! incarnation, the snapshot install marker, a received snapshot), and a simulation seam over them.
//!
//! The WAL reaches its files through `tidal_wal::FileIo`, where the simulation injects errors;
//! these files are written with `std::fs` in the data dir. [`write_then_rename`] writes one
//! (create the temp file, write, fsync, rename, fsync the directory); before each step it asks the
//! [`FileFaults`] registered for a directory holding the file, if any ([`register_faults`]). Only
//! chaos/sim registers one; in production no registry exists ([`step`] finds none and returns at
//! once) and every step is what it was before the seam. An error of any step is returned to the
//! caller, which must fail closed (decisions/020).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// A step of writing a file write-then-rename.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileStep {
    /// Writing the temp file's contents (it is created).
    Write,
    /// Fsyncing the temp file.
    Fsync,
    /// Renaming the temp file over the final name.
    Rename,
    /// Fsyncing the directory (the rename made durable).
    SyncDir,
}

/// A simulation seam (chaos/sim's `disk` family): asked before each step of a write-then-rename
/// of a file under the directory it is registered for; an error fails that step.
pub trait FileFaults: Send + Sync + 'static {
    /// Before `step` of writing `path` (the file's final name) with `contents`.
    fn before(&self, step: FileStep, path: &Path, contents: &[u8]) -> std::io::Result<()>;
}

type Registry = Mutex<Vec<(PathBuf, Arc<dyn FileFaults>)>>;

/// Directories with their fault injectors; never created in production.
static REGISTRY: OnceLock<Registry> = OnceLock::new();

/// Registers `faults` for the files under `dir` (simulation only); `None` removes the entry.
pub fn register_faults(dir: &Path, faults: Option<Arc<dyn FileFaults>>) {
    let registry = REGISTRY.get_or_init(|| Mutex::new(Vec::new()));
    let mut entries = registry.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    entries.retain(|(registered, _)| registered != dir);
    if let Some(faults) = faults {
        entries.push((dir.to_path_buf(), faults));
    }
}

/// Asks the injector registered for `path`'s directory (if any) before `step`. A no-op unless a
/// simulation registered one.
pub fn step(step: FileStep, path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let Some(registry) = REGISTRY.get() else { return Ok(()) };
    let faults = {
        let entries = registry.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        entries.iter().find(|(dir, _)| path.starts_with(dir)).map(|(_, faults)| faults.clone())
    };
    match faults {
        Some(faults) => faults.before(step, path, contents),
        None => Ok(()),
    }
}

/// Writes `contents` to `path` through `<path>.tmp`: create, write, fsync, rename, fsync the
/// directory. Any error is returned (the file at `path` is then the old one or the new one, never
/// a part of either).
pub fn write_then_rename(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    let mut temp = path.as_os_str().to_owned();
    temp.push(".tmp");
    let temp = PathBuf::from(temp);
    let mut file = std::fs::File::create(&temp)?;
    step(FileStep::Write, path, contents)?;
    file.write_all(contents)?;
    step(FileStep::Fsync, path, contents)?;
    file.sync_all()?;
    step(FileStep::Rename, path, contents)?;
    std::fs::rename(&temp, path)?;
    step(FileStep::SyncDir, path, contents)?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    struct FailRename;

    impl FileFaults for FailRename {
        fn before(&self, step: FileStep, _path: &Path, _contents: &[u8]) -> std::io::Result<()> {
            if step == FileStep::Rename {
                return Err(std::io::Error::other("simulated rename error"));
            }
            Ok(())
        }
    }

    #[test]
    fn writes_through_a_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("baseline");
        write_then_rename(&path, b"1 2\n").unwrap();
        write_then_rename(&path, b"3 4\n").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"3 4\n");
    }

    #[test]
    fn an_injected_rename_error_leaves_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("baseline");
        write_then_rename(&path, b"1 2\n").unwrap();
        register_faults(dir.path(), Some(Arc::new(FailRename)));
        let error = write_then_rename(&path, b"3 4\n").unwrap_err();
        assert!(error.to_string().contains("simulated rename error"));
        assert_eq!(std::fs::read(&path).unwrap(), b"1 2\n");
        register_faults(dir.path(), None);
        write_then_rename(&path, b"3 4\n").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"3 4\n");
    }
}
