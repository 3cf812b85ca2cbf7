//! The fault classes, and the schedules that order them: one pass over every class (CI), or
//! classes and hold times drawn from a seed (soak).
//!
//! A fault names its targets by role (the leader, "a follower"), resolved when it starts, so a
//! seed replays the same schedule on whatever node happens to lead.

use std::time::Duration;

/// One kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultClass {
    /// The leader's link goes down: it is cut from both followers and from the clients.
    IsolateLeader,
    /// One follower's link goes down.
    IsolateFollower,
    /// The leader and one follower cannot reach each other; the other follower reaches both (it
    /// is the bridge).
    CutLeaderFollower,
    /// The two followers cannot reach each other; the leader reaches both (it is the bridge).
    BridgeLeader,
    /// Every packet from the leader to one follower is dropped; the other direction works.
    OneWayCut,
    /// 40 % of the packets from the leader to each follower are dropped; the other direction works.
    AsymmetricLoss,
    /// Every node's outbound packets are delayed (netem, or a starved link without netem).
    Latency,
    /// The leader's link goes down and up, again and again, for the whole hold.
    FlappingLink,
    /// The leader is SIGKILLed and restarted on its data dir at heal.
    SigkillRestart,
    /// The leader is SIGSTOPped and SIGCONTed at heal.
    SigstopSigcont,
}

impl FaultClass {
    pub const ALL: [FaultClass; 10] = [
        FaultClass::IsolateLeader,
        FaultClass::IsolateFollower,
        FaultClass::CutLeaderFollower,
        FaultClass::BridgeLeader,
        FaultClass::OneWayCut,
        FaultClass::AsymmetricLoss,
        FaultClass::Latency,
        FaultClass::FlappingLink,
        FaultClass::SigkillRestart,
        FaultClass::SigstopSigcont,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultClass::IsolateLeader => "isolate-leader",
            FaultClass::IsolateFollower => "isolate-follower",
            FaultClass::CutLeaderFollower => "cut-leader-follower",
            FaultClass::BridgeLeader => "bridge-leader",
            FaultClass::OneWayCut => "one-way-cut",
            FaultClass::AsymmetricLoss => "asymmetric-loss",
            FaultClass::Latency => "latency",
            FaultClass::FlappingLink => "flapping-link",
            FaultClass::SigkillRestart => "sigkill-restart",
            FaultClass::SigstopSigcont => "sigstop-sigcont",
        }
    }

    pub fn parse(name: &str) -> Option<FaultClass> {
        FaultClass::ALL.into_iter().find(|class| class.name() == name)
    }
}

/// One fault to apply: its class, how long it lasts, and which follower it picks (0 or 1) where
/// it picks one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Planned {
    pub class: FaultClass,
    pub hold: Duration,
    pub follower: usize,
}

/// The order of faults in a run.
pub enum Schedule {
    /// Each of `classes` once, in order, each held `hold`.
    Pass { classes: Vec<FaultClass>, hold: Duration, next: usize },
    /// Classes drawn from `classes`, holds from `hold_range` (seconds), from a seeded generator.
    Random { classes: Vec<FaultClass>, hold_range: (u64, u64), rng: SplitMix64 },
}

impl Schedule {
    pub fn next(&mut self) -> Option<Planned> {
        match self {
            Schedule::Pass { classes, hold, next } => {
                let class = *classes.get(*next)?;
                *next += 1;
                Some(Planned { class, hold: *hold, follower: 0 })
            }
            Schedule::Random { classes, hold_range: (low, high), rng } => {
                let class = classes[rng.below(classes.len() as u64) as usize];
                let hold = Duration::from_secs(*low + rng.below(*high - *low + 1));
                let follower = rng.below(2) as usize;
                Some(Planned { class, hold, follower })
            }
        }
    }
}

/// SplitMix64: a tiny, well-mixed generator whose sequence depends only on its seed, so a seed
/// printed by a soak run replays its schedule.
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..bound` (`bound` > 0; the modulo bias is irrelevant at these sizes).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_name_parses_back() {
        for class in FaultClass::ALL {
            assert_eq!(FaultClass::parse(class.name()), Some(class));
        }
        assert_eq!(FaultClass::parse("nonsense"), None);
    }

    #[test]
    fn a_seed_replays_the_same_random_schedule() {
        let schedule = |seed| {
            let mut schedule = Schedule::Random {
                classes: FaultClass::ALL.to_vec(),
                hold_range: (3, 15),
                rng: SplitMix64(seed),
            };
            (0..50).filter_map(|_| schedule.next()).collect::<Vec<_>>()
        };
        assert_eq!(schedule(7), schedule(7));
        assert_ne!(schedule(7), schedule(8));
        assert!(schedule(7).iter().all(|planned| (3..=15).contains(&planned.hold.as_secs())));
    }

    #[test]
    fn a_pass_applies_each_class_once_in_order() {
        let mut schedule =
            Schedule::Pass { classes: FaultClass::ALL.to_vec(), hold: Duration::from_secs(5), next: 0 };
        let classes: Vec<_> = std::iter::from_fn(|| schedule.next()).map(|planned| planned.class).collect();
        assert_eq!(classes, FaultClass::ALL.to_vec());
    }
}
