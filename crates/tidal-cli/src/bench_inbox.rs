//! The inbox workloads of `tidal bench`: inbox-roundtrip (each worker sends to its own inbox and
//! receives the message back), inbox-latency (one parked receiver; send start to delivery),
//! inbox-drain (a burst of sends to one topic while a receiver takes up to 1000 at a time) and
//! inbox-send-backlog (the cost of a send by how many messages its topic already holds).
//!
//! Every run uses fresh owners (`bench-<pid>-<ms>-...`), so runs never see each other's messages,
//! and closes them at the end. What is delicate: a receive without a lease consumes what it takes
//! when the node journals it, so a receive whose answer was lost is sent again with the same
//! receive id (the node answers it with what the lost one took), and a send whose answer was lost
//! is sent again with the same message id (the node stores it once). Message `n` of a run always
//! has the id `m{n}`, which is how the receivers tell what they got.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context;
use tidal_client::Client;
use tidal_types::{ErrorCode, InboxMessageView, InboxReceive, InboxReceived, InboxSent};

use crate::bench::{fetch_metrics, percentile, BenchArgs, Report, Workload};

/// The topic every inbox workload uses.
const TOPIC: &str = "bench";
/// How long a round trip's receive may wait: it goes out after its message was acknowledged, so
/// any wait means the node is slow to deliver what it holds.
const ROUNDTRIP_WAIT_MS: u64 = 1000;
/// Older messages a round trip may take before its own: left by an earlier round trip that failed
/// between its send and its receive (already counted as an error).
const ROUNDTRIP_LEFTOVERS_MAX: u32 = 8;
/// How long a parked receiver's receive waits before it is sent again: half the contract's cap.
const PARKED_WAIT_MS: u64 = 30_000;
/// How long an inbox-latency sample waits for its delivery, and how long the send of a round trip
/// or a sample may go on sending again after lost answers.
const DELIVERY_WAIT: Duration = Duration::from_secs(10);
/// The most messages one inbox-drain receive takes: the contract's cap.
const DRAIN_RECEIVE_MAX: u32 = 1000;
/// Times one send or receive is made (the first one included) when its answer is lost.
const LOST_ANSWER_ATTEMPTS_MAX: u32 = 5;
/// Times one send is made when its topic is full and a receiver drains it, with
/// [`FULL_BACKOFF`] between them: 5 s of waiting for one message.
const FULL_ATTEMPTS_MAX: u32 = 100;
/// The pause before a send refused with `inbox_full` is made again.
const FULL_BACKOFF: Duration = Duration::from_millis(50);
/// How long a fill or a drain may take. They move fixed counts of messages, not `--seconds`
/// worth, and 20,000 sends at a few ms each with a handful in flight take well under this.
const PHASE_TIME_MAX: Duration = Duration::from_secs(300);
/// Sends timed at each backlog level (fewer when `--requests-max` or `--seconds` cut them).
const BACKLOG_TIMED_SENDS: u64 = 2000;
/// What a parked receive is given to reach the node before the first send: the node gives no
/// sign that a receive has parked.
const PARK_SETTLE: Duration = Duration::from_millis(200);
/// The pause before each inbox-latency send, untimed: the receiver's next receive is parked again
/// when the message comes (the peers' queue phase in bench/peers waits as long).
const REPARK_GAP: Duration = Duration::from_millis(10);
/// Receives a parked receiver may make beyond one per message (204s and lost answers).
const SPARE_RECEIVES_MAX: u64 = 10_000;
/// The node's counter of parked receives it woke.
const WAKES_METRIC: &str = "tidal_inbox_receive_wakes_total";

/// The inbox workloads whose requests the bench's workers make (one message per request).
pub enum InboxLoad {
    /// inbox-roundtrip: worker `i` sends to and receives from its own inbox, `{prefix}-{i}`.
    Roundtrip {
        /// The run's owner prefix.
        prefix: String,
        /// Every payload's padding.
        pad: String,
    },
    /// inbox-latency: one receiver parked on one inbox.
    Latency(LatencyBoard),
}

