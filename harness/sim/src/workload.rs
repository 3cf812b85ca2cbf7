//! The workload client host: writes items and signals with unique ids to whichever node leads,
//! records every acknowledgement, watches who leads in which term, and after the faults are healed
//! waits for convergence and reads everything back from every node.

use crate::http::{request, Answer};
use crate::net::HTTP_PORT;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::Duration;
use tidal_types::{ClusterStatus, DigestView};
use tokio::time::Instant;

/// Deadline of one request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the cluster may take to elect its first leader.
const FIRST_LEADER_DEADLINE: Duration = Duration::from_secs(30);
/// How long the cluster may take to converge once every fault is healed.
pub const CONVERGE_DEADLINE: Duration = Duration::from_secs(90);
/// Attempts per write (same Idempotency-Key) before its outcome is left unknown.
const WRITE_ATTEMPTS: u32 = 8;

/// Where the run is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Writes under faults.
    Load,
    /// The client asks the driver to undo every fault and restart crashed nodes.
    HealRequested,
    /// Faults are undone: converge and check.
    Healed,
    /// Checks are done.
    Done,
}

/// One acknowledged write.
#[derive(Clone, Debug)]
pub struct Ack {
    /// Unique id of the write (the item id, or the signal's user suffix).
    pub id: u64,
    /// Whether it was an item PUT (else a signal POST).
    pub item: bool,
    /// The seqno the node answered.
    pub seqno: u64,
    /// The node that answered.
    pub node: usize,
}

/// Counts of write outcomes.
#[derive(Clone, Debug, Default)]
pub struct WriteStats {
    /// Requests sent.
    pub attempts: u64,
    /// Writes acknowledged.
    pub acked: u64,
    /// Writes given up on with an unknown outcome.
    pub unknown: u64,
    /// Writes refused with a 4xx other than 429 (nothing written).
    pub refused: u64,
}

/// State shared by the driver and the client (one thread: `Rc<RefCell>`).
#[derive(Clone, Debug)]
pub struct Shared {
    /// The run's phase.
    pub phase: Phase,
    /// Whether the writers have started (a first leader was seen).
    pub writing: bool,
    /// Acknowledged writes.
    pub acks: Vec<Ack>,
    /// Every (term → nodes seen reporting themselves leader of it).
    pub leaders: BTreeMap<u64, BTreeSet<u64>>,
    /// Invariant violations found by the client.
    pub violations: Vec<String>,
    /// Events for the trace hash.
    pub trace: Vec<String>,
    /// Write outcomes.
    pub stats: WriteStats,
    /// The node writes go to first.
    pub leader_guess: usize,
    /// The leader of the highest term the client has seen a leader in: `(term, node index)`.
    pub leader: Option<(u64, usize)>,
    /// Next unique id.
    pub next_id: u64,
    /// Digest every node converged to (empty if they did not).
    pub digest: Option<(u64, String)>,
    /// Simulated ms at which convergence was reached after the heal.
    pub converged_after_ms: Option<u64>,
}

impl Shared {
    /// A fresh run.
    pub fn new() -> Shared {
        Shared {
            phase: Phase::Load,
            writing: false,
            acks: Vec::new(),
            leaders: BTreeMap::new(),
            violations: Vec::new(),
            trace: Vec::new(),
            stats: WriteStats::default(),
            leader_guess: 0,
            leader: None,
            next_id: 1,
            digest: None,
            converged_after_ms: None,
        }
    }
}

impl Default for Shared {
    fn default() -> Shared {
        Shared::new()
    }
}

/// What the client does.
#[derive(Clone, Debug)]
pub struct Workload {
    /// Number of nodes (`n1`..).
    pub nodes: usize,
    /// How long writes go on (simulated).
    pub load: Duration,
    /// Most writes in the run.
    pub writes_max: u64,
    /// Concurrent writers.
    pub writers: usize,
    /// Bytes of padding in every item's metadata.
    pub item_pad: usize,
    /// How long after the heal every node must have converged.
    pub converge_deadline: Duration,
    /// Whether the heal must not install any snapshot (through the log only).
    pub heal_via_log: bool,
}

