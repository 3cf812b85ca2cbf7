//! One run: the network, the cluster, the writers, the schedule of faults, each fault healed and
//! checked (caught up, digests equal, its acknowledged writes on every node), then the final
//! check of every acknowledged write on every node.

use crate::cluster::{Converged, NetCluster};
use crate::fault::{FaultClass, Planned, Schedule};
use crate::load::{Ack, Load};
use crate::report::{longest_gap, FaultRecord, Report};
use crate::topology::Topology;
use anyhow::Context;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// Polls `$check` (an expression awaiting a `Result<T, String>` from the cluster) until it is Ok
/// or [`DEADLINE`] passes; stops early if a node exited on its own. Evaluates to `Result<T, String>`.
macro_rules! poll_until {
    ($run:expr, $check:expr) => {{
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Err(why) = $run.alive() {
                break Err(why);
            }
            match $check {
                Ok(value) => break Ok(value),
                Err(why) if Instant::now() > deadline => break Err(why),
                Err(_) => tokio::time::sleep(POLL).await,
            }
        }
    }};
}

/// Longest wait for a leader, for catching up, for equal digests.
const DEADLINE: Duration = Duration::from_secs(90);
/// Polling step of those waits (each re-checks observable state; nothing waits blindly).
const POLL: Duration = Duration::from_millis(100);
/// Reads in flight at once when checking acknowledged writes.
const READS_IN_FLIGHT: usize = 32;
/// How a flapping link flaps: down this long, then up this long, until the hold ends.
const FLAP_DOWN: Duration = Duration::from_millis(800);
const FLAP_UP: Duration = Duration::from_millis(1200);
/// Loss rate of the asymmetric-loss fault.
const ASYMMETRIC_LOSS_PERCENT: u32 = 40;
/// Nodes in the cluster.
pub const NODES: u64 = 3;

/// What a run does.
pub struct Options {
    pub binary: PathBuf,
    pub root: PathBuf,
    pub writers: usize,
    pub schedule: Schedule,
    /// Stop drawing faults after this long (soak); a pass ends when its classes are done.
    pub budget: Option<Duration>,
}

/// The network, the cluster and the load of one run, and what it found.
struct Run {
    // Fields drop in order: the nodes are killed before their namespaces go.
    cluster: NetCluster,
    topology: Topology,
    load: Arc<Load>,
    report: Report,
    /// Acknowledged writes up to this index of the ledger were already checked on every node.
    checked: usize,
    /// When the writers started (fault lines give their offset from it, to match the node logs).
    started: Instant,
}

/// Runs the whole thing and returns the report (violations included). An `Err` is a harness
/// failure (a command that failed, a node that could not start), not a finding.
pub async fn run(options: Options) -> anyhow::Result<Report> {
    let topology = Topology::create(NODES)?;
    println!(
        "network: {} nodes in namespaces {}..{}, subnet {}, latency by {:?}",
        NODES,
        topology.namespace(1),
        topology.namespace(NODES),
        topology.subnet(),
        topology.latency_kind()
    );
    let cluster = NetCluster::start(&options.binary, &options.root, &topology, NODES)?;
    let bases: Vec<String> = cluster
        .ids()
        .iter()
        .map(|id| cluster.client(*id).map(|c| c.base().to_string()))
        .collect::<Result<_, _>>()?;
    let mut run = Run {
        topology,
        cluster,
        load: Load::new(&bases, &std::process::id().to_string()),
        report: Report::default(),
        checked: 0,
        started: Instant::now(),
    };
    let leader =
        poll_until!(run, run.cluster.check_leader().await).map_err(|why| run.failed("leader", why))?;
    println!("cluster: leader n{leader}; {} writers", options.writers);
    let writers = run.load.spawn(options.writers);
    run.started = Instant::now();
    let started = run.started;
    let mut schedule = options.schedule;
    let mut number = 0;
    while let Some(planned) = schedule.next() {
        if options.budget.is_some_and(|budget| started.elapsed() >= budget) {
            break;
        }
        number += 1;
        if !run.fault(number, planned).await? {
            break;
        }
    }
    run.load.stop();
    for writer in writers {
        writer.await.context("writer task")?;
    }
    run.finish().await?;
    Ok(run.report)
}

