//! Scripted fault plans (`Faults::Script`): a fixed list of [`Step`]s the driver replays between
//! simulation steps, each resolved against the roles and the nodes' disks at run time. A swarm
//! draw reaches a history of several precise faults in a row (crash here, while that partition
//! holds, then restart these two in this order, then heal) only by luck; a script walks into it on
//! purpose, and checks on the way that it got there.
//!
//! Elections are still drawn from the seed, so a script never names a node: it names slots
//! ([`Slot`]) that steps bind when they happen (the leader the client sees, the node whose crash
//! point fired, the follower that received the lost batch), and later steps aim at them. Waiting
//! steps have a deadline ([`STEP_DEADLINE`]); a step that cannot happen, or a window check
//! ([`Step::ExpectStaleGapWindow`], [`Step::AwaitRestoredOffice`]) that finds the history
//! elsewhere, is a violation: a scripted run that silently missed its window would prove nothing.
//! Which seeds reach the window is recorded in `regressions.txt`.

use crate::check::{self, LogMap};
use crate::crashpoint::Op;
use crate::faults::Damage;
use crate::violation::Violation;
use crate::workload::Shared;
use crate::{host_name, Driver, RESTART_DELAY};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tidal_core::{ControlRecord, Records};
use tidal_wal::CrashMode;

/// A node named by a script; bound at run time by the step that first names it.
pub type Slot = usize;

/// Slots a script may use.
pub const SLOTS: usize = 6;

/// How long a waiting step may wait (simulated).
pub const STEP_DEADLINE: Duration = Duration::from_secs(15);

/// How long a process dead at its crash point lives on for [`Step::ShipThenCrash`] (simulated): a
/// hung fsync, not another election (a ship that comes later is not the lost write).
pub const LINGER_MAX: Duration = Duration::from_millis(250);

