//! A fast keyed hasher for the engine's hot in-memory maps: [`FastState`].
//!
//! The fold does several hash lookups per signal (trending scores, counters, profiles, index
//! rows); SipHash was a visible share of it. This is a folded multiply (as in foldhash and aHash's
//! fallback) keyed by a per-map random seed from std's `RandomState`, so keys chosen by clients
//! (item ids, user ids) cannot be picked to collide without knowing the seed.
//!
//! Delicate: iteration order of these maps differs per process, exactly as with `RandomState`;
//! nothing log-derived may depend on it (fjall and the digest order keys themselves).

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

/// A `HashMap` with [`FastState`].
pub type FastMap<K, V> = HashMap<K, V, FastState>;

/// Odd 64-bit multiplier (from PCG) spreading bits across the product.
const MULTIPLIER: u64 = 0x5851_f42d_4c95_7f2d;

/// Builds [`FastHasher`]s with a random seed.
#[derive(Clone, Debug)]
pub struct FastState {
    seed: u64,
}

impl Default for FastState {
    fn default() -> Self {
        FastState { seed: RandomState::new().hash_one(MULTIPLIER) | 1 }
    }
}

impl BuildHasher for FastState {
    type Hasher = FastHasher;

    fn build_hasher(&self) -> FastHasher {
        FastHasher { hash: self.seed }
    }
}

/// Folded-multiply hasher; see the module docs.
pub struct FastHasher {
    hash: u64,
}

impl FastHasher {
    fn mix(&mut self, value: u64) {
        let product = u128::from(self.hash ^ value) * u128::from(MULTIPLIER);
        self.hash = (product as u64) ^ ((product >> 64) as u64);
    }
}

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        // The length first: the zero padding of the last chunk must not make "ab" equal "ab\0".
        self.mix(bytes.len() as u64);
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            self.mix(u64::from_le_bytes(chunk.try_into().expect("chunks_exact yields 8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            self.mix(u64::from_le_bytes(last));
        }
    }

    fn write_u8(&mut self, value: u8) {
        self.mix(u64::from(value));
    }

    fn write_u32(&mut self, value: u32) {
        self.mix(u64::from(value));
    }

    fn write_u64(&mut self, value: u64) {
        self.mix(value);
    }

    fn write_usize(&mut self, value: usize) {
        self.mix(value as u64);
    }

    fn finish(&self) -> u64 {
        // One more round so the top bits (hashbrown's tag) depend on every input bit.
        let product = u128::from(self.hash) * u128::from(MULTIPLIER);
        (product as u64) ^ ((product >> 64) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_keys_hash_equal_and_nearby_keys_spread() {
        let state = FastState::default();
        assert_eq!(state.hash_one(42u64), state.hash_one(42u64));
        assert_eq!(state.hash_one("user7"), state.hash_one(String::from("user7")));
        assert_ne!(state.hash_one("ab"), state.hash_one("ab\0"));
        let tags: std::collections::HashSet<u64> = (0..1024u64).map(|n| state.hash_one(n) >> 57).collect();
        assert!(tags.len() > 64, "top bits must vary: {} distinct tags", tags.len());
    }
}
