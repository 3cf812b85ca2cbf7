//! Inboxes in the engine (kinds 7 and 8): what each record decides, checked against a plain model
//! over random histories and flush layouts, and the rules one by one.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, HashMap};

use common::*;
use proptest::prelude::*;
use tidal_core::{
    Envelope, InboxConsume, InboxOutcome, InboxSend, ReceiveLimits, Records, SendLimits, TidalDb,
};
use tidal_wal::Batch;

const LIMITS: SendLimits = SendLimits { backlog_max: 4, topics_max: 2, dedupe_max: 6, dedupe_age_s: 60 };
const TAKE_ONE: ReceiveLimits =
    ReceiveLimits { max: 1, bytes_max: 1 << 20, receipts_max: 5, receipt_age_s: 60 };

/// One inbox operation of a history.
#[derive(Clone, Debug)]
enum Op {
    Send { sender: u8, topic: u8, id: u8 },
    Receive { id: u8, topics: Vec<u8>, max: u32, lease_ms: u32 },
    Ack { id: u8 },
    Discard { topic: u8, through_back: u64 },
    Close,
    Later { ms: u64 },
}

fn topic(t: u8) -> String {
    format!("t{t}")
}

fn record(op: &Op, seq: u64) -> Option<(String, Records)> {
    let owner = "o".to_string();
    Some(match op {
        Op::Send { sender, topic: t, id } => {
            let send = InboxSend {
                owner,
                topic: topic(*t),
                message_id: format!("m{id}"),
                payload: format!("{{\"n\":{seq}}}").into_bytes(),
                limits: LIMITS,
            };
            (format!("s{sender}"), Records::InboxSend(send))
        }
        Op::Receive { id, topics, max, lease_ms } => {
            let limits = ReceiveLimits { max: *max, ..TAKE_ONE };
            let topics = topics.iter().map(|t| topic(*t)).collect();
            let receive = InboxConsume::Receive {
                owner,
                receive_id: format!("r{id}"),
                topics,
                lease_ms: *lease_ms,
                limits,
            };
            ("rx".into(), Records::InboxConsume(receive))
        }
        Op::Ack { id } => {
            ("rx".into(), Records::InboxConsume(InboxConsume::Ack { owner, receive_id: format!("r{id}") }))
        }
        Op::Discard { topic: t, through_back } => {
            let through = seq.saturating_sub(*through_back);
            let discard = InboxConsume::Discard { owner, topic: topic(*t), through, expired: false };
            ("op".into(), Records::InboxConsume(discard))
        }
        Op::Close => ("op".into(), Records::InboxConsume(InboxConsume::Close { owner })),
        Op::Later { .. } => return None,
    })
}

/// The plain model: what each record should decide.
#[derive(Default)]
struct Model {
    closed: bool,
    /// Unconsumed messages: seq → (topic, sender, id, lease_until, holder).
    messages: BTreeMap<u64, (u8, u8, u8, u64, String)>,
    /// (sender, id) → (seq, time), in insertion order by seq.
    dedupe: BTreeMap<(u8, u8), (u64, u64)>,
    /// receive id → (seq, messages taken, leased, acked).
    receipts: BTreeMap<u8, (u64, u64, Vec<u64>, bool, bool)>,
}

impl Model {
    fn apply(&mut self, op: &Op, seq: u64, now: u64) -> InboxOutcome {
        if self.closed {
            return InboxOutcome::Closed;
        }
        match op {
            Op::Send { sender, topic, id } => self.send(*sender, *topic, *id, seq, now),
            Op::Receive { id, topics, max, lease_ms } => self.receive(*id, topics, *max, *lease_ms, seq, now),
            Op::Ack { id } => self.ack(*id),
            Op::Discard { topic, through_back } => {
                let through = seq.saturating_sub(*through_back);
                let doomed: Vec<u64> = self
                    .messages
                    .iter()
                    .filter(|(s, m)| m.0 == *topic && **s <= through)
                    .map(|(s, _)| *s)
                    .collect();
                for s in &doomed {
                    self.messages.remove(s);
                }
                InboxOutcome::Discarded { count: doomed.len() as u64 }
            }
            Op::Close => {
                let mut unconsumed: BTreeMap<String, u64> = BTreeMap::new();
                for m in self.messages.values() {
                    *unconsumed.entry(topic(m.0)).or_default() += 1;
                }
                *self = Model { closed: true, ..Model::default() };
                InboxOutcome::ClosedNow { unconsumed: unconsumed.into_iter().collect() }
            }
            Op::Later { .. } => unreachable!(),
        }
    }

