//! The attach points: thin entries that turn a `try_*` verdict into the hook's action code.
//! (They sit in a private module, so clippy's `not_unsafe_ptr_arg_deref`, which fires on the raw
//! context pointer of aya's macro expansion for a crate-public function, does not apply.)

use aya_ebpf::{
    EbpfContext as _,
    bindings::{__sk_buff, TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT, xdp_action},
    macros::{cgroup_sock_addr, classifier, xdp},
    programs::{SockAddrContext, TcContext, XdpContext},
};

use maps_schema::maps::{HOST_FWD_IN_SLOT, HOST_FWD_SLOT};

use crate::{counters::Verdict, endpoint, host_fwd, masq, prefilter, socket_lb};

/// tc ingress of a host-side workload veth: packets leaving the pod. A packet it passes goes on
/// to `host_fwd` when BPF host routing is on.
#[classifier]
pub fn from_endpoint(ctx: TcContext) -> i32 {
    let action = from_endpoint_action(ctx.as_ptr().cast());
    if action == TC_ACT_OK {
        host_fwd::tail_call(&ctx, HOST_FWD_SLOT);
    }
    action
}

/// `from_endpoint`'s decision, in a frame of its own: its stack (the decision path's, the largest
/// of the programs; the verifier bounds the frames of a call chain at 512 bytes together) is not
/// added to by what the tail call keeps live.
#[inline(never)]
fn from_endpoint_action(skb: *mut __sk_buff) -> i32 {
    let Some(skb) = core::ptr::NonNull::new(skb) else {
        return TC_ACT_SHOT;
    };
    tc_action(endpoint::try_from_endpoint(&TcContext::new(skb)))
}

/// Tail-called by `from_endpoint` (slot `HOST_FWD_SLOT` of `host_fwd_v1`): BPF host routing.
#[classifier]
pub fn host_fwd(ctx: TcContext) -> i32 {
    host_fwd::try_forward::<true>(&ctx)
}

/// Tail-called by `masq_ingress` (slot `HOST_FWD_IN_SLOT` of `host_fwd_v1`): BPF host routing of
/// what arrives on a host interface.
#[classifier]
pub fn host_fwd_in(ctx: TcContext) -> i32 {
    host_fwd::try_forward::<false>(&ctx)
}

/// tc egress of a host-side workload veth: packets entering the pod.
#[classifier]
pub fn to_endpoint(ctx: TcContext) -> i32 {
    tc_action(endpoint::try_to_endpoint(&ctx))
}

/// XDP prefilter on the interfaces the operator names.
#[xdp]
pub fn xdp_prefilter(ctx: XdpContext) -> u32 {
    match prefilter::try_xdp_prefilter(&ctx) {
        Verdict::Pass => xdp_action::XDP_PASS,
        // The prefilter never redirects.
        Verdict::Drop | Verdict::Redirect => xdp_action::XDP_DROP,
    }
}

/// tc egress of a masquerade interface: pod traffic to outside the pools gets the node address.
#[classifier]
pub fn masq_egress(ctx: TcContext) -> i32 {
    tc_action(masq::try_masq_egress(&ctx))
}

/// tc ingress of a masquerade interface: replies to masqueraded flows go back to the pod. A
/// packet it passes goes on to `host_fwd_in` when BPF host routing is on.
#[classifier]
pub fn masq_ingress(ctx: TcContext) -> i32 {
    let action = masq_ingress_action(ctx.as_ptr().cast());
    if action == TC_ACT_OK {
        host_fwd::tail_call(&ctx, HOST_FWD_IN_SLOT);
    }
    action
}

/// `masq_ingress`'s decision, in a frame of its own (as `from_endpoint_action`).
#[inline(never)]
fn masq_ingress_action(skb: *mut __sk_buff) -> i32 {
    let Some(skb) = core::ptr::NonNull::new(skb) else {
        return TC_ACT_SHOT;
    };
    tc_action(masq::try_masq_ingress(&TcContext::new(skb)))
}

/// `cgroup/connect4` of the socket LB cgroup: a TCP socket connecting to a frontend gets a backend.
#[cgroup_sock_addr(connect4)]
pub fn sock_connect4(ctx: SockAddrContext) -> i32 {
    socket_lb::try_connect4(&ctx)
}

/// `cgroup/getpeername4` there: a socket given a backend reads its frontend as its peer.
#[cgroup_sock_addr(getpeername4)]
pub fn sock_getpeer4(ctx: SockAddrContext) -> i32 {
    socket_lb::try_show_frontend4(&ctx)
}

/// `cgroup/connect6` there: an IPv6 TCP socket connecting to an IPv4-mapped frontend gets a
/// backend.
#[cgroup_sock_addr(connect6)]
pub fn sock_connect6(ctx: SockAddrContext) -> i32 {
    socket_lb::try_connect6(&ctx)
}

/// `cgroup/getpeername6` there: such a socket reads its frontend as its peer.
#[cgroup_sock_addr(getpeername6)]
pub fn sock_getpeer6(ctx: SockAddrContext) -> i32 {
    socket_lb::try_show_frontend6(&ctx)
}

/// `cgroup/sendmsg4` there: a datagram an unconnected UDP socket sends to a frontend goes to a
/// backend.
#[cgroup_sock_addr(sendmsg4)]
pub fn sock_sendmsg4(ctx: SockAddrContext) -> i32 {
    socket_lb::try_sendmsg4(&ctx)
}

/// `cgroup/recvmsg4` there: a datagram from that backend reads as from the frontend.
#[cgroup_sock_addr(recvmsg4)]
pub fn sock_recvmsg4(ctx: SockAddrContext) -> i32 {
    socket_lb::try_recvmsg4(&ctx)
}

/// `cgroup/sendmsg6` there: as `sock_sendmsg4`, for an IPv6 socket sending to an IPv4-mapped
/// frontend.
#[cgroup_sock_addr(sendmsg6)]
pub fn sock_sendmsg6(ctx: SockAddrContext) -> i32 {
    socket_lb::try_sendmsg6(&ctx)
}

/// `cgroup/recvmsg6` there: as `sock_recvmsg4`, for such a socket.
#[cgroup_sock_addr(recvmsg6)]
pub fn sock_recvmsg6(ctx: SockAddrContext) -> i32 {
    socket_lb::try_recvmsg6(&ctx)
}

#[inline(always)]
fn tc_action(verdict: Verdict) -> i32 {
    match verdict {
        Verdict::Pass => TC_ACT_OK,
        Verdict::Drop => TC_ACT_SHOT,
        Verdict::Redirect => TC_ACT_REDIRECT,
    }
}

/// Benchmark floor (feature `bench`): an empty tc program, measured the same way as the real ones.
#[cfg(feature = "bench")]
#[classifier]
pub fn wt_empty(_ctx: TcContext) -> i32 {
    TC_ACT_OK
}
