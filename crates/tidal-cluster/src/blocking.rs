//! Blocking work (engine and file I/O) started from async code.
//!
//! In production it runs on tokio's blocking pool. In the simulation (when this thread counts its
//! work on a [`tidal_types::activity::Scheduler`]) it runs right here, on the thread that steps
//! every simulated host: a blocking-pool thread finishing at an OS-chosen moment woke its task
//! somewhere in the middle of the host's other tasks, and a replay of the seed polled them in
//! another order (decisions/051). Work that waits for the node's own threads (the WAL writer, the
//! applier) must not come here: those take their turns only between steps (see
//! [`tidal_types::activity::carry_awaiting_threads`]).

/// The blocking work did not finish (it panicked on the blocking pool).
#[derive(Debug, thiserror::Error)]
#[error("blocking task failed: {0}")]
pub struct BlockingError(String);

/// Runs `work` off the async workers (see the module doc) and returns what it returned.
pub async fn blocking<R: Send + 'static>(
    work: impl FnOnce() -> R + Send + 'static,
) -> Result<R, BlockingError> {
    if tidal_types::activity::current().is_some() {
        return Ok(work());
    }
    tokio::task::spawn_blocking(work).await.map_err(|error| BlockingError(error.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::Arc;
    use tidal_types::activity::{set_current, Scheduler};

    /// A scheduler that counts and orders nothing: this test only asks whether one is installed.
    #[derive(Debug)]
    struct Installed;

    impl Scheduler for Installed {
        fn new_rank(&self) -> u64 {
            0
        }
        fn work_begun(&self) {}
        fn work_done(&self) {}
        fn set_awake(&self, _: u64, _: bool) {}
        fn take_turn(&self, _: u64) {}
        fn end_turn(&self) {}
        fn block(&self, _: u64) {}
        fn unblock(&self, _: u64) {}
        fn open_turns(&self, _: bool) {}
    }

    #[tokio::test]
    async fn runs_on_the_blocking_pool_in_production_and_inline_in_the_simulation() {
        let here = std::thread::current().id();
        let pool = blocking(move || std::thread::current().id() != here).await.unwrap();
        assert!(pool, "without a scheduler the work runs on another thread");
        let previous = set_current(Some(Arc::new(Installed)));
        let inline = blocking(move || std::thread::current().id() == here).await.unwrap();
        set_current(previous);
        assert!(inline, "with a scheduler the work runs on the calling thread");
    }
}
