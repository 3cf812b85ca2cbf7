//! The connections one port keeps open: at most `max`, and when a new one arrives at the cap, the
//! one that has waited longest without doing anything is closed to make room.
//!
//! Why evict instead of refusing at the cap: sockets that connect and send nothing cost an attacker
//! nothing, so a plain cap lets anyone who can reach the port fill it and lock every real client
//! out until the idle timeout. Closing the longest-idle connection that has not proved itself keeps
//! a slot for whoever actually sends a request. A connection is protected while it is busy (an
//! HTTP request in flight, its reply still streaming) or once it is trusted (an RPC connection that
//! carried the cluster secret, or a peer that presented a cluster certificate).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// What [`eviction_candidate`] needs to know of one open connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotView {
    /// The connection's number (admission order).
    pub id: u64,
    /// Requests in flight on it.
    pub busy: bool,
    /// It proved itself (secret or certificate): never evicted.
    pub trusted: bool,
    /// Milliseconds since the port opened at which it last became idle.
    pub idle_since_ms: u64,
}

/// The connection to close so that a new one can be admitted at the cap: the one idle longest
/// among those that are neither busy nor trusted (ties: the oldest). `None` when every connection is
/// busy or trusted, and the new one is refused instead.
pub fn eviction_candidate(slots: impl IntoIterator<Item = SlotView>) -> Option<u64> {
    slots
        .into_iter()
        .filter(|slot| !slot.busy && !slot.trusted)
        .min_by_key(|slot| (slot.idle_since_ms, slot.id))
        .map(|slot| slot.id)
}

/// One open connection's state, shared by its task and the port's table.
#[derive(Debug)]
pub struct Slot {
    id: u64,
    epoch: Instant,
    busy: AtomicUsize,
    idle_since_ms: AtomicU64,
    trusted: AtomicBool,
    evict: tokio::sync::Notify,
}

impl Slot {
    /// Marks a request in flight until the guard drops (its reply sent or abandoned).
    pub fn begin(self: &Arc<Slot>) -> BusyGuard {
        self.busy.fetch_add(1, Ordering::AcqRel);
        BusyGuard(self.clone())
    }

    /// Protects the connection from eviction for the rest of its life.
    pub fn trust(&self) {
        self.trusted.store(true, Ordering::Release);
    }

    /// Whether the connection proved itself.
    pub fn is_trusted(&self) -> bool {
        self.trusted.load(Ordering::Acquire)
    }

    /// Resolves once the port has chosen this connection to make room for a new one.
    pub async fn evicted(&self) {
        self.evict.notified().await;
    }

    fn view(&self) -> SlotView {
        SlotView {
            id: self.id,
            busy: self.busy.load(Ordering::Acquire) > 0,
            trusted: self.trusted.load(Ordering::Acquire),
            idle_since_ms: self.idle_since_ms.load(Ordering::Acquire),
        }
    }
}

/// A request in flight on a connection ([`Slot::begin`]).
#[derive(Debug)]
pub struct BusyGuard(Arc<Slot>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        let now = self.0.epoch.elapsed().as_millis() as u64;
        self.0.idle_since_ms.store(now, Ordering::Release);
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The open connections of one port.
#[derive(Debug)]
pub struct Conns {
    port: &'static str,
    max: usize,
    epoch: Instant,
    next: AtomicU64,
    open: Mutex<BTreeMap<u64, Arc<Slot>>>,
    /// Connections refused because every slot was busy or trusted.
    pub refused: AtomicU64,
    /// Idle connections closed to make room.
    pub evicted: AtomicU64,
}

impl Conns {
    /// A port (`"http"` or `"rpc"`, for logs and metrics) that keeps at most `max` connections.
    pub fn new(port: &'static str, max: usize) -> Arc<Conns> {
        assert!(max >= 1, "a port must keep at least one connection, got max {max}");
        Arc::new(Conns {
            port,
            max,
            epoch: Instant::now(),
            next: AtomicU64::new(0),
            open: Mutex::new(BTreeMap::new()),
            refused: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
        })
    }

    /// Admits a new connection, evicting the longest-idle untrusted one at the cap; `None` if the
    /// port is full of busy or trusted connections (the caller closes the new socket).
    pub fn admit(self: &Arc<Conns>) -> Option<Admitted> {
        let mut open = self.open.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if open.len() >= self.max {
            let Some(victim) = eviction_candidate(open.values().map(|slot| slot.view())) else {
                self.refused.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(port = self.port, max = self.max, "connection refused: every slot is busy");
                return None;
            };
            if let Some(slot) = open.remove(&victim) {
                slot.evict.notify_one();
                self.evicted.fetch_add(1, Ordering::Relaxed);
            }
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(Slot {
            id,
            epoch: self.epoch,
            busy: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(self.epoch.elapsed().as_millis() as u64),
            trusted: AtomicBool::new(false),
            evict: tokio::sync::Notify::new(),
        });
        open.insert(id, slot.clone());
        assert!(
            open.len() <= self.max,
            "{} port holds {} connections, cap {}",
            self.port,
            open.len(),
            self.max
        );
        Some(Admitted { conns: self.clone(), slot })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).len()
    }

    /// The port's name.
    pub fn port(&self) -> &'static str {
        self.port
    }
}

/// An admitted connection: holds its slot until dropped.
#[derive(Debug)]
pub struct Admitted {
    conns: Arc<Conns>,
    /// The connection's state.
    pub slot: Arc<Slot>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut open = self.conns.open.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        open.remove(&self.slot.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(id: u64, busy: bool, trusted: bool, idle_since_ms: u64) -> SlotView {
        SlotView { id, busy, trusted, idle_since_ms }
    }

    #[test]
    fn the_longest_idle_untrusted_connection_goes_first() {
        let slots = [view(0, false, false, 50), view(1, false, false, 10), view(2, false, true, 0)];
        assert_eq!(eviction_candidate(slots), Some(1));
        let slots = [view(0, true, false, 0), view(1, false, true, 0)];
        assert_eq!(eviction_candidate(slots), None, "busy and trusted connections stay");
        let slots = [view(3, false, false, 7), view(1, false, false, 7)];
        assert_eq!(eviction_candidate(slots), Some(1), "a tie goes to the older connection");
    }

    #[test]
    fn a_full_port_evicts_idle_and_refuses_when_all_are_busy() {
        let conns = Conns::new("test", 2);
        let first = conns.admit().expect("room");
        let second = conns.admit().expect("room");
        let _busy = second.slot.begin();
        let third = conns.admit().expect("the idle first connection makes room");
        assert_eq!(conns.open(), 2);
        assert_eq!(conns.evicted.load(Ordering::Relaxed), 1);
        let _busy_too = third.slot.begin();
        assert!(conns.admit().is_none(), "every slot busy: refused");
        assert_eq!(conns.refused.load(Ordering::Relaxed), 1);
        drop(first);
        assert_eq!(conns.open(), 2, "an evicted slot was already out of the table");
        drop(third);
        assert_eq!(conns.open(), 1);
    }
}
