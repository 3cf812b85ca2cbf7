//! The in-memory ranking index, [`FeedIndex`]: every embedding in one contiguous f32 matrix, and
//! every trending score, mirrored from fjall.
//!
//! Delicate:
//! - It is a cache of the applied state, never a source: rebuilt from fjall on open, and changed
//!   only by `apply`, under the state write lock, together with the write-back overlay. A reader
//!   holding the read lock therefore sees the overlay, fjall and the index at one applied seqno.
//!   A flush encodes dirty embeddings and trending scores from here.
//! - Row order depends on history (removal swaps the last row in), so nothing may depend on it:
//!   every ranking sorts by (score, item id).
//! - Vectors are kept raw (not normalized), with the inverse norm beside them, so the fold can add
//!   the exact logged embedding to a profile while ranking still costs one dot product per row.

use std::sync::{Arc, Mutex};

use crate::counters::ItemCounts;
use crate::dirty_set::Mark;
use crate::fast_hash::FastMap;
use crate::trend::Trend;

/// Embeddings and trending scores for ranking.
#[derive(Debug)]
pub struct FeedIndex {
    dimension: usize,
    /// Item id of each row.
    ids: Vec<u64>,
    /// Row of each item id.
    rows: FastMap<u64, usize>,
    /// `ids.len() x dimension` raw embedding values.
    matrix: Vec<f32>,
    /// `1 / |row|`, or 0 for a zero vector (its cosine with anything is 0).
    inv_norms: Vec<f64>,
    /// Trending score of each row's item, so the feed loop does no hashing.
    row_trends: Vec<Option<Trend>>,
    /// Trending score of every item that has one, with the applier's dirty mark (`DirtySet`) and
    /// the item's counters of the first signal kinds (`counters.rs`: the fold finds them with the
    /// lookup it makes for the score).
    trending: FastMap<u64, TrendEntry>,
    /// Bumped by every change, so caches can tell they are stale.
    generation: u64,
    /// Row-aligned trending terms at some "now", computed by the first feed after a change and
    /// shared by the feeds that follow until the next apply.
    term_cache: Mutex<Option<TermCache>>,
}

#[derive(Debug)]
struct TrendEntry {
    trend: Trend,
    mark: Mark,
    counts: ItemCounts,
}

#[derive(Debug)]
struct TermCache {
    generation: u64,
    now_ms: i64,
    half_life_ms: u64,
    terms: Arc<Vec<f64>>,
}

impl FeedIndex {
    /// An empty index for vectors of `dimension`.
    pub fn new(dimension: usize) -> FeedIndex {
        FeedIndex {
            dimension,
            ids: Vec::new(),
            rows: FastMap::default(),
            matrix: Vec::new(),
            inv_norms: Vec::new(),
            row_trends: Vec::new(),
            trending: FastMap::default(),
            generation: 0,
            term_cache: Mutex::new(None),
        }
    }

    /// Drops everything about an item; returns the dirty mark of its trending score and its
    /// counts, if it had a score.
    pub fn remove_item(&mut self, item: u64) -> Option<(Mark, ItemCounts)> {
        self.generation += 1;
        self.remove_embedding(item);
        self.trending.remove(&item).map(|entry| (entry.mark, entry.counts))
    }

    /// Row-aligned trending terms `sign(s) * ln(1 + |s|)` of the scores decayed to `now_ms` (0 for
    /// rows without a score). Cached until the index changes.
    pub fn row_terms(&self, now_ms: i64, half_life_ms: u64) -> Arc<Vec<f64>> {
        let fresh = |cache: &TermCache| {
            cache.generation == self.generation
                && cache.now_ms == now_ms
                && cache.half_life_ms == half_life_ms
        };
        if let Some(cache) = self.term_cache.lock().expect("term cache lock poisoned").as_ref() {
            if fresh(cache) {
                return cache.terms.clone();
            }
        }
        let terms: Arc<Vec<f64>> = Arc::new(
            self.row_trends
                .iter()
                .map(|trend| trend.map_or(0.0, |t| Trend::term(t.score_at(now_ms, half_life_ms))))
                .collect(),
        );
        let generation = self.generation;
        *self.term_cache.lock().expect("term cache lock poisoned") =
            Some(TermCache { generation, now_ms, half_life_ms, terms: terms.clone() });
        terms
    }

    /// Inserts or replaces an embedding.
    pub fn set_embedding(&mut self, item: u64, vector: &[f32]) {
        self.generation += 1;
        assert_eq!(
            vector.len(),
            self.dimension,
            "embedding of item {item} has {} values, index dimension {}",
            vector.len(),
            self.dimension
        );
        let inv_norm = inverse_norm(vector);
        match self.rows.get(&item) {
            Some(&row) => {
                self.row_mut(row).copy_from_slice(vector);
                self.inv_norms[row] = inv_norm;
            }
            None => {
                self.rows.insert(item, self.ids.len());
                self.ids.push(item);
                self.matrix.extend_from_slice(vector);
                self.inv_norms.push(inv_norm);
                self.row_trends.push(self.trend(item));
            }
        }
    }

