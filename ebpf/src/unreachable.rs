//! A packet to a Service with no ready backend is answered as kube-proxy's `REJECT` answers it:
//! the packet becomes an ICMP destination unreachable (port unreachable) from the frontend,
//! quoting the packet's IPv4 header and first 8 payload bytes, and goes straight back into the
//! client pod (`bpf_redirect_peer` of its own veth: never through the host's stack nor the pod's
//! ingress policy, as for a reply). The client's socket fails at once (`ECONNREFUSED`) instead of
//! waiting out its timeout. Anything that cannot be answered so (IPv4 options, a packet too short
//! to quote, a resize the kernel refuses) is dropped as before; the drop reason is counted either way.

use aya_ebpf::{bindings::TC_ACT_REDIRECT, helpers::bpf_redirect_peer, programs::TcContext};

use crate::parse::{ETH_HLEN, IPPROTO_ICMP};

/// The IPv4 header (no options).
const IP_HLEN: usize = 20;
/// The ICMP header.
const ICMP_HLEN: usize = 8;
/// What the error quotes of the packet: its header and 8 bytes of payload (RFC 792).
const QUOTE: usize = IP_HLEN + 8;
/// The answer's IPv4 total length.
const IP_TOTAL: usize = IP_HLEN + ICMP_HLEN + QUOTE;
/// ICMP destination unreachable, port unreachable.
const ICMP_DEST_UNREACH: u8 = 3;
const ICMP_PORT_UNREACH: u8 = 3;

/// Turns the packet into its port-unreachable answer and redirects it into the pod behind
/// `ifindex`; true when the kernel took the redirect.
#[inline(always)]
pub(crate) fn answer(ctx: &TcContext, ifindex: u32) -> bool {
    if rewrite(ctx).is_err() {
        return false;
    }
    // SAFETY: a helper call on this program's context; it only records the target.
    let action = unsafe { bpf_redirect_peer(ifindex, 0) };
    action == i64::from(TC_ACT_REDIRECT)
}

/// Rewrites in the packet itself (the stack is nearly full here, and the verifier refuses the
/// misaligned stack accesses a copy of the headers would need): the quote moves behind the new
/// headers, then the headers are written over what it was.
#[inline(always)]
fn rewrite(ctx: &TcContext) -> Result<(), i64> {
    const LEN: usize = ETH_HLEN + IP_TOTAL;
    ctx.pull_data(ETH_HLEN as u32 + QUOTE as u32)?;
    let first = first_byte(ctx, ETH_HLEN)?;
    if first != 0x45 {
        return Err(-1);
    }
    // The packet keeps its first bytes (at least the quote) whether it shrinks or grows.
    ctx.change_tail(LEN as u32, 0)?;
    ctx.pull_data(LEN as u32)?;
    let (data, end) = (ctx.data(), ctx.data_end());
    if data + LEN > end {
        return Err(-1);
    }
    let p = data as *mut u8;
    // SAFETY: `p .. p + LEN` is inside the packet, checked just above.
    unsafe {
        let mut i = 0;
        while i < QUOTE {
            *p.add(ETH_HLEN + IP_HLEN + ICMP_HLEN + i) = *p.add(ETH_HLEN + i);
            i += 1;
        }
        // Ethernet: back to the sender.
        let mut i = 0;
        while i < 6 {
            let a = *p.add(i);
            *p.add(i) = *p.add(6 + i);
            *p.add(6 + i) = a;
            i += 1;
        }
        let quote = p.add(ETH_HLEN + IP_HLEN + ICMP_HLEN);
        let ip = p.add(ETH_HLEN);
        let total = (IP_TOTAL as u16).to_be_bytes();
        let head = [
            0x45,
            0xc0,
            total[0],
            total[1],
            0,
            0,
            0,
            0,
            64,
            IPPROTO_ICMP,
            0,
            0,
        ];
        let mut i = 0;
        while i < head.len() {
            *ip.add(i) = head[i];
            i += 1;
        }
        // From the frontend (the packet's destination) to the client (its source).
        let mut i = 0;
        while i < 4 {
            *ip.add(12 + i) = *quote.add(16 + i);
            *ip.add(16 + i) = *quote.add(12 + i);
            i += 1;
        }
        let sum = !fold(add(0, ip, IP_HLEN));
        *ip.add(10) = (sum >> 8) as u8;
        *ip.add(11) = sum as u8;
        let icmp = p.add(ETH_HLEN + IP_HLEN);
        let mut i = 0;
        while i < ICMP_HLEN {
            *icmp.add(i) = 0;
            i += 1;
        }
        *icmp = ICMP_DEST_UNREACH;
        *icmp.add(1) = ICMP_PORT_UNREACH;
        let sum = !fold(add(0, icmp, ICMP_HLEN + QUOTE));
        *icmp.add(2) = (sum >> 8) as u8;
        *icmp.add(3) = sum as u8;
    }
    Ok(())
}

/// The byte at `offset` of the packet.
#[inline(always)]
fn first_byte(ctx: &TcContext, offset: usize) -> Result<u8, i64> {
    let (data, end) = (ctx.data(), ctx.data_end());
    if data + offset + 1 > end {
        return Err(-1);
    }
    // SAFETY: inside the packet, checked just above.
    Ok(unsafe { *((data + offset) as *const u8) })
}

/// Adds the `len` bytes (an even count) at `p` as big-endian 16-bit words to `sum`.
///
/// # Safety
/// `p .. p + len` must be readable.
#[inline(always)]
unsafe fn add(mut sum: u32, p: *const u8, len: usize) -> u32 {
    let mut i = 0;
    while i + 1 < len {
        // SAFETY: in range, by the caller.
        let (hi, lo) = unsafe { (*p.add(i), *p.add(i + 1)) };
        sum += u32::from(u16::from_be_bytes([hi, lo]));
        i += 2;
    }
    sum
}

#[inline(always)]
fn fold(mut sum: u32) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum as u16
}
