//! Taking and leaving office (PROTOCOL.md, "Taking office" and "Losing office").
//!
//! The replica watches openraft's metrics. When openraft makes this node leader of term T, it
//! probes the voters, adopts the most up-to-date log of a probed majority ([`plan_office`], the
//! same core the model check drives), quarantines and pulls if that log is not its own, appends
//! `LeaderStart{T}` at `B(T) + 1`, persists the stream baseline, records the LeaderStart through
//! openraft, activates its ShipQueues, and serves once the LeaderStart is committed and applied.
//! Delicate:
//! - stepping down is synchronous with persisting a higher vote ([`Replica::deposed`], called under
//!   the term lock by the vote store), so a deposed leader never counts another ack;
//! - every step re-checks that the term is still T; a stale office stops at its next step;
//! - a node put back in office in the SAME term writes no second LeaderStart, and only within the
//!   process that opened it: a term openraft restores after a restart is handed over, never resumed
//!   (its unsynced tail may have been shipped and lost here; decisions/023).

use super::{Replica, HEARTBEAT_INTERVAL};
use crate::control::{ControlCmd, ControlPlane};
use crate::error::{Error, Result};
use crate::fatal::FatalSource;
use openraft::ServerState;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tidal_core::{encode_payload, ControlRecord, Envelope, Records};
use tidal_net::{Probe, ProbeOutcome};
use tidal_protocol::{
    campaign_not_before, plan_office, resumes_a_term, term_start, transfer_target, OfficePlan, OwnLog,
    ProbeAnswer,
};
use tidal_types::{NodeId, Seqno, Term, TermSeqno};
use tidal_wal::AppendRequest;
use tokio::sync::watch;

/// Deadline of one probe round.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// How long, once a majority answered, a probe round waits for the other voters.
const PROBE_GRACE: Duration = Duration::from_millis(20);
/// Pause between probe rounds that did not reach a majority.
const PROBE_RETRY: Duration = Duration::from_millis(50);
/// How long steps 2-3 of taking office (probe, adopt, pull) may take before one last probe and, if
/// that does not open the term either, a handover (PROTOCOL.md, "Taking office"). A pull that
/// succeeds is never cut: the deadline is checked between rounds, so it bites only when rounds keep
/// failing (a source that cannot serve its pull, say a damaged segment).
const OFFICE_DEADLINE: Duration = Duration::from_secs(5);
/// The office's state: the role status reports, the term served, the running office and its stream
/// baseline, and what keeps a term from being resumed across a restart.
pub(super) struct Office {
    role: Mutex<Role>,
    /// `Some(term)` while this node serves as leader of `term`.
    serving: watch::Sender<Option<Term>>,
    /// The running office (term and its stop signal).
    running: Mutex<Option<(Term, watch::Sender<bool>)>>,
    /// The stream baseline `(T, B(T))` of the current (or last) office.
    baseline: Mutex<TermSeqno>,
    /// The highest term this process opened as leader (0: none). A term this node led in an earlier
    /// process is not resumed (decisions/023).
    opened_term: AtomicU64,
    /// The persisted vote's term when this process started. openraft makes a node leader of a
    /// term at or below it only by restoring an election an earlier process won: such a term is
    /// handed over, never resumed (decisions/057).
    boot_term: Term,
    /// When this process started its control plane. No openraft call for a term at or below
    /// `boot_term` leaves during the first lease after it (control/network.rs), so a lease a voter
    /// holds for our restored term by then was granted before it (decisions/068).
    booted: OnceLock<tokio::time::Instant>,
    /// Offices given up past the office deadline (metrics): see [`Replica::handovers`].
    handovers: AtomicU64,
}

impl Office {
    /// No office yet; `boot_term` is the persisted vote's term at start.
    pub(super) fn new(boot_term: Term) -> Office {
        Office {
            role: Mutex::new(Role::Follower),
            serving: watch::channel(None).0,
            running: Mutex::new(None),
            baseline: Mutex::new(TermSeqno::default()),
            opened_term: AtomicU64::new(0),
            boot_term,
            booted: OnceLock::new(),
            handovers: AtomicU64::new(0),
        }
    }

