//! Tidal's simulation harness (issue 5, first slice): a [`SimulatedCluster`] of real nodes
//! (`tidal_server::run_on`: HTTP, tonic replication, openraft, the WAL, fjall) as turmoil hosts,
//! a workload client host, seeded faults (swarm: classes and rates drawn per seed), and invariant
//! checks at the end of every run. Everything a run does follows from `(seed, scenario)`, up to the
//! nondeterminism of the node's real threads (docs/decisions/008-simulation.md).
//!
//! - `net`: the transport seams over turmoil TCP; `http`: a small HTTP/1 client over it.
//! - `faults`: the seeded fault plan and its counters; `workload`: the client host.
//! - `check`: WAL checks over each node's simulated file system.
//! - `violation`: what a failed check reports ([`violation::Violation`], one variant per check).
//! - `activity`: the turn scheduler the nodes' own threads run under (decisions/051, 052).

pub mod activity;
pub mod check;
pub mod crashpoint;
pub mod faults;
pub mod files;
pub mod history;
pub mod http;
pub mod inbox;
pub mod net;
pub mod redeliver;
pub mod regressions;
pub mod rng;
pub mod script;
pub mod violation;
pub mod workload;

use faults::{Classes, Counters, Fault, Kind, Plan, Swarm};
use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tidal_cluster::files::FileStep;
use tidal_cluster::{ClusterSpec, ControlTiming, Durability, NodeSpec};
use tidal_server::config::{ClusterMembership, NodeIo, ServeArgs, ServeConfig};
use tidal_types::NodeId;
use tidal_wal::{CrashMode, SimIo};
use violation::{Node, Violation};
use workload::{Phase, Shared, Workload};

/// Logged time of the simulation's epoch (2025-01-01T00:00:00Z), so the fold sees fixed times.
const EPOCH_MS: u64 = 1_735_689_600_000;

/// Where a scenario's faults come from.
#[derive(Clone, Copy, Debug)]
pub enum Faults {
    /// The first four families' draw (frozen: their recorded seeds replay the same plan).
    Classes(Classes),
    /// The later families' swarm draw.
    Swarm(Swarm),
    /// A fixed script of steps resolved against roles at run time (`script.rs`): the same faults
    /// for every seed, only the elections (and so the nodes the steps land on) differ.
    Script(&'static [script::Step]),
}

/// A scenario: cluster shape, workload and which fault classes the seed may draw.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Name (printed with the seed).
    pub name: &'static str,
    /// Cluster size.
    pub nodes: usize,
    /// Durability mode.
    pub durability: Durability,
    /// How long the load phase lasts (simulated).
    pub load: Duration,
    /// Most writes.
    pub writes_max: u64,
    /// Concurrent writers.
    pub writers: usize,
    /// Fault classes.
    pub faults: Faults,
    /// WAL segment size limit (the `segment_bytes_max` knob of `ServeConfig`).
    pub segment_bytes_max: u64,
    /// Bytes of padding in every item's metadata (bigger batches: more rotation).
    pub item_pad: usize,
    /// Batches each node's ship tail holds (the `ship_tail_batches_max` knob of `ServeConfig`): a
    /// follower further behind than this cannot be shipped to from the tail and must pull, as one
    /// back from a long outage must in production.
    pub ship_tail_batches: usize,
    /// How long after the heal every node must have converged (simulated).
    pub converge_deadline: Duration,
    /// The heal must go through the log only: no node may install a snapshot (the one path that
    /// carries item data outside the log), counted from each node's last start.
    pub heal_via_log: bool,
    /// The run must rotate at least this many WAL segments in all (counted on each node's disk at
    /// the end), so the scenario did what it is for.
    pub rotations_min: u64,
    /// Whether the nodes' processes start at different simulated times (0-150 ms, from the seed).
    pub stagger_starts: bool,
    /// A crash point to arm (the crash-point sweep), `arm_after` the first write.
    pub crash_point: Option<crashpoint::CrashPoint>,
    /// When the crash point is armed, from the first write.
    pub arm_after: Duration,
    /// Register keys read and overwritten for the linearizability check (0: none).
    pub registers: u64,
    /// How long a node killed at its crash point stays down (longer than an election timeout: a
    /// killed leader comes back as a follower of a new term; shorter: it may resume its own term).
    pub point_downtime: Duration,
    /// Once the crash point fired, the node's WAL renames fail (`wal.meta`, written
    /// write-then-rename when a divergent suffix goes to quarantine) until the heal, when a
    /// supervisor restarts it: the node must fail closed meanwhile and heal afterwards.
    pub rename_errors: bool,
    /// Whether every other item also gets an embedding (non-empty feeds for invariant 5).
    pub embeddings: bool,
    /// Whether a quarter of the writes are txs (`POST /v1/tx`: an item and an event about it, two
    /// seqnos in one batch), checked for the stream's invariants and the tx's atomicity.
    pub txs: bool,
    /// Whether the seed may turn on duplicated and reordered delivery of ships (`redeliver.rs`;
    /// classes and rates drawn per seed from a stream of their own).
    pub redelivery: bool,
    /// Whether the seed may fail writes, fsyncs and renames of the data dir's small files
    /// (`files.rs`; drawn per seed from a stream of its own).
    pub file_faults: bool,
    /// Whether a supervisor restarts a node whose WAL failed (at the fault window's end). Without
    /// one the node must leave office and exit by itself (decisions/059), another node must
    /// acknowledge writes within [`FAILOVER_BOUND`], and the operator restarts it at the heal.
    pub supervisor: bool,
}

/// How soon after a leader's WAL fails (the fault applied) another node must acknowledge a write
/// when no supervisor restarts it (simulated time; decisions/059).
pub const FAILOVER_BOUND: Duration = Duration::from_secs(5);

const fn swarm(kinds: &'static [Kind], window_ms: (u64, u64), network_noise: bool) -> Faults {
    Faults::Swarm(Swarm { kinds, window_ms, gap_ms: (400, 1500), network_noise })
}

impl Scenario {
    /// The scenarios, by name.
    pub fn all() -> Vec<Scenario> {
        let base = Scenario {
            name: "steady",
            nodes: 3,
            durability: Durability::Quorum,
            load: Duration::from_secs(4),
            writes_max: 150,
            writers: 2,
            faults: Faults::Classes(Classes { network: false, crashes: false }),
            segment_bytes_max: 16 * 1024,
            item_pad: 0,
            ship_tail_batches: tidal_cluster::ship_feed::TAIL_BATCHES_MAX_DEFAULT,
            converge_deadline: workload::CONVERGE_DEADLINE,
            heal_via_log: false,
            rotations_min: 0,
            stagger_starts: true,
            crash_point: None,
            arm_after: Duration::from_millis(1000),
            registers: 0,
            point_downtime: Duration::from_millis(1500),
            rename_errors: false,
            embeddings: false,
            txs: true,
            redelivery: false,
            file_faults: false,
            supervisor: true,
        };
        // A scripted history (`script.rs`): one writer, so that a lost write is one batch, and no
        // transactions, so that a window counts one seqno per write.
        let scripted = |name, steps, load_secs| Scenario {
            name,
            faults: Faults::Script(steps),
            load: Duration::from_secs(load_secs),
            writes_max: 90,
            writers: 1,
            txs: false,
            ..base.clone()
        };
        vec![
            base.clone(),
            Scenario {
                name: "network",
                faults: Faults::Classes(Classes { network: true, crashes: false }),
                load: Duration::from_secs(8),
                redelivery: true,
                ..base.clone()
            },
            Scenario {
                name: "crash",
                faults: Faults::Classes(Classes { network: false, crashes: true }),
                load: Duration::from_secs(8),
                ..base.clone()
            },
            Scenario {
                name: "chaos",
                faults: Faults::Classes(Classes { network: true, crashes: true }),
                load: Duration::from_secs(10),
                redelivery: true,
                ..base.clone()
            },
            // The leader crashes (unsynced bytes lost or torn) and restarts, again and again; a new
            // one must be promoted each time and no acknowledged write may be lost. Some seeds also
            // cut every node's power at once.
            Scenario {
                name: "leader-crash",
                faults: swarm(&[Kind::LeaderCrash, Kind::PowerLoss], (300, 2000), false),
                load: Duration::from_secs(6),
                writes_max: 120,
                redelivery: true,
                ..base.clone()
            },
            // The leader on the minority side, then on the majority side of a split, and paused
            // nodes; after the heal every node converges to one digest within 30 simulated seconds,
            // through the log (no snapshot installs).
            Scenario {
                name: "partition-heal",
                faults: swarm(
                    &[Kind::SplitLeaderMinority, Kind::SplitLeaderMajority, Kind::Pause],
                    (400, 2500),
                    true,
                ),
                load: Duration::from_secs(6),
                writes_max: 120,
                converge_deadline: Duration::from_secs(30),
                heal_via_log: true,
                redelivery: true,
                ..base.clone()
            },
            // One follower down for three quarters of the load phase while the others take many
            // writes; back before the heal, it catches up through StreamSegments (no snapshot):
            // the leader's tail holds 16 batches, far fewer than it missed, so no ship from the
            // tail can bring it back, as after a long outage; its boot-time pull or the pull the
            // leader's queue nudges (when it finds the follower behind the tail) must.
            Scenario {
                name: "follower-outage",
                faults: swarm(&[Kind::FollowerOutage], (0, 0), false),
                load: Duration::from_secs(6),
                writes_max: 300,
                writers: 3,
                ship_tail_batches: 16,
                converge_deadline: Duration::from_secs(30),
                heal_via_log: true,
                ..base.clone()
            },
            // Register keys: every writer also reads (`consistency=linearizable`) or overwrites one
            // of four items at the node it believes leads, so reads and overwrites race; the leader
            // on the minority side of a split (the client still reaches it: a deposed leader keeps
            // getting requests), paused nodes, leader crashes; the per-key histories must be
            // linearizable (history.rs).
            Scenario {
                name: "register",
                faults: swarm(
                    &[Kind::SplitLeaderMinority, Kind::Pause, Kind::LeaderCrash],
                    (400, 2500),
                    true,
                ),
                load: Duration::from_secs(8),
                writes_max: 90,
                writers: 3,
                registers: 4,
                embeddings: true,
                redelivery: true,
                ..base.clone()
            },
            // 4 KiB segments and padded items: segments rotate many times under load, with crashes
            // (torn tails across rotations) and partitions.
            Scenario {
                name: "rotation",
                faults: swarm(&[Kind::Crash, Kind::Partition], (300, 1500), false),
                load: Duration::from_secs(5),
                writes_max: 150,
                segment_bytes_max: 4096,
                item_pad: 300,
                rotations_min: 6,
                ..base.clone()
            },
            // Scripted histories (`script.rs`): findings 1 and 3 of issue 37, one crash, partition,
            // restart and heal after another, aimed at the roles as they turn out; one writer, so
            // that a lost write is one batch. Each run checks that it reached its window.
            Scenario { writes_max: 120, ..scripted("script-stale-gap", script::STALE_GAP, 16) },
            scripted("script-resumed-term", script::RESUMED_TERM, 12),
            scripted("script-isolated-leader", script::ISOLATED_LEADER, 12),
            scripted("script-restarted-leader", script::RESTARTED_LEADER, 6),
            scripted("script-restarted-leader-late", script::RESTARTED_LEADER_LATE, 6),
            // Its third node stays down 8 s: the step's 6 s window ends before it is back.
            scripted("script-restarted-leader-ahead", script::RESTARTED_LEADER_AHEAD, 12),
            scripted("script-restarted-leader-missed", script::RESTARTED_LEADER_MISSED, 6),
            scripted("script-restarted-leader-unreleased", script::RESTARTED_LEADER_UNRELEASED, 6),
            scripted("script-short-partition", script::SHORT_PARTITION, 8),
            // Disk faults through SimIo: failed fsyncs (once, or stuck) and writes, a full disk (the
            // node must fail closed; a supervisor restarts it), bit flips and cut segments on a stopped
            // node (it must refuse to start), a cut tail (it must repair), clock skew.
            Scenario {
                name: "disk",
                faults: swarm(
                    &[
                        Kind::SyncFail,
                        Kind::SyncFailStuck,
                        Kind::WriteFail,
                        Kind::DiskFull,
                        Kind::BitFlip,
                        Kind::TruncateSegment,
                        Kind::TruncateTail,
                        Kind::ClockSkew,
                    ],
                    (400, 1500),
                    false,
                ),
                load: Duration::from_secs(6),
                writes_max: 120,
                segment_bytes_max: 4096,
                item_pad: 100,
                file_faults: true,
                ..base.clone()
            },
            // The leader's WAL fails for good (every fsync, or every write: a full disk) and no
            // supervisor restarts it: it must leave office and exit by itself, and another node
            // must acknowledge writes within FAILOVER_BOUND (decisions/059). One fault window;
            // the operator restarts the node at the heal.
            Scenario {
                name: "fatal-handover",
                faults: Faults::Swarm(Swarm {
                    kinds: &[Kind::LeaderSyncFailStuck, Kind::LeaderDiskFull],
                    window_ms: (1500, 2500),
                    gap_ms: (60_000, 60_000),
                    network_noise: false,
                }),
                load: Duration::from_secs(5),
                writes_max: 150,
                supervisor: false,
                ..base
            },
        ]
    }