impl InboxLoad {
    /// The inbox load of `args.workload`, if it has one; inbox-latency parks its receiver first.
    pub async fn start(client: &Client, args: &BenchArgs) -> Option<Arc<InboxLoad>> {
        let pad = "x".repeat(args.payload_bytes);
        let load = match args.workload {
            Workload::InboxRoundtrip => InboxLoad::Roundtrip { prefix: run_prefix(), pad },
            Workload::InboxLatency => InboxLoad::Latency(LatencyBoard::park(client, args, pad).await),
            _ => return None,
        };
        Some(Arc::new(load))
    }

    /// Request `n`, made by worker `worker`: its latency in µs.
    pub async fn request(&self, client: &Client, worker: u64, n: u64) -> anyhow::Result<u32> {
        match self {
            InboxLoad::Roundtrip { prefix, pad } => {
                let started = Instant::now();
                roundtrip(client, &format!("{prefix}-{worker}"), n, pad).await?;
                Ok(micros(started.elapsed()))
            }
            InboxLoad::Latency(board) => board.sample(client, n).await,
        }
    }

    /// Closes the run's inboxes (`workers` of them for inbox-roundtrip), so the node does not keep
    /// them; a failure is only reported.
    pub async fn close(&self, client: &Client, workers: u64) {
        match self {
            InboxLoad::Roundtrip { prefix, .. } => {
                for worker in 0..workers {
                    close_quietly(client, &format!("{prefix}-{worker}")).await;
                }
            }
            InboxLoad::Latency(board) => {
                // Stopped first: a receive parked on a closed inbox is refused.
                board.receiver.abort();
                close_quietly(client, &board.owner).await;
            }
        }
    }
}

/// One round trip on `owner`: sends message `n`, then receives until it has it (older messages
/// first, when an earlier round trip failed half way).
async fn roundtrip(client: &Client, owner: &str, n: u64, pad: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + DELIVERY_WAIT;
    send_one(client, owner, n, pad, OnFull::Stop, deadline).await?.context("the inbox is full")?;
    let message_id = message_id(n);
    for leftover in 0..=ROUNDTRIP_LEFTOVERS_MAX {
        let receive = InboxReceive {
            topics: vec![TOPIC.into()],
            wait_ms: ROUNDTRIP_WAIT_MS,
            receive_id: format!("r{n}-{leftover}"),
            lease_ms: None,
            max: None,
        };
        let received = receive_one(client, owner, &receive).await?.with_context(|| {
            format!("{message_id} not delivered within {ROUNDTRIP_WAIT_MS} ms of its ack")
        })?;
        if received.message.message_id == message_id {
            return Ok(());
        }
    }
    anyhow::bail!("{message_id} not delivered after {ROUNDTRIP_LEFTOVERS_MAX} older messages")
}

/// inbox-latency's receiver and what it has seen: when each message id was delivered.
pub struct LatencyBoard {
    owner: String,
    pad: String,
    deliveries: Arc<Deliveries>,
    receiver: tokio::task::AbortHandle,
}

/// When each message id reached the receiver, and a wake-up for whoever waits for one.
#[derive(Default)]
struct Deliveries {
    at: Mutex<HashMap<String, Instant>>,
    arrived: tokio::sync::Notify,
}

impl LatencyBoard {
    /// Parks a receiver on a fresh inbox; it stops when the board is dropped, or after the run's
    /// `--seconds` and `--requests-max` with room to spare.
    async fn park(client: &Client, args: &BenchArgs, pad: String) -> LatencyBoard {
        let owner = format!("{}-latency", run_prefix());
        let deliveries = Arc::new(Deliveries::default());
        let receiver = ParkedReceiver {
            client: client.clone(),
            owner: owner.clone(),
            max: None,
            until: Instant::now() + Duration::from_secs(args.seconds) + 2 * DELIVERY_WAIT,
            receives_max: args.requests_max.saturating_add(SPARE_RECEIVES_MAX),
        };
        let recorder = deliveries.clone();
        let task = tokio::spawn(async move {
            let recorded = receiver.run(|messages, at| {
                recorder.record(&messages, at);
                Ok(false)
            });
            if let Err(error) = recorded.await {
                eprintln!("\nbench: the inbox receiver stopped: {error:#}");
            }
        });
        tokio::time::sleep(PARK_SETTLE).await;
        LatencyBoard { owner, pad, deliveries, receiver: task.abort_handle() }
    }

