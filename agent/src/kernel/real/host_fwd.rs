//! BPF host routing's program array (`host_fwd_v1`, [`HostFwdIo`]): `from_endpoint` and `masq_ingress` tail-call
//! into its slots; a slot holds a pinned program (`host_fwd`, `host_fwd_in`, `to_endpoint`) or nothing.

use std::os::fd::AsFd as _;

use aya::{
    maps::{Map, MapData, ProgramArray},
    programs::{ProgramInfo, SchedClassifier},
};

use crate::{
    kernel::{HostFwdIo, KernelError},
    paths::Paths,
};

/// The pinned `host_fwd_v1`, opened from its pin at each call (host routing is set once per start).
pub struct PinnedHostFwd {
    paths: Paths,
}

impl PinnedHostFwd {
    /// The program array of the pin root `paths` names.
    #[must_use]
    pub fn new(paths: &Paths) -> Self {
        Self {
            paths: paths.clone(),
        }
    }

    fn open(&self) -> Result<MapData, KernelError> {
        let pin = self.paths.map_pin(maps_schema::maps::HOST_FWD);
        MapData::from_pin(&pin).map_err(|source| KernelError::OpenMap {
            path: pin.display().to_string(),
            source: Box::new(source),
        })
    }

    fn array(&self) -> Result<ProgramArray<MapData>, KernelError> {
        let pin = self.paths.map_pin(maps_schema::maps::HOST_FWD);
        ProgramArray::try_from(Map::ProgramArray(self.open()?)).map_err(|source| {
            KernelError::OpenMap {
                path: pin.display().to_string(),
                source: Box::new(source),
            }
        })
    }
}

fn map_op(op: &'static str) -> impl FnOnce(aya::maps::MapError) -> KernelError {
    move |source| KernelError::MapOp {
        map: maps_schema::maps::HOST_FWD.to_owned(),
        op,
        source: Box::new(source),
    }
}

fn open_program(path: &std::path::Path) -> impl FnOnce(aya::programs::ProgramError) -> KernelError {
    let path = path.display().to_string();
    move |source| KernelError::OpenProgram {
        path,
        source: Box::new(source),
    }
}

impl HostFwdIo for PinnedHostFwd {
    fn slot(&mut self, slot: u32) -> Result<Option<u32>, KernelError> {
        let data = self.open()?;
        crate::kernel::real::batch::lookup(data.fd().as_fd(), &slot).map_err(|source| {
            KernelError::Io {
                op: "read",
                what: format!(
                    "slot {slot} of {}",
                    self.paths.map_pin(maps_schema::maps::HOST_FWD).display()
                ),
                source,
            }
        })
    }

    fn program_id(&mut self, program: &str) -> Result<u32, KernelError> {
        let pin = self.paths.prog_pin(program);
        Ok(ProgramInfo::from_pin(&pin)
            .map_err(open_program(&pin))?
            .id())
    }

    fn set(&mut self, slot: u32, program: &str) -> Result<(), KernelError> {
        let pin = self.paths.prog_pin(program);
        let prog = SchedClassifier::from_pin(&pin).map_err(open_program(&pin))?;
        let fd = prog.fd().map_err(open_program(&pin))?;
        self.array()?.set(slot, fd, 0).map_err(map_op("write"))
    }

    fn clear(&mut self, slot: u32) -> Result<(), KernelError> {
        self.array()?.clear_index(&slot).map_err(map_op("delete"))
    }
}
