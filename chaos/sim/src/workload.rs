//! The workload client host: writes items and signals with unique ids to whichever node leads,
//! records every acknowledgement, watches who leads in which term, and after the faults are healed
//! waits for convergence and reads everything back from every node.

use crate::http::{request, Answer};
use crate::net::HTTP_PORT;
use crate::violation::{body_start, Node, Violation};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::Duration;
use tidal_types::{ClusterStatus, DigestView};
use tokio::time::Instant;

/// Deadline of one request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
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
    /// For a tx (an item and its event, [`STREAM`]), the event's offset.
    pub offset: Option<u64>,
}

/// The stream the tx writes publish to.
pub const STREAM: &str = "orders";

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
    pub violations: Vec<Violation>,
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
    /// The register operations (`Workload::registers`): the client history of the per-key
    /// linearizability check.
    pub history: crate::history::History,
    /// Feeds compared across nodes (invariant 5).
    pub counters_feeds: u64,
    /// Pulled chunks refused because a source not in office would have replaced batches
    /// (`tidal_replication_refusals_total{reason="stale_source"}`, summed over nodes at the end).
    pub counters_stale_source: u64,
    /// Batches the nodes' catch-up pulls appended (`tidal_pull_batches_total`, summed over nodes at
    /// the end): whether a scenario that puts a follower behind the ship tail made it pull.
    pub counters_pulled_batches: u64,
    /// Feed entries compared (an empty feed compares little).
    pub counters_feed_items: u64,
    /// Offsets a reader read in order while it moved from node to node, resuming after the last
    /// one it read ([`Workload::reader`]).
    pub reader: Vec<u64>,
    /// What the client saw of the inbox.
    pub inbox: crate::inbox::InboxLog,
    /// While set, no write attempt starts (a scripted fault plan holds the client still between
    /// two of its steps, `script.rs`); an attempt already sent runs to its answer.
    pub writes_paused: bool,
    /// A burst of writes a script asked for ([`Burst`]); the client's burster task takes it.
    pub burst: Option<Burst>,
    /// Burst writes answered so far (acknowledged, refused or timed out).
    pub burst_answered: u64,
}

/// Single-attempt item writes to one node, `spacing` apart, all at once in flight (a script's
/// `Step::Burst`): on a node that takes them, each is a WAL drain of its own.
#[derive(Clone, Copy, Debug)]
pub struct Burst {
    /// The node they go to (whatever it is now).
    pub node: usize,
    /// How many.
    pub writes: u32,
    /// Between two sends.
    pub spacing: Duration,
}

/// Burst writes take item ids from here on, apart from the writers' ids.
const BURST_IDS: u64 = 1_000_000;

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
            history: Default::default(),
            counters_feeds: 0,
            counters_stale_source: 0,
            counters_pulled_batches: 0,
            counters_feed_items: 0,
            writes_paused: false,
            burst: None,
            burst_answered: 0,
            reader: Vec::new(),
            inbox: Default::default(),
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
    /// Register keys (0: none). Each writer also reads or overwrites one of them per write
    /// (`GET ...?consistency=linearizable` and `PUT` to the leader), recorded for the per-key
    /// linearizability check (`history.rs`).
    pub registers: u64,
    /// Whether every other item also gets an embedding (`PUT /v1/items/{id}/embedding`), so users'
    /// feeds are not empty and the feed-parity check compares scores.
    pub embeddings: bool,
    /// Whether a reader follows the stream during the load, each read from the next node, and
    /// must see the final stream's prefix (quorum mode: every node applies only committed
    /// batches; in leader mode a failover may drop what it read).
    pub reader: bool,
    /// Whether writes with `id % 4 == 1` are txs (an item and an event about it).
    pub txs: bool,
    /// Whether some writes also send an inbox message while a receiver takes them, checked
    /// exactly-once after the heal (quorum mode only: in leader mode a failover may take back an
    /// acknowledged send).
    pub inboxes: bool,
}

