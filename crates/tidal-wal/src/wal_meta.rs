//! `wal.meta`: the term history and the purge point, which a scan cannot rebuild once segments are
//! purged.
//!
//! ```text
//! offset size field
//!      0    4 magic "TDLM"
//!      4    1 format version (1)
//!      5    3 reserved, zero
//!      8    8 purge point term     u64 LE
//!     16    8 purge point seqno    u64 LE (0: nothing purged)
//!     24    4 entry count n        u32 LE (<= TERM_HISTORY_LEN_MAX)
//!     28    4 reserved, zero
//!     32 16*n entries: term u64 LE, first seqno u64 LE (strictly increasing in both)
//!  32+16n  32 BLAKE3 of every byte before it
//! ```
//!
//! Version 2 is the same with one more fixed field, written only while a truncation is under way
//! (a quarantine or a reset): at offset 32, `truncate_from u64 LE` (every batch at or above that seqno
//! is being removed), and the entries start at offset 40. A file with no truncation pending is always
//! written as version 1, so a WAL that never truncates keeps its exact bytes. Recovery that finds a
//! pending truncation finishes it before it scans, then writes the file again without it.
//!
//! Delicate: the file is replaced by write-then-rename: write `wal.meta.tmp`, fsync it, rename it over
//! `wal.meta`, fsync the directory. A crash leaves either the old or the new file, never a mix; a
//! leftover `.tmp` is ignored and removed on open. A failed fsync here is as fatal as one of a segment.

use std::path::{Path, PathBuf};

use tidal_types::{Seqno, Term, TermSeqno};

use crate::error::Error;
use crate::io::FileIo;

/// Name of the meta file in the WAL directory.
pub const META_FILE_NAME: &str = "wal.meta";
/// Name of the temporary file a new meta file is written to before the rename.
pub const META_TMP_FILE_NAME: &str = "wal.meta.tmp";
const META_MAGIC: [u8; 4] = *b"TDLM";
const META_VERSION: u8 = 1;
/// The version that carries a pending truncation.
const META_VERSION_TRUNCATING: u8 = 2;
const META_FIXED_LEN: usize = 32;
/// Fixed length of a version-2 file: the version-1 fields plus `truncate_from`.
const META_FIXED_LEN_TRUNCATING: usize = 40;
const META_HASH_LEN: usize = 32;
const META_ENTRY_LEN: usize = 16;
/// Most term-history entries the file may hold: a million terms is far beyond any real cluster's
/// elections, and bounds what decoding an untrusted file allocates (16 MiB).
pub const TERM_HISTORY_LEN_MAX: usize = 1 << 20;

/// The persisted term history and purge point.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WalMeta {
    /// `(term, first seqno of that term)`, strictly increasing in both.
    pub term_history: Vec<TermSeqno>,
    /// The last purged position; seqno 0 when nothing was purged.
    pub purged: TermSeqno,
    /// A truncation under way: every batch at or above this seqno is being removed (seqno 0: none).
    /// Recovery finishes it.
    pub truncate_from: Seqno,
}

impl WalMeta {
    /// The term in force at `seqno`, from the history (`Term(0)` before the first entry).
    pub fn term_at(&self, seqno: Seqno) -> Term {
        self.term_history.iter().take_while(|entry| entry.seqno <= seqno).last().map_or(Term(0), |e| e.term)
    }

