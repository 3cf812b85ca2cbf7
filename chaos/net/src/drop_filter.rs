//! [`DropFilter`]: which packets a node's egress drops, as a classic BPF program for tc's `bpf`
//! classifier (`tc filter ... bpf bytecode "..."`).
//!
//! Why classic BPF: the kernels this runs on may lack `netem` and the `gact` action (the CI VM's
//! kernel has neither), but `cls_bpf` and `htb` are common. A classic program can match the IPv4
//! destination and draw a random number (the `SKF_AD_RANDOM` ancillary load), so one classifier
//! gives a cut (100 %) or a loss rate toward one peer or all, with no iptables and no eBPF
//! compiler. A match sends the packet to an htb class whose queue holds 0 packets: it is dropped.

use std::net::Ipv4Addr;

/// `BPF_LD | BPF_H | BPF_ABS`: load the 16-bit word at a packet offset.
const LDH_ABS: u16 = 0x28;
/// `BPF_LD | BPF_W | BPF_ABS`: load the 32-bit word at a packet offset (or an ancillary value).
const LD_ABS: u16 = 0x20;
/// `BPF_JMP | BPF_JEQ | BPF_K`.
const JEQ: u16 = 0x15;
/// `BPF_JMP | BPF_JGE | BPF_K`.
const JGE: u16 = 0x35;
/// `BPF_RET | BPF_K`.
const RET: u16 = 0x06;
/// `SKF_AD_OFF + SKF_AD_RANDOM`: loading this "offset" yields a fresh random u32.
const RANDOM: u32 = 0xffff_f000 + 56;
/// Offset of the Ethernet type (tc classifiers see the frame from its MAC header).
const ETHERTYPE_OFFSET: u32 = 12;
const ETHERTYPE_IPV4: u32 = 0x0800;
/// Offset of the IPv4 destination: 14 bytes of Ethernet header, then 16 into the IP header.
const IPV4_DESTINATION_OFFSET: u32 = 30;
/// For `cls_bpf` without direct action, a return of -1 means "matched: use the filter's flowid".
const MATCHED: u32 = u32::MAX;
const NOT_MATCHED: u32 = 0;

/// The IPv4 packets a node's egress drops: those to `destination` (every IPv4 packet if `None`),
/// each with probability `loss_percent` / 100.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DropFilter {
    pub destination: Option<Ipv4Addr>,
    pub loss_percent: u32,
}

/// One classic BPF instruction; `jump_false_to_end` marks a conditional jump whose false branch
/// goes to the final "not matched" return (its offset is known only once the program is built).
struct Step {
    code: u16,
    k: u32,
    jump_false_to_end: bool,
}

impl DropFilter {
    /// The program in the form `tc ... bpf bytecode` takes: `count,code jt jf k,...`.
    pub fn bytecode(&self) -> String {
        let mut steps = vec![
            Step { code: LDH_ABS, k: ETHERTYPE_OFFSET, jump_false_to_end: false },
            Step { code: JEQ, k: ETHERTYPE_IPV4, jump_false_to_end: true },
        ];
        if let Some(destination) = self.destination {
            steps.push(Step { code: LD_ABS, k: IPV4_DESTINATION_OFFSET, jump_false_to_end: false });
            steps.push(Step { code: JEQ, k: u32::from(destination), jump_false_to_end: true });
        }
        if self.loss_percent < 100 {
            steps.push(Step { code: LD_ABS, k: RANDOM, jump_false_to_end: false });
            steps.push(Step { code: JGE, k: self.random_threshold(), jump_false_to_end: true });
        }
        steps.push(Step { code: RET, k: MATCHED, jump_false_to_end: false });
        steps.push(Step { code: RET, k: NOT_MATCHED, jump_false_to_end: false });
        let not_matched = steps.len() - 1;
        let mut out = steps.len().to_string();
        for (index, step) in steps.iter().enumerate() {
            let jump_false = if step.jump_false_to_end { not_matched - index - 1 } else { 0 };
            out.push_str(&format!(",{} 0 {} {}", step.code, jump_false, step.k));
        }
        out
    }

    /// The random u32 at or above which a packet is dropped: `loss_percent` % of the range.
    fn random_threshold(&self) -> u32 {
        let kept = u64::from(100 - self.loss_percent.min(100));
        // 0 % would be 2^32: saturate (a drop chance of 1 in 2^32 is no loss worth naming).
        u32::try_from((kept << 32) / 100).unwrap_or(u32::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_to_one_peer_matches_ipv4_and_the_destination_only() {
        let filter = DropFilter { destination: Some(Ipv4Addr::new(10, 77, 9, 2)), loss_percent: 100 };
        // 10.77.9.2 = 172820738; both conditional jumps land on the last instruction (ret 0).
        assert_eq!(
            filter.bytecode(),
            "6,40 0 0 12,21 0 3 2048,32 0 0 30,21 0 1 172820738,6 0 0 4294967295,6 0 0 0"
        );
    }

    #[test]
    fn a_loss_rate_draws_a_random_number_against_its_share_of_the_range() {
        let filter = DropFilter { destination: None, loss_percent: 50 };
        assert_eq!(
            filter.bytecode(),
            "6,40 0 0 12,21 0 3 2048,32 0 0 4294963256,53 0 1 2147483648,6 0 0 4294967295,6 0 0 0"
        );
        assert_eq!(DropFilter { destination: None, loss_percent: 0 }.random_threshold(), u32::MAX);
    }
}
