//! The replicated idempotency table: (principal, key) → [`IdempotencyRecord`], folded from batch
//! envelopes and pruned deterministically during apply.
//!
//! ```text
//! idempotency keyspace (one concern, four kinds of keys, tagged by their first byte):
//!   'r' | u16 BE len | principal | key                   → IdempotencyRecord (56 bytes LE)
//!   't' | time u64 BE | u16 BE len | principal | key      → (empty)   all keys by logged time
//!   'p' | u16 BE len | principal | time u64 BE | key      → (empty)   one principal's keys by time
//!   'c' | u16 BE len | principal                          → count u64 LE
//! ```
//!
//! Delicate:
//! - Everything here is log-derived and part of the digest, so pruning is a pure function of the
//!   committed state and the batch: "now" is the batch's logged time, the order is key order, and
//!   the work per apply is bounded by [`PRUNE_PER_APPLY_MAX`]. The window and the per-principal bound
//!   are configuration that every node must share.
//! - The fold reads the applied state (the write-back overlay over fjall, [`Table`]) while its own
//!   writes sit in a list the caller merges into the overlay afterwards: the one new key of the batch
//!   is skipped by the pruning scans, so a batch never deletes what it writes.
//! - A lookup treats an entry older than the window as absent even before it is pruned.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::iter::Peekable;

use fjall::Keyspace;
use tidal_types::Seqno;

use crate::error::Error;

/// Most expired or over-bound entries removed per apply: each apply adds at most one key, so a
/// handful per apply catches up after any burst while keeping every apply's work bounded.
pub const PRUNE_PER_APPLY_MAX: usize = 16;

const TAG_RECORD: u8 = b'r';
const TAG_TIME: u8 = b't';
const TAG_PRINCIPAL: u8 = b'p';
const TAG_COUNT: u8 = b'c';
const RECORD_LEN: usize = 8 + 8 + 32 + 8;
const KEYSPACE: &str = "idempotency";

/// What the log remembers of a write that carried an Idempotency-Key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdempotencyRecord {
    /// Last seqno the write consumed (what the write returned).
    pub last_seqno: Seqno,
    /// First seqno of the write.
    pub first_seqno: Seqno,
    /// [`crate::records_fingerprint`] of the write's payload.
    pub fingerprint: [u8; 32],
    /// Logged time of the write.
    pub time_ms: u64,
}

impl IdempotencyRecord {
    fn encode(&self) -> [u8; RECORD_LEN] {
        let mut out = [0u8; RECORD_LEN];
        out[0..8].copy_from_slice(&self.last_seqno.0.to_le_bytes());
        out[8..16].copy_from_slice(&self.first_seqno.0.to_le_bytes());
        out[16..48].copy_from_slice(&self.fingerprint);
        out[48..56].copy_from_slice(&self.time_ms.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Result<IdempotencyRecord, Error> {
        let corrupt =
            || Error::Corrupt { keyspace: KEYSPACE, reason: format!("record of {} bytes", bytes.len()) };
        if bytes.len() != RECORD_LEN {
            return Err(corrupt());
        }
        let u64_at = |at: usize| bytes[at..at + 8].try_into().map(u64::from_le_bytes).map_err(|_| corrupt());
        let mut fingerprint = [0u8; 32];
        fingerprint.copy_from_slice(&bytes[16..48]);
        Ok(IdempotencyRecord {
            last_seqno: Seqno(u64_at(0)?),
            first_seqno: Seqno(u64_at(8)?),
            fingerprint,
            time_ms: u64_at(48)?,
        })
    }
}

/// The key a batch records: `(principal, idempotency key, record)`.
pub struct NewKey<'a> {
    /// Principal of the envelope.
    pub principal: &'a str,
    /// Idempotency key of the envelope (non-empty).
    pub key: &'a str,
    /// What to remember.
    pub record: IdempotencyRecord,
}

/// Bounds of the table.
#[derive(Clone, Copy)]
pub struct Window {
    /// Logged ms an entry lives.
    pub window_ms: u64,
    /// Entries kept per principal.
    pub keys_max: usize,
}

/// Changes to the table, in order: `(key, Some(value))` puts, `(key, None)` deletes.
pub type Writes = Vec<(Vec<u8>, Option<Vec<u8>>)>;

/// The applied table: the active overlay's entries (`None` = deleted) over the frozen overlay's
/// (a flush in flight) over fjall's.
#[derive(Clone, Copy)]
pub struct Table<'a> {
    /// The idempotency keyspace.
    pub keyspace: &'a Keyspace,
    /// Entries changed since the last freeze.
    pub active: &'a Overlay,
    /// Entries of the flush in flight, if any.
    pub frozen: Option<&'a Overlay>,
}