    /// Encodes the file.
    pub fn encode(&self) -> Vec<u8> {
        let count =
            u32::try_from(self.term_history.len()).expect("term history is bounded by TERM_HISTORY_LEN_MAX");
        let truncating = self.truncate_from > Seqno::ZERO;
        let fixed_len = if truncating { META_FIXED_LEN_TRUNCATING } else { META_FIXED_LEN };
        let mut out =
            Vec::with_capacity(fixed_len + self.term_history.len() * META_ENTRY_LEN + META_HASH_LEN);
        out.extend_from_slice(&META_MAGIC);
        out.push(if truncating { META_VERSION_TRUNCATING } else { META_VERSION });
        out.extend_from_slice(&[0; 3]);
        out.extend_from_slice(&self.purged.term.0.to_le_bytes());
        out.extend_from_slice(&self.purged.seqno.0.to_le_bytes());
        out.extend_from_slice(&count.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        if truncating {
            out.extend_from_slice(&self.truncate_from.0.to_le_bytes());
        }
        for entry in &self.term_history {
            out.extend_from_slice(&entry.term.0.to_le_bytes());
            out.extend_from_slice(&entry.seqno.0.to_le_bytes());
        }
        let hash = blake3::hash(&out);
        out.extend_from_slice(hash.as_bytes());
        out
    }

    /// Decodes the file, checking every field; the error says what is wrong.
    pub fn decode(bytes: &[u8]) -> Result<WalMeta, String> {
        if bytes.len() < META_FIXED_LEN + META_HASH_LEN {
            return Err(format!("{} bytes is too short", bytes.len()));
        }
        if bytes[0..4] != META_MAGIC {
            return Err("bad magic".to_string());
        }
        let count = u32_at(bytes, 24) as usize;
        if count > TERM_HISTORY_LEN_MAX {
            return Err(format!("{count} term history entries is over the maximum"));
        }
        let fixed_len = match bytes[4] {
            META_VERSION => META_FIXED_LEN,
            META_VERSION_TRUNCATING => META_FIXED_LEN_TRUNCATING,
            version => return Err(format!("unsupported version {version}")),
        };
        let len = fixed_len + count * META_ENTRY_LEN + META_HASH_LEN;
        if bytes.len() != len {
            return Err(format!("length {} does not match {count} entries", bytes.len()));
        }
        let body = &bytes[..len - META_HASH_LEN];
        if blake3::hash(body).as_bytes() != &bytes[len - META_HASH_LEN..] {
            return Err("checksum mismatch".to_string());
        }
        if bytes[5..8] != [0; 3] || bytes[28..32] != [0; 4] {
            return Err("reserved bytes are not zero".to_string());
        }
        let purged = TermSeqno { term: Term(u64_at(bytes, 8)), seqno: Seqno(u64_at(bytes, 16)) };
        let truncate_from =
            if fixed_len == META_FIXED_LEN { Seqno::ZERO } else { Seqno(u64_at(bytes, META_FIXED_LEN)) };
        if fixed_len == META_FIXED_LEN_TRUNCATING && truncate_from == Seqno::ZERO {
            return Err("version 2 without a pending truncation".to_string());
        }
        let mut term_history: Vec<TermSeqno> = Vec::with_capacity(count);
        for index in 0..count {
            let at = fixed_len + index * META_ENTRY_LEN;
            let entry = TermSeqno { term: Term(u64_at(bytes, at)), seqno: Seqno(u64_at(bytes, at + 8)) };
            if let Some(previous) = term_history.last() {
                if entry.term <= previous.term || entry.seqno <= previous.seqno {
                    return Err(format!("term history is not increasing at entry {index}"));
                }
            }
            term_history.push(entry);
        }
        Ok(WalMeta { term_history, purged, truncate_from })
    }

    /// Reads `dir/wal.meta`; `Ok(None)` if it does not exist.
    pub fn load(io: &dyn FileIo, dir: &Path) -> Result<Option<WalMeta>, Error> {
        let path = dir.join(META_FILE_NAME);
        match io.read_all(&path) {
            Ok(bytes) => WalMeta::decode(&bytes).map(Some).map_err(|reason| Error::corrupt(path, 0, reason)),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(err) => Err(Error::io("read meta file", path, err)),
        }
    }

    /// Durably replaces `dir/wal.meta` (write-then-rename, fsync of file and directory). Any failure
    /// is fatal: the caller poisons the WAL.
    pub fn store(&self, io: &dyn FileIo, dir: &Path) -> Result<(), Error> {
        let tmp: PathBuf = dir.join(META_TMP_FILE_NAME);
        let path = dir.join(META_FILE_NAME);
        let mut file = io.open_append(&tmp).map_err(|err| Error::fatal("create meta file", &tmp, err))?;
        file.truncate(0).map_err(|err| Error::fatal("truncate meta file", &tmp, err))?;
        file.write_all(&self.encode()).map_err(|err| Error::fatal("write meta file", &tmp, err))?;
        file.sync_data().map_err(|err| Error::fatal("fsync meta file", &tmp, err))?;
        drop(file);
        io.rename(&tmp, &path).map_err(|err| Error::fatal("rename meta file", &path, err))?;
        io.sync_dir(dir).map_err(|err| Error::fatal("fsync WAL directory", dir, err))?;
        Ok(())
    }
}

fn u32_at(buf: &[u8], at: usize) -> u32 {
    let mut bytes = [0u8; 4];
    bytes.copy_from_slice(&buf[at..at + 4]);
    u32::from_le_bytes(bytes)
}

fn u64_at(buf: &[u8], at: usize) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&buf[at..at + 8]);
    u64::from_le_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> WalMeta {
        WalMeta {
            term_history: vec![
                TermSeqno { term: Term(1), seqno: Seqno(1) },
                TermSeqno { term: Term(4), seqno: Seqno(90) },
            ],
            purged: TermSeqno { term: Term(1), seqno: Seqno(40) },
            truncate_from: Seqno::ZERO,
        }
    }

    #[test]
    fn a_pending_truncation_round_trips_as_version_2() {
        let mut meta = sample();
        assert_eq!(meta.encode()[4], 1);
        meta.truncate_from = Seqno(95);
        let bytes = meta.encode();
        assert_eq!(bytes[4], 2);
        assert_eq!(WalMeta::decode(&bytes).unwrap(), meta);
        for bit in 0..bytes.len() * 8 {
            let mut copy = bytes.clone();
            copy[bit / 8] ^= 1 << (bit % 8);
            assert!(WalMeta::decode(&copy).is_err(), "flip of bit {bit} went unnoticed");
        }
    }

    #[test]
    fn round_trips_and_answers_term_at() {
        let meta = sample();
        assert_eq!(WalMeta::decode(&meta.encode()).unwrap(), meta);
        assert_eq!(meta.term_at(Seqno(0)), Term(0));
        assert_eq!(meta.term_at(Seqno(89)), Term(1));
        assert_eq!(meta.term_at(Seqno(90)), Term(4));
    }

    #[test]
    fn every_flipped_bit_and_every_truncation_is_refused() {
        let bytes = sample().encode();
        for bit in 0..bytes.len() * 8 {
            let mut copy = bytes.clone();
            copy[bit / 8] ^= 1 << (bit % 8);
            assert!(WalMeta::decode(&copy).is_err(), "flip of bit {bit} went unnoticed");
        }
        for len in 0..bytes.len() {
            assert!(WalMeta::decode(&bytes[..len]).is_err(), "truncation to {len} went unnoticed");
        }
    }
}
