//! Faults drawn from the seed (swarm testing: each seed enables a random subset of the fault
//! classes with random rates), applied by the driver between simulation steps.
//!
//! Two ways to draw a plan:
//! - [`Plan::draw`]: the first four families (steady, network, crash, chaos). Its draw order is
//!   frozen: a seed of those families names the same plan as when it was recorded in
//!   `regressions.txt`.
//! - [`Plan::draw_swarm`]: the later families, from a list of [`Kind`]s (the first always on, the
//!   others on or off per seed). Faults may name a node by role ([`Who`]): the driver resolves it
//!   against the leader the client last observed when the window opens.

use crate::rng::Rng;
use std::collections::BTreeMap;
use std::time::Duration;
use tidal_wal::CrashMode;

/// One fault window: starts at `at`, undone after `length`.
#[derive(Clone, Debug)]
pub struct Window {
    /// Simulated time the fault starts.
    pub at: Duration,
    /// How long it lasts.
    pub length: Duration,
    /// What it is.
    pub fault: Fault,
}

/// A node, by index or by role when the window opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Who {
    /// Node `n{i+1}`.
    Node(usize),
    /// Whoever leads (the client's latest observation).
    Leader,
    /// The `k`-th (mod n-1) node that does not lead.
    Follower(usize),
}

impl Who {
    /// The node this names, given the observed leader.
    pub fn resolve(self, leader: usize, nodes: usize) -> usize {
        match self {
            Who::Node(node) => node,
            Who::Leader => leader,
            Who::Follower(k) => {
                let others: Vec<usize> = (0..nodes).filter(|node| *node != leader).collect();
                others[k % others.len().max(1)]
            }
        }
    }

    /// The node index of a resolved `Who`.
    pub fn node(self) -> usize {
        match self {
            Who::Node(node) => node,
            // Unresolved roles are resolved before use; n1 is a harmless fallback.
            Who::Leader | Who::Follower(_) => 0,
        }
    }
}

/// Damage done to a stopped node's WAL segment files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Damage {
    /// One bit of one complete batch's payload flips (`pick` chooses batch and bit). Recovery
    /// must refuse to start (the batch fails its hash).
    BitFlip {
        /// Chooses the batch and the bit.
        pick: u64,
    },
    /// A segment that is not the last is cut short (`pick` chooses segment and length). Recovery
    /// must refuse to start.
    TruncateSegment {
        /// Chooses the segment and the new length.
        pick: u64,
    },
    /// The last segment is cut inside its last batch (`pick` chooses where). Recovery sees a torn
    /// write and cuts the partial batch; if the engine had already applied that batch, the node
    /// must refuse to start (its WAL lost applied data), else it starts (repair). Either is fine;
    /// serving anyway is not.
    TruncateTail {
        /// Chooses the cut.
        pick: u64,
    },
}

impl Damage {
    /// Whether the node must refuse to start (else it may refuse or repair).
    pub fn must_refuse(self) -> bool {
        !matches!(self, Damage::TruncateTail { .. })
    }
}

