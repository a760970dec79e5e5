//! `from_endpoint` / `to_endpoint`: dispatch by ifindex to the endpoint, fail closed.

use aya_ebpf::{EbpfContext as _, bindings::__sk_buff, programs::TcContext};
use maps_schema::{
    EndpointInfo,
    reason::{
        DIR_FROM_ENDPOINT, DIR_TO_ENDPOINT, DROP_MALFORMED, DROP_SPOOFED_SOURCE,
        DROP_UNKNOWN_ENDPOINT, DROP_UNSUPPORTED_ETHERTYPE, PASS,
    },
};

use crate::{
    counters::{Verdict, account},
    maps::ENDPOINTS,
    parse::{ETH_P_ARP, ETH_P_IP, ETH_P_IPV6, ethertype, ipv4_source, ipv6_source},
};

#[inline(always)]
fn skb_ifindex(ctx: &TcContext) -> u32 {
    let skb = ctx.as_ptr().cast::<__sk_buff>();
    // SAFETY: the context pointer is the kernel's `__sk_buff` for this program run.
    unsafe { (*skb).ifindex }
}

#[inline(always)]
fn endpoint(ctx: &TcContext) -> Option<EndpointInfo> {
    // SAFETY: the map is read-only to programs, so the entry is never written under us by BPF;
    // the agent replaces entries whole.
    unsafe { ENDPOINTS.get(&skb_ifindex(ctx)).copied() }
}

/// Packets leaving a pod.
#[inline(always)]
pub(crate) fn try_from_endpoint(ctx: &TcContext) -> Verdict {
    let len = ctx.len();
    let Some(ep) = endpoint(ctx) else {
        return account(DROP_UNKNOWN_ENDPOINT, DIR_FROM_ENDPOINT, len);
    };
    let (data, data_end) = (ctx.data(), ctx.data_end());
    let reason = match ethertype(data, data_end) {
        None => DROP_MALFORMED,
        Some(ETH_P_ARP) => PASS,
        Some(ETH_P_IP) => match ipv4_source(data, data_end) {
            None => DROP_MALFORMED,
            Some(src) if ep.owns_v4(src) => PASS,
            Some(_) => DROP_SPOOFED_SOURCE,
        },
        Some(ETH_P_IPV6) => match ipv6_source(data, data_end) {
            None => DROP_MALFORMED,
            Some(src) if ep.owns_v6(&src) => PASS,
            Some(_) => DROP_SPOOFED_SOURCE,
        },
        Some(_) => DROP_UNSUPPORTED_ETHERTYPE,
    };
    account(reason, DIR_FROM_ENDPOINT, len)
}

/// Packets entering a pod.
#[inline(always)]
pub(crate) fn try_to_endpoint(ctx: &TcContext) -> Verdict {
    let len = ctx.len();
    if endpoint(ctx).is_none() {
        return account(DROP_UNKNOWN_ENDPOINT, DIR_TO_ENDPOINT, len);
    }
    let reason = match ethertype(ctx.data(), ctx.data_end()) {
        None => DROP_MALFORMED,
        Some(ETH_P_ARP | ETH_P_IP | ETH_P_IPV6) => PASS,
        Some(_) => DROP_UNSUPPORTED_ETHERTYPE,
    };
    account(reason, DIR_TO_ENDPOINT, len)
}
