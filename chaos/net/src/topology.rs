//! [`Topology`]: one network namespace per node, each joined by a veth pair to a bridge in the
//! harness's own (root) namespace, on a private /24 of 10.77.0.0/16; and the faults made on it
//! with `ip` and `tc` alone (no iptables).
//!
//! Names carry a prefix with the harness's pid (`tnc<pid>`), so two runs never touch each other's
//! namespaces and a run can tell a dead run's leftovers ([`remove_stale`]) from a live one's.
//!
//! Inside each namespace, `eth0`'s egress has an htb root with two classes: 1:1, where every packet
//! goes by default (its queue is where latency is added), and 1:2, whose queue holds 0 packets, so
//! whatever a filter sends there is dropped. Faults add filters ([`DropFilter`]) and remove them all
//! on heal; a full partition sets the host side of the node's veth down.

use crate::drop_filter::DropFilter;
use anyhow::Context;
use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// The /16 the per-run /24s come from.
const SUBNET_HIGH: [u8; 2] = [10, 77];
/// The bridge's (the harness's) host number in the /24.
const BRIDGE_HOST: u8 = 254;
/// Latency when the kernel has `netem`: a one-way delay with jitter on every node's egress.
const NETEM_DELAY: &[&str] = &["netem", "delay", "60ms", "30ms"];
/// Without `netem`, no qdisc can delay a packet; a token bucket this slow makes every link
/// bandwidth-starved instead: queueing delay up to `latency`, and drops past it.
const STARVED_LINK: &[&str] = &["tbf", "rate", "256kbit", "burst", "4kb", "latency", "300ms"];

/// The network of one run. Dropping it removes every namespace, link and bridge it made.
pub struct Topology {
    prefix: String,
    subnet: u8,
    nodes: u64,
    netem: bool,
    next_filter_priority: AtomicU32,
}

/// How latency is made on this kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LatencyKind {
    /// `netem delay 60ms 30ms` on every node's egress.
    Netem,
    /// No `netem` in this kernel: a 256 kbit/s token bucket on every node's egress.
    StarvedLink,
}

/// Why this machine cannot run the harness, if it cannot: not root, no `ip` or `tc`, or
/// `ip netns add` refused. `None` when it can.
pub fn unavailable_because() -> Option<String> {
    let uid = std::fs::read_to_string("/proc/self/status").ok().and_then(|status| {
        status
            .lines()
            .find_map(|line| line.strip_prefix("Uid:")?.split_whitespace().nth(1)?.parse::<u32>().ok())
    });
    if uid != Some(0) {
        return Some("not root (network namespaces need CAP_NET_ADMIN)".into());
    }
    for tool in ["ip", "tc"] {
        if Command::new(tool).arg("-V").output().is_err() {
            return Some(format!("`{tool}` is missing (install iproute2)"));
        }
    }
    let probe = format!("tnc{}-probe", std::process::id());
    if let Err(e) = run(&["ip", "netns", "add", &probe]) {
        return Some(format!("`ip netns add` does not work here: {e:#}"));
    }
    let _ = run(&["ip", "netns", "del", &probe]);
    None
}

/// Removes the namespaces, veths and bridges of earlier runs whose process is gone (a run killed
/// with SIGKILL cannot clean up after itself); returns how many namespaces it removed.
pub fn remove_stale() -> usize {
    let Ok(list) = run(&["ip", "netns", "list"]) else { return 0 };
    let mut removed = 0;
    for name in list.lines().filter_map(|line| line.split_whitespace().next()) {
        let Some(pid) = name.strip_prefix("tnc").and_then(|rest| rest.split('-').next()) else { continue };
        if pid.parse::<u32>().is_err() || std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let id = name.rsplit_once("-n").map(|(_, id)| id).unwrap_or_default();
        let _ = run(&["ip", "link", "del", &format!("tnc{pid}v{id}")]);
        let _ = run(&["ip", "netns", "del", name]);
        let _ = run(&["ip", "link", "del", &format!("tnc{pid}br")]);
        removed += 1;
    }
    removed
}

