//! Key and value layouts of the engine's fjall keyspaces.
//!
//! ```text
//! keyspace     key                                   value
//! meta         name (ASCII)                          u64 / u32 LE
//! items        item u64 BE                           seqno u64 LE | metadata JSON
//! embeddings   item u64 BE                           seqno u64 LE | f32 x dimension LE
//! trend_blocks item / 16, u64 BE                      per item: offset, trend, counters (trend_blocks.rs)
//! trending     item u64 BE                           score f64 LE | ref_ms i64 LE    (layout 1; the digest's view)
//! counters     item u64 BE | kind name               count u64 LE                    (layout 1; the digest's view)
//! profiles     user                                  ref_ms i64 LE | f32 x dimension LE
//! seen         u16 BE len | user | item u64 BE       (empty)
//! idempotency  see idempotency.rs
//! negatives    user                                  NegativesState bytes
//! ```
//!
//! Delicate: integers in keys are big-endian so fjall's byte order is numeric order; variable-length
//! parts that are followed by more key bytes carry a length prefix so one user's prefix never matches
//! another's ("ab" vs "abc"). These layouts are on disk: changing one needs a format version bump.

use tidal_types::Seqno;

/// meta key: applied frontier (u64 LE).
pub const META_APPLIED_SEQNO: &[u8] = b"applied_seqno";
/// meta key: logged time of the last applied batch (u64 LE).
pub const META_LAST_TIME_MS: &[u8] = b"last_time_ms";
/// meta key: the database's embedding dimension (u32 LE), written on first open.
pub const META_DIMENSION: &[u8] = b"dimension";
/// meta key: the last LeaderStart folded: term u64 | leader u64 | baseline u64, LE.
pub const META_LEADER_START: &[u8] = b"leader_start";
/// meta key: the approximate feed index's centroids (`ann_index::encode_centroids`), log-derived:
/// chosen once by an apply, then carried by snapshots and covered by the digest (decisions/067).
pub const META_ANN_CENTROIDS: &[u8] = b"ann_centroids";

/// local key: `applied seqno u64 | items u64 | users u64`, LE: how many items have metadata and how
/// many users a profile at that applied seqno. Written with every flush, so an open need not count
/// them; an open uses it only if its seqno is fjall's applied seqno (decisions/048).
pub const LOCAL_COUNTS: &[u8] = b"counts";

/// local key: the engine's on-disk layout (u32 LE; no key: layout 1). An open refuses a layout it
/// does not know and migrates an older one (decisions/070).
pub const LOCAL_LAYOUT: &[u8] = b"layout";

/// local key: the last item id a layout migration moved into blocks (u64 LE), written with each of
/// its batches so that a migration a crash cut short goes on after it (decisions/070).
pub const LOCAL_MIGRATED_THROUGH: &[u8] = b"migrated_through";

/// local key: the data dir's identity (which node of which cluster this state belongs to), as the
/// server writes it (decisions/063). Node-local: never in the digest or a snapshot.
pub const LOCAL_IDENTITY: &[u8] = b"identity";

/// The [`LOCAL_COUNTS`] value.
pub fn counts_value(applied: Seqno, items: u64, users: u64) -> [u8; 24] {
    let mut value = [0u8; 24];
    value[..8].copy_from_slice(&applied.0.to_le_bytes());
    value[8..16].copy_from_slice(&items.to_le_bytes());
    value[16..].copy_from_slice(&users.to_le_bytes());
    value
}

/// Splits a [`LOCAL_COUNTS`] value into `(applied seqno, items, users)`; `None` if malformed.
pub fn split_counts_value(value: &[u8]) -> Option<(Seqno, u64, u64)> {
    if value.len() != 24 {
        return None;
    }
    Some((Seqno(u64_value(&value[..8])?), u64_value(&value[8..16])?, u64_value(&value[16..])?))
}

/// Key of an item (items, embeddings, trending).
pub fn item_key(item: u64) -> [u8; 8] {
    item.to_be_bytes()
}

/// Item id of an item key.
pub fn item_of_key(key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(key.try_into().ok()?))
}

/// Appends the key of a per (item, signal kind) counter (the logical `counters` keyspace) to `key`.
pub fn put_counter_key(key: &mut Vec<u8>, item: u64, kind: &str) {
    key.extend_from_slice(&item.to_be_bytes());
    key.extend_from_slice(kind.as_bytes());
}

/// Key of a per (item, signal kind) counter.
#[cfg(test)]
pub fn counter_key(item: u64, kind: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(8 + kind.len());
    put_counter_key(&mut key, item, kind);
    key
}

/// Splits a per (item, kind) counter entry into `(item, kind, count)`; `None` if the key is not an
/// item and a non-empty UTF-8 kind, or the value not a u64.
pub fn split_counter<'k>(key: &'k [u8], value: &[u8]) -> Option<(u64, &'k str, u64)> {
    let item = item_of_key(key.get(..8)?)?;
    let kind = std::str::from_utf8(&key[8..]).ok().filter(|kind| !kind.is_empty())?;
    Some((item, kind, u64_value(value)?))
}

/// Prefix of one user's seen set.
pub fn seen_prefix(user: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(2 + user.len() + 8);
    // The codec bounds users to u16::MAX bytes, so the length always fits.
    let len = u16::try_from(user.len()).unwrap_or(u16::MAX);
    key.extend_from_slice(&len.to_be_bytes());
    key.extend_from_slice(user.as_bytes());
    key
}

