//! Exponential decay in logged time: the trending score [`Trend`] and the profile decay factor.
//!
//! A decayed value is stored as `(value at ref_ms, ref_ms)`. Adding `w` at time `t`:
//! - `t >= ref`: `s = s * 2^(-(t - ref) / half_life) + w`, `ref = t` (move the reference forward);
//! - `t < ref` (a late event): `s += w * 2^(-(ref - t) / half_life)` (decay the event to `ref`).
//!
//! Delicate: every node must compute bit-identical values, so the operations and their order are
//! fixed here, in f64, from logged times only; never reorder the arithmetic. Reading a score at a
//! "now" before its reference time returns it undecayed: we never extrapolate backwards.
//!
//! Saturation: a fold never makes a value infinite or NaN, whatever the log holds (the API bounds a
//! weight, but a WAL written by an older version may hold `1e308`, and two of those overflow). A
//! weight is [`finite_weight`]-ed before it is used and every result is [`saturate`]d: the largest
//! finite f64 instead of an infinity, 0 instead of a NaN. Both are the identity on every finite
//! value, so a fold that never overflowed computes the same bits it always did; and both are pure
//! functions of their input, so every node saturates alike.

/// Decay multiplier for `delta_ms` of elapsed logged time: `2^(-delta / half_life)`.
pub fn decay_factor(delta_ms: u64, half_life_ms: u64) -> f64 {
    // No time passed (every event of a batch without its own `ts` after the first): `2^(-0)` is
    // exactly 1, so skip the `exp2`. Bit-identical; a zero half-life (refused by the config) keeps
    // its NaN.
    if delta_ms == 0 && half_life_ms != 0 {
        return 1.0;
    }
    (-(delta_ms as f64) / half_life_ms as f64).exp2()
}

/// `x`, or the nearest finite value: +-inf to +-`f64::MAX`, NaN to 0. The identity on finite values.
#[inline]
pub fn saturate(x: f64) -> f64 {
    if x.is_nan() {
        0.0
    } else {
        x.clamp(-f64::MAX, f64::MAX)
    }
}

/// A weight as the fold uses it: [`saturate`]d, so a NaN weight adds nothing and an infinite one
/// adds the largest finite value.
#[inline]
pub fn finite_weight(weight: f64) -> f64 {
    saturate(weight)
}

/// `|a - b|` of two logged times, in ms.
pub fn distance_ms(a: i64, b: i64) -> u64 {
    a.abs_diff(b)
}

/// An item's decayed trending score.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Trend {
    /// Score at `ref_ms`.
    pub score: f64,
    /// Reference time (logged unix ms).
    pub ref_ms: i64,
}

/// Encoded size of a [`Trend`]: score f64 LE | ref_ms i64 LE.
pub const TREND_LEN: usize = 16;

impl Trend {
    /// A trend created by its first event.
    pub fn first(t_ms: i64, weight: f64) -> Trend {
        Trend { score: finite_weight(weight), ref_ms: t_ms }
    }

    /// Folds an event of `weight` at `t_ms`, saturating (see the module's doc).
    pub fn add(&mut self, t_ms: i64, weight: f64, half_life_ms: u64) {
        let weight = finite_weight(weight);
        // A score stored by an older version may be infinite: saturate it first, so `inf * 0` (an
        // event far enough after it that the factor is 0) cannot make a NaN.
        let score = saturate(self.score);
        let factor = decay_factor(distance_ms(t_ms, self.ref_ms), half_life_ms);
        if t_ms >= self.ref_ms {
            self.score = saturate(score * factor + weight);
            self.ref_ms = t_ms;
        } else {
            self.score = saturate(score + weight * factor);
        }
    }

    /// The score decayed to `now_ms` (undecayed if `now_ms` is before the reference); finite even
    /// for a score an older version stored infinite.
    pub fn score_at(&self, now_ms: i64, half_life_ms: u64) -> f64 {
        let score = saturate(self.score);
        if now_ms <= self.ref_ms {
            return score;
        }
        saturate(score * decay_factor(distance_ms(now_ms, self.ref_ms), half_life_ms))
    }

