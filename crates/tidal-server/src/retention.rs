//! Stream retention: when configured (`stream_retention_events_max`, `stream_retention_age_s`; off
//! by default), the leader trims every stream to those bounds now and then. Each trim is an
//! ordinary logged trim, so every node deletes the same events; a follower does nothing here.
//!
//! A round trims at most [`SCAN_MAX`] events per stream, so one trim never makes the applier count
//! an unbounded range; a stream far over its bounds shrinks over several rounds.

use std::sync::Arc;
use std::time::Duration;

use tidal_core::{Records, StreamControl};

use crate::auth::Principal;
use crate::node::Node;

/// Most events one retention trim removes.
pub const SCAN_MAX: u64 = 100_000;
/// Streams looked at per page.
const STREAMS_PER_PAGE: usize = 100;
/// The principal retention trims are logged as.
pub const PRINCIPAL: &str = "__tidal_retention";

/// Whether retention is configured.
pub fn enabled(node: &Node) -> bool {
    let config = node.config();
    config.stream_retention_events_max.is_some() || config.stream_retention_age_s.is_some()
}

/// One round over every stream, if this node leads (a single node always does); returns the
/// trims it wrote.
pub async fn round(node: &Arc<Node>) -> usize {
    if node.replica().is_some_and(|replica| !replica.is_leader()) {
        return 0;
    }
    let config = node.config();
    let cutoff_s = config.stream_retention_age_s.map(|age| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        i64::try_from(now.as_secs().saturating_sub(age)).unwrap_or(i64::MAX)
    });
    let principal = Principal::system(PRINCIPAL);
    let (mut after, mut trims) = (String::new(), 0);
    loop {
        let page = match node.db().streams(&after, STREAMS_PER_PAGE) {
            Ok(page) => page,
            Err(error) => {
                tracing::error!("stream retention: cannot list streams: {error:#}");
                return trims;
            }
        };
        for info in &page {
            // The scan reads up to SCAN_MAX events: off the async workers.
            let (scanner, stream, keep) =
                (node.clone(), info.name.clone(), config.stream_retention_events_max);
            let point = tidal_cluster::blocking::blocking(move || {
                scanner.db().stream_retention_point(&stream, keep, cutoff_s, SCAN_MAX)
            })
            .await;
            let Ok(Ok(Some(through))) = point else { continue };
            let trim = Records::StreamControl(StreamControl::Trim { stream: info.name.clone(), through });
            match node.write(&principal, None, trim).await {
                Ok(_) => trims += 1,
                // Not the leader any more, or not ready: the next round (on the next leader) does it.
                Err(error) => tracing::debug!(
                    "stream retention: trim of {:?} not written: {}",
                    info.name,
                    error.message
                ),
            }
        }
        match page.last() {
            Some(last) if page.len() == STREAMS_PER_PAGE => after = last.name.clone(),
            _ => return trims,
        }
    }
}

/// Runs a round of stream retention and one of inbox TTL expiry every
/// `stream_retention_interval_ms` until `stop`.
pub fn spawn(node: Arc<Node>, mut stop: tokio::sync::oneshot::Receiver<()>) -> tokio::task::JoinHandle<()> {
    let interval = Duration::from_millis(node.config().stream_retention_interval_ms.max(100));
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = &mut stop => return,
            }
            if enabled(&node) {
                let trims = round(&node).await;
                if trims > 0 {
                    tracing::info!(trims, "stream retention trimmed");
                }
            }
            let expiries = crate::inbox_ttl::round(&node).await;
            if expiries > 0 {
                tracing::info!(expiries, "inbox TTL dropped expired messages");
            }
        }
    })
}
