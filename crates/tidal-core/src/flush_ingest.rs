//! How a flush reaches fjall: from `flush_ingest_bytes_min` (1 MiB) on by ingestion, one new table
//! per keyspace it touches, not through fjall's journal; a smaller one as one write batch (issue 43,
//! decisions/072).
//!
//! ```text
//! flusher:  collect writes -> sort per keyspace -> small? one write batch, done
//!           -> fsync fjall's journal -> intent file (fsync) -> ingest each keyspace
//!           -> ingest meta (the applied seqno: the commit point) -> empty the intent file
//! open:     intent file complete and past fjall's applied seqno?  ingest it again, meta last
//! ```
//!
//! Why: a write batch went through fjall's journal, and an open after a crash replays that journal
//! entry by entry with a keyspace lookup each (most of a crashed node's time to ready, up to about a
//! second for the 64 MB fjall keeps before it rotates). An ingested table is fsynced when it is
//! registered, so nothing of a flush waits in a journal.
//!
//! Delicate:
//! - Ingestions are atomic per keyspace, not across them. The intent file makes the flush atomic:
//!   it is complete and durable before the first ingestion, and it holds absolute values (puts and
//!   removes, never deltas), so ingesting it again over a torn flush gives the same state.
//! - `meta` goes last: its applied seqno says the whole flush is in fjall. An intent at or below
//!   fjall's applied seqno is stale and ignored.
//! - An intent that does not check out (its checksum, its shape) was cut short by a crash while it
//!   was written, before any ingestion: discarding it loses nothing fjall held.
//! - Readers that take one fjall snapshot across keyspaces (digest, snapshot export) take it under
//!   [`FlushIngest`]'s lock, never between two ingestions of one flush.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use fjall::{Keyspace, Slice};
use tidal_types::Seqno;

use crate::error::Error;
use crate::keys;
use crate::stores::Stores;

/// The intent file's name, in the engine's fjall directory (fjall reads only its own names there).
pub const INTENT_FILE: &str = "tidal-flush.intent";

/// First bytes of an intent file (format version 1).
const MAGIC: [u8; 8] = *b"TIDALFI1";

/// A key's new value in a flush, or its removal.
type Entry = (Slice, Option<Slice>);

/// One flush's writes, by keyspace, in the order they were put (a later write of a key wins).
#[derive(Default)]
pub struct FlushWrites {
    keyspaces: Vec<(Keyspace, Vec<Entry>)>,
    len: usize,
    bytes: usize,
}

impl FlushWrites {
    /// Puts `value` under `key`.
    pub fn insert<K: Into<Slice>, V: Into<Slice>>(&mut self, keyspace: &Keyspace, key: K, value: V) {
        let (key, value) = (key.into(), value.into());
        self.push(keyspace, key.len() + value.len(), (key, Some(value)));
    }

    /// Removes `key`.
    pub fn remove<K: Into<Slice>>(&mut self, keyspace: &Keyspace, key: K) {
        let key = key.into();
        self.push(keyspace, key.len(), (key, None));
    }

    fn push(&mut self, keyspace: &Keyspace, bytes: usize, entry: Entry) {
        self.entries(keyspace).push(entry);
        self.len += 1;
        self.bytes += bytes;
    }

    /// Writes put so far (a key written twice counts twice).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Commits the writes in one fjall write batch: atomic across keyspaces through fjall's
    /// journal, no intent needed.
    pub fn commit_as_batch(self, stores: &Stores) -> Result<(), Error> {
        let mut batch = stores.database.batch();
        for (keyspace, entries) in self.into_sorted(stores) {
            for (key, value) in entries {
                match value {
                    Some(value) => batch.insert(&keyspace, key, value),
                    None => batch.remove(&keyspace, key),
                }
            }
        }
        Ok(batch.commit()?)
    }

    fn entries(&mut self, keyspace: &Keyspace) -> &mut Vec<Entry> {
        let at = match self.keyspaces.iter().position(|(known, _)| known == keyspace) {
            Some(at) => at,
            None => {
                self.keyspaces.push((keyspace.clone(), Vec::new()));
                self.keyspaces.len() - 1
            }
        };
        &mut self.keyspaces[at].1
    }