    /// The ranking term of a score: `sign(s) * ln(1 + |s|)`, which tames heavy hitters.
    pub fn term(score: f64) -> f64 {
        score.signum() * score.abs().ln_1p()
    }

    /// Bytes for fjall.
    pub fn encode(&self) -> [u8; TREND_LEN] {
        let mut out = [0u8; TREND_LEN];
        out[..8].copy_from_slice(&self.score.to_le_bytes());
        out[8..].copy_from_slice(&self.ref_ms.to_le_bytes());
        out
    }

    /// Parses [`Trend::encode`]'s bytes.
    pub fn decode(bytes: &[u8]) -> Option<Trend> {
        let score = f64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
        let ref_ms = i64::from_le_bytes(bytes.get(8..16)?.try_into().ok()?);
        (bytes.len() == TREND_LEN).then_some(Trend { score, ref_ms })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: u64 = 3_600_000;

    #[test]
    fn one_half_life_halves_the_score() {
        let mut trend = Trend::first(0, 1.0);
        assert_eq!(trend.score_at(HOUR as i64, HOUR), 0.5);
        trend.add(2 * HOUR as i64, 1.0, HOUR);
        assert_eq!(trend, Trend { score: 1.25, ref_ms: 2 * HOUR as i64 });
        // A late event is decayed to the reference time.
        trend.add(HOUR as i64, 2.0, HOUR);
        assert_eq!(trend.score, 2.25);
        assert_eq!(trend.score_at(HOUR as i64, HOUR), 2.25, "no backwards extrapolation");
    }

    #[test]
    fn no_elapsed_time_is_exactly_the_formula() {
        for half_life in [1, 7, HOUR, u64::MAX] {
            let formula = (-(0u64 as f64) / half_life as f64).exp2();
            assert_eq!(decay_factor(0, half_life).to_bits(), formula.to_bits());
        }
        assert!(decay_factor(0, 0).is_nan(), "a zero half-life is not special-cased");
    }

    #[test]
    fn term_is_signed_log() {
        assert_eq!(Trend::term(0.0), 0.0);
        assert_eq!(Trend::term(std::f64::consts::E - 1.0), 1.0);
        assert_eq!(Trend::term(-(std::f64::consts::E - 1.0)), -1.0);
    }

    #[test]
    fn overflow_saturates_and_finite_values_are_untouched() {
        let mut trend = Trend::first(0, 1e308);
        trend.add(0, 1e308, HOUR);
        assert_eq!(trend.score, f64::MAX);
        // Far enough later that the factor is 0: `inf * 0` would have been NaN.
        trend.add(i64::MAX, 1.0, HOUR);
        assert_eq!(trend, Trend { score: 1.0, ref_ms: i64::MAX });
        trend.add(0, -f64::MAX, 1);
        assert_eq!(trend.score, 1.0, "an event decayed to nothing adds nothing");
        let mut late = Trend::first(10, -f64::MAX);
        late.add(10, f64::NEG_INFINITY, HOUR);
        late.add(9, f64::NAN, HOUR);
        assert_eq!(late.score, -f64::MAX);
        let stored = Trend { score: f64::INFINITY, ref_ms: 0 };
        assert_eq!(stored.score_at(i64::MAX, HOUR), 0.0);
        assert_eq!(stored.score_at(0, HOUR), f64::MAX);
        assert!(Trend::term(f64::MAX).is_finite());
        for x in [0.0, -0.0, 1.5, -7.25, f64::MIN_POSITIVE, 5e-324, f64::MAX, -f64::MAX] {
            assert_eq!(saturate(x).to_bits(), x.to_bits(), "{x}");
        }
    }

    #[test]
    fn bytes_round_trip() {
        let trend = Trend { score: -3.5, ref_ms: -7 };
        assert_eq!(Trend::decode(&trend.encode()), Some(trend));
        assert_eq!(Trend::decode(&[0; 15]), None);
        assert_eq!(Trend::decode(&[0; 17]), None);
    }
}
