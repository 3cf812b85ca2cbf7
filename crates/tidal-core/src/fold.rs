//! The ledger fold of a signal batch, in two phases, each in two halves that share nothing they
//! change: the items' (trending scores and counts) and the users' (profiles and seen items). The
//! engine runs the halves of a large batch on two threads (experiments/047).
//!
//! [`trends`] and [`users`] run under the state read lock, and [`users`] may fail (fjall reads):
//! they compute the new trending scores and load the profiles the overlay lacks, changing nothing.
//! [`count_signals`] and [`profiles`] run after every fallible step of the apply succeeded, under
//! the state write lock (profiles, seen items, the counts in the index) and the writer lock (the
//! counters' dirty set), and cannot fail.
//!
//! Delicate:
//! - Determinism: same log ⇒ bit-identical state. Time is only the logged time (the event's `ts` or
//!   the envelope's), and events are folded in log order per key. The per-batch maps are hash maps:
//!   their order never reaches the state (each key's value is final; fjall and the digest order keys).
//!   Each half folds every event of the batch in log order, so running the halves at once changes
//!   nothing: no key is touched by both.
//! - A batch of many events touching one item or user reads its own earlier updates: everything
//!   is accumulated per key in memory first.
//! - The starting values are the applied state: trends from the index, profiles from the active
//!   overlay, else the frozen one, else fjall. Profiles are folded in place in the overlay: copying
//!   a 512-byte profile per user per batch cost more than the fold itself.

use std::collections::hash_map::Entry;

use crate::config::EngineConfig;
use crate::counters::Counters;
use crate::error::Error;
use crate::fast_hash::{FastMap, FastState};
use crate::feed_index::{Embeddings, FeedIndex, ScoresMut};
use crate::keys::Profile;
use crate::overlay::{DirtyUser, Overlay, OverlayView};
use crate::prefetch::{prefetch, prefetch_address, prefetch_slice};
use crate::record::{ControlRecord, SignalColumns, SignalRef};
use crate::stores::Stores;
use crate::trend::{decay_factor, distance_ms, finite_weight, Trend};

/// What the read phase of a signal batch found, borrowing user names from the decoded events.
pub struct SignalsFold<'a> {
    /// New trending score of every item the batch touched.
    pub trends: FastMap<u64, Trend>,
    /// The fjall profile (`None`: a new user) of every user of the batch the overlay lacks.
    pub loaded: FastMap<&'a str, Option<Profile>>,
    /// Per event, the index of its user in the active overlay's `users` when this phase looked,
    /// or [`NOT_IN_OVERLAY`]. Valid for the write phase: only the applier changes the active
    /// overlay, and nothing changes it between the two phases of one apply.
    pub slots: Vec<u32>,
}

/// A slot of [`SignalsFold::slots`]: the user was not in the active overlay.
pub const NOT_IN_OVERLAY: u32 = u32::MAX;

/// The read phase of a signal batch logged at `envelope_time_ms`, its items' half: the new trending
/// scores. Reads the index only; changes nothing.
pub fn trends(
    index: &FeedIndex,
    config: &EngineConfig,
    envelope_time_ms: u64,
    events: &SignalColumns,
) -> FastMap<u64, Trend> {
    let envelope_time = i64::try_from(envelope_time_ms).unwrap_or(i64::MAX);
    let mut trends: FastMap<u64, Trend> =
        FastMap::with_capacity_and_hasher(events.len(), FastState::default());
    // The index's scores first, in a loop of nothing else: its lookups do not depend on each other,
    // so the CPU overlaps their cache misses (over a million items nearly every one misses), where
    // the loop below, with its batch map between them, took them one at a time.
    let known: Vec<Option<Trend>> = events.items().map(|item| index.trend(item)).collect();
    for (event, known) in events.iter().zip(known) {
        let t = event.ts_ms.unwrap_or(envelope_time);
        match trends.entry(event.item) {
            Entry::Occupied(mut trend) => trend.get_mut().add(t, event.weight, config.half_life_ms),
            Entry::Vacant(slot) => {
                let trend = match known {
                    Some(mut trend) => {
                        trend.add(t, event.weight, config.half_life_ms);
                        trend
                    }
                    None => Trend::first(t, event.weight),
                };
                slot.insert(trend);
            }
        }
    }
    trends
}

/// What the users' half of the read phase found: see [`SignalsFold::loaded`] and
/// [`SignalsFold::slots`].
pub type UsersFold<'a> = (FastMap<&'a str, Option<Profile>>, Vec<u32>);

