//! Ranked lists ([`Ranked`]) and the ranking loops over a [`FeedIndex`]: feed, similar, trending.
//!
//! Delicate: feed parity. Two nodes at the same applied seqno must return the same list with equal
//! scores, so "now" is the logged time of the last applied batch (never a clock), ties are broken by
//! item id, and the arithmetic is fixed (f32 dot products in a fixed lane order, the rest in f64).
//! The loops touch every row: keep them free of allocation and hashing where possible.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashSet};

use tidal_types::Seqno;

use crate::ann_index::AnnIndex;
use crate::fast_hash::FastMap;
use crate::feed_index::{dot, inverse_norm, FeedIndex};
use crate::trend::{saturate, Trend};
use crate::trend_order::TrendOrder;

/// Most entries any ranked list returns: bounds the heap and the reply.
pub const RANKED_LIMIT_MAX: usize = 1000;
/// Most threads one ranking scan uses. The scan is memory-bound (100k x 128 f32 is 51 MB per
/// query); two threads use both cores of the small boxes we target. Results do not depend on it:
/// each part keeps its own top-k and the merge sorts by the same total order.
pub const SCAN_THREADS_MAX: usize = 2;
/// Fewest rows per scan thread: below this a thread costs more than it saves.
const SCAN_ROWS_PER_THREAD_MIN: usize = 16_384;

/// One entry of a ranked list.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RankedEntry {
    /// Item id.
    pub item: u64,
    /// The combined score the list is sorted by.
    pub score: f64,
    /// Cosine similarity part (0 where it does not apply).
    pub similarity: f64,
    /// Trending part (0 where it does not apply).
    pub trending: f64,
}

/// A ranked list, best first, with the applied frontier it was computed at.
#[derive(Clone, Debug, PartialEq)]
pub struct Ranked {
    /// Entries, by score descending then item id ascending.
    pub items: Vec<RankedEntry>,
    /// Applied seqno of the state that produced the list.
    pub applied_seqno: Seqno,
}

/// What a ranking needs besides the index.
pub struct RankParams<'a> {
    /// "now": logged time of the last applied batch.
    pub now_ms: i64,
    /// Trending half-life.
    pub half_life_ms: u64,
    /// `a`.
    pub similarity_weight: f64,
    /// `b`.
    pub trending_weight: f64,
    /// Items never to return.
    pub excluded: &'a HashSet<u64>,
    /// Entries wanted (already capped).
    pub limit: usize,
}

/// Feed: every item with an embedding, scored `a * cosine(profile, e) + b * trending term`.
pub fn rank_feed(index: &FeedIndex, profile: Option<&[f32]>, params: &RankParams<'_>) -> Vec<RankedEntry> {
    let profile_inv = profile.map(inverse_norm).unwrap_or(0.0);
    let excluded = index.row_mask(params.excluded);
    let terms = index.row_terms(params.now_ms, params.half_life_ms);
    scan(index.embeddings(), params.limit, |range, top| {
        let rows = index.rows_in(range.clone()).zip(&excluded[range.clone()]).zip(&terms[range]);
        for (((item, row, row_inv, _), excluded), trending) in rows {
            if *excluded {
                continue;
            }
            let similarity = match profile {
                Some(profile) if profile_inv > 0.0 => cosine(profile, row, row_inv, profile_inv),
                _ => 0.0,
            };
            let trending = *trending;
            let score = params.similarity_weight * similarity + params.trending_weight * trending;
            top.push(RankedEntry { item, score, similarity, trending });
        }
    })
}

/// Hottest items (by trending score) an approximate feed adds to its candidates, per entry wanted:
/// an item far from the profile can still rank by its trending term, and the lists near the profile
/// would not hold it.
const TRENDING_CANDIDATES_PER_LIMIT: usize = 2;
/// Entries of highest estimated cosine scored exactly, per entry wanted: the 8-bit estimate is
/// off by about a percent, and the trending term can lift an entry a little below the top.
const RESCORED_PER_LIMIT: usize = 10;
/// Fewest entries scored exactly, for small limits.
const RESCORED_MIN: usize = 200;