    /// A scenario by name.
    pub fn named(name: &str) -> Option<Scenario> {
        Scenario::all().into_iter().find(|scenario| scenario.name == name)
    }

    /// The crash-point sweep's fixed scenario, without its point: no random faults, 4 KiB
    /// segments and padded items (rotations every few writes), two writers; the point is armed one
    /// second after the first write.
    pub fn crash_points() -> Scenario {
        Scenario {
            name: "crash-point",
            load: Duration::from_secs(4),
            writes_max: 120,
            segment_bytes_max: 4096,
            item_pad: 200,
            embeddings: true,
            ..Scenario::all().swap_remove(0)
        }
    }

    /// The names of every scenario.
    pub fn names() -> Vec<&'static str> {
        Scenario::all().iter().map(|scenario| scenario.name).collect()
    }
}

/// The result of one seeded run.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The seed.
    pub seed: u64,
    /// The scenario's name.
    pub scenario: &'static str,
    /// Invariant violations (empty: the run passed).
    pub violations: Vec<Violation>,
    /// Faults injected, by class.
    pub counters: Counters,
    /// Hash of the run's trace (faults applied, acknowledgements, final digest).
    pub trace_hash: String,
    /// Hash of the fault plan drawn from the seed (the part of a run the seed alone fixes).
    pub plan_hash: String,
    /// Hashes of the trace's parts, to see which of them replay (`make sim-determinism`): `plan`,
    /// `faults` (as applied, with their offsets), `acked` (the set of acknowledged ids), `acks`
    /// (every acknowledgement in order, with its seqno and node), `final` (the converged digest).
    pub trace_parts: Vec<(&'static str, String)>,
    /// Write outcomes.
    pub stats: workload::WriteStats,
    /// Simulated time of the run.
    pub simulated: Duration,
    /// Simulated ms from heal to convergence.
    pub converged_after_ms: Option<u64>,
    /// Seqno every node converged to.
    pub final_seqno: Option<u64>,
    /// Batches compared across nodes by the log-matching check.
    pub batches_compared: u64,
    /// Terms in which a leader was observed.
    pub terms: usize,
    /// The faults as the driver applied them (with their offsets), for a failure report.
    pub story: Vec<String>,
    /// The crash point, if one was armed and reached (what and where).
    pub crash_point_fired: Option<String>,
    /// Acknowledged writes lost (distinct ids named by invariant 1 violations).
    pub lost: u64,
    /// Without a supervisor (`Scenario::supervisor`): simulated ms from the leader's WAL fault to
    /// the first write another node acknowledged, and to the client's first status poll that saw
    /// another node lead.
    pub failover_ms: Option<(u64, Option<u64>)>,
}

impl Outcome {
    /// Whether no invariant broke.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// One summary line.
    pub fn summary(&self) -> String {
        format!(
            "seed {} scenario {}: {} | acked {} unknown {} attempts {} | final seqno {} converged after {} ms | terms {} | faults {} | sim {:.1}s | trace {}",
            self.seed,
            self.scenario,
            if self.passed() { "ok".to_string() } else { format!("FAIL ({} violations)", self.violations.len()) },
            self.stats.acked,
            self.stats.unknown,
            self.stats.attempts,
            self.final_seqno.map_or("-".into(), |s| s.to_string()),
            self.converged_after_ms.map_or("-".into(), |ms| ms.to_string()),
            self.terms,
            self.counters,
            self.simulated.as_secs_f64(),
            self.trace_hash,
        ) + &self.failover_ms.map_or(String::new(), |(acked, led)| {
            let led = led.map_or("-".to_string(), |ms| ms.to_string());
            format!(" | failover: acked by another node after {acked} ms (a new leader seen after {led} ms)")
        })
    }
}

/// A clock the WAL writer thread reads: the simulation's elapsed time since [`EPOCH_MS`], set by
/// the driver before every step (shared by every node), plus this node's skew (`clock_skew`).
#[derive(Clone, Default)]
pub struct SimClock {
    /// Simulated ms since the epoch (shared).
    pub elapsed: Arc<AtomicU64>,
    /// This node's skew in ms.
    pub skew: Arc<AtomicI64>,
}

impl tidal_wal::Clock for SimClock {
    fn now_ms(&self) -> u64 {
        let now = EPOCH_MS + self.elapsed.load(Ordering::SeqCst);
        now.saturating_add_signed(self.skew.load(Ordering::SeqCst))
    }
}

/// Where the nodes' fjall directories go: `TIDAL_SIM_DIR`, else `/dev/shm` when it exists, else
/// the system temp dir. fjall's fsyncs (openraft's vote, the engine) are real and block the node
/// while simulated time runs on: on a real disk of a busy machine one fsync can cost seconds of
/// simulated time, enough to starve elections (docs/decisions/008-simulation.md); on tmpfs it costs
/// microseconds.
fn state_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("TIDAL_SIM_DIR") {
        return PathBuf::from(dir);
    }
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() {
        return shm;
    }
    std::env::temp_dir()
}

/// N real nodes as turmoil hosts `n1..nN`: each with its data dir (fjall) in a temp dir and its
/// WAL on its own [`SimIo`].
pub struct SimulatedCluster {
    /// The cluster spec every node shares.
    pub spec: ClusterSpec,
    /// Each node's WAL file system (survives the node's crashes, as a disk does).
    pub wal_io: Vec<SimIo>,
    /// The node's view of it: crash points and rename errors over `wal_io`.
    pub points: Vec<crashpoint::CrashPointIo>,
    /// Each node's data dir.
    pub data_dirs: Vec<PathBuf>,
    /// Each node's WAL clock (one shared elapsed time, a skew each).
    pub clocks: Vec<SimClock>,
    /// Host exits: `(node, error)` of every node whose `run_on` returned an error, in order.
    pub exits: Rc<RefCell<Vec<(usize, String)>>>,
    /// Each node's WAL segment size limit.
    pub segment_bytes_max: u64,
    /// Each node's ship tail bound in batches.
    pub ship_tail_batches: usize,
    /// How long each node's process takes to start (drawn from the seed; see [`SimulatedCluster::register`]).
    pub start_delays: Vec<Duration>,
    /// Each node's ship tap (duplicated and reordered delivery), when the run has one.
    pub redelivery: Vec<Option<redeliver::Redelivery>>,
    /// Each node's watching control tap (scripted runs, `script.rs`).
    pub observers: Vec<Option<script::Observer>>,
    /// Each node's injector for its data dir's small files (registered only by runs that draw
    /// file faults, see [`SimulatedCluster::register_file_faults`]).
    pub files: Vec<files::DataDirFaults>,
    /// How many times each node's process started (bumped as its host starts `run_on`).
    pub starts: Vec<Arc<AtomicU64>>,
    /// Per node: the receiver of its running instance's close watch (`NodeIo::close_watch`).
    closing: Vec<Arc<std::sync::Mutex<Option<std::sync::mpsc::Receiver<()>>>>>,
    _root: tempfile::TempDir,
}