fn host(node: usize) -> String {
    format!("n{}:{HTTP_PORT}", node + 1)
}

async fn status(node: usize) -> Option<ClusterStatus> {
    let answer = request(&host(node), "GET", "/cluster/status", None, &[], REQUEST_TIMEOUT).await.ok()?;
    if answer.status != 200 {
        return None;
    }
    answer.json().ok()
}

fn record_leaders(shared: &Rc<RefCell<Shared>>, statuses: &[Option<ClusterStatus>]) {
    let mut shared = shared.borrow_mut();
    for status in statuses.iter().flatten() {
        if status.role == "leader" {
            shared.leaders.entry(status.term).or_default().insert(status.node_id);
            if let Some(index) = usize::try_from(status.node_id).ok().and_then(|id| id.checked_sub(1)) {
                shared.leader_guess = index;
                if shared.leader.is_none_or(|(term, _)| status.term >= term) {
                    shared.leader = Some((status.term, index));
                }
            }
        }
    }
}

async fn statuses(nodes: usize) -> Vec<Option<ClusterStatus>> {
    let mut all = Vec::with_capacity(nodes);
    for node in 0..nodes {
        all.push(status(node).await);
    }
    all
}

/// The client's whole life: the simulation ends when it returns.
pub async fn run(workload: Workload, shared: Rc<RefCell<Shared>>) -> turmoil::Result {
    let started = Instant::now();
    // A first leader.
    loop {
        let all = statuses(workload.nodes).await;
        record_leaders(&shared, &all);
        if all.iter().flatten().any(|status| status.role == "leader") {
            break;
        }
        if started.elapsed() > FIRST_LEADER_DEADLINE {
            shared
                .borrow_mut()
                .violations
                .push(format!("no leader within {FIRST_LEADER_DEADLINE:?} of start"));
            shared.borrow_mut().phase = Phase::Done;
            return Ok(());
        }
        // Poll step of a wait on observable state (the deadline above bounds it).
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let monitor = tokio::task::spawn_local(monitor(workload.nodes, shared.clone()));
    shared.borrow_mut().writing = true;
    let load_end = Instant::now() + workload.load;
    let mut writers = Vec::new();
    for _ in 0..workload.writers {
        writers.push(tokio::task::spawn_local(writer(workload.clone(), shared.clone(), load_end)));
    }
    for writer in writers {
        let _ = writer.await;
    }
    shared.borrow_mut().phase = Phase::HealRequested;
    while shared.borrow().phase != Phase::Healed {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let healed_at = Instant::now();
    converge_and_check(&workload, &shared, healed_at).await;
    monitor.abort();
    shared.borrow_mut().phase = Phase::Done;
    Ok(())
}

/// Samples every node's status; records which node claims to lead which term.
async fn monitor(nodes: usize, shared: Rc<RefCell<Shared>>) {
    loop {
        let all = statuses(nodes).await;
        record_leaders(&shared, &all);
        // Sampling period of the leader monitor.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn writer(workload: Workload, shared: Rc<RefCell<Shared>>, load_end: Instant) {
    // Pace the writes over the whole load phase, so the faults (drawn over it) meet writes.
    let per_writer = (workload.writes_max / workload.writers.max(1) as u64).max(1);
    let interval = workload.load / u32::try_from(per_writer).unwrap_or(u32::MAX);
    while Instant::now() < load_end {
        let next = Instant::now() + interval;
        let id = {
            let mut shared = shared.borrow_mut();
            if shared.next_id > workload.writes_max {
                return;
            }
            shared.next_id += 1;
            shared.next_id - 1
        };
        write_one(&workload, &shared, id).await;
        tokio::time::sleep_until(next).await;
    }
}

async fn write_one(workload: &Workload, shared: &Rc<RefCell<Shared>>, id: u64) {
    let item = id % 4 != 3;
    let (method, path, body) = if item {
        let metadata = if workload.item_pad > 0 {
            serde_json::json!({"w": id, "pad": "p".repeat(workload.item_pad)})
        } else {
            serde_json::json!({"w": id})
        };
        ("PUT", format!("/v1/items/{id}"), serde_json::json!({"metadata": metadata}))
    } else {
        (
            "POST",
            "/v1/signals".to_string(),
            serde_json::json!({"signals": [{"user": format!("u{id}"), "item": id - 1, "kind": "click"}]}),
        )
    };
    let body = serde_json::to_vec(&body).unwrap_or_default();
    let headers = [("idempotency-key", format!("w{id}"))];
    for attempt in 0..WRITE_ATTEMPTS {
        let node = shared.borrow().leader_guess;
        shared.borrow_mut().stats.attempts += 1;
        let answer = request(&host(node), method, &path, Some(body.clone()), &headers, REQUEST_TIMEOUT).await;
        match answer {
            Ok(Answer { status: 200..=299, body }) => {
                let seqno = serde_json::from_slice::<serde_json::Value>(&body)
                    .ok()
                    .and_then(|value| value.get("seqno").and_then(serde_json::Value::as_u64));
                let mut shared = shared.borrow_mut();
                match seqno {
                    Some(seqno) => {
                        shared.stats.acked += 1;
                        shared.trace.push(format!("ack {id} {seqno} n{}", node + 1));
                        shared.acks.push(Ack { id, item, seqno, node });
                    }
                    None => shared.violations.push(format!("write {id}: 2xx without a seqno")),
                }
                return;
            }
            Ok(Answer { status, body }) if (400..500).contains(&status) && status != 429 => {
                let mut shared = shared.borrow_mut();
                shared.stats.refused += 1;
                shared.violations.push(format!(
                    "write {id} refused with {status}: {}",
                    String::from_utf8_lossy(&body).chars().take(200).collect::<String>()
                ));
                return;
            }
            _ => {
                // Unknown outcome (503, 504, timeout, broken connection): try the next node with
                // the same Idempotency-Key after a back-off.
                let next = (node + 1) % workload.nodes;
                shared.borrow_mut().leader_guess = next;
                tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt + 1))).await;
            }
        }
    }
    shared.borrow_mut().stats.unknown += 1;
}