    /// Sends message `n` and waits for the receiver to have it: the time in µs from the start of
    /// the send until the delivery.
    async fn sample(&self, client: &Client, n: u64) -> anyhow::Result<u32> {
        tokio::time::sleep(REPARK_GAP).await;
        let started = Instant::now();
        let deadline = started + DELIVERY_WAIT;
        send_one(client, &self.owner, n, &self.pad, OnFull::Stop, deadline)
            .await?
            .context("the inbox is full")?;
        let message_id = message_id(n);
        loop {
            let notified = self.deliveries.arrived.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let delivered =
                self.deliveries.at.lock().unwrap_or_else(PoisonError::into_inner).remove(&message_id);
            if let Some(at) = delivered {
                return Ok(micros(at.saturating_duration_since(started)));
            }
            if tokio::time::timeout_at(deadline.into(), notified).await.is_err() {
                anyhow::bail!("{message_id} did not reach the receiver within {DELIVERY_WAIT:?}");
            }
        }
    }
}

impl Drop for LatencyBoard {
    fn drop(&mut self) {
        self.receiver.abort();
    }
}

impl Deliveries {
    fn record(&self, messages: &[InboxMessageView], at: Instant) {
        let mut delivered = self.at.lock().unwrap_or_else(PoisonError::into_inner);
        for message in messages {
            delivered.insert(message.message_id.clone(), at);
        }
        drop(delivered);
        self.arrived.notify_waiters();
    }
}

/// inbox-drain: `--messages` sends from `--concurrency` senders to one topic while one parked
/// receiver takes up to [`DRAIN_RECEIVE_MAX`] at a time. Fails unless the receiver got every
/// message once, in `inbox_seq` order.
pub async fn drain(client: &Client, args: &BenchArgs) -> anyhow::Result<Report> {
    anyhow::ensure!(args.messages >= 1, "inbox-drain needs --messages of at least 1");
    let owner = format!("{}-drain", run_prefix());
    let pad = "x".repeat(args.payload_bytes);
    let wakes_before = receive_wakes(client).await;
    let until = Instant::now() + PHASE_TIME_MAX;
    let receiver = ParkedReceiver {
        client: client.clone(),
        owner: owner.clone(),
        max: Some(DRAIN_RECEIVE_MAX),
        until,
        receives_max: args.messages.saturating_add(SPARE_RECEIVES_MAX),
    };
    let mut tally = DrainTally::new(args.messages);
    let mut all_received = None;
    let receiving = receiver.run(|messages, at| {
        tally.take(&messages)?;
        all_received = tally.is_complete().then_some(at);
        Ok(tally.is_complete())
    });
    let sending = async {
        tokio::time::sleep(PARK_SETTLE).await;
        let first_send = Instant::now();
        let sent =
            send_many(client, &owner, 0..args.messages, args.concurrency, &pad, until, OnFull::Wait).await?;
        anyhow::ensure!(sent.acked == args.messages, "sent {} of {} messages", sent.acked, args.messages);
        Ok((first_send, sent))
    };
    let (receives, (first_send, sent)) =
        tokio::try_join!(receiving, sending).with_context(|| format!("inbox-drain on {owner}"))?;
    let all_received = all_received.context("the receiver stopped before it had every message")?;
    let wakes_after = receive_wakes(client).await;
    close_quietly(client, &owner).await;
    let preloaded = drain_preloaded(client, args, &pad).await?;
    let figures = DrainFigures {
        messages: args.messages,
        total: all_received.saturating_duration_since(first_send),
        drain: all_received.saturating_duration_since(sent.last_ack.unwrap_or(first_send)),
        preloaded,
        receives,
        wakes: wakes_after.zip(wakes_before).and_then(|(after, before)| after.checked_sub(before)),
    };
    Ok(Report {
        requests: args.messages,
        events: args.messages,
        errors: 0,
        elapsed: figures.total,
        latencies_us: sent.latencies_us,
        first_reader_us: Vec::new(),
        inbox: Some(InboxFigures::Drain(figures)),
    })
}

