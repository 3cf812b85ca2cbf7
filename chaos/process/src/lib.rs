//! Tier-3 harness: runs the real `tidal` binary as OS processes on loopback, kills them with
//! SIGKILL, restarts them on the same data dirs, and cuts links between them.
//!
//! # Layout
//!
//! - [`ProcessCluster`] (`cluster.rs`): writes a cluster file and secret, starts one
//!   `tidal serve --cluster FILE --node-id N --data-dir DIR` per node, waits for a leader, and
//!   answers the questions tests ask (leader, status, digests, metrics, convergence).
//! - [`Relay`] (`relay.rs`): a TCP relay per directed link A→B. Node A reaches B's RPC server only
//!   through it (`tidal serve --dial B=RELAY`), so the harness can cut and restore the link while both
//!   processes keep running (docs/decisions/009).
//! - [`NodeProcess`] (`process.rs`): one child process, its log file, SIGKILL and SIGTERM by pid.
//! - [`SingleNode`] (`single.rs`): one stand-alone node, for crash tests without a cluster.
//! - [`TestDir`] (`test_dir.rs`): a temporary root for data dirs and logs, kept when a test fails.
//!
//! # What is delicate
//!
//! - Every wait polls observable state (HTTP status, `/readyz`, digests) until [`DEADLINE`]; nothing
//!   sleeps to let something happen. A wait that times out returns the last unmet condition and the
//!   tail of the node logs, so a failure explains itself.
//! - Nodes' ports are leased ([`PortLease`], `ports.rs`): from below the kernel's ephemeral range,
//!   locked against every other test process, held until the cluster is dropped, so nothing takes
//!   a port between its choice and the node's bind, or between a node's kill and its restart.
//!   Relays bind port 0 and keep their listeners.
//! - A process is only ever signalled by the pid of a child this harness spawned; dropping the
//!   harness SIGKILLs its children, so a failed test leaves no process behind.
//!
//! Not a load generator and not a checker of its own: tests decide what "correct" means.

mod cluster;
mod ports;
mod process;
mod relay;
mod single;
mod test_dir;

pub use cluster::{write_private, Converged, ProcessCluster};
pub use ports::PortLease;
pub use process::NodeProcess;
pub use relay::Relay;
pub use single::SingleNode;
pub use test_dir::TestDir;

use std::time::Duration;

/// Longest any wait on observable state lasts (startup, election, convergence). Generous: the test
/// machine has two cores shared with compilers.
pub const DEADLINE: Duration = Duration::from_secs(90);

/// Polling step of those waits (each wait re-checks state until [`DEADLINE`]; this is not a
/// synchronization).
pub const POLL: Duration = Duration::from_millis(50);

/// The last `lines` lines of a log file without backtrace frames (for error messages; the same
/// quote `tidal cluster up` gives).
pub fn log_tail(path: &std::path::Path, lines: usize) -> String {
    tidal_client::node_log::tail(path, lines)
}