    /// Each keyspace's writes ascending by key, each key once (its last write), `meta` last.
    fn into_sorted(self, stores: &Stores) -> Vec<(Keyspace, Vec<Entry>)> {
        let mut keyspaces: Vec<_> = self
            .keyspaces
            .into_iter()
            .map(|(keyspace, mut entries)| {
                // Stable: of equal keys the last put stays last, and wins below.
                entries.sort_by(|a, b| a.0.cmp(&b.0));
                let mut once: Vec<Entry> = Vec::with_capacity(entries.len());
                for entry in entries {
                    match once.last_mut() {
                        Some(last) if last.0 == entry.0 => *last = entry,
                        _ => once.push(entry),
                    }
                }
                (keyspace, once)
            })
            .collect();
        keyspaces.sort_by_key(|(keyspace, _)| *keyspace == stores.meta);
        keyspaces
    }
}

/// The engine's side of ingestion: the intent file and the lock a flush holds while it ingests.
#[derive(Debug)]
pub struct FlushIngest {
    path: PathBuf,
    committing: Mutex<()>,
    /// Smaller flushes go in one write batch.
    bytes_min: usize,
}

impl FlushIngest {
    /// The intent file of the engine whose fjall directory is `dir`; flushes of at least
    /// `bytes_min` bytes are ingested.
    pub fn new(dir: &Path, bytes_min: usize) -> FlushIngest {
        FlushIngest { path: dir.join(INTENT_FILE), committing: Mutex::new(()), bytes_min }
    }

