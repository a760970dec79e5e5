//! The attach points: thin entries that turn a `try_*` verdict into the hook's action code.
//! (They sit in a private module, so clippy's `not_unsafe_ptr_arg_deref`, which fires on the raw
//! context pointer of aya's macro expansion for a crate-public function, does not apply.)

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT, xdp_action},
    macros::{classifier, xdp},
    programs::{TcContext, XdpContext},
};

use crate::{counters::Verdict, endpoint, masq, prefilter};

/// tc ingress of a host-side workload veth: packets leaving the pod.
#[classifier]
pub fn from_endpoint(ctx: TcContext) -> i32 {
    tc_action(endpoint::try_from_endpoint(&ctx))
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

/// tc ingress of a masquerade interface: replies to masqueraded flows go back to the pod.
#[classifier]
pub fn masq_ingress(ctx: TcContext) -> i32 {
    tc_action(masq::try_masq_ingress(&ctx))
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
