//! How trending scores and counters are stored: one fjall entry per block of
//! [`BLOCK_ITEMS`] consecutive item ids, holding each item's trend and its counters
//! (decisions/070).
//!
//! Before, each item had a `trending` entry and one `counters` entry per signal kind. A crash
//! under signal ingest then left fjall a journal of millions of small entries, which its open
//! replays one by one (about 2 µs each here), whether a table already holds them or not. A block
//! carries 16 items in one entry, so the same journal bytes hold about a tenth of the entries.
//!
//! The digest and snapshots do not see blocks: [`for_each_logical`] gives the entries the old
//! layout stored (`trending`: item → trend; `counters`: item | kind → count), in key order. So the
//! golden digest, the snapshot format and mixed-version clusters are unchanged.
//!
//! Block value: for each item, ascending and distinct: its offset in the block (`u8`, below
//! [`BLOCK_ITEMS`]), its trend ([`Trend::encode`], 16 bytes), the number of its counters (LEB128),
//! then each counter: the kind name's length (LEB128, at least 1), the name (UTF-8), the count
//! (LEB128, at least 1), kinds in ascending byte order. A block is never empty (its key is removed
//! instead).
//!
//! Delicate:
//! - Only the flusher writes blocks while the engine runs (an install and the migration run with
//!   it idle), so [`Changes::flush_into`]'s read of a block and its write in the flush's batch see
//!   no other writer in between.
//! - Every item with a count has a trend (one signal sets both; a delete removes both): a block
//!   cannot hold counters without their trend, and a flush that would store one is a bug, asserted.

use crate::counters::CountChange;
use crate::error::Error;
use crate::flush_ingest::FlushWrites;
use crate::keys;
use crate::stores::Stores;
use crate::trend::{Trend, TREND_LEN};

/// Item ids per block: ids `16b ..= 16b + 15` share block `b`.
pub const BLOCK_ITEMS: u64 = 16;

/// Longest kind name a block accepts (the API bounds names far below it).
const KIND_BYTES_MAX: u64 = 65_536;

/// One item's stored state: its trend and its counters (kind names ascending, counts above 0).
#[derive(Clone, Debug, PartialEq)]
pub struct ItemState {
    /// The item id.
    pub item: u64,
    /// Its trending score.
    pub trend: Trend,
    /// Its counters by kind name.
    pub counts: Vec<(Box<str>, u64)>,
}

/// The block an item is stored in.
pub fn block_of(item: u64) -> u64 {
    item / BLOCK_ITEMS
}

/// The fjall key of a block.
pub fn block_key(block: u64) -> [u8; 8] {
    block.to_be_bytes()
}

/// A block's value; `items` ascending, distinct, all of one block, not empty.
pub fn encode_block(items: &[ItemState]) -> Vec<u8> {
    assert!(!items.is_empty(), "an empty block is removed, not stored");
    let block = block_of(items[0].item);
    let mut out = Vec::with_capacity(items.len() * (1 + TREND_LEN + 12));
    let mut previous = None;
    for state in items {
        assert!(
            block_of(state.item) == block && previous < Some(state.item),
            "block {block}: item {} after {previous:?}",
            state.item
        );
        previous = Some(state.item);
        out.push((state.item % BLOCK_ITEMS) as u8);
        out.extend_from_slice(&state.trend.encode());
        keys::put_leb128(&mut out, state.counts.len() as u64);
        for (kind, count) in &state.counts {
            debug_assert!(*count > 0 && !kind.is_empty(), "item {}: counter {kind:?} = {count}", state.item);
            keys::put_leb128(&mut out, kind.len() as u64);
            out.extend_from_slice(kind.as_bytes());
            keys::put_leb128(&mut out, *count);
        }
    }
    out
}

