//! `xdp_prefilter`: drops traffic from deny CIDRs before the stack sees it. Stateless: only the
//! source address is looked at; anything it cannot parse passes on to the stack (and to tc).

use aya_ebpf::{EbpfContext as _, bindings::xdp_md, maps::lpm_trie::Key, programs::XdpContext};
use maps_schema::reason::{DIR_PREFILTER, DROP_PREFILTER_DENY, PASS};

use crate::{
    counters::{Seen, Verdict, account},
    ipv6::TrieKey,
    maps::{PREFILTER4, PREFILTER6},
    parse::{Aligned, ETH_HLEN, ETH_P_IP, ETH_P_IPV6, Packet, Reason},
};

#[inline(always)]
pub(crate) fn try_xdp_prefilter(ctx: &XdpContext) -> Verdict {
    let pkt = Packet {
        data: ctx.data(),
        end: ctx.data_end(),
    };
    let md = ctx.as_ptr().cast::<xdp_md>();
    // SAFETY: the context pointer is the kernel's `xdp_md` for this program run.
    let ifindex = unsafe { (*md).ingress_ifindex };
    let seen = Seen {
        direction: DIR_PREFILTER,
        ifindex,
        len: (pkt.end - pkt.data) as u32,
        trace: false,
    };
    account(reason(&pkt), &seen, &pkt)
}

#[inline(always)]
fn reason(pkt: &Packet) -> Reason {
    let denied = match pkt.ethertype() {
        Some(ETH_P_IP) => pkt
            .load::<4>(ETH_HLEN + 12)
            .is_some_and(|src| PREFILTER4.get(&Aligned(Key::new(32, src)).0).is_some()),
        Some(ETH_P_IPV6) => pkt
            .load::<16>(ETH_HLEN + 8)
            .is_some_and(|src| PREFILTER6.get(&TrieKey::new(src).key).is_some()),
        _ => false,
    };
    if denied { DROP_PREFILTER_DENY } else { PASS }
}
