//! Tidal's simulation harness (issue 5, first slice): a [`SimulatedCluster`] of real nodes
//! (`tidal_server::run_on`: HTTP, tonic replication, openraft, the WAL, fjall) as turmoil hosts,
//! a workload client host, seeded faults (swarm: classes and rates drawn per seed), and invariant
//! checks at the end of every run. Everything a run does follows from `(seed, scenario)`, up to the
//! nondeterminism of the node's real threads (docs/decisions/008-simulation.md).
//!
//! - `net`: the transport seams over turmoil TCP; `http`: a small HTTP/1 client over it.
//! - `faults`: the seeded fault plan and its counters; `workload`: the client host.
//! - `check`: WAL checks over each node's simulated file system.

pub mod check;
pub mod faults;
pub mod http;
pub mod net;
pub mod rng;
pub mod workload;

use faults::{Classes, Counters, Fault, Plan};
use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tidal_cluster::{ClusterSpec, ControlTiming, Durability, NodeSpec};
use tidal_server::config::{ClusterMembership, NodeIo, ServeArgs, ServeConfig};
use tidal_types::NodeId;
use tidal_wal::SimIo;
use workload::{Phase, Shared, Workload};

/// Logged time of the simulation's epoch (2025-01-01T00:00:00Z), so the fold sees fixed times.
const EPOCH_MS: u64 = 1_735_689_600_000;

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
    pub classes: Classes,
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
            classes: Classes { network: false, crashes: false },
        };
        vec![
            base.clone(),
            Scenario {
                name: "network",
                classes: Classes { network: true, crashes: false },
                load: Duration::from_secs(8),
                ..base.clone()
            },
            Scenario {
                name: "crash",
                classes: Classes { network: false, crashes: true },
                load: Duration::from_secs(8),
                ..base.clone()
            },
            Scenario {
                name: "chaos",
                classes: Classes { network: true, crashes: true },
                load: Duration::from_secs(10),
                ..base
            },
        ]
    }

    /// A scenario by name.
    pub fn named(name: &str) -> Option<Scenario> {
        Scenario::all().into_iter().find(|scenario| scenario.name == name)
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
    pub violations: Vec<String>,
    /// Faults injected, by class.
    pub counters: Counters,
    /// Hash of the run's trace (faults applied, acknowledgements, final digest).
    pub trace_hash: String,
    /// Hash of the fault plan drawn from the seed (the part of a run the seed alone fixes).
    pub plan_hash: String,
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
        )
    }
}

/// A clock the WAL writer thread reads: the simulation's elapsed time since [`EPOCH_MS`], set by
/// the driver before every step.
#[derive(Clone, Default)]
pub struct SimClock(Arc<AtomicU64>);

impl tidal_wal::Clock for SimClock {
    fn now_ms(&self) -> u64 {
        EPOCH_MS + self.0.load(Ordering::SeqCst)
    }
}

/// N real nodes as turmoil hosts `n1..nN`: each with its data dir (fjall) in a temp dir and its
/// WAL on its own [`SimIo`].
pub struct SimulatedCluster {
    /// The cluster spec every node shares.
    pub spec: ClusterSpec,
    /// Each node's WAL file system (survives the node's crashes, as a disk does).
    pub wal_io: Vec<SimIo>,
    /// Each node's data dir.
    pub data_dirs: Vec<PathBuf>,
    /// The WAL clock.
    pub clock: SimClock,
    _root: tempfile::TempDir,
}

