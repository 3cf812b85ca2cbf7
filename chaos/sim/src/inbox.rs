//! The inbox part of the workload (invariant 6): a sender beside the writers, a receiver that
//! takes messages during the load as a client would (a lost answer retried with the same
//! `receive_id` on the next node), and after the heal a drain and the checks: every acknowledged
//! send delivered exactly once, FIFO per topic, resends answered as the first send, every node
//! holding the same inbox.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use crate::http::{request, Answer};
use crate::violation::{body_start, Node, Violation};
use crate::workload::{host, wait_unpaused, write_retrying, Outcome, Shared, Workload, REQUEST_TIMEOUT};

/// The inbox the simulation uses.
pub const OWNER: &str = "sim";
/// Its topics: a send goes to `t{id % 2}`.
const TOPICS: [&str; 2] = ["t0", "t1"];
/// How long a receive during the load waits (below the request timeout).
const RECEIVE_WAIT_MS: u64 = 300;
/// Attempts per receive id before it is left for after the heal.
const RECEIVE_ATTEMPTS: u32 = 8;
/// Most receives of the drain after the heal.
const DRAIN_MAX: usize = 10_000;

/// What the client saw of the inbox.
#[derive(Clone, Debug, Default)]
pub struct InboxLog {
    /// Acknowledged sends: writer id → (topic, inbox_seq).
    pub sent: BTreeMap<u64, (String, u64)>,
    /// Deliveries in the order answered: (receive id, receive seqno, topic, inbox_seq, writer id).
    pub delivered: Vec<(String, u64, String, u64, u64)>,
    /// Receive ids not answered yet: in flight, or unknown after their attempts, or cut off when
    /// the load ended (retried after the heal: one may have taken a message).
    pub unanswered: Vec<String>,
    /// Next receive id.
    pub next_receive: u64,
}

/// Whether write `id` also sends an inbox message (and, one in two of those, resends it).
pub fn sends(id: u64) -> bool {
    id % 4 == 2
}

/// Sends writer `id`'s message, retried across nodes with the same `message_id`; one in two is
/// sent again once acknowledged, which must be answered as the first.
pub async fn send(workload: &Workload, shared: &Rc<RefCell<Shared>>, id: u64) {
    let topic = TOPICS[(id / 4 % 2) as usize];
    let body = serde_json::json!({"topic": topic, "payload": {"w": id}, "message_id": format!("m{id}")});
    let body = serde_json::to_vec(&body).unwrap_or_default();
    let path = format!("/v1/inboxes/{OWNER}/messages");
    let mut first = None;
    for round in 0..=u64::from(id % 8 == 2) {
        match write_retrying(workload, shared, id, ("POST", &path), body.clone(), &[]).await {
            Outcome::Acked { body, .. } => {
                let reply = serde_json::from_slice::<serde_json::Value>(&body).unwrap_or_default();
                let Some(inbox_seq) = reply.get("inbox_seq").and_then(serde_json::Value::as_u64) else {
                    shared.borrow_mut().violations.push(Violation::AckWithoutSeqno { id });
                    return;
                };
                match first {
                    None => first = Some(inbox_seq),
                    Some(first) if first != inbox_seq || reply.get("duplicate") != Some(&true.into()) => {
                        let violation = Violation::InboxResendAnsweredAsNew { id, first, resent: inbox_seq };
                        shared.borrow_mut().violations.push(violation);
                    }
                    Some(_) => {}
                }
                let mut shared = shared.borrow_mut();
                shared.inbox.sent.insert(id, (topic.to_string(), inbox_seq));
                if round == 0 {
                    shared.trace.push(format!("inbox send {id} {inbox_seq}"));
                }
            }
            Outcome::Refused { status, body } => {
                let violation = Violation::WriteRefused { id, status, body: body_start(&body) };
                shared.borrow_mut().violations.push(violation);
                return;
            }
            Outcome::Unknown => return,
        }
    }
}

/// What one receive id came to.
enum Received {
    /// A delivery was answered (and recorded).
    Message,
    /// Nothing was there (204).
    Nothing,
    /// No answer told.
    Unknown,
}