    fn send(&mut self, sender: u8, t: u8, id: u8, seq: u64, now: u64) -> InboxOutcome {
        let age = u64::from(LIMITS.dedupe_age_s) * 1000;
        if let Some((first, time)) = self.dedupe.get(&(sender, id)) {
            if now - time <= age {
                return InboxOutcome::Sent { inbox_seq: *first, duplicate: true };
            }
        }
        let backlog = self.messages.values().filter(|m| m.0 == t).count() as u64;
        let live = self.messages.values().map(|m| m.0).collect::<std::collections::BTreeSet<_>>();
        if backlog == 0 && live.len() as u32 >= LIMITS.topics_max {
            return InboxOutcome::TooManyTopics { live: live.len() as u32 };
        }
        if backlog >= u64::from(LIMITS.backlog_max) {
            return InboxOutcome::Full { backlog };
        }
        self.messages.insert(seq, (t, sender, id, 0, String::new()));
        self.dedupe.insert((sender, id), (seq, now));
        prune(&mut self.dedupe, |(s, time)| (*s, *time), seq, u64::from(LIMITS.dedupe_max), age, now);
        InboxOutcome::Sent { inbox_seq: seq, duplicate: false }
    }

    fn receive(
        &mut self,
        id: u8,
        topics: &[u8],
        max: u32,
        lease_ms: u32,
        seq: u64,
        now: u64,
    ) -> InboxOutcome {
        if self.receipts.contains_key(&id) {
            return InboxOutcome::AlreadyBound;
        }
        let taken: Vec<u64> = self
            .messages
            .iter()
            .filter(|(_, m)| topics.contains(&m.0) && m.3 <= now)
            .map(|(s, _)| *s)
            .take(max as usize)
            .collect();
        // max 0 closes the id with nothing taken.
        if taken.is_empty() && max > 0 {
            return InboxOutcome::Empty;
        }
        for s in &taken {
            if lease_ms == 0 {
                self.messages.remove(s);
            } else {
                let m = self.messages.get_mut(s).unwrap();
                (m.3, m.4) = (now + u64::from(lease_ms), format!("r{id}"));
            }
        }
        self.receipts.insert(id, (seq, now, taken.clone(), lease_ms > 0, false));
        let age = u64::from(TAKE_ONE.receipt_age_s) * 1000;
        prune(
            &mut self.receipts,
            |(s, time, ..)| (*s, *time),
            seq,
            u64::from(TAKE_ONE.receipts_max),
            age,
            now,
        );
        InboxOutcome::Received { count: taken.len() as u32 }
    }

    fn ack(&mut self, id: u8) -> InboxOutcome {
        let Some((_, _, taken, leased, acked)) = self.receipts.get(&id).cloned() else {
            return InboxOutcome::UnknownReceive;
        };
        if !leased || acked {
            return InboxOutcome::Acked { acked: 0, lost: 0 };
        }
        let (mut done, mut lost) = (0, 0);
        for s in taken {
            if self.messages.get(&s).is_some_and(|m| m.4 == format!("r{id}")) {
                self.messages.remove(&s);
                done += 1;
            } else {
                lost += 1;
            }
        }
        if done > 0 || lost == 0 {
            self.receipts.get_mut(&id).unwrap().4 = true;
        }
        InboxOutcome::Acked { acked: done, lost }
    }
}

/// The engine's window eviction: oldest first (by seq), at most 16 per apply, never the newest.
fn prune<K: Ord + Clone, V>(
    window: &mut BTreeMap<K, V>,
    at: impl Fn(&V) -> (u64, u64),
    newest: u64,
    max: u64,
    age: u64,
    now: u64,
) {
    let mut order: Vec<(u64, u64, K)> = window.iter().map(|(k, v)| (at(v).0, at(v).1, k.clone())).collect();
    order.sort_by_key(|(seq, ..)| *seq);
    let mut count = order.len() as u64;
    for (seq, time, key) in order.into_iter().filter(|(seq, ..)| *seq < newest).take(16) {
        let _ = seq;
        if count <= max && now - time <= age {
            break;
        }
        window.remove(&key);
        count -= 1;
    }
}

