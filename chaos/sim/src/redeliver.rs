//! Duplicated and reordered delivery of ships (issue 5's fault list), through the one seam
//! tidal-net has for it: a [`tidal_net::ShipTap`] on the node's connector. turmoil's TCP keeps a
//! connection in order, and gRPC sends each ship as one request, so neither fault can come from the
//! simulated network: the tap makes them. After a leader's `Peer::ship` has its answer, the tap may
//!
//! - **duplicate** it: a copy is sent again to the same follower after a drawn delay (0 up to
//!   `delay_max`; with 0 it races the queue's next ship), as a separate request whose answer is
//!   discarded (counted by class: `redelivered_<answer>`);
//! - **reorder** it: a copy is held and delivered after the `k`-th later ship to the same follower
//!   was answered (`k` in 1..=`hold_max`), also separately, answer discarded. The queue's own ship
//!   and answer are unchanged, so the queue is never confused: only the follower sees the copy, out
//!   of order, possibly in a later term (the leader may have been deposed in between) or from an
//!   earlier process of a node that crashed and came back (held copies outlive a crash of their
//!   sender, like messages still in the network).
//!
//! Every copy goes through the follower's one receive path: term fencing, log matching, Skip of
//! batches it holds, Refuse of a batch starting inside one of its own, commit never decreasing.
//! The rates are drawn per seed from a stream of their own (the families' fault plans stay as
//! recorded); the driver stops redelivery at the heal (held copies are dropped).

use crate::rng::Rng;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tidal_net::{Chunk, Peer, Probe, ProbeOutcome, RaftCall, Ship, ShipOutcome};

/// Per-seed rates (0: the class is off).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Rates {
    /// Probability that a ship is duplicated.
    pub duplicate: f64,
    /// Probability that a copy of a ship is held and delivered after later ones.
    pub reorder: f64,
    /// Longest delay of a duplicate (ms).
    pub delay_max_ms: u64,
    /// Most later ships a reordered copy waits for.
    pub hold_max: u64,
    /// Probability that a pulled chunk reaches the puller twice in a row.
    pub chunk_duplicate: f64,
    /// Probability that a copy of a pulled chunk is held and handed to the puller after the 1st to
    /// `hold_max`-th later chunk from the same node (a later pull's, if this one ended first).
    pub chunk_reorder: f64,
    /// Probability that a control-plane call (an openraft RPC: vote, append-entries,
    /// install-snapshot; or an office probe) is sent again after a drawn delay.
    pub control_duplicate: f64,
    /// Probability that a copy of a control-plane call is held and sent after the 1st to
    /// `control_hold_max`-th later call to the same node.
    pub control_reorder: f64,
    /// Longest delay of a control-plane duplicate (ms).
    pub control_delay_max_ms: u64,
    /// Most later calls a reordered control-plane copy waits for.
    pub control_hold_max: u64,
}

impl Rates {
    /// Whether any class is on.
    pub fn any(&self) -> bool {
        self.duplicate > 0.0
            || self.reorder > 0.0
            || self.chunk_duplicate > 0.0
            || self.chunk_reorder > 0.0
            || self.control_any()
    }

    /// Whether a control-plane class is on.
    pub fn control_any(&self) -> bool {
        self.control_duplicate > 0.0 || self.control_reorder > 0.0
    }

    /// Swarm draw: each class on with probability 0.6, its rate 2-30 %.
    pub fn draw(seed: u64) -> Rates {
        let mut rng = Rng::new(seed ^ 0x0d0b_1e5e_4d00_0000);
        let rate = |rng: &mut Rng| {
            if rng.chance(0.6) {
                rng.range(2, 31) as f64 / 100.0
            } else {
                0.0
            }
        };
        let duplicate = rate(&mut rng);
        let reorder = rate(&mut rng);
        let (delay_max_ms, hold_max) = (rng.range(50, 5000), rng.range(1, 6));
        // Drawn after the ship rates, so a seed keeps the ship rates it had before chunks were tapped.
        let chunk_duplicate = rate(&mut rng);
        let chunk_reorder = rate(&mut rng);
        // The control-plane classes from a stream of their own: a seed keeps every rate above.
        let mut control = Rng::new(seed ^ 0x0c07_7401_5eed_0000);
        let control_duplicate = rate(&mut control);
        let control_reorder = rate(&mut control);
        let (control_delay_max_ms, control_hold_max) = (control.range(50, 3000), control.range(1, 21));
        Rates {
            duplicate,
            reorder,
            delay_max_ms,
            hold_max,
            chunk_duplicate,
            chunk_reorder,
            control_duplicate,
            control_reorder,
            control_delay_max_ms,
            control_hold_max,
        }
    }

