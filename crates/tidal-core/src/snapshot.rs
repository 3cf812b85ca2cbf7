//! The snapshot format: a self-describing, checksummed stream of the log-derived state at one applied
//! seqno, plus the exporter's hard negatives (merged, never installed as they are).
//!
//! ```text
//! header   magic "TIDALSNP" | version u32 | dimension u32 | seqno u64 | term u64        (32 bytes, LE)
//! section  'S' | name_len u8 | name                                    one per keyspace, fixed order
//!   entry  'E' | key_len u32 | key | value_len u32 | value            keys strictly ascending
//!   end    'Z' | entries u64
//! trailer  'T' | state digest [32] | BLAKE3 of every byte before it [32]
//! ```
//!
//! Sections come in [`SECTIONS`] order: the log-derived keyspaces in digest order, then
//! `negatives`. The state digest in the trailer is the exporter's [`crate::TidalDb::digest`] at the
//! snapshot's seqno, computed over the same records, so an importer proves the records reproduce
//! the exporter's state before it writes anything, and checks its own digest after.
//!
//! Delicate:
//! - Nothing read here is trusted: every length is bounded before anything is allocated for it (a
//!   lying length on a short stream grows a buffer only as far as the bytes that exist), every
//!   entry is checked against the shape its keyspace needs to load, and bytes after the trailer
//!   are an error. [`read_snapshot`] hands an entry to its visitor only once it passed those checks;
//!   the whole-stream checksum can only be checked at the end, so an installer reads the stream
//!   twice: once to verify with a visitor that does nothing, once to write.
//! - A format change needs a version bump: importers refuse versions they do not know.

use std::io::{Read, Write};

use tidal_types::{Seqno, Term, TermSeqno};

use crate::digest::StateHasher;
use crate::error::Error;
use crate::keys;
use crate::negatives::NegativesState;
use crate::trend::{Trend, TREND_LEN};

/// First bytes of every snapshot.
pub const SNAPSHOT_MAGIC: [u8; 8] = *b"TIDALSNP";
/// The format version this build writes and reads.
pub const SNAPSHOT_VERSION: u32 = 3;
/// Bytes of the fixed header.
pub const SNAPSHOT_HEADER_LEN: usize = 32;
/// Largest key: fjall's own key limit.
pub const SNAPSHOT_KEY_BYTES_MAX: usize = 65_536;
/// Largest value: an item's metadata can be as large as a batch payload (64 MiB) plus its seqno;
/// nothing else the engine stores comes close.
pub const SNAPSHOT_VALUE_BYTES_MAX: usize = 64 * 1024 * 1024 + 1024;
/// Section names, in stream order: the log-derived keyspaces in digest order, then negatives.
pub const SECTIONS: [&str; 12] = [
    "meta",
    "items",
    "embeddings",
    "trending",
    "counters",
    "profiles",
    "seen",
    "idempotency",
    "streams",
    "stream_events",
    "inboxes",
    NEGATIVES,
];
/// Name of the hard negatives section (not log-derived: merged by the importer).
pub const NEGATIVES: &str = "negatives";
/// Index of the negatives section in [`SECTIONS`].
pub const NEGATIVES_SECTION: usize = 11;
/// Index of the seen section in [`SECTIONS`]: the seen set's logical pairs, whatever layout the
/// exporter stores them in (decisions/056).
pub const SEEN_SECTION: usize = 6;
/// Index of the trending section in [`SECTIONS`]: item → trend, as the trend blocks hold them
/// (decisions/070).
pub const TRENDING_SECTION: usize = 3;
/// Index of the counters section in [`SECTIONS`]: item | kind → count, from the trend blocks.
pub const COUNTERS_SECTION: usize = 4;
/// meta key present while an install is replacing the state (never in a snapshot).
pub const META_IMPORT_PENDING: &[u8] = b"import_pending";

/// Most keys the meta section may hold: the engine writes four; an install holds them in memory.
const META_KEYS_MAX: u64 = 64;

const TAG_SECTION: u8 = b'S';
const TAG_ENTRY: u8 = b'E';
const TAG_SECTION_END: u8 = b'Z';
const TAG_TRAILER: u8 = b'T';

/// What a snapshot holds, from its header and trailer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// The position the state is at: its applied seqno and the term of the batch holding it.
    pub position: TermSeqno,
    /// The embedding dimension of the exporting database.
    pub dimension: u32,
    /// Bytes of the whole stream.
    pub bytes: u64,
    /// Entries in every section (negatives included).
    pub entries: u64,
    /// The exporter's state digest at `position.seqno` ([`crate::TidalDb::digest`]).
    pub digest: [u8; 32],
}