/// The drain the peers' queue phases time: `--messages` sent first with nobody receiving, then one
/// receiver taking up to [`DRAIN_RECEIVE_MAX`] at a time until it has them all, in order.
async fn drain_preloaded(client: &Client, args: &BenchArgs, pad: &str) -> anyhow::Result<Duration> {
    let owner = format!("{}-preloaded", run_prefix());
    let until = Instant::now() + PHASE_TIME_MAX;
    let sent =
        send_many(client, &owner, 0..args.messages, args.concurrency, pad, until, OnFull::Wait).await?;
    anyhow::ensure!(sent.acked == args.messages, "preloaded {} of {} messages", sent.acked, args.messages);
    let receiver = ParkedReceiver {
        client: client.clone(),
        owner: owner.clone(),
        max: Some(DRAIN_RECEIVE_MAX),
        until,
        receives_max: args.messages.saturating_add(SPARE_RECEIVES_MAX),
    };
    let mut tally = DrainTally::new(args.messages);
    let started = Instant::now();
    receiver
        .run(|messages, _| {
            tally.take(&messages)?;
            Ok(tally.is_complete())
        })
        .await
        .with_context(|| format!("inbox-drain (preloaded) on {owner}"))?;
    let drained = started.elapsed();
    close_quietly(client, &owner).await;
    Ok(drained)
}

/// inbox-send-backlog: at each `--backlog-levels` level, a fresh inbox's topic is filled to the
/// level, then up to [`BACKLOG_TIMED_SENDS`] sends are timed. The table's row adds up the timed
/// sends of every level.
pub async fn send_backlog(client: &Client, args: &BenchArgs) -> anyhow::Result<Report> {
    let prefix = run_prefix();
    let pad = "x".repeat(args.payload_bytes);
    let (mut levels, mut latencies_us, mut elapsed) = (Vec::new(), Vec::new(), Duration::ZERO);
    for &level in &args.backlog_levels {
        let owner = format!("{prefix}-backlog-{level}");
        let measured = measure_level(client, args, &owner, level, &pad).await;
        close_quietly(client, &owner).await;
        let (outcome, timed) = measured.with_context(|| format!("backlog level {level} on {owner}"))?;
        if let Some(timed) = timed {
            elapsed += timed.seconds;
            latencies_us.extend(timed.latencies_us);
        }
        levels.push(BacklogLevel { level, outcome });
    }
    let sends = latencies_us.len() as u64;
    Ok(Report {
        requests: sends,
        events: sends,
        errors: 0,
        elapsed,
        latencies_us,
        first_reader_us: Vec::new(),
        inbox: Some(InboxFigures::Backlog(levels)),
    })
}

/// One backlog level: fills `owner`'s topic to `level` messages, then times sends on top; the
/// outcome, and the timed sends when there were some.
async fn measure_level(
    client: &Client,
    args: &BenchArgs,
    owner: &str,
    level: u64,
    pad: &str,
) -> anyhow::Result<(LevelOutcome, Option<Sent>)> {
    if !args.quiet {
        eprintln!("bench: filling {owner} to {level} messages");
    }
    let fill_deadline = Instant::now() + PHASE_TIME_MAX;
    let fill = send_many(client, owner, 0..level, args.concurrency, pad, fill_deadline, OnFull::Stop).await?;
    if fill.full {
        return Ok((LevelOutcome::Capped { backlog: fill.acked }, None));
    }
    anyhow::ensure!(fill.acked == level, "filled {} of {level} within {PHASE_TIME_MAX:?}", fill.acked);
    if level > 0 {
        let view = client.inbox_show(owner).await?;
        let backlog = view.topics.iter().find(|topic| topic.topic == TOPIC).map_or(0, |topic| topic.backlog);
        anyhow::ensure!(backlog == level, "the topic holds {backlog} messages after a fill to {level}");
    }
    let count = BACKLOG_TIMED_SENDS.min(args.requests_max);
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let timed =
        send_many(client, owner, level..level + count, args.concurrency, pad, deadline, OnFull::Stop).await?;
    if timed.full {
        return Ok((LevelOutcome::Capped { backlog: level + timed.acked }, None));
    }
    let mut sorted_us = timed.latencies_us.clone();
    sorted_us.sort_unstable();
    let outcome = LevelOutcome::Measured {
        sends: timed.acked,
        seconds: timed.seconds.as_secs_f64(),
        p50_ms: percentile(&sorted_us, 0.50),
        p99_ms: percentile(&sorted_us, 0.99),
    };
    Ok((outcome, Some(timed)))
}