    /// The same rates without the control-plane classes (`TIDAL_SIM_CONTROL_REDELIVERY=0`).
    pub fn without_control(self) -> Rates {
        Rates { control_duplicate: 0.0, control_reorder: 0.0, ..self }
    }
}

/// At most this many copies held per follower (a held ship may be large).
const HELD_MAX: usize = 8;

/// A held copy of a ship or a control-plane call.
struct Held<T> {
    /// Later sends to the same node to wait for.
    later: u64,
    copy: T,
}

/// One sender class's redelivery rates: hold a copy (released after 1..=`hold_max` later sends to
/// the same node) with probability `reorder`; send one again after 0..=`delay_max_ms` with
/// probability `duplicate`.
struct CopyRates {
    reorder: f64,
    hold_max: u64,
    duplicate: f64,
    delay_max_ms: u64,
}

/// One answered send of `sent` to a node whose held copies are `held`: ages them and returns those
/// now due, maybe holds a copy of `sent`, and maybe draws a delay for a duplicate (the draws in
/// that order, so a seed's plan replays).
fn plan_copies<T: Clone>(
    held: &mut Vec<Held<T>>,
    sent: &T,
    rng: &mut Rng,
    rates: CopyRates,
) -> (Vec<T>, Option<Duration>) {
    for held in held.iter_mut() {
        held.later = held.later.saturating_sub(1);
    }
    let (released, kept): (Vec<Held<T>>, Vec<Held<T>>) = held.drain(..).partition(|held| held.later == 0);
    *held = kept;
    if held.len() < HELD_MAX && rng.chance(rates.reorder) {
        let later = rng.range(1, rates.hold_max + 1);
        held.push(Held { later, copy: sent.clone() });
    }
    let duplicate =
        rng.chance(rates.duplicate).then(|| Duration::from_millis(rng.range(0, rates.delay_max_ms + 1)));
    (released.into_iter().map(|held| held.copy).collect(), duplicate)
}

/// A held copy of a pulled chunk.
struct HeldChunk {
    /// Later chunks from the same node to wait for.
    later: u64,
    chunk: Chunk,
}

/// A control-plane call the tap may send again.
#[derive(Clone)]
enum Call {
    Raft { call: RaftCall, timeout: Duration },
    Probe { probe: Probe, timeout: Duration },
}

struct State {
    rng: Rng,
    /// The control-plane classes' choices (a stream of their own, so the ship choices of a seed
    /// stay as they were; both follow the order the calls happen in).
    control_rng: Rng,
    /// Copies of control-plane calls, by target address.
    held_calls: HashMap<String, Vec<Held<Call>>>,
    /// By follower address.
    held: HashMap<String, Vec<Held<Ship>>>,
    /// Copies of pulled chunks, by the address they were pulled from.
    held_chunks: HashMap<String, Vec<HeldChunk>>,
    counts: BTreeMap<&'static str, u64>,
    /// What a copy did that a follower must never do (halt its receiver, accept an older term):
    /// `"address: what"`.
    halts: Vec<String>,
}

struct Inner {
    rates: Rates,
    enabled: AtomicBool,
    state: Mutex<State>,
}

/// One node's redelivery tap (shared by its restarts).
#[derive(Clone)]
pub struct Redelivery(Arc<Inner>);