/// Why a snapshot could not be written, read or installed.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// Reading or writing the stream failed.
    #[error("snapshot I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The stream is not a well-formed snapshot (garbage, truncated, out of order, oversize).
    #[error("malformed snapshot at byte {offset}: {reason}")]
    Malformed {
        /// Byte offset where the problem was found.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// The stream's BLAKE3 does not match its trailer: corrupted in transit or on disk.
    #[error("snapshot checksum mismatch: trailer {expected}, content {got}")]
    Checksum {
        /// Checksum in the trailer (hex).
        expected: String,
        /// Checksum of the bytes read (hex).
        got: String,
    },
    /// The records do not reproduce the state digest in the trailer: the exporter is broken.
    #[error("snapshot records hash to state digest {got}, the trailer says {expected}")]
    Digest {
        /// Digest in the trailer (hex).
        expected: String,
        /// Digest of the records (hex).
        got: String,
    },
    /// A well-formed snapshot this node cannot take (another dimension, a half-installed exporter).
    #[error("snapshot does not fit this node: {reason}")]
    Incompatible {
        /// Why.
        reason: String,
    },
    /// After the install, this node's state digest differs from the snapshot's: a bug; the state
    /// stays marked incomplete and applies are refused.
    #[error("installed state has digest {got}, the snapshot's is {expected}")]
    Installed {
        /// Snapshot digest (hex).
        expected: String,
        /// Digest after the install (hex).
        got: String,
    },
    /// The engine failed.
    #[error(transparent)]
    Engine(#[from] Error),
    /// An install stopped on purpose half-way ([`crate::TidalDb::simulate_interrupted_install`]).
    #[error("install interrupted (simulated crash)")]
    Interrupted,
}

impl From<fjall::Error> for SnapshotError {
    fn from(error: fjall::Error) -> Self {
        SnapshotError::Engine(Error::Storage(error))
    }
}

/// Hex of a digest, for messages.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes a snapshot stream: header, then sections in [`SECTIONS`] order, then [`Self::finish`].
pub struct SnapshotWriter<W: Write> {
    out: W,
    checksum: blake3::Hasher,
    state: StateHasher,
    section: Option<usize>,
    next_section: usize,
    count: u64,
    entries: u64,
    bytes: u64,
    header: (Seqno, Term, u32),
}

impl<W: Write> SnapshotWriter<W> {
    /// Starts a snapshot of the state at `(term, seqno)` of a database of `dimension`.
    pub fn new(out: W, position: TermSeqno, dimension: u32) -> Result<Self, SnapshotError> {
        let mut writer = SnapshotWriter {
            out,
            checksum: blake3::Hasher::new(),
            state: StateHasher::default(),
            section: None,
            next_section: 0,
            count: 0,
            entries: 0,
            bytes: 0,
            header: (position.seqno, position.term, dimension),
        };
        let mut header = Vec::with_capacity(SNAPSHOT_HEADER_LEN);
        header.extend_from_slice(&SNAPSHOT_MAGIC);
        header.extend_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
        header.extend_from_slice(&dimension.to_le_bytes());
        header.extend_from_slice(&position.seqno.0.to_le_bytes());
        header.extend_from_slice(&position.term.0.to_le_bytes());
        writer.put(&header)?;
        Ok(writer)
    }

    /// Starts the next section; it must be `SECTIONS[next]`.
    pub fn section(&mut self, name: &str) -> Result<(), SnapshotError> {
        assert!(self.section.is_none(), "section {name} started inside another");
        let index = self.next_section;
        assert_eq!(SECTIONS.get(index), Some(&name), "section {name} out of order at {index}");
        self.put(&[TAG_SECTION, name.len() as u8])?;
        self.put(name.as_bytes())?;
        if index != NEGATIVES_SECTION {
            self.state.keyspace(name);
        }
        self.section = Some(index);
        self.count = 0;
        Ok(())
    }

    /// One entry of the current section; keys must come in ascending order (fjall's).
    pub fn entry(&mut self, key: &[u8], value: &[u8]) -> Result<(), SnapshotError> {
        let section = self.section.expect("an entry is written inside a section");
        self.put(&[TAG_ENTRY])?;
        self.put(&(key.len() as u32).to_le_bytes())?;
        self.put(key)?;
        self.put(&(value.len() as u32).to_le_bytes())?;
        self.put(value)?;
        if section != NEGATIVES_SECTION {
            self.state.entry(key, value);
        }
        self.count += 1;
        self.entries += 1;
        Ok(())
    }

    /// Ends the current section.
    pub fn end_section(&mut self) -> Result<(), SnapshotError> {
        let section = self.section.take().expect("a section is open");
        self.put(&[TAG_SECTION_END])?;
        let count = self.count;
        self.put(&count.to_le_bytes())?;
        if section != NEGATIVES_SECTION {
            self.state.end_keyspace();
        }
        self.next_section += 1;
        Ok(())
    }

    /// Writes the trailer and flushes; returns what the snapshot holds and the writer.
    pub fn finish(mut self) -> Result<(SnapshotInfo, W), SnapshotError> {
        assert_eq!(self.next_section, SECTIONS.len(), "snapshot finished before its last section");
        let (seqno, term, dimension) = self.header;
        let digest = std::mem::take(&mut self.state).finish(seqno);
        self.put(&[TAG_TRAILER])?;
        self.put(&digest)?;
        let checksum = *self.checksum.finalize().as_bytes();
        self.out.write_all(&checksum)?;
        self.bytes += 32;
        self.out.flush()?;
        let info = SnapshotInfo {
            position: TermSeqno { term, seqno },
            dimension,
            bytes: self.bytes,
            entries: self.entries,
            digest,
        };
        Ok((info, self.out))
    }

    fn put(&mut self, bytes: &[u8]) -> Result<(), SnapshotError> {
        self.out.write_all(bytes)?;
        self.checksum.update(bytes);
        self.bytes += bytes.len() as u64;
        Ok(())
    }
}

/// Called with `(section index, key, value)` for every checked entry.
pub type EntryVisitor<'a> = dyn FnMut(usize, &[u8], &[u8]) -> Result<(), SnapshotError> + 'a;

/// Reads and checks a whole snapshot, handing every checked entry to `visit(section, key, value)`
/// (`section` indexes [`SECTIONS`]). `dimension` is the importer's: another one is
/// [`SnapshotError::Incompatible`]. The checksum and the state digest are checked at the end, so a
/// caller that must not act on a bad snapshot runs this once with a visitor that does nothing.
pub fn read_snapshot(
    input: impl Read,
    dimension: u32,
    visit: &mut EntryVisitor<'_>,
) -> Result<SnapshotInfo, SnapshotError> {
    let mut reader = Reader { input, checksum: blake3::Hasher::new(), offset: 0 };
    let position = read_header(&mut reader, dimension)?;
    let mut state = StateHasher::default();
    let mut entries = 0u64;
    for (index, name) in SECTIONS.iter().enumerate() {
        let tag = reader.u8()?;
        if tag != TAG_SECTION {
            return Err(reader.malformed(format!("expected section {name}, found tag {tag:#04x}")));
        }
        let len = usize::from(reader.u8()?);
        let mut found = Vec::new();
        reader.bytes(len, &mut found)?;
        if found != name.as_bytes() {
            return Err(reader.malformed(format!("expected section {name}, found {:?}", hex(&found))));
        }
        let log_derived = index != NEGATIVES_SECTION;
        if log_derived {
            state.keyspace(name);
        }
        let mut section = SectionCheck::new(index, position, dimension);
        let (mut key, mut value) = (Vec::new(), Vec::new());
        loop {
            match reader.u8()? {
                TAG_ENTRY => {
                    reader.sized(SNAPSHOT_KEY_BYTES_MAX, "key", &mut key)?;
                    reader.sized(SNAPSHOT_VALUE_BYTES_MAX, "value", &mut value)?;
                    section
                        .entry(&key, &value)
                        .map_err(|reason| reader.malformed(format!("{name}: {reason}")))?;
                    if log_derived {
                        state.entry(&key, &value);
                    }
                    visit(index, &key, &value)?;
                    entries += 1;
                }
                TAG_SECTION_END => {
                    let count = reader.u64()?;
                    if count != section.count {
                        let reason =
                            format!("{name} ends claiming {count} entries, it held {}", section.count);
                        return Err(reader.malformed(reason));
                    }
                    section.end().map_err(|reason| reader.malformed(format!("{name}: {reason}")))?;
                    break;
                }
                tag => return Err(reader.malformed(format!("unexpected tag {tag:#04x} in section {name}"))),
            }
        }
        if log_derived {
            state.end_keyspace();
        }
    }
    let tag = reader.u8()?;
    if tag != TAG_TRAILER {
        return Err(reader.malformed(format!("expected the trailer, found tag {tag:#04x}")));
    }
    let digest: [u8; 32] = reader.array()?;
    let computed = *reader.checksum.finalize().as_bytes();
    let mut stored = [0u8; 32];
    read_exact_or_truncated(&mut reader.input, &mut stored, reader.offset)?;
    let bytes = reader.offset + 32;
    if stored != computed {
        return Err(SnapshotError::Checksum { expected: hex(&stored), got: hex(&computed) });
    }
    let mut extra = [0u8; 1];
    if reader.input.read(&mut extra)? != 0 {
        return Err(SnapshotError::Malformed { offset: bytes, reason: "bytes after the trailer".into() });
    }
    let records_digest = state.finish(position.seqno);
    if records_digest != digest {
        return Err(SnapshotError::Digest { expected: hex(&digest), got: hex(&records_digest) });
    }
    Ok(SnapshotInfo { position, dimension, bytes, entries, digest })
}

fn read_header<R: Read>(reader: &mut Reader<R>, dimension: u32) -> Result<TermSeqno, SnapshotError> {
    let header: [u8; SNAPSHOT_HEADER_LEN] = reader.array()?;
    let field = |range: std::ops::Range<usize>| &header[range];
    if field(0..8) != SNAPSHOT_MAGIC {
        return Err(SnapshotError::Malformed {
            offset: 0,
            reason: "not a Tidal snapshot (bad magic)".into(),
        });
    }
    let u32_at = |at: usize| u32::from_le_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]]);
    let u64_at = |at: usize| {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&header[at..at + 8]);
        u64::from_le_bytes(bytes)
    };
    let version = u32_at(8);
    if version != SNAPSHOT_VERSION {
        return Err(SnapshotError::Incompatible {
            reason: format!("format version {version}, this build reads {SNAPSHOT_VERSION}"),
        });
    }
    let snapshot_dimension = u32_at(12);
    if snapshot_dimension != dimension {
        return Err(SnapshotError::Incompatible {
            reason: format!("embedding dimension {snapshot_dimension}, this database has {dimension}"),
        });
    }
    let position = TermSeqno { term: Term(u64_at(24)), seqno: Seqno(u64_at(16)) };
    if (position.seqno == Seqno::ZERO) != (position.term == Term(0)) {
        return Err(SnapshotError::Malformed {
            offset: 16,
            reason: format!("position {position}: term 0 goes with seqno 0 only"),
        });
    }
    Ok(position)
}