/// The HTTP address of node index `node`.
pub fn host(node: usize) -> String {
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
            shared.borrow_mut().violations.push(Violation::NoFirstLeader { deadline: FIRST_LEADER_DEADLINE });
            shared.borrow_mut().phase = Phase::Done;
            return Ok(());
        }
        // Poll step of a wait on observable state (the deadline above bounds it).
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let monitor = tokio::task::spawn_local(monitor(workload.nodes, shared.clone()));
    let burster = tokio::task::spawn_local(burster(shared.clone()));
    shared.borrow_mut().writing = true;
    let load_end = Instant::now() + workload.load;
    let reader =
        workload.reader.then(|| tokio::task::spawn_local(read_along(workload.nodes, shared.clone())));
    let receiver = workload
        .inboxes
        .then(|| tokio::task::spawn_local(crate::inbox::receive_along(workload.clone(), shared.clone())));
    let mut writers = Vec::new();
    for index in 0..workload.writers {
        writers.push(tokio::task::spawn_local(writer(workload.clone(), shared.clone(), load_end, index)));
    }
    for writer in writers {
        let _ = writer.await;
    }
    for task in [reader, receiver].into_iter().flatten() {
        task.abort();
    }
    shared.borrow_mut().phase = Phase::HealRequested;
    while shared.borrow().phase != Phase::Healed {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let healed_at = Instant::now();
    converge_and_check(&workload, &shared, healed_at).await;
    monitor.abort();
    burster.abort();
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

/// Fires the bursts a script asks for ([`Shared::burst`]).
async fn burster(shared: Rc<RefCell<Shared>>) {
    let mut next_id = BURST_IDS;
    loop {
        let burst = shared.borrow_mut().burst.take();
        for k in 0..burst.map_or(0, |burst| burst.writes) {
            let Some(burst) = burst else { break };
            let (shared, id) = (shared.clone(), next_id);
            next_id += 1;
            tokio::task::spawn_local(async move {
                tokio::time::sleep(burst.spacing * k).await;
                burst_write(&shared, burst.node, id).await;
            });
        }
        // Poll step of a wait on the driver's request (the script step's deadline bounds it).
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// One burst write: an item PUT to `node`, one attempt. An acknowledgement is checked as every
/// other (the item must be readable everywhere after the heal); anything else is an unknown outcome.
async fn burst_write(shared: &Rc<RefCell<Shared>>, node: usize, id: u64) {
    let body = serde_json::to_vec(&serde_json::json!({"metadata": {"w": id}})).unwrap_or_default();
    let headers = [("idempotency-key", format!("b{id}"))];
    let path = format!("/v1/items/{id}");
    let answer = request(&host(node), "PUT", &path, Some(body), &headers, REQUEST_TIMEOUT).await;
    let mut shared = shared.borrow_mut();
    shared.burst_answered += 1;
    shared.stats.attempts += 1;
    let seqno = match answer {
        Ok(Answer { status: 200..=299, body }) => serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|reply| reply.get("seqno").and_then(serde_json::Value::as_u64)),
        _ => None,
    };
    match seqno {
        Some(seqno) => {
            shared.stats.acked += 1;
            shared.acks.push(Ack { id, item: true, seqno, node, offset: None });
        }
        None => shared.stats.unknown += 1,
    }
}

/// Follows the stream as a subscriber that lost its connection after every read would: reads the
/// events after the last one it saw, each time from the next node.
async fn read_along(nodes: usize, shared: Rc<RefCell<Shared>>) {
    let mut node = 0;
    loop {
        let after = shared.borrow().reader.last().copied().unwrap_or(0);
        let path = format!("/v1/streams/{STREAM}/events?after={after}&limit=50");
        if let Ok(answer) = request(&host(node), "GET", &path, None, &[], REQUEST_TIMEOUT).await {
            if answer.status == 200 {
                let offsets = stream_page(&answer.body).into_iter().map(|(offset, _)| offset);
                shared.borrow_mut().reader.extend(offsets);
            }
        }
        node = (node + 1) % nodes;
        // Period of the reader's polls.
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}

/// `(offset, payload.w)` of each event of a stream read's body.
fn stream_page(body: &[u8]) -> Vec<(u64, u64)> {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else { return Vec::new() };
    let events = value.get("events").and_then(serde_json::Value::as_array).cloned().unwrap_or_default();
    events
        .iter()
        .map(|event| {
            let offset = event.get("offset").and_then(serde_json::Value::as_u64).unwrap_or(0);
            (offset, event.pointer("/payload/w").and_then(serde_json::Value::as_u64).unwrap_or(0))
        })
        .collect()
}

async fn writer(workload: Workload, shared: Rc<RefCell<Shared>>, load_end: Instant, index: usize) {
    // The register ops' thread: one per writer, a new one after an unknown outcome (an operation
    // still in flight for good).
    let mut thread = (index as u64) << 32;
    // Pace the writes over the whole load phase, so the faults (drawn over it) meet writes.
    let per_writer = (workload.writes_max / workload.writers.max(1) as u64).max(1);
    let interval = workload.load / u32::try_from(per_writer).unwrap_or(u32::MAX);
    while Instant::now() < load_end {
        wait_unpaused(&shared).await;
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
        if workload.embeddings && id % 4 != 3 && id % 2 == 0 {
            embed(&workload, &shared, id).await;
        }
        if workload.txs && id % 16 == 8 {
            trim_stream(&shared, id).await;
        }
        if workload.inboxes && crate::inbox::sends(id) {
            crate::inbox::send(&workload, &shared, id).await;
        }
        if workload.registers > 0 {
            register_op(&workload, &shared, id, &mut thread).await;
        }
        tokio::time::sleep_until(next).await;
    }
}

/// Returns once writes are not paused ([`Shared::writes_paused`]).
pub async fn wait_unpaused(shared: &Rc<RefCell<Shared>>) {
    while shared.borrow().writes_paused {
        // Poll step of a wait on the driver's flag (the script's step deadlines bound it).
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether write `id` is a tx: its item and an event about it, one batch.
fn is_tx(workload: &Workload, id: u64) -> bool {
    workload.txs && id % 4 == 1
}

async fn write_one(workload: &Workload, shared: &Rc<RefCell<Shared>>, id: u64) {
    let item = id % 4 != 3;
    let metadata = if workload.item_pad > 0 {
        serde_json::json!({"w": id, "pad": "p".repeat(workload.item_pad)})
    } else {
        serde_json::json!({"w": id})
    };
    let (method, path, body) = if is_tx(workload, id) {
        let ops = serde_json::json!([
            {"op": "put_item", "item": id, "metadata": metadata},
            {"op": "publish", "stream": STREAM, "payload": {"w": id}},
        ]);
        ("POST", "/v1/tx".to_string(), serde_json::json!({ "ops": ops }))
    } else if item {
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
    match write_retrying(workload, shared, id, (method, &path), body, &headers).await {
        Outcome::Acked { node, body } => {
            let reply = serde_json::from_slice::<serde_json::Value>(&body).ok();
            let seqno =
                reply.as_ref().and_then(|value| value.get("seqno").and_then(serde_json::Value::as_u64));
            let offset = reply
                .as_ref()
                .and_then(|value| value.pointer("/offsets/0").and_then(serde_json::Value::as_u64));
            let mut shared = shared.borrow_mut();
            match seqno {
                Some(seqno) => {
                    shared.stats.acked += 1;
                    // With the simulated time it came in: a replay must match it to the ms.
                    let at = turmoil::sim_elapsed().map_or(0, |elapsed| elapsed.as_millis());
                    shared.trace.push(format!("ack {id} {seqno} n{} at {at} ms", node + 1));
                    shared.acks.push(Ack { id, item, seqno, node, offset });
                }
                None => shared.violations.push(Violation::AckWithoutSeqno { id }),
            }
        }
        Outcome::Refused { status, body } => {
            let mut shared = shared.borrow_mut();
            shared.stats.refused += 1;
            shared.violations.push(Violation::WriteRefused { id, status, body: body_start(&body) });
        }
        Outcome::Unknown => shared.borrow_mut().stats.unknown += 1,
    }
}

/// How a write retried across nodes ended.
pub enum Outcome {
    /// A 2xx from `node`.
    Acked {
        /// The node that answered.
        node: usize,
        /// Its body.
        body: Vec<u8>,
    },
    /// A 4xx other than 429: nothing was written.
    Refused {
        /// The status.
        status: u16,
        /// The body.
        body: Vec<u8>,
    },
    /// No answer told: the write may or may not be in the log.
    Unknown,
}

/// Sends a write to the node believed to lead; on an unknown outcome (503, 504, a timeout, a broken
/// connection) sends it again, unchanged (the same Idempotency-Key or inbox id), to the next node
/// after a back-off, at most [`WRITE_ATTEMPTS`] times.
pub async fn write_retrying(
    workload: &Workload,
    shared: &Rc<RefCell<Shared>>,
    id: u64,
    (method, path): (&str, &str),
    body: Vec<u8>,
    headers: &[(&str, String)],
) -> Outcome {
    for attempt in 0..WRITE_ATTEMPTS {
        wait_unpaused(shared).await;
        let node = shared.borrow().leader_guess;
        shared.borrow_mut().stats.attempts += 1;
        let answer = request(&host(node), method, path, Some(body.clone()), headers, REQUEST_TIMEOUT).await;
        tracing::debug!(id, node, attempt, path, status = ?answer.as_ref().map(|answer| answer.status), "write answered");
        match answer {
            Ok(Answer { status: 200..=299, body }) => return Outcome::Acked { node, body },
            Ok(Answer { status, body }) if (400..500).contains(&status) && status != 429 => {
                return Outcome::Refused { status, body }
            }
            _ => {
                let next = (node + 1) % workload.nodes;
                shared.borrow_mut().leader_guess = next;
                tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt + 1))).await;
            }
        }
    }
    Outcome::Unknown
}

/// A feed as read: `(item, score)` in rank order.
type Feed = Vec<(u64, f64)>;

/// Invariant 5 (feed parity): a few users' feeds read from every node at the converged applied
/// seqno must list the same items with scores within 1e-6.
async fn feed_parity(workload: &Workload, shared: &Rc<RefCell<Shared>>, seqno: u64) {
    let users: Vec<u64> =
        shared.borrow().acks.iter().filter(|ack| !ack.item).map(|ack| ack.id).take(4).collect();
    for user in users {
        // Invariant 5 compares feeds at the SAME applied seqno: a node may apply a batch more
        // after the heal gate (e.g. a LeaderStart); read again at the highest until they agree.
        let mut at = seqno;
        let mut feeds: Vec<(usize, u64, Feed)> = Vec::new();
        for _ in 0..10 {
            feeds.clear();
            for node in 0..workload.nodes {
                let path = format!("/v1/users/u{user}/feed?limit=20&min_seqno={at}");
                let answer = request(&host(node), "GET", &path, None, &[], REQUEST_TIMEOUT).await;
                let feed = answer.ok().filter(|answer| answer.status == 200).and_then(|answer| {
                    let value: serde_json::Value = answer.json().ok()?;
                    let applied = value.get("applied_seqno")?.as_u64()?;
                    let items = value
                        .get("items")?
                        .as_array()?
                        .iter()
                        .filter_map(|entry| {
                            Some((entry.get("item")?.as_u64()?, entry.get("score")?.as_f64()?))
                        })
                        .collect::<Vec<_>>();
                    Some((applied, items))
                });
                if let Some((applied, items)) = feed {
                    feeds.push((node, applied, items));
                }
            }
            let highest = feeds.iter().map(|feed| feed.1).max().unwrap_or(at);
            if feeds.len() == workload.nodes && feeds.iter().all(|feed| feed.1 == highest) {
                break;
            }
            at = highest;
        }
        let Some((_, applied0, items0)) = feeds.first().cloned() else { continue };
        if feeds.len() < workload.nodes || feeds.iter().any(|feed| feed.1 != applied0) {
            let seen = feeds.iter().map(|feed| (Node(feed.0), feed.1)).collect();
            shared.borrow_mut().violations.push(Violation::FeedUnreadable { user, seen });
            continue;
        }
        shared.borrow_mut().counters_feeds += 1;
        shared.borrow_mut().counters_feed_items += items0.len() as u64;
        for (node, _, items) in feeds.iter().skip(1) {
            let same_items = items.len() == items0.len()
                && items.iter().zip(&items0).all(|(a, b)| a.0 == b.0 && (a.1 - b.1).abs() <= 1e-6);
            if !same_items {
                shared.borrow_mut().violations.push(Violation::FeedMismatch {
                    user,
                    seqno: applied0,
                    first: (Node(feeds[0].0), items0.clone()),
                    other: (Node(*node), items.clone()),
                });
            }
        }
    }
}

/// Gives item `id` an embedding (dimension 4, drawn from the id): one attempt at the believed
/// leader, its outcome not tracked (the digest covers it); a 4xx is a violation.
async fn embed(workload: &Workload, shared: &Rc<RefCell<Shared>>, id: u64) {
    let mut draw = crate::rng::Rng::new(id ^ 0xe3b0_c442);
    let vector: Vec<f64> = (0..4).map(|_| draw.unit() * 2.0 - 1.0).collect();
    let body = serde_json::to_vec(&serde_json::json!({ "vector": vector })).unwrap_or_default();
    let headers = [("idempotency-key", format!("e{id}"))];
    let node = shared.borrow().leader_guess;
    let path = format!("/v1/items/{id}/embedding");
    let _ = workload;
    if let Ok(Answer { status, body }) =
        request(&host(node), "PUT", &path, Some(body), &headers, REQUEST_TIMEOUT).await
    {
        if (400..500).contains(&status) && status != 429 {
            shared.borrow_mut().violations.push(Violation::EmbeddingRefused {
                id,
                status,
                body: body_start(&body),
            });
        }
    }
}

/// Trims the stream through a few events below the newest acknowledged one: one attempt at the
/// believed leader, its outcome not tracked (the checks read the horizon the nodes agree on). A 4xx
/// is a violation.
async fn trim_stream(shared: &Rc<RefCell<Shared>>, id: u64) {
    let Some(newest) = shared.borrow().acks.iter().filter_map(|ack| ack.offset).max() else { return };
    let body =
        serde_json::to_vec(&serde_json::json!({ "through": newest.saturating_sub(6) })).unwrap_or_default();
    let headers = [("idempotency-key", format!("t{id}"))];
    let node = shared.borrow().leader_guess;
    let path = format!("/v1/streams/{STREAM}/trim");
    if let Ok(Answer { status, body }) =
        request(&host(node), "POST", &path, Some(body), &headers, REQUEST_TIMEOUT).await
    {
        if (400..500).contains(&status) && status != 429 {
            shared.borrow_mut().violations.push(Violation::WriteRefused {
                id,
                status,
                body: body_start(&body),
            });
        }
    }
}

/// Register keys are items with ids from here on (apart from the unique ids of the other writes).
pub const REGISTER_BASE: u64 = 1_000_000;

/// One read or overwrite of a register key, recorded as invoked and as returned.
async fn register_op(workload: &Workload, shared: &Rc<RefCell<Shared>>, id: u64, thread: &mut u64) {
    let mut draw = crate::rng::Rng::new(id ^ 0x4e61_7374);
    let key = REGISTER_BASE + draw.range(0, workload.registers);
    let write = draw.chance(0.5);
    let version = id;
    let op = shared.borrow_mut().history.invoke(*thread, key, write.then_some(version));
    if write {
        let body = serde_json::json!({"metadata": {"w": version, "reg": key}});
        let body = serde_json::to_vec(&body).unwrap_or_default();
        let headers = [("idempotency-key", format!("r{id}"))];
        for attempt in 0..WRITE_ATTEMPTS {
            let node = shared.borrow().leader_guess;
            let path = format!("/v1/items/{key}");
            match request(&host(node), "PUT", &path, Some(body.clone()), &headers, REQUEST_TIMEOUT).await {
                Ok(Answer { status: 200..=299, .. }) => {
                    shared.borrow_mut().history.returned(op, crate::history::Ret::WriteOk);
                    return;
                }
                Ok(Answer { status, body }) if (400..500).contains(&status) && status != 429 => {
                    let mut shared = shared.borrow_mut();
                    shared.history.returned(op, crate::history::Ret::Refused);
                    shared.violations.push(Violation::RegisterWriteRefused {
                        key,
                        version,
                        status,
                        body: body_start(&body),
                    });
                    return;
                }
                _ => {
                    let next = (node + 1) % workload.nodes;
                    shared.borrow_mut().leader_guess = next;
                    tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt + 1))).await;
                }
            }
        }
        // Unknown outcome: the write stays in flight for good; this thread is done.
        shared.borrow_mut().history.returned(op, crate::history::Ret::Unknown);
        *thread += 1;
    } else {
        // A linearizable read is the leader's to answer (a follower forwards it, or in
        // the simulation, where forwarding is off, answers 503: the read leaves the history).
        // Half of them at the node believed to lead, half at any node.
        let node = if draw.chance(0.5) {
            shared.borrow().leader_guess
        } else {
            usize::try_from(draw.range(0, workload.nodes as u64)).unwrap_or(0)
        };
        let path = format!("/v1/items/{key}?consistency=linearizable");
        let answer = request(&host(node), "GET", &path, None, &[], REQUEST_TIMEOUT).await;
        let ret = match answer {
            Ok(Answer { status: 200, body }) => {
                let value = serde_json::from_slice::<serde_json::Value>(&body).ok();
                match value
                    .as_ref()
                    .and_then(|value| value.pointer("/metadata/w"))
                    .and_then(serde_json::Value::as_u64)
                {
                    Some(version) => crate::history::Ret::Read(Some(version)),
                    None => {
                        shared
                            .borrow_mut()
                            .violations
                            .push(Violation::RegisterReadWithoutVersion { key, body: body_start(&body) });
                        crate::history::Ret::Failed
                    }
                }
            }
            Ok(Answer { status: 404, .. }) => crate::history::Ret::Read(None),
            // A read that did not answer changed nothing: it leaves the history.
            _ => crate::history::Ret::Failed,
        };
        shared.borrow_mut().history.returned(op, ret);
    }
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
    // Invariant 2 compares digests at ONE applied seqno. A node may apply past the converged
    // frontier between the status poll and its digest read (a new term's LeaderStart after a late
    // election): then the digests are of different seqnos and say nothing. Converge again and read
    // again (a few times); only digests at the same seqno that differ are a violation.
    let mut digests = Vec::new();
    let mut position = (0, 0);
    for attempt in 1..=DIGEST_ATTEMPTS {
        let Some(converged_at) = converge(workload, shared, healed_at).await else { return };
        position = converged_at;
        digests = read_digests(workload, shared, position.1).await;
        if digests.windows(2).all(|pair| pair[0].0 == pair[1].0) || attempt == DIGEST_ATTEMPTS {
            break;
        }
        shared.borrow_mut().trace.push(format!("digests read at different applied seqnos: {digests:?}"));
    }
    {
        let mut shared = shared.borrow_mut();
        if digests.windows(2).any(|pair| pair[0] != pair[1]) {
            shared.violations.push(Violation::DigestMismatch { digests: digests.clone() });
        } else if let Some(first) = digests.first() {
            shared.trace.push(format!("digest {} {}", first.0, first.1));
            shared.digest = Some(first.clone());
        }
    }
    check_converged(workload, shared, position).await;
    if workload.inboxes {
        crate::inbox::drain(workload, shared).await;
        let drained = shared.borrow().inbox.delivered.iter().map(|(_, seqno, ..)| *seqno).max().unwrap_or(0);
        crate::inbox::check(workload, shared, drained.max(position.1)).await;
    }
}

