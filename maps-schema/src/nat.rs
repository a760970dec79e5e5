//! Masquerade (`nat4`, `masq_if`, `masq_cidr4`): BPF SNAT of pod traffic leaving through the host
//! interfaces named by `--masquerade-interfaces`, to the interface's node address.
//!
//! `masq_egress` (tc egress of such an interface) translates a packet whose source is in a pool
//! CIDR (`masq_cidr4`) and whose destination is not: it looks up the flow's egress entry
//! (original tuple → node address and NAT port) or allocates a port — candidates from
//! [`port_candidate`], each claimed by inserting the ingress entry (translated reply tuple →
//! original address and port) with `BPF_NOEXIST`, at most [`PORT_RETRIES`] tries. `masq_ingress`
//! (tc ingress of the same interface) looks replies up by their tuple and translates them back.
//! Both entries of a flow carry their own `last_seen_ns`; the agent's sweep removes the pair once
//! both are idle for the protocol's timeout.

use crate::{assert_size, user_pod};

/// [`Nat4Key::direction`]: the original tuple of a pod's packet, seen by `masq_egress`.
pub const DIR_EGRESS: u8 = 0;
/// [`Nat4Key::direction`]: the translated tuple of a reply, seen by `masq_ingress`.
pub const DIR_INGRESS: u8 = 1;

/// The first NAT port. The range sits above Linux's default ephemeral range (32768–60999), so
/// the node's own connections do not take the ports the masquerade hands out.
pub const PORT_MIN: u16 = 61_000;
/// The last NAT port (inclusive).
pub const PORT_MAX: u16 = 65_535;
/// Number of NAT ports per (remote address, remote port, protocol).
pub const PORT_COUNT: u32 = PORT_MAX as u32 - PORT_MIN as u32 + 1;
/// Candidate ports tried before a new flow is refused (`nat-port-exhausted`).
pub const PORT_RETRIES: u32 = 16;

/// [`Nat4Entry::flags`]: a TCP FIN or RST went through this direction (the flow is closing).
pub const FLAG_TCP_CLOSING: u16 = 1;

/// `nat_events` slot: egress (and ingress) entry pairs the programs created.
pub const EVENT_CREATED: u32 = 0;
/// `nat_events` slot: port candidates refused because another flow held them (collisions).
pub const EVENT_COLLISION: u32 = 1;
/// `nat_events` slot: new flows refused because no candidate port was free.
pub const EVENT_EXHAUSTED: u32 = 2;
/// `nat_events` slot: NAT entries the map refused (full or busy: map pressure).
pub const EVENT_INSERT_FAILED: u32 = 3;

/// Timeouts of the agent's NAT sweep (seconds since the later `last_seen_ns` of a pair).
pub const TIMEOUT_TCP_SECS: u64 = crate::conntrack::TIMEOUT_TCP_ESTABLISHED_SECS;
/// TCP after a FIN or an RST in either direction.
pub const TIMEOUT_TCP_CLOSING_SECS: u64 = 60;
/// UDP.
pub const TIMEOUT_UDP_SECS: u64 = crate::conntrack::TIMEOUT_OTHER_SECS;
/// ICMP echo.
pub const TIMEOUT_ICMP_SECS: u64 = crate::conntrack::TIMEOUT_ICMP_SECS;

/// A NAT key: a packet's tuple as the program sees it (addresses in network byte order, ports
/// in host byte order; ICMP echo as conntrack has it: a request `(id, 0)`, a reply `(0, id)`).
#[repr(C)]
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    bytemuck::Pod,
    bytemuck::Zeroable,
)]
pub struct Nat4Key {
    /// Source address.
    pub saddr: [u8; 4],
    /// Destination address.
    pub daddr: [u8; 4],
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
    /// IP protocol.
    pub protocol: u8,
    /// [`DIR_EGRESS`] or [`DIR_INGRESS`].
    pub direction: u8,
    /// Explicit padding; always zero.
    pub _pad: [u8; 2],
}
assert_size!(Nat4Key, 16);
user_pod!(Nat4Key);

/// A NAT value: what the packet's own address and port become. An egress entry holds the node
/// address and the NAT port (the new source); an ingress entry the pod's address and port (the
/// new destination).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Nat4Entry {
    /// The translated address (network byte order).
    pub addr: [u8; 4],
    /// The translated port (host byte order; the echo identifier for ICMP).
    pub port: u16,
    /// `FLAG_*` bits.
    pub flags: u16,
    /// First packet, `CLOCK_MONOTONIC_COARSE` nanoseconds (as conntrack's clock).
    pub created_ns: u64,
    /// Last packet in this entry's direction, same clock.
    pub last_seen_ns: u64,
}
assert_size!(Nat4Entry, 24);
user_pod!(Nat4Entry);

