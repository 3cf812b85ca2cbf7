//! Hard-negatives anti-entropy (the one piece of data outside the log; docs/glossary.md).
//!
//! Hard negatives are an ORSWOT CRDT accepted on any node. Every [`RECONCILE_INTERVAL`] (and on
//! `POST /cluster/reconcile`) a node compares its negatives digest with each peer's and, where they
//! differ, pulls the peer's states page by page (`Negatives` RPC) and merges them (a join: merging
//! twice or in any order gives the same state). Every node pulling from every peer converges them
//! all. Memory stays bounded by one page; peer states are decoded with the checked decoder and a bad
//! entry is skipped and counted, never merged.

use super::Replica;
use crate::error::{Error, Result};
use std::sync::Arc;
use std::time::Duration;
use tidal_core::NegativesState;
use tidal_net::NegativesPage;
use tidal_types::{NodeId, USER_BYTES_MAX};

/// How often a node reconciles its hard negatives with every peer.
pub const RECONCILE_INTERVAL: Duration = Duration::from_secs(30);
/// Users per page pulled from a peer.
const PAGE: u32 = 256;

/// What reconciling with one peer did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerReconcile {
    /// The peer.
    pub node: NodeId,
    /// Whether its negatives digest differed from ours when compared.
    pub differed: bool,
    /// Users whose state was merged from it.
    pub merged_users: u64,
    /// Entries refused (bad name or state).
    pub refused: u64,
    /// Outcome in words.
    pub outcome: String,
}

impl Replica {
    /// Reconciles hard negatives with every peer now; with `dry_run`, only compares digests.
    pub async fn reconcile(&self, dry_run: bool) -> Vec<PeerReconcile> {
        let mut report = Vec::new();
        for (node, peer) in self.peer_list() {
            let mut entry =
                PeerReconcile { node, differed: false, merged_users: 0, refused: 0, outcome: String::new() };
            let ours = match self.negatives_digest().await {
                Ok(digest) => digest,
                Err(why) => {
                    entry.outcome = format!("cannot read our own negatives: {why}");
                    report.push(entry);
                    continue;
                }
            };
            let theirs = match peer.negatives("", 0).await {
                Ok((digest, _)) => digest,
                Err(error) => {
                    entry.outcome = format!("unreachable: {error}");
                    report.push(entry);
                    continue;
                }
            };
            entry.differed = theirs != ours;
            if !entry.differed {
                entry.outcome = "same negatives".into();
            } else if dry_run {
                entry.outcome = "negatives differ: would pull and merge theirs".into();
            } else {
                entry.outcome = match self.merge_from(&peer, &mut entry).await {
                    Ok(()) => format!("merged {} users ({} refused)", entry.merged_users, entry.refused),
                    Err(why) => format!("stopped after {} users: {why}", entry.merged_users),
                };
            }
            report.push(entry);
        }
        report
    }

    async fn merge_from(&self, peer: &tidal_net::Peer, entry: &mut PeerReconcile) -> Result<()> {
        let mut after = String::new();
        loop {
            let (_, page) = peer.negatives(&after, PAGE).await.map_err(|e| Error::net(entry.node, e))?;
            let full = page.len() == PAGE as usize;
            let Some((last, _)) = page.last() else { return Ok(()) };
            if *last <= after {
                return Err(Error::net(entry.node, format!("its page does not advance past {after:?}")));
            }
            after = last.clone();
            let mut states = Vec::with_capacity(page.len());
            for (user, bytes) in page {
                match NegativesState::from_bytes(&bytes) {
                    Ok(state) if !user.is_empty() && user.len() <= USER_BYTES_MAX => {
                        states.push((user, state))
                    }
                    Ok(_) => entry.refused += 1,
                    Err(why) => {
                        tracing::warn!(node = %entry.node, user, "refused a hard-negatives state: {why}");
                        entry.refused += 1;
                    }
                }
            }
            let db = self.db.clone();
            let merged = crate::blocking::blocking(move || -> Result<u64> {
                for (user, state) in &states {
                    db.negatives_merge(user, state).map_err(|e| Error::Store(e.to_string()))?;
                }
                Ok(states.len() as u64)
            })
            .await
            .map_err(|e| Error::Store(e.to_string()))??;
            entry.merged_users += merged;
            if !full {
                return Ok(());
            }
        }
    }

    async fn negatives_digest(&self) -> Result<[u8; 32]> {
        let db = self.db.clone();
        crate::blocking::blocking(move || db.negatives_digest().map_err(|e| Error::Store(e.to_string())))
            .await
            .map_err(|e| Error::Store(e.to_string()))?
    }

    /// Serves a page of our hard negatives (the `Negatives` RPC).
    pub async fn serve_negatives(&self, after: String, limit: u32) -> Result<NegativesPage> {
        let db = self.db.clone();
        crate::blocking::blocking(move || -> Result<NegativesPage> {
            let digest = db.negatives_digest().map_err(|e| Error::Store(e.to_string()))?.to_vec();
            if limit == 0 {
                return Ok((digest, Vec::new()));
            }
            let page = db.negatives_page(&after, limit as usize).map_err(|e| Error::Store(e.to_string()))?;
            Ok((digest, page.into_iter().map(|(user, state)| (user, state.to_bytes())).collect()))
        })
        .await
        .map_err(|e| Error::Store(e.to_string()))?
    }

    /// The periodic anti-entropy round, until the replica stops.
    pub(super) async fn reconcile_loop(self: Arc<Self>) {
        let mut stopped = self.stopped.subscribe();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(RECONCILE_INTERVAL) => {}
                _ = stopped.wait_for(|stopped| *stopped) => return,
            }
            for peer in self.reconcile(false).await {
                if peer.merged_users > 0 || peer.refused > 0 {
                    tracing::info!(node = %peer.node, merged = peer.merged_users, refused = peer.refused, "hard negatives reconciled");
                }
            }
        }
    }
}
