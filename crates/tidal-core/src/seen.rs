//! How the seen set is stored: one chunk per user per flush (decisions/056).
//!
//! The seen set is a set of (user, item) pairs that only gains. It used to be stored as one fjall
//! key per pair, so a flush wrote one key per signal of its window (nearly all distinct), and those
//! keys were most of what the flusher and fjall's compactions did. Now a flush writes, per user it
//! touched, ONE key: a chunk holding that user's items of the window, ascending, delta-encoded.
//!
//! The seen keyspace holds two kinds of entries under a user's prefix ([`keys::seen_prefix`]):
//! - a pair: prefix, then the item (8 bytes, big-endian); empty value. Data dirs written before
//!   chunks, and snapshot installs, hold these; they stay valid;
//! - a chunk: prefix, then [`CHUNK_TAG`], then the chunk id (8 bytes, big-endian: the applied seqno
//!   of the flush that wrote it); value: the items as LEB128 deltas (the first from 0).
//!
//! The two suffixes differ in length, so a key says which it is.
//!
//! Delicate:
//! - The digest and the snapshot see the LOGICAL set, never the layout: [`for_each_logical`]
//!   yields every pair once, in pair-key order, whatever chunks and pairs hold it. Two replicas
//!   with the same log have the same digest though their chunks differ (merges depend on reads).
//! - A user's entries are merged into one chunk by the flusher when a read found more than
//!   [`KEYS_BEFORE_MERGE`] of them ([`crate::flusher::SeenMerge`]), so a feed read scans a
//!   bounded number of keys for a user it reads often, and a data dir of pairs (older versions,
//!   snapshot installs) turns into chunks where it is read.
//! - A chunk id names the flush that wrote it, so a later flush never overwrites an earlier
//!   chunk. A flush re-run after a crash (experiments/054: ingested, then the batch lost) may write
//!   a chunk with the same id again; it holds the items of at least the same batches.

use crate::error::Error;
use crate::keys;

/// The byte after a user's prefix that starts a chunk's suffix (a pair's suffix is 8 bytes only).
const CHUNK_TAG: u8 = 0x01;

/// Length of a chunk key's suffix after the user's prefix: the tag and the chunk id.
const CHUNK_SUFFIX: usize = 9;

/// Length of a pair key's suffix after the user's prefix: the item.
const PAIR_SUFFIX: usize = 8;

/// A read that finds more stored entries (chunks or pairs) than this for one user asks the flusher
/// to merge them into one chunk.
pub const KEYS_BEFORE_MERGE: usize = 16;

/// The key of one of `user`'s chunks.
pub fn chunk_key(user: &str, chunk: u64) -> Vec<u8> {
    chunk_key_after(keys::seen_prefix(user), chunk)
}

/// The key of a chunk of the user whose key prefix ([`keys::seen_prefix`]) is `prefix`.
pub fn chunk_key_after(mut prefix: Vec<u8>, chunk: u64) -> Vec<u8> {
    prefix.push(CHUNK_TAG);
    prefix.extend_from_slice(&chunk.to_be_bytes());
    prefix
}

/// A chunk's value: `items` must be ascending and distinct.
pub fn encode_chunk(items: &[u64]) -> Vec<u8> {
    debug_assert!(items.windows(2).all(|pair| pair[0] < pair[1]), "chunk items ascending");
    let mut value = Vec::with_capacity(items.len() * 3);
    let mut previous = 0;
    for &item in items {
        keys::put_leb128(&mut value, item - previous);
        previous = item;
    }
    value
}

/// Decodes a chunk's value into `out`; an error says what is wrong. A chunk is never empty, and
/// its items are strictly ascending and fit in a u64.
pub fn decode_chunk(value: &[u8], out: &mut Vec<u64>) -> Result<(), &'static str> {
    if value.is_empty() {
        return Err("empty chunk");
    }
    let (mut at, mut previous, mut first) = (0, 0u64, true);
    while at < value.len() {
        let delta = keys::read_leb128(value, &mut at)?;
        if delta == 0 && !first {
            return Err("chunk items not strictly ascending");
        }
        previous = previous.checked_add(delta).ok_or("chunk item overflows 64 bits")?;
        out.push(previous);
        first = false;
    }
    Ok(())
}