impl Drop for SimulatedCluster {
    fn drop(&mut self) {
        for dir in &self.data_dirs {
            tidal_cluster::files::register_faults(dir, None);
        }
    }
}

impl SimulatedCluster {
    /// A cluster of `nodes` in `durability` mode (not started).
    pub fn new(nodes: usize, durability: Durability) -> anyhow::Result<SimulatedCluster> {
        let root = tempfile::Builder::new().prefix("tidal-sim-").tempdir_in(state_root())?;
        let spec = ClusterSpec {
            cluster_id: "sim".into(),
            secret: "simulation-secret-0123456789".into(),
            durability,
            nodes: (1..=nodes)
                .map(|id| NodeSpec {
                    id: NodeId(id as u64),
                    http: format!("n{id}:{}", net::HTTP_PORT),
                    rpc: format!("n{id}:{}", net::RPC_PORT),
                })
                .collect(),
            dial: Default::default(),
        };
        let data_dirs = (1..=nodes).map(|id| root.path().join(format!("n{id}"))).collect();
        let elapsed = Arc::new(AtomicU64::new(0));
        let wal_io: Vec<SimIo> = (0..nodes).map(|_| SimIo::new()).collect();
        let starts: Vec<Arc<AtomicU64>> = (0..nodes).map(|_| Arc::default()).collect();
        Ok(SimulatedCluster {
            spec,
            points: wal_io.iter().map(|io| crashpoint::CrashPointIo::new(io.clone())).collect(),
            wal_io,
            data_dirs,
            clocks: (0..nodes)
                .map(|_| SimClock { elapsed: elapsed.clone(), skew: Default::default() })
                .collect(),
            exits: Rc::new(RefCell::new(Vec::new())),
            segment_bytes_max: 16 * 1024,
            ship_tail_batches: tidal_cluster::ship_feed::TAIL_BATCHES_MAX_DEFAULT,
            start_delays: vec![Duration::ZERO; nodes],
            redelivery: vec![None; nodes],
            observers: vec![None; nodes],
            files: starts.iter().map(|starts| files::DataDirFaults::new(starts.clone())).collect(),
            starts,
            closing: (0..nodes).map(|_| Arc::default()).collect(),
            _root: root,
        })
    }

    /// Node `index`'s configuration (the same one at every restart).
    pub fn config(&self, index: usize) -> anyhow::Result<ServeConfig> {
        let args = ServeArgs {
            data_dir: Some(self.data_dirs[index].clone()),
            dimension: Some(4),
            insecure: true,
            ..Default::default()
        };
        let mut config = ServeConfig::resolve(&args)?;
        config.cluster = Some(ClusterMembership {
            spec: self.spec.clone(),
            me: self.spec.nodes[index].id,
            timing: ControlTiming::default(),
            join: false,
        });
        config.segment_bytes_max = self.segment_bytes_max;
        config.ship_tail_batches_max = self.ship_tail_batches;
        config.checkpoint_interval_ms = 1000;
        config.read_wait_ms_max = 2000;
        config.io = NodeIo {
            wal_files: Arc::new(self.points[index].clone()),
            wal_clock: Arc::new(self.clocks[index].clone()),
            connector: match &self.redelivery[index] {
                Some(tap) if tap.rates().control_any() => net::connector()
                    .with_ship_tap(Arc::new(tap.clone()))
                    .with_control_tap(Arc::new(tap.clone())),
                Some(tap) => net::connector().with_ship_tap(Arc::new(tap.clone())),
                None => match &self.observers[index] {
                    Some(observer) => net::connector().with_control_tap(Arc::new(observer.clone())),
                    None => net::connector(),
                },
            },
            forward_writes: false,
            apply_probe: Some(Arc::new(self.points[index].clone())),
            // Set per start, in `register`.
            close_watch: None,
            raft_faults: None,
            receive_probe: None,
        };
        Ok(config)
    }

    /// Crashes node `index`'s host, then waits (real time) until the crashed instance has closed
    /// its engine: its threads wind down on the OS's schedule, and a restart that found the data dir
    /// still open tried again a number of times that depended on it, so a replay differed
    /// (decisions/052). False if it waited [`RELEASE_WAIT_MAX`] in vain.
    pub fn crash(&self, sim: &mut turmoil::Sim<'_>, index: usize) -> bool {
        sim.crash(host_name(index));
        let closed = self.closing[index].lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        match closed {
            Some(closed) => !matches!(
                closed.recv_timeout(RELEASE_WAIT_MAX),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout)
            ),
            None => true,
        }
    }

    /// Registers each node's file-fault injector for its data dir (`tidal_cluster::files`).
    pub fn register_file_faults(&self) {
        for (dir, faults) in self.data_dirs.iter().zip(&self.files) {
            tidal_cluster::files::register_faults(dir, Some(Arc::new(faults.clone())));
        }
    }

    /// Registers every node as a host of `sim`. A node whose `run_on` fails is recorded in
    /// [`SimulatedCluster::exits`] and its host ends (the driver decides whether that was expected,
    /// e.g. a refusal to start on a damaged WAL, and restarts it).
    ///
    /// Each process starts after its own delay ([`SimulatedCluster::start_delays`]), as real
    /// processes never start in the same millisecond. Without it every openraft instance ticks on
    /// the same 150 ms grid, and openraft 0.9 draws its election timeout once per instance: nodes
    /// whose timeouts round to the same tick campaign in lockstep forever (split votes; the
    /// "no leader within 30s" finding in docs/decisions/008-simulation.md).
    pub fn register(&self, sim: &mut turmoil::Sim<'_>) -> anyhow::Result<()> {
        for index in 0..self.spec.nodes.len() {
            let config = self.config(index)?;
            let exits = self.exits.clone();
            let delay = self.start_delays[index];
            let starts = self.starts[index].clone();
            let closing = self.closing[index].clone();
            sim.host(format!("n{}", index + 1), move || {
                let config = config.clone();
                let closing = closing.clone();
                let exits = exits.clone();
                starts.fetch_add(1, Ordering::SeqCst);
                async move {
                    if !delay.is_zero() {
                        // Process start-up time (simulated), not a synchronization.
                        tokio::time::sleep(delay).await;
                    }
                    let mut waited = 0;
                    loop {
                        let http = net::bind(net::HTTP_PORT).await?;
                        let rpc = net::bind(net::RPC_PORT).await?;
                        let mut config = config.clone();
                        let (watch, closed) = std::sync::mpsc::channel();
                        config.io.close_watch = Some(watch);
                        *closing.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(closed);
                        let Err(error) =
                            tidal_server::run_on(config, http, Some(rpc), std::future::pending()).await
                        else {
                            return Ok(());
                        };
                        let error = format!("{error:#}");
                        // A crashed instance's real threads (fjall's, the applier's) may still hold
                        // its fjall database when the restart comes; a real process's locks go with
                        // it. Start again once they let go, as a supervisor would; anything else, or
                        // a lock held for good, is an exit the driver judges.
                        if error.contains("Locked") && waited < LOCKED_RETRIES {
                            waited += 1;
                            tokio::time::sleep(LOCKED_RETRY).await;
                            continue;
                        }
                        exits.borrow_mut().push((index, error));
                        return Ok(());
                    }
                }
            });
        }
        Ok(())
    }
}

fn host_name(node: usize) -> String {
    format!("n{}", node + 1)
}

/// A restart that finds the crashed instance's fjall database still locked tries again this often,
/// this many times (simulated time; the old instance's threads wind down in real time meanwhile).
const LOCKED_RETRY: Duration = Duration::from_millis(50);
const LOCKED_RETRIES: u32 = 200;

/// How long a crash waits for the crashed instance to close its engine (real time; then counted as
/// `release_stall`, and the restart's retries above take over).
const RELEASE_WAIT_MAX: Duration = Duration::from_secs(10);

/// How long a crashed node stays down before a supervisor restart (its old threads wind down).
const RESTART_DELAY: Duration = Duration::from_millis(300);
/// How long a node on a damaged WAL may take to refuse to start (simulated) past its window.
const REFUSAL_GRACE: Duration = Duration::from_secs(5);

/// A WAL file the driver damaged, kept so the operator can restore it.
struct Damaged {
    node: usize,
    path: PathBuf,
    original: Vec<u8>,
    what: String,
    must_refuse: bool,
    refused: bool,
}

/// The driver's side of a run: applies and undoes faults, restarts nodes, judges exits.
struct Driver<'a> {
    cluster: &'a SimulatedCluster,
    nodes: usize,
    counters: Counters,
    trace: Vec<String>,
    violations: Vec<Violation>,
    /// Restarts due: `(simulated time, node)`.
    bounces: Vec<(Duration, usize)>,
    damaged: Option<Damaged>,
    /// A cut tail whose window ended before its node decided (repair or refuse): a refusal that
    /// comes after the undo is still the expected one (disk 155).
    late_damage: Option<Damaged>,
    exits_seen: usize,
    /// The node the crash point was armed on (and whether its death is being handled).
    point_node: Option<usize>,
    /// An exit of this node is its crash point's death, not a violation.
    point_exit_ok: Option<usize>,
    /// Refusals to start on a failed write of the CRDT incarnation (`files.rs`), by node.
    file_refusals: Vec<usize>,
    /// The file-fault window's state.
    file_window: FileWindow,
    /// Per node: its WAL had a write or fsync fault injected since its last restart (a fatal exit
    /// is then expected, decisions/059).
    wal_faulted: Vec<bool>,
    /// Whether a supervisor restarts a node whose WAL failed (`Scenario::supervisor`).
    supervisor: bool,
    /// Without a supervisor: the leader whose WAL failed, and what followed.
    handover: Option<Handover>,
    /// The node that answered the last acknowledged write.
    last_acker: Option<usize>,
}

/// A leader's WAL failed with no supervisor to restart it (`Scenario::supervisor` false).
struct Handover {
    /// The faulted node.
    node: usize,
    /// When the fault was applied (simulated).
    at: Duration,
    /// Who answered the last acknowledged write before it (the leader, if the fault aimed right).
    last_acker: Option<usize>,
    /// When its `run_on` returned the fatal fault.
    exited: Option<Duration>,
    /// When another node first acknowledged a write after it.
    first_other_ack: Option<Duration>,
    /// When the client first saw another node lead (its status polls).
    other_leader_seen: Option<Duration>,
}

