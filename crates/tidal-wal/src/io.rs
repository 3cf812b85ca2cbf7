//! File I/O behind a small trait, so tests and the simulation can inject faults ([`crate::SimIo`]),
//! and its real implementation over `std::fs` ([`StdIo`]).
//!
//! Delicate: durability is only what these calls promise. `WalFile::sync_data` must be a real
//! fdatasync, and a newly created or renamed file is durable only after `FileIo::sync_dir` of its
//! directory. Callers never retry a failed sync (the kernel may have dropped the pages, so a later
//! success proves nothing): they poison. The one exception: a `sync_dir` that failed because no
//! file descriptor was left to open the directory ([`is_out_of_descriptors`]) never reached the
//! fsync.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Whether an I/O error says the process (EMFILE) or the system (ENFILE) has no file descriptor
/// left: the call failed at its open, before it did anything, so it may be tried again later (even
/// a `sync_dir`: the fsync itself never ran). `io::ErrorKind` has no kind for either; the numbers
/// are Linux's and the BSDs'.
pub(crate) fn is_out_of_descriptors(err: &io::Error) -> bool {
    const ENFILE: i32 = 23;
    const EMFILE: i32 = 24;
    matches!(err.raw_os_error(), Some(ENFILE | EMFILE))
}

/// File-system operations the WAL needs.
pub trait FileIo: Send + Sync + 'static {
    /// Creates a directory and its parents.
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Paths of the regular files directly in a directory, in no particular order.
    fn list_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>>;
    /// Opens a file for writing, creating it if missing: `write_all` goes to its end,
    /// `write_all_at` to a given offset (over existing bytes, or past the end, growing the file).
    fn open_append(&self, path: &Path) -> io::Result<Box<dyn WalFile>>;
    /// Reads a whole file.
    fn read_all(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// Reads at most the first `len` bytes of a file (fewer if it is shorter).
    fn read_prefix(&self, path: &Path, len: u64) -> io::Result<Vec<u8>> {
        let mut bytes = self.read_all(path)?;
        bytes.truncate(usize::try_from(len).unwrap_or(usize::MAX));
        Ok(bytes)
    }
    /// Reads `len` bytes of a file from `offset` (fewer if the file ends sooner).
    fn read_range(&self, path: &Path, offset: u64, len: u64) -> io::Result<Vec<u8>> {
        let end = offset.saturating_add(len);
        let mut bytes = self.read_prefix(path, end)?;
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(bytes.len());
        bytes.drain(..start);
        Ok(bytes)
    }
    /// Whether the first `len` bytes of a file (fewer if it is shorter) are all zeros.
    fn is_zero_prefix(&self, path: &Path, len: u64) -> io::Result<bool> {
        Ok(crate::segment::is_zero(&self.read_prefix(path, len)?))
    }
    /// Reads a whole file that may end in a long run of zeros (a preallocated segment) as its bytes
    /// up to some point and the number of zero bytes that follow them to the end of the file. The
    /// split is wherever the implementation likes (the default: the whole file, no zeros).
    fn read_zero_trimmed(&self, path: &Path) -> io::Result<(Vec<u8>, u64)> {
        Ok((self.read_all(path)?, 0))
    }
    /// Removes a file (durable after `sync_dir`).
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Renames a file, replacing `to` (durable after `sync_dir`).
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes the directory's entries (creations, renames, removals) durable.
    fn sync_dir(&self, path: &Path) -> io::Result<()>;
}

/// An open file, written at its end or at an offset.
// `len` is fallible I/O, not a collection size; an `is_empty` would add nothing.
#[allow(clippy::len_without_is_empty)]
pub trait WalFile: Send {
    /// Appends all of `buf`.
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()>;
    /// Writes all of `buf` at `offset`, over the bytes there (a preallocated segment's zeros) and
    /// past the end if it reaches further (the file grows; a gap would read as zeros).
    fn write_all_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()>;
    /// Makes the written bytes durable (fdatasync).
    fn sync_data(&mut self) -> io::Result<()>;
    /// Sets the file's length to `len` bytes (cuts it, or grows it with zeros); later appends go
    /// after them.
    fn truncate(&mut self, len: u64) -> io::Result<()>;
    /// Current length in bytes.
    fn len(&self) -> io::Result<u64>;
}

/// Real files through `std::fs`; `sync_data` is `File::sync_data` (fdatasync). Files are opened
/// without `O_APPEND` (on Linux, `pwrite` on an `O_APPEND` file ignores its offset); `write_all`
/// writes at the current length.
#[derive(Clone, Copy, Debug, Default)]
pub struct StdIo;

struct StdFile {
    file: File,
}