impl Run {
    /// Applies, holds and heals one fault, then checks the cluster; false if it did not recover
    /// (the run stops there: later faults would measure nothing).
    async fn fault(&mut self, number: usize, planned: Planned) -> anyhow::Result<bool> {
        let leader =
            poll_until!(self, self.cluster.check_leader().await).map_err(|why| self.failed("leader", why))?;
        let followers: Vec<u64> = self.cluster.ids().into_iter().filter(|id| *id != leader).collect();
        let follower = followers[planned.follower % followers.len()];
        let other = followers[(planned.follower + 1) % followers.len()];
        let injected = Instant::now();
        let targets = self.inject(planned, leader, follower, other).await?;
        let healed = Instant::now();
        let acks = self.load.acks();
        let acked_max = acks.iter().map(|ack| ack.seqno).max().unwrap_or(0);
        let acks_during = acks.iter().filter(|ack| (injected..=healed).contains(&ack.at)).count();
        let caught_up = poll_until!(self, self.cluster.check_caught_up(acked_max).await);
        let caught_up_at = Instant::now();
        let converged = match &caught_up {
            Ok(_) => self.converge().await,
            Err(why) => Err(why.clone()),
        };
        let times: Vec<Instant> = self.load.acks().iter().map(|ack| ack.at).collect();
        let mut record = FaultRecord {
            class: planned.class,
            targets,
            acks_during,
            longest_gap: longest_gap(&times, injected, caught_up_at),
            heal_to_caught_up: caught_up.is_ok().then(|| caught_up_at - healed),
            heal_to_digests_equal: converged.as_ref().ok().map(|(_, at)| *at - healed),
            lost: 0,
        };
        let recovered = match &converged {
            Ok(_) => {
                record.lost = self.check_acks_since_last_check().await?;
                true
            }
            Err(why) => {
                self.report.violations.push(format!(
                    "fault {number} ({}: {}): no convergence within {DEADLINE:?} of the heal: {why}\n{}{}{}",
                    planned.class.name(),
                    record.targets,
                    self.cluster.status_lines().await,
                    self.cluster.dump_lagging_stacks().await,
                    self.cluster.log_tails()
                ));
                false
            }
        };
        println!(
            "[{number}] +{:.0}s {} ({}) hold {}s: {} acks during, longest gap {:.1}s, heal→caught up {}, heal→digests equal {}, lost {}",
            injected.duration_since(self.started).as_secs_f64(),
            planned.class.name(),
            record.targets,
            planned.hold.as_secs(),
            record.acks_during,
            record.longest_gap.as_secs_f64(),
            record.heal_to_caught_up.map_or("never".into(), |d| format!("{:.1}s", d.as_secs_f64())),
            record.heal_to_digests_equal.map_or("never".into(), |d| format!("{:.1}s", d.as_secs_f64())),
            record.lost
        );
        self.report.faults.push(record);
        Ok(recovered)
    }

