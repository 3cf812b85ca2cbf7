//! [`PortLease`]: loopback ports for test nodes that nothing else takes while a test holds them.
//!
//! A port found by binding port 0 comes from the kernel's ephemeral range, the range every outgoing
//! connection's source port is drawn from too. Between choosing such a port and the node binding
//! it, or between a node's stop and its restart on the same address, any client connection on the
//! machine (another test's, or this test's own probes) could take it, and the node then fails to
//! start or another test's node answers on it. Leased ports come from below the ephemeral range,
//! which the kernel never hands out on its own, and each is held by an advisory lock on a file
//! under the temp dir, so concurrent test processes (nextest runs every test in its own) never
//! lease the same port. The lock is the kernel's (`flock`): it goes away with the process, so a
//! killed test leaves nothing to clean up. Lock files are left in place (a few bytes each, at most
//! one per port of the range); removing one another process may be about to lock would race.

use anyhow::Context;
use std::fs::{File, OpenOptions, TryLockError};
use std::path::PathBuf;

/// Lowest port leased.
const LOWEST: u16 = 24_000;
/// Used when the ephemeral range cannot be read: Linux's default start.
const DEFAULT_EPHEMERAL_START: u16 = 32_768;
/// Fewest ports the leased range may have before leasing refuses to guess.
const MIN_RANGE: u16 = 1_000;

/// Ports leased to this process until the lease is dropped.
#[derive(Debug)]
pub struct PortLease {
    ports: Vec<u16>,
    /// One locked file per port; dropping them releases the ports.
    _locks: Vec<File>,
}

impl PortLease {
    /// Leases `count` distinct loopback ports, each free (bindable on 127.0.0.1) at the time of the
    /// call and locked against every other lease on the machine.
    pub fn take(count: usize) -> anyhow::Result<PortLease> {
        let (lowest, end) = leasable_range()?;
        PortLease::take_in(lowest, end, start_offset(u32::from(end - lowest)), count)
    }

    /// Leases `count` ports of `lowest..end`, looking from `lowest + start` on (wrapping around).
    fn take_in(lowest: u16, end: u16, start: u32, count: usize) -> anyhow::Result<PortLease> {
        let dir = lock_dir();
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let span = u32::from(end - lowest);
        let mut lease = PortLease { ports: Vec::with_capacity(count), _locks: Vec::with_capacity(count) };
        for step in 0..span {
            if lease.ports.len() == count {
                break;
            }
            let port = lowest + ((start + step) % span) as u16;
            if let Some(lock) = claim(&dir, port)? {
                lease.ports.push(port);
                lease._locks.push(lock);
            }
        }
        anyhow::ensure!(
            lease.ports.len() == count,
            "only {} of {count} loopback ports in {lowest}..{end} are free and unleased",
            lease.ports.len()
        );
        Ok(lease)
    }

    /// Leases two blocks of `count` consecutive ports, `base..base+count` and
    /// `base+offset..base+offset+count` (the HTTP and RPC ports `tidal cluster up --port-base base`
    /// gives its nodes, with `offset` its RPC offset). [`PortLease::port`]`(0)` is `base`.
    pub fn take_block(count: u16, offset: u16) -> anyhow::Result<PortLease> {
        let (lowest, end) = leasable_range()?;
        anyhow::ensure!(count > 0 && offset >= count, "blocks of {count} ports {offset} apart overlap");
        let last_base = end.checked_sub(offset + count).filter(|last| *last >= lowest);
        let Some(last_base) = last_base else {
            anyhow::bail!("no room for two blocks of {count} ports {offset} apart in {lowest}..{end}");
        };
        let dir = lock_dir();
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let span = u32::from(last_base - lowest) + 1;
        let start = start_offset(span);
        'bases: for step in 0..span {
            let base = lowest + ((start + step) % span) as u16;
            let mut lease = PortLease { ports: Vec::new(), _locks: Vec::new() };
            for port in (base..base + count).chain(base + offset..base + offset + count) {
                let Some(lock) = claim(&dir, port)? else { continue 'bases };
                lease.ports.push(port);
                lease._locks.push(lock);
            }
            return Ok(lease);
        }
        anyhow::bail!("no two free, unleased blocks of {count} ports {offset} apart in {lowest}..{end}")
    }