impl Redelivery {
    /// A tap with `rates`, its choices drawn from `seed`.
    pub fn new(rates: Rates, seed: u64) -> Redelivery {
        Redelivery(Arc::new(Inner {
            rates,
            enabled: AtomicBool::new(rates.any()),
            state: Mutex::new(State {
                rng: Rng::new(seed),
                control_rng: Rng::new(seed ^ 0x0c07_7401),
                held_calls: HashMap::new(),
                held: HashMap::new(),
                held_chunks: HashMap::new(),
                counts: BTreeMap::new(),
                halts: Vec::new(),
            }),
        }))
    }

    /// The rates.
    pub fn rates(&self) -> Rates {
        self.0.rates
    }

    /// Stops redelivery (the heal): held copies are dropped, copies on their way are not sent.
    pub fn stop(&self) {
        self.0.enabled.store(false, Ordering::SeqCst);
        let mut state = self.lock();
        state.held.clear();
        state.held_chunks.clear();
        state.held_calls.clear();
    }

    /// Copies sent and their answers, by class.
    pub fn counts(&self) -> BTreeMap<&'static str, u64> {
        self.lock().counts.clone()
    }

    /// What copies made followers do that they must never do (`"address: what"`): a halted
    /// receiver, a ship of an older term accepted. The driver reports each as a violation.
    pub fn halts(&self) -> Vec<String> {
        self.lock().halts.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sends `ship` to `peer` after `delay` as a separate request; its answer is only counted.
    fn send(&self, peer: Peer, ship: Ship, delay: Duration, class: &'static str) {
        let this = self.clone();
        tokio::spawn(async move {
            if !delay.is_zero() {
                // The copy's time in the network (simulated), not a synchronization.
                tokio::time::sleep(delay).await;
            }
            if !this.0.enabled.load(Ordering::SeqCst) {
                return;
            }
            *this.lock().counts.entry(class).or_default() += 1;
            let answer = match peer.ship(&ship).await {
                Ok(answer) => match answer.outcome {
                    // Invariant 4: no node accepts a ship whose sender's term is below its own.
                    ShipOutcome::Matched(_) if answer.term > ship.term => {
                        this.lock().halts.push(format!(
                            "{}: invariant 4: it accepted a ship of term {} while in term {}",
                            peer.address(),
                            ship.term,
                            answer.term
                        ));
                        "redelivered_accepted_stale"
                    }
                    ShipOutcome::Matched(_) => "redelivered_matched",
                    ShipOutcome::Fenced => "redelivered_fenced",
                    ShipOutcome::NotYet => "redelivered_not_yet",
                    ShipOutcome::Gap(_) => "redelivered_gap",
                    ShipOutcome::Diverged(_) => "redelivered_diverged",
                    // A halt (tidal-protocol's follower.rs): the copy would have made the follower drop
                    // committed batches, or one term has two logs. The driver makes it a violation.
                    ShipOutcome::Refused(reason)
                        if reason.contains("would quarantine committed") || reason.contains("two logs") =>
                    {
                        this.lock().halts.push(format!("{}: {reason}", peer.address()));
                        "redelivered_halted"
                    }
                    ShipOutcome::Refused(_) => "redelivered_refused",
                },
                Err(_) => "redelivered_lost",
            };
            *this.lock().counts.entry(answer).or_default() += 1;
        });
    }
}

impl Redelivery {
    /// A control-plane call was answered: maybe hold a copy, maybe send one again after a delay,
    /// and release the held copies whose turn came.
    fn control_sent(&self, untapped: &Peer, call: Call) {
        if !self.0.enabled.load(Ordering::SeqCst) {
            return;
        }
        let rates = self.0.rates;
        if !rates.control_any() {
            return;
        }
        let (released, duplicate) = {
            let mut state = self.lock();
            let state = &mut *state;
            let held = state.held_calls.entry(untapped.address().to_string()).or_default();
            let rates = CopyRates {
                reorder: rates.control_reorder,
                hold_max: rates.control_hold_max,
                duplicate: rates.control_duplicate,
                delay_max_ms: rates.control_delay_max_ms,
            };
            plan_copies(held, &call, &mut state.control_rng, rates)
        };
        for copy in released {
            self.send_call(untapped.clone(), copy, Duration::ZERO, "reorder");
        }
        if let Some(delay) = duplicate {
            self.send_call(untapped.clone(), call, delay, "duplicate");
        }
    }

