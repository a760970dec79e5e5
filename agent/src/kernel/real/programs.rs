//! The programs the agent attaches, reusing the pinned ones when they are what this agent would
//! load (same instructions: same kernel tag). A restart over an unchanged object therefore keeps
//! program ids and writes no link; a new object replaces the pins and the links are updated.

use std::path::Path;

use aya::{
    maps::MapError,
    programs::{ProgramError, ProgramInfo, SchedClassifier, Xdp},
};
use maps_schema::programs::{FROM_ENDPOINT, TO_ENDPOINT, XDP_PREFILTER};
use serde::Serialize;

use crate::{
    kernel::real::loader::{self, LoadError},
    paths::Paths,
};

/// Program handles the drivers attach.
pub struct Programs {
    /// tc ingress of workload veths.
    pub from_endpoint: SchedClassifier,
    /// tc egress of workload veths.
    pub to_endpoint: SchedClassifier,
    /// XDP prefilter.
    pub xdp_prefilter: Xdp,
    /// What happened at load.
    pub report: ProgramsReport,
}

/// Whether each program was reused from its pin or newly pinned.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ProgramsReport {
    /// Program name → (kernel id, reused).
    pub programs: Vec<(String, u32, bool)>,
}

/// Errors loading programs.
#[derive(Debug, thiserror::Error)]
pub enum ProgramsError {
    /// Loading failed.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// Opening a pinned program failed.
    #[error("cannot open the pinned program {path}: {source}")]
    Pin {
        /// The pin.
        path: String,
        /// The cause.
        #[source]
        source: Box<ProgramError>,
    },
}

/// Why a pinned program could not be checked for reuse. The agent then replaces the pin with the
/// program it loaded (safe: the links are updated to it) rather than reuse one it cannot check.
#[derive(Debug, thiserror::Error)]
pub enum ReuseCheckError {
    /// The pin exists but cannot be read.
    #[error("cannot read the pinned program {path}: {source}")]
    Pin {
        /// The pin.
        path: String,
        /// The cause.
        #[source]
        source: Box<ProgramError>,
    },
    /// The ids of the maps the pinned program uses cannot be read.
    #[error(
        "cannot list the maps the pinned program {path} uses: {source}; this needs CAP_SYS_ADMIN (or CAP_BPF and CAP_PERFMON): grant it to the agent"
    )]
    MapIds {
        /// The pin.
        path: String,
        /// The cause.
        #[source]
        source: Box<ProgramError>,
    },
    /// A map the pinned program uses cannot be opened by id (`EPERM` without CAP_SYS_ADMIN).
    #[error(
        "cannot read map {id}, which the pinned program {path} uses: {source}; opening a map by id needs CAP_SYS_ADMIN: grant it to the agent"
    )]
    MapInfo {
        /// The pin.
        path: String,
        /// The map id.
        id: u32,
        /// The cause.
        #[source]
        source: Box<MapError>,
    },
}

/// The tag and map ids of a pinned program (`None`: no pin). The kernel's tag ignores which maps
/// a program references, so a resized or migrated map needs the ids too.
fn pinned(path: &Path) -> Result<Option<(u64, Vec<u32>)>, ReuseCheckError> {
    let shown = || path.display().to_string();
    let info = match ProgramInfo::from_pin(path) {
        Ok(info) => info,
        Err(ProgramError::SyscallError(e)) if e.io_error.kind() == std::io::ErrorKind::NotFound => {
            return Ok(None);
        }
        Err(source) => {
            return Err(ReuseCheckError::Pin {
                path: shown(),
                source: Box::new(source),
            });
        }
    };
    let maps = info
        .map_ids()
        .map_err(|source| ReuseCheckError::MapIds {
            path: shown(),
            source: Box::new(source),
        })?
        .unwrap_or_default();
    Ok(Some((info.tag(), maps)))
}

/// True when every named map among `ids` (the maps a pinned program uses) is this load's map of
/// that name (`current`: name → id). `name_of` reads a map's name by id (`MapInfo::from_id`); a
/// map that cannot be read is an error, never a silent match.
fn same_maps(
    path: &Path,
    ids: &[u32],
    current: &std::collections::BTreeMap<String, u32>,
    name_of: impl Fn(u32) -> Result<Option<String>, MapError>,
) -> Result<bool, ReuseCheckError> {
    for id in ids {
        let name = name_of(*id).map_err(|source| ReuseCheckError::MapInfo {
            path: path.display().to_string(),
            id: *id,
            source: Box::new(source),
        })?;
        if let Some(current) = name.and_then(|n| current.get(&n).copied())
            && current != *id
        {
            return Ok(false);
        }
    }
    Ok(true)
}

fn map_name(id: u32) -> Result<Option<String>, MapError> {
    let info = aya::maps::MapInfo::from_id(id)?;
    Ok(info.name_as_str().map(str::to_owned))
}

