//! Faults drawn from the seed (swarm testing: each seed enables a random subset of the fault
//! classes with random rates), applied by the driver between simulation steps.

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

/// Which classes a scenario may draw from.
#[derive(Clone, Copy, Debug)]
pub struct Classes {
    /// Network faults (partitions, one-way, hold, isolate, latency, broken links).
    pub network: bool,
    /// Process crashes with WAL loss.
    pub crashes: bool,
}

impl Plan {
    /// Draws the plan of a seed for a load phase of `load` and `nodes` nodes.
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
        if self.0.is_empty() {
            return formatter.write_str("none");
        }
        let parts: Vec<String> = self.0.iter().map(|(class, count)| format!("{class}={count}")).collect();
        formatter.write_str(&parts.join(" "))
    }
}
