//! The NAT map's upkeep and pressure (`nat4_v1`): what each NAT sweep found and what the programs
//! counted (`nat_events_v1`), kept by the NAT sweep (`upkeep`) for `weir status` and `/metrics`.

use std::sync::{Arc, Mutex, PoisonError};

use maps_schema::{maps::NAT4, nat};

use super::masquerade::NatSweep;
use crate::kernel::{InspectIo, KernelError};

/// The NAT map as of the last sweep (the API contract's).
pub use weir_api::NatStats;

/// Where the NAT sweep keeps [`NatStats`]: shared with the API and the metrics.
#[derive(Clone)]
pub struct NatPressure {
    /// The counters.
    pub stats: Arc<Mutex<NatStats>>,
    /// Where the map's capacity and the programs' events are read.
    pub kernel: Arc<dyn InspectIo>,
}

impl NatPressure {
    /// Records one sweep, with the map's capacity and the programs' events read now. The sweep's
    /// own figures are kept even when the reads fail (the error says which).
    pub fn record(&self, sweep: &NatSweep) -> Result<(), KernelError> {
        let mut stats = *self.stats.lock().unwrap_or_else(PoisonError::into_inner);
        stats.sweeps += 1;
        stats.entries = sweep.entries.saturating_sub(sweep.deleted);
        stats.swept += sweep.deleted;
        let read = self.read(&mut stats);
        *self.stats.lock().unwrap_or_else(PoisonError::into_inner) = stats;
        read
    }

    fn read(&self, stats: &mut NatStats) -> Result<(), KernelError> {
        stats.capacity = u64::from(self.kernel.map_meta(NAT4)?.max_entries);
        if let Some(events) = self.kernel.nat_events()? {
            let at = |slot: u32| {
                usize::try_from(slot).map_or(0, |i| events.get(i).copied().unwrap_or(0))
            };
            stats.created = at(nat::EVENT_CREATED);
            stats.collisions = at(nat::EVENT_COLLISION);
            stats.exhausted = at(nat::EVENT_EXHAUSTED);
            stats.insert_failed = at(nat::EVENT_INSERT_FAILED);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::{MapMeta, fake::FakeKernel};

    #[test]
    fn a_sweep_records_what_is_left_what_went_and_the_programs_events() {
        let kernel = FakeKernel::default();
        kernel.map_metas().insert(
            NAT4.to_owned(),
            MapMeta {
                max_entries: 131_072,
                ..MapMeta::default()
            },
        );
        *kernel.nat_events.lock().expect("lock") = [1_000, 7, 2, 1];
        let pressure = NatPressure {
            stats: Arc::default(),
            kernel: Arc::new(kernel.clone()),
        };
        let sweep = |entries, deleted| NatSweep { entries, deleted };
        pressure.record(&sweep(2_000, 500)).expect("record");
        pressure.record(&sweep(1_500, 100)).expect("record");
        let stats = *pressure.stats.lock().expect("lock");
        assert_eq!(
            stats,
            NatStats {
                sweeps: 2,
                entries: 1_400,
                capacity: 131_072,
                swept: 600,
                created: 1_000,
                collisions: 7,
                exhausted: 2,
                insert_failed: 1,
            }
        );
        // Without the map's pin the sweep's own figures are still kept, and the error says so.
        kernel.map_metas().clear();
        assert!(pressure.record(&sweep(1_400, 400)).is_err());
        let stats = *pressure.stats.lock().expect("lock");
        assert_eq!(
            (stats.sweeps, stats.entries, stats.swept),
            (3, 1_000, 1_000)
        );
    }
}
