//! The per-packet decision both families share: conntrack first, policy for what it does not cover.
//!
//! A conntrack entry records the opener's egress approval and the destination's ingress approval
//! separately. A program bypasses policy only when *its own side* approved the flow:
//! `from_endpoint` of the opener and `to_endpoint` of the destination check the original
//! direction's bit of their side, and the reply direction's bit of the other side's role.

use aya_ebpf::helpers::{bpf_jiffies64, bpf_ktime_get_coarse_ns};
use maps_schema::{
    EndpointInfo,
    conntrack::{
        FLAG_DST_INGRESS_APPROVED, FLAG_OPENER_IS_B, FLAG_SEEN_REPLY, FLAG_SRC_EGRESS_APPROVED,
        FLAG_TCP_FIN_DST, FLAG_TCP_FIN_SRC, FLAG_TCP_RST, FLAG_TCP_SYN, FLAG_TCP_SYN_ACK,
    },
    reason::{
        DIR_FROM_ENDPOINT, DROP_CT_INSERT_FAILED, DROP_SPOOFED_SOURCE, PASS_ESTABLISHED,
        PASS_NEIGHBOUR, PASS_RELATED, is_pass,
    },
};

use crate::{
    counters::Seen,
    maps::{CT_CLOCK, CT_EVENTS, Ct},
    parse::{Class, IPPROTO_TCP, Parsed, Reason, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN, Tuple},
    policy::evaluate,
};

/// What differs between IPv4 and IPv6: addresses, conntrack keys, maps.
pub(crate) trait Family {
    type Addr: Copy + Default;
    type Key;
    /// True when `addr` is one of the endpoint's own addresses.
    fn owns(ep: &EndpointInfo, addr: &Self::Addr) -> bool;
    /// The normalised conntrack key of a packet, and whether its source is the key's `b` end.
    fn ct_key(t: &Tuple<Self::Addr>) -> (Self::Key, bool);
    fn ct_get(key: &Self::Key) -> Option<*mut Ct>;
    fn ct_insert(key: &Self::Key, entry: &Ct) -> Result<(), i32>;
    /// This family's `ct_events` slot for created entries.
    const CREATED: u32;
    /// The security identity of an address (exact map, then ipcache, else world).
    fn identity(addr: &Self::Addr) -> u32;
    /// The identity policy judges a peer of endpoint `ep` by: [`Self::identity`], except that the
    /// hairpin source (`maps_schema::service::HAIRPIN4`) is the endpoint itself.
    #[inline(always)]
    fn peer_identity(_ep: &EndpointInfo, addr: &Self::Addr) -> u32 {
        Self::identity(addr)
    }
}

/// The conntrack bit this program checks: from_endpoint is the opener in the original direction
/// and the destination in the reply direction; to_endpoint the other way round.
#[inline(always)]
fn side_bit(direction: u32, original: bool) -> u32 {
    if (direction == DIR_FROM_ENDPOINT) == original {
        FLAG_SRC_EGRESS_APPROVED
    } else {
        FLAG_DST_INGRESS_APPROVED
    }
}

/// The reason for a parsed IP packet on an endpoint's interface; `rule` receives the id of the
/// policy rule that decided it (left alone when none did). A trace run (`seen.trace`) writes no
/// conntrack state. Entering a pod, a packet against its flow's direction (a reply) gets the
/// entry's `rev_nat` in `p.rev_nat` (the frontend to translate its source back to, or 0).
#[inline(always)]
pub(crate) fn decide<F: Family>(
    ep: &EndpointInfo,
    seen: &Seen,
    p: &mut Parsed<F::Addr>,
    rule: &mut u32,
) -> Reason {
    let direction = seen.direction;
    let t = &p.tuple;
    if let Class::Neighbour = p.class {
        return PASS_NEIGHBOUR;
    }
    if direction == DIR_FROM_ENDPOINT && !F::owns(ep, &t.src) {
        return DROP_SPOOFED_SOURCE;
    }
    let peer = if direction == DIR_FROM_ENDPOINT {
        t.dst
    } else {
        t.src
    };
    let (proto, port) = (t.proto, p.policy_port);
    let mut policy = || {
        evaluate(
            ep,
            direction,
            || F::peer_identity(ep, &peer),
            proto,
            port,
            rule,
        )
    };
    match p.class {
        Class::Flow => stateful::<F>(direction, seen.trace, p, policy),
        Class::Related => {
            // The error travels against the quoted packet: look it up as that packet's reply.
            let (key, src_is_b) = F::ct_key(&p.inner.reversed());
            if let Some(entry) = F::ct_get(&key) {
                // SAFETY: a valid map value pointer for this program run.
                let flags = unsafe { (*entry).flags };
                let original = (flags & FLAG_OPENER_IS_B != 0) == src_is_b;
                if flags & side_bit(direction, original) != 0 {
                    return PASS_RELATED;
                }
            }
            policy()
        }
        Class::Stateless | Class::Neighbour => policy(),
    }
}

