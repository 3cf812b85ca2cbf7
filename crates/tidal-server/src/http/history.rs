//! `GET /cluster/history`: the node's view of the cluster sampled once a second into a bounded
//! ring, and the events read off consecutive samples, so the `/ui` page can draw minutes of lag
//! and list what changed even when it was just opened or reloaded.
//!
//! What is delicate: the ring and the event list are bounded ([`SAMPLES_MAX`], [`EVENTS_MAX`]) and
//! a sample costs what one `GET /cluster/status` costs (locks, one read of the quarantine
//! directory), once a second whether or not anyone looks. Events come from [`events_between`], a
//! pure function of two samples; a member's reachability is the sampling node's view, so only the
//! leader's events say anything about its followers (a follower tracks no other member).

use super::{cluster_status, query_u64, AppResult, AppState};
use crate::node::Node;
use axum::extract::{RawQuery, State};
use axum::Json;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tidal_types::{ClusterEvent, ClusterEventKind, ClusterHistory, NodeStatus, StatusSample};

/// Time between samples: the page refreshes about as often.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);
/// Samples kept: ten minutes at one a second. A sample of a 3-node cluster is about 1 KB of JSON.
pub const SAMPLES_MAX: usize = 600;
/// Events kept: enough for a few minutes of a flapping member, small enough to send whole.
pub const EVENTS_MAX: usize = 200;
/// A member whose last answer is older than this counts as unreachable: several times the
/// heartbeat, well under the time an operator would act on.
pub const UNREACHABLE_AFTER_MS: u64 = 3000;

/// The ring of samples and the list of events.
#[derive(Default)]
pub struct History {
    recorded: Mutex<Recorded>,
}

#[derive(Default)]
struct Recorded {
    samples: VecDeque<StatusSample>,
    events: VecDeque<ClusterEvent>,
}

impl History {
    /// Adds `sample`, with the events since the previous one, dropping the oldest beyond the bounds.
    pub fn record(&self, sample: StatusSample) {
        let mut recorded = self.recorded.lock().expect("history lock poisoned");
        if let Some(previous) = recorded.samples.back() {
            let events = events_between(previous, &sample);
            recorded.events.extend(events);
        }
        recorded.samples.push_back(sample);
        while recorded.samples.len() > SAMPLES_MAX {
            recorded.samples.pop_front();
        }
        while recorded.events.len() > EVENTS_MAX {
            recorded.events.pop_front();
        }
    }

    /// Samples and events after `since_ms`, oldest first.
    pub fn since(&self, node_id: u64, since_ms: u64) -> ClusterHistory {
        let recorded = self.recorded.lock().expect("history lock poisoned");
        ClusterHistory {
            node_id,
            interval_ms: SAMPLE_INTERVAL.as_millis() as u64,
            unreachable_after_ms: UNREACHABLE_AFTER_MS,
            samples: recorded.samples.iter().filter(|s| s.at_ms > since_ms).cloned().collect(),
            events: recorded.events.iter().filter(|e| e.at_ms > since_ms).cloned().collect(),
        }
    }
}

/// `GET /cluster/history?since_ms=T`: what was recorded after `T` (everything without it).
pub(super) async fn get(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
) -> AppResult<Json<ClusterHistory>> {
    let since_ms = query_u64(&query, "since_ms")?.unwrap_or(0);
    let node_id = state.node.replica().map_or(1, |replica| replica.me().0);
    Ok(Json(state.history.since(node_id, since_ms)))
}

/// Samples `node` into `history` every [`SAMPLE_INTERVAL`] until `stop`.
pub fn spawn(
    node: Arc<Node>,
    history: Arc<History>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(SAMPLE_INTERVAL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = &mut stop => return,
            }
            match sample(&node) {
                Ok(sample) => history.record(sample),
                Err(error) => tracing::debug!("status sample not taken: {}", error.message),
            }
        }
    })
}