/// A fault.
#[derive(Clone, Debug)]
pub enum Fault {
    /// Node `a` and node `b` cannot reach each other.
    Partition { a: usize, b: usize },
    /// Messages from `from` to `to` are dropped (the other direction works).
    OneWay { from: usize, to: usize },
    /// Messages between `a` and `b` are held (delivered late, in a burst, when released).
    Hold { a: usize, b: usize },
    /// Node `node` is isolated from every other host (a minority partition).
    Isolate { node: usize },
    /// Node `node`'s process crashes (its WAL's file system loses unsynced bytes, or tears them),
    /// and restarts after the window.
    Crash { node: usize, mode: CrashMode },
    /// A node crashes by role (leader-crash, follower-outage) and restarts after the window.
    CrashWho { who: Who, mode: CrashMode },
    /// Every node loses power at once (each WAL keeps only synced bytes, or tears the rest); all
    /// restart after the window. Quorum mode promises that no acknowledged write is lost.
    PowerLoss { mode: CrashMode },
    /// A split of the cluster in two: the leader's side (`side`, filled when the window opens) is
    /// a majority or a minority; no node on one side reaches one on the other. The client reaches all.
    Split { leader_majority: bool, side: Vec<usize> },
    /// A paused node: every link to and from it (the client's included) holds its messages; its
    /// process keeps running and its state. Released after the window (a burst of stale messages).
    Pause { who: Who },
    /// The next fsync on the node fails (`stuck`: every fsync fails for the window). The node must
    /// fail closed (its WAL poisons, nothing more is acked) and exit (a fatal fault, decisions/059);
    /// a supervisor restarts it after the window (power loss of its unsynced bytes: after a failed
    /// fsync nothing unsynced is trusted), unless the scenario has none (`Scenario::supervisor`).
    SyncFail { who: Who, stuck: bool },
    /// The next WAL write on the node fails; restarted after the window.
    WriteFail { who: Who },
    /// Every WAL write on the node fails for the window (no space left); restarted after it.
    DiskFull { who: Who },
    /// The node is stopped (power loss), its WAL damaged, and restarted at once: it must refuse to
    /// start or repair, never serve the damage. A refused node gets its bytes back (the operator
    /// restores the disk) and restarts after the window.
    Corrupt { who: Who, damage: Damage },
    /// The node's clock (the one its WAL stamps batches with) is off by `ms` for the window.
    ClockSkew { who: Who, ms: i64 },
    /// Every node's small-file writes in its data dir (`files.rs`) fail at `step` for the window;
    /// `who` (the leader) crashes and restarts at once, so a new leader writes its stream baseline.
    /// A supervisor restarts every node whose write failed at the window's end.
    FileFail { who: Who, step: tidal_cluster::files::FileStep },
}

impl Fault {
    /// The counter class this fault is counted under.
    pub fn class(&self) -> &'static str {
        match self {
            Fault::Partition { .. } => "partition",
            Fault::OneWay { .. } => "partition_oneway",
            Fault::Hold { .. } => "hold",
            Fault::Isolate { .. } => "isolate",
            Fault::Crash { mode: CrashMode::LoseUnsynced, .. } => "crash_lose_unsynced",
            Fault::Crash { mode: CrashMode::TornUnsynced { .. }, .. } => "crash_torn",
            Fault::CrashWho { who: Who::Leader, mode: CrashMode::LoseUnsynced } => "leader_crash_lose",
            Fault::CrashWho { who: Who::Leader, mode: CrashMode::TornUnsynced { .. } } => "leader_crash_torn",
            Fault::CrashWho { .. } => "follower_outage",
            Fault::PowerLoss { .. } => "power_loss",
            Fault::Split { leader_majority: true, .. } => "split_leader_majority",
            Fault::Split { leader_majority: false, .. } => "split_leader_minority",
            Fault::Pause { .. } => "pause",
            Fault::SyncFail { stuck: false, .. } => "fsync_fail",
            Fault::SyncFail { stuck: true, .. } => "fsync_fail_stuck",
            Fault::WriteFail { .. } => "write_fail",
            Fault::DiskFull { .. } => "disk_full",
            Fault::Corrupt { damage: Damage::BitFlip { .. }, .. } => "bitflip",
            Fault::Corrupt { damage: Damage::TruncateSegment { .. }, .. } => "truncate_segment",
            Fault::Corrupt { damage: Damage::TruncateTail { .. }, .. } => "truncate_tail",
            Fault::ClockSkew { .. } => "clock_skew",
            Fault::FileFail { step, .. } => match step {
                tidal_cluster::files::FileStep::Write => "file_write_fail_window",
                tidal_cluster::files::FileStep::Fsync => "file_fsync_fail_window",
                tidal_cluster::files::FileStep::Rename => "file_rename_fail_window",
                tidal_cluster::files::FileStep::SyncDir => "file_dirsync_fail_window",
            },
        }
    }

    /// The fault with every role resolved to a node, given the observed leader.
    pub fn resolve(&self, leader: usize, nodes: usize) -> Fault {
        let at = |who: Who| Who::Node(who.resolve(leader, nodes));
        match self.clone() {
            Fault::CrashWho { who, mode } => Fault::CrashWho { who: at(who), mode },
            Fault::Split { leader_majority, .. } => {
                // Minority: floor((n-1)/2) nodes; majority: floor(n/2)+1 (3 nodes: 1 and 2).
                let size = if leader_majority { nodes / 2 + 1 } else { (nodes - 1) / 2 };
                let mut side = vec![leader];
                side.extend((1..size.max(1)).map(|k| Who::Follower(k - 1).resolve(leader, nodes)));
                Fault::Split { leader_majority, side }
            }
            Fault::Pause { who } => Fault::Pause { who: at(who) },
            Fault::SyncFail { who, stuck } => Fault::SyncFail { who: at(who), stuck },
            Fault::WriteFail { who } => Fault::WriteFail { who: at(who) },
            Fault::DiskFull { who } => Fault::DiskFull { who: at(who) },
            Fault::Corrupt { who, damage } => Fault::Corrupt { who: at(who), damage },
            Fault::ClockSkew { who, ms } => Fault::ClockSkew { who: at(who), ms },
            Fault::FileFail { who, step } => Fault::FileFail { who: at(who), step },
            other => other,
        }
    }
}