/// What one stored entry of the seen keyspace is.
#[derive(Debug, PartialEq, Eq)]
pub enum Entry<'a> {
    /// A pair: the user's prefix and the item.
    Pair { prefix: &'a [u8], item: u64 },
    /// A chunk: the user's prefix; the value holds the items.
    Chunk { prefix: &'a [u8] },
}

/// Parses a stored key of the seen keyspace (its value is checked by the caller: empty for a pair,
/// [`decode_chunk`] for a chunk).
pub fn parse_key(key: &[u8]) -> Result<Entry<'_>, &'static str> {
    let len = key.get(..2).ok_or("seen key shorter than its length")?;
    let prefix_len = 2 + usize::from(u16::from_be_bytes([len[0], len[1]]));
    let prefix = key.get(..prefix_len).ok_or("seen key shorter than its user")?;
    let suffix = &key[prefix_len..];
    match suffix.len() {
        PAIR_SUFFIX => Ok(Entry::Pair { prefix, item: keys::item_of_key(suffix).ok_or("bad item")? }),
        CHUNK_SUFFIX if suffix[0] == CHUNK_TAG => Ok(Entry::Chunk { prefix }),
        _ => Err("seen key of neither a pair nor a chunk"),
    }
}

/// The items of one stored entry, appended to `out`; the user's prefix.
pub fn entry_items<'k>(key: &'k [u8], value: &[u8], out: &mut Vec<u64>) -> Result<&'k [u8], Error> {
    let corrupt = |reason: &str| Error::Corrupt { keyspace: "seen", reason: reason.into() };
    match parse_key(key).map_err(corrupt)? {
        Entry::Pair { prefix, item } => {
            if !value.is_empty() {
                return Err(corrupt("a seen pair with a value"));
            }
            out.push(item);
            Ok(prefix)
        }
        Entry::Chunk { prefix } => {
            decode_chunk(value, out).map_err(corrupt)?;
            Ok(prefix)
        }
    }
}