impl Topology {
    /// Makes the bridge (with the harness's address) and one namespace per node (ids 1..=nodes),
    /// each node's `eth0` at 10.77.S.<id>/24, and probes whether the kernel has `netem`.
    pub fn create(nodes: u64) -> anyhow::Result<Topology> {
        let prefix = format!("tnc{}", std::process::id());
        let subnet = free_subnet()?;
        let mut topology =
            Topology { prefix, subnet, nodes, netem: false, next_filter_priority: AtomicU32::new(1) };
        // From here on, a failure drops `topology`, which removes what was made so far.
        let bridge = topology.bridge();
        run(&["ip", "link", "add", &bridge, "type", "bridge"])?;
        run(&["ip", "link", "set", &bridge, "up"])?;
        run(&["ip", "addr", "add", &format!("{}/24", topology.harness_address()), "dev", &bridge])?;
        for id in 1..=nodes {
            topology.add_node(id)?;
        }
        let netem =
            topology.tc(1, &["qdisc", "add", "dev", "eth0", "parent", "1:1", "handle", "10:"], NETEM_DELAY);
        topology.netem = netem.is_ok();
        if topology.netem {
            topology.tc(1, &["qdisc", "del", "dev", "eth0", "parent", "1:1", "handle", "10:"], &[])?;
        }
        Ok(topology)
    }

