//! The leader lease this node grants, as far as Tidal can see it (decisions/068).
//!
//! openraft 0.9 refuses every vote while the lease a voter granted on the leader's last append runs
//! (`leader_lease` = `election_max`), and does not say when that lease ends. A node asked to stand
//! for a leader that can no longer serve (a restored office) needs that moment: a campaign started
//! inside the lease is refused, and its higher term then keeps the same request from being repeated
//! (the target checks the request's term against its own). So the node notes when it last served an
//! openraft append and of which term, and campaigns once that lease has run out.

use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// How long a campaign for a leader of `term` must wait for the lease a voter granted on the last
/// append it served (`last`: that append's term and when it arrived) to end, `lease` long. Zero when
/// the last append was of another term: no lease of `term` runs here (a later term's leader would
/// have made the request stale, which the target refuses before asking this).
pub fn lease_left(last: Option<(u64, Instant)>, term: u64, now: Instant, lease: Duration) -> Duration {
    match last {
        Some((served, at)) if served == term => (at + lease).saturating_duration_since(now),
        _ => Duration::ZERO,
    }
}

/// How long a node asked to stand waits before it campaigns: until the lease it grants has run out
/// (`own`) and no sooner than the asker's `not_before` (the other voters' leases its majority needs,
/// decisions/068), which is capped at one `lease`: no lease granted before the request runs longer,
/// and a garbled value must not hold the node back.
pub fn campaign_wait(own: Duration, not_before: Duration, lease: Duration) -> Duration {
    own.max(not_before.min(lease))
}

/// The last openraft append this node served: its term and when it arrived.
#[derive(Default)]
pub struct LeaseClock {
    last: Mutex<Option<(u64, Instant)>>,
}

impl LeaseClock {
    /// A clock for a process whose persisted vote names `boot_term` (0: none): openraft restores
    /// that vote with a lease starting at its own start, so the clock starts there too.
    pub fn starting(boot_term: u64) -> LeaseClock {
        let last = (boot_term > 0).then(|| (boot_term, Instant::now()));
        LeaseClock { last: Mutex::new(last) }
    }

    /// Notes an append of `term` arriving now. An append of an older term does not move the clock
    /// (openraft refuses it without touching the lease).
    pub fn served(&self, term: u64) {
        let mut last = self.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if last.is_none_or(|(served, _)| served <= term) {
            *last = Some((term, Instant::now()));
        }
    }

    /// [`lease_left`] now.
    pub fn left(&self, term: u64, lease: Duration) -> Duration {
        let last = *self.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        lease_left(last, term, Instant::now(), lease)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_campaign_waits_only_for_a_lease_of_the_term_it_replaces() {
        let lease = Duration::from_millis(650);
        let at = Instant::now();
        let later = |ms| at + Duration::from_millis(ms);
        assert_eq!(lease_left(Some((3, at)), 3, later(100), lease), Duration::from_millis(550));
        assert_eq!(lease_left(Some((3, at)), 3, later(650), lease), Duration::ZERO, "just run out");
        assert_eq!(lease_left(Some((3, at)), 3, later(5_000), lease), Duration::ZERO, "long gone");
        assert_eq!(lease_left(Some((2, at)), 3, later(0), lease), Duration::ZERO, "no append of term 3 here");
        assert_eq!(lease_left(None, 3, later(0), lease), Duration::ZERO, "never served an append");
    }

    #[test]
    fn a_campaign_waits_for_the_later_of_its_own_lease_and_the_askers_wait_capped_at_a_lease() {
        let ms = Duration::from_millis;
        let lease = ms(650);
        assert_eq!(campaign_wait(ms(100), ms(300), lease), ms(300));
        assert_eq!(campaign_wait(ms(400), ms(300), lease), ms(400));
        assert_eq!(campaign_wait(ms(0), Duration::from_micros(u64::MAX), lease), lease, "capped");
        assert_eq!(campaign_wait(ms(0), ms(0), lease), ms(0), "at once");
    }

    #[test]
    fn a_restarted_node_counts_the_lease_openraft_restores_with_its_vote() {
        let lease = Duration::from_secs(60);
        assert!(LeaseClock::starting(3).left(3, lease) > Duration::from_secs(59));
        assert_eq!(LeaseClock::starting(0).left(0, lease), Duration::ZERO, "no vote persisted");
    }

    #[test]
    fn the_clock_follows_the_newest_term_and_ignores_older_appends() {
        let clock = LeaseClock::default();
        let lease = Duration::from_secs(60);
        clock.served(4);
        assert!(clock.left(4, lease) > Duration::from_secs(59));
        clock.served(3);
        assert_eq!(clock.left(3, lease), Duration::ZERO, "an older term's append moves nothing");
        assert!(clock.left(4, lease) > Duration::ZERO);
        clock.served(5);
        assert_eq!(clock.left(4, lease), Duration::ZERO, "term 5's leader replaced term 4's lease");
    }
}
