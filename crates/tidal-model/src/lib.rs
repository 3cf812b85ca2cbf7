//! An exhaustive model check of Tidal's replication protocol (PROTOCOL.md) with stateright.
//!
//! The model drives tidal-cluster's decision core — `decide_ship`, `commit_frontier` over a
//! `Quorum`, `answer_probe`, `plan_office`, `resumes_a_term`, the ShipQueue's `next_after` and the
//! ship feed's `tail_start` — not a copy of it, through every interleaving of a small cluster:
//! elections at any moment (one leader per term, persisted votes), message loss, duplication and
//! reordering, crashes that lose what was not fsynced (after which openraft may restore an
//! office), pulls whose check and read are two steps, and a membership change.
//! Leaders ship batches as soon as they are written, before their own fsync (decisions/023); each
//! batch carries the identity of the process that wrote it, so two batches at one `(term, seqno)`
//! are told apart. Followers apply committed batches once written, before their own fsync
//! (decisions/025), and a restart brings `applied` back to the durable WAL.
//! docs/decisions/006-model-check.md says what is abstracted and why that is sound.
//!
//! It is not a simulation of the production runtime: no bytes, no timing, no snapshots beyond
//! rewinding state to a divergence point (a follower that would need one does not pull), no purge.
#![deny(missing_docs)]

pub mod check;
pub mod history;
pub mod model;
pub mod properties;
pub mod state;
pub mod symmetry;

pub use check::{check, CheckReport};
pub use model::{Action, Bug, Bugs, Mode, ReplicationModel};
pub use state::ModelState;
