//! Protocol decisions without I/O (PROTOCOL.md). Each function takes what a node knows and a message,
//! and returns what to do; it never performs it.

pub mod commit;
pub mod follower;
pub mod office;
pub mod ship;

pub use commit::{commit_frontier, lease_holds, Quorum};
pub use follower::{
    append_only, decide_ship, replaced_from, BatchMeta, HaltCause, Located, LogView, ShipMeta, Step, Verdict,
};
pub use office::{
    answer_probe, divergence_point, plan_office, resumes_a_term, term_at, transfer_target, OfficePlan,
    OwnLog, ProbeAnswer,
};
pub use ship::{next_after, resume_after_gap, waits_before_next, Reply};
