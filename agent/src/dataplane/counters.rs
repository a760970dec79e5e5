//! Verdict counters as operators read them: every (reason, direction) slot with traffic, summed
//! over CPUs, with the reason's name shared with the eBPF side.

use maps_schema::{
    counters::counter_index,
    reason::{self, DIRECTIONS},
};

use crate::kernel::{CountersIo, InspectIo, KernelError};

/// One counter slot (the API contract's).
pub use weir_api::CounterView;

/// Every slot that counted something, over `io`.
pub fn read_with(io: &dyn CountersIo) -> Result<Vec<CounterView>, KernelError> {
    let mut out = Vec::new();
    for &code in reason::ALL {
        for direction in 0..DIRECTIONS {
            let (packets, bytes) = io.slot(counter_index(code, direction))?;
            if packets > 0 {
                out.push(CounterView {
                    code,
                    reason: reason::name(code).to_owned(),
                    direction: reason::direction_name(direction).to_owned(),
                    packets,
                    bytes,
                });
            }
        }
    }
    Ok(out)
}

/// Every slot of the pinned counters (read through `kernel`) that counted something.
pub fn read(kernel: &dyn InspectIo) -> Result<Vec<CounterView>, KernelError> {
    read_with(&*kernel.counter_array(maps_schema::maps::COUNTERS)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::fake::FakeKernel;

    #[test]
    fn only_slots_with_traffic_are_shown_by_name() {
        let k = FakeKernel::default();
        let index = counter_index(reason::DROP_PREFILTER_DENY, reason::DIR_PREFILTER);
        k.counters().insert(index, (3, 180));
        let shown = read_with(&k).expect("read");
        assert_eq!(
            shown,
            vec![CounterView {
                code: reason::DROP_PREFILTER_DENY,
                reason: reason::name(reason::DROP_PREFILTER_DENY).to_owned(),
                direction: reason::direction_name(reason::DIR_PREFILTER).to_owned(),
                packets: 3,
                bytes: 180,
            }]
        );
    }
}