/// One overlay's idempotency entries by fjall key; `None` is a delete.
pub type Overlay = BTreeMap<Vec<u8>, Option<Vec<u8>>>;

/// Stands in for the frozen overlay when no flush is in flight.
static NO_ENTRIES: Overlay = BTreeMap::new();

impl<'a> Table<'a> {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        match self.active.get(key).or_else(|| self.frozen.and_then(|frozen| frozen.get(key))) {
            Some(value) => Ok(value.clone()),
            None => Ok(self.keyspace.get(key)?.map(|value| value.to_vec())),
        }
    }

    /// Entries under `prefix` in key order: the active overlay's win over the frozen one's, which
    /// win over fjall's.
    fn prefix(&self, prefix: &'a [u8]) -> impl Iterator<Item = Result<(Vec<u8>, Vec<u8>), Error>> + 'a {
        let fjall = self.keyspace.prefix(prefix).map(|guard| {
            let (key, value) = guard.into_inner()?;
            Ok((key.to_vec(), value.to_vec()))
        });
        let under = move |overlay: &'a Overlay| {
            overlay.range(prefix.to_vec()..).take_while(move |(key, _)| key.starts_with(prefix))
        };
        let frozen =
            Merged { fjall: fjall.peekable(), overlay: under(self.frozen.unwrap_or(&NO_ENTRIES)).peekable() };
        Merged { fjall: frozen.peekable(), overlay: under(self.active).peekable() }
    }
}

/// Merge of two key-ordered streams; on equal keys the overlay wins, and its deletes hide entries.
/// `fjall` may itself be a merge (the frozen overlay over fjall).
struct Merged<F: Iterator, O: Iterator> {
    fjall: Peekable<F>,
    overlay: Peekable<O>,
}

impl<'a, F, O> Iterator for Merged<F, O>
where
    F: Iterator<Item = Result<(Vec<u8>, Vec<u8>), Error>>,
    O: Iterator<Item = (&'a Vec<u8>, &'a Option<Vec<u8>>)>,
{
    type Item = Result<(Vec<u8>, Vec<u8>), Error>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            // How the overlay's next key compares with fjall's (an error counts as fjall's turn).
            let overlay_vs_fjall = match (self.fjall.peek(), self.overlay.peek()) {
                (None, None) => return None,
                (Some(Err(_)), _) | (Some(Ok(_)), None) => Ordering::Greater,
                (None, Some(_)) => Ordering::Less,
                (Some(Ok((fjall_key, _))), Some((overlay_key, _))) => overlay_key.as_slice().cmp(fjall_key),
            };
            match overlay_vs_fjall {
                Ordering::Greater => return self.fjall.next(),
                // The overlay's entry replaces fjall's.
                Ordering::Equal => drop(self.fjall.next()),
                Ordering::Less => {}
            }
            let (key, value) = self.overlay.next().expect("peeked an overlay entry");
            if let Some(value) = value {
                return Some(Ok((key.clone(), value.clone())));
            }
        }
    }
}

/// The entry for `(principal, key)`, unless absent or older than the window at `now_ms`.
pub fn lookup(
    table: Table<'_>,
    principal: &str,
    key: &str,
    now_ms: u64,
    window: Window,
) -> Result<Option<IdempotencyRecord>, Error> {
    let Some(bytes) = table.get(&record_key(principal.as_bytes(), key.as_bytes()))? else {
        return Ok(None);
    };
    let record = IdempotencyRecord::decode(&bytes)?;
    Ok((!expired(record.time_ms, now_ms, window)).then_some(record))
}

