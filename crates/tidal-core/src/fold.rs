//! The ledger fold: what one decoded signal batch changes, computed without changing anything.
//!
//! Nothing here is visible to reads: the caller merges the result into the write-back overlay and
//! the index under the state write lock, after every fallible step of the apply succeeded.
//!
//! Delicate:
//! - Determinism: same log ⇒ bit-identical state. Time is only the logged time (the event's `ts` or
//!   the envelope's), and events are folded in log order per key. The per-batch maps are hash maps:
//!   their order never reaches the state (each key's value is final; fjall and the digest order keys).
//! - A batch of many events touching one item or user reads its own earlier updates: everything
//!   is accumulated per key in memory first.
//! - The starting values are the applied state: trends from the index, profiles from the overlay,
//!   else fjall.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use crate::config::EngineConfig;
use crate::counters::Counters;
use crate::error::Error;
use crate::feed_index::FeedIndex;
use crate::keys::Profile;
use crate::overlay::Overlay;
use crate::record::{ControlRecord, SignalEvent};
use crate::stores::Stores;
use crate::trend::{decay_factor, distance_ms, Trend};

/// What a signal batch changes, borrowing user names from the decoded events.
pub struct SignalsFold<'a> {
    /// New trending score of every item the batch touched.
    pub trends: HashMap<u64, Trend>,
    /// New profile and seen items of every user the batch touched, in first-touch order.
    pub users: Vec<UserFold<'a>>,
    /// How many users got their first profile.
    pub new_users: i64,
}

/// One user's part of a [`SignalsFold`].
pub struct UserFold<'a> {
    /// User id.
    pub user: &'a str,
    /// The whole new profile.
    pub profile: Profile,
    /// Items the batch saw, in log order (repeats allowed).
    pub seen: Vec<u64>,
}

/// Folds signal events logged at `envelope_time_ms` over the applied state. Fails only on a fjall
/// read; changes nothing.
pub fn signals<'a>(
    stores: &Stores,
    index: &FeedIndex,
    overlay: &Overlay,
    config: &EngineConfig,
    envelope_time_ms: u64,
    events: &'a [SignalEvent],
) -> Result<SignalsFold<'a>, Error> {
    let dimension = config.dimension as usize;
    let envelope_time = i64::try_from(envelope_time_ms).unwrap_or(i64::MAX);
    let mut trends: HashMap<u64, Trend> = HashMap::with_capacity(events.len());
    let mut slots: HashMap<&str, usize> = HashMap::new();
    let mut users: Vec<UserFold<'a>> = Vec::new();
    let mut new_users = 0;
    for event in events {
        let t = event.ts_ms.unwrap_or(envelope_time);
        match trends.entry(event.item) {
            Entry::Occupied(mut trend) => trend.get_mut().add(t, event.weight, config.half_life_ms),
            Entry::Vacant(slot) => {
                let trend = match index.trend(event.item) {
                    Some(mut trend) => {
                        trend.add(t, event.weight, config.half_life_ms);
                        trend
                    }
                    None => Trend::first(t, event.weight),
                };
                slot.insert(trend);
            }
        }
        let slot = match slots.get(event.user.as_str()) {
            Some(&slot) => slot,
            None => {
                let profile = match overlay.profile(stores, &event.user, dimension)? {
                    Some(profile) => profile,
                    None => {
                        new_users += 1;
                        Profile { ref_ms: t, vector: vec![0.0; dimension] }
                    }
                };
                users.push(UserFold { user: &event.user, profile, seen: Vec::new() });
                slots.insert(&event.user, users.len() - 1);
                users.len() - 1
            }
        };
        let user = &mut users[slot];
        add_to_profile(
            &mut user.profile,
            t,
            event.weight,
            index.embedding(event.item),
            config.profile_half_life_ms,
        );
        user.seen.push(event.item);
    }
    Ok(SignalsFold { trends, users, new_users })
}

/// Counts the events per (item, kind). Returns how many counters became dirty.
pub fn count_signals(counters: &mut Counters, events: &[SignalEvent]) -> usize {
    events.iter().filter(|event| counters.increment(event.item, &event.kind)).count()
}

/// Profile rule, the trend rule on a vector: decay to the later of the two times, add
/// `weight * embedding` (decayed to the reference if the event is late). Without an embedding the
/// event still moves the reference time, so every replica decays the same way.
fn add_to_profile(
    profile: &mut Profile,
    t_ms: i64,
    weight: f64,
    embedding: Option<&[f32]>,
    half_life_ms: u64,
) {
    let factor = decay_factor(distance_ms(t_ms, profile.ref_ms), half_life_ms);
    if t_ms >= profile.ref_ms {
        profile.ref_ms = t_ms;
        match embedding {
            Some(embedding) => {
                for (value, e) in profile.vector.iter_mut().zip(embedding) {
                    *value = (f64::from(*value) * factor + weight * f64::from(*e)) as f32;
                }
            }
            None => {
                for value in profile.vector.iter_mut() {
                    *value = (f64::from(*value) * factor) as f32;
                }
            }
        }
    } else if let Some(embedding) = embedding {
        for (value, e) in profile.vector.iter_mut().zip(embedding) {
            *value = (f64::from(*value) + weight * factor * f64::from(*e)) as f32;
        }
    }
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
}