    /// Applies `planned` (targets by role), holds it, heals everything; returns what it did.
    async fn inject(
        &self,
        planned: Planned,
        leader: u64,
        follower: u64,
        other: u64,
    ) -> anyhow::Result<String> {
        let (topology, cluster) = (&self.topology, &self.cluster);
        let dropped_before = self.dropped_packets()?;
        let targets = match planned.class {
            FaultClass::IsolateLeader => {
                topology.link_down(leader)?;
                format!("leader n{leader} isolated")
            }
            FaultClass::IsolateFollower => {
                topology.link_down(follower)?;
                format!("follower n{follower} isolated")
            }
            FaultClass::CutLeaderFollower => {
                topology.cut(leader, follower)?;
                format!("leader n{leader} ⟷ n{follower} cut; n{other} bridges")
            }
            FaultClass::BridgeLeader => {
                topology.cut(follower, other)?;
                format!("n{follower} ⟷ n{other} cut; leader n{leader} bridges")
            }
            FaultClass::OneWayCut => {
                topology.drop_packets(leader, follower, 100)?;
                format!("leader n{leader} → n{follower} dropped, reverse open")
            }
            FaultClass::AsymmetricLoss => {
                topology.drop_packets(leader, follower, ASYMMETRIC_LOSS_PERCENT)?;
                topology.drop_packets(leader, other, ASYMMETRIC_LOSS_PERCENT)?;
                format!("{ASYMMETRIC_LOSS_PERCENT}% of leader n{leader} → followers dropped, reverse open")
            }
            FaultClass::Latency => {
                for id in cluster.ids() {
                    topology.add_latency(id)?;
                }
                format!("every node's egress delayed ({:?}), leader n{leader}", topology.latency_kind())
            }
            FaultClass::FlappingLink => format!("leader n{leader}'s link flapping"),
            FaultClass::SigkillRestart => {
                cluster.kill(leader)?;
                format!("leader n{leader} SIGKILLed, restarted at heal")
            }
            FaultClass::SigstopSigcont => {
                cluster.signal(leader, "STOP")?;
                format!("leader n{leader} SIGSTOPped, SIGCONTed at heal")
            }
        };
        self.hold(planned, leader).await?;
        let dropped = self.dropped_packets()? - dropped_before;
        let targets =
            if dropped > 0 { format!("{targets}; {dropped} packets dropped by tc") } else { targets };
        match planned.class {
            FaultClass::SigkillRestart => cluster.restart(leader)?,
            FaultClass::SigstopSigcont => cluster.signal(leader, "CONT")?,
            _ => {}
        }
        for id in cluster.ids() {
            topology.heal(id)?;
        }
        Ok(targets)
    }

    /// Packets every node's drop class has dropped so far.
    fn dropped_packets(&self) -> anyhow::Result<u64> {
        self.cluster.ids().into_iter().map(|id| self.topology.dropped_packets(id)).sum()
    }

    /// Lets the fault last its hold (this is the experiment's schedule, not a synchronization);
    /// a flapping link flaps meanwhile.
    async fn hold(&self, planned: Planned, leader: u64) -> anyhow::Result<()> {
        let until = Instant::now() + planned.hold;
        if planned.class != FaultClass::FlappingLink {
            tokio::time::sleep_until(until.into()).await;
            return Ok(());
        }
        while Instant::now() < until {
            self.topology.link_down(leader)?;
            tokio::time::sleep(FLAP_DOWN).await;
            self.topology.link_up(leader)?;
            tokio::time::sleep(FLAP_UP).await;
        }
        Ok(())
    }

    /// With the writers paused: waits for equal digests; the converged state and when.
    async fn converge(&self) -> Result<(Converged, Instant), String> {
        let _paused = self.load.pause().await;
        let converged = poll_until!(self, self.cluster.check_converged().await)?;
        Ok((converged, Instant::now()))
    }

    /// After the last fault: writers stopped, every node converged on one digest, and every write
    /// ever acknowledged read back from every node.
    async fn finish(&mut self) -> anyhow::Result<()> {
        for id in self.cluster.ids() {
            self.topology.heal(id)?;
        }
        let acks = self.load.acks();
        self.report.acked = acks.len();
        self.report.unknown = self.load.unknown();
        match poll_until!(self, self.cluster.check_converged().await) {
            Ok(converged) => {
                println!(
                    "final: converged at seqno {} on leader n{}, digest {}",
                    converged.seqno, converged.leader, converged.digest
                );
                self.report.final_digest = Some(converged.digest);
                self.report.lost_final = self.check_acks(&acks, "final check").await?;
            }
            Err(why) => {
                self.report.violations.push(format!(
                    "final: no convergence within {DEADLINE:?}: {why}\n{}{}{}",
                    self.cluster.status_lines().await,
                    self.cluster.dump_lagging_stacks().await,
                    self.cluster.log_tails()
                ));
                // Still read everything back: which node lacks what tells a stuck applier from a
                // lost write. Not counted as lost (the cluster never converged to judge it).
                self.check_acks(&acks, "final check without convergence").await?;
            }
        }
        Ok(())
    }