    fn add_node(&self, id: u64) -> anyhow::Result<()> {
        let (namespace, host_side) = (self.namespace(id), self.host_side(id));
        run(&["ip", "netns", "add", &namespace])?;
        run(&["ip", "link", "add", &host_side, "type", "veth", "peer", "name", "eth0", "netns", &namespace])?;
        run(&["ip", "link", "set", &host_side, "master", &self.bridge()])?;
        run(&["ip", "link", "set", &host_side, "up"])?;
        let address = format!("{}/24", self.address(id));
        run(&["ip", "-n", &namespace, "addr", "add", &address, "dev", "eth0"])?;
        run(&["ip", "-n", &namespace, "link", "set", "eth0", "up"])?;
        run(&["ip", "-n", &namespace, "link", "set", "lo", "up"])?;
        // The drop machinery (module docs): class 1:1 for everything, 1:2 with a 0-packet queue.
        self.tc(id, &["qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "1"], &[])?;
        for class in ["1:1", "1:2"] {
            let class_args = ["class", "add", "dev", "eth0", "parent", "1:", "classid", class];
            self.tc(id, &class_args, &["htb", "rate", "10gbit"])?;
        }
        self.tc(
            id,
            &["qdisc", "add", "dev", "eth0", "parent", "1:2", "handle", "2:", "pfifo", "limit", "0"],
            &[],
        )?;
        Ok(())
    }

    /// Node `id`'s namespace.
    pub fn namespace(&self, id: u64) -> String {
        format!("{}-n{id}", self.prefix)
    }

    /// Node `id`'s address.
    pub fn address(&self, id: u64) -> Ipv4Addr {
        Ipv4Addr::new(SUBNET_HIGH[0], SUBNET_HIGH[1], self.subnet, id as u8)
    }

    /// The harness's address on the bridge.
    pub fn harness_address(&self) -> Ipv4Addr {
        Ipv4Addr::new(SUBNET_HIGH[0], SUBNET_HIGH[1], self.subnet, BRIDGE_HOST)
    }

    /// The subnet, for the report.
    pub fn subnet(&self) -> String {
        format!("{}.{}.{}.0/24", SUBNET_HIGH[0], SUBNET_HIGH[1], self.subnet)
    }

    /// How [`Topology::add_latency`] delays packets on this kernel.
    pub fn latency_kind(&self) -> LatencyKind {
        if self.netem {
            LatencyKind::Netem
        } else {
            LatencyKind::StarvedLink
        }
    }

    fn bridge(&self) -> String {
        format!("{}br", self.prefix)
    }

    fn host_side(&self, id: u64) -> String {
        format!("{}v{id}", self.prefix)
    }

    /// Full partition: the node's link to the bridge goes down (peers and harness alike lose it).
    pub fn link_down(&self, id: u64) -> anyhow::Result<()> {
        run(&["ip", "link", "set", &self.host_side(id), "down"]).map(drop)
    }

    /// Brings the node's link back up.
    pub fn link_up(&self, id: u64) -> anyhow::Result<()> {
        run(&["ip", "link", "set", &self.host_side(id), "up"]).map(drop)
    }

    /// Drops `loss_percent` % of the IPv4 packets `from` sends to `to` (one direction only).
    pub fn drop_packets(&self, from: u64, to: u64, loss_percent: u32) -> anyhow::Result<()> {
        let filter = DropFilter { destination: Some(self.address(to)), loss_percent };
        let priority = self.next_filter_priority.fetch_add(1, Ordering::Relaxed).to_string();
        let bytecode = filter.bytecode();
        let args = ["filter", "add", "dev", "eth0", "parent", "1:", "protocol", "all", "prio", &priority];
        self.tc(from, &args, &["bpf", "bytecode", &bytecode, "flowid", "1:2"])
    }

    /// Cuts `a` and `b` from each other, both directions.
    pub fn cut(&self, a: u64, b: u64) -> anyhow::Result<()> {
        self.drop_packets(a, b, 100)?;
        self.drop_packets(b, a, 100)
    }

    /// Delays every packet node `id` sends ([`LatencyKind`] says how).
    pub fn add_latency(&self, id: u64) -> anyhow::Result<()> {
        let how = if self.netem { NETEM_DELAY } else { STARVED_LINK };
        self.tc(id, &["qdisc", "replace", "dev", "eth0", "parent", "1:1", "handle", "10:"], how)
    }

    /// Undoes every fault on node `id`'s network: link up, no drop filter, no delay.
    pub fn heal(&self, id: u64) -> anyhow::Result<()> {
        self.link_up(id)?;
        // Both may find nothing to remove: a node may have had no filter or no delay.
        let _ = self.tc(id, &["filter", "del", "dev", "eth0", "parent", "1:"], &[]);
        let _ = self.tc(id, &["qdisc", "del", "dev", "eth0", "parent", "1:1", "handle", "10:"], &[]);
        let filters = self.tc_show(id, "filter")?;
        anyhow::ensure!(filters.trim().is_empty(), "node {id} still has filters after heal: {filters}");
        Ok(())
    }

    /// Packets node `id`'s drop class has dropped so far (what the drop filters matched): the
    /// evidence that a tc fault did bite.
    pub fn dropped_packets(&self, id: u64) -> anyhow::Result<u64> {
        let shown = self.tc_show(id, "qdisc")?;
        Ok(dropped_by_drop_class(&shown).unwrap_or(0))
    }

    /// `tc -s <what> show dev eth0` in node `id`'s namespace (qdisc drop counters, filters).
    pub fn tc_show(&self, id: u64, what: &str) -> anyhow::Result<String> {
        run(&["tc", "-n", &self.namespace(id), "-s", what, "show", "dev", "eth0"])
    }

    fn tc(&self, id: u64, args: &[&str], more: &[&str]) -> anyhow::Result<()> {
        let namespace = self.namespace(id);
        let mut all = vec!["tc", "-n", namespace.as_str()];
        all.extend_from_slice(args);
        all.extend_from_slice(more);
        run(&all).map(drop)
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        // Deleting a namespace does not always take its veth at once (the kernel frees it when
        // the last reference goes); delete the host side, which takes both ends.
        for id in 1..=self.nodes {
            let _ = run(&["ip", "link", "del", &self.host_side(id)]);
            let _ = run(&["ip", "netns", "del", &self.namespace(id)]);
        }
        let _ = run(&["ip", "link", "del", &self.bridge()]);
    }
}

/// The `dropped` counter of qdisc `2:` (the drop class's queue) in `tc -s qdisc show` output.
fn dropped_by_drop_class(shown: &str) -> Option<u64> {
    let mut lines = shown.lines().skip_while(|line| !line.starts_with("qdisc pfifo 2:"));
    lines.next()?;
    let counters = lines.next()?;
    let after = counters.split("dropped ").nth(1)?;
    after.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// A /24 of 10.77.0.0/16 that no interface on this machine has an address in.
fn free_subnet() -> anyhow::Result<u8> {
    let taken = run(&["ip", "-4", "-o", "addr", "show"])?;
    let start = std::process::id() % 250;
    (0..250u32)
        .map(|step| (1 + (start + step) % 250) as u8)
        .find(|third| !taken.contains(&format!(" {}.{}.{third}.", SUBNET_HIGH[0], SUBNET_HIGH[1])))
        .context("every 10.77.x.0/24 is in use")
}

/// Runs a command; its stdout, or an error with the command line and its stderr.
pub fn run(args: &[&str]) -> anyhow::Result<String> {
    let (program, rest) = args.split_first().context("empty command")?;
    let output = Command::new(program).args(rest).output().with_context(|| format!("run {program}"))?;
    anyhow::ensure!(
        output.status.success(),
        "`{}` failed ({}): {}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drop_class_counter_is_read_from_tc_statistics() {
        let shown = "qdisc htb 1: root refcnt 3 r2q 10 default 0x1 direct_packets_stat 0 direct_qlen 1000\n \
                     Sent 6430 bytes 81 pkt (dropped 3, overlimits 0 requeues 0) \n \
                     backlog 0b 0p requeues 0\n\
                     qdisc pfifo 2: parent 1:2 limit 0p\n \
                     Sent 0 bytes 0 pkt (dropped 26, overlimits 0 requeues 0) \n";
        assert_eq!(dropped_by_drop_class(shown), Some(26));
        assert_eq!(dropped_by_drop_class("qdisc noqueue 0: root"), None);
    }
}