impl SimulatedCluster {
    /// A cluster of `nodes` in `durability` mode (not started).
    pub fn new(nodes: usize, durability: Durability) -> anyhow::Result<SimulatedCluster> {
        let root = tempfile::Builder::new().prefix("tidal-sim-").tempdir()?;
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
        Ok(SimulatedCluster {
            spec,
            wal_io: (0..nodes).map(|_| SimIo::new()).collect(),
            data_dirs,
            clock: SimClock::default(),
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
        config.segment_bytes_max = 16 * 1024;
        config.checkpoint_interval_ms = 1000;
        config.read_wait_ms_max = 2000;
        config.io = NodeIo {
            wal_files: Arc::new(self.wal_io[index].clone()),
            wal_clock: Arc::new(self.clock.clone()),
            connector: net::connector(),
            forward_writes: false,
        };
        Ok(config)
    }

    /// Registers every node as a host of `sim`.
    pub fn register(&self, sim: &mut turmoil::Sim<'_>) -> anyhow::Result<()> {
        for index in 0..self.spec.nodes.len() {
            let config = self.config(index)?;
            sim.host(format!("n{}", index + 1), move || {
                let config = config.clone();
                async move {
                    let http = net::bind(net::HTTP_PORT).await?;
                    let rpc = net::bind(net::RPC_PORT).await?;
                    tidal_server::run_on(config, http, Some(rpc), std::future::pending())
                        .await
                        .map_err(|error| -> Box<dyn std::error::Error> { format!("{error:#}").into() })
                }
            });
        }
        Ok(())
    }
}

fn host_name(node: usize) -> String {
    format!("n{}", node + 1)
}

/// Undoes a fault (or part of one).
fn undo(sim: &mut turmoil::Sim<'_>, fault: &Fault, nodes: usize) {
    match *fault {
        Fault::Partition { a, b } => sim.repair(host_name(a), host_name(b)),
        Fault::OneWay { from, to } => sim.repair_oneway(host_name(from), host_name(to)),
        Fault::Hold { a, b } => sim.release(host_name(a), host_name(b)),
        Fault::Isolate { node } => {
            for other in (0..nodes).filter(|other| *other != node) {
                sim.repair(host_name(node), host_name(other));
            }
            sim.repair(host_name(node), "client");
        }
        Fault::Crash { node, .. } => {
            if !sim.is_host_running(host_name(node)) {
                sim.bounce(host_name(node));
            }
        }
    }
}

fn apply(sim: &mut turmoil::Sim<'_>, cluster: &SimulatedCluster, fault: &Fault, nodes: usize) {
    match *fault {
        Fault::Partition { a, b } => sim.partition(host_name(a), host_name(b)),
        Fault::OneWay { from, to } => sim.partition_oneway(host_name(from), host_name(to)),
        Fault::Hold { a, b } => sim.hold(host_name(a), host_name(b)),
        Fault::Isolate { node } => {
            for other in (0..nodes).filter(|other| *other != node) {
                sim.partition(host_name(node), host_name(other));
            }
            sim.partition(host_name(node), "client");
        }
        Fault::Crash { node, mode } => {
            // Power loss first (the WAL's unsynced bytes go, open handles die), then the process.
            cluster.wal_io[node].crash(mode);
            sim.crash(host_name(node));
        }
    }
}

/// Runs one seeded scenario and checks it.
pub fn run(seed: u64, scenario: &Scenario) -> anyhow::Result<Outcome> {
    let mut rng = rng::Rng::new(seed);
    let cluster = SimulatedCluster::new(scenario.nodes, scenario.durability)?;
    let plan = Plan::draw(&mut rng, scenario.classes, scenario.nodes, scenario.load);
    let limit = scenario.load + workload::CONVERGE_DEADLINE + Duration::from_secs(120);
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
    };
    sim.client("client", workload::run(workload, shared.clone()));
    let mut counters = Counters::default();
    if plan.fail_rate > 0.0 {
        counters.bump("flaky_links");
    }
    if plan.latency_max > Duration::from_millis(1) {
        counters.bump("latency");
    }
    let plan_hash = blake3::hash(format!("{plan:?}").as_bytes()).to_hex()[..16].to_string();
    let mut trace = vec![format!("plan {plan_hash}")];
    let mut pending = plan.windows.clone();
    pending.reverse();
    let mut active: Option<faults::Window> = None;
    let mut load_started: Option<Duration> = None;
    let mut violations = Vec::new();
    let mut healed = false;
    loop {
        let now = sim.elapsed();
        cluster.clock.0.store(u64::try_from(now.as_millis()).unwrap_or(u64::MAX), Ordering::SeqCst);
        let phase = shared.borrow().phase;
        match phase {
            Phase::Load => {
                // Fault times count from the first write, not from boot.
                let start = *load_started.get_or_insert(now);
                let offset = now - start;
                if let Some(window) = &active {
                    if offset >= window.at + window.length {
                        undo(&mut sim, &window.fault, scenario.nodes);
                        trace.push(format!("{} ms undo {:?}", offset.as_millis(), window.fault));
                        active = None;
                    }
                }
                if active.is_none() && pending.last().is_some_and(|window| offset >= window.at) {
                    if let Some(window) = pending.pop() {
                        apply(&mut sim, &cluster, &window.fault, scenario.nodes);
                        counters.bump(window.fault.class());
                        trace.push(format!("{} ms apply {:?}", offset.as_millis(), window.fault));
                        active = Some(window);
                    }
                }
            }
            Phase::HealRequested if !healed => {
                if let Some(window) = active.take() {
                    undo(&mut sim, &window.fault, scenario.nodes);
                }
                // Heal: every link whole again, no message loss, every node running.
                sim.set_fail_rate(0.0);
                for a in 0..scenario.nodes {
                    for b in 0..scenario.nodes {
                        if a != b {
                            sim.repair(host_name(a), host_name(b));
                            sim.release(host_name(a), host_name(b));
                        }
                    }
                    sim.repair(host_name(a), "client");
                    if !sim.is_host_running(host_name(a)) {
                        sim.bounce(host_name(a));
                    }
                }
                trace.push("heal".into());
                healed = true;
                shared.borrow_mut().phase = Phase::Healed;
            }
            _ => {}
        }
        match sim.step() {
            Ok(true) => break,
            Ok(false) => {}
            Err(error) => {
                violations.push(format!("simulation stopped: {error}"));
                break;
            }
        }
    }
    let simulated = sim.elapsed();
    drop(sim);
    // WAL checks over each node's simulated disk (the nodes are stopped: the sim is dropped).
    let mut logs = Vec::new();
    for (index, io) in cluster.wal_io.iter().enumerate() {
        logs.push(check::read_wal(io, &cluster.data_dirs[index].join("wal"), index, &mut violations));
    }
    let batches_compared = check::log_matching(&logs, &mut violations);
    let shared = Rc::try_unwrap(shared).map(RefCell::into_inner).unwrap_or_else(|rc| {
        let borrowed = rc.borrow();
        Shared {
            phase: borrowed.phase,
            acks: borrowed.acks.clone(),
            leaders: borrowed.leaders.clone(),
            violations: borrowed.violations.clone(),
            trace: borrowed.trace.clone(),
            stats: borrowed.stats.clone(),
            leader_guess: borrowed.leader_guess,
            next_id: borrowed.next_id,
            digest: borrowed.digest.clone(),
            converged_after_ms: borrowed.converged_after_ms,
        }
    });
    // Invariant 4 (observed): at most one leader per term.
    for (term, leaders) in &shared.leaders {
        if leaders.len() > 1 {
            violations.push(format!("invariant 4: term {term} had leaders {leaders:?}"));
        }
    }
    violations.extend(shared.violations.iter().cloned());
    let mut hasher = blake3::Hasher::new();
    for line in trace.iter().chain(shared.trace.iter()) {
        hasher.update(line.as_bytes());
        hasher.update(b"\n");
    }
    let trace_hash = hasher.finalize().to_hex()[..16].to_string();
    Ok(Outcome {
        seed,
        scenario: scenario.name,
        violations,
        counters,
        trace_hash,
        plan_hash,
        stats: shared.stats,
        simulated,
        converged_after_ms: shared.converged_after_ms,
        final_seqno: shared.digest.as_ref().map(|digest| digest.0),
        batches_compared,
        terms: shared.leaders.len(),
    })
}