/// Per-section checks: key order and the shape every keyspace needs to load.
struct SectionCheck {
    index: usize,
    position: TermSeqno,
    dimension: usize,
    /// The previous key (empty before the first: keys are never empty).
    previous: Vec<u8>,
    count: u64,
    meta_applied: Option<u64>,
    meta_dimension: Option<u32>,
}

impl SectionCheck {
    fn new(index: usize, position: TermSeqno, dimension: u32) -> SectionCheck {
        SectionCheck {
            index,
            position,
            dimension: dimension as usize,
            previous: Vec::new(),
            count: 0,
            meta_applied: None,
            meta_dimension: None,
        }
    }

    fn entry(&mut self, key: &[u8], value: &[u8]) -> Result<(), String> {
        if key.is_empty() {
            return Err("empty key".into());
        }
        if self.previous.as_slice() >= key {
            return Err(format!("key {} is not above the previous one", hex(key)));
        }
        self.previous.clear();
        self.previous.extend_from_slice(key);
        self.count += 1;
        let vector_len = 8 + self.dimension * 4;
        let item_key =
            || keys::item_of_key(key).map(|_| ()).ok_or_else(|| "item key is not 8 bytes".to_string());
        match SECTIONS[self.index] {
            "meta" => self.meta(key, value),
            "items" => {
                item_key()?;
                keys::split_seqno_value(value).map(|_| ()).ok_or_else(|| "value shorter than a seqno".into())
            }
            "embeddings" => {
                item_key()?;
                (value.len() == vector_len)
                    .then_some(())
                    .ok_or_else(|| format!("{} bytes, not {vector_len}", value.len()))
            }
            "trending" => {
                item_key()?;
                (value.len() == TREND_LEN && Trend::decode(value).is_some())
                    .then_some(())
                    .ok_or_else(|| "not a trend".into())
            }
            "counters" => {
                let kind = key.get(8..).filter(|kind| !kind.is_empty()).ok_or("counter key too short")?;
                std::str::from_utf8(kind).map_err(|_| "counter kind is not UTF-8")?;
                keys::u64_value(value).map(|_| ()).ok_or_else(|| "count is not a u64".into())
            }
            "profiles" => {
                std::str::from_utf8(key).map_err(|_| "user is not UTF-8")?;
                (value.len() == vector_len)
                    .then_some(())
                    .ok_or_else(|| format!("{} bytes, not {vector_len}", value.len()))
            }
            "seen" => {
                let len = key.get(..2).map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])));
                let fits = len.is_some_and(|len| key.len() == 2 + len + 8);
                (fits && value.is_empty()).then_some(()).ok_or_else(|| "malformed seen entry".into())
            }
            "idempotency" => Ok(()),
            "streams" => crate::streams::check_stream_entry(key, value).map_err(|e| e.to_string()),
            "stream_events" => crate::streams::check_event_entry(key, value).map_err(|e| e.to_string()),
            "inboxes" => crate::inboxes::check_inbox_entry(key, value).map_err(|e| e.to_string()),
            NEGATIVES => {
                std::str::from_utf8(key).map_err(|_| "user is not UTF-8")?;
                NegativesState::from_bytes(value).map(|_| ())
            }
            other => unreachable!("section {other} has no checks"),
        }
    }

    fn meta(&mut self, key: &[u8], value: &[u8]) -> Result<(), String> {
        if self.count > META_KEYS_MAX {
            return Err(format!("more than {META_KEYS_MAX} meta keys"));
        }
        if key == META_IMPORT_PENDING {
            return Err("the exporter was itself half-way through an install".into());
        }
        if key == keys::META_APPLIED_SEQNO {
            self.meta_applied = Some(keys::u64_value(value).ok_or("applied seqno is not a u64")?);
        }
        if key == keys::META_DIMENSION {
            let bytes = <[u8; 4]>::try_from(value).map_err(|_| "dimension is not a u32")?;
            self.meta_dimension = Some(u32::from_le_bytes(bytes));
        }
        Ok(())
    }

    fn end(&self) -> Result<(), String> {
        if SECTIONS[self.index] != "meta" {
            return Ok(());
        }
        let seqno = self.position.seqno.0;
        if self.meta_applied.unwrap_or(0) != seqno {
            return Err(format!("applied seqno {:?}, the header says {seqno}", self.meta_applied));
        }
        if self.meta_dimension != Some(self.dimension as u32) {
            return Err(format!("dimension {:?}, the header says {}", self.meta_dimension, self.dimension));
        }
        Ok(())
    }
}

