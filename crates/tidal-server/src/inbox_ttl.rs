//! Inbox TTL: when configured (`inbox_ttl_s`, `inbox_topic_ttl_s`; off by default), the leader drops
//! messages older than their topic's TTL now and then, as logged discards (`expired`), so every
//! node drops the same messages and a replay needs no clock; a follower does nothing here.
//!
//! Only a prefix of a topic expires: a round discards through the last message older than the TTL
//! that has no younger message before it, so a younger message is never dropped ahead of an older
//! one. A message's age is the leader's clock against the logged time of its send. A round looks at
//! most [`SCAN_MAX`] messages per topic; a topic far behind catches up over several rounds.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tidal_core::{InboxConsume, Records};

use crate::auth::Principal;
use crate::node::Node;

/// Most messages one expiry drops.
pub const SCAN_MAX: usize = 10_000;
/// Live topics looked at per page.
const TOPICS_PER_PAGE: usize = 256;
/// The principal expiries are logged as.
pub const PRINCIPAL: &str = "__tidal_inbox_ttl";

/// One round over every live topic, if this node leads; returns the discards it wrote.
pub async fn round(node: &Arc<Node>) -> usize {
    let config = &node.config().inbox;
    if !config.expires() || node.replica().is_some_and(|replica| !replica.is_leader()) {
        return 0;
    }
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_millis() as u64);
    let principal = Principal::system(PRINCIPAL);
    let (mut after, mut discards): (Option<(String, String)>, usize) = (None, 0);
    loop {
        let cursor = after.as_ref().map(|(owner, topic)| (owner.as_str(), topic.as_str()));
        let page = match node.db().inbox_live_topics(cursor, TOPICS_PER_PAGE) {
            Ok(page) => page,
            Err(error) => {
                tracing::error!("inbox TTL: cannot list topics: {error:#}");
                return discards;
            }
        };
        for (owner, topic, _) in &page {
            let Some(ttl_s) = config.ttl_of(topic) else { continue };
            let cutoff_ms = now_ms.saturating_sub(u64::from(ttl_s) * 1000);
            // The scan reads up to SCAN_MAX messages: off the async workers.
            let (scanner, o, t) = (node.clone(), owner.clone(), topic.clone());
            let point = tidal_cluster::blocking::blocking(move || {
                scanner.db().inbox_expiry_point(&o, &t, cutoff_ms, SCAN_MAX)
            })
            .await;
            let Ok(Ok(Some(through))) = point else { continue };
            let discard =
                InboxConsume::Discard { owner: owner.clone(), topic: topic.clone(), through, expired: true };
            match node.write(&principal, None, Records::InboxConsume(discard)).await {
                Ok(_) => discards += 1,
                // Not the leader any more, or not ready: the next round (on the next leader) does it.
                Err(error) => {
                    tracing::debug!("inbox TTL: expiry of {owner:?}/{topic:?} not written: {}", error.message)
                }
            }
        }
        match page.last() {
            Some((owner, topic, _)) if page.len() == TOPICS_PER_PAGE => {
                after = Some((owner.clone(), topic.clone()))
            }
            _ => return discards,
        }
    }
}