/// [`rank_feed`] over the candidates of the approximate index (decisions/067): the entries of
/// highest estimated cosine in the lists nearest `profile` (at least `probes` lists, more until
/// `limit` entries survive the exclusions) and the hottest items, each scored exactly as
/// [`rank_feed`] scores it (same functions, same bits). `profile` must have a non-zero norm.
pub fn rank_feed_ann(
    index: &FeedIndex,
    (ann, order): (&AnnIndex, &TrendOrder),
    profile: &[f32],
    params: &RankParams<'_>,
    probes: usize,
) -> Vec<RankedEntry> {
    let profile_inv = inverse_norm(profile);
    let score_row = |row: usize| {
        let (item, vector, row_inv, trend) = index.row(row);
        let similarity = cosine(profile, vector, row_inv, profile_inv);
        let trending = trend.map_or(0.0, |t| Trend::term(t.score_at(params.now_ms, params.half_life_ms)));
        let score = params.similarity_weight * similarity + params.trending_weight * trending;
        RankedEntry { item, score, similarity, trending }
    };
    let limit = params.limit.min(RANKED_LIMIT_MAX);
    let mut top = TopK::new(limit);
    // The hottest items first, remembered so the lists do not score them twice.
    // Every item the lists must skip, in one fast map: the lists test tens of thousands of
    // entries, and the caller's set hashes with SipHash (a visible share of a query).
    let mut skipped: FastMap<u64, ()> = params.excluded.iter().map(|item| (*item, ())).collect();
    let mut taken = 0usize;
    for item in order.hottest() {
        if taken >= limit * TRENDING_CANDIDATES_PER_LIMIT {
            break;
        }
        if params.excluded.contains(&item) {
            continue;
        }
        if let Some(row) = index.row_of(item) {
            top.push(score_row(row));
            skipped.insert(item, ());
            taken += 1;
        }
    }
    let wanted = (limit * RESCORED_PER_LIMIT).max(RESCORED_MIN);
    let skip = |item: u64| skipped.contains_key(&item);
    // The estimate is the feed's score with the estimated cosine: the trending term can lift an
    // entry past others that are nearer the profile.
    let term = |trend: &Trend| {
        (params.trending_weight * Trend::term(trend.score_at(params.now_ms, params.half_life_ms))) as f32
    };
    let estimate = (params.similarity_weight as f32, term);
    for row in ann.candidates(profile, (probes, limit, wanted), skip, estimate) {
        top.push(score_row(row as usize));
    }
    top.into_sorted()
}

/// [`rank_similar`] over the entries of highest estimated cosine in the lists nearest the item's
/// embedding, scored exactly; `None` if the item has no embedding.
pub fn rank_similar_ann(
    index: &FeedIndex,
    ann: &AnnIndex,
    item: u64,
    limit: usize,
    probes: usize,
) -> Option<Vec<RankedEntry>> {
    let query = index.embedding(item)?;
    let query_inv = index.inverse_norm_of(item)?;
    let limit = limit.min(RANKED_LIMIT_MAX);
    let mut top = TopK::new(limit);
    let wanted = (limit * RESCORED_PER_LIMIT).max(RESCORED_MIN);
    for row in ann.candidates(query, (probes, limit, wanted), |other| other == item, (1.0, |_: &Trend| 0.0)) {
        let (other, vector, row_inv, _) = index.row(row as usize);
        let similarity = cosine(query, vector, row_inv, query_inv);
        top.push(RankedEntry { item: other, score: similarity, similarity, trending: 0.0 });
    }
    Some(top.into_sorted())
}

/// `cos(query, row)` from the inverse norms. The f32 dot product overflows for vectors of large values
/// (a profile saturated at `f32::MAX`, an embedding of `1e30`s), which made a score infinite or NaN
/// (`null` in the API): only then is it computed again in f64, where it cannot overflow (values of at
/// most `f32::MAX` squared, summed over at most `DIMENSION_MAX` lanes). Every finite result keeps its
/// bits, and the fallback has a fixed order, so every node ranks alike.
fn cosine(query: &[f32], row: &[f32], row_inv: f64, query_inv: f64) -> f64 {
    let similarity = f64::from(dot(query, row)) * row_inv * query_inv;
    if similarity.is_finite() {
        return similarity;
    }
    let wide: f64 = query.iter().zip(row).map(|(q, r)| f64::from(*q) * f64::from(*r)).sum();
    saturate(wide * row_inv * query_inv)
}

/// Runs `part` over row ranges covering `0..rows`, on up to [`SCAN_THREADS_MAX`] threads, and
/// merges their top-k lists.
fn scan<F>(rows: usize, limit: usize, part: F) -> Vec<RankedEntry>
where
    F: Fn(std::ops::Range<usize>, &mut TopK) + Sync,
{
    let threads = (rows / SCAN_ROWS_PER_THREAD_MIN).clamp(1, SCAN_THREADS_MAX);
    if threads == 1 {
        let mut top = TopK::new(limit);
        part(0..rows, &mut top);
        return top.into_sorted();
    }
    let chunk = rows.div_ceil(threads);
    let mut merged = TopK::new(limit);
    std::thread::scope(|scope| {
        let part = &part;
        let handles: Vec<_> = (1..threads)
            .map(|t| {
                scope.spawn(move || {
                    let mut top = TopK::new(limit);
                    part(t * chunk..((t + 1) * chunk).min(rows), &mut top);
                    top
                })
            })
            .collect();
        part(0..chunk.min(rows), &mut merged);
        for handle in handles {
            let top = handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            for entry in top.heap {
                merged.push(entry.0);
            }
        }
    });
    merged.into_sorted()
}