    /// Sends a copy of a control-plane call after `delay` as a separate request; its answer is
    /// only counted (`raft_copy_<kind>_<answer>`, `probe_copy_<answer>`).
    fn send_call(&self, peer: Peer, call: Call, delay: Duration, how: &'static str) {
        let this = self.clone();
        tokio::spawn(async move {
            if !delay.is_zero() {
                // The copy's time in the network (simulated), not a synchronization.
                tokio::time::sleep(delay).await;
            }
            if !this.0.enabled.load(Ordering::SeqCst) {
                return;
            }
            let class = match (&call, how) {
                (Call::Raft { .. }, "duplicate") => "raft_duplicate",
                (Call::Raft { .. }, _) => "raft_reorder",
                (Call::Probe { .. }, "duplicate") => "probe_duplicate",
                (Call::Probe { .. }, _) => "probe_reorder",
            };
            *this.lock().counts.entry(class).or_default() += 1;
            let answer = match call {
                Call::Raft { call, timeout } => {
                    let kind = call.kind.clone();
                    let request = serde_json::from_slice::<serde_json::Value>(&call.payload).ok();
                    match peer.raft(call, timeout).await {
                        Ok(reply) => {
                            let reply = serde_json::from_slice::<serde_json::Value>(&reply).ok();
                            let (answer, stale) = raft_answer(&kind, request.as_ref(), reply.as_ref());
                            if let Some(what) = stale {
                                this.lock().halts.push(format!("{}: {what}", peer.address()));
                            }
                            answer
                        }
                        Err(_) => "raft_copy_lost",
                    }
                }
                Call::Probe { probe, timeout } => match peer.probe(&probe, timeout).await {
                    // The answerer's position is only for the prober's own term.
                    Ok(reply)
                        if matches!(reply.outcome, ProbeOutcome::Position { .. })
                            && reply.term != probe.term =>
                    {
                        this.lock().halts.push(format!(
                            "{}: answered a probe of term {} with its position while in term {}",
                            peer.address(),
                            probe.term,
                            reply.term
                        ));
                        "probe_copy_wrong_term"
                    }
                    Ok(reply) => match reply.outcome {
                        ProbeOutcome::Position { .. } => "probe_copy_position",
                        ProbeOutcome::Fenced => "probe_copy_fenced",
                        ProbeOutcome::NotYet => "probe_copy_not_yet",
                    },
                    Err(_) => "probe_copy_lost",
                },
            };
            *this.lock().counts.entry(answer).or_default() += 1;
        });
    }
}

/// The term of an openraft vote (`{"leader_id": {"term": T, ..}, ..}`) at `pointer` in `value`.
fn vote_term(value: &serde_json::Value, pointer: &str) -> Option<u64> {
    value.pointer(pointer)?.as_u64()
}

