//! The programs the agent attaches, reusing the pinned ones when they are what this agent would
//! load (same instructions: same kernel tag). A restart over an unchanged object therefore keeps
//! program ids and writes no link; a new object replaces the pins and the links are updated.

use std::path::Path;

use aya::programs::{ProgramError, ProgramInfo, SchedClassifier, Xdp};
use maps_schema::programs::{FROM_ENDPOINT, TO_ENDPOINT, XDP_PREFILTER};
use serde::Serialize;

use crate::{
    bpf::loader::{self, LoadError},
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

/// The tag and map ids of a pinned program. The kernel's tag ignores which maps a program
/// references, so a resized or migrated map needs the ids too.
fn pinned(path: &Path) -> Option<(u64, Vec<u32>)> {
    let info = ProgramInfo::from_pin(path).ok()?;
    let maps = info.map_ids().ok().flatten().unwrap_or_default();
    Some((info.tag(), maps))
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
        // A pinned program is only reused if every named map it references is this load's.
        let same_maps = |ids: &[u32]| {
            ids.iter().all(|id| {
                aya::maps::MapInfo::from_id(*id)
                    .ok()
                    .and_then(|info| map_ids.get(info.name_as_str()?).copied())
                    .is_none_or(|current| current == *id)
            })
        };
        let mut report = ProgramsReport::default();
        for name in maps_schema::programs::ALL {
            let pin = paths.prog_pin(name);
            let new_tag = loaded.program_tag(name);
            let reuse = new_tag.is_some()
                && pinned(&pin).is_some_and(|(tag, maps)| Some(tag) == new_tag && same_maps(&maps));
            if !reuse {
                loaded.pin_program(name, &pin)?;
            }
            let id = ProgramInfo::from_pin(&pin)
                .map(|i| i.id())
                .unwrap_or_default();
            report.programs.push(((*name).to_owned(), id, reuse));
        }
        let pin_err = |path: &Path| {
            let path = path.display().to_string();
            move |source| ProgramsError::Pin {
                path,
                source: Box::new(source),
            }
        };
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

    /// The kernel id of a program handle.
    pub fn id_of(program: &SchedClassifier) -> u32 {
        program.info().map(|i| i.id()).unwrap_or_default()
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
    | Map::RingBuf(data)) = map
    else {
        return None;
    };
    data.info().ok().map(|i| i.id())
}
