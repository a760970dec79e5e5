//! The real [`CtIo`]: the pinned conntrack maps of one layout, opened per operation (a migration
//! may replace the pins), read and deleted with batch syscalls; the programs' clock (`now_ns`) and
//! their per-CPU event counters (`read_event_sums`).

use std::{os::fd::AsFd as _, path::Path};

use aya::maps::MapData;
use bytemuck::Pod;
use maps_schema::{
    CtEntry, Nat4Entry, Nat4Key, SvcCt4Entry, SvcCt4Key,
    conntrack::{Ct4Key, Ct6Key},
    nat::DIR_EGRESS,
    service_ct::SVC_CT4,
};

use crate::{
    kernel::{CtIo, KernelError, ServiceFlows4, ct_layout::map_names, real::batch},
    paths::Paths,
};

/// `CLOCK_MONOTONIC_COARSE` now, in nanoseconds (the programs' clock).
#[must_use]
pub fn now_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC_COARSE).map_or(0, |t| {
        u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000
            + u64::try_from(t.tv_nsec()).unwrap_or(0)
    })
}

fn open(name: &str, path: &Path) -> Result<MapData, KernelError> {
    MapData::from_pin(path).map_err(|source| KernelError::OpenMap {
        path: format!("{name} at {}", path.display()),
        source: Box::new(source),
    })
}

fn io_err(map: &str, op: &'static str, e: std::io::Error) -> KernelError {
    KernelError::Attach {
        op,
        what: map.to_owned(),
        source: Box::new(e),
    }
}

fn entries<K: Pod>(name: &str, map: &MapData) -> Result<Vec<(K, CtEntry)>, KernelError> {
    let layout = maps_schema::maps::layout_version(name).unwrap_or(maps_schema::conntrack::LAYOUT);
    crate::kernel::ct_layout::read::<K>(map, layout).map_err(|e| io_err(name, "read", e))
}

/// The real [`CtIo`]: the pinned conntrack maps of one layout, opened per operation (a migration
/// may replace the pins), read and deleted with batch syscalls.
pub struct PinnedCt {
    paths: Paths,
    layout: u32,
}

impl PinnedCt {
    /// The conntrack maps of layout `layout` under `paths`.
    #[must_use]
    pub fn new(paths: &Paths, layout: u32) -> Self {
        Self {
            paths: paths.clone(),
            layout,
        }
    }

    fn names(&self) -> (String, String) {
        map_names(self.layout)
    }

    fn read<K: Pod>(&self, name: &str) -> Result<Vec<(K, CtEntry)>, KernelError> {
        entries::<K>(name, &open(name, &self.paths.map_pin(name))?)
    }

    fn delete<K: Pod>(&self, name: &str, keys: &[K]) -> Result<u64, KernelError> {
        if keys.is_empty() {
            return Ok(0);
        }
        let map = open(name, &self.paths.map_pin(name))?;
        let n = batch::delete(map.fd().as_fd(), keys).map_err(|e| io_err(name, "delete", e))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// Every entry of the map pinned as `name` and its capacity; `None` without the pin.
    fn read_if_pinned<K: Pod, V: Pod>(
        &self,
        name: &str,
    ) -> Result<Option<Pinned<K, V>>, KernelError> {
        let Some(map) = open_if_pinned(name, &self.paths.map_pin(name))? else {
            return Ok(None);
        };
        let fd = map.fd().as_fd();
        let entries = batch::lookup_all::<K, V>(fd).map_err(|e| io_err(name, "read", e))?;
        let max = batch::max_entries(fd).map_err(|e| io_err(name, "read", e))?;
        Ok(Some((entries, max)))
    }

    fn max(&self, name: &str) -> Result<u64, KernelError> {
        let map = open(name, &self.paths.map_pin(name))?;
        let info = map.info().map_err(|source| KernelError::MapOp {
            map: name.to_owned(),
            op: "read the capacity of",
            source: Box::new(source),
        })?;
        Ok(u64::from(info.max_entries()))
    }
}

impl CtIo for PinnedCt {
    fn entries4(&self) -> Result<Vec<(Ct4Key, CtEntry)>, KernelError> {
        self.read(&self.names().0)
    }