/// The read phase of a signal batch, its users' half: where each event's user is in the active
/// overlay, and the profiles to load from fjall for the others. Fails only on a fjall read;
/// changes nothing.
pub fn users<'a>(
    stores: &Stores,
    view: OverlayView<'_>,
    dimension: usize,
    events: &'a SignalColumns,
) -> Result<UsersFold<'a>, Error> {
    let mut loaded: FastMap<&'a str, Option<Profile>> = FastMap::default();
    let mut slots = Vec::with_capacity(events.len());
    for event in events.iter() {
        // A user of the active overlay is folded in place; others start from the frozen overlay's
        // profile, else fjall's.
        match view.active.user_ids.get(event.user) {
            Some(&id) => slots.push(id),
            None => {
                slots.push(NOT_IN_OVERLAY);
                if !loaded.contains_key(event.user) {
                    loaded.insert(event.user, view.profile(stores, event.user, dimension)?);
                }
            }
        }
    }
    Ok((loaded, slots))
}

/// The write phase: folds every event into its user's profile and seen items in the overlay, in
/// log order, in place. Infallible. Returns `(new users, estimated bytes added)`.
pub fn profiles(
    overlay: &mut Overlay,
    embeddings: Embeddings<'_>,
    config: &EngineConfig,
    envelope_time_ms: u64,
    events: &SignalColumns,
    mut loaded: FastMap<&str, Option<Profile>>,
    slots: &[u32],
) -> (i64, usize) {
    debug_assert_eq!(slots.len(), events.len());
    let dimension = config.dimension as usize;
    let envelope_time = i64::try_from(envelope_time_ms).unwrap_or(i64::MAX);
    let (mut new_users, mut bytes) = (0, 0);
    for (at, (event, &slot)) in events.iter().zip(slots).enumerate() {
        prefetch_ahead(overlay, slots, at);
        let t = event.ts_ms.unwrap_or(envelope_time);
        let embedding = embeddings.get(event.item);
        // A user the read phase found in the overlay (nearly every event once it is warm) is an
        // index; one it did not find may have been added by an earlier event of this batch.
        let id = if slot != NOT_IN_OVERLAY {
            slot
        } else if let Some(&id) = overlay.user_ids.get(event.user) {
            id
        } else {
            let profile = match loaded.remove(event.user).flatten() {
                Some(profile) => profile,
                None => {
                    new_users += 1;
                    Profile { ref_ms: t, vector: vec![0.0; dimension] }
                }
            };
            let (id, added) = overlay.add_user(event.user, profile);
            bytes += added;
            id
        };
        let dirty = &mut overlay.users[id as usize];
        debug_assert_eq!(&*dirty.name, event.user);
        fold_event(dirty, t, &event, embedding, config.profile_half_life_ms);
    }
    (new_users, bytes + events.len() * 8)
}

/// How many events ahead of the one being folded the fold prefetches its user's entry...
const USER_AHEAD: usize = 16;
/// ... and, that entry having arrived meanwhile, the profile vector and the seen list's tail.
const VECTOR_AHEAD: usize = 8;

/// Prefetches what the events [`USER_AHEAD`] and [`VECTOR_AHEAD`] after `at` will touch, in two
/// steps: the vector's address is in the user entry, which the first step brought in.
fn prefetch_ahead(overlay: &Overlay, slots: &[u32], at: usize) {
    let user = |ahead: usize| {
        let slot = *slots.get(at + ahead)?;
        overlay.users.get(slot as usize)
    };
    if let Some(dirty) = user(USER_AHEAD) {
        prefetch(dirty);
    }
    if let Some(dirty) = user(VECTOR_AHEAD) {
        prefetch_slice(&dirty.profile.vector);
        prefetch_address(dirty.seen.as_ptr_range().end.cast());
    }
}

/// One event into its user's profile and seen items.
fn fold_event(
    dirty: &mut DirtyUser,
    t: i64,
    event: &SignalRef<'_>,
    embedding: Option<&[f32]>,
    half_life_ms: u64,
) {
    add_to_profile(&mut dirty.profile, t, event.weight, embedding, half_life_ms);
    dirty.seen.push(event.item);
}

/// Counts the events per (item, kind). Every item of the batch has its trending score set already
/// (its counts live in that entry, experiments/038).
pub fn count_signals(counters: &mut Counters, scores: &mut ScoresMut<'_>, events: &SignalColumns) {
    // The batch's kinds to counter kind ids once, then one counter update per event.
    let kinds: Vec<u32> = events.kinds().iter().map(|kind| counters.kind_id(kind)).collect();
    for event in events.iter() {
        let counts = scores
            .counts_mut(event.item)
            .expect("the batch's trending scores are set before its counts: every item has an entry");
        counters.increment_id(counts, event.item, kinds[event.kind as usize]);
    }
}