    /// The leased ports, in the order they were leased.
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// The `index`-th leased port.
    pub fn port(&self, index: usize) -> u16 {
        self.ports[index]
    }

    /// `127.0.0.1:PORT` of the `index`-th leased port.
    pub fn address(&self, index: usize) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port(index)))
    }
}

/// `[LOWEST, start of the ephemeral range)`.
fn leasable_range() -> anyhow::Result<(u16, u16)> {
    let end = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next().and_then(|low| low.parse::<u16>().ok()))
        .unwrap_or(DEFAULT_EPHEMERAL_START);
    anyhow::ensure!(
        end >= LOWEST + MIN_RANGE,
        "the ephemeral port range starts at {end}: too few ports below it (from {LOWEST}) to lease \
         test ports that no outgoing connection can take"
    );
    Ok((LOWEST, end))
}

fn lock_dir() -> PathBuf {
    std::env::temp_dir().join("tidal-test-ports")
}

/// Where this lease starts looking: spread by process and time, so concurrent tests rarely probe
/// the same ports first (correctness does not depend on it; the locks do that).
fn start_offset(span: u32) -> u32 {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let mixed = u64::from(std::process::id()).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(nanos);
    (mixed % u64::from(span)) as u32
}

/// The locked lock file of `port` if no other lease holds it and nothing listens on it.
fn claim(dir: &std::path::Path, port: u16) -> anyhow::Result<Option<File>> {
    let lock = try_lock(dir, port)?;
    Ok(lock.filter(|_| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()))
}

/// The locked lock file of `port`, or None if another lease holds it.
fn try_lock(dir: &std::path::Path, port: u16) -> anyhow::Result<Option<File>> {
    let path = dir.join(port.to_string());
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("open port lock {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(TryLockError::WouldBlock) => Ok(None),
        Err(TryLockError::Error(error)) => {
            Err(error).with_context(|| format!("lock port lock {}", path.display()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_distinct_below_the_ephemeral_range_and_released_on_drop() {
        let (lowest, end) = leasable_range().unwrap();
        let first = PortLease::take(4).unwrap();
        let second = PortLease::take(4).unwrap();
        let mut all: Vec<u16> = first.ports().iter().chain(second.ports()).copied().collect();
        assert!(all.iter().all(|port| (lowest..end).contains(port)), "{all:?} outside {lowest}..{end}");
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 8, "two leases shared a port: {first:?} {second:?}");
        // A held port cannot be locked again, even from this process (flock locks are per open file).
        assert!(try_lock(&lock_dir(), first.port(0)).unwrap().is_none());
        let port = first.port(0);
        drop(first);
        assert!(try_lock(&lock_dir(), port).unwrap().is_some(), "a dropped lease still holds {port}");
    }

    #[test]
    fn a_block_lease_holds_both_blocks() {
        let block = PortLease::take_block(3, 100).unwrap();
        let base = block.port(0);
        assert_eq!(block.ports(), [base, base + 1, base + 2, base + 100, base + 101, base + 102]);
        for port in block.ports() {
            assert!(try_lock(&lock_dir(), *port).unwrap().is_none(), "{port} is not held");
        }
        let other = PortLease::take(6).unwrap();
        assert!(other.ports().iter().all(|port| !block.ports().contains(port)));
    }

    #[test]
    fn a_port_someone_listens_on_is_not_leased() {
        let lease = PortLease::take(1).unwrap();
        let port = lease.port(0);
        let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        drop(lease);
        // Unleased but bound: a lease of exactly that port finds nothing.
        let refused = PortLease::take_in(port, port + 1, 0, 1).unwrap_err().to_string();
        assert!(refused.contains("only 0 of 1"), "{refused}");
        drop(listener);
        let again = PortLease::take_in(port, port + 1, 0, 1).unwrap();
        assert_eq!(again.ports(), [port]);
    }
}