    /// The persisted vote's term when this process started.
    pub(super) fn boot_term(&self) -> Term {
        self.boot_term
    }

    /// Records that the control plane starts now (once; later calls change nothing).
    pub(super) fn mark_booted(&self) {
        let _ = self.booted.set(tokio::time::Instant::now());
    }
}

/// A node's role, as status reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Follows a leader (or knows none yet).
    Follower,
    /// Standing for election, or elected and taking office (not serving yet).
    Candidate,
    /// Leader in office: LeaderStart committed and applied.
    Leader,
}

impl Role {
    /// The status name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Follower => "follower",
            Role::Candidate => "candidate",
            Role::Leader => "leader",
        }
    }
}

/// Name of the stream baseline file in the data directory.
pub const STREAM_BASELINE_FILE: &str = "stream_baseline";

/// Who hands an office over: a live leader that missed its deadline, or a restarted one whose
/// restored term will never be served (its voters may release the lease they granted it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Handing {
    Live,
    Restored,
}

impl Replica {
    /// Follows openraft's metrics: takes office when elected, leaves it when not leader any more,
    /// and learns the leader (a follower pulls when the leader changes).
    pub(super) async fn watch_control(self: Arc<Self>, control: Arc<ControlPlane>) {
        let mut metrics = control.raft().metrics();
        let mut known_leader = None;
        let mut stopped = self.stopped.subscribe();
        loop {
            if *stopped.borrow() {
                return;
            }
            let (state, term, leader, core_failed) = {
                let m = metrics.borrow_and_update();
                self.adopt_membership(m.membership_config.membership());
                let core_failed = match &m.running_state {
                    Err(openraft::error::Fatal::Stopped) | Ok(()) => None,
                    Err(error) => Some(error.to_string()),
                };
                (m.state, Term(m.current_term), m.current_leader, core_failed)
            };
            if let Some(why) = core_failed {
                // openraft stopped on an error (a failed store write: the vote, its log): this node
                // no longer knows terms durably. Fatal; `watch_fatal` leaves office.
                self.fatal.raise(FatalSource::ControlPlane, format!("openraft's core stopped: {why}"));
            }
            let leading = state == ServerState::Leader && leader == Some(self.me.0);
            let office_term = self
                .office
                .running
                .lock()
                .expect("office lock is never held across a panic")
                .as_ref()
                .map(|(t, _)| *t);
            if let Some(id) = leader {
                self.leader_hint.store(id, Ordering::SeqCst);
            }
            match (leading, office_term) {
                (true, Some(current)) if current == term => {}
                (true, _) => {
                    self.leave_office();
                    self.start_office(term);
                }
                (false, Some(_)) => self.leave_office(),
                (false, None) => {}
            }
            if !leading {
                let role = if state == ServerState::Candidate { Role::Candidate } else { Role::Follower };
                *self.office.role.lock().expect("role lock is never held across a panic") = role;
                if leader.is_some() && leader != known_leader && leader != Some(self.me.0) {
                    // A new leader: catch up from it now rather than at its first ship.
                    self.clone().start_pull("leader change");
                }
            }
            known_leader = leader;
            tokio::select! {
                changed = metrics.changed() => if changed.is_err() {
                    // openraft's core task ended (a panic ends it without a last report).
                    if !*stopped.borrow() && !self.fatal.is_raised() {
                        self.fatal.raise(FatalSource::ControlPlane, "openraft's core ended");
                    }
                    self.leave_office();
                    return;
                },
                _ = stopped.changed() => {}
            }
        }
    }

    /// Once the node's fatal state is raised (by any source: the WAL, the applier, the engine, a
    /// vote, openraft), leaves office for good at once (PROTOCOL.md, "Storage errors"): heartbeats
    /// and campaigns off, ShipQueues parked, serving cleared, then openraft stopped, so this node
    /// neither leads nor votes again; the voters' lease runs out and they elect another node. The
    /// node exits shortly after (`tidal_server::run_on`).
    pub(super) async fn watch_fatal(self: Arc<Self>, control: Arc<ControlPlane>) {
        let mut stopped = self.stopped.subscribe();
        let reason = tokio::select! {
            reason = self.fatal.raised() => reason,
            _ = stopped.wait_for(|stopped| *stopped) => return,
        };
        let runtime = control.raft().runtime_config();
        runtime.heartbeat(false);
        runtime.elect(false);
        if self.commit.office().is_some() || self.is_leader() {
            tracing::error!(source = %reason.source, "leaving office after a fatal fault: heartbeats off");
        }
        self.leave_office();
        control.shutdown().await;
    }