/// Classifies the answer to a copy of an openraft RPC (openraft's `Result<Response, RaftError>`
/// in JSON), and says what it must never be: a vote granted by a node whose own vote is of a
/// later term than the copy's (an older term's candidate elected after the fact).
fn raft_answer(
    kind: &str,
    request: Option<&serde_json::Value>,
    reply: Option<&serde_json::Value>,
) -> (&'static str, Option<String>) {
    let Some(reply) = reply else { return ("raft_copy_undecodable", None) };
    if reply.get("Err").is_some() {
        return (
            match kind {
                "vote" => "raft_copy_vote_error",
                "append" => "raft_copy_append_error",
                _ => "raft_copy_snapshot_error",
            },
            None,
        );
    }
    let Some(ok) = reply.get("Ok") else { return ("raft_copy_undecodable", None) };
    match kind {
        "vote" => {
            let granted = ok.get("vote_granted").and_then(serde_json::Value::as_bool).unwrap_or(false);
            if !granted {
                return ("raft_copy_vote_refused", None);
            }
            let asked = request.and_then(|request| vote_term(request, "/vote/leader_id/term"));
            let holds = vote_term(ok, "/vote/leader_id/term");
            match (asked, holds) {
                (Some(asked), Some(holds)) if holds > asked => (
                    "raft_copy_vote_granted_stale",
                    Some(format!("granted a vote of term {asked} while its own vote is of term {holds}")),
                ),
                _ => ("raft_copy_vote_granted", None),
            }
        }
        "append" => (
            match ok {
                serde_json::Value::String(answer) if answer == "Success" => "raft_copy_append_success",
                serde_json::Value::String(answer) if answer == "Conflict" => "raft_copy_append_conflict",
                serde_json::Value::Object(answer) if answer.contains_key("PartialSuccess") => {
                    "raft_copy_append_partial"
                }
                serde_json::Value::Object(answer) if answer.contains_key("HigherVote") => {
                    "raft_copy_append_higher_vote"
                }
                _ => "raft_copy_append_other",
            },
            None,
        ),
        _ => ("raft_copy_snapshot_ok", None),
    }
}

impl tidal_net::ControlTap for Redelivery {
    fn raft_sent(&self, untapped: &Peer, call: &RaftCall, timeout: Duration) {
        self.control_sent(untapped, Call::Raft { call: call.clone(), timeout });
    }

    fn probed(&self, untapped: &Peer, probe: &Probe, timeout: Duration) {
        self.control_sent(untapped, Call::Probe { probe: probe.clone(), timeout });
    }
}

impl tidal_net::ShipTap for Redelivery {
    fn shipped(&self, untapped: &Peer, ship: &Ship) {
        if !self.0.enabled.load(Ordering::SeqCst) {
            return;
        }
        let rates = self.0.rates;
        let (released, duplicate) = {
            let mut state = self.lock();
            let state = &mut *state;
            let held = state.held.entry(untapped.address().to_string()).or_default();
            let rates = CopyRates {
                reorder: rates.reorder,
                hold_max: rates.hold_max,
                duplicate: rates.duplicate,
                delay_max_ms: rates.delay_max_ms,
            };
            plan_copies(held, ship, &mut state.rng, rates)
        };
        for copy in released {
            self.send(untapped.clone(), copy, Duration::ZERO, "ship_reorder");
        }
        if let Some(delay) = duplicate {
            self.send(untapped.clone(), ship.clone(), delay, "ship_duplicate");
        }
    }

    /// A pulled chunk: maybe twice in a row, maybe held and handed over again after later chunks
    /// from the same node (each copy goes through the puller's one receive path; a copy it does
    /// not accept ends that pull, as a lost stream would).
    fn pulled(&self, address: &str, chunk: Chunk) -> Vec<Chunk> {
        if !self.0.enabled.load(Ordering::SeqCst) {
            return vec![chunk];
        }
        let rates = self.0.rates;
        let mut state = self.lock();
        let state = &mut *state;
        let held = state.held_chunks.entry(address.to_string()).or_default();
        for copy in held.iter_mut() {
            copy.later = copy.later.saturating_sub(1);
        }
        let (released, kept): (Vec<HeldChunk>, Vec<HeldChunk>) =
            held.drain(..).partition(|copy| copy.later == 0);
        *held = kept;
        if held.len() < HELD_MAX && state.rng.chance(rates.chunk_reorder) {
            let later = state.rng.range(1, rates.hold_max + 1);
            held.push(HeldChunk { later, chunk: chunk.clone() });
        }
        let twice = state.rng.chance(rates.chunk_duplicate);
        let mut chunks = vec![chunk.clone()];
        if twice {
            *state.counts.entry("chunk_duplicate").or_default() += 1;
            chunks.push(chunk);
        }
        for copy in released {
            *state.counts.entry("chunk_reorder").or_default() += 1;
            chunks.push(copy.chunk);
        }
        chunks
    }
}
