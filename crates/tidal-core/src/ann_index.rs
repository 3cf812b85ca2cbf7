//! The approximate ranking index, [`AnnIndex`]: an inverted file (IVF) over the rows of the
//! [`crate::feed_index::FeedIndex`], so a feed or similar-items query scores the rows of a few
//! lists instead of every row (decisions/067).
//!
//! Delicate: parity. Which rows a query scores must be a function of the applied state only, never
//! of the order a node saw the writes, of its restarts or of a snapshot install:
//! - the centroids are chosen once, by [`choose_centroids`], a pure function of the embeddings at
//!   the apply where the catalogue first reaches [`crate::EngineConfig::ann_centroids_at`]; they
//!   are then log-derived state, persisted in `meta` (`keys::META_ANN_CENTROIDS`), carried by
//!   snapshots and covered by the digest, never recomputed;
//! - a row's list is [`AnnIndex::nearest_list`] of its current vector: a pure function of the
//!   vector and the centroids, with ties to the lower list, so a rebuild from fjall (after a
//!   restart or an install) puts every row in the list the live index has it in;
//! - the order of rows inside a list follows history (removal swaps), so nothing may depend on it:
//!   a query takes whole lists and the ranking sorts by (score, item id).

use crate::feed_index::{dot, inverse_norm};

/// Bytes of the centroids' header in `meta`: magic, version, dimension, lists.
const HEADER_BYTES: usize = 16;
/// Marks a centroids value, so a value of another kind is refused rather than misread.
const MAGIC: [u8; 4] = *b"TANN";
/// Format of the centroids value; a reader refuses other versions.
const VERSION: u32 = 1;

/// The inverted file: unit-norm centroids, the rows of each list, and each row's place.
#[derive(Debug)]
pub struct AnnIndex {
    dimension: usize,
    /// `lists x dimension` unit-norm centroid values.
    centroids: Vec<f32>,
    /// Rows of the feed index assigned to each list, in no meaningful order.
    lists: Vec<Vec<u32>>,
    /// For each row of the feed index: its list and its position in that list.
    slots: Vec<Slot>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Slot {
    list: u32,
    position: u32,
}

impl AnnIndex {
    /// An index over `centroids` (`lists x dimension` unit-norm values) with no rows yet.
    pub fn new(dimension: usize, centroids: Vec<f32>) -> AnnIndex {
        assert!(
            dimension > 0 && centroids.len() % dimension == 0 && !centroids.is_empty(),
            "centroids of {} values for dimension {dimension}",
            centroids.len()
        );
        let lists = centroids.len() / dimension;
        AnnIndex { dimension, centroids, lists: vec![Vec::new(); lists], slots: Vec::new() }
    }

    /// Number of lists.
    pub fn lists(&self) -> usize {
        self.lists.len()
    }

    /// The rows of list `list`.
    pub fn list(&self, list: usize) -> &[u32] {
        &self.lists[list]
    }

    /// The list a vector belongs to: the centroid of highest cosine, the lower list on a tie.
    pub fn nearest_list(&self, vector: &[f32]) -> u32 {
        let unit = unit(vector);
        let mut best = (0u32, f32::NEG_INFINITY);
        for (list, centroid) in self.centroids.chunks_exact(self.dimension).enumerate() {
            let score = dot(centroid, &unit);
            if score > best.1 {
                best = (list as u32, score);
            }
        }
        best.0
    }

    /// Lists by descending cosine of their centroid with `query`, the lower list first on a tie.
    pub fn probe_order(&self, query: &[f32]) -> Vec<u32> {
        let unit = unit(query);
        let scores: Vec<f32> =
            self.centroids.chunks_exact(self.dimension).map(|centroid| dot(centroid, &unit)).collect();
        let mut order: Vec<u32> = (0..self.lists.len() as u32).collect();
        order.sort_unstable_by(|a, b| scores[*b as usize].total_cmp(&scores[*a as usize]).then(a.cmp(b)));
        order
    }