    /// Sets a trending score; returns its dirty mark, for the applier's `DirtySet`.
    pub fn set_trend(&mut self, item: u64, trend: Trend) -> &mut Mark {
        self.split_for_signals().0.into_set_trend(item, trend)
    }

    /// The index split for a signal batch's merge (experiments/047): its scores and counts, which
    /// the merge changes, and its embeddings, which the profile fold only reads. The two touch
    /// disjoint fields, so the two folds can run at the same time.
    pub fn split_for_signals(&mut self) -> (ScoresMut<'_>, Embeddings<'_>) {
        let FeedIndex { dimension, rows, matrix, row_trends, trending, generation, .. } = self;
        let rows = &*rows;
        (
            ScoresMut { rows, row_trends, trending, generation },
            Embeddings { dimension: *dimension, rows, matrix },
        )
    }

    /// Forgets every trending score's dirty mark (after the dirty set's window counter wrapped).
    pub fn clear_trend_marks(&mut self) {
        for entry in self.trending.values_mut() {
            entry.mark = Mark::CLEAN;
        }
    }

    /// Forgets every counter's dirty mark (after the counters' dirty set wrapped).
    pub fn clear_count_marks(&mut self) {
        for entry in self.trending.values_mut() {
            entry.counts.clear_marks();
        }
    }

    /// The counters of an item that has a trending score.
    pub fn counts_mut(&mut self, item: u64) -> Option<&mut ItemCounts> {
        self.trending.get_mut(&item).map(|entry| &mut entry.counts)
    }

    /// The raw embedding of an item.
    pub fn embedding(&self, item: u64) -> Option<&[f32]> {
        Embeddings { dimension: self.dimension, rows: &self.rows, matrix: &self.matrix }.get(item)
    }

    /// The trending score of an item.
    pub fn trend(&self, item: u64) -> Option<Trend> {
        self.trending.get(&item).map(|entry| entry.trend)
    }

    /// Number of embeddings.
    pub fn embeddings(&self) -> usize {
        self.ids.len()
    }

    /// Number of items with a trending score.
    pub fn trending_items(&self) -> usize {
        self.trending.len()
    }

    /// Every trending score, in no particular order.
    pub fn trends(&self) -> impl Iterator<Item = (u64, Trend)> + '_ {
        self.trending.iter().map(|(item, entry)| (*item, entry.trend))
    }

    /// Every row as (item id, raw vector, inverse norm, trend), in row order (not meaningful).
    #[cfg(test)]
    pub fn rows(&self) -> impl Iterator<Item = (u64, &[f32], f64, Option<Trend>)> + '_ {
        self.rows_in(0..self.ids.len())
    }

    /// Rows `range` as in [`FeedIndex::rows`]; `range` must lie within `0..embeddings()`.
    pub fn rows_in(
        &self,
        range: std::ops::Range<usize>,
    ) -> impl Iterator<Item = (u64, &[f32], f64, Option<Trend>)> + '_ {
        let dimension = self.dimension.max(1);
        self.ids[range.clone()]
            .iter()
            .zip(self.matrix[range.start * dimension..range.end * dimension].chunks_exact(dimension))
            .zip(self.inv_norms[range.clone()].iter().zip(self.row_trends[range].iter()))
            .map(|((id, row), (inv, trend))| (*id, row, *inv, *trend))
    }

    /// A mask over rows, true for the rows of `items` (items without a row are ignored).
    pub fn row_mask<'a>(&self, items: impl IntoIterator<Item = &'a u64>) -> Vec<bool> {
        let mut mask = vec![false; self.ids.len()];
        for item in items {
            if let Some(&row) = self.rows.get(item) {
                mask[row] = true;
            }
        }
        mask
    }

    /// Inverse norm of an item's embedding.
    pub fn inverse_norm_of(&self, item: u64) -> Option<f64> {
        self.rows.get(&item).map(|&row| self.inv_norms[row])
    }

    fn remove_embedding(&mut self, item: u64) {
        let Some(row) = self.rows.remove(&item) else { return };
        let last = self.ids.len() - 1;
        if row != last {
            let moved = self.ids[last];
            let (head, tail) = self.matrix.split_at_mut(last * self.dimension);
            head[row * self.dimension..(row + 1) * self.dimension].copy_from_slice(&tail[..self.dimension]);
            self.ids[row] = moved;
            self.inv_norms[row] = self.inv_norms[last];
            self.row_trends[row] = self.row_trends[last];
            self.rows.insert(moved, row);
        }
        self.ids.truncate(last);
        self.inv_norms.truncate(last);
        self.row_trends.truncate(last);
        self.matrix.truncate(last * self.dimension);
    }

    fn row_mut(&mut self, row: usize) -> &mut [f32] {
        &mut self.matrix[row * self.dimension..(row + 1) * self.dimension]
    }
}

/// The scores side of [`FeedIndex::split_for_signals`]: trending scores with their dirty marks
/// and counts.
pub struct ScoresMut<'a> {
    rows: &'a FastMap<u64, usize>,
    row_trends: &'a mut Vec<Option<Trend>>,
    trending: &'a mut FastMap<u64, TrendEntry>,
    generation: &'a mut u64,
}