/// Calls `visit` with each item of a stored block, in order: its id, trend and counters (kind
/// names ascending). A value that does not decode is an error, before or after some visits.
pub fn parse_block<E: From<Error>>(
    key: &[u8],
    value: &[u8],
    mut visit: impl FnMut(u64, Trend, &[(&str, u64)]) -> Result<(), E>,
) -> Result<(), E> {
    let block = keys::item_of_key(key).ok_or_else(|| corrupt("block key is not 8 bytes".into()))?;
    if value.is_empty() || block > u64::MAX / BLOCK_ITEMS {
        return Err(corrupt(format!("block {block}: empty or out of range")).into());
    }
    let mut at = 0;
    let mut previous: Option<u8> = None;
    let mut counts: Vec<(&str, u64)> = Vec::new();
    while at < value.len() {
        let offset = value[at];
        if u64::from(offset) >= BLOCK_ITEMS || previous >= Some(offset) {
            return Err(corrupt(format!("block {block}: offset {offset} after {previous:?}")).into());
        }
        previous = Some(offset);
        let trend = value.get(at + 1..at + 1 + TREND_LEN).and_then(Trend::decode);
        let trend = trend.ok_or_else(|| corrupt(format!("block {block}: cut inside a trend")))?;
        at += 1 + TREND_LEN;
        read_counts(value, &mut at, &mut counts)
            .map_err(|reason| corrupt(format!("block {block}: {reason}")))?;
        visit(block * BLOCK_ITEMS + u64::from(offset), trend, &counts)?;
    }
    Ok(())
}

/// Reads one item's counters at `*at` into `out` (cleared first).
fn read_counts<'v>(
    value: &'v [u8],
    at: &mut usize,
    out: &mut Vec<(&'v str, u64)>,
) -> Result<(), &'static str> {
    out.clear();
    let n = keys::read_leb128(value, at)?;
    for _ in 0..n {
        let len = keys::read_leb128(value, at)?;
        if len == 0 || len > KIND_BYTES_MAX {
            return Err("kind name of no or too many bytes");
        }
        let end =
            at.checked_add(len as usize).filter(|end| *end <= value.len()).ok_or("cut inside a kind")?;
        let kind = std::str::from_utf8(&value[*at..end]).map_err(|_| "kind is not UTF-8")?;
        *at = end;
        if out.last().is_some_and(|(last, _)| last.as_bytes() >= kind.as_bytes()) {
            return Err("kinds not strictly ascending");
        }
        let count = keys::read_leb128(value, at)?;
        if count == 0 {
            return Err("a count of 0");
        }
        out.push((kind, count));
    }
    Ok(())
}

/// A stored block's items, owned.
pub fn decode_block(key: &[u8], value: &[u8]) -> Result<Vec<ItemState>, Error> {
    let mut items = Vec::new();
    parse_block::<Error>(key, value, |item, trend, counts| {
        let counts = counts.iter().map(|(kind, count)| (Box::<str>::from(*kind), *count)).collect();
        items.push(ItemState { item, trend, counts });
        Ok(())
    })?;
    Ok(items)
}

/// Which logical keyspace of the old layout [`for_each_logical`] gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logical {
    /// `item u64 BE` → `Trend::encode`.
    Trending,
    /// `item u64 BE | kind name` → `count u64 LE`.
    Counters,
}

/// Feeds `emit` the entries the old layout stored for `logical`, in key order, from the blocks
/// `blocks` yields in key order: what the digest hashes and a snapshot carries.
pub fn for_each_logical<E: From<Error>>(
    blocks: impl Iterator<Item = Result<(fjall::UserKey, fjall::UserValue), fjall::Error>>,
    logical: Logical,
    mut emit: impl FnMut(&[u8], &[u8]) -> Result<(), E>,
) -> Result<(), E> {
    let mut key = Vec::with_capacity(64);
    for entry in blocks {
        let (block_key, value) = entry.map_err(Error::from)?;
        parse_block(&block_key, &value, |item, trend, counts| match logical {
            Logical::Trending => emit(&keys::item_key(item), &trend.encode()),
            Logical::Counters => {
                for (kind, count) in counts {
                    key.clear();
                    keys::put_counter_key(&mut key, item, kind);
                    emit(&key, &count.to_le_bytes())?;
                }
                Ok(())
            }
        })?;
    }
    Ok(())
}

