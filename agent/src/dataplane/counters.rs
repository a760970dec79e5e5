//! Verdict counters as operators read them: every (reason, direction) slot with traffic, summed
//! over CPUs, with the reason's name shared with the eBPF side.

use aya::maps::{Map, MapData, PerCpuArray};
use maps_schema::{
    CounterValue,
    counters::counter_index,
    reason::{self, DIRECTIONS},
};
use serde::{Deserialize, Serialize};

use super::kernel::KernelError;
use crate::paths::Paths;

/// One counter slot.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct CounterView {
    /// Reason code.
    pub code: u32,
    /// Reason name.
    pub reason: String,
    /// Direction name.
    pub direction: String,
    /// Packets.
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
}

/// Every slot that counted something.
pub fn read(paths: &Paths) -> Result<Vec<CounterView>, KernelError> {
    let pin = paths.map_pin(maps_schema::maps::COUNTERS);
    let open_err = |source| KernelError::OpenMap {
        path: pin.display().to_string(),
        source: Box::new(source),
    };
    let map = Map::from_map_data(MapData::from_pin(&pin).map_err(open_err)?).map_err(open_err)?;
    let array: PerCpuArray<_, CounterValue> = PerCpuArray::try_from(map).map_err(open_err)?;
    let mut out = Vec::new();
    for &code in reason::ALL {
        for direction in 0..DIRECTIONS {
            let values = array
                .get(&counter_index(code, direction), 0)
                .map_err(|source| KernelError::MapOp {
                    map: maps_schema::maps::COUNTERS.into(),
                    op: "read",
                    source: Box::new(source),
                })?;
            let (packets, bytes) = values
                .iter()
                .fold((0, 0), |(p, b), v| (p + v.packets, b + v.bytes));
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