/// The whole plan of one seed.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Largest one-way message latency (turmoil draws each message's latency below it).
    pub latency_max: Duration,
    /// Probability that a message breaks its link (TCP: the connection breaks).
    pub fail_rate: f64,
    /// Fault windows, in start order, never overlapping.
    pub windows: Vec<Window>,
}

/// Which classes a scenario of the first four families may draw from.
#[derive(Clone, Copy, Debug)]
pub struct Classes {
    /// Network faults (partitions, one-way, hold, isolate, latency, broken links).
    pub network: bool,
    /// Process crashes with WAL loss.
    pub crashes: bool,
}

/// A fault kind of the swarm draw ([`Plan::draw_swarm`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Crash the leader (lose or tear unsynced bytes), restart after the window.
    LeaderCrash,
    /// Every node loses power at once.
    PowerLoss,
    /// Split with the leader on the minority side.
    SplitLeaderMinority,
    /// Split with the leader on the majority side.
    SplitLeaderMajority,
    /// A paused node (leader or follower).
    Pause,
    /// One follower down for most of the load phase (one long window; nothing else is drawn).
    FollowerOutage,
    /// A random node crashes (lose or tear unsynced bytes).
    Crash,
    /// A symmetric partition of two random nodes.
    Partition,
    /// One failed fsync on a node (leader or follower).
    SyncFail,
    /// Every fsync fails for the window.
    SyncFailStuck,
    /// One failed write.
    WriteFail,
    /// Every write fails for the window.
    DiskFull,
    /// A bit flip in a stopped node's WAL.
    BitFlip,
    /// A non-last segment of a stopped node cut short.
    TruncateSegment,
    /// The last batch of a stopped follower cut short (drawn as the plan's LAST window only: it
    /// destroys synced data on one node, which quorum replication survives only while every other
    /// copy stays intact).
    TruncateTail,
    /// A node's clock off by up to a minute either way.
    ClockSkew,
    /// Every fsync of the leader's WAL fails for the window (its WAL poisons: a fatal fault).
    LeaderSyncFailStuck,
    /// Every WAL write of the leader fails for the window (no space left: a fatal fault).
    LeaderDiskFull,
}

/// How a swarm-drawn scenario's faults look.
#[derive(Clone, Copy, Debug)]
pub struct Swarm {
    /// The kinds: the first is always on, each other one on with probability one half.
    pub kinds: &'static [Kind],
    /// Shortest and longest window (ms).
    pub window_ms: (u64, u64),
    /// Shortest and longest gap between windows (ms).
    pub gap_ms: (u64, u64),
    /// Whether links get latency and a failure rate too.
    pub network_noise: bool,
}