impl FileIo for StdIo {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::create_dir_all(path)
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
        let mut paths = Vec::new();
        for entry in fs::read_dir(path)? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                paths.push(entry.path());
            }
        }
        Ok(paths)
    }

    fn open_append(&self, path: &Path) -> io::Result<Box<dyn WalFile>> {
        let file = OpenOptions::new().create(true).truncate(false).write(true).open(path)?;
        Ok(Box::new(StdFile { file }))
    }

    fn read_all(&self, path: &Path) -> io::Result<Vec<u8>> {
        fs::read(path)
    }

    fn read_prefix(&self, path: &Path, len: u64) -> io::Result<Vec<u8>> {
        let file = File::open(path)?;
        let capacity = usize::try_from(len.min(file.metadata()?.len())).unwrap_or(0);
        let mut bytes = Vec::with_capacity(capacity);
        file.take(len).read_to_end(&mut bytes)?;
        Ok(bytes)
    }

    /// One positioned read into one allocation: a pull reads segments a chunk at a time.
    fn read_range(&self, path: &Path, offset: u64, len: u64) -> io::Result<Vec<u8>> {
        let file = File::open(path)?;
        let available = file.metadata()?.len().saturating_sub(offset).min(len);
        let mut bytes = vec![0u8; usize::try_from(available).unwrap_or(0)];
        let mut filled = 0;
        while filled < bytes.len() {
            match file.read_at(&mut bytes[filled..], offset + filled as u64) {
                Ok(0) => break,
                Ok(read) => filled += read,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error),
            }
        }
        bytes.truncate(filled);
        Ok(bytes)
    }

    /// In 1 MiB steps: all-zero steps are only counted (materialized if bytes follow), so the
    /// preallocated end of the active segment costs no allocation at restart.
    fn read_zero_trimmed(&self, path: &Path) -> io::Result<(Vec<u8>, u64)> {
        let mut bytes = Vec::new();
        let mut zeros = 0usize;
        for_each_chunk(File::open(path)?, |chunk| {
            if crate::segment::is_zero(chunk) {
                zeros += chunk.len();
            } else {
                bytes.resize(bytes.len() + zeros, 0);
                zeros = 0;
                bytes.extend_from_slice(chunk);
            }
            true
        })?;
        Ok((bytes, zeros as u64))
    }

    /// In 1 MiB steps through one buffer: a kept `segment.prep` may be up to a whole segment of
    /// zeros, and reading it into one allocation cost a restart tens of milliseconds of page faults.
    fn is_zero_prefix(&self, path: &Path, len: u64) -> io::Result<bool> {
        for_each_chunk(File::open(path)?.take(len), crate::segment::is_zero)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        File::open(path)?.sync_all()
    }
}

impl WalFile for StdFile {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        let end = self.file.metadata()?.len();
        self.file.write_all_at(buf, end)
    }

    fn write_all_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn truncate(&mut self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }
}

/// Reads `reader` to its end in 1 MiB steps through one buffer, handing each step to `f` until it
/// returns false; returns whether every step was taken.
fn for_each_chunk(mut reader: impl Read, mut f: impl FnMut(&[u8]) -> bool) -> io::Result<bool> {
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let read = reader.read(&mut buf)?;
        if read == 0 {
            return Ok(true);
        }
        if !f(&buf[..read]) {
            return Ok(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_prefix_checks_every_chunk_up_to_the_length() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("segment.prep");
        let mut bytes = vec![0u8; 3 << 20];
        fs::write(&path, &bytes).unwrap();
        assert!(StdIo.is_zero_prefix(&path, u64::MAX).unwrap());
        let at = (5 << 19) + 3; // 2.5 MiB + 3: in the third chunk
        bytes[at] = 1;
        fs::write(&path, &bytes).unwrap();
        assert!(!StdIo.is_zero_prefix(&path, u64::MAX).unwrap());
        assert!(StdIo.is_zero_prefix(&path, at as u64).unwrap(), "the byte after the prefix is not read");
        assert!(!StdIo.is_zero_prefix(&path, at as u64 + 1).unwrap());
    }

    #[test]
    fn a_range_read_is_the_slice_of_the_file_and_stops_at_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("segment");
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        fs::write(&path, &bytes).unwrap();
        for (offset, len) in [(0u64, 0u64), (0, 10_000), (1, 9_999), (4_096, 100), (9_990, 100), (20_000, 5)]
        {
            let start = (offset as usize).min(bytes.len());
            let end = (offset + len).min(bytes.len() as u64) as usize;
            assert_eq!(StdIo.read_range(&path, offset, len).unwrap(), &bytes[start..end], "{offset}+{len}");
            let sim = crate::SimIo::new();
            sim.write_file(&path, &bytes);
            assert_eq!(sim.read_range(&path, offset, len).unwrap(), &bytes[start..end], "sim {offset}+{len}");
        }
    }
}