/// Nearest neighbours of `item` by cosine; `None` if it has no embedding.
pub fn rank_similar(index: &FeedIndex, item: u64, limit: usize) -> Option<Vec<RankedEntry>> {
    let query = index.embedding(item)?;
    let query_inv = index.inverse_norm_of(item)?;
    Some(scan(index.embeddings(), limit, |range, top| {
        for (other, row, row_inv, _) in index.rows_in(range) {
            if other == item {
                continue;
            }
            let similarity = cosine(query, row, row_inv, query_inv);
            top.push(RankedEntry { item: other, score: similarity, similarity, trending: 0.0 });
        }
    }))
}

/// Items by trending term at `now_ms`.
pub fn rank_trending(index: &FeedIndex, now_ms: i64, half_life_ms: u64, limit: usize) -> Vec<RankedEntry> {
    let mut top = TopK::new(limit);
    for (item, trend) in index.trends() {
        let trending = Trend::term(trend.score_at(now_ms, half_life_ms));
        top.push(RankedEntry { item, score: trending, similarity: 0.0, trending });
    }
    top.into_sorted()
}

/// Keeps the best `limit` entries seen; the heap's top is the worst kept.
struct TopK {
    limit: usize,
    heap: BinaryHeap<Worst>,
}

impl TopK {
    fn new(limit: usize) -> TopK {
        let limit = limit.min(RANKED_LIMIT_MAX);
        TopK { limit, heap: BinaryHeap::with_capacity(limit + 1) }
    }

    fn push(&mut self, entry: RankedEntry) {
        if self.limit == 0 {
            return;
        }
        if self.heap.len() == self.limit {
            let ranks_before_worst = self.heap.peek().is_some_and(|worst| Worst(entry) < *worst);
            if !ranks_before_worst {
                return;
            }
            self.heap.pop();
        }
        self.heap.push(Worst(entry));
    }

    fn into_sorted(self) -> Vec<RankedEntry> {
        // into_sorted_vec is ascending by Worst's order: best first.
        self.heap.into_sorted_vec().into_iter().map(|w| w.0).collect()
    }
}

/// Orders entries so the worst is the greatest: `Worst(a) < Worst(b)` iff `a` ranks before `b`
/// (higher score, then lower item id).
struct Worst(RankedEntry);

impl PartialEq for Worst {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Worst {}

impl PartialOrd for Worst {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Worst {
    fn cmp(&self, other: &Self) -> Ordering {
        other.0.score.total_cmp(&self.0.score).then(self.0.item.cmp(&other.0.item))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(item: u64, score: f64) -> RankedEntry {
        RankedEntry { item, score, similarity: 0.0, trending: 0.0 }
    }

    #[test]
    fn top_k_sorts_by_score_then_id() {
        let mut top = TopK::new(3);
        for (item, score) in [(5, 1.0), (3, 2.0), (4, 1.0), (1, 1.0), (2, 0.5), (9, 2.0)] {
            top.push(entry(item, score));
        }
        let items: Vec<u64> = top.into_sorted().iter().map(|e| e.item).collect();
        assert_eq!(items, vec![3, 9, 1]);
    }

    #[test]
    fn limit_zero_and_cap() {
        let mut top = TopK::new(0);
        top.push(entry(1, 1.0));
        assert!(top.into_sorted().is_empty());
        assert_eq!(TopK::new(usize::MAX).limit, RANKED_LIMIT_MAX);
    }

    #[test]
    fn a_cosine_of_huge_values_is_finite_and_ordinary_ones_keep_their_bits() {
        let huge = [f32::MAX, f32::MAX, -f32::MAX, 1e30];
        let inv = crate::feed_index::inverse_norm(&huge);
        assert!(!dot(&huge, &huge).is_finite(), "the f32 dot product overflows");
        let cos = cosine(&huge, &huge, inv, inv);
        assert!((cos - 1.0).abs() < 1e-9, "{cos}");
        let (a, b) = ([0.5f32, -1.0, 2.0, 0.25], [1.0f32, 0.5, -0.75, 3.0]);
        let (ia, ib) = (crate::feed_index::inverse_norm(&a), crate::feed_index::inverse_norm(&b));
        assert_eq!(cosine(&a, &b, ib, ia).to_bits(), (f64::from(dot(&a, &b)) * ib * ia).to_bits());
    }

    #[test]
    fn a_parallel_scan_equals_a_serial_one() {
        let rows = 3 * SCAN_ROWS_PER_THREAD_MIN + 7;
        let score = |row: usize| ((row * 7919) % 1000) as f64;
        let part = |range: std::ops::Range<usize>, top: &mut TopK| {
            for row in range {
                top.push(entry(row as u64, score(row)));
            }
        };
        let mut serial = TopK::new(50);
        part(0..rows, &mut serial);
        assert_eq!(scan(rows, 50, part), serial.into_sorted());
    }
}
