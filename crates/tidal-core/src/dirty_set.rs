//! The applier's set of keys changed since the last flush, with their values: [`DirtySet`].
//!
//! Counters and trending scores change on nearly every signal, keyed by item ids spread over
//! millions of items. Keeping "the last value of every changed key" in a hash map cost a second
//! random insert into a large table per event, beside the lookup of the value itself, on the
//! applier's thread that every write waits for. Here the value's own map entry carries a
//! [`Mark`]: the flush window it was last changed in and its position in this set's vector, so a
//! change costs the lookup the applier does anyway plus a write into the vector.
//!
//! Delicate:
//! - A mark is valid only in its window: [`DirtySet::take`] starts a new window, and when the
//!   window counter wraps (after 2^32 - 1 flushes) it reports so, and the owner must reset every
//!   mark ([`Mark::CLEAN`]) before the next change, or a stale mark would claim another key's
//!   position.
//! - A key whose entry is removed loses its mark; a later change in the same window pushes it
//!   again, so the vector may hold a key twice. [`last_values`] keeps the later one.
//! - Memory is one entry per changed key per window (plus such rare repeats), like the map it
//!   replaces.

/// Where a key's change sits in the current window of its [`DirtySet`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    window: u32,
    position: u32,
}

impl Mark {
    /// Not changed in any live window.
    pub const CLEAN: Mark = Mark { window: 0, position: 0 };
}

/// Keys changed in the current flush window, each with its latest value, in first-change order.
#[derive(Debug)]
pub struct DirtySet<K, V> {
    entries: Vec<(K, V)>,
    /// The current window, never `Mark::CLEAN.window`.
    window: u32,
}

impl<K, V> Default for DirtySet<K, V> {
    fn default() -> Self {
        DirtySet { entries: Vec::new(), window: Mark::CLEAN.window + 1 }
    }
}

impl<K: Copy + Ord, V: Copy> DirtySet<K, V> {
    /// Records `value` for `key`, whose entry elsewhere carries `mark`.
    pub fn set(&mut self, mark: &mut Mark, key: K, value: V) {
        if mark.window == self.window {
            let entry = &mut self.entries[mark.position as usize];
            debug_assert!(entry.0 == key, "a mark of this window points at another key's change");
            entry.1 = value;
        } else {
            *mark = Mark { window: self.window, position: self.next_position() };
            self.entries.push((key, value));
        }
    }

    /// Records `value` for `key` whose entry (with `mark`) was just removed, so no mark remembers it.
    pub fn set_removed(&mut self, mut mark: Mark, key: K, value: V) {
        self.set(&mut mark, key, value);
    }

    /// Keys changed in this window (a key removed and changed again counts twice).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Moves this window's changes out and starts the next window, with room for as many changes
    /// (growing a vector of a million entries mid-apply copies them all). `true` with them if the
    /// window counter wrapped: the owner must reset every mark to [`Mark::CLEAN`] now.
    pub fn take(&mut self) -> (Vec<(K, V)>, bool) {
        let next = Vec::with_capacity(self.entries.len());
        let entries = std::mem::replace(&mut self.entries, next);
        self.window = self.window.wrapping_add(1);
        let wrapped = self.window == Mark::CLEAN.window;
        if wrapped {
            self.window = Mark::CLEAN.window + 1;
        }
        (entries, wrapped)
    }

    /// Moves to the last window, so the next [`DirtySet::take`] wraps (tests of the owners' resets).
    #[cfg(test)]
    pub fn jump_to_last_window(&mut self) {
        self.window = u32::MAX;
    }

    fn next_position(&self) -> u32 {
        u32::try_from(self.entries.len()).expect("fewer than 2^32 changes in one flush window")
    }
}