/// How many times the heal check converges and reads the digests when they come from different
/// applied seqnos.
const DIGEST_ATTEMPTS: usize = 3;

/// Every node's `(applied seqno, digest)`, read with `min_seqno`.
async fn read_digests(
    workload: &Workload,
    shared: &Rc<RefCell<Shared>>,
    min_seqno: u64,
) -> Vec<(u64, String)> {
    let mut digests = Vec::new();
    for node in 0..workload.nodes {
        let path = format!("/cluster/digest?min_seqno={min_seqno}");
        match request(&host(node), "GET", &path, None, &[], REQUEST_TIMEOUT)
            .await
            .and_then(|a| a.json::<DigestView>())
        {
            Ok(view) => digests.push((view.applied_seqno, view.digest)),
            Err(error) => shared
                .borrow_mut()
                .violations
                .push(Violation::DigestUnreadable { node: Node(node), error: format!("{error:#}") }),
        }
    }
    digests
}

/// Heal gate: one leader, every node on its term, everything durable and applied everywhere.
/// Returns `(term, commit)`, or `None` after recording the violation at the deadline.
async fn converge(
    workload: &Workload,
    shared: &Rc<RefCell<Shared>>,
    healed_at: Instant,
) -> Option<(u64, u64)> {
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
            shared.borrow_mut().violations.push(Violation::ConvergedTooLate {
                deadline: workload.converge_deadline,
                statuses: summary,
            });
            return None;
        }
        // Poll step of a wait on observable state (the deadline above bounds it).
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    if shared.borrow().converged_after_ms.is_none() {
        let converged_ms = u64::try_from(healed_at.elapsed().as_millis()).unwrap_or(u64::MAX);
        shared.borrow_mut().converged_after_ms = Some(converged_ms);
    }
    Some(position)
}

