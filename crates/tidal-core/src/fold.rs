//! The ledger fold: what one decoded batch changes, as fjall writes plus [`IndexChange`]s.
//!
//! Nothing here commits: the caller puts the writes, the new applied seqno and the new time in ONE
//! fjall batch, commits it, then applies the index changes.
//!
//! Delicate:
//! - Determinism: same log ⇒ bit-identical state. Time is only the logged time (the event's `ts` or
//!   the envelope's), events are folded in log order, and per-batch accumulators are BTreeMaps so
//!   writes happen in a fixed order.
//! - A batch of many events touching one item or user reads its own earlier updates: everything
//!   is accumulated in memory first and written once per key.
//! - Reads see committed fjall state plus the index, which mirrors it (apply is serialized).

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};

use fjall::OwnedWriteBatch;
use tidal_types::Seqno;

use crate::config::EngineConfig;
use crate::error::Error;
use crate::feed_index::{FeedIndex, IndexChange};
use crate::keys::{self, Profile};
use crate::record::{ControlRecord, SignalEvent};
use crate::stores::Stores;
use crate::trend::{decay_factor, distance_ms, Trend};

/// Folds signal events logged at `envelope_time_ms`. Returns how many users got their first profile.
pub fn signals(
    stores: &Stores,
    index: &FeedIndex,
    config: &EngineConfig,
    envelope_time_ms: u64,
    events: &[SignalEvent],
    writes: &mut OwnedWriteBatch,
    changes: &mut Vec<IndexChange>,
) -> Result<i64, Error> {
    let mut new_users = 0;
    let dimension = config.dimension as usize;
    let envelope_time = i64::try_from(envelope_time_ms).unwrap_or(i64::MAX);
    let mut trends: BTreeMap<u64, Trend> = BTreeMap::new();
    let mut counters: BTreeMap<(u64, &str), u64> = BTreeMap::new();
    let mut profiles: BTreeMap<&str, Profile> = BTreeMap::new();
    let mut seen: BTreeSet<(&str, u64)> = BTreeSet::new();
    for event in events {
        let t = event.ts_ms.unwrap_or(envelope_time);
        if let Some(trend) = trends.get_mut(&event.item) {
            trend.add(t, event.weight, config.half_life_ms);
        } else {
            let trend = match index.trend(event.item) {
                Some(mut trend) => {
                    trend.add(t, event.weight, config.half_life_ms);
                    trend
                }
                None => Trend::first(t, event.weight),
            };
            trends.insert(event.item, trend);
        }
        match counters.entry((event.item, event.kind.as_str())) {
            Entry::Occupied(mut count) => *count.get_mut() += 1,
            Entry::Vacant(slot) => {
                let committed = match stores.counters.get(keys::counter_key(event.item, &event.kind))? {
                    Some(bytes) => keys::u64_value(&bytes).ok_or_else(|| corrupt("counters", "not a u64"))?,
                    None => 0,
                };
                slot.insert(committed + 1);
            }
        }
        if !profiles.contains_key(event.user.as_str()) {
            let profile = match stores.profiles.get(event.user.as_bytes())? {
                Some(bytes) => {
                    Profile::decode(&bytes, dimension).ok_or_else(|| corrupt("profiles", "bad length"))?
                }
                None => {
                    new_users += 1;
                    Profile { ref_ms: t, vector: vec![0.0; dimension] }
                }
            };
            profiles.insert(event.user.as_str(), profile);
        }
        if let Some(profile) = profiles.get_mut(event.user.as_str()) {
            add_to_profile(
                profile,
                t,
                event.weight,
                index.embedding(event.item),
                config.profile_half_life_ms,
            );
        }
        seen.insert((event.user.as_str(), event.item));
    }
    for (item, trend) in trends {
        writes.insert(&stores.trending, keys::item_key(item), trend.encode());
        changes.push(IndexChange::Trend { item, trend });
    }
    for ((item, kind), count) in counters {
        writes.insert(&stores.counters, keys::counter_key(item, kind), count.to_le_bytes());
    }
    for (user, profile) in profiles {
        writes.insert(&stores.profiles, user.as_bytes(), profile.encode());
    }
    for (user, item) in seen {
        writes.insert(&stores.seen, keys::seen_key(user, item), []);
    }
    Ok(new_users)
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

/// Upserts an item's metadata.
pub fn item_metadata(
    stores: &Stores,
    seqno: Seqno,
    item: u64,
    metadata: &[u8],
    writes: &mut OwnedWriteBatch,
) {
    writes.insert(&stores.items, keys::item_key(item), keys::seqno_value(seqno, metadata));
}

/// Upserts an item's embedding.
pub fn item_embedding(
    stores: &Stores,
    config: &EngineConfig,
    seqno: Seqno,
    item: u64,
    vector: &[f32],
    writes: &mut OwnedWriteBatch,
    changes: &mut Vec<IndexChange>,
) -> Result<(), Error> {
    if vector.len() != config.dimension as usize {
        return Err(Error::EmbeddingDimension { item, expected: config.dimension, got: vector.len() });
    }
    let mut bytes = Vec::with_capacity(vector.len() * 4);
    keys::f32s_to_bytes(vector, &mut bytes);
    writes.insert(&stores.embeddings, keys::item_key(item), keys::seqno_value(seqno, &bytes));
    changes.push(IndexChange::Embedding { item, vector: vector.to_vec() });
    Ok(())
}

/// Deletes an item: its metadata, embedding, trending score and per-kind counters. Users' seen
/// sets and profiles keep what they already absorbed: they are history of the users, not state of
/// the item, and rewriting every profile would make a delete cost O(users).
pub fn item_delete(
    stores: &Stores,
    item: u64,
    writes: &mut OwnedWriteBatch,
    changes: &mut Vec<IndexChange>,
) -> Result<(), Error> {
    let key = keys::item_key(item);
    writes.remove(&stores.items, key);
    writes.remove(&stores.embeddings, key);
    writes.remove(&stores.trending, key);
    for guard in stores.counters.prefix(key) {
        let counter_key = guard.key()?;
        writes.remove(&stores.counters, counter_key);
    }
    changes.push(IndexChange::RemoveItem { item });
    Ok(())
}

/// Folds a control record: LeaderStart is remembered in meta (it changes no data).
pub fn control(stores: &Stores, record: &ControlRecord, writes: &mut OwnedWriteBatch) {
    match record {
        ControlRecord::LeaderStart { term, leader, baseline } => {
            let mut value = Vec::with_capacity(24);
            value.extend_from_slice(&term.0.to_le_bytes());
            value.extend_from_slice(&leader.0.to_le_bytes());
            value.extend_from_slice(&baseline.0.to_le_bytes());
            writes.insert(&stores.meta, keys::META_LEADER_START, value);
        }
    }
}

fn corrupt(keyspace: &'static str, reason: &str) -> Error {
    Error::Corrupt { keyspace, reason: reason.into() }
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