impl Driver<'_> {
    fn all_pairs(&self) -> Vec<(usize, usize)> {
        (0..self.nodes).flat_map(|a| (0..self.nodes).map(move |b| (a, b))).filter(|(a, b)| a != b).collect()
    }

    /// Power loss of `node`'s WAL disk and its process; restarted `RESTART_DELAY` after `now`.
    fn crash_and_restart(&mut self, sim: &mut turmoil::Sim<'_>, node: usize, mode: CrashMode, now: Duration) {
        self.crash_and_restart_after(sim, node, mode, now + RESTART_DELAY);
    }

    /// [`Driver::crash_and_restart`], restarted at `restart` (simulated time).
    fn crash_and_restart_after(
        &mut self,
        sim: &mut turmoil::Sim<'_>,
        node: usize,
        mode: CrashMode,
        restart: Duration,
    ) {
        self.wal_faulted[node] = false;
        self.cluster.wal_io[node].crash(mode);
        self.crash_host(sim, node);
        self.bounces.push((restart, node));
    }

    /// [`SimulatedCluster::crash`], counting a wait in vain as `release_stall`.
    fn crash_host(&mut self, sim: &mut turmoil::Sim<'_>, node: usize) {
        if !self.cluster.crash(sim, node) {
            self.counters.bump("release_stall");
        }
    }

    fn apply(&mut self, sim: &mut turmoil::Sim<'_>, fault: &Fault, now: Duration) {
        let cluster = self.cluster;
        let io = |node: usize| &cluster.wal_io[node];
        match fault {
            Fault::Partition { a, b } => sim.partition(host_name(*a), host_name(*b)),
            Fault::OneWay { from, to } => sim.partition_oneway(host_name(*from), host_name(*to)),
            Fault::Hold { a, b } => sim.hold(host_name(*a), host_name(*b)),
            Fault::Isolate { node } => {
                for other in (0..self.nodes).filter(|other| other != node) {
                    sim.partition(host_name(*node), host_name(other));
                }
                sim.partition(host_name(*node), "client");
            }
            Fault::Crash { node, mode } => {
                // Power loss first (the WAL's unsynced bytes go, open handles die), then the process.
                io(*node).crash(*mode);
                self.crash_host(sim, *node);
            }
            Fault::CrashWho { who, mode } => {
                io(who.node()).crash(*mode);
                self.crash_host(sim, who.node());
            }
            Fault::PowerLoss { mode } => {
                for node in 0..self.nodes {
                    io(node).crash(*mode);
                    self.crash_host(sim, node);
                }
            }
            Fault::Split { side, .. } => {
                for a in side {
                    for b in (0..self.nodes).filter(|b| !side.contains(b)) {
                        sim.partition(host_name(*a), host_name(b));
                    }
                }
            }
            Fault::Pause { who } => {
                for other in (0..self.nodes).filter(|other| *other != who.node()) {
                    sim.hold(host_name(who.node()), host_name(other));
                }
                sim.hold(host_name(who.node()), "client");
            }
            Fault::SyncFail { who, .. } | Fault::WriteFail { who } | Fault::DiskFull { who } => {
                let node = who.node();
                match fault {
                    Fault::SyncFail { stuck: false, .. } => io(node).fail_next_sync(),
                    Fault::SyncFail { stuck: true, .. } => io(node).fail_syncs(true),
                    Fault::WriteFail { .. } => io(node).fail_next_write(),
                    _ => io(node).fail_writes(true),
                }
                self.wal_faulted[node] = true;
                if !self.supervisor && self.handover.is_none() {
                    self.handover = Some(Handover {
                        node,
                        at: now,
                        last_acker: self.last_acker,
                        exited: None,
                        first_other_ack: None,
                        other_leader_seen: None,
                    });
                }
            }
            Fault::Corrupt { who, damage } => {
                let node = who.node();
                io(node).crash(CrashMode::LoseUnsynced);
                self.crash_host(sim, node);
                let wal_dir = self.cluster.data_dirs[node].join("wal");
                match check::damage(io(node), &wal_dir, *damage) {
                    Some((path, original, what)) => {
                        self.trace.push(format!("damage n{}: {what}", node + 1));
                        self.damaged = Some(Damaged {
                            node,
                            path,
                            original,
                            what,
                            must_refuse: damage.must_refuse(),
                            refused: false,
                        });
                    }
                    None => {
                        self.counters.bump("damage_skipped_empty_wal");
                        self.trace.push(format!("damage n{}: nothing to damage", node + 1));
                    }
                }
                self.bounces.push((now + RESTART_DELAY, node));
            }
            Fault::ClockSkew { who, ms } => cluster.clocks[who.node()].skew.store(*ms, Ordering::SeqCst),
            Fault::FileFail { who, step } => self.open_file_window(sim, *step, who.node(), now),
        }
    }

    /// Undoes a fault; false while it must wait (a damaged node that has not refused yet).
    fn undo(&mut self, sim: &mut turmoil::Sim<'_>, fault: &Fault, now: Duration, overdue: bool) -> bool {
        match fault {
            Fault::Partition { a, b } => sim.repair(host_name(*a), host_name(*b)),
            Fault::OneWay { from, to } => sim.repair_oneway(host_name(*from), host_name(*to)),
            Fault::Hold { a, b } => sim.release(host_name(*a), host_name(*b)),
            Fault::Isolate { node } => {
                for other in (0..self.nodes).filter(|other| other != node) {
                    sim.repair(host_name(*node), host_name(other));
                }
                sim.repair(host_name(*node), "client");
            }
            Fault::Crash { node, .. } => {
                if !sim.is_host_running(host_name(*node)) {
                    sim.bounce(host_name(*node));
                }
            }
            Fault::CrashWho { who, .. } => {
                if !sim.is_host_running(host_name(who.node())) {
                    sim.bounce(host_name(who.node()));
                }
            }
            Fault::PowerLoss { .. } => {
                for node in 0..self.nodes {
                    if !sim.is_host_running(host_name(node)) {
                        sim.bounce(host_name(node));
                    }
                }
            }
            Fault::Split { side, .. } => {
                for a in side {
                    for b in (0..self.nodes).filter(|b| !side.contains(b)) {
                        sim.repair(host_name(*a), host_name(b));
                    }
                }
            }
            Fault::Pause { who } => {
                for other in (0..self.nodes).filter(|other| *other != who.node()) {
                    sim.release(host_name(who.node()), host_name(other));
                }
                sim.release(host_name(who.node()), "client");
            }
            Fault::SyncFail { who, .. } | Fault::WriteFail { who } | Fault::DiskFull { who } => {
                // The supervisor restarts the node (a poisoned WAL never recovers in place; the
                // node exits by itself, decisions/059). Without one it stays down until the heal.
                let io = &self.cluster.wal_io[who.node()];
                io.fail_syncs(false);
                io.fail_writes(false);
                if self.supervisor {
                    self.crash_and_restart(sim, who.node(), CrashMode::LoseUnsynced, now);
                }
            }
            Fault::Corrupt { .. } => {
                if let Some(damaged) = self.damaged.take() {
                    if damaged.must_refuse && !damaged.refused {
                        if !overdue {
                            self.damaged = Some(damaged);
                            return false;
                        }
                        self.violations.push(Violation::StartedOnDamagedWal {
                            node: Node(damaged.node),
                            damage: damaged.what.clone(),
                        });
                    }
                    if damaged.refused || damaged.must_refuse {
                        // The operator restores the disk and restarts the node.
                        self.cluster.wal_io[damaged.node].write_file(&damaged.path, &damaged.original);
                        self.trace.push(format!("restore n{} {}", damaged.node + 1, damaged.path.display()));
                        self.crash_and_restart(sim, damaged.node, CrashMode::LoseUnsynced, now);
                    } else {
                        // A cut tail may still be refused by a start that is not done yet.
                        self.late_damage = Some(damaged);
                    }
                }
            }
            Fault::ClockSkew { who, .. } => self.cluster.clocks[who.node()].skew.store(0, Ordering::SeqCst),
            Fault::FileFail { .. } => self.close_file_window(sim, now),
        }
        true
    }

    /// Judges host exits since the last call: a refusal to start on a damaged WAL is expected,
    /// anything else is a violation.
    fn judge_exits(&mut self, now: Duration, offset: Duration) {
        let exits = self.cluster.exits.borrow();
        for (node, error) in exits.iter().skip(self.exits_seen) {
            let incarnation_failed =
                self.cluster.files[*node].failed().iter().any(|failed| failed.file == "incarnation");
            if incarnation_failed && error.contains("simulated file error") {
                // A node that could not write its CRDT incarnation must not start (fail closed);
                // the supervisor starts it again.
                self.file_refusals.push(*node);
                self.counters.bump("file_fail_closed_start");
                self.trace.push(format!("{} ms n{} refused to start: {error}", offset.as_millis(), node + 1));
                self.bounces.push((now + RESTART_DELAY, *node));
                continue;
            }
            if self.cluster.points[*node].renames_failed() > 0 && error.contains("simulated rename error") {
                // Failing closed on a failed rename (e.g. at start-up, recovery writing `wal.meta`)
                // is what the node must do; the supervisor restarts it at the heal.
                self.counters.bump("rename_fail_closed");
                self.trace.push(format!("{} ms n{} failed closed: {error}", offset.as_millis(), node + 1));
                continue;
            }
            if self.wal_faulted[*node] && error.contains("fatal storage fault (wal)") {
                // Its WAL failed: it left office and exited (decisions/059). The supervisor restarts
                // it at the window's end (or, without one, the operator at the heal).
                self.counters.bump("fatal_exit");
                self.trace.push(format!(
                    "{} ms n{} exited on a fatal storage fault",
                    offset.as_millis(),
                    node + 1
                ));
                if let Some(handover) = self.handover.as_mut().filter(|handover| handover.node == *node) {
                    handover.exited.get_or_insert(now);
                }
                continue;
            }
            if self.point_exit_ok == Some(*node) {
                self.trace.push(format!(
                    "{} ms n{} exited at its crash point: {error}",
                    offset.as_millis(),
                    node + 1
                ));
                continue;
            }
            let late = self.late_damage.as_ref().is_some_and(|damaged| damaged.node == *node);
            if late && (error.contains("corrupt") || error.contains("refusing to start")) {
                if let Some(damaged) = self.late_damage.take() {
                    // Refused after its window ended: the operator restores the disk and the
                    // supervisor restarts the node.
                    self.cluster.wal_io[damaged.node].write_file(&damaged.path, &damaged.original);
                    self.counters.bump("refused_start");
                    self.trace.push(format!(
                        "{} ms n{} refused to start (after its window); restore {}",
                        offset.as_millis(),
                        node + 1,
                        damaged.path.display()
                    ));
                    self.bounces.push((now + RESTART_DELAY, *node));
                }
                continue;
            }
            let expected = self.damaged.as_mut().filter(|damaged| damaged.node == *node && !damaged.refused);
            // A refusal names the damage: a corrupt batch, or a WAL that ends below what the
            // engine applied.
            let names_damage = error.contains("corrupt") || error.contains("refusing to start");
            match expected {
                Some(damaged) if names_damage => {
                    damaged.refused = true;
                    self.counters.bump("refused_start");
                    self.trace.push(format!("{} ms n{} refused to start", offset.as_millis(), node + 1));
                }
                _ => self.violations.push(Violation::UnexpectedExit {
                    node: Node(*node),
                    at_ms: violation::millis(offset),
                    error: error.clone(),
                }),
            }
        }
        self.exits_seen = exits.len();
        self.point_exit_ok = None;
    }

    /// Arms the scenario's crash point on the node that has its role now.
    fn arm_point(&mut self, point: &crashpoint::CrashPoint, leader: usize) {
        let who = match point.boundary.role {
            crashpoint::Role::Leader => faults::Who::Leader,
            crashpoint::Role::Follower => faults::Who::Follower(0),
        };
        let node = who.resolve(leader, self.nodes);
        if let Some(op) = point.boundary.op {
            self.cluster.points[node].arm(op, point.k, point.mode);
        }
        self.point_node = Some(node);
        self.trace.push(format!("arm {} on n{}", point.label(), node + 1));
    }

    /// The armed node reached its crash point (its disk already crashed, its file operations
    /// failing): crash its host, restart it after `downtime`.
    fn point_reached(
        &mut self,
        sim: &mut turmoil::Sim<'_>,
        now: Duration,
        offset: Duration,
        downtime: Duration,
        rename_errors: bool,
    ) {
        let Some(node) = self.point_node else { return };
        let io = &self.cluster.points[node];
        if !io.is_dead() {
            return;
        }
        if sim.is_host_running(host_name(node)) {
            self.crash_host(sim, node);
        }
        io.revive();
        if rename_errors {
            io.fail_renames(true);
            self.trace.push(format!("n{}: renames fail from now on", node + 1));
        }
        self.counters.bump("crash_point");
        self.trace.push(format!(
            "{} ms n{} died at its crash point: {}",
            offset.as_millis(),
            node + 1,
            io.fired().unwrap_or_default()
        ));
        self.point_exit_ok = Some(node);
        self.bounces.push((now + downtime, node));
    }

    /// Opens the file-fault window: every node's small-file writes fail at `step` from now on,
    /// and the leader crashes (restarted shortly), so a new leader writes its stream baseline.
    fn open_file_window(&mut self, sim: &mut turmoil::Sim<'_>, step: FileStep, leader: usize, now: Duration) {
        self.file_window.opened = true;
        self.file_window.failed_before =
            self.cluster.files.iter().map(|faults| faults.failed().len()).collect();
        for faults in &self.cluster.files {
            faults.fail(Some(step));
        }
        if sim.is_host_running(host_name(leader)) {
            self.crash_and_restart(sim, leader, CrashMode::LoseUnsynced, now);
        }
    }

    /// Closes the file-fault window: writes succeed again, and a supervisor restarts every node
    /// whose write failed meanwhile (it failed closed; the restart must recover).
    fn close_file_window(&mut self, sim: &mut turmoil::Sim<'_>, now: Duration) {
        if !self.file_window.opened || self.file_window.closed {
            return;
        }
        self.file_window.closed = true;
        for (node, faults) in self.cluster.files.iter().enumerate() {
            faults.fail(None);
            let before = self.file_window.failed_before.get(node).copied().unwrap_or(0);
            let failed = faults.failed().len().saturating_sub(before);
            self.file_window.failures += failed;
            let restarting = self.bounces.iter().any(|(_, due)| *due == node);
            if failed > 0 && !restarting && sim.is_host_running(host_name(node)) {
                self.trace.push(format!("n{}: {failed} file writes failed; supervisor restart", node + 1));
                self.crash_and_restart(sim, node, CrashMode::LoseUnsynced, now);
            }
        }
    }

    /// Restarts that are due.
    fn bounce_due(&mut self, sim: &mut turmoil::Sim<'_>, now: Duration) {
        let due: Vec<usize> =
            self.bounces.iter().filter(|(at, _)| *at <= now).map(|(_, node)| *node).collect();
        self.bounces.retain(|(at, _)| *at > now);
        for node in due {
            if !sim.is_host_running(host_name(node)) {
                sim.bounce(host_name(node));
            }
        }
    }
}