    /// A higher term was persisted (under the term lock, before the vote is answered): stop
    /// counting acks and stop serving at once. The office task notices and ends.
    pub(super) fn deposed(&self, term: Term) {
        if self.commit.office().is_some_and(|office| office < term) {
            tracing::warn!(%term, "a higher term was persisted: leaving office");
        }
        self.commit.step_down();
        self.office.serving.send_if_modified(|serving| {
            if serving.is_some_and(|office| office < term) {
                *serving = None;
                true
            } else {
                false
            }
        });
    }

    /// Leaves office: parks the ShipQueues and stops serving.
    pub(super) fn leave_office(&self) {
        let office = self.office.running.lock().expect("office lock is never held across a panic").take();
        if let Some((term, stop)) = office {
            tracing::info!(%term, "leaving office");
            let _ = stop.send(true);
        }
        self.commit.step_down();
        self.office.serving.send_replace(None);
    }

    fn start_office(self: &Arc<Self>, term: Term) {
        if self.fatal.is_raised() {
            // A node with a fatal fault never takes office (`watch_fatal`).
            return;
        }
        let (stop_tx, stop) = watch::channel(false);
        *self.office.running.lock().expect("office lock is never held across a panic") =
            Some((term, stop_tx));
        *self.office.role.lock().expect("role lock is never held across a panic") = Role::Candidate;
        // A failed office of an earlier term may have switched them off (below).
        self.set_heartbeats(true);
        let replica = self.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            match replica.clone().take_office(term, stop.clone()).await {
                Ok(baseline) => tracing::info!(
                    %term, %baseline, ms = started.elapsed().as_millis() as u64, "in office: serving as leader"
                ),
                Err(why) if replica.still(term, &stop).is_ok() => {
                    // openraft still has us lead this term, but we cannot serve it (say the stream
                    // baseline could not be written): we fail closed, and our heartbeats would keep
                    // every other node from standing, so no one would take writes. Without them the
                    // voters' lease runs out and they elect another node, whose higher term deposes
                    // us (as a leadership transfer does, replica/promote.rs).
                    let resumed = matches!(why, Error::ResumedTerm { .. });
                    if matches!(why, Error::Superseded { .. }) {
                        // Another node won a later election: the protocol working, not a fault.
                        tracing::warn!(%term, "did not take office: {why}; heartbeats off");
                    } else if resumed {
                        tracing::warn!(%term, "did not take office: {why}; heartbeats off, handing over");
                    } else {
                        tracing::error!(%term, "could not take office: {why}; heartbeats off so that another node is elected");
                    }
                    replica.set_heartbeats(false);
                    if resumed {
                        replica.hand_over_restored(term, &stop).await;
                    }
                }
                Err(why) => tracing::warn!(%term, "did not take office: {why}"),
            }
        });
    }

    /// Switches openraft's leader heartbeats on or off (no-op without a control plane).
    fn set_heartbeats(&self, on: bool) {
        if let Some(control) = self.control.get() {
            control.raft().runtime_config().heartbeat(on);
        }
    }

    fn still(&self, term: Term, stop: &watch::Receiver<bool>) -> Result<()> {
        if *stop.borrow() {
            return Err(Error::OfficeEnded { term, why: "stopped".into() });
        }
        if self.gate.term() != term {
            return Err(Error::OfficeEnded {
                term,
                why: format!("the term moved on to {}", self.gate.term()),
            });
        }
        Ok(())
    }

    /// Takes office of `term` (PROTOCOL.md, "Taking office"): adopts the greatest log of a probed
    /// majority, opens the term, ships, and serves once LeaderStart is committed and applied.
    /// Returns the stream baseline.
    async fn take_office(self: Arc<Self>, term: Term, stop: watch::Receiver<bool>) -> Result<TermSeqno> {
        tracing::info!(%term, "elected: taking office");
        let (baseline, write_leader_start) = self.adopt_greatest_log(term, &stop).await?;
        // Step 4: open the term.
        let term_start = self.open_term(term, &stop, baseline, write_leader_start).await?;
        if write_leader_start {
            let seqno = self.append_leader_start(term, baseline.seqno).await?;
            if seqno != baseline.seqno.next() {
                // The WAL numbers batches; our own log ended at the baseline under the term lock.
                return Err(Error::LeaderStartMisplaced { at: seqno, expected: baseline.seqno.next() });
            }
        } else {
            // Our own matched: what we already hold of this term.
            self.commit.record_matched(self.me, term, self.wal.last_position());
        }
        self.persist_baseline(term, baseline)?;
        // Everything this node holds when it opens the term must be committed and applied before
        // it takes a write. Usually that is LeaderStart itself; a leader that resumes its own term
        // after a restart (openraft restores a committed vote) holds LeaderStart AND a recovered
        // tail past its commit hint. Serving before that tail is applied let a client's retry miss
        // the idempotency table (it holds applied writes) and be written twice (chaos/sim's
        // duplicate check, decisions/008).
        let serve_at = std::cmp::max(term_start, self.wal.last_position().seqno);
        // Step 5: ship, then serve once LeaderStart (and all before it) is committed and applied.
        tokio::spawn(self.clone().ship_queues(term, stop.clone()));
        self.record_leader_start(term, baseline);
        self.wait_until_applied(term, &stop, serve_at).await?;
        let _term_lock = self.gate.lock().await;
        self.still(term, &stop)?;
        self.office.serving.send_replace(Some(term));
        *self.office.role.lock().expect("role lock is never held across a panic") = Role::Leader;
        self.leader_hint.store(self.me.0, Ordering::SeqCst);
        Ok(baseline)
    }

    /// Steps 2-3 of taking office: probe a majority and adopt the greatest log (quarantine, pull, or
    /// install a snapshot), within the office deadline, then one last round before a handover.
    /// Returns the baseline and whether a LeaderStart is to be written.
    async fn adopt_greatest_log(
        self: &Arc<Self>,
        term: Term,
        stop: &watch::Receiver<bool>,
    ) -> Result<(TermSeqno, bool)> {
        let deadline = tokio::time::Instant::now() + OFFICE_DEADLINE;
        let mut last_round = false;
        loop {
            self.still(term, stop)?;
            if tokio::time::Instant::now() >= deadline {
                if last_round {
                    // Counted here only: a restored office's hand-over (decisions/068) is expected
                    // after every quick restart of a leader, and the metric is alerted on.
                    self.office.handovers.fetch_add(1, Ordering::SeqCst);
                    let why = match self.hand_over(term, Handing::Live).await {
                        Ok(target) => {
                            format!("not taken within {OFFICE_DEADLINE:?}; handed it to node {target}")
                        }
                        Err(why) => format!("not taken within {OFFICE_DEADLINE:?}; {why}"),
                    };
                    return Err(Error::NoOffice { term, why });
                }
                // One more probe; if it does not open the term, we hand over.
                last_round = true;
            }
            let (answers, _) = self.probe_all(term).await;
            let own = {
                let _term_lock = self.gate.lock().await;
                self.still(term, stop)?;
                OwnLog {
                    last: self.wal.last_position(),
                    history: self.wal.term_history(),
                    applied: *self.applied.borrow(),
                }
            };
            match plan_office(self.me, term, &own, &answers, &self.commit.quorum()) {
                OfficePlan::Wait => tokio::time::sleep(PROBE_RETRY).await,
                OfficePlan::StepDown { term: higher } => {
                    return Err(Error::Superseded { term, higher });
                }
                OfficePlan::Sync { source, target, pull_from, quarantine_from, needs_snapshot } => {
                    tracing::warn!(%term, %source, %target, %pull_from, ?quarantine_from, "adopting a more up-to-date log");
                    self.sync_from(term, source, pull_from, quarantine_from, needs_snapshot).await?;
                }
                OfficePlan::Open { baseline, write_leader_start } => {
                    return Ok((baseline, write_leader_start))
                }
            }
        }
    }

    /// Performs one `Sync` plan: installs the source's snapshot when our applied state holds data
    /// the adopted log does not (then the next probe plans a pull), or quarantines our divergent
    /// suffix and pulls the source's log. A failed pull or install is retried by the next round.
    async fn sync_from(
        self: &Arc<Self>,
        term: Term,
        source: NodeId,
        pull_from: TermSeqno,
        quarantine_from: Option<Seqno>,
        needs_snapshot: bool,
    ) -> Result<()> {
        if needs_snapshot {
            tracing::warn!(%term, %source, %pull_from, "applied past the divergence point: installing the source's snapshot");
            if let Err(why) =
                self.install_from(source, "taking office, applied past the divergence point").await
            {
                tracing::warn!(%source, "snapshot install while taking office failed: {why}");
                tokio::time::sleep(PROBE_RETRY).await;
            }
            return Ok(());
        }
        if let Some(from) = quarantine_from {
            let report = self.quarantine_from(from).await?;
            tracing::warn!(?report, "moved a divergent suffix to quarantine");
            self.feed.reset(self.wal.last_position());
        }
        if let Err(why) = self.pull_from(source, pull_from, true).await {
            tracing::warn!(%source, "pull while taking office failed: {why}");
            tokio::time::sleep(PROBE_RETRY).await;
        }
        Ok(())
    }

    /// Opens `term` under the term lock: refuses to resume a term an earlier process led, sets the
    /// WAL's term, starts counting commit in it and records the stream baseline. Returns the
    /// term's first seqno.
    async fn open_term(
        &self,
        term: Term,
        stop: &watch::Receiver<bool>,
        baseline: TermSeqno,
        write_leader_start: bool,
    ) -> Result<Seqno> {
        let _term_lock = self.gate.lock().await;
        self.still(term, stop)?;
        let opened = self.office.opened_term.load(Ordering::SeqCst);
        if resumes_a_term(term, self.office.boot_term, write_leader_start, opened) && self.has_other_voters()
        {
            // openraft restored our leadership of a term an earlier process of ours won. That
            // process shipped batches before their fsync (decisions/023), so followers outside the
            // majority we probed may hold batches of this term that the crash took from us (its
            // LeaderStart included: then our WAL holds nothing of the term and the plan says to
            // write a LeaderStart, a second, different one at the same seqno). Writing on from our
            // log would put other contents at their seqnos under the same term. Hand the office
            // over: the next leader opens a new term and quarantines whatever was never committed.
            return Err(Error::ResumedTerm { term });
        }
        self.office.opened_term.fetch_max(term.get(), Ordering::SeqCst);
        self.wal.set_term(term);
        let term_start = term_start(term, baseline.seqno, write_leader_start, &self.wal.term_history());
        self.commit.begin_term(term, term_start);
        // The stream baseline (T, B(T)): this office's term and the last seqno before it.
        *self.office.baseline.lock().expect("baseline lock is never held across a panic") =
            TermSeqno { term, seqno: baseline.seqno };
        Ok(term_start)
    }

    /// Records the LeaderStart in openraft's control log too (in the background: the data path
    /// does not wait for it).
    fn record_leader_start(&self, term: Term, baseline: TermSeqno) {
        let Some(control) = self.control.get().cloned() else { return };
        let record =
            ControlCmd::LeaderStart { term: term.get(), leader: self.me.0, baseline: baseline.seqno.get() };
        tokio::spawn(async move {
            if let Err(error) = control.raft().client_write(record).await {
                tracing::info!("LeaderStart not recorded in the control log: {error}");
            }
        });
    }

    /// Waits until everything up to `serve_at` is committed and applied here, while the office of
    /// `term` lasts.
    async fn wait_until_applied(
        &self,
        term: Term,
        stop: &watch::Receiver<bool>,
        serve_at: Seqno,
    ) -> Result<()> {
        let mut commits = self.commit.subscribe();
        let mut applied = self.applied.clone();
        let mut stop_wait = stop.clone();
        loop {
            self.still(term, stop)?;
            if *commits.borrow() >= serve_at && *applied.borrow() >= serve_at {
                return Ok(());
            }
            tokio::select! {
                _ = commits.changed() => {}
                _ = applied.changed() => {}
                _ = stop_wait.changed() => {}
                _ = tokio::time::sleep(HEARTBEAT_INTERVAL) => {}
            }
        }
    }

    /// Asks the voter with the greatest log that answers a probe to stand for election (it needs no
    /// pull): the node asked, or why none stands. The caller has switched our heartbeats off, so if
    /// the request fails the voters' lease runs out and they elect without us. A restored office
    /// first has the voters release the lease they granted it (decisions/068, third amendment).
    async fn hand_over(&self, term: Term, handing: Handing) -> Result<tidal_types::NodeId> {
        let (answers, mut leases) = self.probe_all(term).await;
        let quorum = self.commit.quorum();
        let Some(target) = transfer_target(self.me, &answers, &quorum) else {
            return Err(Error::Unavailable("no voter to hand it to".to_string()));
        };
        // Every voter, this node included, refuses votes while the lease it grants runs: the
        // target campaigns once enough of them have run out (or were released) for its majority.
        leases.insert(self.me, self.lease_granted(term));
        let mode = match handing {
            Handing::Live => tidal_net::ElectMode::Stand,
            Handing::Restored => {
                self.release_leases(term, target, &quorum, &mut leases).await;
                tidal_net::ElectMode::StandPastReleased
            }
        };
        let not_before = campaign_not_before(target, &leases, &quorum);
        let asked = match self.peer(target) {
            Some(peer) => match peer.elect(term.get(), self.me.0, not_before, mode).await {
                Ok(tidal_net::Election::Started) => Ok(()),
                Ok(tidal_net::Election::Refused(why)) => Err(why),
                Err(error) => Err(error.to_string()),
            },
            None => Err("not a peer any more".to_string()),
        };
        asked
            .map(|()| target)
            .map_err(|why| Error::Unavailable(format!("node {target} did not stand ({why})")))
    }

    /// Asks every voter other than `target` that still grants this node a lease of `term` to
    /// release it, and marks those that did as granting none (`leases`). Each answers once its
    /// release campaign is queued ahead of any vote request it receives later, so the target's
    /// campaign, asked for after these answers, finds them released. A voter that has not answered
    /// within the probe timeout keeps its lease in the count: the target is asked at once and waits
    /// for that lease instead.
    async fn release_leases(
        &self,
        term: Term,
        target: NodeId,
        quorum: &tidal_protocol::Quorum,
        leases: &mut BTreeMap<NodeId, Duration>,
    ) {
        let mut calls = tokio::task::JoinSet::new();
        let holding = leases.iter().filter(|(node, left)| {
            **node != self.me && **node != target && quorum.is_voter(**node) && !left.is_zero()
        });
        for (node, _) in holding {
            let Some(peer) = self.peer(*node) else { continue };
            let (node, me) = (*node, self.me.0);
            calls.spawn(async move {
                (node, peer.elect(term.get(), me, Duration::ZERO, tidal_net::ElectMode::Release).await)
            });
        }
        let deadline = tokio::time::Instant::now() + PROBE_TIMEOUT;
        while let Ok(Some(joined)) = tokio::time::timeout_at(deadline, calls.join_next()).await {
            let Ok((node, answer)) = joined else { continue };
            match answer {
                Ok(tidal_net::Election::Started) => {
                    leases.insert(node, Duration::ZERO);
                }
                Ok(tidal_net::Election::Refused(why)) => tracing::info!(%node, "lease not released: {why}"),
                Err(error) => tracing::info!(%node, "lease not released: {error}"),
            }
        }
    }

    /// Hands a restored office over as soon as the voters can elect another node (decisions/068).
    /// A voter refuses all votes while the leader lease it granted runs, and left alone the voters'
    /// own timers end the outage up to a whole election timeout after it. None of the restored
    /// office's openraft calls leave this process during its first lease (control/network.rs), so
    /// every such lease was granted to our earlier process, before the crash. So this node asks the most up-to-date voter
    /// to stand at once; the voter campaigns when the lease it granted has run out (it noted when,
    /// `stand_for_election`) and no sooner than the request's wait, the leases of the other voters
    /// its majority needs (each probe answer says what is left of one; second amendment). Should
    /// that campaign fail anyway, a second request goes out once every such lease has surely run out
    /// (it began before this process started), if this node still holds the term then.
    async fn hand_over_restored(&self, term: Term, stop: &watch::Receiver<bool>) {
        let booted = *self.office.booted.get_or_init(tokio::time::Instant::now);
        self.try_hand_over_restored(term, stop).await;
        tokio::time::sleep_until(booted + self.timing.voters_lease()).await;
        self.try_hand_over_restored(term, stop).await;
    }

    async fn try_hand_over_restored(&self, term: Term, stop: &watch::Receiver<bool>) {
        if self.still(term, stop).is_err() {
            return;
        }
        match self.hand_over(term, Handing::Restored).await {
            Ok(target) => tracing::info!(%term, %target, "restored office handed over"),
            Err(why) => tracing::warn!(%term, "restored office not handed over: {why}"),
        }
    }

    /// Probes every peer in `term`: their answers, and what remains of the lease each grants.
    async fn probe_all(&self, term: Term) -> (BTreeMap<NodeId, ProbeAnswer>, BTreeMap<NodeId, Duration>) {
        let probe = Probe { cluster_id: self.spec.cluster_id.clone(), term, leader: self.me };
        let mut calls = tokio::task::JoinSet::new();
        for (id, peer) in self.peer_list() {
            let probe = probe.clone();
            calls.spawn(async move { (id, peer.probe(&probe, PROBE_TIMEOUT).await) });
        }
        let (mut answers, mut leases) = (BTreeMap::new(), BTreeMap::new());
        // Once a majority (with this node) has answered, the stragglers get a short grace: a slow
        // or dead voter must not hold the office up for the whole probe timeout. Any majority is
        // enough for `plan_office` (the model check probes arbitrary majorities).
        let mut grace_until = None;
        loop {
            let next = match grace_until {
                None => calls.join_next().await,
                Some(until) => match tokio::time::timeout_at(until, calls.join_next()).await {
                    Ok(next) => next,
                    Err(_) => break,
                },
            };
            let Some(joined) = next else { break };
            let Ok((id, reply)) = joined else { continue };
            match reply {
                Ok(reply) => {
                    let answer = match reply.outcome {
                        ProbeOutcome::NotYet => ProbeAnswer::NotYet { term: reply.term },
                        ProbeOutcome::Fenced => ProbeAnswer::Fenced { term: reply.term },
                        ProbeOutcome::Position { last, history } => ProbeAnswer::Position { last, history },
                    };
                    answers.insert(id, answer);
                    leases.insert(id, reply.lease_left);
                }
                Err(error) => tracing::debug!(node = %id, "probe failed: {error}"),
            }
            if grace_until.is_none() {
                let answered: std::collections::BTreeSet<_> =
                    answers.keys().copied().chain(std::iter::once(self.me)).collect();
                if self.commit.quorum().is_majority(&answered) {
                    grace_until = Some(tokio::time::Instant::now() + PROBE_GRACE);
                }
            }
        }
        (answers, leases)
    }

    /// Appends the term's first batch, `LeaderStart{term}`, and waits until it is durable.
    async fn append_leader_start(&self, term: Term, baseline: Seqno) -> Result<Seqno> {
        let envelope = Envelope { time_ms: 0, principal: String::new(), idempotency_key: String::new() };
        let records = Records::Control(ControlRecord::LeaderStart { term, leader: self.me, baseline });
        let encoded = encode_payload(&envelope, &records);
        let request =
            AppendRequest { kind: encoded.kind, event_count: encoded.event_count, payload: encoded.payload };
        // Submitted from here, not from a blocking thread: the writer's completion wakes this task,
        // and in the simulation the append is done between two steps (decisions/051).
        let mut request = request;
        let appended = loop {
            let (done_tx, done_rx) = tokio::sync::oneshot::channel();
            let done: tidal_wal::Completion = Box::new(move |result| drop(done_tx.send(result)));
            match self.wal.submit(request, done) {
                Ok(()) => break done_rx,
                Err(tidal_wal::SubmitError::QueueFull(back)) => {
                    request = back;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err(error) => return Err(Error::wal("append LeaderStart", error)),
            }
        };
        let appended = appended
            .await
            .map_err(|_| Error::wal("append LeaderStart", "the WAL writer stopped"))?
            .map_err(|e| Error::wal("append LeaderStart", e))?;
        Ok(appended.last)
    }

    /// Writes `data_dir/stream_baseline` (`term baseline`), by write-then-rename, fsynced. An
    /// error ends the office before it serves (the caller returns it: fail closed).
    fn persist_baseline(&self, term: Term, baseline: TermSeqno) -> Result<()> {
        let path = self.data_dir.join(STREAM_BASELINE_FILE);
        let contents = format!("{} {}\n", term.get(), baseline.seqno.get());
        crate::files::write_then_rename(&path, contents.as_bytes())
            .map_err(|e| Error::File { path: path.clone(), why: e.to_string() })
    }
}