    fn entries6(&self) -> Result<Vec<(Ct6Key, CtEntry)>, KernelError> {
        self.read(&self.names().1)
    }

    fn delete4(&mut self, keys: &[Ct4Key]) -> Result<u64, KernelError> {
        self.delete(&self.names().0, keys)
    }

    fn delete6(&mut self, keys: &[Ct6Key]) -> Result<u64, KernelError> {
        self.delete(&self.names().1, keys)
    }

    fn capacity(&self) -> Result<(u64, u64), KernelError> {
        let (ct4, ct6) = self.names();
        Ok((self.max(&ct4)?, self.max(&ct6)?))
    }

    fn created(&self) -> Result<Option<[u64; 2]>, KernelError> {
        read_created(&self.paths)
    }

    fn service_flows4(&self) -> Result<Option<ServiceFlows4>, KernelError> {
        Ok(self
            .read_if_pinned::<SvcCt4Key, SvcCt4Entry>(SVC_CT4)?
            .map(|(entries, max)| (entries, u64::from(max))))
    }

    fn delete_service_flows4(&mut self, keys: &[SvcCt4Key]) -> Result<u64, KernelError> {
        self.delete(SVC_CT4, keys)
    }

    fn nat_flows4(&self) -> Result<Vec<Nat4Key>, KernelError> {
        let entries = self
            .read_if_pinned::<Nat4Key, Nat4Entry>(maps_schema::maps::NAT4)?
            .map_or_else(Vec::new, |(entries, _)| entries);
        Ok(entries
            .into_iter()
            .filter(|(k, _)| k.direction == DIR_EGRESS)
            .map(|(k, _)| k)
            .collect())
    }
}

/// A pinned map's entries and capacity.
type Pinned<K, V> = (Vec<(K, V)>, u32);

/// The map pinned at `path`; `None` when there is no such pin.
fn open_if_pinned(name: &str, path: &Path) -> Result<Option<MapData>, KernelError> {
    match MapData::from_pin(path) {
        Ok(map) => Ok(Some(map)),
        Err(e) if is_missing_pin(&e) => Ok(None),
        Err(e) => Err(KernelError::OpenMap {
            path: format!("{name} at {}", path.display()),
            source: Box::new(e),
        }),
    }
}

/// Entries the programs created (IPv4, IPv6), summed over CPUs; `None` without the pin.
fn read_created(paths: &Paths) -> Result<Option<[u64; 2]>, KernelError> {
    use maps_schema::conntrack::{EVENT_CREATED4, EVENT_CREATED6};
    let sums = read_event_sums(
        paths,
        maps_schema::maps::CT_EVENTS,
        &[EVENT_CREATED4, EVENT_CREATED6],
    )?;
    Ok(sums.map(|s| [s[0], s[1]]))
}

/// Slots `slots` of the per-CPU `u64` array pinned as `name` (an events counter the programs
/// bump), each summed over CPUs, in order; `None` without the pin.
pub fn read_event_sums(
    paths: &Paths,
    name: &str,
    slots: &[u32],
) -> Result<Option<Vec<u64>>, KernelError> {
    let pin = paths.map_pin(name);
    let open_err = |source| KernelError::OpenMap {
        path: format!("{name} at {}", pin.display()),
        source: Box::new(source),
    };
    let Some(data) = open_if_pinned(name, &pin)? else {
        return Ok(None);
    };
    let array = aya::maps::PerCpuArray::<_, u64>::try_from(aya::maps::Map::PerCpuArray(data))
        .map_err(open_err)?;
    let sum = |i: u32| {
        array
            .get(&i, 0)
            .map(|v| v.iter().sum::<u64>())
            .map_err(|source| KernelError::MapOp {
                map: name.to_owned(),
                op: "read",
                source: Box::new(source),
            })
    };
    slots
        .iter()
        .map(|&i| sum(i))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// True when `e` says the pin does not exist.
fn is_missing_pin(e: &aya::maps::MapError) -> bool {
    matches!(e, aya::maps::MapError::SyscallError(s) if s.io_error.kind() == std::io::ErrorKind::NotFound)
}
