//! State digests: BLAKE3 over the canonical log-derived state, and over the hard negatives.
//!
//! Delicate: the digest is how tests and operators prove two replicas identical, so it must cover
//! every log-derived keyspace ([`Stores::log_derived`]) and nothing node-local. It reads one fjall
//! snapshot taken right after a flush of the write-back overlay, so it covers the whole applied
//! state and is consistent with the applied seqno it reports even while applies run. The
//! encoding is unambiguous: every name, key and value is length-prefixed, every keyspace ends
//! with its entry count.

use fjall::Readable;
use tidal_types::Seqno;

use crate::error::Error;
use crate::keys;
use crate::seen;
use crate::stores::Stores;
use crate::trend_blocks::{self, Logical};

/// `(applied seqno, digest)` of the log-derived state in `snapshot`.
pub fn state_digest(stores: &Stores, snapshot: &fjall::Snapshot) -> Result<(Seqno, [u8; 32]), Error> {
    let mut hasher = StateHasher::default();
    for (name, keyspace) in stores.log_derived() {
        hasher.keyspace(name);
        for_each_entry(stores, snapshot, name, keyspace, |key, value| {
            hasher.entry(key, value);
            Ok::<(), Error>(())
        })?;
        hasher.end_keyspace();
    }
    let applied = match snapshot.get(&stores.meta, keys::META_APPLIED_SEQNO)? {
        None => 0,
        Some(bytes) => keys::u64_value(&bytes).ok_or_else(|| Error::Corrupt {
            keyspace: "meta",
            reason: "applied seqno is not a u64".into(),
        })?,
    };
    Ok((Seqno(applied), hasher.finish(Seqno(applied))))
}

/// Feeds the entries of the log-derived keyspace `name` in `snapshot` to `emit` as the digest and a
/// snapshot see them, in key order: the stored entries, but the seen set's logical pairs
/// ([`seen::for_each_logical`]), whatever layout holds them, the trending scores and counters of
/// the trend blocks as the old layout stored them ([`trend_blocks::for_each_logical`]), and no
/// stream event at or below its
/// stream's horizon (a flush deletes them just after its commit: a fjall snapshot taken in between
/// still holds them).
pub fn for_each_entry<E: From<Error>>(
    stores: &Stores,
    snapshot: &fjall::Snapshot,
    name: &str,
    keyspace: &fjall::Keyspace,
    mut emit: impl FnMut(&[u8], &[u8]) -> Result<(), E>,
) -> Result<(), E> {
    let raw = snapshot.iter(keyspace).map(|guard| guard.into_inner());
    match name {
        "seen" => return seen::for_each_logical(raw, emit),
        "trending" => return trend_blocks::for_each_logical(raw, Logical::Trending, emit),
        "counters" => return trend_blocks::for_each_logical(raw, Logical::Counters, emit),
        _ => {}
    }
    let horizons = match name {
        "stream_events" => Some(crate::streams::Horizons::of(stores, snapshot)?),
        _ => None,
    };
    for entry in raw {
        let (key, value) = entry.map_err(Error::from)?;
        if horizons.as_ref().is_none_or(|horizons| horizons.keeps(&key)) {
            emit(&key, &value)?;
        }
    }
    Ok(())
}

/// The state digest's encoding, fed one keyspace at a time in [`Stores::log_derived`] order. Shared
/// by [`state_digest`] and the snapshot codec, so a snapshot's records can be checked against the
/// digest its exporter computed without writing them anywhere.
#[derive(Default)]
pub struct StateHasher {
    hasher: blake3::Hasher,
    count: u64,
}

impl StateHasher {
    /// Starts a keyspace.
    pub fn keyspace(&mut self, name: &str) {
        put(&mut self.hasher, name.as_bytes());
        self.count = 0;
    }

    /// One entry of the current keyspace, in key order.
    pub fn entry(&mut self, key: &[u8], value: &[u8]) {
        put(&mut self.hasher, key);
        put(&mut self.hasher, value);
        self.count += 1;
    }

    /// Ends the current keyspace.
    pub fn end_keyspace(&mut self) {
        self.hasher.update(&self.count.to_le_bytes());
    }

    /// The digest, given the applied seqno the state is at.
    pub fn finish(mut self, applied: Seqno) -> [u8; 32] {
        self.hasher.update(&applied.0.to_le_bytes());
        *self.hasher.finalize().as_bytes()
    }
}

/// Digest of every user's hard negatives state (stored in canonical form).
pub fn negatives_digest(stores: &Stores) -> Result<[u8; 32], Error> {
    let snapshot = stores.database.snapshot();
    let mut hasher = blake3::Hasher::new();
    let mut count = 0u64;
    for guard in snapshot.iter(&stores.negatives) {
        let (key, value) = guard.into_inner()?;
        put(&mut hasher, &key);
        put(&mut hasher, &value);
        count += 1;
    }
    hasher.update(&count.to_le_bytes());
    Ok(*hasher.finalize().as_bytes())
}

fn put(hasher: &mut blake3::Hasher, bytes: &[u8]) {
    hasher.update(&(bytes.len() as u64).to_le_bytes());
    hasher.update(bytes);
}
