//! BPF host routing (`--host-routing bpf`): `from_endpoint` tail-calls `host_fwd` through the
//! `host_fwd_v1` program array for every packet it passed, and `host_fwd` sends an IPv4 packet
//! bound for another node (or outside) straight out of the interface the kernel's FIB names,
//! with the TTL lowered and the next hop's MAC addresses, as Cilium's BPF host routing does. The
//! kernel's IP forwarding (its routing cache, netfilter's forward and post-routing hooks) is
//! skipped; the egress interface's own tc programs (masquerade, NodePort) still run. The other
//! way, `masq_ingress` on the node's underlay (and on the masquerade and NodePort interfaces)
//! tail-calls `host_fwd_in` for what it passed: a packet for a pod here is judged by the pod's
//! `to_endpoint`, tail-called for that endpoint, and handed straight to the pod's side of its veth
//! (`bpf_redirect_peer`: no second trip through a backlog queue); without `to_endpoint` in its
//! slot it goes out of the pod's veth, whose `to_endpoint` (its tc egress) judges it as before.
//!
//! Everything else goes on to the kernel as before, unchanged: a trace run, a packet that is not
//! plain IPv4 (options, or another ethertype), a TTL about to expire (the kernel answers it), a
//! destination the FIB does not forward to with a known neighbour (local addresses, a neighbour
//! not yet resolved, too big for the egress MTU), and a pod on this node (its `to_endpoint` judges
//! it after the kernel's delivery). An empty slot (`--host-routing kernel`, or an agent that never
//! filled it) makes the tail call fail, and `from_endpoint` passes the packet to the kernel.

use aya_ebpf::{
    EbpfContext as _,
    bindings::{__sk_buff, TC_ACT_OK},
    helpers::bpf_redirect,
    programs::TcContext,
};
use maps_schema::{
    maps::{PEER_CB, TO_ENDPOINT_SLOT},
    trace::CB_DONE,
};

use crate::{
    fib::{self, FIB_SUCCESS},
    maps::{ENDPOINTS, HOST_FWD},
    parse::{ETH_HLEN, ETH_P_IP, Packet, word},
};

/// Hands a packet `from_endpoint` (`slot`: `HOST_FWD_SLOT`) or `masq_ingress`
/// (`HOST_FWD_IN_SLOT`) passed to its forwarding program. Returns only when the slot is empty.
#[inline(always)]
pub(crate) fn tail_call(ctx: &TcContext, slot: u32) {
    // SAFETY: a tail call into a program of the same type; on failure it returns and the caller
    // passes the packet to the kernel.
    unsafe { HOST_FWD.tail_call(ctx, slot) };
}

/// The action for a packet `from_endpoint` passed (`FROM_POD`) or one that arrived on a host
/// interface: a redirect out of the FIB's interface, or `TC_ACT_OK` (the kernel forwards or
/// delivers it). A pod's packet to another pod on this node is left to the kernel; a packet
/// from the wire to a pod here is redirected to the pod's veth, whose `to_endpoint` judges it.
#[inline(always)]
pub(crate) fn try_forward<const FROM_POD: bool>(ctx: &TcContext) -> i32 {
    let skb = ctx.as_ptr().cast::<__sk_buff>();
    // A trace run `from_endpoint` answered (its verdict is in `cb[]`): nothing to send.
    // SAFETY: the context pointer is the kernel's `__sk_buff` for this program run.
    if unsafe { core::ptr::read_volatile(&raw const (*skb).cb[0]) } == CB_DONE {
        return TC_ACT_OK;
    }
    // SAFETY: as above.
    let ifindex = unsafe { (*skb).ifindex };
    let pkt = Packet {
        data: ctx.data(),
        end: ctx.data_end(),
    };
    if pkt.ethertype() != Some(ETH_P_IP) {
        return TC_ACT_OK;
    }
    let Some(h) = pkt.ptr::<[u8; 20]>(ETH_HLEN) else {
        return TC_ACT_OK;
    };
    // SAFETY: bounds checked by `ptr` (20 bytes).
    let (version_ihl, ttl, proto, addrs) = unsafe {
        (
            word::<_, u8>(h, 0),
            word::<_, u8>(h, 8),
            word::<_, u8>(h, 9),
            word::<_, u64>(h, 12),
        )
    };
    if version_ihl != 0x45 || ttl <= 1 {
        return TC_ACT_OK;
    }
    let (fib, rc) = fib::lookup(ctx, ifindex, proto, addrs as u32, (addrs >> 32) as u32);
    if rc != FIB_SUCCESS || fib.ifindex == ifindex {
        return TC_ACT_OK;
    }
    // From a pod to a pod on this node: the kernel delivers it to the pod's veth.
    // SAFETY: read-only to programs; the agent replaces entries whole.
    if FROM_POD && unsafe { ENDPOINTS.get(&fib.ifindex) }.is_some() {
        return TC_ACT_OK;
    }
    if !rewrite(ctx, &fib) {
        return TC_ACT_OK;
    }
    // From the wire to a pod here: its `to_endpoint`, run now for that endpoint, hands the packet
    // straight to the pod's side of the veth if it passes.
    // SAFETY: as above.
    if !FROM_POD && unsafe { ENDPOINTS.get(&fib.ifindex) }.is_some() {
        set_peer_cb(skb, [PEER_CB[0], PEER_CB[1], fib.ifindex]);
        tail_call(ctx, TO_ENDPOINT_SLOT);
        // No `to_endpoint` in the slot: out of the pod's veth, whose `to_endpoint` runs there.
        set_peer_cb(skb, [0; 3]);
    }
    // SAFETY: a plain helper call.
    unsafe { bpf_redirect(fib.ifindex, 0) as i32 }
}

