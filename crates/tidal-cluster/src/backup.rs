//! Backups (decisions/065): a node's log-derived state at one seqno S as one self-checking file,
//! and the restore that turns such a file into a data dir a node starts from at S.
//!
//! A backup is the snapshot stream the Snapshot RPC carries (`tidal_core::snapshot`, with its own
//! checksum and state digest) followed by a footer (S, S's term, the term history through S) and
//! a BLAKE3 of every byte before it:
//!
//! ```text
//! snapshot  "TIDALSNP" ... (the snapshot format, decisions/007)        snapshot_bytes
//! footer    "TIDALBAK" | version u32 | snapshot_bytes u64 | term u64 | seqno u64 | n u32
//!           | (term u64, first seqno u64) x n                           40 + 16 n
//! trailer   footer_bytes u32 | BLAKE3 of every byte before it [32]       36
//! ```
//!
//! The footer comes last because S is known only once the cut is done; a reader finds it from the
//! fixed-size trailer.
//!
//! A restore verifies the whole file before it creates anything, then writes exactly what an
//! interrupted snapshot install leaves: the verified snapshot at `snapshot/install.snap` and the
//! `install_pending` marker. The node's first start finishes the install
//! ([`crate::resume_pending_install`]): its WAL becomes an empty log continuing at S + 1 with the
//! backup's term history, its engine holds the state at S. Nothing else is written: no identity
//! (the node records the one it is started with, decisions/063), no control-plane store, no CRDT
//! incarnation (a fresh one is drawn), so a restored node is a new node that holds a prefix of the
//! log and claims nothing past S.
//!
//! Delicate: a follower applies before commit (decisions/025), so its applied state may hold a
//! suffix a new leader will drop. [`cut_backup`] reports S; the caller must not hand the file out
//! until S is committed (the HTTP route waits for that).

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use tidal_core::snapshot::{read_snapshot, SNAPSHOT_HEADER_LEN, SNAPSHOT_MAGIC};
use tidal_core::{SnapshotError, SnapshotInfo, TidalDb};
use tidal_types::{Seqno, Term, TermSeqno};
use tidal_wal::wal_meta::TERM_HISTORY_LEN_MAX;
use tidal_wal::Wal;

use crate::snapshot::{write_install_marker, InstallError, INSTALL_FILE, SNAPSHOT_DIR_NAME};

/// First bytes of a backup's footer.
pub const BACKUP_MAGIC: [u8; 8] = *b"TIDALBAK";
/// The backup format version this build writes and reads.
pub const BACKUP_VERSION: u32 = 1;
/// Bytes of the trailer: footer length u32 and the BLAKE3 of everything before it.
pub const BACKUP_TRAILER_LEN: u64 = 36;
/// Bytes of the footer before its term history.
const FOOTER_FIXED_LEN: usize = 40;
/// Name prefix of a backup being cut in `snapshot/`; a leftover (a crash mid-cut) is removed by
/// the next cut.
const CUT_PREFIX: &str = "backup-cut-";
/// Read buffer of the verify pass.
const READ_BUFFER_BYTES: usize = 256 * 1024;