/// Feeds every (user, item) pair of the stored entries `raw` (in key order, as fjall iterates
/// them) to `emit` once, as the pair key and an empty value, in pair-key order: the logical seen
/// set, whatever layout holds it. Memory: one user's items at a time.
pub fn for_each_logical<E: From<Error>>(
    raw: impl IntoIterator<Item = Result<(fjall::Slice, fjall::Slice), fjall::Error>>,
    mut emit: impl FnMut(&[u8], &[u8]) -> Result<(), E>,
) -> Result<(), E> {
    // A user's entries are contiguous in key order: they share the length-prefixed user.
    let mut prefix: Vec<u8> = Vec::new();
    let mut items: Vec<u64> = Vec::new();
    let mut flush = |prefix: &[u8], items: &mut Vec<u64>| -> Result<(), E> {
        items.sort_unstable();
        items.dedup();
        let mut key = prefix.to_vec();
        for &item in items.iter() {
            key.truncate(prefix.len());
            key.extend_from_slice(&item.to_be_bytes());
            emit(&key, &[])?;
        }
        items.clear();
        Ok(())
    };
    let mut found = Vec::new();
    for entry in raw {
        let (key, value) = entry.map_err(Error::from)?;
        found.clear();
        let user = entry_items(&key, &value, &mut found)?;
        if user != prefix.as_slice() {
            flush(&prefix, &mut items)?;
            prefix.clear();
            prefix.extend_from_slice(user);
        }
        items.extend_from_slice(&found);
    }
    flush(&prefix, &mut items)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_round_trips_and_damage_is_an_error() {
        let items = [0, 1, 127, 128, 300, 1 << 40, u64::MAX];
        let value = encode_chunk(&items);
        let mut out = Vec::new();
        decode_chunk(&value, &mut out).unwrap();
        assert_eq!(out, items);
        // Every truncation but the whole: an error or a strict prefix of the items, never a panic.
        for end in 0..value.len() {
            let mut out = Vec::new();
            if decode_chunk(&value[..end], &mut out).is_ok() {
                assert!(end > 0 && items.starts_with(&out) && out.len() < items.len());
            }
        }
        assert_eq!(decode_chunk(&[], &mut Vec::new()), Err("empty chunk"));
        assert_eq!(decode_chunk(&[0x80], &mut Vec::new()), Err("ends inside a number"));
        assert_eq!(decode_chunk(&[1, 0], &mut Vec::new()), Err("chunk items not strictly ascending"));
        let too_long = [0xff; 10];
        assert!(decode_chunk(&too_long, &mut Vec::new()).is_err());
        // Two items summing past u64::MAX.
        let mut past = encode_chunk(&[u64::MAX]);
        past.push(1);
        assert_eq!(decode_chunk(&past, &mut Vec::new()), Err("chunk item overflows 64 bits"));
    }

    #[test]
    fn garbage_values_never_panic() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let len = (state % 24) as usize;
            let bytes: Vec<u8> = (0..len).map(|i| (state >> (i % 8 * 8)) as u8).collect();
            let mut out = Vec::new();
            if decode_chunk(&bytes, &mut out).is_ok() {
                assert!(out.windows(2).all(|pair| pair[0] < pair[1]));
            }
            let _ = parse_key(&bytes);
        }
    }

    #[test]
    fn keys_say_what_they_are() {
        let pair = keys::seen_key("ab", 7);
        assert_eq!(parse_key(&pair), Ok(Entry::Pair { prefix: &pair[..4], item: 7 }));
        let chunk = chunk_key("ab", 7);
        assert_eq!(parse_key(&chunk), Ok(Entry::Chunk { prefix: &chunk[..4] }));
        // A chunk key one byte short has a pair's shape (its empty value is what a pair needs);
        // two bytes short is neither.
        assert!(matches!(parse_key(&chunk[..chunk.len() - 1]), Ok(Entry::Pair { .. })));
        assert!(parse_key(&chunk[..chunk.len() - 2]).is_err());
        let mut wrong_tag = chunk.clone();
        wrong_tag[4] = 0x02;
        assert!(parse_key(&wrong_tag).is_err());
        assert!(parse_key(b"\x00").is_err());
        assert!(parse_key(b"\x00\x09ab").is_err());
    }

    #[test]
    fn the_logical_set_is_the_same_whatever_the_layout() {
        let slice = |bytes: Vec<u8>| fjall::Slice::from(bytes);
        let logical = |entries: Vec<(Vec<u8>, Vec<u8>)>| {
            let mut sorted = entries;
            sorted.sort();
            let mut out = Vec::new();
            for_each_logical::<Error>(sorted.into_iter().map(|(k, v)| Ok((slice(k), slice(v)))), |k, v| {
                out.push((k.to_vec(), v.to_vec()));
                Ok(())
            })
            .unwrap();
            out
        };
        let pairs = logical(vec![
            (keys::seen_key("a", 3), vec![]),
            (keys::seen_key("a", 9), vec![]),
            (keys::seen_key("bb", 1), vec![]),
            (keys::seen_key("b", 5), vec![]),
        ]);
        let chunks = logical(vec![
            (chunk_key("a", 10), encode_chunk(&[3, 9])),
            (chunk_key("a", 20), encode_chunk(&[9])),
            (keys::seen_key("a", 3), vec![]),
            (chunk_key("bb", 20), encode_chunk(&[1])),
            (chunk_key("b", 30), encode_chunk(&[5])),
        ]);
        assert_eq!(pairs, chunks);
        assert_eq!(pairs.len(), 4);
        assert!(pairs.iter().all(|(_, v)| v.is_empty()));
        assert!(pairs.windows(2).all(|w| w[0].0 < w[1].0), "pair-key order");
    }
}