impl Replica {
    /// Whether this node serves as leader (in office, LeaderStart committed and applied).
    pub fn is_leader(&self) -> bool {
        self.office.serving.borrow().is_some()
    }

    /// The term this node serves as leader in, or why an operator verb must go elsewhere (the leader
    /// this node knows).
    pub(crate) fn serving_term(&self) -> Result<Term> {
        let serving = *self.office.serving.borrow();
        serving.ok_or_else(|| Error::NotLeader { me: self.me, leader: self.leader() })
    }

    /// The control plane and the term this node serves in, for an operator verb only the serving
    /// leader runs.
    pub(super) fn leading_control(&self) -> Result<(Arc<ControlPlane>, Term)> {
        let control = self
            .control
            .get()
            .ok_or_else(|| Error::Unavailable("the control plane has not started yet".into()))?
            .clone();
        Ok((control, self.serving_term()?))
    }

    /// `Some(term)` while this node serves as leader; watch it to learn when office is lost.
    pub fn serving(&self) -> watch::Receiver<Option<Term>> {
        self.office.serving.subscribe()
    }

    /// The role, for status.
    ///
    /// `Leader` only while this node serves in the term it has persisted: between a higher vote
    /// (which stops the serving at once) and the office watcher's next step, the stored role still
    /// says leader, and status must not pair it with the new term (the simulation's "two leaders in
    /// one term" check saw exactly that, partition-heal seed 43).
    pub fn role(&self) -> Role {
        let role = *self.office.role.lock().expect("role lock is never held across a panic");
        if role == Role::Leader && *self.office.serving.borrow() != Some(self.gate.term()) {
            return Role::Follower;
        }
        role
    }

    /// The role with the term it holds in, read consistently (status): a `Leader` answer means this
    /// node served in exactly that term.
    pub fn role_in_term(&self) -> (Role, Term) {
        // Terms move a few times a second at most; a read that keeps racing them reports follower.
        for _ in 0..8 {
            let before = self.gate.term();
            let role = self.role();
            if self.gate.term() == before {
                return (role, before);
            }
        }
        (Role::Follower, self.gate.term())
    }

    /// The stream baseline `(T, B(T))` of this node's current (or last) office: its term, and the
    /// last seqno before that term's LeaderStart.
    pub fn baseline(&self) -> TermSeqno {
        *self.office.baseline.lock().expect("baseline lock is never held across a panic")
    }

    /// How many offices this node gave up because it could not take them within the office deadline
    /// (it asked the voter with the greatest log to stand instead; PROTOCOL.md, "Taking office").
    pub fn handovers(&self) -> u64 {
        self.office.handovers.load(Ordering::SeqCst)
    }
}

impl Replica {
    /// The term this node serves as leader in, if it does.
    pub(super) fn serving_now(&self) -> Option<Term> {
        *self.office.serving.borrow()
    }
}