fn any_op() -> impl Strategy<Value = Op> {
    let topics = prop::collection::vec(0u8..3, 1..3);
    prop_oneof![
        4 => (0u8..2, 0u8..3, 0u8..8).prop_map(|(sender, topic, id)| Op::Send { sender, topic, id }),
        3 => (0u8..8, topics, 0u32..3, prop_oneof![Just(0u32), Just(5_000u32)])
            .prop_map(|(id, topics, max, lease_ms)| Op::Receive { id, topics, max, lease_ms }),
        1 => (0u8..8).prop_map(|id| Op::Ack { id }),
        1 => (0u8..3, 0u64..6).prop_map(|(topic, through_back)| Op::Discard { topic, through_back }),
        1 => prop_oneof![Just(1_000u64), Just(10_000u64), Just(90_000u64)].prop_map(|ms| Op::Later { ms }),
        0 => Just(Op::Close),
    ]
}

fn apply(db: &TidalDb, batch: &Batch) -> InboxOutcome {
    db.apply(batch).unwrap();
    db.inbox_outcome(batch.last_seqno().0).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Every record decides what the model decides, whatever flushes happen in between; a replay of
    /// the same log on another node with other flush points ends at the same digest.
    #[test]
    fn inboxes_follow_the_model(ops in prop::collection::vec(any_op(), 1..60), flushes in prop::collection::vec(any::<bool>(), 60), close_at in 0usize..80) {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (db, replica) = (open(a.path()), open(b.path()));
        let (mut log, mut model, mut now) = (Log::new(), Model::default(), T0);
        let mut ops = ops;
        if close_at < ops.len() {
            ops.insert(close_at, Op::Close);
        }
        for (i, op) in ops.iter().enumerate() {
            if let Op::Later { ms } = op {
                now += ms;
                continue;
            }
            let seq = log.next;
            let (principal, records) = record(op, seq).unwrap();
            let batch = log.push_with(Envelope { time_ms: now, principal, idempotency_key: String::new() }, records);
            let expected = model.apply(op, seq, now);
            prop_assert_eq!(apply(&db, &batch), expected, "op {} {:?} at seq {}", i, op, seq);
            if flushes[i % flushes.len()] {
                db.checkpoint().unwrap();
            }
            let backlog: u64 = db.inbox_topics("o").unwrap().iter().map(|t| t.meta.backlog).sum();
            prop_assert_eq!(backlog, model.messages.len() as u64);
        }
        apply_all(&replica, &log.batches);
        prop_assert_eq!(db.digest().unwrap(), replica.digest().unwrap());
    }
}

struct Inbox {
    db: TidalDb,
    log: Log,
    now: u64,
    _dir: tempfile::TempDir,
}

impl Inbox {
    fn new() -> Inbox {
        let dir = tempfile::tempdir().unwrap();
        Inbox { db: open(dir.path()), log: Log::new(), now: T0, _dir: dir }
    }

    fn write(&mut self, principal: &str, records: Records) -> (u64, InboxOutcome) {
        let envelope =
            Envelope { time_ms: self.now, principal: principal.into(), idempotency_key: String::new() };
        let batch = self.log.push_with(envelope, records);
        (batch.last_seqno().0, apply(&self.db, &batch))
    }

    fn send(&mut self, sender: &str, t: &str, id: &str, limits: SendLimits) -> InboxOutcome {
        let payload = b"\"hi\"".to_vec();
        let send = InboxSend { owner: "o".into(), topic: t.into(), message_id: id.into(), payload, limits };
        self.write(sender, Records::InboxSend(send)).1
    }

    fn receive(&mut self, id: &str, topics: &[&str], lease_ms: u32) -> (u64, InboxOutcome) {
        let topics = topics.iter().map(|t| t.to_string()).collect();
        let receive = InboxConsume::Receive {
            owner: "o".into(),
            receive_id: id.into(),
            topics,
            lease_ms,
            limits: TAKE_ONE,
        };
        self.write("rx", Records::InboxConsume(receive))
    }

    fn taken(&self, id: &str) -> Vec<u64> {
        self.db.inbox_receipt("o", id).unwrap().unwrap().messages.iter().map(|m| m.inbox_seq).collect()
    }
}

const WIDE: SendLimits = SendLimits { backlog_max: 100, topics_max: 8, dedupe_max: 1000, dedupe_age_s: 3600 };