/// Receives with `receive_id` at the believed leader, retried with the same id on the next node
/// until a node answers.
async fn receive(
    workload: &Workload,
    shared: &Rc<RefCell<Shared>>,
    receive_id: &str,
    wait_ms: u64,
) -> Received {
    let body = serde_json::json!({"topics": TOPICS, "receive_id": receive_id, "wait_ms": wait_ms});
    let body = serde_json::to_vec(&body).unwrap_or_default();
    let path = format!("/v1/inboxes/{OWNER}/receive");
    for attempt in 0..RECEIVE_ATTEMPTS {
        let node = shared.borrow().leader_guess;
        match request(&host(node), "POST", &path, Some(body.clone()), &[], REQUEST_TIMEOUT).await {
            Ok(Answer { status: 200, body }) => {
                record(shared, receive_id, &body);
                return Received::Message;
            }
            Ok(Answer { status: 204, .. }) => return Received::Nothing,
            Ok(Answer { status, body }) if (400..500).contains(&status) && status != 429 => {
                let receive_id = receive_id.to_string();
                let violation =
                    Violation::InboxReceiveRefused { receive_id, status, body: body_start(&body) };
                shared.borrow_mut().violations.push(violation);
                return Received::Nothing;
            }
            _ => {
                shared.borrow_mut().leader_guess = (node + 1) % workload.nodes;
                tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt + 1))).await;
            }
        }
    }
    Received::Unknown
}

/// Records a delivery from a receive's answer.
fn record(shared: &Rc<RefCell<Shared>>, receive_id: &str, body: &[u8]) {
    let value = serde_json::from_slice::<serde_json::Value>(body).unwrap_or_default();
    let number = |pointer: &str| value.pointer(pointer).and_then(serde_json::Value::as_u64).unwrap_or(0);
    let topic = value.get("topic").and_then(serde_json::Value::as_str).unwrap_or_default().to_string();
    let (seqno, inbox_seq, id) = (number("/seqno"), number("/inbox_seq"), number("/payload/w"));
    let mut shared = shared.borrow_mut();
    shared.trace.push(format!("inbox delivery {receive_id} {inbox_seq} at {seqno}"));
    shared.inbox.delivered.push((receive_id.to_string(), seqno, topic, inbox_seq, id));
}

fn next_receive_id(shared: &Rc<RefCell<Shared>>) -> String {
    let mut shared = shared.borrow_mut();
    shared.inbox.next_receive += 1;
    format!("r{}", shared.inbox.next_receive)
}

