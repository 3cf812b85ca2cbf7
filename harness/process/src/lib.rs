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
//! - Ports are picked by binding port 0 and releasing it; another process may take one in between.
//!   Relays keep their listeners, so only the nodes' own HTTP and RPC ports have that window.
//! - A process is only ever signalled by the pid of a child this harness spawned; dropping the
//!   harness SIGKILLs its children, so a failed test leaves no process behind.
//!
//! Not a load generator and not a checker of its own: tests decide what "correct" means.

mod cluster;
mod process;
mod relay;
mod single;
mod test_dir;

pub use cluster::{Converged, ProcessCluster};
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

/// A loopback port free at the time of the call.
pub fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// The last `lines` lines of a log file (for error messages), without backtrace frames: under
/// `RUST_BACKTRACE=1` (as in CI) a node's exit error or panic is followed by dozens of frames that
/// would push the message itself out of the tail. The same rule as `tidal cluster up`'s quote.
pub fn log_tail(path: &std::path::Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|error| format!("<cannot read: {error}>"));
    let kept = without_backtraces(&text);
    kept[kept.len().saturating_sub(lines)..].join("\n")
}

/// The lines of `text` without Rust backtraces: a heading (anyhow's `Stack backtrace:`, a panic's
/// `stack backtrace:`) and the numbered frames and `at` locations after it. An error's numbered
/// `Caused by:` list, which has no heading before it, is kept.
fn without_backtraces(text: &str) -> Vec<&str> {
    let mut in_trace = false;
    let mut kept = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.eq_ignore_ascii_case("stack backtrace:") {
            in_trace = true;
            continue;
        }
        let indented = trimmed.len() < line.len();
        let numbered = trimmed.split_once(": ").is_some_and(|(n, _)| n.bytes().all(|b| b.is_ascii_digit()));
        if in_trace && indented && (numbered || trimmed.starts_with("at ")) {
            continue;
        }
        in_trace = false;
        kept.push(line);
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::log_tail;

    #[test]
    fn a_log_tail_drops_backtrace_frames_and_keeps_the_causes() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("n1.log");
        let mut text =
            String::from("Error: top\n\nCaused by:\n    0: middle\n    1: root\n\nStack backtrace:\n");
        for frame in 0..50 {
            text.push_str(&format!("  {frame}: tidal::serve\n             at ./src/main.rs:1:1\n"));
        }
        text.push_str(
            "thread 'main' panicked at src/x.rs:1:1:\nboom\nstack backtrace:\n   0: std::begin_panic\n",
        );
        std::fs::write(&log, text).unwrap();
        let tail = log_tail(&log, 40);
        assert!(
            tail.contains("Error: top") && tail.contains("0: middle") && tail.contains("1: root"),
            "{tail}"
        );
        assert!(tail.ends_with("boom"), "{tail}");
        assert!(
            !tail.contains("main.rs") && !tail.contains("begin_panic") && !tail.contains("acktrace"),
            "{tail}"
        );
    }
}
