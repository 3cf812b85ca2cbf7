//! A node's one fatal state (PROTOCOL.md, "Storage errors and torn writes"; decisions/059).
//!
//! A storage fault the node cannot recover from in place (a poisoned WAL, a dead applier, a failed
//! engine flush or fjall worker, a failed vote fsync, openraft's core stopping) is raised here once,
//! by whoever sees it first. Everything that must react watches it: the replica leaves office and
//! stops its heartbeats and elections at once, `/healthz` and `/readyz` fail with the reason, and
//! `tidal serve` exits non-zero shortly after, for a supervisor (or the operator) to restart it
//! while the cluster fails over. The first reason raised is kept; later ones are only logged.

use std::sync::Arc;
use tokio::sync::watch;

/// Where a fatal fault came from (the `source` label of `tidal_fatal`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FatalSource {
    /// The WAL is poisoned (a failed write or fsync of a segment, a failed `wal.meta` write).
    Wal,
    /// The applier stopped: an apply failed, or its thread ended or panicked.
    Applier,
    /// The engine refuses applies: a background flush failed, or fjall poisoned itself.
    Engine,
    /// A vote could not be persisted (fsynced) in the control plane's store.
    Vote,
    /// The control plane stopped: openraft's core exited, or its store's database failed.
    ControlPlane,
}

impl FatalSource {
    /// Every source, in a fixed order (metrics).
    pub const ALL: [FatalSource; 5] = [
        FatalSource::Wal,
        FatalSource::Applier,
        FatalSource::Engine,
        FatalSource::Vote,
        FatalSource::ControlPlane,
    ];

    /// The label.
    pub fn as_str(self) -> &'static str {
        match self {
            FatalSource::Wal => "wal",
            FatalSource::Applier => "applier",
            FatalSource::Engine => "engine",
            FatalSource::Vote => "vote",
            FatalSource::ControlPlane => "control_plane",
        }
    }
}

impl std::fmt::Display for FatalSource {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.as_str())
    }
}

/// Why the node stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FatalReason {
    /// Where the fault came from.
    pub source: FatalSource,
    /// What failed, in words.
    pub detail: String,
}

impl std::fmt::Display for FatalReason {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "fatal storage fault ({}): {}", self.source, self.detail)
    }
}

/// The node's fatal state: `None` until a fault is raised, then the first reason for good. Cheap to
/// clone; every clone is the same state.
#[derive(Clone)]
pub struct Fatal(Arc<watch::Sender<Option<FatalReason>>>);

impl Default for Fatal {
    fn default() -> Fatal {
        Fatal::new()
    }
}

impl std::fmt::Debug for Fatal {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_tuple("Fatal").field(&*self.0.borrow()).finish()
    }
}

impl Fatal {
    /// A node with no fault.
    pub fn new() -> Fatal {
        Fatal(Arc::new(watch::channel(None).0))
    }

    /// Raises a fault. Returns whether it was the first (the one kept). Never waits: callable from
    /// any thread (the WAL writer's, the applier's, an async task).
    pub fn raise(&self, source: FatalSource, detail: impl Into<String>) -> bool {
        let reason = FatalReason { source, detail: detail.into() };
        let first = self.0.send_if_modified(|current| {
            if current.is_some() {
                return false;
            }
            *current = Some(reason.clone());
            true
        });
        if first {
            tracing::error!(
                source = source.as_str(),
                "{reason}; this node leaves office, fails /healthz and /readyz, and exits for a restart"
            );
        } else {
            tracing::warn!(
                source = source.as_str(),
                "another fatal fault after the first: {}",
                reason.detail
            );
        }
        first
    }

    /// The fault, if one was raised.
    pub fn get(&self) -> Option<FatalReason> {
        self.0.borrow().clone()
    }

    /// Whether a fault was raised.
    pub fn is_raised(&self) -> bool {
        self.0.borrow().is_some()
    }

    /// Watches the state (it changes once, from `None` to the first reason).
    pub fn subscribe(&self) -> watch::Receiver<Option<FatalReason>> {
        self.0.subscribe()
    }

    /// Resolves once a fault is raised, with it.
    pub async fn raised(&self) -> FatalReason {
        let mut watch = self.subscribe();
        loop {
            if let Some(reason) = watch.borrow_and_update().clone() {
                return reason;
            }
            // The sender lives in `self`, so the channel never closes while this waits.
            if watch.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_first_fault_is_kept_and_watchers_hear_it() {
        let fatal = Fatal::new();
        assert!(!fatal.is_raised());
        let waiter = tokio::spawn({
            let fatal = fatal.clone();
            async move { fatal.raised().await }
        });
        assert!(fatal.raise(FatalSource::Wal, "fsync failed"));
        assert!(!fatal.raise(FatalSource::Applier, "applier stopped"));
        let reason = waiter.await.unwrap();
        assert_eq!(reason, FatalReason { source: FatalSource::Wal, detail: "fsync failed".into() });
        assert_eq!(fatal.get(), Some(reason));
        assert_eq!(
            fatal.get().unwrap().to_string(),
            "fatal storage fault (wal): fsync failed",
            "the exit's message names the source"
        );
    }
}