/// The counters [`check_converged`] reads from every node's `/metrics`.
const HALTED: &str = "tidal_replication_refusals_total{reason=\"halted\"}";
const UNHELD_PREV: &str = "tidal_replication_refusals_total{reason=\"unheld_prev\"}";
const INSTALLS: &str = "tidal_snapshot_installs_total";

/// A counter missing from `node`'s `/metrics`.
fn missing(node: usize, metric: &str) -> Violation {
    Violation::MetricMissing { node: Node(node), metric: metric.to_string() }
}

/// The checks after convergence at `position` (metrics, invariant 1, feed parity).
async fn check_converged(workload: &Workload, shared: &Rc<RefCell<Shared>>, position: (u64, u64)) {
    // From each node's `/metrics` (counted since its last start):
    // - invariant 2, "through the log only": a snapshot install is the one path that carries item
    //   data outside the log (scenarios with `heal_via_log`);
    // - no halted receiver: a follower halts when accepting a message would quarantine committed
    //   batches or when one term has two logs, which quorum mode must never see (tidal-protocol's follower.rs).
    for node in 0..workload.nodes {
        let answer = request(&host(node), "GET", "/metrics", None, &[], REQUEST_TIMEOUT).await;
        let text = answer.ok().map(|answer| String::from_utf8_lossy(&answer.body).into_owned());
        let metric = |name: &str| {
            text.as_deref().and_then(|text| {
                text.lines()
                    .find_map(|line| line.strip_prefix(name))
                    .and_then(|value| value.trim().parse::<f64>().ok())
            })
        };
        match metric(&format!("{HALTED} ")) {
            Some(0.0) => {}
            Some(count) => {
                shared.borrow_mut().violations.push(Violation::ReceiverHalted { node: Node(node), count })
            }
            None => shared.borrow_mut().violations.push(missing(node, HALTED)),
        }
        // Log matching rests on the leader's own log holding every `prev` it ships or serves
        // (decisions/057): a ship or pulled chunk whose prev it does not hold is a violation here,
        // not a silent divergence later.
        match metric(&format!("{UNHELD_PREV} ")) {
            Some(0.0) => {}
            Some(count) => {
                shared.borrow_mut().violations.push(Violation::UnheldPrev { node: Node(node), count })
            }
            None => shared.borrow_mut().violations.push(missing(node, UNHELD_PREV)),
        }
        if let Some(count) = metric("tidal_replication_refusals_total{reason=\"stale_source\"} ") {
            shared.borrow_mut().counters_stale_source += count as u64;
        }
        if let Some(count) = metric("tidal_pull_batches_total ") {
            shared.borrow_mut().counters_pulled_batches += count as u64;
        }
        if !workload.heal_via_log {
            continue;
        }
        match metric(&format!("{INSTALLS} ")) {
            Some(0.0) => {}
            Some(installs) => shared
                .borrow_mut()
                .violations
                .push(Violation::SnapshotInstalled { node: Node(node), installs }),
            None => shared.borrow_mut().violations.push(missing(node, INSTALLS)),
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
                shared.borrow_mut().violations.push(Violation::AckedItemUnreadable {
                    id: ack.id,
                    seqno: ack.seqno,
                    acked_by: Node(ack.node),
                    node: Node(node),
                    read: what,
                });
            }
        }
    }
    feed_parity(workload, shared, position.1).await;
    check_stream(workload, shared, position.1).await;
    // Every acked seqno must be at or below the converged commit frontier.
    for ack in &acks {
        if ack.seqno > position.1 {
            shared.borrow_mut().violations.push(Violation::AckedAboveFrontier {
                id: ack.id,
                seqno: ack.seqno,
                frontier: position.1,
            });
        }
    }
}