/// A receive takes the oldest available message across its topics, and its receipt answers a
/// retry with the same message whatever arrived since.
#[test]
fn a_receive_takes_the_oldest_across_its_topics_and_is_bound_to_its_id() {
    let mut inbox = Inbox::new();
    for (t, id) in [("b", "1"), ("a", "2"), ("b", "3")] {
        inbox.send("s", t, id, WIDE);
    }
    assert_eq!(inbox.receive("r1", &["a", "b"], 0).1, InboxOutcome::Received { count: 1 });
    assert_eq!(inbox.taken("r1"), vec![1]);
    assert_eq!(inbox.receive("r1", &["a"], 0).1, InboxOutcome::AlreadyBound);
    assert_eq!(inbox.taken("r1"), vec![1]);
    assert_eq!(inbox.receive("r2", &["a"], 0).1, InboxOutcome::Received { count: 1 });
    assert_eq!(inbox.taken("r2"), vec![2]);
    let receipt = inbox.db.inbox_receipt("o", "r2").unwrap().unwrap();
    assert_eq!((receipt.messages[0].sender.as_str(), receipt.messages[0].message_id.as_str()), ("s", "2"));
    assert_eq!(inbox.receive("r3", &["a"], 0).1, InboxOutcome::Empty);
    assert!(inbox.db.inbox_receipt("o", "r3").unwrap().is_none(), "an empty receive binds nothing");
}

/// A receive of `max` 0 binds its id to nothing: an attempt of the same id that was still in
/// flight, applied after it, takes nothing even though a message is there.
#[test]
fn a_closed_receive_id_takes_nothing_later() {
    let mut inbox = Inbox::new();
    let close = InboxConsume::Receive {
        owner: "o".into(),
        receive_id: "r".into(),
        topics: vec!["a".into()],
        lease_ms: 0,
        limits: ReceiveLimits { max: 0, ..TAKE_ONE },
    };
    assert_eq!(inbox.write("rx", Records::InboxConsume(close)).1, InboxOutcome::Received { count: 0 });
    inbox.send("s", "a", "1", WIDE);
    assert_eq!(inbox.receive("r", &["a"], 0).1, InboxOutcome::AlreadyBound);
    assert!(inbox.taken("r").is_empty());
    assert_eq!(inbox.db.inbox_topic("o", "a").unwrap().unwrap().backlog, 1, "the message is still there");
}

/// The dedupe key is (sender, message_id): a resend is answered with the first sequence even
/// after the message was consumed; another sender's same id is a new message.
#[test]
fn a_resend_is_a_duplicate_per_sender_even_after_consumption() {
    let mut inbox = Inbox::new();
    assert_eq!(inbox.send("s1", "a", "m", WIDE), InboxOutcome::Sent { inbox_seq: 1, duplicate: false });
    inbox.receive("r", &["a"], 0);
    assert_eq!(inbox.send("s1", "a", "m", WIDE), InboxOutcome::Sent { inbox_seq: 1, duplicate: true });
    assert_eq!(inbox.send("s2", "a", "m", WIDE), InboxOutcome::Sent { inbox_seq: 4, duplicate: false });
    inbox.now += 3_601_000;
    assert_eq!(inbox.send("s1", "a", "m", WIDE), InboxOutcome::Sent { inbox_seq: 5, duplicate: false });
}

/// The backlog cap is per topic: a full topic refuses while another flows; the cap on live
/// topics refuses a new topic, never a known one, and a drained topic stops counting.
#[test]
fn caps_are_per_topic_and_drained_topics_stop_counting() {
    let mut inbox = Inbox::new();
    let limits = SendLimits { backlog_max: 2, topics_max: 2, ..WIDE };
    inbox.send("s", "hot", "1", limits);
    inbox.send("s", "hot", "2", limits);
    assert_eq!(inbox.send("s", "hot", "3", limits), InboxOutcome::Full { backlog: 2 });
    assert!(matches!(inbox.send("s", "cold", "4", limits), InboxOutcome::Sent { duplicate: false, .. }));
    assert_eq!(inbox.send("s", "third", "5", limits), InboxOutcome::TooManyTopics { live: 2 });
    inbox.receive("r", &["cold"], 0);
    assert!(inbox.db.inbox_topic("o", "cold").unwrap().is_none(), "a drained topic is not live");
    assert!(matches!(inbox.send("s", "third", "6", limits), InboxOutcome::Sent { duplicate: false, .. }));
}