/// Why a backup could not be cut, verified or restored. A refused restore created nothing.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// A file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a whole backup: truncated, not a backup at all, or its footer is damaged.
    #[error("{path} is not a complete Tidal backup: {reason}")]
    NotABackup {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The file's bytes do not hash to its trailer: damaged on disk or in transit.
    #[error("{path} is damaged: its content hashes to {got}, its trailer says {expected}")]
    Checksum {
        /// The file.
        path: PathBuf,
        /// Checksum in the trailer (hex).
        expected: String,
        /// Checksum of the bytes read (hex).
        got: String,
    },
    /// The snapshot inside is damaged or does not match the footer.
    #[error("{path}: the snapshot inside is damaged: {source}")]
    Snapshot {
        /// The file.
        path: PathBuf,
        /// What the snapshot reader found.
        #[source]
        source: SnapshotError,
    },
    /// The engine could not cut a snapshot.
    #[error("cut the snapshot: {0}")]
    Cut(#[source] SnapshotError),
    /// A restore target that is not empty: a restore never mixes with existing data.
    #[error("{dir} is not empty: a restore writes only into a new or empty data dir")]
    NotEmpty {
        /// The data dir.
        dir: PathBuf,
    },
    /// The install marker could not be written.
    #[error(transparent)]
    Marker(#[from] InstallError),
}

/// What a backup holds, from its footer and its snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackupInfo {
    /// The position S the state is at.
    pub position: TermSeqno,
    /// The term history through S: `(term, first seqno of that term)`.
    pub history: Vec<TermSeqno>,
    /// The snapshot's own description (dimension, entries, state digest).
    pub snapshot: SnapshotInfo,
    /// Bytes of the whole file.
    pub bytes: u64,
    /// BLAKE3 of every byte before the checksum (what the trailer holds).
    pub checksum: [u8; 32],
}

/// A backup just cut: the open file (its name already removed, so the disk space goes with the
/// last handle) and what it holds.
pub struct CutBackup {
    /// The whole backup, positioned at its first byte.
    pub file: File,
    /// What it holds.
    pub info: BackupInfo,
}

/// Cuts a backup of `db` at its applied seqno into a file under `data_dir/snapshot`, returns it
/// open and unlinked. Blocking (a full read of the state). The caller checks that
/// `info.position.seqno` is committed before handing the file out.
pub fn cut_backup(db: &TidalDb, wal: &Wal, data_dir: &Path, id: u64) -> Result<CutBackup, BackupError> {
    let dir = data_dir.join(SNAPSHOT_DIR_NAME);
    std::fs::create_dir_all(&dir).map_err(io("create the snapshot directory"))?;
    remove_leftover_cuts(&dir)?;
    let path = dir.join(format!("{CUT_PREFIX}{id}"));
    // Read and write: the same handle is streamed back once the cut is done.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .map_err(io("create the backup file"))?;
    let out = HashingWriter { inner: BufWriter::new(file), hasher: blake3::Hasher::new(), bytes: 0 };
    let (snapshot, mut out) =
        db.export_snapshot(out, |seqno| wal.term_at(seqno)).map_err(BackupError::Cut)?;
    let position = snapshot.position;
    let history: Vec<TermSeqno> =
        wal.term_history().into_iter().filter(|entry| entry.seqno <= position.seqno).collect();
    let footer = encode_footer(snapshot.bytes, position, &history);
    out.write_all(&footer).map_err(io("write the backup footer"))?;
    let footer_len = u32::try_from(footer.len()).expect("a footer is bounded by TERM_HISTORY_LEN_MAX");
    out.write_all(&footer_len.to_le_bytes()).map_err(io("write the backup trailer"))?;
    let checksum = *out.hasher.finalize().as_bytes();
    out.inner.write_all(&checksum).map_err(io("write the backup trailer"))?;
    let bytes = out.bytes + 32;
    let mut file = out.inner.into_inner().map_err(|error| io("flush the backup file")(error.into_error()))?;
    file.seek(SeekFrom::Start(0)).map_err(io("rewind the backup file"))?;
    // Unlinked at once: the open handle keeps the bytes while the file is streamed, and a
    // client that goes away leaves nothing behind.
    std::fs::remove_file(&path).map_err(io("unlink the backup file"))?;
    let info = BackupInfo { position, history, snapshot, bytes, checksum };
    tracing::info!(position = %info.position, bytes, "backup cut");
    Ok(CutBackup { file, info })
}

/// Verifies the backup at `path` whole (trailer checksum, footer, every snapshot record, the
/// snapshot's state digest) and returns what it holds. Reads the file once; writes nothing.
pub fn verify_backup(path: &Path) -> Result<BackupInfo, BackupError> {
    let not_a_backup =
        |damage: Damage| BackupError::NotABackup { path: path.to_path_buf(), reason: damage.0 };
    let mut file = File::open(path).map_err(io_at("open", path))?;
    let bytes = file.metadata().map_err(io_at("stat", path))?.len();
    let mut head = [0u8; SNAPSHOT_HEADER_LEN];
    if bytes < SNAPSHOT_HEADER_LEN as u64 + BACKUP_TRAILER_LEN
        || file.read_exact(&mut head).is_err()
        || head[..8] != SNAPSHOT_MAGIC
    {
        return Err(not_a_backup(Damage(format!("{bytes} bytes do not start with a snapshot header"))));
    }
    let dimension = u32::from_le_bytes(head[12..16].try_into().expect("4 bytes"));
    let (footer, footer_len) = read_footer(&mut file, bytes).map_err(not_a_backup)?;
    let (snapshot_bytes, position, history) = decode_footer(&footer).map_err(not_a_backup)?;
    if snapshot_bytes.checked_add(footer_len + BACKUP_TRAILER_LEN) != Some(bytes) {
        return Err(not_a_backup(Damage(format!(
            "the footer says {snapshot_bytes} snapshot bytes, the file has {} before its footer",
            bytes.saturating_sub(footer_len + BACKUP_TRAILER_LEN)
        ))));
    }
    file.seek(SeekFrom::Start(0)).map_err(io_at("rewind", path))?;
    let mut reader = HashingReader {
        inner: BufReader::with_capacity(READ_BUFFER_BYTES, file),
        hasher: blake3::Hasher::new(),
    };
    let snapshot = read_snapshot((&mut reader).take(snapshot_bytes), dimension, &mut |_, _, _| Ok(()))
        .map_err(|source| BackupError::Snapshot { path: path.to_path_buf(), source })?;
    let mut rest = Vec::new();
    reader.inner.read_to_end(&mut rest).map_err(io_at("read", path))?;
    let (hashed, trailer) = rest.split_at(rest.len().saturating_sub(32));
    reader.hasher.update(hashed);
    let checksum = *reader.hasher.finalize().as_bytes();
    if checksum.as_slice() != trailer {
        return Err(BackupError::Checksum {
            path: path.to_path_buf(),
            expected: hex(trailer),
            got: hex(&checksum),
        });
    }
    check_consistent(&snapshot, position, &history).map_err(not_a_backup)?;
    Ok(BackupInfo { position, history, snapshot, bytes, checksum })
}

/// Restores the backup at `path` into `data_dir`, which must not exist or be empty: verifies it
/// whole first (a refused restore creates nothing), then writes `snapshot/install.snap` and the
/// install marker, each fsynced. The node's first start on `data_dir` finishes the install.
pub fn restore_backup(path: &Path, data_dir: &Path) -> Result<BackupInfo, BackupError> {
    check_empty(data_dir)?;
    let info = verify_backup(path)?;
    let dir = data_dir.join(SNAPSHOT_DIR_NAME);
    std::fs::create_dir_all(&dir).map_err(io_at("create", &dir))?;
    let installing = dir.join(INSTALL_FILE);
    let temp = dir.join(format!("{INSTALL_FILE}.tmp"));
    {
        let mut from = File::open(path).map_err(io_at("open", path))?.take(info.snapshot.bytes);
        let mut to = File::create(&temp).map_err(io_at("create", &temp))?;
        let copied = std::io::copy(&mut from, &mut to).map_err(io_at("copy the snapshot to", &temp))?;
        if copied != info.snapshot.bytes {
            return Err(BackupError::NotABackup {
                path: path.to_path_buf(),
                reason: format!("it shrank to {copied} snapshot bytes while being restored"),
            });
        }
        to.sync_all().map_err(io_at("fsync", &temp))?;
    }
    std::fs::rename(&temp, &installing).map_err(io_at("rename", &temp))?;
    sync_dir(&dir)?;
    write_install_marker(data_dir, info.position, info.history.clone())?;
    sync_dir(data_dir)?;
    if let Some(parent) = data_dir.parent().filter(|parent| !parent.as_os_str().is_empty()) {
        sync_dir(parent)?;
    }
    Ok(info)
}

/// Hex of a checksum or digest.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

// ---------------------------------------------------------------- footer

fn encode_footer(snapshot_bytes: u64, position: TermSeqno, history: &[TermSeqno]) -> Vec<u8> {
    let mut out = Vec::with_capacity(FOOTER_FIXED_LEN + 16 * history.len());
    out.extend_from_slice(&BACKUP_MAGIC);
    out.extend_from_slice(&BACKUP_VERSION.to_le_bytes());
    out.extend_from_slice(&snapshot_bytes.to_le_bytes());
    out.extend_from_slice(&position.term.0.to_le_bytes());
    out.extend_from_slice(&position.seqno.0.to_le_bytes());
    let count = u32::try_from(history.len()).expect("a term history is bounded by TERM_HISTORY_LEN_MAX");
    out.extend_from_slice(&count.to_le_bytes());
    for entry in history {
        out.extend_from_slice(&entry.term.0.to_le_bytes());
        out.extend_from_slice(&entry.seqno.0.to_le_bytes());
    }
    out
}

/// What is wrong with a file that is not a whole backup (becomes [`BackupError::NotABackup`]).
#[derive(Debug, PartialEq, Eq)]
struct Damage(String);

/// The footer's bytes and length, found from the trailer at the end of a `bytes`-long file.
fn read_footer(file: &mut File, bytes: u64) -> Result<(Vec<u8>, u64), Damage> {
    let mut trailer = [0u8; BACKUP_TRAILER_LEN as usize];
    file.seek(SeekFrom::Start(bytes - BACKUP_TRAILER_LEN))
        .and_then(|_| file.read_exact(&mut trailer))
        .map_err(|error| Damage(format!("read its trailer: {error}")))?;
    let footer_len = u64::from(u32::from_le_bytes(trailer[..4].try_into().expect("4 bytes")));
    let footer_max = (FOOTER_FIXED_LEN + 16 * TERM_HISTORY_LEN_MAX) as u64;
    if !(FOOTER_FIXED_LEN as u64..=footer_max).contains(&footer_len)
        || footer_len + BACKUP_TRAILER_LEN > bytes
    {
        return Err(Damage(format!(
            "no backup footer at its end (truncated?): footer length {footer_len} in {bytes} bytes"
        )));
    }
    let mut footer = vec![0u8; footer_len as usize];
    file.seek(SeekFrom::Start(bytes - BACKUP_TRAILER_LEN - footer_len))
        .and_then(|_| file.read_exact(&mut footer))
        .map_err(|error| Damage(format!("read its footer: {error}")))?;
    Ok((footer, footer_len))
}

fn decode_footer(footer: &[u8]) -> Result<(u64, TermSeqno, Vec<TermSeqno>), Damage> {
    let u64_at = |at: usize| u64::from_le_bytes(footer[at..at + 8].try_into().expect("8 bytes"));
    if footer[..8] != BACKUP_MAGIC {
        return Err(Damage("no backup footer at its end (truncated?)".into()));
    }
    let version = u32::from_le_bytes(footer[8..12].try_into().expect("4 bytes"));
    if version != BACKUP_VERSION {
        return Err(Damage(format!(
            "backup format version {version}; this build reads version {BACKUP_VERSION}"
        )));
    }
    let position = TermSeqno { term: Term(u64_at(20)), seqno: Seqno(u64_at(28)) };
    let count = u32::from_le_bytes(footer[36..40].try_into().expect("4 bytes")) as usize;
    if count > TERM_HISTORY_LEN_MAX || footer.len() != FOOTER_FIXED_LEN + 16 * count {
        return Err(Damage(format!(
            "its footer's {count} term history entries do not fit its {} bytes",
            footer.len()
        )));
    }
    let history = (0..count)
        .map(|i| TermSeqno { term: Term(u64_at(40 + 16 * i)), seqno: Seqno(u64_at(48 + 16 * i)) })
        .collect();
    Ok((u64_at(12), position, history))
}

/// The footer agrees with the snapshot, and its history puts S's term at S (what the WAL reset
/// at the first start requires).
fn check_consistent(
    snapshot: &SnapshotInfo,
    position: TermSeqno,
    history: &[TermSeqno],
) -> Result<(), Damage> {
    if snapshot.position != position {
        return Err(Damage(format!("its footer says {position}, its snapshot holds {}", snapshot.position)));
    }
    let ordered = history.windows(2).all(|pair| pair[0].term < pair[1].term && pair[0].seqno < pair[1].seqno);
    let term_at_s = history.iter().rev().find(|entry| entry.seqno <= position.seqno).map(|entry| entry.term);
    if position.seqno > Seqno::ZERO && (!ordered || term_at_s != Some(position.term)) {
        return Err(Damage(format!(
            "its term history {history:?} does not put term {} at seqno {}",
            position.term, position.seqno
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------- helpers

struct HashingWriter<W: Write> {
    inner: W,
    hasher: blake3::Hasher,
    bytes: u64,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let written = self.inner.write(buf)?;
        self.hasher.update(&buf[..written]);
        self.bytes += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

struct HashingReader<R: Read> {
    inner: R,
    hasher: blake3::Hasher,
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let read = self.inner.read(buf)?;
        self.hasher.update(&buf[..read]);
        Ok(read)
    }
}

fn check_empty(data_dir: &Path) -> Result<(), BackupError> {
    match std::fs::read_dir(data_dir) {
        Ok(mut entries) => match entries.next() {
            None => Ok(()),
            Some(_) => Err(BackupError::NotEmpty { dir: data_dir.to_path_buf() }),
        },
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(BackupError::Io { what: format!("list {}", data_dir.display()), source }),
    }
}

fn remove_leftover_cuts(dir: &Path) -> Result<(), BackupError> {
    for entry in std::fs::read_dir(dir).map_err(io("list the snapshot directory"))? {
        let path = entry.map_err(io("list the snapshot directory"))?.path();
        let leftover =
            path.file_name().and_then(|name| name.to_str()).is_some_and(|name| name.starts_with(CUT_PREFIX));
        if leftover {
            std::fs::remove_file(&path).map_err(io_at("remove", &path))?;
        }
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<(), BackupError> {
    File::open(dir).and_then(|dir| dir.sync_all()).map_err(io_at("fsync", dir))
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> BackupError {
    move |source| BackupError::Io { what: what.to_string(), source }
}

fn io_at<'a>(what: &'a str, path: &'a Path) -> impl FnOnce(std::io::Error) -> BackupError + 'a {
    move |source| BackupError::Io { what: format!("{what} {}", path.display()), source }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(term: u64, seqno: u64) -> TermSeqno {
        TermSeqno { term: Term(term), seqno: Seqno(seqno) }
    }

    #[test]
    fn the_footer_round_trips_and_a_bad_one_is_refused() {
        let history = vec![at(1, 1), at(3, 500)];
        let footer = encode_footer(12345, at(3, 900), &history);
        assert_eq!(decode_footer(&footer).unwrap(), (12345, at(3, 900), history));
        let mut wrong_magic = footer.clone();
        wrong_magic[0] ^= 1;
        assert!(decode_footer(&wrong_magic).unwrap_err().0.contains("no backup footer"));
        let mut wrong_version = footer.clone();
        wrong_version[8] = 9;
        assert!(decode_footer(&wrong_version).unwrap_err().0.contains("version 9"));
        assert!(decode_footer(&footer[..footer.len() - 1]).unwrap_err().0.contains("do not fit"));
    }

    #[test]
    fn a_history_must_put_the_terms_of_s_at_s() {
        let info = |position| SnapshotInfo { position, dimension: 8, bytes: 0, entries: 0, digest: [0; 32] };
        assert!(check_consistent(&info(at(3, 900)), at(3, 900), &[at(1, 1), at(3, 500)]).is_ok());
        assert!(check_consistent(&info(at(3, 900)), at(3, 900), &[at(1, 1)]).is_err());
        assert!(check_consistent(&info(at(3, 900)), at(2, 900), &[at(1, 1), at(2, 5)]).is_err());
        assert!(check_consistent(&info(at(0, 0)), at(0, 0), &[]).is_ok());
    }

    #[test]
    fn a_restore_refuses_a_non_empty_dir_before_reading_anything() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("something"), b"x").unwrap();
        let error = restore_backup(Path::new("/nonexistent/backup"), dir.path()).unwrap_err();
        assert!(matches!(error, BackupError::NotEmpty { .. }), "{error}");
    }
}