    /// Adds `row` (the next row of the feed index, or a row that was removed) to `list`.
    pub fn insert(&mut self, row: usize, list: u32) {
        let members = &mut self.lists[list as usize];
        let slot = Slot { list, position: members.len() as u32 };
        members.push(u32::try_from(row).expect("feed index rows fit in u32"));
        match row.cmp(&self.slots.len()) {
            std::cmp::Ordering::Less => self.slots[row] = slot,
            std::cmp::Ordering::Equal => self.slots.push(slot),
            std::cmp::Ordering::Greater => {
                panic!("row {row} inserted past the end of {} slots", self.slots.len())
            }
        }
    }

    /// The list `row` is in.
    pub fn list_of(&self, row: usize) -> u32 {
        self.slots[row].list
    }

    /// Takes `row` out of its list (its slot stays until it is inserted again or renumbered).
    pub fn remove(&mut self, row: usize) {
        let Slot { list, position } = self.slots[row];
        let members = &mut self.lists[list as usize];
        assert_eq!(members[position as usize] as usize, row, "slot of row {row} points at another row");
        members.swap_remove(position as usize);
        if let Some(&moved) = members.get(position as usize) {
            self.slots[moved as usize].position = position;
        }
    }

    /// The feed index moved its last row `from` into the freed row `to` (`to` was removed first),
    /// and drops the last slot.
    pub fn renumber(&mut self, from: usize, to: usize) {
        assert_eq!(from + 1, self.slots.len(), "only the last row moves: row {from} of {}", self.slots.len());
        let slot = self.slots[from];
        self.lists[slot.list as usize][slot.position as usize] = to as u32;
        self.slots[to] = slot;
        self.slots.pop();
    }

    /// Drops the last slot (the feed index removed its last row, after [`AnnIndex::remove`]).
    pub fn pop(&mut self) {
        self.slots.pop();
    }

    /// Estimated heap bytes.
    pub fn bytes(&self) -> usize {
        self.centroids.capacity() * 4
            + self.lists.iter().map(|list| list.capacity() * 4 + 24).sum::<usize>()
            + self.slots.capacity() * std::mem::size_of::<Slot>()
    }
}

/// The centroids as stored in `meta`: magic, version, dimension, lists (u32 LE), then the values
/// (f32 LE).
pub fn encode_centroids(dimension: usize, centroids: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES + centroids.len() * 4);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(dimension as u32).to_le_bytes());
    out.extend_from_slice(&((centroids.len() / dimension.max(1)) as u32).to_le_bytes());
    for value in centroids {
        out.extend_from_slice(&value.to_le_bytes());
    }
    out
}

/// Parses [`encode_centroids`]'s bytes for an index of `dimension`; the reason if they are not.
pub fn decode_centroids(bytes: &[u8], dimension: usize) -> Result<Vec<f32>, String> {
    let header = bytes.get(..HEADER_BYTES).ok_or("centroids shorter than their header")?;
    let word = |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().expect("4 bytes"));
    if header[..4] != MAGIC || word(4) != VERSION {
        return Err(format!("centroids: magic {:?}, version {}", &header[..4], word(4)));
    }
    let (stored_dimension, lists) = (word(8) as usize, word(12) as usize);
    if stored_dimension != dimension || lists == 0 {
        return Err(format!(
            "centroids of dimension {stored_dimension} x {lists} lists, index dimension {dimension}"
        ));
    }
    let body = &bytes[HEADER_BYTES..];
    if body.len() != lists * dimension * 4 {
        return Err(format!("centroids body of {} bytes for {lists} x {dimension}", body.len()));
    }
    Ok(body.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes"))).collect())
}