    /// Held while no flush is between its first ingestion and its last: a fjall snapshot taken
    /// under it holds whole flushes only.
    pub fn whole_flushes(&self) -> MutexGuard<'_, ()> {
        self.committing.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// [`FlushIngest::whole_flushes`], or `None` while a flush is between its first ingestion and
    /// its last.
    pub fn try_whole_flushes(&self) -> Option<MutexGuard<'_, ()>> {
        match self.committing.try_lock() {
            Ok(guard) => Some(guard),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Writes `writes` (the flush of the overlay frozen at `applied`, whose `meta` writes include
    /// that applied seqno) into fjall: under `bytes_min` as one write batch, else by ingestion.
    /// `before_marker` runs once an ingestion has put every keyspace but `meta`; `false` from it
    /// stops there (a test's simulated crash). Returns whether it went to the end.
    pub fn commit(
        &self,
        stores: &Stores,
        writes: FlushWrites,
        applied: Seqno,
        before_marker: impl FnOnce() -> bool,
    ) -> Result<bool, Error> {
        if writes.bytes < self.bytes_min {
            writes.commit_as_batch(stores)?;
            return Ok(true);
        }
        // Earlier flushes that went in batches sit in fjall's journal, maybe only in OS buffers:
        // durable first, or a power loss could keep this flush's tables (and applied seqno) and
        // lose them.
        stores.database.persist(fjall::PersistMode::SyncAll)?;
        let keyspaces = writes.into_sorted(stores);
        debug_assert!(
            keyspaces.last().is_some_and(|(keyspace, _)| *keyspace == stores.meta),
            "a flush of {applied} writes its applied seqno to meta, last"
        );
        write_intent(&self.path, applied, &keyspaces)?;
        let whole = self.whole_flushes();
        let (marker, data) = keyspaces.split_last().expect("meta is in every flush");
        for (keyspace, entries) in data {
            ingest(keyspace, entries)?;
        }
        if !before_marker() {
            return Ok(false);
        }
        ingest(&marker.0, &marker.1)?;
        drop(whole);
        self.clear();
        Ok(true)
    }

    /// At open, before anything reads fjall: finishes a flush a crash cut between its ingestions.
    /// Returns the applied seqno of the flush it finished, if any.
    pub fn recover(&self, stores: &Stores) -> Result<Option<Seqno>, Error> {
        let bytes = match std::fs::read(&self.path) {
            Ok(bytes) if bytes.is_empty() => return Ok(None),
            Ok(bytes) => bytes,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(intent_io(&self.path, source)),
        };
        let intent = match decode_intent(&bytes, stores) {
            Ok(intent) => intent,
            Err(reason) => {
                tracing::warn!(
                    path = %self.path.display(),
                    %reason,
                    "a flush intent cut short while it was written: discarded (no table was ingested from it)"
                );
                self.clear();
                return Ok(None);
            }
        };
        let stored = stores.meta.get(keys::META_APPLIED_SEQNO)?.and_then(|bytes| keys::u64_value(&bytes));
        if stored.is_some_and(|stored| stored >= intent.applied.0) {
            self.clear();
            return Ok(None);
        }
        tracing::info!(applied = %intent.applied, "finishing a flush a crash interrupted");
        for (keyspace, entries) in &intent.keyspaces {
            ingest(keyspace, entries)?;
        }
        self.clear();
        Ok(Some(intent.applied))
    }

    /// Empties the intent file durably: before a snapshot install replaces fjall's state (and its
    /// applied seqno) with one an intent left behind could be ahead of.
    pub fn discard(&self) -> Result<(), Error> {
        match OpenOptions::new().write(true).open(&self.path) {
            Ok(file) => {
                file.set_len(0).and_then(|()| file.sync_all()).map_err(|source| intent_io(&self.path, source))
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(intent_io(&self.path, source)),
        }
    }

    /// Empties the intent file. Not fsynced: an intent left behind is at or below fjall's applied
    /// seqno from now on, and ignored.
    fn clear(&self) {
        if let Err(error) = OpenOptions::new().write(true).open(&self.path).and_then(|file| file.set_len(0)) {
            tracing::warn!(path = %self.path.display(), %error, "could not empty the flush intent (harmless)");
        }
    }
}

fn ingest(keyspace: &Keyspace, entries: &[Entry]) -> Result<(), Error> {
    if entries.is_empty() {
        // An ingestion creates its first table file at once, and one that ends empty leaves it.
        return Ok(());
    }
    let mut ingestion = keyspace.start_ingestion()?;
    for (key, value) in entries {
        match value {
            Some(value) => ingestion.write(key.clone(), value.clone())?,
            None => ingestion.write_tombstone(key.clone())?,
        }
    }
    ingestion.finish()?;
    Ok(())
}

fn intent_io(path: &Path, source: std::io::Error) -> Error {
    Error::Intent { path: path.display().to_string(), source }
}

/// Writes the intent: magic, applied seqno, keyspaces (name, entries), then a BLAKE3 of all of it;
/// fsynced before it returns. The file exists from the first flush on, so its directory entry is
/// durable after that flush's fsync of the directory.
fn write_intent(path: &Path, applied: Seqno, keyspaces: &[(Keyspace, Vec<Entry>)]) -> Result<(), Error> {
    let io = |source| intent_io(path, source);
    let created = !path.exists();
    let file = File::create(path).map_err(io)?;
    let mut out =
        HashingWriter { inner: BufWriter::with_capacity(1 << 20, &file), hasher: blake3::Hasher::new() };
    encode_intent(&mut out, applied, keyspaces).map_err(io)?;
    let hash = *out.hasher.finalize().as_bytes();
    out.inner.write_all(&hash).map_err(io)?;
    out.inner.flush().map_err(io)?;
    drop(out);
    file.sync_data().map_err(io)?;
    if created {
        if let Some(dir) = path.parent() {
            File::open(dir).and_then(|dir| dir.sync_all()).map_err(io)?;
        }
    }
    Ok(())
}

fn encode_intent(
    out: &mut impl Write,
    applied: Seqno,
    keyspaces: &[(Keyspace, Vec<Entry>)],
) -> std::io::Result<()> {
    out.write_all(&MAGIC)?;
    out.write_all(&applied.0.to_le_bytes())?;
    out.write_all(&u32_len(keyspaces.len()).to_le_bytes())?;
    for (keyspace, entries) in keyspaces {
        let name = keyspace.name().as_bytes();
        out.write_all(&u32_len(name.len()).to_le_bytes())?;
        out.write_all(name)?;
        out.write_all(&(entries.len() as u64).to_le_bytes())?;
        for (key, value) in entries {
            out.write_all(&u32_len(key.len()).to_le_bytes())?;
            out.write_all(key)?;
            match value {
                Some(value) => {
                    out.write_all(&[1])?;
                    out.write_all(&u32_len(value.len()).to_le_bytes())?;
                    out.write_all(value)?;
                }
                None => out.write_all(&[0])?,
            }
        }
    }
    Ok(())
}

fn u32_len(len: usize) -> u32 {
    u32::try_from(len).expect("fjall keys, values and names fit in u32 lengths")
}

/// A decoded intent.
struct Intent {
    applied: Seqno,
    keyspaces: Vec<(Keyspace, Vec<Entry>)>,
}

/// Decodes an intent file, checking its hash first. Any error means the file was cut short.
fn decode_intent(bytes: &[u8], stores: &Stores) -> Result<Intent, Error> {
    if bytes.len() < MAGIC.len() + 8 + 4 + 32 {
        return Err(bad(format!("{} bytes is shorter than an empty intent", bytes.len())));
    }
    let (body, hash) = bytes.split_at(bytes.len() - 32);
    if blake3::hash(body).as_bytes() != hash {
        return Err(bad("its checksum does not match"));
    }
    let mut reader = Cursor { bytes: body, at: 0 };
    if reader.take(MAGIC.len())? != MAGIC {
        return Err(bad("bad magic"));
    }
    let applied = Seqno(reader.u64()?);
    let count = reader.u32()? as usize;
    let mut keyspaces = Vec::new();
    for _ in 0..count {
        let name_len = reader.u32()? as usize;
        let name =
            std::str::from_utf8(reader.take(name_len)?).map_err(|_| bad("a keyspace name is not UTF-8"))?;
        let keyspace = stores.by_name(name).ok_or_else(|| bad(format!("unknown keyspace {name:?}")))?.clone();
        let entries_len = reader.u64()?;
        let mut entries = Vec::new();
        for _ in 0..entries_len {
            let key_len = reader.u32()? as usize;
            let key = Slice::from(reader.take(key_len)?);
            let value = match reader.take(1)?[0] {
                0 => None,
                1 => {
                    let value_len = reader.u32()? as usize;
                    Some(Slice::from(reader.take(value_len)?))
                }
                other => return Err(bad(format!("entry tag {other}"))),
            };
            entries.push((key, value));
        }
        if !entries.windows(2).all(|pair| pair[0].0 < pair[1].0) {
            return Err(bad(format!("keys of {name} do not ascend")));
        }
        keyspaces.push((keyspace, entries));
    }
    if reader.at != body.len() {
        return Err(bad(format!("{} bytes after the last keyspace", body.len() - reader.at)));
    }
    if keyspaces.last().is_none_or(|(keyspace, _)| *keyspace != stores.meta) {
        return Err(bad("meta is not the last keyspace"));
    }
    Ok(Intent { applied, keyspaces })
}

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, len: usize) -> Result<&'a [u8], Error> {
        let end = self.at.checked_add(len).filter(|end| *end <= self.bytes.len());
        let end =
            end.ok_or_else(|| bad(format!("{len} bytes wanted at {} of {}", self.at, self.bytes.len())))?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn u32(&mut self) -> Result<u32, Error> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Result<u64, Error> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
}

fn bad(reason: impl Into<String>) -> Error {
    Error::IntentCorrupt { reason: reason.into() }
}

struct HashingWriter<W> {
    inner: W,
    hasher: blake3::Hasher,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let written = self.inner.write(buf)?;
        self.hasher.update(&buf[..written]);
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stores() -> (tempfile::TempDir, Stores) {
        let dir = tempfile::tempdir().unwrap();
        let stores = Stores::open(dir.path()).unwrap();
        (dir, stores)
    }