/// The file-fault window's state in a run.
#[derive(Default)]
struct FileWindow {
    opened: bool,
    closed: bool,
    /// Each node's failed steps before it opened.
    failed_before: Vec<usize>,
    /// Failed steps while it was open.
    failures: usize,
}

/// The per-run checks of the file faults: a node whose stream baseline of term T could not be
/// written never acknowledged a write of term T in that process (it did not serve); a node whose CRDT incarnation
/// could not be written refused to start. Counts every failed step by class.
#[allow(clippy::too_many_arguments)]
fn check_file_faults(
    cluster: &SimulatedCluster,
    plan: &files::FilePlan,
    window: &FileWindow,
    refusals: &[usize],
    (acks, ack_starts): (&[workload::Ack], &[u64]),
    logs: &[check::LogMap],
    counters: &mut Counters,
    violations: &mut Vec<Violation>,
) {
    let term_at = |node: usize, seqno: u64| {
        logs.get(node)?
            .range(..=seqno)
            .next_back()
            .filter(|(_, (_, last, _))| *last >= seqno)
            .map(|(_, (term, _, _))| *term)
    };
    for (node, faults) in cluster.files.iter().enumerate() {
        for failed in faults.failed() {
            counters.bump(files::class(&failed));
            let Some(term) = failed.term else { continue };
            // An ack the driver saw (after the step it came in) while the node ran the process whose
            // write failed; a later process may serve the term (it resumed it and wrote the file).
            let served = acks.iter().zip(ack_starts).find(|(ack, start)| {
                ack.node == node && **start == failed.start && term_at(node, ack.seqno) == Some(term)
            });
            match served.map(|(ack, _)| ack) {
                Some(ack) => violations.push(Violation::ServedWithoutBaseline {
                    node: Node(node),
                    id: ack.id,
                    seqno: ack.seqno,
                    term,
                    step: format!("{:?}", failed.step),
                }),
                None => counters.bump("file_refused_office"),
            }
        }
    }
    if let Some((node, _)) = plan.boot {
        let failed = cluster.files[node].failed().iter().any(|failed| failed.file == "incarnation");
        if !failed {
            counters.bump("file_boot_unreached");
        } else if !refusals.contains(&node) {
            violations.push(Violation::StartedWithoutIncarnation { node: Node(node) });
        }
    }
    if window.opened && window.failures == 0 {
        counters.bump("file_window_unreached");
    }
}

/// Runs one seeded scenario and checks it.
/// How long a step waits for the nodes' threads before it goes on without them (then counted as
/// `settle_stall`; a replay of the seed may then differ).
const SETTLE_MAX: Duration = Duration::from_secs(2);

/// Stalls after which a run stops waiting for the nodes' threads.
const SETTLE_STALLS_MAX: u32 = 3;

/// After a step: waits until the nodes' own threads (WAL writers, appliers, blocking work) have
/// done what the step handed them, so that it is done before simulated time moves on
/// (decisions/051). False if it gave up after [`SETTLE_MAX`].
fn settle(activity: &activity::Activity) -> bool {
    if activity.busy() == 0 {
        return true;
    }
    let started = std::time::Instant::now();
    let mut spins = 0u32;
    while activity.busy() > 0 {
        if spins < 100 {
            spins += 1;
            std::hint::spin_loop();
        } else if started.elapsed() > SETTLE_MAX {
            return false;
        } else {
            std::thread::yield_now();
        }
    }
    true
}

/// Restores the thread's activity when a run ends, however it ends.
struct ActivityScope(Option<Arc<dyn tidal_types::activity::Scheduler>>);

impl Drop for ActivityScope {
    fn drop(&mut self) {
        tidal_types::activity::set_current(self.0.take());
    }
}

/// tokio numbers its tasks from one counter per process, and a runtime that shuts down (a crashed
/// host) drops its tasks in shards by that number modulo a power of two (4 for a host's runtime),
/// each task closing its sockets as it goes: the FINs, and the latencies drawn for them, came in an
/// order that depended on how many tasks the process had made before the run. A run that followed
/// another in the same process (a sweep, the determinism measurement) did not replay alone.
/// Spawning empty tasks until the next number is a multiple of [`TASK_ID_ALIGN`] starts every run
/// at the same place modulo it (decisions/052).
///
/// Runs on other threads of the process (`cargo test`'s test threads, the crash sweep's jobs) take
/// numbers from the same counter meanwhile: then no alignment holds, and after a bounded number of
/// tries the run goes on without one (`tidal-sim --jobs` runs each run in a process of its own).
fn align_task_ids() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    for _ in 0..TASK_ID_ALIGN * 16 {
        let id: u64 = runtime.spawn(async {}).id().to_string().parse()?;
        if (id + 1).is_multiple_of(TASK_ID_ALIGN) {
            return Ok(());
        }
    }
    tracing::warn!("tokio's task numbers are taken by other threads too: this run may not replay alone");
    Ok(())
}

