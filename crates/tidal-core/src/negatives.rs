//! Hard negatives: a per-user ORSWOT (observed-remove set without tombstones), [`NegativesState`].
//!
//! Each add creates a dot `(actor, counter)` from the adding node's version vector; a remove drops
//! the item's entry and keeps nothing else: the version vector remembers which dots this replica has
//! seen, so a merge can tell "removed here" (dot seen, entry absent) from "not seen yet" (dot above
//! our clock). That is what keeps the state bounded by items present x actors, with no tombstones.
//!
//! Delicate:
//! - A dot must never be reused: the actor is `(node id, incarnation)`, the incarnation bumped on a
//!   wiped data dir, and the engine persists every local change with an fsync before it returns, so a
//!   crash cannot roll a counter back and hand out the same dot twice.
//! - States from peers are untrusted: deserialization checks the invariants (every dot at or below
//!   the clock, no empty entry) so a merge never works on a state no replica could produce.
//! - Merge is the standard ORSWOT join: commutative, associative, idempotent; add wins over a
//!   concurrent remove.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// Most hard negatives one user may add on one node: bounds the state a user can grow. Merges are
/// never refused (that would break convergence), so a user's merged state can exceed it by the
/// adds of other nodes.
pub const NEGATIVES_PER_USER_MAX: usize = 10_000;

/// A CRDT actor: one incarnation of one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Actor {
    /// Node id.
    pub node: u64,
    /// Incarnation, bumped whenever the node starts on a wiped data dir.
    pub incarnation: u64,
}

/// One user's hard negatives.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "NegativesWire", into = "NegativesWire")]
pub struct NegativesState {
    /// Version vector: the highest counter of each actor this replica has seen.
    clock: BTreeMap<Actor, u64>,
    /// Items present, each with its surviving dots (at most one per actor).
    entries: BTreeMap<u64, BTreeMap<Actor, u64>>,
}

impl NegativesState {
    /// Adds `item` as `actor`: a fresh dot replaces the dots this replica held for it.
    pub fn add(&mut self, actor: Actor, item: u64) {
        let counter = self.clock.entry(actor).or_insert(0);
        *counter += 1;
        let dot = *counter;
        self.entries.insert(item, BTreeMap::from([(actor, dot)]));
    }

    /// Removes `item`: only the dots this replica has seen are removed (the clock keeps them).
    pub fn remove(&mut self, item: u64) {
        self.entries.remove(&item);
    }

    /// Whether `item` is present.
    pub fn contains(&self, item: u64) -> bool {
        self.entries.contains_key(&item)
    }

    /// Items present, ascending.
    pub fn items(&self) -> Vec<u64> {
        self.entries.keys().copied().collect()
    }

    /// Number of items present.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no item is present.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Number of actors in the version vector.
    pub fn actors(&self) -> usize {
        self.clock.len()
    }

    /// The ORSWOT join of `self` and `other`, into `self`.
    pub fn merge(&mut self, other: &NegativesState) {
        let items: BTreeSet<u64> = self.entries.keys().chain(other.entries.keys()).copied().collect();
        let empty = BTreeMap::new();
        let mut entries = BTreeMap::new();
        for item in items {
            let ours = self.entries.get(&item).unwrap_or(&empty);
            let theirs = other.entries.get(&item).unwrap_or(&empty);
            let mut dots = BTreeMap::new();
            for (actor, counter) in ours {
                let in_both = theirs.get(actor) == Some(counter);
                if in_both || *counter > other.seen(*actor) {
                    dots.insert(*actor, *counter);
                }
            }
            for (actor, counter) in theirs {
                if *counter > self.seen(*actor) {
                    let kept = dots.entry(*actor).or_insert(*counter);
                    *kept = (*kept).max(*counter);
                }
            }
            if !dots.is_empty() {
                entries.insert(item, dots);
            }
        }
        for (actor, counter) in &other.clock {
            let ours = self.clock.entry(*actor).or_insert(0);
            *ours = (*ours).max(*counter);
        }
        self.entries = entries;
    }

    /// Canonical bytes (for digests and storage): the wire form as JSON, whose order is fixed by
    /// the BTreeMaps.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(&NegativesWire::from(self.clone()))
            .expect("serializing plain integers into a Vec cannot fail")
    }

    /// Parses bytes from [`NegativesState::to_bytes`], checking the invariants.
    pub fn from_bytes(bytes: &[u8]) -> Result<NegativesState, String> {
        serde_json::from_slice(bytes).map_err(|e| e.to_string())
    }

    fn seen(&self, actor: Actor) -> u64 {
        self.clock.get(&actor).copied().unwrap_or(0)
    }
}

/// A dot or a clock entry on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct DotWire {
    node: u64,
    incarnation: u64,
    counter: u64,
}

/// One item on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryWire {
    item: u64,
    dots: Vec<DotWire>,
}

/// The serialized form of [`NegativesState`]: lists, because JSON map keys must be strings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct NegativesWire {
    clock: Vec<DotWire>,
    entries: Vec<EntryWire>,
}

fn dot_wire((actor, counter): (&Actor, &u64)) -> DotWire {
    DotWire { node: actor.node, incarnation: actor.incarnation, counter: *counter }
}

impl From<NegativesState> for NegativesWire {
    fn from(state: NegativesState) -> Self {
        NegativesWire {
            clock: state.clock.iter().map(dot_wire).collect(),
            entries: state
                .entries
                .iter()
                .map(|(item, dots)| EntryWire { item: *item, dots: dots.iter().map(dot_wire).collect() })
                .collect(),
        }
    }
}

impl TryFrom<NegativesWire> for NegativesState {
    type Error = String;