    fn sample(stores: &Stores) -> FlushWrites {
        let mut writes = FlushWrites::default();
        writes.insert(&stores.meta, keys::META_APPLIED_SEQNO, 7u64.to_le_bytes());
        writes.insert(&stores.items, *b"b", *b"first");
        writes.insert(&stores.items, *b"a", *b"one");
        writes.remove(&stores.items, *b"c");
        writes.insert(&stores.items, *b"b", *b"second");
        writes.insert(&stores.local, *b"k", *b"v");
        writes
    }

    fn encoded(stores: &Stores, writes: FlushWrites) -> Vec<u8> {
        let keyspaces = writes.into_sorted(stores);
        let mut out = HashingWriter { inner: Vec::new(), hasher: blake3::Hasher::new() };
        encode_intent(&mut out, Seqno(7), &keyspaces).unwrap();
        let hash = *out.hasher.finalize().as_bytes();
        let mut bytes = out.inner;
        bytes.extend_from_slice(&hash);
        bytes
    }

    fn rehashed(mut body: Vec<u8>) -> Vec<u8> {
        let hash = *blake3::hash(&body).as_bytes();
        body.extend_from_slice(&hash);
        body
    }

    #[test]
    fn writes_sort_per_keyspace_keep_the_last_write_of_a_key_and_put_meta_last() {
        let (_dir, stores) = stores();
        let sorted = sample(&stores).into_sorted(&stores);
        let names: Vec<&str> = sorted.iter().map(|(keyspace, _)| &**keyspace.name()).collect();
        assert_eq!(names, ["items", "local", "meta"]);
        let items: Vec<(&[u8], Option<&[u8]>)> =
            sorted[0].1.iter().map(|(key, value)| (&key[..], value.as_deref())).collect();
        assert_eq!(items, [(&b"a"[..], Some(&b"one"[..])), (b"b", Some(b"second")), (b"c", None)]);
    }