impl Plan {
    /// Draws the plan of a seed for a load phase of `load` and `nodes` nodes (the first four
    /// families; the draw order is frozen, see the module docs).
    pub fn draw(rng: &mut Rng, classes: Classes, nodes: usize, load: Duration) -> Plan {
        if !classes.network && !classes.crashes {
            return Plan { latency_max: Duration::from_millis(1), fail_rate: 0.0, windows: Vec::new() };
        }
        // Swarm: every class on or off per seed, rates per seed.
        let mut enabled: Vec<&str> = Vec::new();
        for class in ["partition", "oneway", "hold", "isolate"] {
            if classes.network && rng.chance(0.5) {
                enabled.push(class);
            }
        }
        for class in ["crash_lose", "crash_torn"] {
            if classes.crashes && rng.chance(0.6) {
                enabled.push(class);
            }
        }
        if enabled.is_empty() {
            enabled.push(if classes.crashes { "crash_lose" } else { "partition" });
        }
        let latency_max =
            if classes.network { Duration::from_millis(rng.range(1, 40)) } else { Duration::from_millis(1) };
        let fail_rate =
            if classes.network && rng.chance(0.3) { rng.range(1, 20) as f64 / 10_000.0 } else { 0.0 };
        let load_ms = u64::try_from(load.as_millis()).unwrap_or(u64::MAX);
        let mut windows = Vec::new();
        let mut at = rng.range(300, 1200);
        while at + 200 < load_ms {
            let length = rng.range(200, 2500).min(load_ms - at);
            let class = enabled[usize::try_from(rng.range(0, enabled.len() as u64)).unwrap_or(0)];
            let node = |rng: &mut Rng| usize::try_from(rng.range(0, nodes as u64)).unwrap_or(0);
            let pair = |rng: &mut Rng| {
                let a = node(rng);
                let b = (a + 1 + usize::try_from(rng.range(0, nodes as u64 - 1)).unwrap_or(0)) % nodes;
                (a, b)
            };
            let fault = match class {
                "partition" => {
                    let (a, b) = pair(rng);
                    Fault::Partition { a, b }
                }
                "oneway" => {
                    let (from, to) = pair(rng);
                    Fault::OneWay { from, to }
                }
                "hold" => {
                    let (a, b) = pair(rng);
                    Fault::Hold { a, b }
                }
                "isolate" => Fault::Isolate { node: node(rng) },
                "crash_torn" => Fault::Crash {
                    node: node(rng),
                    mode: CrashMode::TornUnsynced { keep: rng.range(1, 200) as usize },
                },
                _ => Fault::Crash { node: node(rng), mode: CrashMode::LoseUnsynced },
            };
            windows.push(Window {
                at: Duration::from_millis(at),
                length: Duration::from_millis(length),
                fault,
            });
            at += length + rng.range(300, 1500);
        }
        Plan { latency_max, fail_rate, windows }
    }

    /// Draws the plan of a seed for the later families (see [`Swarm`]).
    pub fn draw_swarm(rng: &mut Rng, swarm: Swarm, nodes: usize, load: Duration) -> Plan {
        let mut enabled = Vec::new();
        for (index, kind) in swarm.kinds.iter().enumerate() {
            if index == 0 || rng.chance(0.5) {
                enabled.push(*kind);
            }
        }
        let (latency_max, fail_rate) = if swarm.network_noise {
            let latency = Duration::from_millis(rng.range(1, 30));
            let fail = if rng.chance(0.3) { rng.range(1, 10) as f64 / 10_000.0 } else { 0.0 };
            (latency, fail)
        } else {
            (Duration::from_millis(1), 0.0)
        };
        let load_ms = u64::try_from(load.as_millis()).unwrap_or(u64::MAX);
        let mut windows = Vec::new();
        if enabled.first() == Some(&Kind::FollowerOutage) {
            // One follower down from early in the load phase to near its end.
            let at = rng.range(load_ms / 20, load_ms / 8);
            let length = load_ms * 3 / 4;
            let who = Who::Follower(usize::try_from(rng.range(0, nodes as u64)).unwrap_or(0));
            let mode = crash_mode(rng);
            windows.push(Window {
                at: Duration::from_millis(at),
                length: Duration::from_millis(length),
                fault: Fault::CrashWho { who, mode },
            });
            return Plan { latency_max, fail_rate, windows };
        }
        let mut at = rng.range(300, 900);
        while at + swarm.window_ms.0 < load_ms {
            let length = rng.range(swarm.window_ms.0, swarm.window_ms.1).min(load_ms - at);
            let mut kind = enabled[usize::try_from(rng.range(0, enabled.len() as u64)).unwrap_or(0)];
            let last = at + length + swarm.gap_ms.1 + swarm.window_ms.0 >= load_ms;
            if kind == Kind::TruncateTail && !last {
                kind = enabled[0];
            }
            let fault = draw_fault(rng, kind, nodes);
            windows.push(Window {
                at: Duration::from_millis(at),
                length: Duration::from_millis(length),
                fault,
            });
            at += length + rng.range(swarm.gap_ms.0, swarm.gap_ms.1);
        }
        Plan { latency_max, fail_rate, windows }
    }
}

