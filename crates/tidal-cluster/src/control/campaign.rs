//! A fresh election timeout for every campaign (decisions/012).
//!
//! openraft 0.9 draws a node's election timeout ONCE, when the `Raft` starts (0.10 resamples it per
//! election), and checks it only on its tick (every 1.5 heartbeat intervals). Voters whose timeouts
//! round up to the same tick campaign in the same term, split the vote, and do it again every round:
//! each candidate's timer restarts at its own vote, and the timeouts never change. The simulation
//! found three nodes doing that for 30 simulated seconds (chaos seeds 59 and 140: every node starts
//! at the same instant, so the ticks are in phase; on real machines it needs the ticks within a
//! vote's round trip, rarer but not excluded).
//!
//! So each time this node starts a campaign it pauses its own elections (`runtime_config().elect`)
//! for `election_max + r`, r drawn per campaign below `election_max - election_min`. The pause is
//! longer than any timeout openraft drew, so a campaign that fails is retried after the fresh draw,
//! as in standard Raft. A campaign that wins is not slowed (a leader does not look at the switch),
//! and the pause ends before a follower's own timer could fire (`leader_lease + election_min`), so a
//! later failover is not delayed either. Votes are not affected: the switch only gates this node's
//! own timer.

use super::{ControlTiming, TypeConfig};
use openraft::{Raft, ServerState};
use std::time::Duration;

/// How long elections pause when this node starts a campaign: `election_max` plus `draw` reduced
/// below the spread of the timeouts (at most `election_min`, so the pause ends before a follower's
/// earliest timer, `leader_lease (= election_max) + election_min`).
pub fn campaign_pause(timing: ControlTiming, draw: u64) -> Duration {
    let spread = (timing.election_max - timing.election_min).min(timing.election_min);
    let spread_ms = u64::try_from(spread.as_millis()).unwrap_or(u64::MAX).max(1);
    timing.election_max + Duration::from_millis(draw % spread_ms)
}

/// A random draw, from the source openraft draws its timeouts from (seeded in the simulation).
fn draw() -> u64 {
    rand::RngCore::next_u64(&mut super::runtime::ControlRng)
}

/// Watches this node's campaigns and pauses its elections after each start (see the module doc).
/// Ends when openraft shuts down (its metrics channel closes).
pub async fn spread_campaigns(raft: Raft<TypeConfig>, timing: ControlTiming) {
    let mut metrics = raft.metrics();
    let mut last_campaign = None;
    let mut resume: Option<tokio::time::Instant> = None;
    loop {
        let (state, term) = {
            let m = metrics.borrow_and_update();
            (m.state, m.current_term)
        };
        if state == ServerState::Candidate && last_campaign != Some(term) {
            last_campaign = Some(term);
            let pause = campaign_pause(timing, draw());
            tracing::debug!(
                term,
                pause_ms = pause.as_millis() as u64,
                "campaign started: next one after a fresh timeout"
            );
            raft.runtime_config().elect(false);
            resume = Some(tokio::time::Instant::now() + pause);
        }
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { return },
            () = async {
                match resume {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {
                raft.runtime_config().elect(true);
                resume = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pause_outlasts_every_drawn_timeout_and_ends_before_a_follower_timer() {
        for timing in [
            ControlTiming::default(),
            ControlTiming {
                heartbeat: Duration::from_millis(100),
                election_min: Duration::from_millis(200),
                election_max: Duration::from_millis(1000),
            },
        ] {
            let mut seen = std::collections::BTreeSet::new();
            for draw in 0..5000u64 {
                let pause = campaign_pause(timing, draw.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                // openraft draws its timeout in [min, max): a failed campaign waits for our draw.
                assert!(pause >= timing.election_max, "{pause:?} under {timing:?}");
                // A follower's timer fires at leader_lease (= max) + its timeout (>= min) at the earliest.
                assert!(pause < timing.election_max + timing.election_min, "{pause:?} under {timing:?}");
                seen.insert(pause.as_millis() / 10);
            }
            assert!(seen.len() > 10, "the pause must spread campaigns, got {seen:?}");
        }
    }
}