    #[test]
    fn a_flush_under_the_threshold_is_one_batch_and_one_at_it_is_ingested() {
        let (dir, stores) = stores();
        let path = dir.path().join(INTENT_FILE);
        let bytes = sample(&stores).bytes;
        let batched = FlushIngest::new(dir.path(), bytes + 1);
        assert!(batched.commit(&stores, sample(&stores), Seqno(7), || unreachable!()).unwrap());
        assert!(!path.exists(), "a batch writes no intent");
        assert!(stores.items.approximate_len() > 0 && stores.items.table_count() == 0, "in the memtable");
        let ingested = FlushIngest::new(dir.path(), bytes);
        let mut reached_marker = false;
        assert!(ingested
            .commit(&stores, sample(&stores), Seqno(7), || {
                reached_marker = true;
                true
            })
            .unwrap());
        assert!(reached_marker && path.exists(), "an ingestion goes through its intent");
        assert_eq!(
            stores.items.table_count(),
            2,
            "the memtable written as a table first, then the ingested one"
        );
        assert_eq!(&*stores.items.get(b"b").unwrap().unwrap(), b"second");
    }

    #[test]
    fn an_intent_decodes_to_what_was_encoded() {
        let (_dir, stores) = stores();
        let bytes = encoded(&stores, sample(&stores));
        let intent = decode_intent(&bytes, &stores).unwrap();
        assert_eq!(intent.applied, Seqno(7));
        let expected = sample(&stores).into_sorted(&stores);
        assert_eq!(intent.keyspaces.len(), expected.len());
        for ((keyspace, entries), (want_keyspace, want_entries)) in intent.keyspaces.iter().zip(&expected) {
            assert_eq!(keyspace.name(), want_keyspace.name());
            assert_eq!(entries, want_entries);
        }
    }

