//! ICMP errors about translated flows: an error entering a client about a packet it sent to a
//! frontend quotes that packet as translated (to the backend), and comes from the backend when the
//! backend's kernel sent it. The client's socket is connected to the frontend, so the error gets
//! the frontend back — the quoted destination address and port, the quoted header's checksum, the
//! ICMP checksum, and the outer source when it is the backend — as kube-proxy's conntrack NAT does
//! for related packets. A UDP client of a backend that does not listen then fails at once
//! (`ECONNREFUSED`); a path-MTU error reaches the right socket.

use aya_ebpf::programs::TcContext;
use maps_schema::reason::DROP_MALFORMED;

use crate::{
    parse::{ETH_HLEN, IPPROTO_TCP, IPPROTO_UDP, Parsed, Reason},
    service::{reply_frontend, rev_nat_of},
};

/// Offset of the IPv4 header checksum and source address in a header.
const IP_CHECK: usize = 10;
const IP_SRC: usize = 12;
const IP_DST: usize = 16;
/// The ICMP header's length and its checksum's offset.
const ICMP_HLEN: usize = 8;
const ICMP_CHECK: usize = 2;

/// `reason` (a pass) for an ICMP error entering a client, with the error translated back when it is
/// about a translated flow; anything else keeps `reason`.
#[inline(always)]
pub(crate) fn translate_back(ctx: &TcContext, p: &Parsed<u32>, reason: Reason) -> Reason {
    let inner = p.inner;
    if inner.proto != IPPROTO_TCP && inner.proto != IPPROTO_UDP {
        return reason;
    }
    // The quoted packet went client → backend: its flow names the service.
    let service_id = rev_nat_of(&inner, true);
    if service_id == 0 {
        return reason;
    }
    let Some((vip, vport)) = reply_frontend(&inner.reversed(), service_id) else {
        return reason;
    };
    match rewrite(ctx, vip, vport) {
        Ok(()) => reason,
        Err(_) => DROP_MALFORMED,
    }
}

#[inline(always)]
fn rewrite(ctx: &TcContext, vip: u32, vport: u16) -> Result<(), i64> {
    let outer_ihl: u8 = ctx.load(ETH_HLEN)?;
    let icmp = ETH_HLEN + usize::from(outer_ihl & 0x0f) * 4;
    let inner = icmp + ICMP_HLEN;
    let inner_ihl: u8 = ctx.load(inner)?;
    let inner_l4 = inner + usize::from(inner_ihl & 0x0f) * 4;
    // Values as loaded (network byte order in a native word), as the checksum helpers take them.
    let old_dst: u32 = ctx.load(inner + IP_DST)?;
    let old_check: u16 = ctx.load(inner + IP_CHECK)?;
    let old_port: u16 = ctx.load(inner_l4 + 2)?;
    let new_port = vport.to_be();
    ctx.store(inner + IP_DST, &vip, 0)?;
    ctx.l3_csum_replace(inner + IP_CHECK, u64::from(old_dst), u64::from(vip), 4)?;
    let new_check: u16 = ctx.load(inner + IP_CHECK)?;
    ctx.store(inner_l4 + 2, &new_port, 0)?;
    // The ICMP checksum covers the whole message (no pseudo header): every changed word.
    let c = icmp + ICMP_CHECK;
    ctx.l4_csum_replace(c, u64::from(old_dst), u64::from(vip), 4)?;
    ctx.l4_csum_replace(c, u64::from(old_check), u64::from(new_check), 2)?;
    ctx.l4_csum_replace(c, u64::from(old_port), u64::from(new_port), 2)?;
    let outer_src: u32 = ctx.load(ETH_HLEN + IP_SRC)?;
    if outer_src == old_dst {
        ctx.store(ETH_HLEN + IP_SRC, &vip, 0)?;
        ctx.l3_csum_replace(ETH_HLEN + IP_CHECK, u64::from(outer_src), u64::from(vip), 4)?;
    }
    Ok(())
}
