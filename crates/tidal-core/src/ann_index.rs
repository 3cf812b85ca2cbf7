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

use crate::error::Error;
use crate::feed_index::{dot, inverse_norm};
use crate::trend::Trend;

/// Bytes of the centroids' header in `meta`: magic, version, dimension, lists.
const HEADER_BYTES: usize = 16;
/// Marks a centroids value, so a value of another kind is refused rather than misread.
const MAGIC: [u8; 4] = *b"TANN";
/// Format of the centroids value; a reader refuses other versions.
const VERSION: u32 = 1;

/// The inverted file: unit-norm centroids, and for each list its entries with an 8-bit copy of
/// their vectors stored together, so a query reads its lists front to back instead of jumping
/// through the whole matrix (at a million rows of 128 dimensions, reading 32k scattered f32 rows
/// cost 12 ms a query; the 8-bit copies are a quarter of the bytes, in order).
#[derive(Debug)]
pub struct AnnIndex {
    dimension: usize,
    /// `lists x dimension` unit-norm centroid values.
    centroids: Vec<f32>,
    /// The centroids as 8-bit codes with their steps (see [`quantize`]): a vector's list is found
    /// by integer dot products with these, a quarter of the bytes and exact sums (the per-write
    /// cost of an embedding and of the rebuild on open).
    centroid_codes: Vec<i8>,
    /// See `centroid_codes`.
    centroid_steps: Vec<f32>,
    /// Each list's entries, in no meaningful order.
    lists: Vec<List>,
    /// For each row of the feed index: its list and its position in that list.
    slots: Vec<Slot>,
}