    #[test]
    fn every_truncation_and_every_flipped_byte_is_refused() {
        let (_dir, stores) = stores();
        let bytes = encoded(&stores, sample(&stores));
        for len in 0..bytes.len() {
            assert!(decode_intent(&bytes[..len], &stores).is_err(), "a cut at {len} of {}", bytes.len());
        }
        for at in 0..bytes.len() {
            let mut flipped = bytes.clone();
            flipped[at] ^= 0x40;
            assert!(decode_intent(&flipped, &stores).is_err(), "a flipped byte at {at}");
        }
    }

    #[test]
    fn a_well_hashed_intent_of_the_wrong_shape_is_refused_with_the_reason() {
        let (_dir, stores) = stores();
        let body = |bytes: Vec<u8>| bytes[..bytes.len() - 32].to_vec();
        let good = body(encoded(&stores, sample(&stores)));
        let mut magic = good.clone();
        magic[0] = b'X';
        let mut oversize = good.clone();
        // The first keyspace's name length, past the magic, the seqno and the keyspace count.
        oversize[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        let mut trailing = good.clone();
        trailing.push(0);
        let mut unknown = good.clone();
        unknown[24..29].copy_from_slice(b"itemz");
        let garbage: Vec<u8> = (0..200u32).map(|i| (i * 37 % 251) as u8).collect();
        for (case, bytes, reason) in [
            ("magic", magic, "bad magic"),
            ("oversize", oversize, "bytes wanted"),
            ("trailing", trailing, "after the last keyspace"),
            ("unknown", unknown, "unknown keyspace"),
            ("garbage", garbage, "bad magic"),
        ] {
            let error =
                decode_intent(&rehashed(bytes), &stores).err().unwrap_or_else(|| panic!("{case} decoded"));
            assert!(error.to_string().contains(reason), "{case}: {error}");
        }
    }

    #[test]
    fn an_open_finishes_a_flush_cut_before_its_marker_and_ignores_a_stale_or_torn_intent() {
        let (dir, stores) = stores();
        let ingest = FlushIngest::new(dir.path(), 0);
        let finished = ingest.commit(&stores, sample(&stores), Seqno(7), || false).unwrap();
        assert!(!finished, "stopped before the marker");
        assert_eq!(&*stores.items.get(b"b").unwrap().unwrap(), b"second");
        assert!(stores.meta.get(keys::META_APPLIED_SEQNO).unwrap().is_none(), "no marker yet");
        assert_eq!(ingest.recover(&stores).unwrap(), Some(Seqno(7)));
        assert_eq!(&*stores.meta.get(keys::META_APPLIED_SEQNO).unwrap().unwrap(), 7u64.to_le_bytes());
        assert_eq!(std::fs::metadata(dir.path().join(INTENT_FILE)).unwrap().len(), 0, "emptied");
        assert_eq!(ingest.recover(&stores).unwrap(), None, "nothing left to finish");

        // A stale intent (its seqno already in fjall) changes nothing.
        let mut stale = FlushWrites::default();
        stale.insert(&stores.items, *b"b", *b"stale");
        stale.insert(&stores.meta, keys::META_APPLIED_SEQNO, 7u64.to_le_bytes());
        write_intent(&dir.path().join(INTENT_FILE), Seqno(7), &stale.into_sorted(&stores)).unwrap();
        assert_eq!(ingest.recover(&stores).unwrap(), None);
        assert_eq!(&*stores.items.get(b"b").unwrap().unwrap(), b"second");

        // A torn intent (a crash while it was written) is discarded.
        let path = dir.path().join(INTENT_FILE);
        let mut later = FlushWrites::default();
        later.insert(&stores.items, *b"b", *b"later");
        later.insert(&stores.meta, keys::META_APPLIED_SEQNO, 9u64.to_le_bytes());
        write_intent(&path, Seqno(9), &later.into_sorted(&stores)).unwrap();
        let len = std::fs::metadata(&path).unwrap().len();
        OpenOptions::new().write(true).open(&path).unwrap().set_len(len - 1).unwrap();
        assert_eq!(ingest.recover(&stores).unwrap(), None);
        assert_eq!(&*stores.items.get(b"b").unwrap().unwrap(), b"second");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
    }
}
