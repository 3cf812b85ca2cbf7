//! The client history of register keys and its linearizability check (the read side of invariant 1
//! in PROTOCOL.md, "Invariants the simulation checks"; issue 5, item 6), with stateright's
//! `LinearizabilityTester` over its register semantics, one tester per key (linearizability is
//! local: a history is linearizable iff each key's is).
//!
//! An operation is invoked before its first request is sent and returns after its final answer:
//! - a write acknowledged (2xx) returns `WriteOk`; a write whose outcome is unknown (503, 504,
//!   timeouts on every attempt) stays in flight for good: the checker may place it anywhere after
//!   its invocation, or leave it out; its client thread ends there (a new one goes on);
//! - a read answered 200 returns the version it saw, 404 returns "absent"; a read that got no
//!   answer changed nothing and leaves the history.

use crate::violation::Violation;
use stateright::semantics::register::{Register, RegisterOp, RegisterRet};
use stateright::semantics::{ConsistencyTester, LinearizabilityTester};
use std::collections::BTreeMap;

/// How an operation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ret {
    /// Not yet.
    Pending,
    /// A write acknowledged.
    WriteOk,
    /// A write refused with a 4xx (nothing written; a violation is reported separately).
    Refused,
    /// A write with an unknown outcome.
    Unknown,
    /// A read saw this version (`None`: the key was absent).
    Read(Option<u64>),
    /// A read without an answer.
    Failed,
}

/// One operation.
#[derive(Clone, Debug)]
pub struct Op {
    /// The client thread.
    pub thread: u64,
    /// The register key (an item id).
    pub key: u64,
    /// `Some(version)` for a write, `None` for a read.
    pub write: Option<u64>,
    /// How it ended.
    pub ret: Ret,
}

#[derive(Clone, Copy, Debug)]
enum Event {
    Invoke(usize),
    Return(usize),
}

/// The history: operations and the real-time order of their invocations and returns.
#[derive(Clone, Debug, Default)]
pub struct History {
    ops: Vec<Op>,
    events: Vec<Event>,
}

impl History {
    /// Records an invocation; returns the operation's index.
    pub fn invoke(&mut self, thread: u64, key: u64, write: Option<u64>) -> usize {
        self.ops.push(Op { thread, key, write, ret: Ret::Pending });
        let index = self.ops.len() - 1;
        self.events.push(Event::Invoke(index));
        index
    }

    /// Records how operation `op` ended.
    pub fn returned(&mut self, op: usize, ret: Ret) {
        self.ops[op].ret = ret;
        self.events.push(Event::Return(op));
    }

    /// Operations recorded.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Counts: `(writes acked, writes unknown, reads answered, reads without an answer)`.
    pub fn counts(&self) -> (u64, u64, u64, u64) {
        let mut counts = (0, 0, 0, 0);
        for op in &self.ops {
            match op.ret {
                Ret::WriteOk => counts.0 += 1,
                Ret::Unknown | Ret::Pending if op.write.is_some() => counts.1 += 1,
                Ret::Read(_) => counts.2 += 1,
                Ret::Failed => counts.3 += 1,
                _ => {}
            }
        }
        counts
    }

    /// Checks every key's history; one violation per key that has no linearization.
    pub fn check(&self) -> Vec<Violation> {
        let mut testers: BTreeMap<u64, LinearizabilityTester<u64, Register<Option<u64>>>> = BTreeMap::new();
        let mut violations = Vec::new();
        for event in &self.events {
            let (index, invoke) = match *event {
                Event::Invoke(index) => (index, true),
                Event::Return(index) => (index, false),
            };
            let op = &self.ops[index];
            // Reads without an answer and refused writes took no effect: not in the history.
            if matches!(op.ret, Ret::Failed | Ret::Refused) {
                continue;
            }
            let tester = testers.entry(op.key).or_insert_with(|| LinearizabilityTester::new(Register(None)));
            let result = if invoke {
                let call = match op.write {
                    Some(version) => RegisterOp::Write(Some(version)),
                    None => RegisterOp::Read,
                };
                tester.on_invoke(op.thread, call).map(|_| ())
            } else {
                match op.ret {
                    Ret::WriteOk => tester.on_return(op.thread, RegisterRet::WriteOk).map(|_| ()),
                    Ret::Read(value) => tester.on_return(op.thread, RegisterRet::ReadOk(value)).map(|_| ()),
                    // In flight for good.
                    _ => Ok(()),
                }
            };
            if let Err(error) = result {
                violations.push(Violation::MalformedHistory { key: op.key, error: error.to_string() });
            }
        }
        for (key, tester) in &testers {
            if !tester.is_consistent() {
                violations.push(Violation::NotLinearizable {
                    key: *key,
                    operations: tester.len(),
                    history: self.describe(*key),
                });
            }
        }
        violations
    }

    /// A key's history in real-time order, for a violation report.
    fn describe(&self, key: u64) -> String {
        let mut lines = Vec::new();
        for event in &self.events {
            let (index, invoke) = match *event {
                Event::Invoke(index) => (index, true),
                Event::Return(index) => (index, false),
            };
            let op = &self.ops[index];
            if op.key != key || matches!(op.ret, Ret::Failed | Ret::Refused) {
                continue;
            }
            let what = match (invoke, op.write, op.ret) {
                (true, Some(version), _) => format!("t{:x} write {version}", op.thread),
                (true, None, _) => format!("t{:x} read", op.thread),
                (false, _, Ret::Read(value)) => format!("t{:x} -> {value:?}", op.thread),
                (false, _, ret) => format!("t{:x} -> {ret:?}", op.thread),
            };
            lines.push(what);
        }
        lines.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_read_after_an_acked_write_is_caught() {
        let mut history = History::default();
        let write = history.invoke(1, 7, Some(10));
        history.returned(write, Ret::WriteOk);
        let read = history.invoke(2, 7, None);
        history.returned(read, Ret::Read(None));
        assert_eq!(history.check().len(), 1);
    }

    #[test]
    fn an_unknown_write_may_or_may_not_have_happened() {
        let mut history = History::default();
        let write = history.invoke(1, 7, Some(10));
        history.returned(write, Ret::Unknown);
        let read = history.invoke(2, 7, None);
        history.returned(read, Ret::Read(None));
        let read = history.invoke(2, 7, None);
        history.returned(read, Ret::Read(Some(10)));
        assert!(history.check().is_empty());
        // But once seen, it cannot be unseen.
        let read = history.invoke(2, 7, None);
        history.returned(read, Ret::Read(None));
        assert_eq!(history.check().len(), 1);
    }

    #[test]
    fn concurrent_operations_may_go_either_way() {
        let mut history = History::default();
        let write = history.invoke(1, 7, Some(10));
        let read = history.invoke(2, 7, None);
        history.returned(read, Ret::Read(Some(10)));
        history.returned(write, Ret::WriteOk);
        assert!(history.check().is_empty());
    }
}
