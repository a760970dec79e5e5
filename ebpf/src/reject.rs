//! Test-only (feature `verifier-reject`): a program the verifier must reject, so the verifier gate
//! can show that it fails when a program is rejected.

use aya_ebpf::{macros::classifier, programs::TcContext};

/// Reads the first packet byte without a bounds check: the verifier refuses the load.
#[classifier]
pub fn wt_rejected(ctx: TcContext) -> i32 {
    // SAFETY: none — this is the point: the verifier must refuse it.
    let first = unsafe { core::ptr::read_volatile(ctx.data() as *const u8) };
    i32::from(first)
}
