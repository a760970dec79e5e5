//! The programs the agent attaches, reusing the pinned ones when they are what this agent would
//! load (same instructions: same kernel tag). A restart over an unchanged object therefore keeps
//! program ids and writes no link; a new object replaces the pins and the links are updated.

use std::path::Path;

use aya::programs::{ProgramError, ProgramInfo, SchedClassifier, Xdp};
use maps_schema::programs::{FROM_ENDPOINT, TO_ENDPOINT, XDP_PREFILTER};
use serde::Serialize;

use crate::{
    loader::{self, LoadError},
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

fn pinned_tag(path: &Path) -> Option<u64> {
    ProgramInfo::from_pin(path).ok().map(|info| info.tag())
}

impl Programs {
    /// Loads the object (maps reused from their pins), compares each program with its pin, and keeps
    /// the pinned program when it is identical; otherwise pins the new one.
    pub fn load(paths: &Paths, object: &[u8]) -> Result<Self, ProgramsError> {
        let mut loaded = loader::load_for_agent(paths, object)?;
        let mut report = ProgramsReport::default();
        for name in maps_schema::programs::ALL {
            let pin = paths.prog_pin(name);
            let new_tag = loaded.program_tag(name);
            let reuse = new_tag.is_some() && pinned_tag(&pin) == new_tag;
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