/// One step of a script.
#[derive(Clone, Copy, Debug)]
pub enum Step {
    /// Waits until the client sees a leader of a term above every term an earlier `AwaitLeader`
    /// saw, among the nodes of `among` (any node if empty); binds it to `bind`.
    AwaitLeader { bind: Slot, among: &'static [Slot] },
    /// Binds `slots`, in order, to the nodes no slot names yet (lowest index first).
    BindRest { slots: &'static [Slot] },
    /// Binds `bind` to the node of `among` that `not` does not name.
    BindOther { among: &'static [Slot], not: Slot, bind: Slot },
    /// Waits this many simulated ms.
    Sleep(u64),
    /// The client starts no write attempt until [`Step::ResumeWrites`] (one already sent runs on).
    PauseWrites,
    /// The client writes again.
    ResumeWrites,
    /// Waits until every node runs and every WAL ends at the same position.
    AwaitSameLog,
    /// The two nodes cannot reach each other.
    Partition(Slot, Slot),
    /// Undoes [`Step::Partition`].
    Repair(Slot, Slot),
    /// The node reaches no other node (the client still reaches it).
    CutOff(Slot),
    /// Undoes [`Step::CutOff`].
    Rejoin(Slot),
    /// Arms the crash point `op` (its next occurrence, unsynced bytes lost) on every node of
    /// `on`, and waits until one of them reaches it: binds that node to `died`, disarms the
    /// others, and pauses the client's writes. The node's disk is crashed at the point and every
    /// file operation fails from there; its process lives on until [`Step::ShipThenCrash`] or
    /// [`Step::CrashHost`].
    DieAt { op: Op, on: &'static [Slot], died: Slot },
    /// The process of `dead` (dead at its crash point, its fsync never returned) lives on, for at
    /// most [`LINGER_MAX`], until its ShipQueue has put what it wrote on some node of `to`, which
    /// then holds batches past `dead`'s WAL end (shipped on write; a LeaderStart among them must
    /// name `dead`); binds that node to `got`, records those batches as the lost write, and
    /// crashes `dead`'s host.
    ShipThenCrash { dead: Slot, to: &'static [Slot], got: Slot },
    /// Crashes the host of `dead` (dead at its crash point) now.
    CrashHost(Slot),
    /// Checks that `node`'s WAL ends with a LeaderStart it wrote itself (it led a new term) and
    /// that another node of `holders` holds that very batch; binds that node to `got` and records
    /// the batch as the lost write.
    ExpectOwnLeaderStart { node: Slot, holders: &'static [Slot], got: Slot },
    /// Cuts the stopped node's WAL inside its last batch (a disk that lost synced bytes, as the
    /// `disk` family's truncate-tail); checks that the lost write is gone from it.
    CutTail(Slot),
    /// Starts a crashed node (a supervisor restart, [`RESTART_DELAY`] from now).
    Start(Slot),
    /// Crashes the node (power loss of unsynced bytes) and restarts it [`RESTART_DELAY`] later;
    /// records its restart point (where its WAL ends, so where its ship tail restarts).
    Restart(Slot),
    /// As [`Step::Restart`], the restart this many simulated ms after the crash.
    RestartAfter(Slot, u64),
    /// Waits until every node of `nodes` holds, at the lost write's first seqno, a batch of a
    /// term above the lost write's (a new term's LeaderStart in its place).
    AwaitReplaced { nodes: &'static [Slot] },
    /// Finding 1's window: `stale`'s WAL ends with the lost write, which no node of `tails` holds,
    /// and every node of `tails` last restarted (its ship tail reset) exactly at the lost write's
    /// last seqno, so whichever leads has a tail whose front lines up with `stale`'s last position.
    ExpectStaleGapWindow { stale: Slot, tails: &'static [Slot] },
    /// Sends `writes` single-attempt item writes to `to`, `spacing_ms` apart ([`crate::workload::Burst`]); waits
    /// until every one was answered (or timed out).
    Burst { to: Slot, writes: u32, spacing_ms: u64 },
    /// Window check: `node`'s WAL holds at least `batches` batches past every other node's WAL
    /// end (written there, never committed: its applier holds them pending, unwoken).
    ExpectUncommitted { node: Slot, batches: usize },
    /// Finding 3's window: `node`, which lost the lost write (the LeaderStart of term T), probes in
    /// term T from a process started after it died (openraft restored its office of T).
    AwaitRestoredOffice { node: Slot },
    /// As [`Step::AwaitLeader`] (any node), but a violation when no such leader is known within
    /// `ms` simulated ms of the step's start.
    AwaitLeaderWithin { bind: Slot, ms: u64 },
    /// For this many simulated ms, no leader of a term above the last [`Step::AwaitLeader`]'s
    /// appears: nobody campaigned.
    ExpectTermHeld(u64),
    /// Window check, after the await of a new leader: the hand-over of a restored office went as
    /// decisions/068's third amendment says. In the term after the previous leader's, `released`
    /// campaigned (it gave up its lease); in the term after that `by` stood and `released` did not,
    /// unless the release campaign itself won.
    ExpectReleased { by: Slot, released: Slot },
    /// Window check, after the await of a new leader: `by` stood for election in the term `above`
    /// terms past the previous leader's.
    ExpectStood { by: Slot, above: u64 },
}

/// Finding 1 of issue 37 (`script-stale-gap`). Slots: 0 the leader L of term t1, 1 the follower F
/// that gets the write W, 2 the other follower G, 3 and 4 the leader and the follower of term t2,
/// 5 the leader when F rejoins.
pub const STALE_GAP: &[Step] = &[
    Step::AwaitLeader { bind: 0, among: &[] },
    Step::Sleep(500),
    Step::BindRest { slots: &[1, 2] },
    // L ships on write to F only.
    Step::Partition(0, 2),
    // W: written on L, shipped to F on write, lost on L (its fsync never returns).
    Step::DieAt { op: Op::BeforeSync, on: &[0], died: 0 },
    Step::ShipThenCrash { dead: 0, to: &[1], got: 1 },
    Step::CutOff(1),
    Step::Repair(0, 2),
    Step::Start(0),
    // t2 among L and G: its LeaderStart at W's seqno.
    Step::AwaitLeader { bind: 3, among: &[0, 2] },
    Step::AwaitReplaced { nodes: &[0, 2] },
    Step::BindOther { among: &[0, 2], not: 3, bind: 4 },
    // A rolling restart, the follower first: each ship tail restarts right after W's seqno.
    Step::Restart(4),
    Step::Sleep(1500),
    Step::Restart(3),
    Step::AwaitLeader { bind: 5, among: &[0, 2] },
    Step::ExpectStaleGapWindow { stale: 1, tails: &[0, 2] },
    Step::Rejoin(1),
    Step::Sleep(3000),
    Step::ResumeWrites,
];

/// Finding 3 of issue 37 (`script-resumed-term`). Slots: 0 the first leader L0, 1 and 2 the
/// others, 3 the leader L of the next term T, 4 the follower F that holds T's LeaderStart.
pub const RESUMED_TERM: &[Step] = &[
    Step::AwaitLeader { bind: 0, among: &[] },
    Step::Sleep(500),
    Step::PauseWrites,
    Step::AwaitSameLog,
    Step::BindRest { slots: &[1, 2] },
    // A new term T between the two others; its leader L dies as it is about to apply its
    // LeaderStart (durable on L, shipped to and acknowledged by F: committed).
    Step::CutOff(0),
    Step::DieAt { op: Op::Apply, on: &[1, 2], died: 3 },
    Step::CrashHost(3),
    Step::ExpectOwnLeaderStart { node: 3, holders: &[1, 2], got: 4 },
    // L's disk loses the LeaderStart; F is out of L's reach when it comes back.
    Step::CutTail(3),
    Step::CutOff(4),
    Step::Repair(0, 3),
    Step::Start(3),
    // openraft restores L's leadership of T; L probes L0 (a majority) and decides.
    Step::AwaitRestoredOffice { node: 3 },
    Step::Sleep(2000),
    Step::Rejoin(4),
    Step::Rejoin(0),
    Step::ResumeWrites,
];

/// The network-chaos soak's stall (seed 42; `script-isolated-leader`). Slots: 0 the leader L cut
/// off from the others, 1 and 2 the others, 3 the leader of the next term. L keeps taking writes it
/// can never commit, one WAL drain each, more than its applier's input holds (256 messages): none
/// of them wakes the applier, and before the fix the drain that found the input full waited for it
/// forever, so L's WAL writer stopped for good (its log never caught up after the heal).
pub const ISOLATED_LEADER: &[Step] = &[
    Step::AwaitLeader { bind: 0, among: &[] },
    Step::Sleep(500),
    Step::PauseWrites,
    Step::AwaitSameLog,
    Step::CutOff(0),
    Step::Burst { to: 0, writes: 320, spacing_ms: 5 },
    Step::ExpectUncommitted { node: 0, batches: 300 },
    Step::BindRest { slots: &[1, 2] },
    Step::AwaitLeader { bind: 3, among: &[1, 2] },
    Step::ResumeWrites,
    Step::Sleep(1500),
    Step::Rejoin(0),
    Step::Sleep(3000),
];

/// A follower cut from the leader for less than an election timeout (`script-short-partition`).
/// Slots: 0 the leader, 1 the follower, 2 the other. The partition drops what the leader's open
/// connections carried to the follower, so the connection its openraft heartbeats use hangs; before
/// the fix it stayed hung until HTTP/2's keepalive gave up (up to 5 s), the follower heard no
/// heartbeat, campaigned, and its higher term deposed the leader although ships reached it.
pub const SHORT_PARTITION: &[Step] = &[
    Step::AwaitLeader { bind: 0, among: &[] },
    Step::Sleep(500),
    Step::BindRest { slots: &[1, 2] },
    Step::Partition(0, 1),
    Step::Sleep(150),
    Step::Repair(0, 1),
    Step::ExpectTermHeld(4000),
];

/// A leader restarted at once, as a supervisor does (`script-restarted-leader`). Slots: 0 the
/// leader, 1 the next one. Its process restarts 300 ms after the crash, inside the lease the voters
/// granted its last heartbeat; openraft restores its leadership and the node refuses the term
/// (issue 37, finding 3). decisions/068: its startup appends stay home, it asks a voter to stand at
/// once, and the voter campaigns when that lease has run out. Before, the startup appends renewed
/// the lease from the restart: the next leader came 1352-1561 ms after the crash with the voters'
/// own timers, 1137-1143 ms with a hand-over after the renewed lease, 719-725 ms with the voter
/// waiting out the lease. Third amendment: the voters release the lease the restarted node holds,
/// and the next leader comes about 20 ms after that node starts (510-516 ms; fails above 600).
pub const RESTARTED_LEADER: &[Step] = &[
    Step::AwaitLeader { bind: 0, among: &[] },
    Step::Sleep(500),
    Step::Restart(0),
    Step::AwaitLeaderWithin { bind: 1, ms: 600 },
];

/// As [`RESTARTED_LEADER`], the process back 700 ms after the crash (`script-restarted-leader-late`:
/// a real node opens its engine before it starts openraft), when the voters' lease has already run
/// out: the voter asked to stand campaigns at once.
pub const RESTARTED_LEADER_LATE: &[Step] = &[
    Step::AwaitLeader { bind: 0, among: &[] },
    Step::Sleep(500),
    Step::RestartAfter(0, 700),
    Step::AwaitLeaderWithin { bind: 1, ms: 1000 },
];

/// A restarted leader whose openraft log is ahead of the only voter left
/// (`script-restarted-leader-ahead`, decisions/068's amendment). Slots: 0 the first leader B, 1
/// and 2 the others, 3 the leader A of the next term T, 4 the third node C. B is cut off while A
/// and C elect A, so A's LeaderStart of T reaches C's openraft log and never B's. C then goes down
/// (back 8 s later), and A restarts 300 ms after its crash with its office of T restored while B
/// rejoins. openraft refuses B its vote while B's log is shorter, and A, still openraft's leader of
/// T, never campaigns; only A's appends of T reaching B move it (B answers with its higher vote, A
/// steps down, its timer fires, B votes for it). With those calls kept home for good no leader came
/// within 6 s (seeds 1-4: A holds T until C is back); with the one-lease bound the client sees one
/// 2.1-4.5 s after the step begins (seeds 1-16, the election itself about 1.3 s).
pub const RESTARTED_LEADER_AHEAD: &[Step] = &[
    Step::AwaitLeader { bind: 0, among: &[] },
    Step::Sleep(500),
    Step::BindRest { slots: &[1, 2] },
    Step::CutOff(0),
    Step::AwaitLeader { bind: 3, among: &[1, 2] },
    Step::BindOther { among: &[1, 2], not: 3, bind: 4 },
    Step::Sleep(300),
    Step::RestartAfter(4, 8000),
    Step::RestartAfter(3, 300),
    Step::Rejoin(0),
    Step::AwaitLeaderWithin { bind: 5, ms: 6000 },
];

/// As [`RESTARTED_LEADER`], but the voter asked to stand missed the last heartbeats before the
/// crash (`script-restarted-leader-missed`). Slots: 0 the leader, 1 the voter it will ask (logs are
/// level, so the lowest id), 2 the other, 3 the next leader. For 120 ms before the crash the leader's
/// heartbeats reach only the other voter, so that voter's lease runs 120 ms longer than the asked
/// one's. Campaigning when its own lease ran out, the asked voter was refused by the other voter and
/// by the restarted node (openraft restores its vote with a fresh lease), and the voters' own timers
/// elected the next leader 1140-1561 ms after the crash (seeds 1-8). decisions/068, second
/// amendment: probe answers carry each voter's remaining lease and the request says how long the
/// candidate's majority needs (`campaign_not_before`): 719-725 ms, as without the missed heartbeats.
/// Third amendment: the other voter releases its lease and the asked one stands above it (510-516
/// ms, seeds 1-16; fails above 600); the window check sees that shape (or the release campaign
/// winning, granted by the asked voter whose own lease ran out first: seed 8).
pub const RESTARTED_LEADER_MISSED: &[Step] = &[
    Step::AwaitLeader { bind: 0, among: &[] },
    Step::Sleep(500),
    Step::PauseWrites,
    Step::AwaitSameLog,
    Step::BindRest { slots: &[1, 2] },
    Step::Partition(0, 1),
    Step::Sleep(120),
    Step::Restart(0),
    Step::Repair(0, 1),
    Step::ResumeWrites,
    Step::AwaitLeaderWithin { bind: 3, ms: 600 },
    Step::ExpectReleased { by: 1, released: 2 },
];

/// As [`RESTARTED_LEADER`], but the restarted node cannot reach one voter
/// (`script-restarted-leader-unreleased`). Slots: 0 the leader, 1 the voter it can reach, 2 the one
/// it cannot (cut from the crash until the next leader is seen), 3 the next leader. Nothing is
/// released: the unreachable voter answers no probe, so the restarted node knows no lease of its,
/// and asks the reachable voter to stand past the released after the longest lease it knows (its
/// own, restored with its vote). The voter releases its own lease at once (a campaign in T+1 the
/// cut-off voter refuses while its lease runs) and stands in T+2 after the wait, when the cut-off
/// voter's lease has long run out: 1137-1143 ms after the crash (seeds 1-16; fails above 1250). The
/// path where the target's second campaign waits, and checks that its term is still T+1 first: with
/// that check comparing against T instead, the campaign never came and the voters' own timers
/// elected 1349-1352 ms after the crash in seeds 1, 3 and 5.
pub const RESTARTED_LEADER_UNRELEASED: &[Step] = &[
    Step::AwaitLeader { bind: 0, among: &[] },
    Step::Sleep(500),
    Step::PauseWrites,
    Step::AwaitSameLog,
    Step::BindRest { slots: &[1, 2] },
    Step::Restart(0),
    Step::Partition(0, 2),
    Step::ResumeWrites,
    Step::AwaitLeaderWithin { bind: 3, ms: 1250 },
    Step::Repair(0, 2),
    Step::ExpectStood { by: 1, above: 2 },
];

/// A probe a node sent: the node's process (its start count) and the probe's term.
#[derive(Clone, Copy, Debug)]
struct Probed {
    start: u64,
    term: u64,
}

/// A control-plane tap that only watches (no copies): the office probes a node sends, stamped
/// with the node's process, so a script sees which process took office in which term.
#[derive(Clone)]
pub struct Observer {
    starts: Arc<AtomicU64>,
    probes: Arc<Mutex<Vec<Probed>>>,
    /// The terms of the vote requests the node sent (it stood for election in them).
    campaigns: Arc<Mutex<Vec<u64>>>,
}

impl Observer {
    /// A tap for the node whose process starts are counted in `starts`.
    pub fn new(starts: Arc<AtomicU64>) -> Observer {
        Observer { starts, probes: Arc::default(), campaigns: Arc::default() }
    }

    fn probes(&self) -> Vec<Probed> {
        self.probes.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    fn stood_in(&self, term: u64) -> bool {
        self.campaigns.lock().unwrap_or_else(std::sync::PoisonError::into_inner).contains(&term)
    }
}

/// The term of an openraft vote request (the candidate's vote names it); None for another call.
fn vote_term(call: &tidal_net::RaftCall) -> Option<u64> {
    if call.kind != "vote" {
        return None;
    }
    let request: serde_json::Value = serde_json::from_slice(&call.payload).ok()?;
    request["vote"]["leader_id"]["term"].as_u64()
}

impl tidal_net::ControlTap for Observer {
    fn raft_sent(&self, _untapped: &tidal_net::Peer, call: &tidal_net::RaftCall, _timeout: Duration) {
        if let Some(term) = vote_term(call) {
            self.campaigns.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(term);
        }
    }

    fn probed(&self, _untapped: &tidal_net::Peer, probe: &tidal_net::Probe, _timeout: Duration) {
        let start = self.starts.load(Ordering::SeqCst);
        self.probes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(Probed { start, term: probe.term.get() });
    }
}

/// The write a crash took from one node while another holds it: `(term, first, last)` seqnos.
#[derive(Clone, Copy, Debug)]
struct Lost {
    term: u64,
    first: u64,
    last: u64,
}

/// A script as it runs.
pub struct ScriptRun {
    name: &'static str,
    steps: &'static [Step],
    next: usize,
    /// When the current step started (simulated).
    started: Option<Duration>,
    /// Whether the current step did its first part (armed, ...).
    begun: bool,
    slots: [Option<usize>; SLOTS],
    term_seen: u64,
    /// The term seen before the last await of a leader bound its new one.
    term_before: u64,
    lost: Option<Lost>,
    /// Each node's last restart point `(term, seqno)` (where its WAL ended when it went down).
    restart_points: Vec<Option<(u64, u64)>>,
    /// Each node's process start count when it died at a crash point.
    died_in: Vec<Option<u64>>,
    seed: u64,
    /// Burst writes answered when the current [`Step::Burst`] began.
    burst_from: u64,
    /// The script ran to its end, or failed.
    pub done: bool,
}

/// A node's WAL as it is on its disk now.
fn wal(driver: &Driver<'_>, node: usize) -> LogMap {
    let mut ignored = Vec::new();
    let dir = driver.cluster.data_dirs[node].join("wal");
    check::read_wal(&driver.cluster.wal_io[node], &dir, node, &mut ignored)
}

/// A log's last position `(term, seqno)`, `(0, 0)` if empty.
fn last(log: &LogMap) -> (u64, u64) {
    log.values().next_back().map_or((0, 0), |(term, last, _)| (*term, *last))
}

/// The term of the batch of `log` that holds `seqno`.
fn term_at(log: &LogMap, seqno: u64) -> Option<u64> {
    log.range(..=seqno).next_back().filter(|(_, (_, last, _))| *last >= seqno).map(|(_, (term, _, _))| *term)
}

/// The LeaderStart record of the batch starting at `first` on `node`'s disk: `(term, leader id)`.
fn leader_start(driver: &Driver<'_>, node: usize, first: u64) -> Option<(u64, u64)> {
    let io = &driver.cluster.wal_io[node];
    let dir = driver.cluster.data_dirs[node].join("wal");
    for segment in check::segments(io, &dir) {
        let Ok(bytes) = io.file_bytes(&segment) else { continue };
        let mut offset = 0usize;
        while let Ok(batch) = tidal_wal::decode_batch(&bytes[offset..]) {
            offset += batch.encoded.len();
            if batch.header.first_seqno.get() != first {
                continue;
            }
            let (_, records) = tidal_core::record::decode_payload(batch.header.kind, batch.payload).ok()?;
            return match records {
                Records::Control(ControlRecord::LeaderStart { term, leader, .. }) => {
                    Some((term.get(), leader.0))
                }
                _ => None,
            };
        }
    }
    None
}

/// What a step did this tick.
enum Progress {
    Done,
    Wait(String),
    Fail(String),
}

impl ScriptRun {
    /// `steps` for a run of `seed` on `nodes` nodes.
    pub fn new(name: &'static str, steps: &'static [Step], nodes: usize, seed: u64) -> ScriptRun {
        ScriptRun {
            name,
            steps,
            next: 0,
            started: None,
            begun: false,
            slots: [None; SLOTS],
            term_seen: 0,
            term_before: 0,
            lost: None,
            restart_points: vec![None; nodes],
            died_in: vec![None; nodes],
            seed,
            burst_from: 0,
            done: steps.is_empty(),
        }
    }

    /// Runs every step that can run now; stops at one that waits.
    pub(crate) fn tick(
        &mut self,
        driver: &mut Driver<'_>,
        sim: &mut turmoil::Sim<'_>,
        shared: &Rc<RefCell<Shared>>,
        now: Duration,
        offset: Duration,
    ) {
        while !self.done {
            let Some(step) = self.steps.get(self.next).copied() else {
                self.done = true;
                driver.trace.push(format!("{} ms script {}: done", offset.as_millis(), self.name));
                return;
            };
            let started = *self.started.get_or_insert(now);
            let progress = self
                .try_step(step, driver, sim, shared, now, now - started, offset)
                .unwrap_or_else(Progress::Fail);
            match progress {
                Progress::Done => {
                    self.next += 1;
                    self.started = None;
                    self.begun = false;
                }
                Progress::Wait(what) => {
                    if now - started > STEP_DEADLINE {
                        let why = format!("not reached within {STEP_DEADLINE:?}: {what}");
                        self.fail(driver, sim, shared, step, (now, offset), why);
                    }
                    return;
                }
                Progress::Fail(why) => self.fail(driver, sim, shared, step, (now, offset), why),
            }
        }
    }

    fn fail(
        &mut self,
        driver: &mut Driver<'_>,
        sim: &mut turmoil::Sim<'_>,
        shared: &Rc<RefCell<Shared>>,
        step: Step,
        (now, offset): (Duration, Duration),
        why: String,
    ) {
        driver.violations.push(Violation::ScriptMissed {
            script: self.name.to_string(),
            step: self.next + 1,
            what: format!("{step:?}"),
            at_ms: crate::violation::millis(offset),
            why,
        });
        // Let the run end normally (heal, converge, check) after a missed window: no point stays
        // armed, a node dead at one is restarted, the client writes again.
        for node in 0..driver.nodes {
            let points = &driver.cluster.points[node];
            points.disarm();
            if points.is_dead() {
                driver.point_exit_ok = Some(node);
                if sim.is_host_running(host_name(node)) {
                    driver.crash_host(sim, node);
                }
                driver.cluster.points[node].revive();
                driver.bounces.push((now + RESTART_DELAY, node));
            }
        }
        shared.borrow_mut().writes_paused = false;
        self.done = true;
    }

    fn nodes(&self, slots: &[Slot]) -> Result<Vec<usize>, String> {
        slots.iter().map(|slot| self.node(*slot)).collect()
    }

    fn node(&self, slot: Slot) -> Result<usize, String> {
        self.slots.get(slot).copied().flatten().ok_or_else(|| format!("slot {slot} is not bound"))
    }

    fn bind(&mut self, driver: &mut Driver<'_>, slot: Slot, node: usize, offset: Duration, why: &str) {
        self.slots[slot] = Some(node);
        driver.trace.push(format!("{} ms script: slot {slot} = n{} ({why})", offset.as_millis(), node + 1));
    }

    #[allow(clippy::too_many_arguments)]
    fn try_step(
        &mut self,
        step: Step,
        driver: &mut Driver<'_>,
        sim: &mut turmoil::Sim<'_>,
        shared: &Rc<RefCell<Shared>>,
        now: Duration,
        waited: Duration,
        offset: Duration,
    ) -> Result<Progress, String> {
        let nodes = driver.nodes;
        let ms = offset.as_millis();
        Ok(match step {
            Step::AwaitLeader { bind, among } => {
                let allowed = self.nodes(among)?;
                self.await_leader(driver, shared, (bind, &allowed), None, waited, offset)
            }
            Step::AwaitLeaderWithin { bind, ms } => self.await_leader(
                driver,
                shared,
                (bind, &[]),
                Some(Duration::from_millis(ms)),
                waited,
                offset,
            ),
            Step::BindRest { slots } => {
                let bound: Vec<usize> = self.slots.iter().flatten().copied().collect();
                let free: Vec<usize> = (0..nodes).filter(|node| !bound.contains(node)).collect();
                if free.len() < slots.len() {
                    return Err(format!("{} nodes left for {} slots", free.len(), slots.len()));
                }
                for (slot, node) in slots.iter().zip(free) {
                    self.bind(driver, *slot, node, offset, "the rest");
                }
                Progress::Done
            }
            Step::BindOther { among, not, bind } => {
                let not = self.node(not)?;
                let other =
                    self.nodes(among)?.into_iter().find(|node| *node != not).ok_or("no other node")?;
                self.bind(driver, bind, other, offset, "the other one");
                Progress::Done
            }
            Step::Sleep(sleep) => {
                if waited >= Duration::from_millis(sleep) {
                    Progress::Done
                } else {
                    Progress::Wait("sleeping".into())
                }
            }
            Step::PauseWrites => {
                shared.borrow_mut().writes_paused = true;
                driver.trace.push(format!("{ms} ms script: writes paused"));
                Progress::Done
            }
            Step::ResumeWrites => {
                shared.borrow_mut().writes_paused = false;
                driver.trace.push(format!("{ms} ms script: writes resumed"));
                Progress::Done
            }
            Step::AwaitSameLog => {
                let running = (0..nodes).all(|node| sim.is_host_running(host_name(node)));
                let lasts: Vec<(u64, u64)> = (0..nodes).map(|node| last(&wal(driver, node))).collect();
                if running && lasts.windows(2).all(|pair| pair[0] == pair[1]) {
                    driver.trace.push(format!("{ms} ms script: every WAL ends at {:?}", lasts[0]));
                    Progress::Done
                } else {
                    Progress::Wait(format!("every WAL at one position (now {lasts:?})"))
                }
            }
            Step::Partition(a, b) => {
                let (a, b) = (self.node(a)?, self.node(b)?);
                sim.partition(host_name(a), host_name(b));
                driver.trace.push(format!("{ms} ms script: partition n{} n{}", a + 1, b + 1));
                Progress::Done
            }
            Step::Repair(a, b) => {
                let (a, b) = (self.node(a)?, self.node(b)?);
                sim.repair(host_name(a), host_name(b));
                driver.trace.push(format!("{ms} ms script: repair n{} n{}", a + 1, b + 1));
                Progress::Done
            }
            Step::CutOff(slot) => {
                let node = self.node(slot)?;
                for other in (0..nodes).filter(|other| *other != node) {
                    sim.partition(host_name(node), host_name(other));
                }
                driver.trace.push(format!("{ms} ms script: n{} cut off", node + 1));
                Progress::Done
            }
            Step::Rejoin(slot) => {
                let node = self.node(slot)?;
                for other in (0..nodes).filter(|other| *other != node) {
                    sim.repair(host_name(node), host_name(other));
                }
                driver.trace.push(format!("{ms} ms script: n{} rejoins", node + 1));
                Progress::Done
            }
            Step::DieAt { op, on, died } => {
                let on: Vec<usize> = self.nodes(on)?;
                if !self.begun {
                    self.begun = true;
                    for node in &on {
                        driver.cluster.points[*node].arm(op, 1, CrashMode::LoseUnsynced);
                    }
                    let names: Vec<String> = on.iter().map(|node| format!("n{}", node + 1)).collect();
                    driver.trace.push(format!("{ms} ms script: arm {op:?} on {}", names.join(",")));
                }
                let Some(node) = on.iter().copied().find(|node| driver.cluster.points[*node].is_dead())
                else {
                    return Ok(Progress::Wait(format!("{op:?} reached")));
                };
                for other in on.iter().filter(|other| **other != node) {
                    driver.cluster.points[*other].disarm();
                }
                shared.borrow_mut().writes_paused = true;
                self.died_in[node] = Some(driver.cluster.starts[node].load(Ordering::SeqCst));
                driver.point_exit_ok = Some(node);
                driver.counters.bump("crash_point");
                driver.trace.push(format!(
                    "{ms} ms script: n{} died at {}; writes paused",
                    node + 1,
                    driver.cluster.points[node].fired().unwrap_or_default()
                ));
                self.bind(driver, died, node, offset, "died at its crash point");
                Progress::Done
            }
            Step::ShipThenCrash { dead, to, got } => {
                let dead = self.node(dead)?;
                // Its process is still up (a hung fsync): an exit meanwhile is its death.
                driver.point_exit_ok = Some(dead);
                let dead_log = wal(driver, dead);
                let (_, end) = last(&dead_log);
                let to: Vec<usize> = self.nodes(to)?;
                let holder = to.iter().copied().filter(|node| *node != dead).find_map(|node| {
                    let log = wal(driver, node);
                    let first = log.range(end + 1..).next().map(|(first, (term, _, _))| (*first, *term))?;
                    Some((node, first, last(&log).1))
                });
                let Some((node, (first, term), upto)) = holder else {
                    let names: Vec<String> = to
                        .iter()
                        .filter(|node| **node != dead)
                        .map(|node| format!("n{}", node + 1))
                        .collect();
                    let what = format!("{} holding past n{}'s WAL end {end}", names.join(" or "), dead + 1);
                    if waited > LINGER_MAX {
                        return Err(format!("not reached within {LINGER_MAX:?}: {what}"));
                    }
                    return Ok(Progress::Wait(what));
                };
                if let Some((_, leader)) = leader_start(driver, node, first) {
                    if leader != dead as u64 + 1 {
                        return Err(format!(
                            "n{} holds the LeaderStart ({term}, {first}) of n{leader}, not a batch n{} wrote",
                            node + 1,
                            dead + 1
                        ));
                    }
                }
                if first != end + 1 {
                    return Err(format!("n{} holds {first}.. but n{} ends at {end}", node + 1, dead + 1));
                }
                self.lost = Some(Lost { term, first, last: upto });
                driver.crash_host(sim, dead);
                driver.cluster.points[dead].revive();
                driver.trace.push(format!(
                    "{ms} ms script: n{} holds {first}..={upto} of term {term}, which n{} lost; n{} crashed",
                    node + 1,
                    dead + 1,
                    dead + 1
                ));
                self.bind(driver, got, node, offset, "holds the lost write");
                Progress::Done
            }
            Step::CrashHost(slot) => {
                let node = self.node(slot)?;
                driver.point_exit_ok = Some(node);
                if sim.is_host_running(host_name(node)) {
                    driver.crash_host(sim, node);
                }
                driver.cluster.points[node].revive();
                driver.trace.push(format!("{ms} ms script: n{} crashed", node + 1));
                Progress::Done
            }
            Step::ExpectOwnLeaderStart { node: slot, holders, got } => {
                let node = self.node(slot)?;
                let log = wal(driver, node);
                let (term, end) = last(&log);
                let first = log.range(..=end).next_back().map_or(0, |(first, _)| *first);
                match leader_start(driver, node, first) {
                    Some((start_term, leader)) if start_term == term && leader == node as u64 + 1 => {}
                    other => {
                        return Err(format!(
                            "n{}'s WAL ends at ({term}, {end}), not with a LeaderStart of its own (found {other:?})",
                            node + 1
                        ))
                    }
                }
                let ours = log.get(&first).copied();
                let holder = self
                    .nodes(holders)?
                    .into_iter()
                    .filter(|other| *other != node)
                    .find(|other| wal(driver, *other).get(&first).copied() == ours);
                let Some(holder) = holder else {
                    return Err(format!("no node holds n{}'s LeaderStart at ({term}, {first})", node + 1));
                };
                self.lost = Some(Lost { term, first, last: end });
                driver.trace.push(format!(
                    "{ms} ms script: n{} wrote the LeaderStart ({term}, {first}); n{} holds it",
                    node + 1,
                    holder + 1
                ));
                self.bind(driver, got, holder, offset, "holds the LeaderStart");
                Progress::Done
            }
            Step::CutTail(slot) => {
                let node = self.node(slot)?;
                let lost = self.lost.ok_or("no lost write recorded")?;
                let io = &driver.cluster.wal_io[node];
                let dir = driver.cluster.data_dirs[node].join("wal");
                let pick = self.seed ^ 0x5c21_7e7a;
                let Some((_, _, what)) = check::damage(io, &dir, Damage::TruncateTail { pick }) else {
                    return Err(format!("n{} has no WAL to cut", node + 1));
                };
                let (term, end) = last(&wal(driver, node));
                if end >= lost.first {
                    return Err(format!(
                        "n{} still ends at ({term}, {end}) after the cut ({what})",
                        node + 1
                    ));
                }
                driver.counters.bump("truncate_tail");
                driver
                    .trace
                    .push(format!("{ms} ms script: n{}: {what}; its WAL ends at ({term}, {end})", node + 1));
                Progress::Done
            }
            Step::Start(slot) => {
                let node = self.node(slot)?;
                driver.bounces.push((now + RESTART_DELAY, node));
                driver.trace.push(format!("{ms} ms script: n{} starts", node + 1));
                Progress::Done
            }
            Step::Restart(slot) | Step::RestartAfter(slot, _) => {
                let node = self.node(slot)?;
                let delay = match step {
                    Step::RestartAfter(_, ms) => Duration::from_millis(ms),
                    _ => RESTART_DELAY,
                };
                driver.crash_and_restart_after(sim, node, CrashMode::LoseUnsynced, now + delay);
                let point = last(&wal(driver, node));
                self.restart_points[node] = Some(point);
                driver.trace.push(format!("{ms} ms script: n{} restarts at {point:?}", node + 1));
                Progress::Done
            }
            Step::AwaitReplaced { nodes: slots } => {
                let lost = self.lost.ok_or("no lost write recorded")?;
                let mut missing = Vec::new();
                for slot in slots {
                    let node = self.node(*slot)?;
                    match term_at(&wal(driver, node), lost.first) {
                        Some(term) if term > lost.term => {}
                        other => missing.push(format!("n{}: {other:?}", node + 1)),
                    }
                }
                if missing.is_empty() {
                    Progress::Done
                } else {
                    Progress::Wait(format!("a later term at seqno {}: {}", lost.first, missing.join(", ")))
                }
            }
            Step::ExpectStaleGapWindow { stale, tails } => {
                let lost = self.lost.ok_or("no lost write recorded")?;
                let stale = self.node(stale)?;
                let stale_last = last(&wal(driver, stale));
                if stale_last != (lost.term, lost.last) {
                    return Err(format!(
                        "n{} ends at {stale_last:?}, not with the lost write {lost:?}",
                        stale + 1
                    ));
                }
                for slot in tails {
                    let node = self.node(*slot)?;
                    let point = self.restart_points[node];
                    let held = term_at(&wal(driver, node), lost.last);
                    let aligned = point.is_some_and(|(term, seqno)| seqno == lost.last && term != lost.term);
                    if !aligned || held == Some(lost.term) {
                        return Err(format!(
                            "n{} restarted at {point:?} and holds term {held:?} at {}: its ship tail does not line up with n{}'s {stale_last:?}",
                            node + 1,
                            lost.last,
                            stale + 1
                        ));
                    }
                }
                window_seen(
                    driver,
                    offset,
                    format!(
                        "n{} ends at {stale_last:?}, which no leader holds; every leader's ship tail starts at seqno {}",
                        stale + 1,
                        lost.last + 1
                    ),
                );
                Progress::Done
            }
            Step::Burst { to, writes, spacing_ms } => {
                self.burst(driver, shared, (to, writes, spacing_ms), offset)?
            }
            Step::ExpectUncommitted { node, batches } => {
                self.expect_uncommitted(driver, node, batches, offset)?
            }
            Step::ExpectTermHeld(window_ms) => {
                self.expect_term_held(driver, shared, window_ms, waited, offset)?
            }
            Step::ExpectReleased { by, released } => self.expect_released(driver, by, released, offset)?,
            Step::ExpectStood { by, above } => {
                let term = self.term_before + above;
                if !self.stood(driver, by, term)? {
                    return Ok(Progress::Fail(format!("slot {by} did not stand in term {term}")));
                }
                window_seen(driver, offset, format!("slot {by} stood in term {term}"));
                Progress::Done
            }
            Step::AwaitRestoredOffice { node: slot } => {
                let node = self.node(slot)?;
                let lost = self.lost.ok_or("no lost write recorded")?;
                let died = self.died_in[node].ok_or("the node did not die at a crash point")?;
                let observer = driver.cluster.observers[node].as_ref().ok_or("no observer on the node")?;
                let restored =
                    observer.probes().iter().any(|probe| probe.start > died && probe.term == lost.term);
                if !restored {
                    return Ok(Progress::Wait(format!(
                        "n{} probing in term {} from a later process",
                        node + 1,
                        lost.term
                    )));
                }
                window_seen(
                    driver,
                    offset,
                    format!(
                        "n{} restarted and took office of term {} again (it probes in it), its LeaderStart lost",
                        node + 1,
                        lost.term
                    ),
                );
                Progress::Done
            }
        })
    }
}

impl ScriptRun {
    /// Whether the node in `slot` sent vote requests of `term` (stood for election in it).
    fn stood(&self, driver: &Driver<'_>, slot: Slot, term: u64) -> Result<bool, String> {
        let node = self.node(slot)?;
        let observer = driver.cluster.observers[node].as_ref().ok_or("no observer on the node")?;
        Ok(observer.stood_in(term))
    }

    /// [`Step::ExpectReleased`].
    fn expect_released(
        &mut self,
        driver: &mut Driver<'_>,
        by: Slot,
        released: Slot,
        offset: Duration,
    ) -> Result<Progress, String> {
        let (release, stand) = (self.term_before + 1, self.term_before + 2);
        let stood = |slot: Slot, term: u64| self.stood(driver, slot, term);
        let shape = (stood(released, release)?, stood(by, stand)?, stood(released, stand)?);
        // A release campaign may win: a voter whose own lease had run out grants it (here `by`,
        // which missed the last heartbeats). That ends the outage as well.
        let release_won = shape.0 && self.term_seen == release;
        if shape != (true, true, false) && !release_won {
            return Ok(Progress::Fail(format!(
                "not a release then a stand: slot {released} stood in term {release}: {}, slot {by} in term {stand}: {}, slot {released} in term {stand}: {}",
                shape.0, shape.1, shape.2
            )));
        }
        window_seen(
            driver,
            offset,
            format!("slot {released} released its lease in term {release}, slot {by} stood in term {stand}"),
        );
        Ok(Progress::Done)
    }

    /// [`Step::Burst`]: asks the client for it once, then waits for every answer.
    fn burst(
        &mut self,
        driver: &mut Driver<'_>,
        shared: &Rc<RefCell<Shared>>,
        (to, writes, spacing_ms): (Slot, u32, u64),
        offset: Duration,
    ) -> Result<Progress, String> {
        let node = self.node(to)?;
        let mut shared = shared.borrow_mut();
        if !self.begun {
            self.begun = true;
            self.burst_from = shared.burst_answered;
            let spacing = Duration::from_millis(spacing_ms);
            shared.burst = Some(crate::workload::Burst { node, writes, spacing });
            driver.trace.push(format!("{} ms script: {writes} writes to n{}", offset.as_millis(), node + 1));
        }
        let answered = shared.burst_answered - self.burst_from;
        Ok(if answered >= u64::from(writes) {
            Progress::Done
        } else {
            Progress::Wait(format!("{answered} of {writes} burst writes answered"))
        })
    }

    /// [`Step::AwaitLeader`] and [`Step::AwaitLeaderWithin`]: a leader above every term seen so far,
    /// among `allowed` (any node if empty), bound to `bind`; a failure once `within` has passed.
    fn await_leader(
        &mut self,
        driver: &mut Driver<'_>,
        shared: &Rc<RefCell<Shared>>,
        (bind, allowed): (Slot, &[usize]),
        within: Option<Duration>,
        waited: Duration,
        offset: Duration,
    ) -> Progress {
        let leader = shared.borrow().leader;
        match leader {
            Some((term, node))
                if term > self.term_seen && (allowed.is_empty() || allowed.contains(&node)) =>
            {
                self.term_before = std::mem::replace(&mut self.term_seen, term);
                let why = format!("leads term {term}, {} ms after the step began", waited.as_millis());
                self.bind(driver, bind, node, offset, &why);
                Progress::Done
            }
            _ if within.is_some_and(|within| waited > within) => Progress::Fail(format!(
                "no leader above term {} within {} ms (seen: {leader:?})",
                self.term_seen,
                within.unwrap_or_default().as_millis()
            )),
            _ => Progress::Wait(format!("a leader above term {} (seen: {leader:?})", self.term_seen)),
        }
    }

    /// [`Step::ExpectTermHeld`].
    fn expect_term_held(
        &mut self,
        driver: &mut Driver<'_>,
        shared: &Rc<RefCell<Shared>>,
        window_ms: u64,
        waited: Duration,
        offset: Duration,
    ) -> Result<Progress, String> {
        if let Some((term, node)) = shared.borrow().leader.filter(|(term, _)| *term > self.term_seen) {
            return Err(format!(
                "n{} leads term {term} after {} ms: a node campaigned against the leader of term {}",
                node + 1,
                waited.as_millis(),
                self.term_seen
            ));
        }
        if waited < Duration::from_millis(window_ms) {
            return Ok(Progress::Wait(format!("term {} held", self.term_seen)));
        }
        window_seen(driver, offset, format!("term {} held for {window_ms} ms", self.term_seen));
        Ok(Progress::Done)
    }

    /// [`Step::ExpectUncommitted`].
    fn expect_uncommitted(
        &mut self,
        driver: &mut Driver<'_>,
        slot: Slot,
        batches: usize,
        offset: Duration,
    ) -> Result<Progress, String> {
        let node = self.node(slot)?;
        let others_end =
            (0..driver.nodes).filter(|other| *other != node).map(|other| last(&wal(driver, other)).1).max();
        let log = wal(driver, node);
        let past = log.range(others_end.unwrap_or(0) + 1..).count();
        if past < batches {
            return Err(format!(
                "n{} holds {past} batches past the others' end {others_end:?}, not {batches}",
                node + 1
            ));
        }
        window_seen(
            driver,
            offset,
            format!("n{} holds {past} uncommitted batches, more than its applier's input", node + 1),
        );
        Ok(Progress::Done)
    }
}

/// A step found the window its case is about: counted, and traced at `offset`.
fn window_seen(driver: &mut Driver<'_>, offset: Duration, what: String) {
    driver.counters.bump("script_window");
    driver.trace.push(format!("{} ms script: window: {what}", offset.as_millis()));
}
