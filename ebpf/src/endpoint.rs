//! `from_endpoint` / `to_endpoint`: dispatch by ifindex to the endpoint (fail closed), then per
//! ethertype: ARP passes, IPv4 (with service translation, `service`) and IPv6 go through
//! conntrack and policy, the rest drops. A packet to a Service with no ready backend is answered
//! with an ICMP port unreachable (`unreachable`).

use aya_ebpf::{
    EbpfContext as _,
    bindings::{__sk_buff, TC_ACT_REDIRECT},
    helpers::bpf_redirect_peer,
    programs::TcContext,
};
use maps_schema::{
    EndpointInfo,
    reason::{
        DIR_FROM_ENDPOINT, DIR_TO_ENDPOINT, DROP_MALFORMED, DROP_SERVICE_NO_BACKEND,
        DROP_UNKNOWN_ENDPOINT, DROP_UNSUPPORTED_ETHERTYPE, PASS_NEIGHBOUR,
    },
};

use crate::{
    counters::{Seen, Verdict, account, count, count_rule},
    flow::{Family, decide},
    host_fwd, ipv4,
    ipv6::{self, V6},
    maps::ENDPOINTS,
    parse::{ETH_P_ARP, ETH_P_IP, ETH_P_IPV6, Packet, Parsed, Reason},
    service, trace, unreachable,
};

/// Packets leaving a pod.
#[inline(always)]
pub(crate) fn try_from_endpoint(ctx: &TcContext) -> Verdict {
    try_endpoint(ctx, DIR_FROM_ENDPOINT)
}

/// Packets entering a pod.
#[inline(always)]
pub(crate) fn try_to_endpoint(ctx: &TcContext) -> Verdict {
    try_endpoint(ctx, DIR_TO_ENDPOINT)
}

#[inline(always)]
fn try_endpoint(ctx: &TcContext, direction: u32) -> Verdict {
    let skb = ctx.as_ptr().cast::<__sk_buff>();
    // SAFETY: the context pointer is the kernel's `__sk_buff` for this program run.
    let own = unsafe { (*skb).ifindex };
    // Tail-called by `host_fwd_in` for a pod on this node: judged for that pod's veth.
    let peer = if direction == DIR_TO_ENDPOINT {
        host_fwd::peer_target(skb, own)
    } else {
        None
    };
    let ifindex = peer.unwrap_or(own);
    let seen = Seen {
        direction,
        ifindex,
        len: ctx.len(),
        trace: trace::is_trace_run(skb),
    };
    let pkt = Packet {
        data: ctx.data(),
        end: ctx.data_end(),
    };
    // SAFETY: the map is read-only to programs, so BPF never writes the entry under us; the agent
    // replaces entries whole.
    let mut rule = 0;
    let answer = match unsafe { ENDPOINTS.get(&ifindex) } {
        None => DROP_UNKNOWN_ENDPOINT,
        Some(ep) => dispatch(ctx, ep, &seen, &pkt, &mut rule),
    };
    let (reason, hairpin) = service::hairpin(answer);
    // A service translation rewrote the packet: the pointers read before it are stale.
    let pkt = Packet {
        data: ctx.data(),
        end: ctx.data_end(),
    };
    #[cfg(feature = "debug-log")]
    crate::debug_log::decision(ctx, &seen, reason, rule);
    if seen.trace {
        return trace::answer(skb, reason, rule);
    }
    count_rule(rule, seen.len);
    let verdict = account(reason, &seen, &pkt);
    if let Some(veth) = peer
        && matches!(verdict, Verdict::Pass)
    {
        // SAFETY: a plain helper call; this run is at the tc ingress of a host interface.
        return if unsafe { bpf_redirect_peer(veth, 0) } == i64::from(TC_ACT_REDIRECT) {
            Verdict::Redirect
        } else {
            Verdict::Drop
        };
    }
    // A pod reaching itself through its Service: back into it through its `to_endpoint`.
    if let Some(to_self) = hairpin
        && matches!(verdict, Verdict::Pass)
    {
        return if service::send_back(ctx, ifindex, to_self) {
            Verdict::Redirect
        } else {
            Verdict::Drop
        };
    }
    // A Service without a ready backend refuses the client as kube-proxy's REJECT does.
    if reason == DROP_SERVICE_NO_BACKEND
        && direction == DIR_FROM_ENDPOINT
        && unreachable::answer(ctx, ifindex)
    {
        return Verdict::Redirect;
    }
    verdict
}

#[inline(always)]
fn dispatch(
    ctx: &TcContext,
    ep: &EndpointInfo,
    seen: &Seen,
    pkt: &Packet,
    rule: &mut u32,
) -> Reason {
    match pkt.ethertype() {
        None => DROP_MALFORMED,
        Some(ETH_P_ARP) => PASS_NEIGHBOUR,
        Some(ETH_P_IP) => match ipv4::parse(pkt) {
            Err(reason) => reason,
            Ok(p) => {
                note(&p, seen);
                service::decide_v4(ctx, ep, seen, pkt, p, rule)
            }
        },
        Some(ETH_P_IPV6) => ip::<V6>(ep, seen, ipv6::parse(pkt), rule),
        Some(_) => DROP_UNSUPPORTED_ETHERTYPE,
    }
}

/// Counts a parsed packet's note (IPv4 options, IPv6 extension headers) beside its verdict.
#[inline(always)]
fn note<A: Copy>(p: &Parsed<A>, seen: &Seen) {
    if let Some(note) = p.note
        && !seen.trace
    {
        count(note, seen.direction, seen.len);
    }
}

#[inline(always)]
fn ip<F: Family>(
    ep: &EndpointInfo,
    seen: &Seen,
    parsed: Result<Parsed<F::Addr>, Reason>,
    rule: &mut u32,
) -> Reason {
    match parsed {
        Err(reason) => reason,
        Ok(mut p) => {
            note(&p, seen);
            decide::<F>(ep, seen, &mut p, rule)
        }
    }
}