/// What an inbox workload measured beyond the bench's table.
#[derive(Clone, Debug)]
pub enum InboxFigures {
    /// inbox-drain.
    Drain(DrainFigures),
    /// inbox-send-backlog, level by level.
    Backlog(Vec<BacklogLevel>),
}

/// What inbox-drain measured.
#[derive(Clone, Debug)]
pub struct DrainFigures {
    /// Messages sent and received.
    pub messages: u64,
    /// From the first send until the receiver had every message.
    pub total: Duration,
    /// From the last send's acknowledgement until the receiver had every message (0 when it had
    /// them first).
    pub drain: Duration,
    /// With every message sent before the receiver starts: how long it takes them all (what the
    /// peers' queue drains time).
    pub preloaded: Duration,
    /// The receiver's receives.
    pub receives: ReceiveCounts,
    /// How many times the node woke a parked receive over the run, from its `/metrics` before and
    /// after; None when it does not export the counter.
    pub wakes: Option<u64>,
}

/// One level of inbox-send-backlog.
#[derive(Clone, Debug)]
pub struct BacklogLevel {
    /// The messages the topic held before the timed sends.
    pub level: u64,
    /// What the timed sends showed.
    pub outcome: LevelOutcome,
}

/// What the sends at one backlog level showed.
#[derive(Clone, Debug)]
pub enum LevelOutcome {
    /// The sends were timed.
    Measured {
        /// Sends acknowledged.
        sends: u64,
        /// Their wall time.
        seconds: f64,
        /// Their median latency.
        p50_ms: f64,
        /// Their 99th percentile latency.
        p99_ms: f64,
    },
    /// The node refused a send with `inbox_full` when the topic held `backlog` messages: the level
    /// (or the timed sends on top of it) is past its per-topic cap.
    Capped {
        /// The messages the topic held.
        backlog: u64,
    },
}

impl InboxFigures {
    /// Prints the figures as a table whose rows start with `workload`.
    pub fn print(&self, workload: Workload, concurrency: usize) {
        match self {
            InboxFigures::Drain(drain) => {
                println!("\n| workload | messages | senders | total ms | drain ms | receives | empty receives | receive wakes | preloaded drain ms |");
                println!("|---|---|---|---|---|---|---|---|---|");
                println!(
                    "| {workload:?} | {} | {concurrency} | {:.1} | {:.1} | {} | {} | {} | {:.1} |",
                    drain.messages,
                    drain.total.as_secs_f64() * 1000.0,
                    drain.drain.as_secs_f64() * 1000.0,
                    drain.receives.delivered,
                    drain.receives.empty,
                    drain.wakes.map_or("n/a".to_string(), |wakes| wakes.to_string()),
                    drain.preloaded.as_secs_f64() * 1000.0,
                );
                println!("\ntotal: first send until the receiver had every message; drain: last send's ack until then;");
                println!("preloaded drain: every message sent first, then one receiver takes them all");
            }
            InboxFigures::Backlog(levels) => {
                println!("\n| workload | backlog | sends | seconds | sends/s | p50 ms | p99 ms |");
                println!("|---|---|---|---|---|---|---|");
                for BacklogLevel { level, outcome } in levels {
                    match outcome {
                        LevelOutcome::Measured { sends, seconds, p50_ms, p99_ms } => println!(
                            "| {workload:?} | {level} | {sends} | {seconds:.1} | {:.0} | {p50_ms:.2} | {p99_ms:.2} |",
                            *sends as f64 / seconds.max(1e-9)
                        ),
                        LevelOutcome::Capped { backlog } => println!(
                            "| {workload:?} | {level} | capped: inbox_full at {backlog} (raise inbox_backlog_max) | | | | |"
                        ),
                    }
                }
            }
        }
    }
}

/// What a parked receiver's receives brought.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReceiveCounts {
    /// Receives that delivered messages.
    pub delivered: u64,
    /// Receives that waited their whole time for nothing (204).
    pub empty: u64,
}

/// One receiver parked on `owner`'s topic: one receive at a time, each waiting up to
/// [`PARKED_WAIT_MS`], each with a fresh receive id except after a lost answer.
struct ParkedReceiver {
    client: Client,
    owner: String,
    /// Messages per receive (None: one).
    max: Option<u32>,
    /// It stops at this time...
    until: Instant,
    /// ... or after this many receives.
    receives_max: u64,
}