/// Key of one (user, item) pair in the seen set: how the digest and a snapshot see the set, and
/// how data dirs before seen chunks (and snapshot installs) store it (decisions/056).
#[cfg(test)]
pub fn seen_key(user: &str, item: u64) -> Vec<u8> {
    let mut key = seen_prefix(user);
    key.extend_from_slice(&item.to_be_bytes());
    key
}

/// Value with a leading seqno (items, embeddings).
pub fn seqno_value(seqno: Seqno, rest: &[u8]) -> Vec<u8> {
    let mut value = Vec::with_capacity(8 + rest.len());
    value.extend_from_slice(&seqno.0.to_le_bytes());
    value.extend_from_slice(rest);
    value
}

/// Splits a value with a leading seqno.
pub fn split_seqno_value(value: &[u8]) -> Option<(Seqno, &[u8])> {
    let seqno = u64::from_le_bytes(value.get(..8)?.try_into().ok()?);
    Some((Seqno(seqno), &value[8..]))
}

/// f32 values, little-endian.
pub fn f32s_to_bytes(values: &[f32], out: &mut Vec<u8>) {
    // Grow once, then fill fixed-size chunks: the loop vectorizes (one `extend_from_slice` per
    // value checked the capacity each time and stayed scalar; a flush converts every dirty vector).
    let start = out.len();
    out.resize(start + values.len() * 4, 0);
    for (bytes, value) in out[start..].chunks_exact_mut(4).zip(values) {
        bytes.copy_from_slice(&value.to_le_bytes());
    }
}

/// Whether every value is finite, without an early exit (so the loop vectorizes).
pub fn all_finite(values: &[f32]) -> bool {
    values.iter().fold(true, |all, value| all & value.is_finite())
}

/// Parses exactly `dimension` little-endian f32 values.
pub fn f32s_from_bytes(bytes: &[u8], dimension: usize) -> Option<Vec<f32>> {
    if bytes.len() != dimension.checked_mul(4)? {
        return None;
    }
    Some(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

/// A u64 LE value.
pub fn u64_value(bytes: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.try_into().ok()?))
}

/// Appends `value` as LEB128: seven bits per byte, low bits first, the high bit set on every byte
/// but the last.
pub fn put_leb128(out: &mut Vec<u8>, mut value: u64) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// Reads a LEB128 number at `*at` and moves `*at` past it; an error says what is wrong.
pub fn read_leb128(bytes: &[u8], at: &mut usize) -> Result<u64, &'static str> {
    let mut value = 0u64;
    let mut shift = 0;
    loop {
        let byte = *bytes.get(*at).ok_or("ends inside a number")?;
        *at += 1;
        let bits = u64::from(byte & 0x7f);
        if shift == 63 && bits > 1 || shift > 63 {
            return Err("a number overflows 64 bits");
        }
        value |= bits << shift;
        shift += 7;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
}

/// A user's profile: decayed weighted sum of the embeddings of items they interacted with.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    /// Reference time (logged unix ms) of `vector`.
    pub ref_ms: i64,
    /// The vector at `ref_ms`, `dimension` long.
    pub vector: Vec<f32>,
}

impl Profile {
    /// Bytes for fjall.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + self.vector.len() * 4);
        out.extend_from_slice(&self.ref_ms.to_le_bytes());
        f32s_to_bytes(&self.vector, &mut out);
        out
    }

    /// Parses [`Profile::encode`]'s bytes.
    pub fn decode(bytes: &[u8], dimension: usize) -> Option<Profile> {
        let ref_ms = i64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
        let vector = f32s_from_bytes(&bytes[8..], dimension)?;
        Some(Profile { ref_ms, vector })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vector_helpers_agree_with_the_scalar_definitions() {
        let values: Vec<f32> = (0..37).map(|i| i as f32 * -1.25 + 0.5).collect();
        let mut out = vec![9u8]; // appends after what is there
        f32s_to_bytes(&values, &mut out);
        let scalar: Vec<u8> =
            std::iter::once(9u8).chain(values.iter().flat_map(|v| v.to_le_bytes())).collect();
        assert_eq!(out, scalar);
        assert_eq!(f32s_from_bytes(&out[1..], values.len()), Some(values.clone()));
        assert!(all_finite(&values) && all_finite(&[]));
        // A non-finite value anywhere (first, middle, last, in and out of a vector lane) is seen.
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for at in 0..values.len() {
                let mut with = values.clone();
                with[at] = bad;
                assert!(!all_finite(&with), "{bad} at {at} not seen");
            }
        }
    }

    #[test]
    fn keys_sort_numerically_and_prefixes_do_not_collide() {
        assert!(item_key(255) < item_key(256));
        assert!(!seen_key("abc", 1).starts_with(&seen_prefix("ab")));
        assert!(seen_key("ab", 1).starts_with(&seen_prefix("ab")));
        assert_eq!(item_of_key(&item_key(77)), Some(77));
        assert_eq!(item_of_key(b"short"), None);
    }

    #[test]
    fn values_round_trip() {
        let profile = Profile { ref_ms: -4, vector: vec![1.0, -2.5] };
        assert_eq!(Profile::decode(&profile.encode(), 2), Some(profile.clone()));
        assert_eq!(Profile::decode(&profile.encode(), 3), None);
        let value = seqno_value(Seqno(9), b"{}");
        assert_eq!(split_seqno_value(&value), Some((Seqno(9), &b"{}"[..])));
        assert_eq!(split_seqno_value(b"1234567"), None);
    }
}