/// [`MasqInterface::flags`]: the interface serves NodePorts on its address (`--nodeport-interfaces`).
pub const IF_NODEPORT: u32 = 1;
/// [`MasqInterface::flags`]: the interface does not masquerade pod traffic (named by
/// `--nodeport-interfaces` only). Zero, as entries written before flags existed, masquerades.
pub const IF_NO_MASQUERADE: u32 = 2;
/// [`MasqInterface::flags`]: the interface is the node's underlay, served for BPF host routing
/// (`--host-routing bpf`: `masq_ingress` hands what arrives to `host_fwd_in`) and nothing else
/// unless another flag says so. The programs do not read it: it tells the operator why weir
/// attached there.
pub const IF_HOST_ROUTING: u32 = 4;

/// `masq_if` value (key: ifindex): a host interface the programs `masq_egress`/`masq_ingress`
/// serve — the address it masquerades to and serves NodePorts on, and its roles. Written by the
/// agent.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MasqInterface {
    /// The node address (network byte order).
    pub addr: [u8; 4],
    /// [`IF_NODEPORT`], [`IF_NO_MASQUERADE`], [`IF_HOST_ROUTING`].
    pub flags: u32,
}
assert_size!(MasqInterface, 8);
user_pod!(MasqInterface);

/// `masq_cidr4` value (LPM key: a pool CIDR): sources in it are masqueraded, destinations in it
/// never are. Written by the agent from the IPAM pools.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MasqCidr {
    /// Reserved; always zero.
    pub _reserved: u32,
}
assert_size!(MasqCidr, 4);
user_pod!(MasqCidr);

/// The NAT port candidate `attempt` (0-based) for a new flow `src:sport → dst:dport` of
/// `protocol`: a hash of the flow picks the first, later attempts take the ports after it
/// (wrapping inside [`PORT_MIN`]..=[`PORT_MAX`]). Pure, so tests predict the programs' choice.
#[inline(always)]
#[must_use]
pub const fn port_candidate(
    src: [u8; 4],
    dst: [u8; 4],
    sport: u16,
    dport: u16,
    protocol: u8,
    attempt: u32,
) -> u16 {
    let mut h = u32::from_le_bytes(src).wrapping_mul(0x9e37_79b1);
    h ^= u32::from_le_bytes(dst).rotate_left(13);
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= ((sport as u32) << 16) | dport as u32;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= protocol as u32;
    h ^= h >> 16;
    let slot = (h % PORT_COUNT + attempt) % PORT_COUNT;
    (PORT_MIN as u32 + slot) as u16
}

/// The sweep timeout of a NAT entry pair, from its protocol and both entries' flags.
#[must_use]
pub const fn timeout_secs(protocol: u8, flags: u16) -> u64 {
    match protocol {
        6 => {
            if flags & FLAG_TCP_CLOSING != 0 {
                TIMEOUT_TCP_CLOSING_SECS
            } else {
                TIMEOUT_TCP_SECS
            }
        }
        1 => TIMEOUT_ICMP_SECS,
        _ => TIMEOUT_UDP_SECS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_stay_in_range_and_walk_on_from_the_hash() {
        let first = port_candidate([10, 0, 0, 2], [192, 0, 2, 1], 40_000, 80, 6, 0);
        assert!((PORT_MIN..=PORT_MAX).contains(&first));
        for attempt in 1..PORT_COUNT * 2 {
            let p = port_candidate([10, 0, 0, 2], [192, 0, 2, 1], 40_000, 80, 6, attempt);
            assert!((PORT_MIN..=PORT_MAX).contains(&p));
            let expected =
                u32::from(PORT_MIN) + (u32::from(first - PORT_MIN) + attempt) % PORT_COUNT;
            assert_eq!(u32::from(p), expected);
        }
    }

    #[test]
    fn different_flows_spread_over_the_range() {
        let mut seen = std::collections::BTreeSet::new();
        for sport in 0..1000u16 {
            seen.insert(port_candidate(
                [10, 0, 0, 2],
                [192, 0, 2, 1],
                30_000 + sport,
                80,
                6,
                0,
            ));
        }
        // 1,000 flows into 4,536 ports: a decent hash leaves few first-choice collisions.
        assert!(seen.len() > 850, "{} distinct first candidates", seen.len());
    }
}