fn converged(all: &[Option<ClusterStatus>]) -> Option<(u64, u64)> {
    let all: Vec<&ClusterStatus> = all.iter().map(Option::as_ref).collect::<Option<_>>()?;
    let leaders: Vec<&&ClusterStatus> = all.iter().filter(|status| status.role == "leader").collect();
    let [leader] = leaders.as_slice() else { return None };
    let commit = leader.commit_seqno;
    let agree = all.iter().all(|status| {
        status.leader_id == Some(leader.node_id)
            && status.term == leader.term
            && status.applied_seqno == commit
            && status.durable_seqno == commit
    });
    agree.then_some((leader.term, commit))
}

async fn converge_and_check(workload: &Workload, shared: &Rc<RefCell<Shared>>, healed_at: Instant) {
    // Heal gate: one leader, every node on its term, everything durable and applied everywhere.
    let position = loop {
        let all = statuses(workload.nodes).await;
        record_leaders(shared, &all);
        if let Some(position) = converged(&all) {
            break position;
        }
        if healed_at.elapsed() > workload.converge_deadline {
            let summary: Vec<String> = all
                .iter()
                .enumerate()
                .map(|(node, status)| match status {
                    None => format!("n{}: no status", node + 1),
                    Some(s) => format!(
                        "n{}: {} term {} leader {:?} durable {} commit {} applied {}",
                        s.node_id,
                        s.role,
                        s.term,
                        s.leader_id,
                        s.durable_seqno,
                        s.commit_seqno,
                        s.applied_seqno
                    ),
                })
                .collect();
            shared.borrow_mut().violations.push(format!(
                "heal gate: no convergence within {:?} after heal: {}",
                workload.converge_deadline,
                summary.join("; ")
            ));
            return;
        }
        // Poll step of a wait on observable state (the deadline above bounds it).
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let converged_ms = u64::try_from(healed_at.elapsed().as_millis()).unwrap_or(u64::MAX);
    shared.borrow_mut().converged_after_ms = Some(converged_ms);
    // Invariant 2: the same digest at the same seqno on every node.
    let mut digests = Vec::new();
    for node in 0..workload.nodes {
        let path = format!("/cluster/digest?min_seqno={}", position.1);
        match request(&host(node), "GET", &path, None, &[], REQUEST_TIMEOUT)
            .await
            .and_then(|a| a.json::<DigestView>())
        {
            Ok(view) => digests.push((view.applied_seqno, view.digest)),
            Err(error) => shared.borrow_mut().violations.push(format!("digest of n{}: {error:#}", node + 1)),
        }
    }
    {
        let mut shared = shared.borrow_mut();
        if digests.windows(2).any(|pair| pair[0] != pair[1]) {
            shared.violations.push(format!("invariant 2: digests differ after heal: {digests:?}"));
        } else if let Some(first) = digests.first() {
            shared.trace.push(format!("digest {} {}", first.0, first.1));
            shared.digest = Some(first.clone());
        }
    }
    // Invariant 2, "through the log only": a snapshot install is the one path that carries item
    // data outside the log; count them (since each node's last start) from `/metrics`.
    if workload.heal_via_log {
        for node in 0..workload.nodes {
            let answer = request(&host(node), "GET", "/metrics", None, &[], REQUEST_TIMEOUT).await;
            let installs = answer.ok().and_then(|answer| {
                let text = String::from_utf8_lossy(&answer.body).into_owned();
                text.lines()
                    .find_map(|line| line.strip_prefix("tidal_snapshot_installs_total "))
                    .and_then(|value| value.trim().parse::<f64>().ok())
            });
            match installs {
                Some(0.0) => {}
                Some(count) => shared.borrow_mut().violations.push(format!(
                    "invariant 2: n{} healed outside the log ({count} snapshot installs)",
                    node + 1
                )),
                None => shared.borrow_mut().violations.push(format!(
                    "invariant 2: n{}: no tidal_snapshot_installs_total in /metrics",
                    node + 1
                )),
            }
        }
    }
    // Invariant 1: every acknowledged item is readable on every node.
    let acks = shared.borrow().acks.clone();
    for ack in acks.iter().filter(|ack| ack.item) {
        for node in 0..workload.nodes {
            let path = format!("/v1/items/{}?min_seqno={}", ack.id, ack.seqno);
            let read = request(&host(node), "GET", &path, None, &[], REQUEST_TIMEOUT).await;
            let found =
                match &read {
                    Ok(answer) if answer.status == 200 => {
                        answer.json::<serde_json::Value>().ok().and_then(|value| {
                            value.pointer("/metadata/w").and_then(serde_json::Value::as_u64)
                        }) == Some(ack.id)
                    }
                    _ => false,
                };
            if !found {
                let what = match read {
                    Ok(answer) => format!("{} {}", answer.status, String::from_utf8_lossy(&answer.body)),
                    Err(error) => format!("{error:#}"),
                };
                shared.borrow_mut().violations.push(format!(
                    "invariant 1: acked item {} (seqno {} from n{}) not readable on n{}: {what}",
                    ack.id,
                    ack.seqno,
                    ack.node + 1,
                    node + 1
                ));
            }
        }
    }
    // Every acked seqno must be at or below the converged commit frontier.
    for ack in &acks {
        if ack.seqno > position.1 {
            shared.borrow_mut().violations.push(format!(
                "invariant 1: acked write {} has seqno {} above the converged frontier {}",
                ack.id, ack.seqno, position.1
            ));
        }
    }
}
