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
//! - Once the catalogue is large enough the index also keeps an [`AnnIndex`] over its rows and a
//!   [`TrendOrder`] of its scores (decisions/067), changed in the same calls as the rows, so they
//!   always describe exactly the rows and scores held here.

use std::sync::{Arc, Mutex};

use crate::ann_index::AnnIndex;
use crate::counters::ItemCounts;
use crate::dirty_set::Mark;
use crate::fast_hash::FastMap;
use crate::trend::Trend;
use crate::trend_order::TrendOrder;

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
    /// The approximate index over the rows, once the centroids exist (decisions/067).
    ann: Option<AnnIndex>,
    /// The positive trending scores in decayed order; kept with `ann`.
    trend_order: Option<TrendOrder>,
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
            ann: None,
            trend_order: None,
        }
    }

    /// Starts the approximate index over `centroids` (`lists x dimension` unit-norm values) and
    /// puts every row in its list: `lists` dot products per row, on up to two threads, with a
    /// progress line in the log every [`ASSIGN_PROGRESS_ROWS`] rows.
    pub fn install_ann(&mut self, centroids: Vec<f32>, half_life_ms: u64) {
        let started = std::time::Instant::now();
        let mut ann = AnnIndex::new(self.dimension, centroids);
        let lists = assign_rows(&ann, &self.matrix, self.dimension);
        for (row, list) in lists.into_iter().enumerate() {
            let vector = &self.matrix[row * self.dimension..(row + 1) * self.dimension];
            ann.insert(row, list, (self.ids[row], self.row_trends[row]), vector);
        }
        let mut order = TrendOrder::new(half_life_ms);
        for (item, entry) in &self.trending {
            order.update(*item, None, Some(entry.trend));
        }
        let seconds = started.elapsed().as_secs_f64();
        tracing::info!(
            rows = self.ids.len(),
            lists = ann.lists(),
            seconds,
            rows_per_second = (self.ids.len() as f64 / seconds.max(1e-9)) as u64,
            "approximate feed index built"
        );
        self.ann = Some(ann);
        self.trend_order = Some(order);
    }

    /// The approximate index, once it exists.
    pub fn ann(&self) -> Option<&AnnIndex> {
        self.ann.as_ref()
    }

    /// The positive trending scores in decayed order, with the approximate index.
    pub fn trend_order(&self) -> Option<&TrendOrder> {
        self.trend_order.as_ref()
    }

    /// Row `row` as (item id, raw vector, inverse norm, trend).
    pub fn row(&self, row: usize) -> (u64, &[f32], f64, Option<Trend>) {
        let dimension = self.dimension;
        (
            self.ids[row],
            &self.matrix[row * dimension..(row + 1) * dimension],
            self.inv_norms[row],
            self.row_trends[row],
        )
    }

    /// The row of an item's embedding.
    pub fn row_of(&self, item: u64) -> Option<usize> {
        self.rows.get(&item).copied()
    }

    /// Estimated heap bytes of the embeddings (matrix, ids, norms, the row map) and of the
    /// approximate index with its trend order; the trending scores are not counted.
    pub fn bytes(&self) -> (usize, usize) {
        let rows = self.ids.capacity() * 8
            + self.matrix.capacity() * 4
            + self.inv_norms.capacity() * 8
            + self.row_trends.capacity() * std::mem::size_of::<Option<Trend>>()
            + self.rows.capacity() * 24;
        let ann = self.ann.as_ref().map_or(0, AnnIndex::bytes)
            + self.trend_order.as_ref().map_or(0, TrendOrder::bytes);
        (rows, ann)
    }

    /// Drops everything about an item; returns the dirty mark of its trending score and its
    /// counts, if it had a score.
    pub fn remove_item(&mut self, item: u64) -> Option<(Mark, ItemCounts)> {
        self.generation += 1;
        self.remove_embedding(item);
        let removed = self.trending.remove(&item)?;
        if let Some(order) = &mut self.trend_order {
            order.update(item, Some(removed.trend), None);
        }
        Some((removed.mark, removed.counts))
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
                if let Some(ann) = &mut self.ann {
                    // Even in the same list: its 8-bit copy changes with the vector.
                    ann.remove(row);
                    ann.insert(row, ann.nearest_list(vector), (item, self.row_trends[row]), vector);
                }
            }
            None => {
                if let Some(ann) = &mut self.ann {
                    let trend = self.trending.get(&item).map(|entry| entry.trend);
                    ann.insert(self.ids.len(), ann.nearest_list(vector), (item, trend), vector);
                }
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
        let FeedIndex { dimension, rows, matrix, row_trends, trending, generation, trend_order, ann, .. } =
            self;
        let rows = &*rows;
        (
            ScoresMut { rows, row_trends, trending, generation, trend_order, ann },
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
        if let Some(ann) = &mut self.ann {
            ann.remove(row);
            if row == last {
                ann.pop();
            } else {
                ann.renumber(last, row);
            }
        }
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
    trend_order: &'a mut Option<TrendOrder>,
    ann: &'a mut Option<AnnIndex>,
}

impl<'a> ScoresMut<'a> {
    /// [`FeedIndex::set_trend`].
    pub fn set_trend(&mut self, item: u64, trend: Trend) -> &mut Mark {
        ScoresMut {
            rows: self.rows,
            row_trends: &mut *self.row_trends,
            trending: &mut *self.trending,
            generation: &mut *self.generation,
            trend_order: &mut *self.trend_order,
            ann: &mut *self.ann,
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
            if let Some(ann) = self.ann {
                ann.set_trend(row, trend);
            }
        }
        let mut old = None;
        let entry = self
            .trending
            .entry(item)
            .and_modify(|entry| old = Some(entry.trend))
            .or_insert(TrendEntry { trend, mark: Mark::CLEAN, counts: ItemCounts::default() });
        if let Some(order) = self.trend_order {
            order.update(item, old, Some(trend));
        }
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

/// Rows between two progress lines of [`assign_rows`]: about five seconds of work on two cores
/// at 1024 lists of 128 dimensions (1M rows took 22 s).
pub const ASSIGN_PROGRESS_ROWS: usize = 1 << 18;

/// The list of every row of `matrix`, on up to two threads (the scan's bound), logging progress.
fn assign_rows(ann: &AnnIndex, matrix: &[f32], dimension: usize) -> Vec<u32> {
    let rows = matrix.len() / dimension.max(1);
    let started = std::time::Instant::now();
    let mut lists = vec![0u32; rows];
    for (chunk, out) in lists.chunks_mut(ASSIGN_PROGRESS_ROWS).enumerate() {
        let first = chunk * ASSIGN_PROGRESS_ROWS;
        let half = out.len().div_ceil(2);
        let (a, b) = out.split_at_mut(half);
        let assign = |out: &mut [u32], first: usize| {
            for (offset, list) in out.iter_mut().enumerate() {
                let row = first + offset;
                *list = ann.nearest_list(&matrix[row * dimension..(row + 1) * dimension]);
            }
        };
        std::thread::scope(|scope| {
            scope.spawn(|| assign(b, first + half));
            assign(a, first);
        });
        let done = first + out.len();
        if done < rows {
            let rate = done as f64 / started.elapsed().as_secs_f64().max(1e-9);
            tracing::info!(done, rows, rows_per_second = rate as u64, "building the approximate feed index");
        }
    }
    lists
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
