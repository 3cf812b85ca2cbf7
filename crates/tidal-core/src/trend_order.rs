//! [`TrendOrder`]: the items with a positive trending score, ordered by that score at any "now",
//! so the approximate feed can add the hottest items to its candidates without scanning every
//! score (decisions/067).
//!
//! Delicate: a score decays as `s * 2^(-(now - ref) / half_life)`, so for two positive scores the
//! order at any "now" past both references is the order of `log2(s) + ref / half_life`: the key
//! does not depend on "now" and the set stays sorted without being touched as time passes. A score
//! whose reference is in the future (a signal's own `ts`) is read undecayed, so the key only
//! approximates its rank; that only changes which items are candidates, and the choice is still a
//! pure function of the scores (ties by item id), so every node makes it alike. Candidates are
//! scored exactly.

use std::collections::BTreeSet;

use crate::trend::Trend;

/// Items with a positive trending score, hottest first.
#[derive(Debug)]
pub struct TrendOrder {
    half_life_ms: u64,
    /// (descending key as sortable bits, item id).
    order: BTreeSet<(u64, u64)>,
}

impl TrendOrder {
    /// An empty order for scores decaying with `half_life_ms`.
    pub fn new(half_life_ms: u64) -> TrendOrder {
        TrendOrder { half_life_ms, order: BTreeSet::new() }
    }

    /// Replaces `item`'s score `old` (if it had one) by `new` (`None`: removed).
    pub fn update(&mut self, item: u64, old: Option<Trend>, new: Option<Trend>) {
        if let Some(key) = old.and_then(|trend| self.key(trend)) {
            self.order.remove(&(key, item));
        }
        if let Some(key) = new.and_then(|trend| self.key(trend)) {
            self.order.insert((key, item));
        }
    }

    /// Items, hottest first (ties by item id).
    pub fn hottest(&self) -> impl Iterator<Item = u64> + '_ {
        self.order.iter().map(|(_, item)| *item)
    }

    /// Number of items held.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Estimated heap bytes (a B-tree entry of 16 bytes with its share of node overhead).
    pub fn bytes(&self) -> usize {
        self.order.len() * 24
    }

    /// The sortable key of a positive score: ascending bits for descending `log2(s) + ref / hl`.
    fn key(&self, trend: Trend) -> Option<u64> {
        let score = crate::trend::saturate(trend.score);
        if score <= 0.0 {
            return None;
        }
        let rank = score.log2() + trend.ref_ms as f64 / self.half_life_ms as f64;
        // IEEE order as unsigned bits (negatives flipped), then inverted for descending order.
        let bits = rank.to_bits();
        let ascending = if bits >> 63 == 1 { !bits } else { bits | 1 << 63 };
        Some(!ascending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: u64 = 3_600_000;

    #[test]
    fn the_order_is_the_order_of_decayed_scores() {
        let mut order = TrendOrder::new(HOUR);
        let trends = [
            (1, Trend { score: 4.0, ref_ms: 0 }),
            (2, Trend { score: 1.0, ref_ms: 2 * HOUR as i64 }),
            (3, Trend { score: 0.5, ref_ms: 3 * HOUR as i64 }),
            (4, Trend { score: -9.0, ref_ms: 0 }),
            (5, Trend { score: 0.001, ref_ms: 0 }),
        ];
        for (item, trend) in trends {
            order.update(item, None, Some(trend));
        }
        assert_eq!(order.len(), 4, "a negative score is not held");
        let now = 5 * HOUR as i64;
        let mut by_score: Vec<(u64, f64)> = trends
            .iter()
            .map(|(item, trend)| (*item, trend.score_at(now, HOUR)))
            .filter(|e| e.1 > 0.0)
            .collect();
        by_score.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let expected: Vec<u64> = by_score.iter().map(|e| e.0).collect();
        assert_eq!(order.hottest().collect::<Vec<_>>(), expected, "scores at now: {by_score:?}");
        order.update(1, Some(trends[0].1), None);
        order.update(5, Some(trends[4].1), Some(Trend { score: 1e9, ref_ms: 0 }));
        assert_eq!(order.hottest().next(), Some(5));
        assert_eq!(order.len(), 3);
    }
}