/// The changes of a window once per key, in key order (fjall's memtable inserts are cheaper in
/// order), each with its last value.
pub fn last_values<K: Copy + Ord, V: Copy>(changes: &[(K, V)]) -> Vec<(K, V)> {
    let mut sorted = changes.to_vec();
    // Stable: of two entries of one key (removed, then changed again) the later stays last.
    sorted.sort_by_key(|(key, _)| *key);
    sorted.dedup_by(|later, earlier| {
        let same = later.0 == earlier.0;
        if same {
            earlier.1 = later.1;
        }
        same
    });
    sorted
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    /// A map of values with marks, as the owners keep them.
    #[derive(Default)]
    struct Owner {
        values: BTreeMap<u64, (u64, Mark)>,
        dirty: DirtySet<u64, Option<u64>>,
    }

    impl Owner {
        fn set(&mut self, key: u64, value: u64) {
            let entry = self.values.entry(key).or_insert((0, Mark::CLEAN));
            entry.0 = value;
            self.dirty.set(&mut entry.1, key, Some(value));
        }

        fn remove(&mut self, key: u64) {
            if let Some((_, mark)) = self.values.remove(&key) {
                self.dirty.set_removed(mark, key, None);
            }
        }

        fn flush(&mut self) -> Vec<(u64, Option<u64>)> {
            let (changes, wrapped) = self.dirty.take();
            if wrapped {
                for (_, mark) in self.values.values_mut() {
                    *mark = Mark::CLEAN;
                }
            }
            last_values(&changes)
        }
    }

    #[test]
    fn a_window_lists_each_key_once_with_its_last_value() {
        let mut owner = Owner::default();
        owner.set(5, 1);
        owner.set(3, 7);
        owner.set(5, 2);
        assert_eq!(owner.dirty.len(), 2);
        assert_eq!(owner.flush(), vec![(3, Some(7)), (5, Some(2))]);
        assert_eq!(owner.dirty.len(), 0);
        owner.set(5, 9);
        assert_eq!(owner.flush(), vec![(5, Some(9))]);
        assert_eq!(owner.flush(), vec![]);
    }

    #[test]
    fn a_removal_then_a_change_in_one_window_keeps_the_change() {
        let mut owner = Owner::default();
        owner.set(1, 1);
        owner.remove(1);
        assert_eq!(owner.dirty.len(), 1, "the removal reuses the entry of this window");
        owner.set(1, 4);
        assert_eq!(owner.dirty.len(), 2);
        assert_eq!(owner.flush(), vec![(1, Some(4))]);
        owner.remove(1);
        assert_eq!(owner.flush(), vec![(1, None)]);
    }

    #[test]
    fn a_wrapped_window_counter_asks_for_a_reset() {
        let mut owner = Owner::default();
        owner.set(1, 1);
        owner.flush();
        // Key 1 keeps its mark of window 1; jump to the last window so the next take wraps to 1.
        owner.dirty.window = u32::MAX;
        owner.set(2, 1);
        assert_eq!(owner.flush(), vec![(2, Some(1))]);
        assert_eq!(owner.dirty.window, 1);
        // Without the reset, key 1 would claim position 0 of this window, which is key 3's.
        owner.set(3, 1);
        owner.set(1, 2);
        assert_eq!(owner.flush(), vec![(1, Some(2)), (3, Some(1))]);
    }

    proptest! {
        /// Over several windows, each flush writes exactly what a map of last values would.
        #[test]
        fn agrees_with_a_map_of_last_values(
            windows in proptest::collection::vec(
                proptest::collection::vec((0u64..16, proptest::option::of(any::<u64>())), 0..64),
                1..6,
            )
        ) {
            let mut owner = Owner::default();
            for window in windows {
                let mut expected = BTreeMap::new();
                for (key, value) in window {
                    match value {
                        Some(value) => owner.set(key, value),
                        None if owner.values.contains_key(&key) => owner.remove(key),
                        None => continue,
                    }
                    expected.insert(key, value);
                }
                prop_assert_eq!(owner.flush(), expected.into_iter().collect::<Vec<_>>());
            }
        }
    }
}