/// Folds one batch into the table: records `new` (if any), then prunes what expired at `now_ms` and
/// what is over the bound of `new`'s principal. Changes go to `writes`; the table is unchanged.
///
/// `oldest_ms` is a lower bound on the time of every entry (`None`: unknown; `u64::MAX`: the
/// table is empty): while nothing can have expired, the expiry scan, a fjall iterator per apply,
/// is skipped, which removes nothing the scan would have removed. Returns the bound after this
/// batch, for the caller to keep once the batch is merged.
pub fn fold(
    table: Table<'_>,
    writes: &mut Writes,
    new: Option<&NewKey<'_>>,
    now_ms: u64,
    window: Window,
    oldest_ms: Option<u64>,
) -> Result<Option<u64>, Error> {
    let mut deltas: BTreeMap<Vec<u8>, i64> = BTreeMap::new();
    let mut removed: BTreeSet<(Vec<u8>, Vec<u8>)> = BTreeSet::new();
    let new_id = new.map(|n| (n.principal.as_bytes().to_vec(), n.key.as_bytes().to_vec()));
    if let Some(new) = new {
        record_new(table, writes, new, &mut deltas)?;
    }
    let mut next_oldest_ms = oldest_ms;
    if !matches!(oldest_ms, Some(oldest) if !expired(oldest, now_ms, window)) {
        next_oldest_ms =
            prune_expired(table, writes, new_id.as_ref(), now_ms, window, &mut deltas, &mut removed)?;
    }
    if let Some((principal, new_key)) = &new_id {
        prune_over_bound(table, writes, principal, new_key, window, &mut deltas, &mut removed)?;
    }
    for (principal, delta) in deltas {
        let count = committed_count(table, &principal)? as i64 + delta;
        if count > 0 {
            writes.push((count_key(&principal), Some((count as u64).to_le_bytes().to_vec())));
        } else {
            writes.push((count_key(&principal), None));
        }
    }
    // Removals only raise the oldest time; the new key may lower it.
    Ok(match (next_oldest_ms, new) {
        (Some(oldest), Some(new)) => Some(oldest.min(new.record.time_ms)),
        (oldest, _) => oldest,
    })
}

/// Removes up to [`PRUNE_PER_APPLY_MAX`] expired entries, oldest first. Returns a lower bound on
/// the time of the entries left (`u64::MAX` if none), or `None` if the bound was reached first.
fn prune_expired(
    table: Table<'_>,
    writes: &mut Writes,
    new_id: Option<&(Vec<u8>, Vec<u8>)>,
    now_ms: u64,
    window: Window,
    deltas: &mut BTreeMap<Vec<u8>, i64>,
    removed: &mut BTreeSet<(Vec<u8>, Vec<u8>)>,
) -> Result<Option<u64>, Error> {
    let mut scanned = 0;
    for entry in table.prefix(&[TAG_TIME]).take(PRUNE_PER_APPLY_MAX) {
        scanned += 1;
        let (key, _) = entry?;
        let (time_ms, principal, idem_key) = parse_time_key(&key)?;
        if !expired(time_ms, now_ms, window) {
            return Ok(Some(time_ms));
        }
        let id = (principal.to_vec(), idem_key.to_vec());
        // The new key's old entry is replaced by `record_new`.
        if Some(&id) == new_id {
            continue;
        }
        remove_entry(writes, time_ms, &id.0, &id.1);
        *deltas.entry(id.0.clone()).or_default() -= 1;
        removed.insert(id);
    }
    Ok((scanned < PRUNE_PER_APPLY_MAX).then_some(u64::MAX))
}

fn record_new(
    table: Table<'_>,
    writes: &mut Writes,
    new: &NewKey<'_>,
    deltas: &mut BTreeMap<Vec<u8>, i64>,
) -> Result<(), Error> {
    let (principal, key) = (new.principal.as_bytes(), new.key.as_bytes());
    let record_key = record_key(principal, key);
    match table.get(&record_key)? {
        // A reused key (the leader found the old one expired): replace it, the count is unchanged.
        Some(old) => {
            let old = IdempotencyRecord::decode(&old)?;
            writes.push((time_key(old.time_ms, principal, key), None));
            writes.push((principal_time_key(principal, old.time_ms, key), None));
        }
        None => *deltas.entry(principal.to_vec()).or_default() += 1,
    }
    writes.push((record_key, Some(new.record.encode().to_vec())));
    writes.push((time_key(new.record.time_ms, principal, key), Some(Vec::new())));
    writes.push((principal_time_key(principal, new.record.time_ms, key), Some(Vec::new())));
    Ok(())
}