/// See [`align_task_ids`]: a multiple of every shard count tokio uses for a one-thread runtime.
const TASK_ID_ALIGN: u64 = 64;

pub fn run(seed: u64, scenario: &Scenario) -> anyhow::Result<Outcome> {
    align_task_ids()?;
    let mut rng = rng::Rng::new(seed);
    // Every simulated host runs on this thread: openraft's election timeouts and the campaign
    // pauses are drawn from the seed (decisions/051).
    tidal_cluster::control::seed_thread_rng(Some(seed ^ 0x0e1e_c7ed));
    // Work the nodes hand to their own threads counts here; each step waits for it (decisions/051).
    // `TIDAL_SIM_SETTLE=0` turns the wait off (to measure what it buys).
    let activity = activity::Activity::new();
    let _scope = ActivityScope(tidal_types::activity::set_current(Some(activity.clone())));
    let mut settling = std::env::var_os("TIDAL_SIM_SETTLE").is_none_or(|value| value != "0");
    let mut stalls = 0u32;
    let mut cluster = SimulatedCluster::new(scenario.nodes, scenario.durability)?;
    cluster.segment_bytes_max = scenario.segment_bytes_max;
    cluster.ship_tail_batches = scenario.ship_tail_batches;
    // `TIDAL_SIM_ALIGNED_STARTS=1` starts every node at the same instant (reproduces the
    // lockstep-election finding).
    let aligned = std::env::var_os("TIDAL_SIM_ALIGNED_STARTS").is_some_and(|value| value == "1");
    if scenario.stagger_starts && !aligned {
        // A stream of its own, so the fault plan's draws stay as recorded.
        let mut starts = rng::Rng::new(seed ^ 0x57a6_6e55);
        cluster.start_delays =
            (0..scenario.nodes).map(|_| Duration::from_millis(starts.range(0, 150))).collect();
    }
    let plan = match scenario.faults {
        Faults::Classes(classes) => Plan::draw(&mut rng, classes, scenario.nodes, scenario.load),
        Faults::Swarm(swarm) => Plan::draw_swarm(&mut rng, swarm, scenario.nodes, scenario.load),
        Faults::Script(_) => {
            Plan { latency_max: Duration::from_millis(1), fail_rate: 0.0, windows: Vec::new() }
        }
    };
    let mut script = match scenario.faults {
        Faults::Script(steps) => {
            cluster.observers =
                cluster.starts.iter().map(|starts| Some(script::Observer::new(starts.clone()))).collect();
            Some(script::ScriptRun::new(scenario.name, steps, scenario.nodes, seed))
        }
        _ => None,
    };
    // `TIDAL_SIM_REDELIVERY=0` turns duplicated and reordered delivery off (to compare a plant's
    // catch rate with and without it).
    let redelivery_off = std::env::var_os("TIDAL_SIM_REDELIVERY").is_some_and(|value| value == "0");
    // `TIDAL_SIM_CONTROL_REDELIVERY=0` turns off only the control-plane classes (openraft's RPCs
    // and the office probe).
    let control_off = std::env::var_os("TIDAL_SIM_CONTROL_REDELIVERY").is_some_and(|value| value == "0");
    let redelivery = if scenario.redelivery && !redelivery_off {
        let rates = redeliver::Rates::draw(seed);
        if control_off {
            rates.without_control()
        } else {
            rates
        }
    } else {
        redeliver::Rates::default()
    };
    if redelivery.any() {
        cluster.redelivery = (0..scenario.nodes)
            .map(|node| Some(redeliver::Redelivery::new(redelivery, seed ^ 0x7a9 ^ ((node as u64) << 40))))
            .collect();
    }
    // File faults (`disk`): a window in which every node's small-file writes fail at a drawn step,
    // and a failed first start. `TIDAL_SIM_FILE_FAULTS=0` turns them off.
    let file_faults_off = std::env::var_os("TIDAL_SIM_FILE_FAULTS").is_some_and(|value| value == "0");
    let file_plan = if scenario.file_faults && !file_faults_off {
        files::FilePlan::draw(seed, scenario.nodes)
    } else {
        files::FilePlan::default()
    };
    if file_plan.any() {
        cluster.register_file_faults();
    }
    let mut plan = plan;
    if let Some((pick, step)) = file_plan.window {
        // One window of the plan (picked by the file stream) becomes the file-fault window: it
        // keeps that window's time, and every other window stays as drawn.
        if !plan.windows.is_empty() {
            let index = usize::try_from(pick % plan.windows.len() as u64).unwrap_or(0);
            plan.windows[index].fault = Fault::FileFail { who: faults::Who::Leader, step };
        }
    }
    if let Some((node, step)) = file_plan.boot {
        cluster.files[node].fail_boot(step);
    }
    let limit = scenario.load + scenario.converge_deadline + Duration::from_secs(120);
    let mut sim = turmoil::Builder::new()
        .simulation_duration(limit)
        .tick_duration(Duration::from_millis(1))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(plan.latency_max)
        .fail_rate(plan.fail_rate)
        .repair_rate(0.5)
        .rng_seed(seed)
        .build();
    cluster.register(&mut sim)?;
    let shared = Rc::new(RefCell::new(Shared::new()));
    let workload = Workload {
        nodes: scenario.nodes,
        load: scenario.load,
        writes_max: scenario.writes_max,
        writers: scenario.writers,
        item_pad: scenario.item_pad,
        converge_deadline: scenario.converge_deadline,
        heal_via_log: scenario.heal_via_log,
        registers: scenario.registers,
        embeddings: scenario.embeddings,
        reader: scenario.txs && scenario.durability == Durability::Quorum,
        txs: scenario.txs,
        inboxes: scenario.txs && scenario.durability == Durability::Quorum,
    };
    sim.client("client", workload::run(workload, shared.clone()));
    let mut driver = Driver {
        cluster: &cluster,
        nodes: scenario.nodes,
        counters: Counters::default(),
        trace: Vec::new(),
        violations: Vec::new(),
        bounces: Vec::new(),
        damaged: None,
        late_damage: None,
        exits_seen: 0,
        point_node: None,
        point_exit_ok: None,
        file_refusals: Vec::new(),
        file_window: FileWindow::default(),
        wal_faulted: vec![false; scenario.nodes],
        supervisor: scenario.supervisor,
        handover: None,
        last_acker: None,
    };
    if plan.fail_rate > 0.0 {
        driver.counters.bump("flaky_links");
    }
    if plan.latency_max > Duration::from_millis(1) {
        driver.counters.bump("latency");
    }
    let plan_hash = blake3::hash(format!("{plan:?} {redelivery:?}").as_bytes()).to_hex()[..16].to_string();
    driver.trace.push(format!("plan {plan_hash}"));
    if redelivery.any() {
        driver.trace.push(format!("redelivery: {redelivery:?}"));
    }
    if file_plan.any() {
        driver.trace.push(format!("file faults: {file_plan:?}"));
    }
    let mut ack_starts: Vec<u64> = Vec::new();
    let mut pending = plan.windows.clone();
    pending.reverse();
    // The open window, with its faults resolved to nodes.
    let mut active: Option<faults::Window> = None;
    let mut load_started: Option<Duration> = None;
    let mut healed = false;
    loop {
        let now = sim.elapsed();
        cluster.clocks[0].elapsed.store(u64::try_from(now.as_millis()).unwrap_or(u64::MAX), Ordering::SeqCst);
        // Fault times count from boot in the first four families (their recorded seeds replay
        // that way) and from the first write in the later ones (faults aimed at the leader need
        // one; the start-up election is not what they test).
        let anchored = match scenario.faults {
            Faults::Classes(_) => true,
            Faults::Swarm(_) | Faults::Script(_) => shared.borrow().writing,
        };
        if anchored {
            load_started.get_or_insert(now);
        }
        let offset = load_started.map_or(Duration::ZERO, |start| now - start);
        driver.point_reached(&mut sim, now, offset, scenario.point_downtime, scenario.rename_errors);
        driver.judge_exits(now, offset);
        if let Some(point) = &scenario.crash_point {
            if driver.point_node.is_none() && load_started.is_some() && offset >= scenario.arm_after {
                let leader = {
                    let shared = shared.borrow();
                    shared.leader.map_or(shared.leader_guess, |(_, node)| node)
                };
                driver.arm_point(point, leader);
            }
        }
        driver.bounce_due(&mut sim, now);
        let phase = shared.borrow().phase;
        match phase {
            Phase::Load if load_started.is_some() && script.is_some() => {
                if let Some(script) = &mut script {
                    script.tick(&mut driver, &mut sim, &shared, now, offset);
                }
            }
            // A script runs to its end before the heal.
            Phase::HealRequested if script.as_ref().is_some_and(|script| !script.done) => {
                if let Some(script) = &mut script {
                    script.tick(&mut driver, &mut sim, &shared, now, offset);
                }
            }
            Phase::Load if load_started.is_some() => {
                if let Some(window) = &active {
                    let end = window.at + window.length;
                    if offset >= end {
                        let fault = window.fault.clone();
                        if driver.undo(&mut sim, &fault, now, offset >= end + REFUSAL_GRACE) {
                            driver.trace.push(format!("{} ms undo {fault:?}", offset.as_millis()));
                            active = None;
                        }
                    }
                }
                if active.is_none() && pending.last().is_some_and(|window| offset >= window.at) {
                    if let Some(mut window) = pending.pop() {
                        let leader = {
                            let shared = shared.borrow();
                            shared.leader.map_or(shared.leader_guess, |(_, node)| node)
                        };
                        // Counted by the planned fault: its class names the role it aims at.
                        driver.counters.bump(window.fault.class());
                        window.fault = window.fault.resolve(leader, scenario.nodes);
                        driver.apply(&mut sim, &window.fault, now);
                        driver.trace.push(format!("{} ms apply {:?}", offset.as_millis(), window.fault));
                        active = Some(window);
                    }
                }
            }
            Phase::HealRequested if !healed => {
                if let Some(window) = active.take() {
                    driver.undo(&mut sim, &window.fault, now, true);
                }
                // Heal: every link whole again, no message loss, disks and clocks sound, every
                // node running.
                sim.set_fail_rate(0.0);
                for (a, b) in driver.all_pairs() {
                    sim.repair(host_name(a), host_name(b));
                    sim.release(host_name(a), host_name(b));
                }
                if let Some(node) = driver.handover.as_ref().map(|handover| handover.node) {
                    if !sim.is_host_running(host_name(node)) {
                        // No supervisor: the operator restarts the node that exited (its disk as
                        // after a power cycle: after a failed fsync nothing unsynced is trusted).
                        driver.trace.push(format!("operator restarts n{}", node + 1));
                        driver.crash_and_restart(&mut sim, node, CrashMode::LoseUnsynced, now);
                    }
                }
                for node in 0..scenario.nodes {
                    sim.repair(host_name(node), "client");
                    sim.release(host_name(node), "client");
                    cluster.wal_io[node].fail_syncs(false);
                    cluster.wal_io[node].fail_writes(false);
                    cluster.clocks[node].skew.store(0, Ordering::SeqCst);
                    let points = &cluster.points[node];
                    points.fail_renames(false);
                    if points.renames_failed() > 0 && sim.is_host_running(host_name(node)) {
                        // A node whose rename failed stopped serving its WAL (fail closed): a
                        // supervisor restarts it.
                        driver.crash_and_restart(&mut sim, node, CrashMode::LoseUnsynced, now);
                    }
                    let restarting = driver.bounces.iter().any(|(_, due)| *due == node);
                    if !restarting && !sim.is_host_running(host_name(node)) {
                        sim.bounce(host_name(node));
                    }
                }
                for tap in cluster.redelivery.iter().flatten() {
                    tap.stop();
                }
                driver.trace.push("heal".into());
                healed = true;
                shared.borrow_mut().phase = Phase::Healed;
            }
            _ => {}
        }
        if settling {
            activity.begin_step();
        }
        let stepped = sim.step();
        activity.end_step();
        if settling && !settle(&activity) {
            driver.counters.bump("settle_stall");
            stalls += 1;
            // Something counted waits for the simulation itself; stop waiting for it.
            settling = stalls < SETTLE_STALLS_MAX;
        }
        {
            // Each new acknowledgement, stamped with the answering node's process start (right
            // after the step it came in, before the driver restarts anything).
            let shared = shared.borrow();
            let stepped_to = sim.elapsed();
            for ack in shared.acks.iter().skip(ack_starts.len()) {
                ack_starts.push(cluster.starts[ack.node].load(Ordering::SeqCst));
                driver.last_acker = Some(ack.node);
                if let Some(handover) = driver.handover.as_mut() {
                    if ack.node != handover.node && handover.first_other_ack.is_none() {
                        handover.first_other_ack = Some(stepped_to);
                    }
                }
            }
            if let (Some(handover), Some((_, leader))) = (driver.handover.as_mut(), shared.leader) {
                if leader != handover.node && handover.other_leader_seen.is_none() {
                    handover.other_leader_seen = Some(stepped_to);
                }
            }
        }
        match stepped {
            Ok(true) => break,
            Ok(false) => {}
            Err(error) => {
                driver.violations.push(Violation::SimulationStopped { error: error.to_string() });
                break;
            }
        }
    }
    for _ in 0..activity.stalls() {
        driver.counters.bump("turn_stall");
    }
    let simulated = sim.elapsed();
    let offset = simulated - load_started.unwrap_or_default();
    driver.judge_exits(simulated, offset);
    let crash_point_fired = driver.point_node.and_then(|node| cluster.points[node].fired());
    let failover_ms = driver.handover.as_ref().and_then(|handover| {
        let since =
            |at: Duration| u64::try_from(at.saturating_sub(handover.at).as_millis()).unwrap_or(u64::MAX);
        handover.first_other_ack.map(|at| (since(at), handover.other_leader_seen.map(since)))
    });
    if let Some(handover) = &driver.handover {
        check_handover(handover, &mut driver.counters, &mut driver.violations);
    }
    for points in &cluster.points {
        for _ in 0..points.renames_failed() {
            driver.counters.bump("rename_fail");
        }
    }
    let Driver { mut counters, trace, mut violations, file_refusals, file_window, .. } = driver;
    // Files in the trace are named under the run's temp dir, which differs between replays.
    let trace: Vec<String> = match cluster.data_dirs.first().and_then(|dir| dir.parent()) {
        Some(root) => {
            let root = root.display().to_string();
            trace.into_iter().map(|line| line.replace(&root, "<run>")).collect()
        }
        None => trace,
    };
    drop(sim);
    for (node, tap) in cluster.redelivery.iter().enumerate() {
        let Some(tap) = tap else { continue };
        for (class, count) in tap.counts() {
            *counters.0.entry(class).or_default() += count;
        }
        for halt in tap.halts() {
            violations.push(Violation::Redelivery { node: Node(node), answer: halt });
        }
    }
    // WAL checks over each node's simulated disk (the nodes are stopped: the sim is dropped).
    let mut logs = Vec::new();
    for (index, io) in cluster.wal_io.iter().enumerate() {
        let wal_dir = cluster.data_dirs[index].join("wal");
        logs.push(check::read_wal(io, &wal_dir, index, &mut violations));
        if check::duplicates(io, &wal_dir, index, &mut violations) > 0 {
            counters.bump("dedup_logs_checked");
        }
        let rotations = check::rotation(io, &wal_dir, index, cluster.segment_bytes_max, &mut violations);
        for _ in 0..rotations {
            counters.bump("wal_rotations");
        }
    }
    let batches_compared = check::log_matching(&logs, &mut violations);
    // For each diverging position (a few), every node's history of it: what it holds, what it
    // quarantined and when, and who led each term (as sampled). Printed with the failure.
    let mut position_story = Vec::new();
    for seqno in check::diverging(&logs).into_iter().take(3) {
        position_story.push(format!("seqno {seqno}, node by node (ms of simulated time):"));
        for (index, io) in cluster.wal_io.iter().enumerate() {
            let wal_dir = cluster.data_dirs[index].join("wal");
            for line in check::position_history(io, &wal_dir, seqno, EPOCH_MS) {
                position_story.push(format!("  n{}: {line}", index + 1));
            }
        }
    }
    let rotations = counters.0.get("wal_rotations").copied().unwrap_or(0);
    if rotations < scenario.rotations_min && shared.borrow().stats.acked >= 60 {
        violations.push(Violation::TooFewRotations {
            rotations,
            expected: scenario.rotations_min,
            acked: shared.borrow().stats.acked,
        });
    }
    let shared = Rc::try_unwrap(shared).map(RefCell::into_inner).unwrap_or_else(|rc| rc.borrow().clone());
    check_file_faults(
        &cluster,
        &file_plan,
        &file_window,
        &file_refusals,
        (&shared.acks, &ack_starts),
        &logs,
        &mut counters,
        &mut violations,
    );
    // Invariant 4 (observed): at most one leader per term.
    for (term, leaders) in &shared.leaders {
        if leaders.len() > 1 {
            violations.push(Violation::TwoLeaders { term: *term, leaders: leaders.clone() });
        }
    }
    violations.extend(shared.violations.iter().cloned());
    for _ in 0..shared.counters_feeds {
        counters.bump("feeds_compared");
    }
    for _ in 0..shared.counters_feed_items {
        counters.bump("feed_items_compared");
    }
    for _ in 0..shared.counters_stale_source {
        counters.bump("refused_stale_source");
    }
    for _ in 0..shared.counters_pulled_batches {
        counters.bump("pulled_batches");
    }
    for _ in 0..shared.inbox.sent.len() {
        counters.bump("inbox_sends_acked");
    }
    for _ in 0..shared.inbox.delivered.len() {
        counters.bump("inbox_deliveries");
    }
    // The per-key linearizability check of the register history.
    if !shared.history.is_empty() {
        let (written, unknown, read, read_failed) = shared.history.counts();
        for _ in 0..read_failed {
            counters.bump("register_reads_failed");
        }
        for _ in 0..written {
            counters.bump("register_writes_acked");
        }
        for _ in 0..unknown {
            counters.bump("register_writes_unknown");
        }
        for _ in 0..read {
            counters.bump("register_reads");
        }
        violations.extend(shared.history.check());
    }
    let mut hasher = blake3::Hasher::new();
    for line in trace.iter().chain(shared.trace.iter()) {
        hasher.update(line.as_bytes());
        hasher.update(b"\n");
    }
    let trace_hash = hasher.finalize().to_hex()[..16].to_string();
    let part = |lines: &mut dyn Iterator<Item = String>| {
        let mut hasher = blake3::Hasher::new();
        for line in lines {
            hasher.update(line.as_bytes());
            hasher.update(b"\n");
        }
        hasher.finalize().to_hex()[..16].to_string()
    };
    let mut acked: Vec<u64> = shared
        .trace
        .iter()
        .filter_map(|line| line.strip_prefix("ack "))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .collect();
    acked.sort_unstable();
    if let Ok(path) = std::env::var("TIDAL_SIM_TRACE_OUT") {
        // `%n` in the path numbers the runs of this process (two replays in one test).
        static RUNS: AtomicU64 = AtomicU64::new(0);
        let path = path.replace("%n", &RUNS.fetch_add(1, Ordering::SeqCst).to_string());
        let mut all: Vec<String> = trace.clone();
        all.extend(shared.trace.iter().cloned());
        for (index, io) in cluster.wal_io.iter().enumerate() {
            all.extend(check::batch_lines(io, &cluster.data_dirs[index].join("wal"), index));
        }
        let _ = std::fs::write(path, all.join("\n"));
    }
    let trace_parts = vec![
        ("plan", plan_hash.clone()),
        ("faults", part(&mut trace.iter().filter(|line| !line.starts_with("plan")).cloned())),
        ("acked", part(&mut acked.iter().map(u64::to_string))),
        ("acks", part(&mut shared.trace.iter().filter(|line| line.starts_with("ack ")).cloned())),
        ("final", part(&mut shared.trace.iter().filter(|line| line.starts_with("digest ")).cloned())),
    ];
    // The compact trace printed with a failure: faults as applied and the client's last events.
    let mut story: Vec<String> = trace.iter().filter(|line| !line.starts_with("plan")).cloned().collect();
    story.truncate(40);
    if !position_story.is_empty() {
        let leaders: Vec<String> = shared
            .leaders
            .iter()
            .map(|(term, leaders)| {
                let names: Vec<String> = leaders.iter().map(|node| format!("n{node}")).collect();
                format!("term {term}: {}", names.join(","))
            })
            .collect();
        position_story.push(format!("leaders as sampled: {}", leaders.join("; ")));
        story.extend(position_story);
    }
    let lost = lost_writes(&violations);
    Ok(Outcome {
        seed,
        scenario: scenario.name,
        violations,
        counters,
        trace_hash,
        plan_hash,
        trace_parts,
        stats: shared.stats,
        simulated,
        converged_after_ms: shared.converged_after_ms,
        final_seqno: shared.digest.as_ref().map(|digest| digest.0),
        batches_compared,
        terms: shared.leaders.len(),
        story,
        crash_point_fired,
        lost,
        failover_ms,
    })
}