/// One list's entries, as parallel columns.
#[derive(Debug, Default, Clone)]
struct List {
    /// Row of each entry in the feed index.
    rows: Vec<u32>,
    /// Item id of each entry (exclusions are tested without touching the feed index).
    items: Vec<u64>,
    /// Trending score of each entry's item, so the estimate can add the feed's trending term
    /// without touching the feed index (kept by [`AnnIndex::set_trend`]).
    trends: Vec<Option<Trend>>,
    /// Per entry, the factor that turns its integer dot product with a quantized unit query into
    /// an estimated cosine: its quantization step times its inverse norm.
    factors: Vec<f32>,
    /// `entries x dimension` codes: each value divided by the step `max |v| / 127`, rounded.
    codes: Vec<i8>,
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
            dimension > 0 && centroids.len().is_multiple_of(dimension) && !centroids.is_empty(),
            "centroids of {} values for dimension {dimension}",
            centroids.len()
        );
        let lists = centroids.len() / dimension;
        let (mut centroid_codes, mut centroid_steps) = (Vec::with_capacity(centroids.len()), Vec::new());
        for centroid in centroids.chunks_exact(dimension) {
            let (codes, step) = quantize(centroid);
            centroid_codes.extend_from_slice(&codes);
            centroid_steps.push(step);
        }
        AnnIndex {
            dimension,
            centroids,
            centroid_codes,
            centroid_steps,
            lists: vec![List::default(); lists],
            slots: Vec::new(),
        }
    }

    /// Number of lists.
    pub fn lists(&self) -> usize {
        self.lists.len()
    }

    /// The list a vector belongs to: the centroid of highest estimated cosine (8-bit codes of both),
    /// the lower list on a tie.
    pub fn nearest_list(&self, vector: &[f32]) -> u32 {
        let (codes, _) = quantize(vector);
        let mut best = (0u32, f32::NEG_INFINITY);
        let centroids = self.centroid_codes.chunks_exact(self.dimension).zip(&self.centroid_steps);
        for (list, (centroid, step)) in centroids.enumerate() {
            let score = dot_codes(centroid, &codes) as f32 * step;
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

    /// The rows of the `wanted` entries of highest estimated score with `query` (ties to the lower
    /// item id) in the lists nearest it, skipping the items `skip` says: at least `probes` lists,
    /// then more until `enough` entries were not skipped. The estimate is `weight` times the
    /// estimated cosine plus `term` of the entry's trending score (if it has one). A pure function
    /// of the lists' contents.
    pub fn candidates(
        &self,
        query: &[f32],
        (probes, enough, wanted): (usize, usize, usize),
        skip: impl Fn(u64) -> bool,
        (weight, term): (f32, impl Fn(&Trend) -> f32),
    ) -> Vec<u32> {
        // The query's own step makes the estimate a cosine, comparable with the trending term.
        let (codes, query_step) = quantize(&unit(query));
        let mut best: std::collections::BinaryHeap<Candidate> = std::collections::BinaryHeap::new();
        let mut kept = 0usize;
        for (probed, list) in self.probe_order(query).into_iter().enumerate() {
            if probed >= probes && kept >= enough {
                break;
            }
            let list = &self.lists[list as usize];
            let entries = list.codes.chunks_exact(self.dimension).zip(&list.factors).zip(&list.items);
            for (position, ((row_codes, factor), item)) in entries.enumerate() {
                if skip(*item) {
                    continue;
                }
                kept += 1;
                let cosine = dot_codes(&codes, row_codes) as f32 * factor * query_step;
                let estimate = weight * cosine + list.trends[position].as_ref().map_or(0.0, &term);
                let candidate = Candidate { estimate, item: *item, row: list.rows[position] };
                if best.len() < wanted {
                    best.push(candidate);
                } else if best.peek().is_some_and(|worst| candidate < *worst) {
                    best.pop();
                    best.push(candidate);
                }
            }
        }
        best.into_iter().map(|candidate| candidate.row).collect()
    }

    /// Adds `row` (the next row of the feed index, or a row that was removed) of `item` with
    /// `vector` and trending score `trend` to `list`.
    pub fn insert(&mut self, row: usize, list: u32, (item, trend): (u64, Option<Trend>), vector: &[f32]) {
        let members = &mut self.lists[list as usize];
        let slot = Slot { list, position: members.rows.len() as u32 };
        let (codes, step) = quantize(vector);
        members.rows.push(u32::try_from(row).expect("feed index rows fit in u32"));
        members.items.push(item);
        members.trends.push(trend);
        members.factors.push((f64::from(step) * inverse_norm(vector)) as f32);
        members.codes.extend_from_slice(&codes);
        match row.cmp(&self.slots.len()) {
            std::cmp::Ordering::Less => self.slots[row] = slot,
            std::cmp::Ordering::Equal => self.slots.push(slot),
            std::cmp::Ordering::Greater => {
                panic!("row {row} inserted past the end of {} slots", self.slots.len())
            }
        }
    }

    /// Takes `row` out of its list (its slot stays until it is inserted again or renumbered).
    pub fn remove(&mut self, row: usize) {
        let Slot { list, position } = self.slots[row];
        let dimension = self.dimension;
        let members = &mut self.lists[list as usize];
        let at = position as usize;
        assert_eq!(members.rows[at] as usize, row, "slot of row {row} points at another row");
        let last = members.rows.len() - 1;
        members.rows.swap_remove(at);
        members.items.swap_remove(at);
        members.trends.swap_remove(at);
        members.factors.swap_remove(at);
        members.codes.copy_within(last * dimension..(last + 1) * dimension, at * dimension);
        members.codes.truncate(last * dimension);
        if let Some(&moved) = members.rows.get(at) {
            self.slots[moved as usize].position = position;
        }
    }

    /// The feed index moved its last row `from` into the freed row `to` (`to` was removed first),
    /// and drops the last slot.
    pub fn renumber(&mut self, from: usize, to: usize) {
        assert_eq!(from + 1, self.slots.len(), "only the last row moves: row {from} of {}", self.slots.len());
        let slot = self.slots[from];
        self.lists[slot.list as usize].rows[slot.position as usize] = to as u32;
        self.slots[to] = slot;
        self.slots.pop();
    }

    /// Sets the trending score of the item of `row`.
    pub fn set_trend(&mut self, row: usize, trend: Trend) {
        let Slot { list, position } = self.slots[row];
        self.lists[list as usize].trends[position as usize] = Some(trend);
    }

    /// Drops the last slot (the feed index removed its last row, after [`AnnIndex::remove`]).
    pub fn pop(&mut self) {
        self.slots.pop();
    }

    /// Estimated heap bytes.
    pub fn bytes(&self) -> usize {
        let lists: usize = self
            .lists
            .iter()
            .map(|list| {
                list.rows.capacity() * 4
                    + list.items.capacity() * 8
                    + list.trends.capacity() * std::mem::size_of::<Option<Trend>>()
                    + list.factors.capacity() * 4
                    + list.codes.capacity()
                    + std::mem::size_of::<List>()
            })
            .sum();
        self.centroids.capacity() * 5
            + self.centroid_steps.capacity() * 4
            + lists
            + self.slots.capacity() * std::mem::size_of::<Slot>()
    }
}

/// An entry during a search; ordered so the worst (lowest estimate, then highest item id) is the
/// greatest, for the max-heap of the best.
#[derive(Clone, Copy, Debug)]
struct Candidate {
    estimate: f32,
    item: u64,
    row: u32,
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == std::cmp::Ordering::Equal
    }
}

