//! The real [`CountersIo`]: a pinned per-CPU counter array (the verdict counters, the rule hits).

use aya::maps::{Map, MapData, PerCpuArray};
use maps_schema::CounterValue;

use crate::{
    kernel::{CountersIo, KernelError},
    paths::Paths,
};

/// The real [`CountersIo`]: a pinned per-CPU array of [`CounterValue`] (`counters`, the rule
/// hits).
pub struct PinnedCounters {
    name: String,
    array: PerCpuArray<MapData, CounterValue>,
}

impl PinnedCounters {
    /// Opens the counter array pinned as `name`.
    pub fn open(paths: &Paths, name: &str) -> Result<Self, KernelError> {
        let pin = paths.map_pin(name);
        let open_err = |source| KernelError::OpenMap {
            path: pin.display().to_string(),
            source: Box::new(source),
        };
        let map =
            Map::from_map_data(MapData::from_pin(&pin).map_err(open_err)?).map_err(open_err)?;
        Ok(Self {
            name: name.to_owned(),
            array: PerCpuArray::try_from(map).map_err(open_err)?,
        })
    }
}

impl CountersIo for PinnedCounters {
    fn slot(&self, index: u32) -> Result<(u64, u64), KernelError> {
        let values = self
            .array
            .get(&index, 0)
            .map_err(|source| KernelError::MapOp {
                map: self.name.clone(),
                op: "read",
                source: Box::new(source),
            })?;
        Ok(values
            .iter()
            .fold((0, 0), |(p, b), v| (p + v.packets, b + v.bytes)))
    }
}