/// Whether the program pinned at `pin` is what this load would pin (same tag, this load's
/// maps). A pin that cannot be checked is not reused: the caller is told why and replaces it.
fn reusable(
    pin: &Path,
    new_tag: Option<u64>,
    current: &std::collections::BTreeMap<String, u32>,
) -> Result<bool, ReuseCheckError> {
    let Some(new_tag) = new_tag else {
        return Ok(false);
    };
    match pinned(pin)? {
        Some((tag, maps)) if tag == new_tag => same_maps(pin, &maps, current, map_name),
        _ => Ok(false),
    }
}

impl Programs {
    /// Loads the object (maps reused from their pins, `sizes` overriding map sizes by name),
    /// compares each program with its pin, and keeps the pinned program when it is identical
    /// and uses this load's maps; otherwise pins the new one.
    pub fn load(
        paths: &Paths,
        object: &[u8],
        sizes: &[(String, u32)],
    ) -> Result<Self, ProgramsError> {
        let mut loaded = loader::load_for_agent(paths, object, sizes)?;
        let map_ids: std::collections::BTreeMap<String, u32> = loaded
            .ebpf
            .maps()
            .filter_map(|(name, map)| Some((name.to_owned(), map_id(map)?)))
            .collect();
        let pin_err = |path: &Path| {
            let path = path.display().to_string();
            move |source| ProgramsError::Pin {
                path,
                source: Box::new(source),
            }
        };
        let mut report = ProgramsReport::default();
        for name in maps_schema::programs::ALL {
            let pin = paths.prog_pin(name);
            let new_tag = loaded.program_tag(name);
            // A pinned program is only reused if every named map it references is this load's;
            // one that cannot be checked is replaced (the links then move to the new one).
            let reuse = reusable(&pin, new_tag, &map_ids).unwrap_or_else(|e| {
                tracing::warn!(program = name, error = %e, "cannot check the pinned program; replacing it instead of reusing it");
                false
            });
            if !reuse {
                loaded.pin_program(name, &pin)?;
            }
            let id = ProgramInfo::from_pin(&pin).map_err(pin_err(&pin))?.id();
            report.programs.push(((*name).to_owned(), id, reuse));
        }
        let from = paths.prog_pin(FROM_ENDPOINT);
        let to = paths.prog_pin(TO_ENDPOINT);
        let xdp = paths.prog_pin(XDP_PREFILTER);
        Ok(Self {
            from_endpoint: SchedClassifier::from_pin(&from).map_err(pin_err(&from))?,
            to_endpoint: SchedClassifier::from_pin(&to).map_err(pin_err(&to))?,
            xdp_prefilter: Xdp::from_pin(&xdp, aya_obj::programs::XdpAttachType::Interface)
                .map_err(pin_err(&xdp))?,
            report,
        })
    }
}

fn map_id(map: &aya::maps::Map) -> Option<u32> {
    use aya::maps::Map;
    let (Map::Array(data)
    | Map::HashMap(data)
    | Map::LruHashMap(data)
    | Map::LpmTrie(data)
    | Map::PerCpuArray(data)
    | Map::PerCpuHashMap(data)
    | Map::ProgramArray(data)
    | Map::RingBuf(data)
    | Map::SkStorage(data)) = map
    else {
        return None;
    };
    data.info().ok().map(|i| i.id())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn eperm() -> MapError {
        MapError::SyscallError(aya::sys::SyscallError {
            call: "bpf_map_get_fd_by_id",
            io_error: std::io::Error::from_raw_os_error(libc::EPERM),
        })
    }

    #[test]
    fn a_map_that_cannot_be_read_is_an_error_naming_the_capability() {
        let current = BTreeMap::from([("policy_v1".to_owned(), 7)]);
        let pin = Path::new("/sys/fs/bpf/weir/progs/from_endpoint");
        let e = same_maps(pin, &[7], &current, |_| Err(eperm())).expect_err("unreadable");
        assert!(matches!(e, ReuseCheckError::MapInfo { id: 7, .. }), "{e:?}");
        let message = e.to_string();
        assert!(message.contains("CAP_SYS_ADMIN"), "{message}");
        assert!(message.contains("from_endpoint"), "{message}");
    }

    #[test]
    fn reuse_needs_every_named_map_to_be_this_loads() {
        let current = BTreeMap::from([("policy_v1".to_owned(), 7), ("ct4_v2".to_owned(), 8)]);
        let pin = Path::new("p");
        let names = |id: u32| {
            Ok(match id {
                7 => Some("policy_v1".to_owned()),
                8 | 9 => Some("ct4_v2".to_owned()),
                _ => None,
            })
        };
        assert!(same_maps(pin, &[7, 8, 3], &current, names).expect("readable"));
        // A program that still uses the previous `ct4_v2` (a resized map) is not reused.
        assert!(!same_maps(pin, &[7, 9], &current, names).expect("readable"));
    }
}
