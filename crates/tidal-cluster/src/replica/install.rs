//! Snapshot installs on this node: when the log alone cannot bring it back (the source purged past
//! our position, we applied past a divergence point, or leader durability lost batches we had
//! committed), it fetches another node's snapshot and installs it under the term lock.

use super::Replica;
use crate::error::{Error, Result};
use crate::snapshot::{fetch_snapshot, install_fetched, FetchOutcome, InstallOutcome};
use std::sync::{Arc, Mutex};
use tidal_net::Peer;
use tidal_types::{NodeId, TermSeqno};
// tokio's clock: simulated time under turmoil.
use tokio::time::Instant;

pub use super::SNAPSHOT_INSTALL_INTERVAL_MIN;

/// The installs' state: single flight, rate limit, counts.
#[derive(Default)]
pub(super) struct Installs {
    /// Held while this node fetches and installs a snapshot (one at a time: the files are shared).
    installing: tokio::sync::Mutex<()>,
    /// When the last automatic install started (rate limit).
    last_install: Mutex<Option<Instant>>,
    stats: Mutex<InstallStats>,
}

/// This node's own snapshot installs (follower side), for status and metrics.
#[derive(Clone, Debug, Default)]
pub struct InstallStats {
    /// Installs completed since start.
    pub installed: u64,
    /// Installs that failed (transfer or install) since start.
    pub failed: u64,
    /// Position of the last completed install.
    pub last_position: Option<TermSeqno>,
}

impl Replica {
    /// Repairs a halted receiver from `leader`'s snapshot in the background (single flight and rate
    /// limited by [`Replica::install_from`]); a successful install clears the halt.
    pub(super) fn start_halt_repair(self: Arc<Self>, leader: NodeId) {
        tokio::spawn(async move {
            match self.install_from(leader, "halted: leader durability lost batches we committed").await {
                Ok(()) => {
                    if let Err(error) = self.pull_after_install(leader, false).await {
                        tracing::warn!(%leader, "pull after the halt repair: {error}");
                    }
                }
                Err(error) => tracing::warn!(%leader, "halt repair not done now: {error}"),
            }
        });
    }

    /// Fetches `source`'s snapshot (no lock held: the transfer may take long), then installs it under
    /// the term lock (ships and pulled chunks wait for the seconds the state replacement takes) and
    /// moves the ship feed and the commit frontier to the snapshot's position. At most one install
    /// runs at a time and automatic installs start at most every [`SNAPSHOT_INSTALL_INTERVAL_MIN`].
    pub(crate) async fn install_from(self: &Arc<Self>, source: NodeId, why: &str) -> Result<()> {
        let peer = self.peer(source).ok_or(Error::NotAPeer(source))?;
        let Ok(_installing) = self.installs.installing.try_lock() else {
            return Err(Error::InstallRunning);
        };
        {
            let mut last =
                self.installs.last_install.lock().expect("install lock is never held across a panic");
            if let Some(at) = last.filter(|at| at.elapsed() < SNAPSHOT_INSTALL_INTERVAL_MIN) {
                return Err(Error::InstallTooSoon {
                    why: why.to_string(),
                    ago: at.elapsed(),
                    interval: SNAPSHOT_INSTALL_INTERVAL_MIN,
                });
            }
            *last = Some(Instant::now());
        }
        let result = self.fetch_and_install(&peer, source, why).await;
        let mut stats = self.installs.stats.lock().expect("install stats lock is never held across a panic");
        match &result {
            Ok(Some(position)) => {
                stats.installed += 1;
                stats.last_position = Some(*position);
            }
            Ok(None) => {}
            Err(_) => stats.failed += 1,
        }
        result.map(|_| ())
    }

    /// `Some(position)` if a snapshot was installed, `None` if the log turned out to suffice.
    async fn fetch_and_install(
        self: &Arc<Self>,
        peer: &Peer,
        source: NodeId,
        why: &str,
    ) -> Result<Option<TermSeqno>> {
        tracing::warn!(%source, why, "fetching a snapshot");
        let fetched = fetch_snapshot(peer, self.me, &self.wal, &self.db, &self.data_dir, &mut |_| {})
            .await
            .map_err(|e| Error::Snapshot { from: source, why: format!("transfer: {e}") })?;
        let fetched = match fetched {
            FetchOutcome::Fetched(fetched) => fetched,
            FetchOutcome::NotNeeded { position } => {
                tracing::info!(%source, %position, "snapshot not needed: our log holds its position");
                return Ok(None);
            }
        };
        tracing::info!(%source, position = %fetched.position(), bytes = fetched.bytes(), "snapshot received; installing");
        let _term_lock = self.gate.lock().await;
        let outcome = install_fetched(fetched, &self.wal, &self.db, Some(&self.applier), &self.data_dir)
            .await
            .map_err(|e| Error::Snapshot { from: source, why: format!("install: {e}") })?;
        match outcome {
            InstallOutcome::Installed(report) => {
                self.feed.reset(self.wal.last_position());
                self.forget_leader_match();
                self.commit.advance(report.position.seqno);
                // A halt (leader durability lost committed batches of ours) is healed by this
                // install: the batches are in quarantine, the state is the source's.
                self.clear_halt();
                tracing::info!(%source, position = %report.position, bytes = report.bytes,
                    elapsed = ?report.elapsed, "snapshot installed; pulling on from it");
                Ok(Some(report.position))
            }
            InstallOutcome::NotNeeded { position } => {
                tracing::info!(%source, %position, "snapshot not needed any more: the log moved on");
                Ok(None)
            }
        }
    }
}

impl Replica {
    /// This node's snapshot installs.
    pub fn install_stats(&self) -> InstallStats {
        self.installs.stats.lock().expect("install stats lock is never held across a panic").clone()
    }
}