impl Eq for Candidate {}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.estimate.total_cmp(&self.estimate).then(self.item.cmp(&other.item))
    }
}

/// `vector` as 8-bit codes with the step between codes: `v / step` rounded, `step = max |v| / 127`
/// (0 and zero codes for a zero vector).
fn quantize(vector: &[f32]) -> (Vec<i8>, f32) {
    let largest = vector.iter().fold(0f32, |m, v| m.max(v.abs()));
    if largest == 0.0 || !largest.is_finite() {
        return (vec![0; vector.len()], 0.0);
    }
    let step = largest / 127.0;
    (vector.iter().map(|v| (v / step).round().clamp(-127.0, 127.0) as i8).collect(), step)
}

/// Integer dot product of two code vectors: exact, so its order of summation cannot matter, and
/// the copy compiled for AVX2 (taken where the CPU has it: twice the lanes per instruction) returns
/// what the baseline copy returns. Nodes on different CPUs still rank alike.
fn dot_codes(a: &[i8], b: &[i8]) -> i32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above; that is all `dot_codes_avx2` requires.
        #[allow(unsafe_code)]
        return unsafe { dot_codes_avx2(a, b) };
    }
    dot_codes_lanes(a, b)
}

/// [`dot_codes_lanes`] compiled with AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn dot_codes_avx2(a: &[i8], b: &[i8]) -> i32 {
    dot_codes_lanes(a, b)
}