    fn try_from(wire: NegativesWire) -> Result<Self, String> {
        let mut clock = BTreeMap::new();
        for dot in wire.clock {
            let actor = Actor { node: dot.node, incarnation: dot.incarnation };
            if clock.insert(actor, dot.counter).is_some() {
                return Err(format!("actor {actor:?} twice in the clock"));
            }
        }
        let mut entries = BTreeMap::new();
        for entry in wire.entries {
            if entry.dots.is_empty() {
                return Err(format!("item {} has no dots", entry.item));
            }
            let mut dots = BTreeMap::new();
            for dot in entry.dots {
                let actor = Actor { node: dot.node, incarnation: dot.incarnation };
                let seen = clock.get(&actor).copied().unwrap_or(0);
                if dot.counter == 0 || dot.counter > seen {
                    return Err(format!("dot {dot:?} of item {} is not covered by the clock", entry.item));
                }
                if dots.insert(actor, dot.counter).is_some() {
                    return Err(format!("item {} has two dots of actor {actor:?}", entry.item));
                }
            }
            if entries.insert(entry.item, dots).is_some() {
                return Err(format!("item {} twice", entry.item));
            }
        }
        Ok(NegativesState { clock, entries })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const A: Actor = Actor { node: 1, incarnation: 0 };
    const B: Actor = Actor { node: 2, incarnation: 0 };
    const C: Actor = Actor { node: 3, incarnation: 7 };

    fn merged(a: &NegativesState, b: &NegativesState) -> NegativesState {
        let mut out = a.clone();
        out.merge(b);
        out
    }

    #[test]
    fn add_wins_over_a_concurrent_remove() {
        let mut a = NegativesState::default();
        a.add(A, 42);
        let mut b = a.clone();
        b.remove(42);
        a.add(A, 42); // concurrent re-add: a new dot b has not seen
        assert!(merged(&a, &b).contains(42));
        assert!(merged(&b, &a).contains(42));
    }

    #[test]
    fn an_observed_remove_wins() {
        let mut a = NegativesState::default();
        a.add(A, 42);
        let mut b = a.clone();
        b.remove(42);
        assert!(!merged(&a, &b).contains(42));
        assert!(!merged(&b, &a).contains(42));
    }

    #[test]
    fn concurrent_adds_on_two_nodes_keep_both_dots_until_one_removes_both() {
        let mut a = NegativesState::default();
        let mut b = NegativesState::default();
        a.add(A, 1);
        b.add(B, 1);
        let mut both = merged(&a, &b);
        assert_eq!(both.entries[&1].len(), 2);
        both.remove(1);
        assert!(!merged(&both, &a).contains(1));
        assert!(!merged(&b, &both).contains(1));
    }

    #[test]
    fn state_stays_bounded_after_many_cycles() {
        let mut a = NegativesState::default();
        let mut b = NegativesState::default();
        for round in 0..10_000u64 {
            a.add(A, round % 3);
            b.add(B, round % 5);
            a.remove(round % 3);
            if round % 7 == 0 {
                a.merge(&b);
                b.merge(&a);
            }
        }
        a.merge(&b);
        assert!(a.len() <= 5, "{}", a.len());
        assert_eq!(a.actors(), 2);
        assert!(a.to_bytes().len() < 1024);
    }

    #[test]
    fn bytes_round_trip_and_bad_states_are_refused() {
        let mut a = NegativesState::default();
        a.add(A, 5);
        a.add(C, 6);
        assert_eq!(NegativesState::from_bytes(&a.to_bytes()).unwrap(), a);
        let uncovered =
            br#"{"clock":[],"entries":[{"item":1,"dots":[{"node":1,"incarnation":0,"counter":1}]}]}"#;
        assert!(NegativesState::from_bytes(uncovered).is_err());
        let empty = br#"{"clock":[],"entries":[{"item":1,"dots":[]}]}"#;
        assert!(NegativesState::from_bytes(empty).is_err());
        assert!(NegativesState::from_bytes(b"garbage").is_err());
    }

    #[derive(Clone, Debug)]
    enum Op {
        Add(usize, u64),
        Remove(usize, u64),
        Merge(usize, usize),
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        let op = prop_oneof![
            (0..3usize, 0..6u64).prop_map(|(r, i)| Op::Add(r, i)),
            (0..3usize, 0..6u64).prop_map(|(r, i)| Op::Remove(r, i)),
            (0..3usize, 0..3usize).prop_map(|(a, b)| Op::Merge(a, b)),
        ];
        prop::collection::vec(op, 0..40)
    }

    /// Three replicas (actors A, B, C) running random histories: states any cluster can reach.
    fn replicas(ops: &[Op]) -> Vec<NegativesState> {
        let actors = [A, B, C];
        let mut states = vec![NegativesState::default(); 3];
        for op in ops {
            match *op {
                Op::Add(r, item) => states[r].add(actors[r], item),
                Op::Remove(r, item) => states[r].remove(item),
                Op::Merge(a, b) => {
                    let other = states[b].clone();
                    states[a].merge(&other);
                }
            }
        }
        states
    }

    proptest! {
        #[test]
        fn merge_is_a_join(ops in ops()) {
            let s = replicas(&ops);
            let (a, b, c) = (&s[0], &s[1], &s[2]);
            prop_assert_eq!(merged(a, b), merged(b, a));
            prop_assert_eq!(merged(&merged(a, b), c), merged(a, &merged(b, c)));
            prop_assert_eq!(merged(a, a), a.clone());
            prop_assert_eq!(NegativesState::from_bytes(&a.to_bytes()).unwrap(), a.clone());
        }
    }
}
