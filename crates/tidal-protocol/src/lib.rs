//! Tidal's replication protocol as decisions without I/O (docs/PROTOCOL.md). Each function takes
//! what a node knows and a message, and returns what to do; it never performs it.
//!
//! - `follower`: what a follower does with a ship or a pulled chunk (`decide_ship`), which chunks
//!   may only append (`append_only`), when a halted follower repairs itself;
//! - `commit`: the leader's commit frontier and the leader-mode lease;
//! - `office`: taking office (probe answers, the plan, the divergence point, whether a restored
//!   term is resumed and whether a call speaks for one, whom to hand an office to);
//! - `membership`: whether a `members add/remove` may run and its plan (printed by a dry run,
//!   executed by the runtime);
//! - `ship`: what a ShipQueue does next (ship, notice, wait, nudge a pull), where it ships after an
//!   answer, how long it backs off, and where a read of its tail starts.
//!
//! `tidal-cluster` runs these decisions with real disks and sockets; `tidal-model` explores them
//! exhaustively. This crate depends on `tidal-types` only, so both drive exactly the same code.
#![deny(missing_docs)]

pub mod commit;
pub mod follower;
pub mod membership;
pub mod office;
pub mod ship;

pub use commit::{commit_frontier, lease_holds, Quorum};
pub use follower::{
    append_only, authority, decide_ship, repairs_a_halt, replaced_from, Authority, BatchMeta, HaltCause,
    Located, LogView, Origin, ShipMeta, Step, Verdict,
};
pub use membership::{plan_member_change, Addresses, MemberPlan, MemberRefusal, MemberRequest, MemberView};
pub use office::{
    answer_probe, campaign_not_before, divergence_point, plan_office, resumes_a_term,
    speaks_for_a_restored_term, term_at, term_start, transfer_target, OfficePlan, OwnLog, ProbeAnswer,
};
pub use ship::{
    next_after, next_backoff, next_ship_step, resume_after_gap, tail_start, waits_before_next, QueueStep,
    QueueView, Reply, Tail, TailStart,
};
