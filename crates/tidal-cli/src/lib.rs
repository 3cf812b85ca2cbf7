//! The tooling of the `tidal` binary: everything it does besides `tidal serve` (which is
//! [`tidal_server::run`]).
//!
//! # Layout
//! - `bench` (with `bench_conn`, its lean connection, and `bench_streams`, `bench_inbox`, the
//!   streams and inboxes workloads): `tidal bench`, the load generator.
//! - `cluster_cmd`: `tidal cluster up/down/add-node/remove-node/failover-bench`, a local cluster of
//!   `tidal serve` processes on loopback.
//! - `ops`: the operator verbs (`tidal status`, `catchup`, `heal`, `promote`, `members`, ...),
//!   thin clients of the HTTP routes.
//! - `backup_cmd`: `tidal backup` and `tidal restore`; `progress`: the progress lines of long verbs.
//! - `gates`: `tidal gates`, the exit gates on a local cluster; `demo`: `tidal demo`, the guided tour.
//! - `stream_cmd`, `inbox_cmd`: `tidal stream ...` and `tidal inbox ...`, the streams and inboxes
//!   APIs from the command line.
//!
//! `main.rs` parses the command line and hands each subcommand to one of these; only this crate
//! binds sockets from configuration and reads signals.
#![deny(missing_docs)]

pub mod backup_cmd;
pub mod bench;
mod bench_conn;
mod bench_feed;
mod bench_inbox;
mod bench_streams;
pub mod cluster_cmd;
pub mod demo;
pub mod gates;
pub mod inbox_cmd;
pub mod local_tls;
pub mod logging;
pub mod ops;
pub mod progress;
pub mod stream_cmd;