/// The whole stream as `node` holds it once it applied `seqno`: `(offset, writer id)` ascending.
async fn read_stream(node: usize, seqno: u64) -> Result<Vec<(u64, u64)>, String> {
    let mut events = Vec::new();
    loop {
        let after = events.last().map_or(0, |(offset, _)| *offset);
        let path = format!("/v1/streams/{STREAM}/events?after={after}&limit=1000&min_seqno={seqno}");
        let answer = request(&host(node), "GET", &path, None, &[], REQUEST_TIMEOUT)
            .await
            .map_err(|e| format!("{e:#}"))?;
        if answer.status != 200 {
            return Err(format!("{} {}", answer.status, body_start(&answer.body)));
        }
        let page = stream_page(&answer.body);
        if page.is_empty() {
            return Ok(events);
        }
        events.extend(page);
    }
}

/// The stream's trim horizon as `node` holds it once it applied `seqno` (0 before any trim).
async fn read_horizon(node: usize, seqno: u64) -> Result<u64, String> {
    let path = format!("/v1/streams?min_seqno={seqno}");
    let answer =
        request(&host(node), "GET", &path, None, &[], REQUEST_TIMEOUT).await.map_err(|e| format!("{e:#}"))?;
    if answer.status != 200 {
        return Err(format!("{} {}", answer.status, body_start(&answer.body)));
    }
    let list: serde_json::Value = answer.json().map_err(|e| format!("{e:#}"))?;
    let streams = list.get("streams").and_then(serde_json::Value::as_array).cloned().unwrap_or_default();
    Ok(streams
        .iter()
        .find(|stream| stream.get("stream").and_then(serde_json::Value::as_str) == Some(STREAM))
        .and_then(|stream| stream.get("trimmed_through").and_then(serde_json::Value::as_u64))
        .unwrap_or(0))
}