/// One flush window's changes to the stored trending state, last values only: every item whose
/// trend changed or that was deleted (`None`), by item; every changed counter (`None`: removed),
/// by (item, kind id), with the kind names of the ids.
#[derive(Debug)]
pub struct Changes<'a> {
    /// Trend changes, ascending by item, distinct.
    pub trends: &'a [(u64, Option<Trend>)],
    /// Counter changes, ascending by (item, kind id), distinct.
    pub counts: &'a [CountChange],
    /// The name of each kind id.
    pub kinds: &'a [Box<str>],
}

impl Changes<'_> {
    /// Reads each changed block, applies its changes, and puts the result (or its removal) into
    /// `writes`, in key order. Reads the latest committed blocks: only the flusher writes them.
    pub fn flush_into(&self, stores: &Stores, writes: &mut FlushWrites) -> Result<(), Error> {
        debug_assert!(self.trends.windows(2).all(|w| w[0].0 < w[1].0), "trend changes ascending");
        debug_assert!(self.counts.windows(2).all(|w| w[0].0 < w[1].0), "counter changes ascending");
        let (mut trends, mut counts) = (self.trends, self.counts);
        while let Some(block) = next_block(trends, counts) {
            let (block_trends, rest) =
                trends.split_at(trends.partition_point(|(item, _)| block_of(*item) == block));
            trends = rest;
            let (block_counts, rest) =
                counts.split_at(counts.partition_point(|((item, _), _)| block_of(*item) == block));
            counts = rest;
            let key = block_key(block);
            let mut items = match stores.trend_blocks.get(key)? {
                Some(value) => decode_block(&key, &value)?,
                None => Vec::new(),
            };
            self.apply(block_trends, block_counts, &mut items);
            if items.is_empty() {
                writes.remove(&stores.trend_blocks, key);
            } else {
                writes.insert(&stores.trend_blocks, key, encode_block(&items));
            }
        }
        Ok(())
    }

    /// Applies one block's changes to its stored `items` (ascending, at most 16: a binary search
    /// finds each changed item, and each changed kind among the item's few).
    fn apply(&self, trends: &[(u64, Option<Trend>)], counts: &[CountChange], items: &mut Vec<ItemState>) {
        for &(item, trend) in trends {
            match (items.binary_search_by_key(&item, |state| state.item), trend) {
                (Ok(at), Some(trend)) => items[at].trend = trend,
                (Ok(at), None) => drop(items.remove(at)),
                (Err(at), Some(trend)) => items.insert(at, ItemState { item, trend, counts: Vec::new() }),
                (Err(_), None) => {}
            }
        }
        for &((item, kind), count) in counts {
            let kind = &self.kinds[kind as usize];
            let Ok(at) = items.binary_search_by_key(&item, |state| state.item) else {
                assert!(count.is_none(), "item {item} would keep counter {kind} = {count:?} without a trend");
                continue;
            };
            let counts = &mut items[at].counts;
            match (counts.binary_search_by(|(stored, _)| stored.as_bytes().cmp(kind.as_bytes())), count) {
                (Ok(k), Some(count)) => counts[k].1 = count,
                (Ok(k), None) => drop(counts.remove(k)),
                (Err(k), Some(count)) => counts.insert(k, (kind.clone(), count)),
                (Err(_), None) => {}
            }
        }
    }
}

/// The first block either list of changes touches.
fn next_block(trends: &[(u64, Option<Trend>)], counts: &[CountChange]) -> Option<u64> {
    let trend = trends.first().map(|(item, _)| block_of(*item));
    let count = counts.first().map(|((item, _), _)| block_of(*item));
    trend.into_iter().chain(count).min()
}

fn corrupt(reason: String) -> Error {
    Error::Corrupt { keyspace: "trend_blocks", reason }
}

/// What [`migrate_legacy`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Migration {
    /// Items moved into blocks (in committed batches).
    pub items: u64,
    /// Batches committed.
    pub batches: u64,
}