    /// Checks the writes acknowledged since the previous check on every node; how many are lost.
    async fn check_acks_since_last_check(&mut self) -> anyhow::Result<usize> {
        let acks = self.load.acks();
        let fresh = acks[self.checked.min(acks.len())..].to_vec();
        self.checked = acks.len();
        self.check_acks(&fresh, "after heal").await
    }

    /// Reads every write in `acks` back from every node; each one missing or changed is a
    /// violation (listed, up to a few) and counts once as lost.
    async fn check_acks(&mut self, acks: &[Ack], when: &str) -> anyhow::Result<usize> {
        let mut failures = Vec::new();
        let ids = self.cluster.ids();
        let mut reads = JoinSet::new();
        let mut pending = acks.iter().copied();
        loop {
            while reads.len() < READS_IN_FLIGHT {
                let Some(ack) = pending.next() else { break };
                for id in &ids {
                    let client = self.cluster.client(*id)?.clone();
                    reads.spawn(read_back(client, *id, ack));
                }
            }
            let Some(outcome) = reads.join_next().await else { break };
            if let Err(failure) = outcome.context("read task")? {
                failures.push(failure);
            }
        }
        let mut lost: Vec<u64> = failures.iter().map(|(item, _, _)| *item).collect();
        lost.sort_unstable();
        lost.dedup();
        if !lost.is_empty() {
            let per_node: Vec<String> = ids
                .iter()
                .map(|id| format!("n{id}: {}", failures.iter().filter(|(_, node, _)| node == id).count()))
                .collect();
            let examples: Vec<&str> = failures.iter().take(5).map(|(_, _, why)| why.as_str()).collect();
            self.report.violations.push(format!(
                "{when}: {} of {} acknowledged writes missing or changed on some node ({}), e.g. {}",
                lost.len(),
                acks.len(),
                per_node.join(", "),
                examples.join("; ")
            ));
        }
        Ok(lost.len())
    }

    /// `check_alive` for the polling loop: a node that exited on its own ends the wait.
    fn alive(&self) -> Result<(), String> {
        self.cluster.check_alive().map_err(|e| format!("{e:#}"))
    }

    /// A failed wait as a harness error naming `what` and quoting the logs.
    fn failed(&self, what: &str, why: String) -> anyhow::Error {
        anyhow::anyhow!("no {what} within {DEADLINE:?}: {why}\n{}", self.cluster.log_tails())
    }
}

/// Reads item `ack.id` from node `id`: Ok if it holds the acknowledged write, else (item id,
/// node id, why). A read that fails in transport is retried a few times before it counts.
async fn read_back(client: tidal_client::Client, id: u64, ack: Ack) -> Result<(), (u64, u64, String)> {
    let mut last = String::new();
    for _ in 0..5 {
        match client.get_item(ack.id).await {
            Ok(item) if item.seqno == ack.seqno => return Ok(()),
            Ok(item) => {
                let why =
                    format!("n{id}: item {} at seqno {} (acknowledged at {})", ack.id, item.seqno, ack.seqno);
                return Err((ack.id, id, why));
            }
            Err(tidal_client::Error::Api { status: 404, .. }) => {
                let why = format!("n{id}: item {} (acknowledged at seqno {}) not found", ack.id, ack.seqno);
                return Err((ack.id, id, why));
            }
            Err(e) => last = format!("{e}"),
        }
    }
    Err((ack.id, id, format!("n{id}: item {} unreadable: {last}", ack.id)))
}