fn crash_mode(rng: &mut Rng) -> CrashMode {
    if rng.chance(0.5) {
        CrashMode::LoseUnsynced
    } else {
        CrashMode::TornUnsynced { keep: rng.range(1, 200) as usize }
    }
}

fn any_node(rng: &mut Rng, nodes: usize) -> Who {
    // The leader half the time (it is the node whose faults matter most), else a follower.
    if rng.chance(0.5) {
        Who::Leader
    } else {
        Who::Follower(usize::try_from(rng.range(0, nodes as u64)).unwrap_or(0))
    }
}

fn draw_fault(rng: &mut Rng, kind: Kind, nodes: usize) -> Fault {
    match kind {
        Kind::LeaderCrash => Fault::CrashWho { who: Who::Leader, mode: crash_mode(rng) },
        Kind::PowerLoss => Fault::PowerLoss { mode: crash_mode(rng) },
        Kind::SplitLeaderMinority => Fault::Split { leader_majority: false, side: Vec::new() },
        Kind::SplitLeaderMajority => Fault::Split { leader_majority: true, side: Vec::new() },
        Kind::Pause => Fault::Pause { who: any_node(rng, nodes) },
        Kind::FollowerOutage => Fault::CrashWho { who: Who::Follower(0), mode: crash_mode(rng) },
        Kind::Crash => Fault::Crash {
            node: usize::try_from(rng.range(0, nodes as u64)).unwrap_or(0),
            mode: crash_mode(rng),
        },
        Kind::Partition => {
            let a = usize::try_from(rng.range(0, nodes as u64)).unwrap_or(0);
            let b = (a + 1 + usize::try_from(rng.range(0, nodes as u64 - 1)).unwrap_or(0)) % nodes;
            Fault::Partition { a, b }
        }
        Kind::SyncFail => Fault::SyncFail { who: any_node(rng, nodes), stuck: false },
        Kind::SyncFailStuck => Fault::SyncFail { who: any_node(rng, nodes), stuck: true },
        Kind::WriteFail => Fault::WriteFail { who: any_node(rng, nodes) },
        Kind::DiskFull => Fault::DiskFull { who: any_node(rng, nodes) },
        Kind::BitFlip => {
            Fault::Corrupt { who: any_node(rng, nodes), damage: Damage::BitFlip { pick: rng.next_u64() } }
        }
        Kind::TruncateSegment => Fault::Corrupt {
            who: any_node(rng, nodes),
            damage: Damage::TruncateSegment { pick: rng.next_u64() },
        },
        Kind::TruncateTail => Fault::Corrupt {
            who: Who::Follower(usize::try_from(rng.range(0, nodes as u64)).unwrap_or(0)),
            damage: Damage::TruncateTail { pick: rng.next_u64() },
        },
        Kind::ClockSkew => {
            let ms = i64::try_from(rng.range(1_000, 60_000)).unwrap_or(1_000);
            Fault::ClockSkew { who: any_node(rng, nodes), ms: if rng.chance(0.5) { ms } else { -ms } }
        }
        Kind::LeaderSyncFailStuck => Fault::SyncFail { who: Who::Leader, stuck: true },
        Kind::LeaderDiskFull => Fault::DiskFull { who: Who::Leader },
    }
}

/// How many faults of each class were injected.
#[derive(Clone, Debug, Default)]
pub struct Counters(pub BTreeMap<&'static str, u64>);

impl Counters {
    /// Counts one fault of `class`.
    pub fn bump(&mut self, class: &'static str) {
        *self.0.entry(class).or_default() += 1;
    }

    /// Adds another run's counts.
    pub fn add(&mut self, other: &Counters) {
        for (class, count) in &other.0 {
            *self.0.entry(class).or_default() += count;
        }
    }
}

impl std::fmt::Display for Counters {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write_counts(formatter, self.0.iter())
    }
}

/// Writes counts by class as `class=count class=count`, or `none`: a run's [`Counters`], or a
/// sweep's sums of them.
pub fn write_counts<K: std::fmt::Display, C: std::fmt::Display>(
    formatter: &mut std::fmt::Formatter<'_>,
    counts: impl ExactSizeIterator<Item = (K, C)>,
) -> std::fmt::Result {
    if counts.len() == 0 {
        return formatter.write_str("none");
    }
    let parts: Vec<String> = counts.map(|(class, count)| format!("{class}={count}")).collect();
    formatter.write_str(&parts.join(" "))
}