/// Moves what a data dir of the old layout holds in `trending` and `counters` into blocks, in
/// batches of about `batch_bytes`. Each batch carries whole blocks and records the last item it
/// moved ([`keys::LOCAL_MIGRATED_THROUGH`]), so after a crash between two the next open goes on
/// after it (`stop_after` committed batches ends it there, for the tests of that). The old entries
/// stay until [`drop_legacy`] clears both keyspaces at once: a delete per entry would put two
/// tombstones per item into fjall's journal, which every open replays entry by entry. Runs at open,
/// before anything reads or writes the state.
pub fn migrate_legacy(
    stores: &Stores,
    batch_bytes: usize,
    stop_after: Option<u64>,
) -> Result<Migration, Error> {
    let mut done = Migration::default();
    let from = match stores.local.get(keys::LOCAL_MIGRATED_THROUGH)? {
        None => 0,
        Some(value) => match keys::u64_value(&value) {
            None => return Err(legacy("local", "migrated_through is not a u64".into())),
            Some(u64::MAX) => return Ok(done),
            Some(through) => through + 1,
        },
    };
    let mut legacy = Legacy::new(stores, from)?;
    let mut pending: Vec<ItemState> = Vec::new();
    let mut batch = stores.database.batch();
    let (mut bytes, mut items) = (0usize, 0u64);
    loop {
        let next = legacy.next_item()?;
        let block_ends = match (&next, pending.first()) {
            (_, None) => false,
            (Some(state), Some(first)) => block_of(state.item) != block_of(first.item),
            (None, Some(_)) => true,
        };
        if block_ends {
            items += pending.len() as u64;
            bytes += write_migrated(stores, &mut batch, &mut pending)?;
        }
        if bytes >= batch_bytes || (next.is_none() && bytes > 0) {
            if stop_after == Some(done.batches) {
                return Ok(done);
            }
            std::mem::replace(&mut batch, stores.database.batch()).commit()?;
            done.batches += 1;
            done.items += std::mem::take(&mut items);
            bytes = 0;
        }
        let Some(state) = next else { return Ok(done) };
        pending.push(state);
    }
}

/// Empties the old layout's keyspaces and forgets the migration's progress, once every item is in
/// a block and the layout is recorded: one clear record per keyspace in fjall's journal. Records
/// reach the journal in order, so no crash keeps the clear without the layout before it.
pub fn drop_legacy(stores: &Stores) -> Result<(), Error> {
    stores.legacy_trending.clear()?;
    stores.legacy_counters.clear()?;
    stores.local.remove(keys::LOCAL_MIGRATED_THROUGH)?;
    Ok(())
}

/// Whether the old layout's keyspaces still hold anything.
pub fn holds_legacy(stores: &Stores) -> bool {
    stores.legacy_trending.first_key_value().is_some() || stores.legacy_counters.first_key_value().is_some()
}

/// Writes the migrated items of one block (merged into what the block holds, if anything) and the
/// last item moved, in `batch`; returns the bytes written.
fn write_migrated(
    stores: &Stores,
    batch: &mut fjall::OwnedWriteBatch,
    pending: &mut Vec<ItemState>,
) -> Result<usize, Error> {
    let key = block_key(block_of(pending[0].item));
    let mut items = match stores.trend_blocks.get(key)? {
        Some(value) => decode_block(&key, &value)?,
        None => Vec::new(),
    };
    for state in pending.drain(..) {
        match items.binary_search_by_key(&state.item, |stored| stored.item) {
            Ok(at) => items[at] = state,
            Err(at) => items.insert(at, state),
        }
    }
    let last = items.last().map(|state| state.item).expect("a migrated block holds an item");
    batch.insert(&stores.local, keys::LOCAL_MIGRATED_THROUGH, last.to_le_bytes());
    let value = encode_block(&items);
    let bytes = key.len() + value.len();
    batch.insert(&stores.trend_blocks, key, value);
    Ok(bytes)
}

type Entries<'s> = Box<dyn Iterator<Item = Result<(fjall::UserKey, fjall::UserValue), fjall::Error>> + 's>;

/// The old layout's items in id order: each `trending` entry joined with its `counters` entries.
struct Legacy<'s> {
    trending: Entries<'s>,
    counters: Entries<'s>,
    /// The next counter not yet joined.
    counter: Option<(fjall::UserKey, fjall::UserValue)>,
}

