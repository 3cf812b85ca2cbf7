//! Tidal's vocabulary: positions in the one log, node ids, record kinds and the HTTP API models.
//!
//! This crate does no I/O and knows no runtime. Every other crate speaks these words; the glossary in
//! `docs/glossary.md` defines them once. Positions are newtypes so a term can never be passed where a
//! seqno is expected.
#![deny(missing_docs)]

pub mod activity;
mod api;
mod history_api;
mod inbox_api;
mod kind;
pub mod link;
mod log_limit;
mod position;
mod verbs_api;

pub use api::*;
pub use history_api::*;
pub use inbox_api::*;
pub use kind::RecordKind;
pub use log_limit::LogLimit;
pub use position::{NodeId, Seqno, Term, TermSeqno};
pub use verbs_api::*;

/// Names starting with this prefix are reserved for Tidal itself.
pub const RESERVED_PREFIX: &str = "__tidal";
