//! Trace runs of `weir policy trace` (`maps_schema::trace`): recognised by the context's `cb[]`
//! carrying the agent's nonce, answered in `cb[]`.

use aya_ebpf::bindings::__sk_buff;
use maps_schema::{
    reason::is_pass,
    trace::{CB_DONE, CB_MAGIC},
};

use crate::{counters::Verdict, maps::TRACE};

/// True when this run is a trace run: `cb[0]` is the magic and `cb[1..3]` the agent's non-zero
/// nonce. Real traffic costs one context load and compare (its `cb[0]` is not the magic, or its
/// nonce does not match).
#[inline(always)]
pub(crate) fn is_trace_run(skb: *const __sk_buff) -> bool {
    // Context fields must be read one 4-byte load each (the verifier refuses a merged 8-byte
    // load of two `cb` words), hence volatile reads.
    // SAFETY: the context pointer is the kernel's `__sk_buff` for this program run.
    let magic = unsafe { core::ptr::read_volatile(&raw const (*skb).cb[0]) };
    if magic != CB_MAGIC {
        return false;
    }
    // SAFETY: as above.
    let (lo, hi) = unsafe {
        (
            core::ptr::read_volatile(&raw const (*skb).cb[1]),
            core::ptr::read_volatile(&raw const (*skb).cb[2]),
        )
    };
    let nonce = u64::from(lo) | (u64::from(hi) << 32);
    TRACE
        .get(0)
        .is_some_and(|c| c.nonce != 0 && c.nonce == nonce)
}

/// Writes a trace run's answer (reason, deciding rule) into `cb[]` and returns its verdict.
#[inline(always)]
pub(crate) fn answer(skb: *mut __sk_buff, reason: u32, rule: u32) -> Verdict {
    // SAFETY: `cb` is writable for tc programs; the context pointer is this run's `__sk_buff`.
    // One 4-byte store each (volatile: never merged into a wider context store).
    unsafe {
        core::ptr::write_volatile(&raw mut (*skb).cb[0], CB_DONE);
        core::ptr::write_volatile(&raw mut (*skb).cb[1], reason);
        core::ptr::write_volatile(&raw mut (*skb).cb[2], rule);
    }
    if is_pass(reason) {
        Verdict::Pass
    } else {
        Verdict::Drop
    }
}