impl<'s> Legacy<'s> {
    /// The items from `from` on.
    fn new(stores: &'s Stores, from: u64) -> Result<Legacy<'s>, Error> {
        let start = keys::item_key(from);
        let mut counters: Entries<'s> =
            Box::new(stores.legacy_counters.range(start..).map(|guard| guard.into_inner()));
        let counter = counters.next().transpose()?;
        let trending = Box::new(stores.legacy_trending.range(start..).map(|guard| guard.into_inner()));
        Ok(Legacy { trending, counters, counter })
    }

    fn next_item(&mut self) -> Result<Option<ItemState>, Error> {
        let Some(entry) = self.trending.next() else {
            return match &self.counter {
                Some((key, _)) => Err(orphan(key)),
                None => Ok(None),
            };
        };
        let (key, value) = entry?;
        let item = keys::item_of_key(&key).ok_or_else(|| legacy("trending", "malformed key".into()))?;
        let trend =
            Trend::decode(&value).ok_or_else(|| legacy("trending", format!("item {item}: not a trend")))?;
        let mut counts = Vec::new();
        while let Some((key, value)) = &self.counter {
            let counter = keys::split_counter(key, value).filter(|(_, _, count)| *count > 0);
            let Some((owner, kind, count)) = counter else {
                return Err(legacy("counters", format!("a malformed counter near item {item}")));
            };
            if owner > item {
                break;
            }
            if owner < item {
                return Err(orphan(key));
            }
            counts.push((kind.into(), count));
            self.counter = self.counters.next().transpose()?;
        }
        Ok(Some(ItemState { item, trend, counts }))
    }
}

fn orphan(key: &[u8]) -> Error {
    let item = key.get(..8).and_then(keys::item_of_key);
    legacy("counters", format!("item {item:?} has a count but no trending score"))
}

fn legacy(keyspace: &'static str, reason: String) -> Error {
    Error::Corrupt { keyspace, reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(item: u64, score: f64, counts: &[(&str, u64)]) -> ItemState {
        let counts = counts.iter().map(|(kind, count)| (Box::<str>::from(*kind), *count)).collect();
        ItemState { item, trend: Trend { score, ref_ms: item as i64 * 7 - 3 }, counts }
    }

    /// Items of block 2 with no, one and several counters (names of several lengths).
    fn sample() -> Vec<ItemState> {
        vec![
            state(32, 1.5, &[]),
            state(33, -0.25, &[("click", 1)]),
            state(40, 1e300, &[("a", 300), ("click", u64::MAX), ("view", 2)]),
            state(47, 0.0, &[("é", 1 << 40)]),
        ]
    }

    #[test]
    fn a_block_round_trips() {
        let items = sample();
        let value = encode_block(&items);
        assert_eq!(decode_block(&block_key(2), &value).unwrap(), items);
        let single = vec![state(u64::MAX, 3.0, &[("k", 9)])];
        let key = block_key(block_of(u64::MAX));
        assert_eq!(decode_block(&key, &encode_block(&single)).unwrap(), single);
    }

    #[test]
    fn every_truncation_and_damage_is_an_error() {
        let value = encode_block(&sample());
        for end in 0..value.len() {
            let cut = decode_block(&block_key(2), &value[..end]);
            // A cut at an item's end is a shorter, valid block; anywhere else it is an error.
            if let Ok(items) = cut {
                assert!(end > 0 && sample().starts_with(&items) && items.len() < sample().len(), "{end}");
            }
        }
        let bad_key = decode_block(&[0; 7], &value).unwrap_err();
        assert!(bad_key.to_string().contains("block key"), "{bad_key}");
        let mut descending = value.clone();
        descending[0] = 5; // item 37 before 33
        assert!(decode_block(&block_key(2), &descending).is_err());
        let mut offset = value.clone();
        offset[0] = 16;
        assert!(decode_block(&block_key(2), &offset).is_err());
        // Kinds out of order, a zero count, an empty name.
        for counts in [&[("b", 1), ("a", 1)][..], &[("a", 0)], &[("", 1)]] {
            let mut out = vec![0];
            out.extend_from_slice(&Trend::default().encode());
            keys::put_leb128(&mut out, counts.len() as u64);
            for (kind, count) in counts {
                keys::put_leb128(&mut out, kind.len() as u64);
                out.extend_from_slice(kind.as_bytes());
                keys::put_leb128(&mut out, *count);
            }
            assert!(decode_block(&block_key(0), &out).is_err(), "{counts:?}");
        }
    }

    #[test]
    fn garbage_values_never_panic() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for n in 0..20_000usize {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let value: Vec<u8> = (0..n % 80).map(|i| (state >> (i % 8 * 8)) as u8).collect();
            let _ = decode_block(&block_key(state % 1000), &value);
        }
    }

    /// What the digest sees: the old layout's entries, in its key order.
    #[test]
    fn the_logical_view_is_the_old_layouts_entries_in_key_order() {
        let blocks = [(0, vec![state(3, 1.0, &[("view", 4)])]), (2, sample())];
        let stored = || {
            blocks.iter().map(|(block, items)| {
                Ok((
                    fjall::UserKey::from(&block_key(*block)[..]),
                    fjall::UserValue::from(encode_block(items)),
                ))
            })
        };
        let mut trending = Vec::new();
        for_each_logical::<Error>(stored(), Logical::Trending, |key, value| {
            trending.push((key.to_vec(), value.to_vec()));
            Ok(())
        })
        .unwrap();
        let mut counters = Vec::new();
        for_each_logical::<Error>(stored(), Logical::Counters, |key, value| {
            counters.push((key.to_vec(), value.to_vec()));
            Ok(())
        })
        .unwrap();
        let all: Vec<&ItemState> = blocks.iter().flat_map(|(_, items)| items).collect();
        let expected: Vec<_> =
            all.iter().map(|s| (keys::item_key(s.item).to_vec(), s.trend.encode().to_vec())).collect();
        assert_eq!(trending, expected);
        let expected: Vec<_> = all
            .iter()
            .flat_map(|s| {
                s.counts.iter().map(|(k, c)| (keys::counter_key(s.item, k), c.to_le_bytes().to_vec()))
            })
            .collect();
        assert_eq!(counters, expected);
        assert!(counters.windows(2).all(|pair| pair[0].0 < pair[1].0), "counter keys ascending");
    }

    #[test]
    fn a_flush_changes_only_what_its_window_changed() {
        let dir = tempfile::tempdir().unwrap();
        let stores = Stores::open(dir.path()).unwrap();
        stores.trend_blocks.insert(block_key(2), encode_block(&sample())).unwrap();
        let kinds: Vec<Box<str>> = vec!["click".into(), "view".into(), "a".into()];
        let moved = Trend { score: 9.0, ref_ms: 9 };
        // Item 33 deleted then signalled again (click); item 40 loses "a"; item 47 deleted; item 35
        // is new; item 17 (block 1) is new; item 48 (block 3) deleted although never stored.
        let trends = [(17, Some(moved)), (33, Some(moved)), (35, Some(moved)), (47, None), (48, None)];
        let counts =
            [((17, 1), Some(2)), ((33, 0), Some(1)), ((35, 0), Some(5)), ((40, 2), None), ((47, 0), None)];
        let mut writes = FlushWrites::default();
        Changes { trends: &trends, counts: &counts, kinds: &kinds }.flush_into(&stores, &mut writes).unwrap();
        writes.commit_as_batch(&stores).unwrap();
        let read = |block| stores.trend_blocks.get(block_key(block)).unwrap();
        let block = |block| decode_block(&block_key(block), &read(block).unwrap()).unwrap();
        assert_eq!(block(1), vec![ItemState { trend: moved, ..state(17, 0.0, &[("view", 2)]) }]);
        let mut expected = sample();
        expected[1] = ItemState { trend: moved, ..state(33, 0.0, &[("click", 1)]) };
        expected[2].counts.remove(0);
        expected.insert(2, ItemState { trend: moved, ..state(35, 0.0, &[("click", 5)]) });
        expected.pop();
        assert_eq!(block(2), expected);
        assert!(read(3).is_none(), "a block left empty is not stored");
    }

    #[test]
    #[should_panic(expected = "without a trend")]
    fn a_flush_never_stores_counters_without_their_trend() {
        let dir = tempfile::tempdir().unwrap();
        let stores = Stores::open(dir.path()).unwrap();
        let kinds: Vec<Box<str>> = vec!["click".into()];
        let mut writes = FlushWrites::default();
        let counts = [((5, 0), Some(1))];
        let _ = Changes { trends: &[], counts: &counts, kinds: &kinds }.flush_into(&stores, &mut writes);
    }

    /// Writes `items` in the old layout, as a data dir of layout 1 holds them.
    fn write_legacy(stores: &Stores, items: &[ItemState]) {
        for state in items {
            stores.legacy_trending.insert(keys::item_key(state.item), state.trend.encode()).unwrap();
            for (kind, count) in &state.counts {
                stores
                    .legacy_counters
                    .insert(keys::counter_key(state.item, kind), count.to_le_bytes())
                    .unwrap();
            }
        }
    }

    fn stored_items(stores: &Stores) -> Vec<ItemState> {
        let mut items = Vec::new();
        for guard in stores.trend_blocks.iter() {
            let (key, value) = guard.into_inner().unwrap();
            items.extend(decode_block(&key, &value).unwrap());
        }
        items
    }

    /// A migration cut after any batch (a crash: the batch in hand is never committed) goes on at
    /// the next open after the last item it recorded, and ends with every item in a block, once.
    /// It deletes no old entry (each would be a tombstone an open replays): the clear at the end
    /// empties the old layout and forgets the progress.
    #[test]
    fn a_migration_cut_after_any_batch_ends_the_same() {
        let items: Vec<ItemState> = (0..200u64)
            .map(|n| n * n % 997)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .map(|item| {
                let counts: &[(&str, u64)] = match item % 3 {
                    0 => &[],
                    1 => &[("click", item + 1)],
                    _ => &[("click", 1), ("share", 2), ("view", item + 3)],
                };
                state(item, item as f64 / 3.0, counts)
            })
            .collect();
        let legacy_entries: usize = items.iter().map(|state| 1 + state.counts.len()).sum();
        let mut cuts = 0;
        for stop_after in 0.. {
            let dir = tempfile::tempdir().unwrap();
            let stores = Stores::open(dir.path()).unwrap();
            write_legacy(&stores, &items);
            let first = migrate_legacy(&stores, 300, Some(stop_after)).unwrap();
            let rest = migrate_legacy(&stores, 300, None).unwrap();
            assert_eq!(stored_items(&stores), items, "cut after {stop_after} batches");
            let old = || stores.legacy_trending.iter().count() + stores.legacy_counters.iter().count();
            assert_eq!(old(), legacy_entries, "the migration itself deletes nothing");
            assert!(holds_legacy(&stores));
            drop_legacy(&stores).unwrap();
            assert_eq!(old(), 0);
            assert!(!holds_legacy(&stores));
            assert!(stores.local.get(keys::LOCAL_MIGRATED_THROUGH).unwrap().is_none());
            assert_eq!(first.items + rest.items, items.len() as u64, "cut after {stop_after} batches");
            assert_eq!(first.batches, stop_after.min(first.batches + rest.batches));
            if rest.items == 0 {
                break;
            }
            cuts += 1;
        }
        assert!(cuts > 5, "the sample spans several batches: {cuts}");
    }

    #[test]
    fn a_count_without_its_trending_score_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let stores = Stores::open(dir.path()).unwrap();
        write_legacy(&stores, &[state(4, 1.0, &[])]);
        stores.legacy_counters.insert(keys::counter_key(9, "view"), 3u64.to_le_bytes()).unwrap();
        let error = migrate_legacy(&stores, 1 << 20, None).unwrap_err();
        assert!(error.to_string().contains("item Some(9) has a count but no trending score"), "{error}");
        stores.legacy_counters.insert(keys::counter_key(2, "view"), 3u64.to_le_bytes()).unwrap();
        let error = migrate_legacy(&stores, 1 << 20, None).unwrap_err();
        assert!(error.to_string().contains("item Some(2) has a count"), "{error}");
    }
}