impl ParkedReceiver {
    /// Receives and hands each delivery's messages, with the time they came, to `take`, until
    /// `take` says it has everything (true) or fails, a receive is refused, or a bound is hit.
    async fn run(
        self,
        mut take: impl FnMut(Vec<InboxMessageView>, Instant) -> anyhow::Result<bool>,
    ) -> anyhow::Result<ReceiveCounts> {
        let mut counts = ReceiveCounts::default();
        for _ in 0..self.receives_max {
            anyhow::ensure!(Instant::now() < self.until, "the receiver ran out of time ({counts:?})");
            let receive = InboxReceive {
                topics: vec![TOPIC.into()],
                wait_ms: PARKED_WAIT_MS,
                // Numbered by answers, so a receive whose answer was lost keeps its id.
                receive_id: format!("r{}", counts.delivered + counts.empty),
                lease_ms: None,
                max: self.max,
            };
            match receive_one(&self.client, &self.owner, &receive).await? {
                Some(received) => {
                    counts.delivered += 1;
                    if take(messages_of(received), Instant::now())? {
                        return Ok(counts);
                    }
                }
                None => counts.empty += 1,
            }
        }
        anyhow::bail!("the receiver made its {} receives ({counts:?})", self.receives_max)
    }
}

/// The messages of a delivery: all of them when the receive gave `max`, else the one.
fn messages_of(received: InboxReceived) -> Vec<InboxMessageView> {
    received.messages.unwrap_or_else(|| vec![received.message])
}

/// What inbox-drain's receiver checks as messages arrive: `inbox_seq` strictly increasing, and
/// each of the run's messages (`m0` up to the count) exactly once.
struct DrainTally {
    expected: u64,
    last_seq: u64,
    seen: HashSet<u64>,
}

/// A delivery inbox-drain must not see.
#[derive(Debug, PartialEq, Eq)]
enum DrainViolation {
    /// A message came with an `inbox_seq` not above the one before it.
    OutOfOrder { previous: u64, got: u64, message_id: String },
    /// A message came twice.
    Duplicate { message_id: String },
    /// A message the run did not send.
    Unknown { message_id: String },
}

impl DrainTally {
    fn new(expected: u64) -> DrainTally {
        DrainTally { expected, last_seq: 0, seen: HashSet::new() }
    }

    /// Takes one delivery's messages, in the order they came.
    fn take(&mut self, messages: &[InboxMessageView]) -> Result<(), DrainViolation> {
        for message in messages {
            let message_id = || message.message_id.clone();
            if message.inbox_seq <= self.last_seq {
                let (previous, got) = (self.last_seq, message.inbox_seq);
                return Err(DrainViolation::OutOfOrder { previous, got, message_id: message_id() });
            }
            self.last_seq = message.inbox_seq;
            let index = message_index(&message.message_id).filter(|index| *index < self.expected);
            let index = index.ok_or_else(|| DrainViolation::Unknown { message_id: message_id() })?;
            if !self.seen.insert(index) {
                return Err(DrainViolation::Duplicate { message_id: message_id() });
            }
        }
        Ok(())
    }

    fn is_complete(&self) -> bool {
        self.seen.len() as u64 == self.expected
    }
}

impl std::fmt::Display for DrainViolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DrainViolation::OutOfOrder { previous, got, message_id } => {
                write!(f, "out of order: {message_id} has inbox_seq {got}, after {previous}")
            }
            DrainViolation::Duplicate { message_id } => write!(f, "delivered twice: {message_id}"),
            DrainViolation::Unknown { message_id } => write!(f, "delivered but never sent: {message_id}"),
        }
    }
}

impl std::error::Error for DrainViolation {}

/// What to do when a send is refused with `inbox_full`.
#[derive(Clone, Copy)]
enum OnFull {
    /// Back off and send it again: a receiver is draining the topic.
    Wait,
    /// Stop sending: the topic is at the node's cap and nothing drains it.
    Stop,
}

