//! The opt-in debug build (feature `debug-log`, never the default object): every endpoint decision
//! is logged through aya-log-ebpf, drained by the agent into `tracing` (target `datapath`).

use aya_ebpf::programs::TcContext;

use crate::{counters::Seen, parse::Reason};

/// Logs one decision: program direction, interface, length, reason code, deciding rule, trace run.
#[inline(always)]
pub(crate) fn decision(ctx: &TcContext, seen: &Seen, reason: Reason, rule: u32) {
    aya_log_ebpf::info!(
        ctx,
        "weir decision: direction={} ifindex={} len={} reason={} rule={} trace={}",
        seen.direction,
        seen.ifindex,
        seen.len,
        reason,
        rule,
        u32::from(seen.trace)
    );
}