/// A reader that hashes what it reads and knows its offset.
struct Reader<R: Read> {
    input: R,
    checksum: blake3::Hasher,
    offset: u64,
}

impl<R: Read> Reader<R> {
    fn malformed(&self, reason: String) -> SnapshotError {
        SnapshotError::Malformed { offset: self.offset, reason }
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], SnapshotError> {
        let mut bytes = [0u8; N];
        read_exact_or_truncated(&mut self.input, &mut bytes, self.offset)?;
        self.checksum.update(&bytes);
        self.offset += N as u64;
        Ok(bytes)
    }

    fn u8(&mut self) -> Result<u8, SnapshotError> {
        Ok(self.array::<1>()?[0])
    }

    fn u64(&mut self) -> Result<u64, SnapshotError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// Exactly `len` bytes into `bytes` (reused); it grows only with bytes actually read.
    fn bytes(&mut self, len: usize, bytes: &mut Vec<u8>) -> Result<(), SnapshotError> {
        bytes.clear();
        (&mut self.input).take(len as u64).read_to_end(bytes)?;
        if bytes.len() != len {
            let reason = format!("truncated: {} of {len} bytes", bytes.len());
            return Err(SnapshotError::Malformed { offset: self.offset + bytes.len() as u64, reason });
        }
        self.checksum.update(bytes);
        self.offset += len as u64;
        Ok(())
    }

    /// A u32 length, at most `max`, then that many bytes into `bytes`.
    fn sized(&mut self, max: usize, what: &str, bytes: &mut Vec<u8>) -> Result<(), SnapshotError> {
        let len = u32::from_le_bytes(self.array()?) as usize;
        if len > max {
            return Err(self.malformed(format!("{what} of {len} bytes is over the limit of {max}")));
        }
        self.bytes(len, bytes)
    }
}

fn read_exact_or_truncated(
    input: &mut impl Read,
    bytes: &mut [u8],
    offset: u64,
) -> Result<(), SnapshotError> {
    input.read_exact(bytes).map_err(|error| match error.kind() {
        std::io::ErrorKind::UnexpectedEof => {
            SnapshotError::Malformed { offset, reason: "truncated: the stream ends early".into() }
        }
        _ => SnapshotError::Io(error),
    })
}

#[cfg(test)]
mod snapshot_test;