/// What a burst of sends did.
#[derive(Default)]
struct Sent {
    /// Sends acknowledged.
    acked: u64,
    /// Their latencies in µs.
    latencies_us: Vec<u32>,
    /// When the last acknowledgement came.
    last_ack: Option<Instant>,
    /// Whether a send was refused with `inbox_full` (under [`OnFull::Stop`]).
    full: bool,
    /// From the first send until the last sender stopped.
    seconds: Duration,
}

/// Sends messages `range` to `owner`'s topic from `concurrency` senders at once, until each is
/// acknowledged, `deadline` passes, or (under [`OnFull::Stop`]) the topic is full.
async fn send_many(
    client: &Client,
    owner: &str,
    range: Range<u64>,
    concurrency: usize,
    pad: &str,
    deadline: Instant,
    on_full: OnFull,
) -> anyhow::Result<Sent> {
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(range.start));
    let stop = Arc::new(AtomicBool::new(false));
    let senders: Vec<_> = (0..(concurrency as u64).min(range.end - range.start))
        .map(|_| {
            let (client, owner, pad) = (client.clone(), owner.to_string(), pad.to_string());
            let (next, stop, end) = (next.clone(), stop.clone(), range.end);
            tokio::spawn(async move {
                let mut sent = Sent::default();
                while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= end {
                        break;
                    }
                    let at = Instant::now();
                    let Some(_) = send_one(&client, &owner, n, &pad, on_full, deadline).await? else {
                        stop.store(true, Ordering::Relaxed);
                        sent.full = true;
                        break;
                    };
                    sent.latencies_us.push(micros(at.elapsed()));
                    sent.last_ack = Some(Instant::now());
                    sent.acked += 1;
                }
                Ok::<Sent, anyhow::Error>(sent)
            })
        })
        .collect();
    let mut all = Sent::default();
    for sender in senders {
        let sent = sender.await.context("inbox sender")??;
        all.acked += sent.acked;
        all.latencies_us.extend(sent.latencies_us);
        all.last_ack = all.last_ack.max(sent.last_ack);
        all.full |= sent.full;
    }
    all.seconds = started.elapsed();
    Ok(all)
}

/// Sends message `n` to `owner`'s topic: again under the same id after a lost answer (the node
/// stores it once), and after `inbox_full` under [`OnFull::Wait`]; None when the topic is full
/// under [`OnFull::Stop`].
async fn send_one(
    client: &Client,
    owner: &str,
    n: u64,
    pad: &str,
    on_full: OnFull,
    deadline: Instant,
) -> anyhow::Result<Option<InboxSent>> {
    let message_id = message_id(n);
    let (mut lost, mut full) = (0, 0);
    loop {
        let payload = serde_json::json!({ "n": n, "pad": pad });
        let error = match client.inbox_send(owner, TOPIC, payload, &message_id).await {
            Ok(sent) => return Ok(Some(sent)),
            Err(error) => error,
        };
        if error.code() == Some(ErrorCode::InboxFull.as_str()) {
            full += 1;
            match on_full {
                OnFull::Stop => return Ok(None),
                OnFull::Wait if full < FULL_ATTEMPTS_MAX && Instant::now() < deadline => {
                    tokio::time::sleep(FULL_BACKOFF).await;
                    continue;
                }
                OnFull::Wait => {}
            }
        } else if error.code().is_none() && lost + 1 < LOST_ANSWER_ATTEMPTS_MAX && Instant::now() < deadline {
            lost += 1;
            continue;
        }
        return Err(error).with_context(|| format!("send {message_id} to {owner}"));
    }
}

/// One receive on `owner`, made again with the same id after a lost answer (the node answers it
/// with what the lost one took).
async fn receive_one(
    client: &Client,
    owner: &str,
    receive: &InboxReceive,
) -> anyhow::Result<Option<InboxReceived>> {
    let mut attempt = 1;
    loop {
        match client.inbox_receive(owner, receive).await {
            Ok(received) => return Ok(received),
            Err(error) if error.code().is_none() && attempt < LOST_ANSWER_ATTEMPTS_MAX => attempt += 1,
            Err(error) => {
                return Err(error).with_context(|| format!("receive {} on {owner}", receive.receive_id));
            }
        }
    }
}

/// Closes `owner`'s inbox, saying so on stderr when that fails (the figures are taken already);
/// an inbox that never got a message does not exist, and is left alone.
async fn close_quietly(client: &Client, owner: &str) {
    match client.inbox_close(owner).await {
        Err(error) if error.code() != Some(ErrorCode::NotFound.as_str()) => {
            eprintln!("bench: closing inbox {owner}: {error}");
        }
        _ => {}
    }
}

