//! Verdicts and the per-CPU counters every verdict goes through.

use maps_schema::counters::counter_index;

use crate::maps::COUNTERS;

/// What happens to the packet.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Pass,
    Drop,
}

/// Counts the packet under `reason` and `direction` and returns the verdict that reason implies.
#[inline(always)]
pub(crate) fn account(reason: u32, direction: u32, bytes: u32) -> Verdict {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter_index(reason, direction)) {
        // SAFETY: per-CPU slot, only this CPU touches it while the program runs.
        unsafe {
            (*slot).packets += 1;
            (*slot).bytes += u64::from(bytes);
        }
    }
    if reason == maps_schema::reason::PASS {
        Verdict::Pass
    } else {
        Verdict::Drop
    }
}