/// Conntrack for a flow packet; `policy` decides what this side has not approved yet. A trace run
/// (`trace`) reads conntrack and never writes it.
#[inline(always)]
fn stateful<F: Family>(
    direction: u32,
    trace: bool,
    p: &mut Parsed<F::Addr>,
    policy: impl FnOnce() -> Reason,
) -> Reason {
    let (key, src_is_b) = F::ct_key(&p.tuple);
    let now = now_ns();
    let tcp = p.tuple.proto == IPPROTO_TCP;
    let Some(entry) = F::ct_get(&key) else {
        let reason = policy();
        if !is_pass(reason) || trace {
            return reason;
        }
        let mut flags = side_bit(direction, true);
        if src_is_b {
            flags |= FLAG_OPENER_IS_B;
        }
        if tcp {
            flags |= tcp_state(p.tcp_flags, true);
        }
        #[cfg(not(feature = "ct-v2"))]
        let new = Ct {
            rev_nat: p.rev_nat,
            ..Ct::new(now, flags)
        };
        #[cfg(feature = "ct-v2")]
        let new = Ct::new(now, flags);
        return match F::ct_insert(&key, &new) {
            Ok(()) => {
                if let Some(created) = CT_EVENTS.get_ptr_mut(F::CREATED) {
                    // SAFETY: per-CPU slot, only this CPU touches it while the program runs.
                    unsafe { *created += 1 };
                }
                reason
            }
            Err(_) => DROP_CT_INSERT_FAILED,
        };
    };
    // SAFETY: a valid map value pointer for this program run; concurrent updates of the flags
    // from another CPU can only lose a state bit, which the next packet sets again.
    let (old, last) = unsafe { ((*entry).flags, (*entry).last_seen_ns) };
    let original = (old & FLAG_OPENER_IS_B != 0) == src_is_b;
    #[cfg(not(feature = "ct-v2"))]
    if direction != DIR_FROM_ENDPOINT && !original {
        // SAFETY: as above.
        p.rev_nat = unsafe { (*entry).rev_nat };
    }
    let side = side_bit(direction, original);
    let (reason, approve) = if old & side != 0 {
        (PASS_ESTABLISHED, 0)
    } else {
        // This side never approved the flow: decide now. An approval is only recorded for the
        // original direction; a reply-direction packet is judged statelessly.
        let reason = policy();
        if !is_pass(reason) {
            return reason;
        }
        (reason, if original { side } else { 0 })
    };
    if trace {
        return reason;
    }
    // A pod's packet in its flow's direction knows the flow's frontend (`p.rev_nat`, 0 for none):
    // a new connection reusing a translated tuple through another frontend (or none) gets its
    // replies from that one, not from the old flow's. A store, not a compare and a store (no
    // branch on the values). Left out of the `debug-log` test build, whose logging calls would
    // then take the programs past the verifier's complexity limit.
    #[cfg(not(any(feature = "ct-v2", feature = "debug-log")))]
    if direction == DIR_FROM_ENDPOINT && original {
        // SAFETY: as above.
        unsafe { (*entry).rev_nat = p.rev_nat };
    }
    let mut flags = old | approve;
    if !original {
        flags |= FLAG_SEEN_REPLY;
    }
    if tcp {
        if p.tcp_flags & TCP_SYN != 0 && p.tcp_flags & TCP_ACK == 0 && original {
            // A new connection on a reused tuple: forget the old one's closing state.
            flags &= !(FLAG_TCP_SYN_ACK | FLAG_TCP_FIN_SRC | FLAG_TCP_FIN_DST | FLAG_TCP_RST);
        }
        flags |= tcp_state(p.tcp_flags, original);
    }
    // Stamps only move forward: CPUs whose cached clock differs by a tick do not take turns
    // rewriting the entry.
    if flags != old || now > last {
        // SAFETY: as above.
        unsafe {
            (*entry).flags = flags;
            (*entry).last_seen_ns = now.max(last);
        }
    }
    reason
}

/// Now on the conntrack clock (`maps_schema::conntrack::CLOCK`), read through this CPU's
/// [`CT_CLOCK`] slot: `jiffies` is one load (the verifier inlines the helper), and the clock helper
/// runs only on a CPU's first packet of a tick.
#[inline(always)]
pub(crate) fn now_ns() -> u64 {
    // SAFETY: helpers without arguments.
    let jiffies = unsafe { bpf_jiffies64() };
    let Some(cache) = CT_CLOCK.get_ptr_mut(0) else {
        // SAFETY: as above.
        return unsafe { bpf_ktime_get_coarse_ns() };
    };
    // SAFETY: this CPU's slot; nothing else touches it while the program runs.
    unsafe {
        if (*cache).jiffies != jiffies {
            (*cache).now_ns = bpf_ktime_get_coarse_ns();
            (*cache).jiffies = jiffies;
        }
        (*cache).now_ns
    }
}

/// Conntrack TCP state bits a packet with `tcp_flags` sets.
#[inline(always)]
fn tcp_state(tcp_flags: u8, original: bool) -> u32 {
    let mut state = 0;
    if tcp_flags & TCP_SYN != 0 {
        state |= if original && tcp_flags & TCP_ACK == 0 {
            FLAG_TCP_SYN
        } else if !original && tcp_flags & TCP_ACK != 0 {
            FLAG_TCP_SYN_ACK
        } else {
            0
        };
    }
    if tcp_flags & TCP_FIN != 0 {
        state |= if original {
            FLAG_TCP_FIN_SRC
        } else {
            FLAG_TCP_FIN_DST
        };
    }
    if tcp_flags & TCP_RST != 0 {
        state |= FLAG_TCP_RST;
    }
    state
}