/// The node's count of parked receives woken, from its `/metrics`; None when it does not answer
/// or has no such counter.
async fn receive_wakes(client: &Client) -> Option<u64> {
    let metrics = fetch_metrics(client.base(), client.token()).await.ok()?;
    counter(&metrics, WAKES_METRIC)
}

/// The counter `name` in a `/metrics` text, summed over its label sets; None without a sample.
fn counter(metrics: &str, name: &str) -> Option<u64> {
    let mut total = None;
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix(name) else { continue };
        // After the name come labels or the value; anything else is another metric (`name_x`).
        let rest = match rest.strip_prefix('{') {
            Some(labels) => labels.split_once('}').map_or("", |(_, after)| after),
            None if rest.starts_with(' ') => rest,
            None => continue,
        };
        let value: f64 = rest.split_whitespace().next()?.parse().ok()?;
        total = Some(total.unwrap_or(0) + value as u64);
    }
    total
}

/// A fresh owner prefix for this run: `bench-<pid>-<unix ms>`.
fn run_prefix() -> String {
    let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    format!("bench-{}-{ms}", std::process::id())
}

/// The id of message `n` of a run.
fn message_id(n: u64) -> String {
    format!("m{n}")
}

/// The `n` of a [`message_id`].
fn message_index(message_id: &str) -> Option<u64> {
    message_id.strip_prefix('m')?.parse().ok()
}

fn micros(duration: Duration) -> u32 {
    u32::try_from(duration.as_micros()).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::{counter, message_id, DrainTally, DrainViolation};
    use tidal_types::InboxMessageView;

    fn message(inbox_seq: u64, n: u64) -> InboxMessageView {
        InboxMessageView {
            topic: "bench".into(),
            inbox_seq,
            message_id: message_id(n),
            sender: "bench".into(),
            payload: serde_json::json!({ "n": n }),
            created_at_ms: 0,
        }
    }

    #[test]
    fn the_drain_tally_wants_every_message_once_in_order() {
        let mut tally = DrainTally::new(3);
        assert_eq!(tally.take(&[message(10, 1), message(12, 0)]), Ok(()));
        assert!(!tally.is_complete());
        assert_eq!(tally.take(&[message(15, 2)]), Ok(()));
        assert!(tally.is_complete());

        let mut tally = DrainTally::new(3);
        tally.take(&[message(10, 0)]).unwrap();
        let violation = tally.take(&[message(10, 1)]);
        assert_eq!(
            violation,
            Err(DrainViolation::OutOfOrder { previous: 10, got: 10, message_id: "m1".into() })
        );

        let mut tally = DrainTally::new(3);
        tally.take(&[message(10, 0)]).unwrap();
        assert_eq!(tally.take(&[message(11, 0)]), Err(DrainViolation::Duplicate { message_id: "m0".into() }));

        let mut tally = DrainTally::new(3);
        assert_eq!(tally.take(&[message(10, 3)]), Err(DrainViolation::Unknown { message_id: "m3".into() }));
        let mut stranger = message(11, 0);
        stranger.message_id = "someone-else".into();
        assert_eq!(
            tally.take(&[stranger]),
            Err(DrainViolation::Unknown { message_id: "someone-else".into() })
        );
    }

    #[test]
    fn a_counter_is_summed_over_its_labels_and_absent_without_samples() {
        let text = "# TYPE tidal_inbox_receive_wakes_total counter\n\
                    tidal_inbox_receive_wakes_total{node=\"1\"} 7\n\
                    tidal_inbox_receive_wakes_total{node=\"2\"} 5\n\
                    tidal_inbox_receive_wakes_total_created 1700000000\n\
                    tidal_other_total 3\n";
        assert_eq!(counter(text, "tidal_inbox_receive_wakes_total"), Some(12));
        assert_eq!(
            counter("tidal_inbox_receive_wakes_total 42\n", "tidal_inbox_receive_wakes_total"),
            Some(42)
        );
        assert_eq!(counter("tidal_other_total 3\n", "tidal_inbox_receive_wakes_total"), None);
    }
}