/// Without a supervisor: the leader whose WAL failed exited by itself, and another node
/// acknowledged a write within [`FAILOVER_BOUND`] of the fault (decisions/059).
fn check_handover(handover: &Handover, counters: &mut Counters, violations: &mut Vec<Violation>) {
    let node = Node(handover.node);
    if handover.last_acker != Some(handover.node) {
        violations.push(Violation::HandoverNotLeader { node, last_acker: handover.last_acker.map(Node) });
    }
    match handover.exited {
        Some(_) => counters.bump("fatal_handover_exited"),
        None => violations.push(Violation::HandoverNoExit { node }),
    }
    match handover.first_other_ack {
        Some(at) if at.saturating_sub(handover.at) <= FAILOVER_BOUND => {
            counters.bump("fatal_handover_failed_over")
        }
        Some(at) => violations.push(Violation::HandoverTooLate {
            node,
            after_ms: violation::millis(at.saturating_sub(handover.at)),
            bound_ms: violation::millis(FAILOVER_BOUND),
        }),
        None => violations.push(Violation::HandoverNoFailover { node }),
    }
}

/// Acknowledged writes lost: the distinct ids invariant 1 violations name.
fn lost_writes(violations: &[Violation]) -> u64 {
    let ids: std::collections::BTreeSet<u64> = violations.iter().filter_map(Violation::lost_write).collect();
    ids.len() as u64
}