/// A leased message is held for its receive; unacked past the lease it goes to the next receive,
/// and the first receive's late ack is told it lost it.
#[test]
fn an_unacked_lease_is_delivered_again_and_a_late_ack_loses() {
    let mut inbox = Inbox::new();
    inbox.send("s", "a", "1", WIDE);
    assert_eq!(inbox.receive("r1", &["a"], 5_000).1, InboxOutcome::Received { count: 1 });
    assert_eq!(inbox.receive("r2", &["a"], 5_000).1, InboxOutcome::Empty);
    inbox.now += 5_000;
    assert_eq!(inbox.receive("r3", &["a"], 5_000).1, InboxOutcome::Received { count: 1 });
    let ack =
        |id: &str| Records::InboxConsume(InboxConsume::Ack { owner: "o".into(), receive_id: id.into() });
    assert_eq!(inbox.write("rx", ack("r1")).1, InboxOutcome::Acked { acked: 0, lost: 1 });
    assert_eq!(inbox.write("rx", ack("r3")).1, InboxOutcome::Acked { acked: 1, lost: 0 });
    assert_eq!(inbox.write("rx", ack("r3")).1, InboxOutcome::Acked { acked: 0, lost: 0 });
    assert_eq!(inbox.write("rx", ack("nope")).1, InboxOutcome::UnknownReceive);
    assert!(inbox.db.inbox_topic("o", "a").unwrap().is_none());
}

/// A discard applied before a receive leaves it nothing of what it dropped; it is clamped to the
/// topic's head (a later send survives it) and a repeat drops nothing.
#[test]
fn a_discard_wins_over_a_later_receive_and_repeats_idempotently() {
    let mut inbox = Inbox::new();
    inbox.send("s", "a", "1", WIDE);
    inbox.send("s", "a", "2", WIDE);
    let discard = |through| {
        Records::InboxConsume(InboxConsume::Discard {
            owner: "o".into(),
            topic: "a".into(),
            through,
            expired: false,
        })
    };
    assert_eq!(inbox.write("op", discard(u64::MAX)).1, InboxOutcome::Discarded { count: 2 });
    assert_eq!(inbox.receive("r", &["a"], 0).1, InboxOutcome::Empty);
    inbox.send("s", "a", "3", WIDE);
    assert_eq!(inbox.write("op", discard(u64::MAX)).1, InboxOutcome::Discarded { count: 1 });
    assert_eq!(inbox.write("op", discard(u64::MAX)).1, InboxOutcome::Discarded { count: 0 });
}

/// A close reports what was unconsumed and refuses everything after; nothing of the inbox but
/// its closed meta stays in storage.
#[test]
fn a_close_reports_the_unconsumed_and_refuses_after() {
    let mut inbox = Inbox::new();
    inbox.send("s", "a", "1", WIDE);
    inbox.send("s", "b", "2", WIDE);
    inbox.send("s", "b", "3", WIDE);
    inbox.receive("r", &["a"], 0);
    let close = Records::InboxConsume(InboxConsume::Close { owner: "o".into() });
    let expected = InboxOutcome::ClosedNow { unconsumed: vec![("b".into(), 2)] };
    assert_eq!(inbox.write("op", close.clone()).1, expected);
    assert_eq!(inbox.send("s", "a", "4", WIDE), InboxOutcome::Closed);
    assert_eq!(inbox.receive("r2", &["a"], 0).1, InboxOutcome::Closed);
    assert_eq!(inbox.write("op", close).1, InboxOutcome::Closed);
    inbox.db.checkpoint().unwrap();
    assert_eq!(inbox.db.inbox_entries_in_storage().unwrap(), 1, "only the closed meta is left");
}

/// Consumed messages leave storage (a flushed window's tombstones delete fjall's copies); what a
/// restart reads back is the same inbox.
#[test]
fn consumed_messages_leave_storage_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::new();
    let db = open(dir.path());
    let send = |id: u32| InboxSend {
        owner: "o".into(),
        topic: "a".into(),
        message_id: format!("{id}"),
        payload: b"1".to_vec(),
        limits: WIDE,
    };
    let mut counts = HashMap::new();
    for id in 0..50 {
        db.apply(&log.push(T0, Records::InboxSend(send(id)))).unwrap();
    }
    db.checkpoint().unwrap();
    for id in 0..40 {
        let topics = vec!["a".to_string()];
        let receive = InboxConsume::Receive {
            owner: "o".into(),
            receive_id: format!("r{id}"),
            topics,
            lease_ms: 0,
            limits: TAKE_ONE,
        };
        db.apply(&log.push(T0, Records::InboxConsume(receive))).unwrap();
    }
    db.checkpoint().unwrap();
    // The meta, the topic, 10 messages, 50 dedupe entries and their order keys, 5 receipts and theirs.
    counts.insert("entries", db.inbox_entries_in_storage().unwrap());
    assert_eq!(counts["entries"], 1 + 1 + 10 + 100 + 10);
    let digest = db.digest().unwrap();
    drop(db);
    let db = open(dir.path());
    assert_eq!(db.digest().unwrap(), digest);
    assert_eq!(db.inbox_topic("o", "a").unwrap().unwrap().backlog, 10);
}