/// The portable body of [`dot_codes`], inlined into each copy so each is vectorized for its target.
#[inline(always)]
fn dot_codes_lanes(a: &[i8], b: &[i8]) -> i32 {
    // Sixteen independent lanes of i16 products summed in i32, so the compiler vectorizes it
    // (multiply-add of 16-bit pairs); integer sums are exact in any order.
    const LANES: usize = 16;
    let mut acc = [0i32; LANES];
    let (chunks_a, chunks_b) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let rest: i32 = chunks_a
        .remainder()
        .iter()
        .zip(chunks_b.remainder())
        .map(|(x, y)| i32::from(*x) * i32::from(*y))
        .sum();
    for (x, y) in chunks_a.zip(chunks_b) {
        for lane in 0..LANES {
            acc[lane] += i32::from(i16::from(x[lane]) * i16::from(y[lane]));
        }
    }
    acc.iter().sum::<i32>() + rest
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

/// Parses [`encode_centroids`]'s bytes for an index of `dimension`.
pub fn decode_centroids(bytes: &[u8], dimension: usize) -> Result<Vec<f32>, Error> {
    let bad = |reason: String| Error::Corrupt { keyspace: "meta", reason };
    let header =
        bytes.get(..HEADER_BYTES).ok_or_else(|| bad("centroids shorter than their header".into()))?;
    let word = |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().expect("4 bytes"));
    if header[..4] != MAGIC || word(4) != VERSION {
        return Err(bad(format!("centroids: magic {:?}, version {}", &header[..4], word(4))));
    }
    let (stored_dimension, lists) = (word(8) as usize, word(12) as usize);
    if stored_dimension != dimension || lists == 0 {
        return Err(bad(format!(
            "centroids of dimension {stored_dimension} x {lists} lists, index dimension {dimension}"
        )));
    }
    let body = &bytes[HEADER_BYTES..];
    if body.len() != lists * dimension * 4 {
        return Err(bad(format!("centroids body of {} bytes for {lists} x {dimension}", body.len())));
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

    fn rows(index: &AnnIndex, list: usize) -> Vec<u32> {
        let mut rows = index.lists[list].rows.clone();
        rows.sort_unstable();
        rows
    }

    #[test]
    fn removal_and_renumbering_keep_slots_consistent() {
        let mut index = index();
        for (row, list) in [(0, 0), (1, 1), (2, 0), (3, 0)] {
            index.insert(row, list, (100 + row as u64, None), &[row as f32 + 1.0, 1.0]);
        }
        // The feed index removes row 0 and moves its last row (3) into it.
        index.remove(0);
        index.renumber(3, 0);
        assert_eq!(index.slots.len(), 3);
        for row in 0..3 {
            let slot = index.slots[row];
            let list = &index.lists[slot.list as usize];
            let at = slot.position as usize;
            assert_eq!(list.rows[at] as usize, row, "row {row}");
            let (codes, _) = quantize(&[if row == 0 { 4.0 } else { row as f32 + 1.0 }, 1.0]);
            assert_eq!(&list.codes[at * 2..at * 2 + 2], codes.as_slice(), "codes of row {row} moved with it");
        }
        assert_eq!(rows(&index, 0), vec![0, 2]);
        index.remove(2);
        index.pop();
        assert_eq!(rows(&index, 0), vec![0]);
        assert_eq!(rows(&index, 1), vec![1]);
        assert_eq!(index.lists[0].items, vec![103], "row 0 now holds item 103");
    }

    #[test]
    fn candidates_are_the_best_estimates_of_the_nearest_lists_without_skipped_items() {
        let mut index = index();
        // Along x: rows 0..4 at growing angles; along y: rows 4..6.
        let vectors = [[1.0, 0.0], [1.0, 0.1], [1.0, 0.5], [1.0, 0.9], [0.0, 1.0], [0.2, 1.0]];
        for (row, vector) in vectors.iter().enumerate() {
            index.insert(row, index.nearest_list(vector), (row as u64, None), vector);
        }
        let no_trend = (1.0, |_: &Trend| 0.0);
        let mut got = index.candidates(&[1.0, 0.0], (1, 1, 2), |_| false, no_trend);
        got.sort_unstable();
        assert_eq!(got, vec![0, 1], "the two nearest of the nearest list");
        let mut got = index.candidates(&[1.0, 0.0], (1, 1, 2), |item| item < 2, no_trend);
        got.sort_unstable();
        assert_eq!(got, vec![2, 3], "skipped items make room for the next");
        let mut got = index.candidates(&[1.0, 0.0], (1, 5, 10), |item| item < 2, no_trend);
        got.sort_unstable();
        assert_eq!(got, vec![2, 3, 4, 5], "too few left in one list: the next list is probed");
        index.set_trend(3, Trend { score: 1e6, ref_ms: 0 });
        let hot = (1.0, |trend: &Trend| trend.score as f32);
        assert_eq!(
            index.candidates(&[1.0, 0.0], (1, 1, 1), |_| false, hot),
            vec![3],
            "the trend term counts"
        );
        assert_eq!(dot_codes(&[127, -127], &[127, 127]), 0);
        let (a, b): (Vec<i8>, Vec<i8>) =
            (0..37).map(|i| ((i * 7 % 255 - 127) as i8, (i * 13 % 255 - 127) as i8)).unzip();
        let naive: i32 = a.iter().zip(&b).map(|(x, y)| i32::from(*x) * i32::from(*y)).sum();
        assert_eq!(dot_codes(&a, &b), naive, "the lanes and the remainder add up");
        // An estimate is a cosine: a trend term of 0.8 lifts row 4 (cosine 0) above row 3 (0.74)
        // but not above rows 0 and 1 (1.0, 0.995) or 2 (0.89).
        index.set_trend(3, Trend { score: 0.0, ref_ms: 0 });
        index.set_trend(4, Trend { score: 0.8, ref_ms: 0 });
        let mut top = index.candidates(&[1.0, 0.0], (2, 1, 2), |_| false, (1.0, |t: &Trend| t.score as f32));
        top.sort_unstable();
        assert_eq!(top, vec![0, 1], "cosines 1.0 and 0.995 stay first");
        let mut top =
            index.candidates(&[1.0, 0.0], (2, 1, 2), |item| item < 2, (1.0, |t: &Trend| t.score as f32));
        top.sort_unstable();
        assert_eq!(top, vec![2, 4], "row 4's trend lifts it past row 3");
        assert_eq!(quantize(&[0.0, 0.0]), (vec![0, 0], 0.0));
    }

    #[test]
    fn every_copy_of_the_dot_product_returns_the_exact_sum() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut code = move || {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (((state >> 33) % 255) as i32 - 127) as i8
        };
        for len in [0usize, 1, 15, 16, 17, 31, 32, 33, 64, 128, 129, 300, 4096] {
            let a: Vec<i8> = (0..len).map(|_| code()).collect();
            let b: Vec<i8> = (0..len).map(|_| code()).collect();
            let naive: i32 = a.iter().zip(&b).map(|(x, y)| i32::from(*x) * i32::from(*y)).sum();
            assert_eq!(dot_codes_lanes(&a, &b), naive, "portable, {len} dims");
            assert_eq!(dot_codes(&a, &b), naive, "dispatched, {len} dims");
        }
        // The largest products in every lane: -127 * -127 fits the 16-bit product, the sum 32 bits.
        let extreme = vec![-127i8; 4096];
        assert_eq!(dot_codes(&extreme, &extreme), 4096 * 127 * 127);
        assert_eq!(dot_codes_lanes(&extreme, &extreme), 4096 * 127 * 127);
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
        assert_eq!(decode_centroids(&encoded, 2).unwrap(), forward);
        assert!(decode_centroids(&encoded, 3).is_err());
        assert!(decode_centroids(&encoded[..20], 2).is_err());
    }
}