impl<'a> ScoresMut<'a> {
    /// [`FeedIndex::set_trend`].
    pub fn set_trend(&mut self, item: u64, trend: Trend) -> &mut Mark {
        ScoresMut {
            rows: self.rows,
            row_trends: &mut *self.row_trends,
            trending: &mut *self.trending,
            generation: &mut *self.generation,
        }
        .into_set_trend(item, trend)
    }

    /// [`FeedIndex::counts_mut`].
    pub fn counts_mut(&mut self, item: u64) -> Option<&mut ItemCounts> {
        self.trending.get_mut(&item).map(|entry| &mut entry.counts)
    }

    fn into_set_trend(self, item: u64, trend: Trend) -> &'a mut Mark {
        *self.generation += 1;
        if let Some(&row) = self.rows.get(&item) {
            self.row_trends[row] = Some(trend);
        }
        let entry = self.trending.entry(item).or_insert(TrendEntry {
            trend,
            mark: Mark::CLEAN,
            counts: ItemCounts::default(),
        });
        entry.trend = trend;
        &mut entry.mark
    }
}

/// The embeddings side of [`FeedIndex::split_for_signals`], read only.
#[derive(Clone, Copy)]
pub struct Embeddings<'a> {
    dimension: usize,
    rows: &'a FastMap<u64, usize>,
    matrix: &'a [f32],
}

impl<'a> Embeddings<'a> {
    /// [`FeedIndex::embedding`].
    pub fn get(&self, item: u64) -> Option<&'a [f32]> {
        let dimension = self.dimension;
        self.rows.get(&item).map(|&row| &self.matrix[row * dimension..(row + 1) * dimension])
    }
}

/// `1 / |v|` computed in f64, or 0 for a zero vector.
pub fn inverse_norm(vector: &[f32]) -> f64 {
    let squared: f64 = vector.iter().map(|v| f64::from(*v) * f64::from(*v)).sum();
    if squared > 0.0 {
        1.0 / squared.sqrt()
    } else {
        0.0
    }
}

/// Dot product with eight independent f32 lanes, so the compiler vectorizes it. The summation order
/// is fixed by this code, so every node computes the same bits.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 8;
    let mut acc = [0f32; LANES];
    let chunks_a = a.chunks_exact(LANES);
    let chunks_b = b.chunks_exact(LANES);
    let (rest_a, rest_b) = (chunks_a.remainder(), chunks_b.remainder());
    for (x, y) in chunks_a.zip(chunks_b) {
        let x: &[f32; LANES] = x.try_into().expect("chunks_exact yields LANES values");
        let y: &[f32; LANES] = y.try_into().expect("chunks_exact yields LANES values");
        for lane in 0..LANES {
            acc[lane] += x[lane] * y[lane];
        }
    }
    let mut sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in rest_a.iter().zip(rest_b) {
        sum += x * y;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removal_keeps_rows_consistent() {
        let mut index = FeedIndex::new(2);
        for item in 0..5u64 {
            index.set_embedding(item, &[item as f32, 1.0]);
        }
        index.remove_item(1);
        index.remove_item(4);
        index.set_embedding(2, &[9.0, 9.0]);
        assert_eq!(index.embeddings(), 3);
        assert_eq!(index.embedding(0), Some(&[0.0, 1.0][..]));
        assert_eq!(index.embedding(2), Some(&[9.0, 9.0][..]));
        assert_eq!(index.embedding(3), Some(&[3.0, 1.0][..]));
        assert_eq!(index.embedding(1), None);
        index.set_trend(3, Trend::first(5, 1.0));
        index.set_trend(77, Trend::first(5, 2.0));
        for (item, row, inv, trend) in index.rows() {
            assert_eq!(index.embedding(item), Some(row));
            assert_eq!(inv, inverse_norm(row));
            assert_eq!(trend, index.trend(item).filter(|_| item == 3));
        }
        index.set_embedding(77, &[1.0, 1.0]);
        assert_eq!(index.rows().last().map(|r| r.3), Some(Some(Trend::first(5, 2.0))));
        let mask = index.row_mask(&[3, 1000]);
        assert_eq!(mask.iter().filter(|m| **m).count(), 1);
    }

    /// A trending entry with its key fills one cache line: the fold's lookup of an item's score
    /// brings its counts along (experiments/038).
    #[test]
    fn a_trending_slot_is_one_cache_line() {
        assert_eq!(std::mem::size_of::<(u64, TrendEntry)>(), 64);
    }

    #[test]
    fn dot_matches_the_naive_sum_on_small_integers() {
        let a: Vec<f32> = (0..19).map(|v| v as f32).collect();
        let b: Vec<f32> = (0..19).map(|v| (v % 3) as f32).collect();
        let naive: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert_eq!(dot(&a, &b), naive);
        assert_eq!(inverse_norm(&[0.0, 0.0]), 0.0);
        assert_eq!(inverse_norm(&[3.0, 4.0]), 0.2);
    }
}