/// The node's status and replication counters now.
fn sample(node: &Node) -> AppResult<StatusSample> {
    let status = cluster_status(node, node.applied_seqno())?;
    let at_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_millis() as u64);
    let Some(replica) = node.replica() else {
        return Ok(StatusSample {
            at_ms,
            status,
            refusals: BTreeMap::new(),
            pulls: 0,
            snapshot_installs: 0,
            snapshot_install_failures: 0,
        });
    };
    let refusals = replica.refusals();
    let installs = replica.install_stats();
    Ok(StatusSample {
        at_ms,
        status,
        refusals: refusals.into_iter().map(|(class, count)| (class.as_str().to_string(), count)).collect(),
        pulls: replica.pull_stats().pulls,
        snapshot_installs: installs.installed,
        snapshot_install_failures: installs.failed,
    })
}

/// Whether the sampling node counts `member` as unreachable: not itself, and silent for longer
/// than [`UNREACHABLE_AFTER_MS`] or never heard. Only meaningful on a leader.
pub fn unreachable(sampler: u64, member: &NodeStatus) -> bool {
    member.id != sampler && member.lag_ms.is_none_or(|lag| lag > UNREACHABLE_AFTER_MS)
}

/// What changed from `previous` to `next`: leadership, members' reachability (on a leader), pulls
/// and snapshot heals it sees, its own refusals and quarantine.
pub fn events_between(previous: &StatusSample, next: &StatusSample) -> Vec<ClusterEvent> {
    let (before, after) = (&previous.status, &next.status);
    let mut events = Vec::new();
    let mut event = |kind, node, message: String| {
        events.push(ClusterEvent { at_ms: next.at_ms, kind, node, message });
    };
    if before.leader_id != after.leader_id || before.term != after.term {
        let leader = after.leader_id.map_or_else(|| "no leader".to_string(), |id| format!("leader {id}"));
        event(ClusterEventKind::Leader, after.leader_id, format!("term {}: {leader}", after.term));
    }
    // Followers' progress is the leader's view only; a follower's sample knows no other member.
    if after.role == "leader" && before.role != "leader" {
        for member in after.nodes.iter().filter(|member| unreachable(after.node_id, member)) {
            let message = format!("node {} does not answer the new leader", member.id);
            event(ClusterEventKind::Unreachable, Some(member.id), message);
        }
    }
    let leads = after.role == "leader" && before.role == "leader";
    for member in after.nodes.iter().filter(|_| leads) {
        let Some(was) = before.nodes.iter().find(|old| old.id == member.id) else { continue };
        let id = Some(member.id);
        match (unreachable(before.node_id, was), unreachable(after.node_id, member)) {
            (false, true) => {
                event(ClusterEventKind::Unreachable, id, format!("node {} stopped answering", member.id))
            }
            (true, false) => event(ClusterEventKind::Answering, id, format!("node {} answers", member.id)),
            _ => {}
        }
        match (was.pulling, member.pulling) {
            (false, true) => {
                event(ClusterEventKind::PullStarted, id, format!("node {} catching up by pull", member.id))
            }
            (true, false) => event(ClusterEventKind::PullEnded, id, format!("node {} pull ended", member.id)),
            _ => {}
        }
        match (was.snapshot, member.snapshot) {
            (false, true) => event(
                ClusterEventKind::SnapshotStarted,
                id,
                format!("node {} healed by a snapshot", member.id),
            ),
            (true, false) => {
                event(ClusterEventKind::SnapshotEnded, id, format!("node {} snapshot heal ended", member.id))
            }
            _ => {}
        }
    }
    for (reason, count) in &next.refusals {
        let added = count.saturating_sub(previous.refusals.get(reason).copied().unwrap_or(0));
        if added > 0 {
            event(ClusterEventKind::Refused, Some(after.node_id), format!("refused {added} × {reason}"));
        }
    }
    if after.quarantine_files > before.quarantine_files {
        let message =
            format!("WAL quarantine: {} files, {} seqnos", after.quarantine_files, after.quarantined_seqnos);
        event(ClusterEventKind::Quarantined, Some(after.node_id), message);
    }
    events
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tidal_types::ClusterStatus;

    fn member(id: u64, lag_ms: Option<u64>) -> NodeStatus {
        NodeStatus {
            id,
            role: if id == 1 { "leader".into() } else { "follower".into() },
            learner: false,
            http: format!("127.0.0.1:{}", 7070 + id),
            durable_seqno: 10,
            applied_seqno: 10,
            lag_ms,
            matched_seqno: 10,
            pulling: false,
            snapshot: false,
        }
    }

    /// A sample of node 1 leading term `term` at `at_ms`, with members 2 and 3 silent for `lags`.
    fn sample(at_ms: u64, term: u64, lags: [Option<u64>; 2]) -> StatusSample {
        StatusSample {
            at_ms,
            status: ClusterStatus {
                node_id: 1,
                role: "leader".into(),
                term,
                leader_id: Some(1),
                durable_seqno: 10,
                commit_seqno: 10,
                applied_seqno: 10,
                baseline_term: term,
                baseline_seqno: 0,
                quarantine_files: 0,
                quarantined_seqnos: 0,
                nodes: vec![member(1, Some(0)), member(2, lags[0]), member(3, lags[1])],
            },
            refusals: BTreeMap::new(),
            pulls: 0,
            snapshot_installs: 0,
            snapshot_install_failures: 0,
        }
    }

    #[test]
    fn a_silent_member_is_reported_once_when_it_stops_and_once_when_it_answers() {
        let healthy = sample(1000, 2, [Some(50), Some(40)]);
        let silent = sample(2000, 2, [Some(50), Some(UNREACHABLE_AFTER_MS + 1)]);
        let still = sample(3000, 2, [Some(50), Some(UNREACHABLE_AFTER_MS + 1001)]);
        let back = sample(4000, 2, [Some(50), Some(10)]);
        assert_eq!(events_between(&healthy, &healthy), vec![]);
        let stopped = events_between(&healthy, &silent);
        assert_eq!(stopped.len(), 1, "{stopped:?}");
        assert_eq!(
            (stopped[0].kind, stopped[0].node, stopped[0].at_ms),
            (ClusterEventKind::Unreachable, Some(3), 2000)
        );
        assert_eq!(events_between(&silent, &still), vec![]);
        let answers = events_between(&still, &back);
        assert_eq!((answers[0].kind, answers[0].node), (ClusterEventKind::Answering, Some(3)));
    }

    #[test]
    fn a_new_term_refusals_and_quarantine_are_events() {
        let before = sample(1000, 2, [Some(5), Some(5)]);
        let mut after = sample(2000, 3, [Some(5), Some(5)]);
        after.refusals.insert("stale_term".into(), 4);
        after.status.quarantine_files = 1;
        after.status.quarantined_seqnos = 7;
        let kinds: Vec<_> =
            events_between(&before, &after).into_iter().map(|e| (e.kind, e.message)).collect();
        assert_eq!(
            kinds,
            vec![
                (ClusterEventKind::Leader, "term 3: leader 1".to_string()),
                (ClusterEventKind::Refused, "refused 4 × stale_term".to_string()),
                (ClusterEventKind::Quarantined, "WAL quarantine: 1 files, 7 seqnos".to_string()),
            ]
        );
    }

    #[test]
    fn a_new_leader_reports_the_members_it_does_not_hear() {
        let mut follower = sample(1000, 2, [Some(5), Some(5)]);
        follower.status.role = "follower".into();
        let leader = sample(2000, 3, [Some(5), None]);
        let events = events_between(&follower, &leader);
        let kinds: Vec<_> = events.iter().map(|e| (e.kind, e.node)).collect();
        assert_eq!(
            kinds,
            vec![(ClusterEventKind::Leader, Some(1)), (ClusterEventKind::Unreachable, Some(3))]
        );
    }

    #[test]
    fn the_ring_keeps_the_newest_samples_and_answers_after_since() {
        let history = History::default();
        for second in 1..=(SAMPLES_MAX as u64 + 5) {
            history.record(sample(second * 1000, 2, [Some(5), Some(5)]));
        }
        let all = history.since(1, 0);
        assert_eq!(all.samples.len(), SAMPLES_MAX);
        assert_eq!(all.samples[0].at_ms, 6000, "the five oldest were dropped");
        let recent = history.since(1, (SAMPLES_MAX as u64 + 3) * 1000);
        assert_eq!(recent.samples.iter().map(|s| s.at_ms).collect::<Vec<_>>(), vec![604_000, 605_000]);
    }
}