/// Profile rule, the trend rule on a vector: decay to the later of the two times, add
/// `weight * embedding` (decayed to the reference if the event is late). Without an embedding the
/// event still moves the reference time, so every replica decays the same way.
///
/// Saturating, as the trend rule is (see `trend`): the weight is made finite first, and each value is
/// stored as [`to_f32_saturating`] of its f64 result, so a value never becomes infinite or NaN in
/// f32 (a weight of `1e6` times an embedding value of `1e33` is finite in f64 but not in f32). For
/// every result that fit in f32 before, the bits are the same.
fn add_to_profile(
    profile: &mut Profile,
    t_ms: i64,
    weight: f64,
    embedding: Option<&[f32]>,
    half_life_ms: u64,
) {
    let weight = finite_weight(weight);
    let factor = decay_factor(distance_ms(t_ms, profile.ref_ms), half_life_ms);
    // A value stored by an older version may be infinite: `stored` makes it finite before it is
    // multiplied, so `inf * 0` cannot make a NaN.
    if t_ms >= profile.ref_ms {
        profile.ref_ms = t_ms;
        match embedding {
            Some(embedding) => {
                for (value, e) in profile.vector.iter_mut().zip(embedding) {
                    *value = to_f32_saturating(stored(*value) * factor + weight * f64::from(*e));
                }
            }
            // A factor of exactly 1 (no time passed) leaves every value bit-identical: skip the loop.
            None if factor == 1.0 => {}
            None => {
                for value in profile.vector.iter_mut() {
                    *value = to_f32_saturating(stored(*value) * factor);
                }
            }
        }
    } else if let Some(embedding) = embedding {
        for (value, e) in profile.vector.iter_mut().zip(embedding) {
            *value = to_f32_saturating(stored(*value) + weight * factor * f64::from(*e));
        }
    }
}

/// `x as f32`, except that what would round to an infinity is the largest finite f32 of its sign
/// and a NaN is 0. For every `x` that `as f32` keeps finite, the same bits (a value between
/// `f32::MAX` and the rounding midpoint above it rounds to `f32::MAX` either way). Branch-free, so
/// the profile loops stay vectorized.
#[inline]
fn to_f32_saturating(x: f64) -> f32 {
    let max = f64::from(f32::MAX);
    let x = if x.is_nan() { 0.0 } else { x.clamp(-max, max) };
    x as f32
}

/// A stored profile value, made finite the same way (an older version may have stored an infinity).
#[inline]
fn stored(value: f32) -> f64 {
    f64::from(if value.is_nan() { 0.0 } else { value.clamp(-f32::MAX, f32::MAX) })
}

/// The meta value of a control record: LeaderStart is remembered (it changes no data).
pub fn control_value(record: &ControlRecord) -> Vec<u8> {
    match record {
        ControlRecord::LeaderStart { term, leader, baseline } => {
            let mut value = Vec::with_capacity(24);
            value.extend_from_slice(&term.0.to_le_bytes());
            value.extend_from_slice(&leader.0.to_le_bytes());
            value.extend_from_slice(&baseline.0.to_le_bytes());
            value
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_decays_and_adds() {
        let mut profile = Profile { ref_ms: 0, vector: vec![2.0, 0.0] };
        add_to_profile(&mut profile, 1000, 1.0, Some(&[0.0, 1.0]), 1000);
        assert_eq!(profile, Profile { ref_ms: 1000, vector: vec![1.0, 1.0] });
        add_to_profile(&mut profile, 0, 2.0, Some(&[1.0, 0.0]), 1000);
        assert_eq!(profile, Profile { ref_ms: 1000, vector: vec![2.0, 1.0] });
        add_to_profile(&mut profile, 2000, 5.0, None, 1000);
        assert_eq!(profile, Profile { ref_ms: 2000, vector: vec![1.0, 0.5] });
    }

    #[test]
    fn profile_values_saturate_in_f32() {
        let mut profile = Profile { ref_ms: 0, vector: vec![0.0, 1.0, f32::INFINITY] };
        add_to_profile(&mut profile, 0, 1e6, Some(&[1e33, -1e33, 0.0]), 1000);
        assert_eq!(profile.vector, vec![f32::MAX, -f32::MAX, f32::MAX]);
        // Far later, the factor is 0: a stored infinity decays to 0, not NaN.
        profile.vector[2] = f32::INFINITY;
        add_to_profile(&mut profile, i64::MAX, f64::NAN, Some(&[1.0, 1.0, 1.0]), 1000);
        assert_eq!(profile.vector, vec![0.0, 0.0, 0.0]);
        add_to_profile(&mut profile, 0, f64::INFINITY, Some(&[f32::MAX, -f32::MAX, 0.0]), 1);
        assert_eq!(profile.vector, vec![0.0, 0.0, 0.0], "a late event decayed to nothing adds nothing");
        for x in [0.0, -0.0, 1.5, -7.25, f64::from(f32::MAX), 1e-50, 3.4028235e38] {
            assert_eq!(to_f32_saturating(x).to_bits(), (x as f32).to_bits(), "{x}");
        }
        assert_eq!(to_f32_saturating(f64::NAN), 0.0);
        assert_eq!(to_f32_saturating(-1e39), -f32::MAX);
    }
}
