//! [`Report`]: what each fault did to availability and whether anything acknowledged was lost,
//! per fault and summed per class, and the machine-readable last line.

use crate::fault::FaultClass;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// What one fault did.
#[derive(Clone, Debug)]
pub struct FaultRecord {
    pub class: FaultClass,
    /// What it did to which nodes ("leader n2 isolated").
    pub targets: String,
    /// Writes acknowledged between the fault's start and its heal.
    pub acks_during: usize,
    /// Longest time without an acknowledgement from the fault's start until the cluster caught up.
    pub longest_gap: Duration,
    /// Heal → one leader named by all and every node applied every write acknowledged by the heal.
    pub heal_to_caught_up: Option<Duration>,
    /// Heal → equal digests on every node (writes paused for the comparison).
    pub heal_to_digests_equal: Option<Duration>,
    /// Writes acknowledged since the previous check that some node did not return.
    pub lost: usize,
}

/// The whole run.
#[derive(Debug, Default)]
pub struct Report {
    pub faults: Vec<FaultRecord>,
    pub violations: Vec<String>,
    pub acked: usize,
    pub unknown: u64,
    /// Acknowledged writes missing on some node in the final check (all writes, all nodes).
    pub lost_final: usize,
    pub final_digest: Option<String>,
}

/// The longest stretch of `[from, to]` without an acknowledgement at `times` (sorted or not).
pub fn longest_gap(times: &[Instant], from: Instant, to: Instant) -> Duration {
    let mut inside: Vec<Instant> = times.iter().copied().filter(|at| (from..=to).contains(at)).collect();
    inside.sort();
    let mut previous = from;
    let mut longest = Duration::ZERO;
    for at in inside.into_iter().chain(std::iter::once(to)) {
        longest = longest.max(at.saturating_duration_since(previous));
        previous = at;
    }
    longest
}

fn seconds(duration: Option<Duration>) -> String {
    duration.map_or_else(|| "never".to_string(), |d| format!("{:.1}s", d.as_secs_f64()))
}

impl Report {
    /// Acknowledged writes lost: the larger of the per-fault checks' sum and the final check.
    pub fn lost(&self) -> usize {
        self.lost_final.max(self.faults.iter().map(|fault| fault.lost).sum())
    }

    /// The per-class table, the violations, and the last line:
    /// `netchaos: <runs> runs, <faults> faults, <lost> acknowledged writes lost, <violations> violations`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<20} {:>6} {:>12} {:>14} {:>16} {:>18} {:>6}",
            "class", "faults", "acks during", "longest gap", "heal→caught up", "heal→digests equal", "lost"
        );
        let mut by_class: BTreeMap<FaultClass, Vec<&FaultRecord>> = BTreeMap::new();
        for fault in &self.faults {
            by_class.entry(fault.class).or_default().push(fault);
        }
        for (class, faults) in &by_class {
            let worst = |pick: fn(&FaultRecord) -> Option<Duration>| {
                faults
                    .iter()
                    .map(|fault| pick(fault))
                    .try_fold(Duration::ZERO, |worst, d| d.map(|d| worst.max(d)))
            };
            let _ = writeln!(
                out,
                "{:<20} {:>6} {:>12} {:>14} {:>16} {:>18} {:>6}",
                class.name(),
                faults.len(),
                faults.iter().map(|fault| fault.acks_during).sum::<usize>(),
                seconds(worst(|fault| Some(fault.longest_gap))),
                seconds(worst(|fault| fault.heal_to_caught_up)),
                seconds(worst(|fault| fault.heal_to_digests_equal)),
                faults.iter().map(|fault| fault.lost).sum::<usize>(),
            );
        }
        let _ = writeln!(out, "(gaps and heal times: the worst of the class's faults)");
        let _ = writeln!(
            out,
            "writes: {} acknowledged, {} abandoned with an unknown outcome; final digest {}",
            self.acked,
            self.unknown,
            self.final_digest.as_deref().unwrap_or("none (no convergence)")
        );
        for violation in &self.violations {
            let _ = writeln!(out, "VIOLATION: {violation}");
        }
        let _ = write!(
            out,
            "netchaos: 1 runs, {} faults, {} acknowledged writes lost, {} violations",
            self.faults.len(),
            self.lost(),
            self.violations.len()
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_gap_counts_the_edges_of_the_window() {
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let times = [at(100), at(150), at(900), at(5000)];
        // 150 → 900 inside; 900 → the window's end (1000) is shorter; 5000 is outside.
        assert_eq!(longest_gap(&times, at(0), at(1000)), Duration::from_millis(750));
        // No acknowledgement at all: the whole window.
        assert_eq!(longest_gap(&[], at(0), at(1000)), Duration::from_millis(1000));
    }

    #[test]
    fn the_last_line_is_machine_readable() {
        let report = Report { violations: vec!["x".into()], lost_final: 3, ..Report::default() };
        let rendered = report.render();
        assert_eq!(
            rendered.lines().last(),
            Some("netchaos: 1 runs, 0 faults, 3 acknowledged writes lost, 1 violations")
        );
    }
}