/// Invariant 5's stream part and the tx's atomicity: every node holds the same events, every
/// acknowledged publish is there at its offset, every tx left its item and its event or neither,
/// and the reader that moved between nodes saw a prefix of the final stream.
async fn check_stream(workload: &Workload, shared: &Rc<RefCell<Shared>>, seqno: u64) {
    let mut streams = Vec::new();
    for node in 0..workload.nodes {
        match read_stream(node, seqno).await {
            Ok(events) => streams.push((node, events)),
            Err(read) => {
                shared.borrow_mut().violations.push(Violation::StreamUnreadable { node: Node(node), read })
            }
        }
    }
    let Some((first_node, first)) = streams.first().cloned() else { return };
    for (node, events) in &streams[1..] {
        if *events != first {
            let at = (0..).find(|i| first.get(*i) != events.get(*i)).unwrap_or(0);
            shared.borrow_mut().violations.push(Violation::StreamMismatch {
                first: (Node(first_node), first.len()),
                other: (Node(*node), events.len()),
                at: (first.get(at).copied(), events.get(at).copied()),
            });
        }
    }
    let horizon = match read_horizon(first_node, seqno).await {
        Ok(horizon) => horizon,
        Err(read) => {
            shared.borrow_mut().violations.push(Violation::StreamUnreadable { node: Node(first_node), read });
            return;
        }
    };
    let held: BTreeMap<u64, u64> = first.iter().copied().collect();
    let acks = shared.borrow().acks.clone();
    for ack in &acks {
        // An acknowledged event may be gone only by a trim.
        if let Some(offset) = ack.offset.filter(|offset| *offset > horizon) {
            if held.get(&offset) != Some(&ack.id) {
                shared.borrow_mut().violations.push(Violation::AckedEventLost { id: ack.id, offset });
            }
        }
    }
    let with_event: BTreeSet<u64> = first.iter().map(|(_, id)| *id).collect();
    let written = shared.borrow().next_id;
    for id in (1..written).filter(|id| is_tx(workload, *id)) {
        // The tx's item took its first seqno, its event the next: a trim may have taken the event.
        let path = format!("/v1/items/{id}?min_seqno={seqno}");
        let item_seqno = request(&host(first_node), "GET", &path, None, &[], REQUEST_TIMEOUT)
            .await
            .ok()
            .filter(|answer| answer.status == 200)
            .and_then(|answer| answer.json::<serde_json::Value>().ok())
            .and_then(|item| item.get("seqno").and_then(serde_json::Value::as_u64));
        let event = with_event.contains(&id);
        let whole = match item_seqno {
            None => !event,
            // Its event, at item_seqno + 1, is at or below the horizon.
            Some(item_seqno) => event || item_seqno < horizon,
        };
        if !whole {
            shared.borrow_mut().violations.push(Violation::TxHalfApplied {
                id,
                item: item_seqno.is_some(),
                event,
            });
        }
    }
    let reader = shared.borrow().reader.clone();
    let finals: Vec<u64> = first.iter().map(|(offset, _)| *offset).collect();
    // What the reader read that no trim has taken since must be the final stream's first events,
    // and it never read an offset twice or out of order.
    let ascending = reader.windows(2).position(|pair| pair[1] <= pair[0]);
    let kept: Vec<u64> = reader.iter().copied().filter(|offset| *offset > horizon).collect();
    let gap = (0..kept.len()).find(|i| finals.get(*i) != Some(&kept[*i]));
    if let Some(position) = ascending.map(|at| at + 1) {
        let read = reader[position];
        shared.borrow_mut().violations.push(Violation::ReaderGap { position, read, expected: None });
    } else if let Some(position) = gap {
        let (read, expected) = (kept[position], finals.get(position).copied());
        shared.borrow_mut().violations.push(Violation::ReaderGap { position, read, expected });
    }
    let mut shared = shared.borrow_mut();
    shared.trace.push(format!(
        "stream: {} events, trimmed through {horizon}, the reader read {}",
        first.len(),
        reader.len()
    ));
}