/// Writes `cb[0..3]` (one 4-byte store each: the verifier refuses merged context stores).
#[inline(always)]
fn set_peer_cb(skb: *mut __sk_buff, words: [u32; 3]) {
    // SAFETY: `cb` is writable for tc programs; the context pointer is this run's `__sk_buff`.
    unsafe {
        core::ptr::write_volatile(&raw mut (*skb).cb[0], words[0]);
        core::ptr::write_volatile(&raw mut (*skb).cb[1], words[1]);
        core::ptr::write_volatile(&raw mut (*skb).cb[2], words[2]);
    }
}

/// The endpoint a `to_endpoint` run judges for `host_fwd_in` (`cb` marked with `PEER_CB`, run on
/// another interface than that endpoint's veth), if this is such a run: its veth's ifindex. The
/// mark is cleared.
#[inline(always)]
pub(crate) fn peer_target(skb: *mut __sk_buff, ifindex: u32) -> Option<u32> {
    // SAFETY: the context pointer is this run's `__sk_buff`; one 4-byte load each.
    let (a, b, target) = unsafe {
        (
            core::ptr::read_volatile(&raw const (*skb).cb[0]),
            core::ptr::read_volatile(&raw const (*skb).cb[1]),
            core::ptr::read_volatile(&raw const (*skb).cb[2]),
        )
    };
    if a != PEER_CB[0] || b != PEER_CB[1] || target == ifindex {
        return None;
    }
    set_peer_cb(skb, [0; 3]);
    Some(target)
}

/// The forwarding rewrite, in place: the next hop's MAC addresses, the TTL one lower, the
/// header checksum updated for it (RFC 1624). False when the header is not writable here.
#[inline(always)]
fn rewrite(ctx: &TcContext, fib: &fib::Fib) -> bool {
    let (data, end) = (ctx.data(), ctx.data_end());
    if data + ETH_HLEN + 20 > end {
        return false;
    }
    let eth = data as *mut u8;
    // SAFETY: the 34 bytes of the Ethernet and IPv4 headers are inside the packet (checked just
    // above); a tc program may write its packet directly.
    unsafe {
        core::ptr::copy_nonoverlapping(fib.mac(10).as_ptr(), eth, 6);
        core::ptr::copy_nonoverlapping(fib.mac(4).as_ptr(), eth.add(6), 6);
        let ip = eth.add(ETH_HLEN);
        let old = u16::from_be_bytes([*ip.add(8), *ip.add(9)]);
        let new = old - 0x0100;
        let check = u16::from_be_bytes([*ip.add(10), *ip.add(11)]);
        let mut sum = u32::from(!check) + u32::from(!old) + u32::from(new);
        sum = (sum & 0xffff) + (sum >> 16);
        sum = (sum & 0xffff) + (sum >> 16);
        let [hi, lo] = (!(sum as u16)).to_be_bytes();
        *ip.add(8) -= 1;
        *ip.add(10) = hi;
        *ip.add(11) = lo;
    }
    true
}