/// The centroids for `lists` lists, chosen from `rows` (item id, vector): the vectors of the
/// `lists` items with the lowest [`spread`] of their id (zero vectors skipped), each scaled to unit
/// norm, in that order. A pure function of the set of rows, whatever order they come in. Empty if
/// no row has a non-zero vector.
pub fn choose_centroids<'a>(rows: impl Iterator<Item = (u64, &'a [f32])>, lists: usize) -> Vec<f32> {
    // Keep the `lists` lowest (spread, id) in a max-heap of (key, slot in `kept`): one pass, no
    // sort of every row.
    let mut heap: std::collections::BinaryHeap<((u64, u64), usize)> =
        std::collections::BinaryHeap::with_capacity(lists + 1);
    let mut kept: Vec<&'a [f32]> = Vec::with_capacity(lists);
    for (item, vector) in rows {
        if inverse_norm(vector) == 0.0 {
            continue;
        }
        let key = (spread(item), item);
        if kept.len() < lists {
            heap.push((key, kept.len()));
            kept.push(vector);
        } else if heap.peek().is_some_and(|(worst, _)| key < *worst) {
            let (_, slot) = heap.pop().expect("the heap holds `lists` entries");
            kept[slot] = vector;
            heap.push((key, slot));
        }
    }
    heap.into_sorted_vec().into_iter().flat_map(|(_, slot)| unit(kept[slot])).collect()
}

/// SplitMix64's finalizer: a fixed bijection of item ids, so the centroid sample is spread over
/// the catalogue rather than its lowest ids (ids are often assigned in order of arrival).
pub fn spread(item: u64) -> u64 {
    let mut z = item.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `vector` scaled to unit norm (computed in f64, rounded to f32), or zeros for a zero vector.
/// Scaling first keeps the f32 dot products of huge values finite.
fn unit(vector: &[f32]) -> Vec<f32> {
    let inv = inverse_norm(vector);
    vector.iter().map(|v| (f64::from(*v) * inv) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index() -> AnnIndex {
        // Two lists: along x and along y.
        AnnIndex::new(2, vec![1.0, 0.0, 0.0, 1.0])
    }

    #[test]
    fn rows_go_to_the_nearest_centroid_and_ties_to_the_lower_list() {
        let index = index();
        assert_eq!(index.nearest_list(&[5.0, 1.0]), 0);
        assert_eq!(index.nearest_list(&[-1.0, 0.5]), 1);
        assert_eq!(index.nearest_list(&[2.0, 2.0]), 0, "a tie goes to the lower list");
        assert_eq!(index.nearest_list(&[f32::MAX, f32::MAX]), 0, "huge values do not overflow");
        assert_eq!(index.probe_order(&[0.1, 3.0]), vec![1, 0]);
    }

    #[test]
    fn removal_and_renumbering_keep_slots_consistent() {
        let mut index = index();
        for (row, list) in [(0, 0), (1, 1), (2, 0), (3, 0)] {
            index.insert(row, list);
        }
        // The feed index removes row 0 and moves its last row (3) into it.
        index.remove(0);
        index.renumber(3, 0);
        assert_eq!(index.slots.len(), 3);
        for row in 0..3 {
            let slot = index.slots[row];
            assert_eq!(index.lists[slot.list as usize][slot.position as usize] as usize, row, "row {row}");
        }
        let mut list0 = index.list(0).to_vec();
        list0.sort_unstable();
        assert_eq!(list0, vec![0, 2]);
        index.remove(2);
        index.pop();
        assert_eq!(index.list(0), &[0]);
        assert_eq!(index.list(1), &[1]);
    }

    #[test]
    fn the_centroid_choice_ignores_row_order_and_zero_vectors() {
        let vectors: Vec<(u64, Vec<f32>)> =
            (0..50u64).map(|item| (item, vec![item as f32, 1.0 + (item % 3) as f32])).collect();
        let mut rows: Vec<(u64, &[f32])> = vectors.iter().map(|(i, v)| (*i, v.as_slice())).collect();
        let forward = choose_centroids(rows.iter().copied(), 8);
        rows.reverse();
        rows.push((1000, &[0.0, 0.0]));
        assert_eq!(choose_centroids(rows.iter().copied(), 8), forward);
        assert_eq!(forward.len(), 16);
        let encoded = encode_centroids(2, &forward);
        assert_eq!(decode_centroids(&encoded, 2), Ok(forward));
        assert!(decode_centroids(&encoded, 3).is_err());
        assert!(decode_centroids(&encoded[..20], 2).is_err());
    }
}