/// The totals of a crash-point sweep.
#[derive(Clone, Debug, Default)]
pub struct SweepTotals {
    /// Points enumerated (every boundary, reachable or not, x k x lost/torn).
    pub total: u64,
    /// Points the node actually died at.
    pub covered: u64,
    /// Simulation runs (one per reachable point).
    pub runs: u64,
    /// Acknowledged writes lost, summed over the runs.
    pub lost: u64,
    /// Invariant violations, summed over the runs.
    pub violations: u64,
    /// Runs with a violation: `(label, violations)`.
    pub failures: Vec<(String, Vec<String>)>,
    /// Points not reached: labels.
    pub missed: Vec<String>,
    /// Runs with rename errors (leader/ship#k, then the node's renames fail).
    pub rename_runs: u64,
    /// Renames that failed in them.
    pub renames_failed: u64,
}

impl SweepTotals {
    /// The summary line: `crash-points: <covered>/<total> points, <runs> runs, <lost> acknowledged
    /// writes lost`, and the violations.
    pub fn line(&self) -> String {
        format!(
            "crash-points: {}/{} points, {} runs, {} acknowledged writes lost, {} violations (rename errors: {} runs, {} renames failed)",
            self.covered, self.total, self.runs, self.lost, self.violations, self.rename_runs, self.renames_failed
        )
    }
}

/// What a crash-point sweep keeps of one run. A child process of `tidal-sim --crash-sweep --jobs J`
/// prints it as one JSON line.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct PointRun {
    /// [`Outcome::summary`].
    pub summary: String,
    /// [`Outcome::crash_point_fired`].
    pub crash_point_fired: Option<String>,
    /// [`Outcome::lost`].
    pub lost: u64,
    /// [`Outcome::violations`].
    pub violations: Vec<Violation>,
    /// [`Outcome::story`].
    pub story: Vec<String>,
    /// Renames the run's fault injection failed.
    pub renames_failed: u64,
}

impl PointRun {
    /// What the sweep keeps of `outcome`.
    pub fn of(outcome: &Outcome) -> PointRun {
        PointRun {
            summary: outcome.summary(),
            crash_point_fired: outcome.crash_point_fired.clone(),
            lost: outcome.lost,
            violations: outcome.violations.clone(),
            story: outcome.story.clone(),
            renames_failed: outcome.counters.0.get("rename_fail").copied().unwrap_or(0),
        }
    }
}

/// The runs of a crash-point sweep over `ks`, in a fixed order: every reachable point of
/// [`crashpoint::sweep`], then `leader/ship#k` once more per k with rename errors (the leader dies
/// after an fsync it never shipped, a suffix only it holds, comes back as a follower whose suffix
/// must go to quarantine, and its renames fail). An index into this list names a run.
pub fn crash_sweep_runs(ks: &[u64]) -> Vec<(crashpoint::CrashPoint, bool)> {
    let mut runs: Vec<(crashpoint::CrashPoint, bool)> = crashpoint::sweep(ks)
        .into_iter()
        .filter(|point| point.boundary.op.is_some())
        .map(|point| (point, false))
        .collect();
    let ship = crashpoint::BOUNDARIES.iter().find(|b| b.role == crashpoint::Role::Leader && b.name == "ship");
    for &k in ks {
        if let Some(boundary) = ship {
            runs.push((
                crashpoint::CrashPoint { boundary: *boundary, k, mode: CrashMode::LoseUnsynced },
                true,
            ));
        }
    }
    runs
}

/// Run `index` of [`crash_sweep_runs`]`(ks)` with `seed`, in this process.
pub fn crash_point_run(seed: u64, ks: &[u64], index: usize) -> anyhow::Result<PointRun> {
    let runs = crash_sweep_runs(ks);
    let (point, rename_errors) =
        runs.get(index).ok_or_else(|| anyhow::anyhow!("the sweep over ks {ks:?} has no run {index}"))?;
    let scenario =
        Scenario { crash_point: Some(*point), rename_errors: *rename_errors, ..Scenario::crash_points() };
    Ok(PointRun::of(&run(seed, &scenario)?))
}

/// The crash-point sweep: for every point of [`crashpoint::sweep`]`(ks)`, one run of
/// [`Scenario::crash_points`] (seed `seed`) with the node killed at that point, restarted, and every
/// invariant checked. `progress` gets one line per run. `jobs` runs at once, as threads of this
/// process ([`crash_sweep_with`] takes the runner: `tidal-sim` runs each in a child process).
pub fn crash_sweep(
    seed: u64,
    ks: &[u64],
    jobs: usize,
    progress: &(dyn Fn(&str) + Sync),
) -> anyhow::Result<SweepTotals> {
    crash_sweep_with(ks, jobs, progress, &|index| crash_point_run(seed, ks, index))
}

/// [`crash_sweep`] with `run_point(i)` running run `i` of [`crash_sweep_runs`]`(ks)`.
pub fn crash_sweep_with(
    ks: &[u64],
    jobs: usize,
    progress: &(dyn Fn(&str) + Sync),
    run_point: &(dyn Fn(usize) -> anyhow::Result<PointRun> + Sync),
) -> anyhow::Result<SweepTotals> {
    let points = crashpoint::sweep(ks);
    let mut totals = SweepTotals { total: points.len() as u64, ..SweepTotals::default() };
    let runnable = crash_sweep_runs(ks);
    for point in points.iter().filter(|point| point.boundary.op.is_none()) {
        totals.missed.push(format!("{} (not reachable in the simulation)", point.label()));
    }
    let next = AtomicU64::new(0);
    #[allow(clippy::type_complexity)]
    let results: std::sync::Mutex<Vec<(crashpoint::CrashPoint, bool, String, anyhow::Result<PointRun>)>> =
        std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            scope.spawn(|| loop {
                let index = usize::try_from(next.fetch_add(1, Ordering::SeqCst)).unwrap_or(usize::MAX);
                let Some((point, rename_errors)) = runnable.get(index) else { return };
                // The run's index: `tidal-sim --crash-sweep --ks .. --point I --report-json` replays it.
                let label =
                    format!("{index:>3} {}{}", point.label(), if *rename_errors { "+rename" } else { "" });
                let outcome = run_point(index);
                match &outcome {
                    Ok(outcome) => {
                        progress(&format!(
                            "{:<32} {} | died: {} | lost {}",
                            label,
                            outcome.summary,
                            outcome.crash_point_fired.as_deref().unwrap_or("NOT REACHED"),
                            outcome.lost
                        ));
                        // `TIDAL_SIM_STORY=1`: what the driver did in each run.
                        if std::env::var_os("TIDAL_SIM_STORY").is_some() {
                            progress(&format!("    {}", outcome.story.join("\n    ")));
                        }
                    }
                    Err(error) => progress(&format!("{label:<32} error: {error:#}")),
                }
                results.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((
                    *point,
                    *rename_errors,
                    label,
                    outcome,
                ));
            });
        }
    });
    let results = results.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
    for (point, rename_errors, label, outcome) in results {
        let outcome = outcome?;
        totals.runs += 1;
        totals.lost += outcome.lost;
        totals.violations += outcome.violations.len() as u64;
        if rename_errors {
            totals.rename_runs += 1;
            totals.renames_failed += outcome.renames_failed;
        } else if outcome.crash_point_fired.is_some() {
            totals.covered += 1;
        } else {
            totals.missed.push(point.label());
        }
        if !outcome.violations.is_empty() {
            let mut lines: Vec<String> = outcome.violations.iter().map(Violation::to_string).collect();
            lines.extend(outcome.story.iter().map(|line| format!("trace: {line}")));
            totals.failures.push((label, lines));
        }
    }
    totals.missed.sort();
    totals.failures.sort();
    Ok(totals)
}
