//! Positions in the log: [`Seqno`], [`Term`], [`TermSeqno`], and [`NodeId`].

use serde::{Deserialize, Serialize};
use std::fmt;

/// Position of one event in the cluster's one log. Every event consumes one seqno.
///
/// `Seqno::ZERO` means "no record yet"; the first event is 1. Frontiers are inclusive.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Seqno(pub u64);

impl Seqno {
    /// No record yet.
    pub const ZERO: Seqno = Seqno(0);

    /// The seqno `n` positions later.
    #[allow(clippy::should_implement_trait)] // an inherent method reads better at call sites than `+ n`
    pub fn add(self, n: u64) -> Seqno {
        Seqno(self.0.checked_add(n).expect("seqno space is 2^64 events: it cannot overflow"))
    }

    /// The next seqno (exclusive end of a range ending at `self`).
    pub fn next(self) -> Seqno {
        self.add(1)
    }

    /// The raw value.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Seqno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Leadership epoch, decided by openraft (standard mode: one leader per term).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Term(pub u64);

impl Term {
    /// The raw value.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t{}", self.0)
    }
}

/// A position compared across nodes: by term first, then seqno.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TermSeqno {
    /// Term of the batch holding `seqno`.
    pub term: Term,
    /// The seqno.
    pub seqno: Seqno,
}

impl fmt::Display for TermSeqno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({}, {})", self.term, self.seqno)
    }
}

/// Identifier of a node in a cluster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NodeId(pub u64);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}", self.0)
    }
}