fn prune_over_bound(
    table: Table<'_>,
    writes: &mut Writes,
    principal: &[u8],
    new_key: &[u8],
    window: Window,
    deltas: &mut BTreeMap<Vec<u8>, i64>,
    removed: &mut BTreeSet<(Vec<u8>, Vec<u8>)>,
) -> Result<(), Error> {
    let delta = deltas.get(principal).copied().unwrap_or(0);
    let mut count = committed_count(table, principal)? as i64 + delta;
    let limit = i64::try_from(window.keys_max).unwrap_or(i64::MAX);
    if count <= limit {
        return Ok(());
    }
    let prefix = principal_prefix(TAG_PRINCIPAL, principal);
    for entry in table.prefix(&prefix).take(PRUNE_PER_APPLY_MAX) {
        if count <= limit {
            break;
        }
        let (key, _) = entry?;
        let (time_ms, idem_key) = parse_principal_time_key(&key, prefix.len())?;
        let id = (principal.to_vec(), idem_key.to_vec());
        if idem_key == new_key || removed.contains(&id) {
            continue;
        }
        remove_entry(writes, time_ms, principal, idem_key);
        *deltas.entry(principal.to_vec()).or_default() -= 1;
        count -= 1;
        removed.insert(id);
    }
    Ok(())
}

fn expired(time_ms: u64, now_ms: u64, window: Window) -> bool {
    time_ms < now_ms.saturating_sub(window.window_ms)
}

fn remove_entry(writes: &mut Writes, time_ms: u64, principal: &[u8], key: &[u8]) {
    writes.push((record_key(principal, key), None));
    writes.push((time_key(time_ms, principal, key), None));
    writes.push((principal_time_key(principal, time_ms, key), None));
}

fn committed_count(table: Table<'_>, principal: &[u8]) -> Result<u64, Error> {
    match table.get(&count_key(principal))? {
        None => Ok(0),
        Some(bytes) => crate::keys::u64_value(&bytes)
            .ok_or_else(|| Error::Corrupt { keyspace: KEYSPACE, reason: "count is not a u64".into() }),
    }
}

fn principal_prefix(tag: u8, principal: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(3 + principal.len() + 8 + 16);
    out.push(tag);
    // The codec bounds principals to u16::MAX bytes.
    out.extend_from_slice(&u16::try_from(principal.len()).unwrap_or(u16::MAX).to_be_bytes());
    out.extend_from_slice(principal);
    out
}

fn record_key(principal: &[u8], key: &[u8]) -> Vec<u8> {
    let mut out = principal_prefix(TAG_RECORD, principal);
    out.extend_from_slice(key);
    out
}

fn count_key(principal: &[u8]) -> Vec<u8> {
    principal_prefix(TAG_COUNT, principal)
}

fn time_key(time_ms: u64, principal: &[u8], key: &[u8]) -> Vec<u8> {
    let mut out = vec![TAG_TIME];
    out.extend_from_slice(&time_ms.to_be_bytes());
    out.extend_from_slice(&principal_prefix(0, principal)[1..]);
    out.extend_from_slice(key);
    out
}

fn principal_time_key(principal: &[u8], time_ms: u64, key: &[u8]) -> Vec<u8> {
    let mut out = principal_prefix(TAG_PRINCIPAL, principal);
    out.extend_from_slice(&time_ms.to_be_bytes());
    out.extend_from_slice(key);
    out
}

fn bad_key() -> Error {
    Error::Corrupt { keyspace: KEYSPACE, reason: "malformed index key".into() }
}

/// `(time, principal, key)` of a 't' key.
fn parse_time_key(key: &[u8]) -> Result<(u64, &[u8], &[u8]), Error> {
    let time_ms = u64::from_be_bytes(key.get(1..9).ok_or_else(bad_key)?.try_into().map_err(|_| bad_key())?);
    let len = u16::from_be_bytes(key.get(9..11).ok_or_else(bad_key)?.try_into().map_err(|_| bad_key())?);
    let end = 11 + usize::from(len);
    let principal = key.get(11..end).ok_or_else(bad_key)?;
    Ok((time_ms, principal, &key[end..]))
}

/// `(time, key)` of a 'p' key whose principal prefix is `prefix_len` bytes.
fn parse_principal_time_key(key: &[u8], prefix_len: usize) -> Result<(u64, &[u8]), Error> {
    let time = key.get(prefix_len..prefix_len + 8).ok_or_else(bad_key)?;
    let time_ms = u64::from_be_bytes(time.try_into().map_err(|_| bad_key())?);
    Ok((time_ms, &key[prefix_len + 8..]))
}