/// The receiver during the load: one receive at a time, each waiting a little.
pub async fn receive_along(workload: Workload, shared: Rc<RefCell<Shared>>) {
    loop {
        wait_unpaused(&shared).await;
        let receive_id = next_receive_id(&shared);
        // Noted before it is sent: the load's end may cut it off after it took a message.
        shared.borrow_mut().inbox.unanswered.push(receive_id.clone());
        if !matches!(receive(&workload, &shared, &receive_id, RECEIVE_WAIT_MS).await, Received::Unknown) {
            shared.borrow_mut().inbox.unanswered.retain(|id| *id != receive_id);
        }
        // Period of the receiver's polls (a receive that found nothing has waited already).
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// After the heal: answers every receive left unanswered (a lost answer is recovered by its id),
/// then takes what is left until nothing is.
pub async fn drain(workload: &Workload, shared: &Rc<RefCell<Shared>>) {
    let unanswered = std::mem::take(&mut shared.borrow_mut().inbox.unanswered);
    for receive_id in unanswered {
        if let Received::Unknown = receive(workload, shared, &receive_id, 0).await {
            shared.borrow_mut().violations.push(Violation::InboxUnreadable { node: None, read: receive_id });
        }
    }
    for _ in 0..DRAIN_MAX {
        let receive_id = next_receive_id(shared);
        match receive(workload, shared, &receive_id, 0).await {
            Received::Message => {}
            Received::Nothing => return,
            Received::Unknown => {
                shared
                    .borrow_mut()
                    .violations
                    .push(Violation::InboxUnreadable { node: None, read: receive_id });
                return;
            }
        }
    }
}

/// Invariant 6, after the drain: every acknowledged send delivered exactly once and to one
/// receive, each topic delivered in send order, and every node holding the same drained inbox.
pub async fn check(workload: &Workload, shared: &Rc<RefCell<Shared>>, seqno: u64) {
    let log = shared.borrow().inbox.clone();
    let mut receives_of: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for (receive_id, _, _, inbox_seq, _) in &log.delivered {
        let receives = receives_of.entry(*inbox_seq).or_default();
        if !receives.contains(receive_id) {
            receives.push(receive_id.clone());
        }
    }
    let mut violations = Vec::new();
    for (inbox_seq, receives) in &receives_of {
        if receives.len() > 1 {
            violations
                .push(Violation::InboxDeliveredTwice { inbox_seq: *inbox_seq, receives: receives.clone() });
        }
    }
    for (id, (_, inbox_seq)) in &log.sent {
        if !receives_of.contains_key(inbox_seq) {
            violations.push(Violation::InboxMessageLost { id: *id, inbox_seq: *inbox_seq });
        }
    }
    // Per topic, in the order the receives were applied, sequences only ascend.
    let mut by_receive: Vec<&(String, u64, String, u64, u64)> = log.delivered.iter().collect();
    by_receive.sort_by_key(|(_, seqno, _, inbox_seq, _)| (*seqno, *inbox_seq));
    by_receive.dedup_by_key(|(receive_id, ..)| receive_id.clone());
    let mut last: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for (_, seqno, topic, inbox_seq, _) in by_receive {
        if let Some(previous) = last.insert(topic, (*seqno, *inbox_seq)) {
            if previous.1 >= *inbox_seq {
                let later = (*seqno, *inbox_seq);
                violations.push(Violation::InboxOutOfOrder {
                    topic: topic.clone(),
                    earlier: previous,
                    later,
                });
            }
        }
    }
    violations.extend(same_inbox_everywhere(workload, seqno).await);
    let mut shared = shared.borrow_mut();
    shared.trace.push(format!("inbox: {} sent, {} delivered", log.sent.len(), receives_of.len()));
    shared.violations.extend(violations);
}

/// Every node's view of the inbox at `seqno`: the same consumed count, no backlog left.
async fn same_inbox_everywhere(workload: &Workload, seqno: u64) -> Vec<Violation> {
    let mut violations = Vec::new();
    let mut views = Vec::new();
    for node in 0..workload.nodes {
        let path = format!("/v1/inboxes/{OWNER}?min_seqno={seqno}");
        match request(&host(node), "GET", &path, None, &[], REQUEST_TIMEOUT).await {
            Ok(Answer { status: 200, body }) => {
                let view = serde_json::from_slice::<serde_json::Value>(&body).unwrap_or_default();
                let consumed = view.get("consumed").and_then(serde_json::Value::as_u64).unwrap_or(0);
                let backlog: u64 = view
                    .get("topics")
                    .and_then(serde_json::Value::as_array)
                    .map_or(0, |topics| topics.iter().filter_map(|t| t.get("backlog")?.as_u64()).sum());
                views.push((Node(node), consumed, backlog));
            }
            // No message ever sent: no inbox on any node.
            Ok(Answer { status: 404, .. }) => views.push((Node(node), 0, 0)),
            Ok(Answer { status, body }) => violations.push(Violation::InboxUnreadable {
                node: Some(Node(node)),
                read: format!("{status} {}", body_start(&body)),
            }),
            Err(error) => violations
                .push(Violation::InboxUnreadable { node: Some(Node(node)), read: format!("{error:#}") }),
        }
    }
    let differ = views.windows(2).any(|pair| (pair[0].1, pair[0].2) != (pair[1].1, pair[1].2));
    if differ || views.iter().any(|(_, _, backlog)| *backlog > 0) {
        violations.push(Violation::InboxStateDiffers { views });
    }
    violations
}
