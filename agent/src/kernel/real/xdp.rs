//! The real [`XdpIo`]: `xdp_prefilter` from its pin, its XDP links pinned at
//! `links/<ifname>:xdp_prefilter`, and whether the interface each pin names is the one the link runs on.

use attach::AttachMode;
use aya::programs::Xdp;
use maps_schema::programs::XDP_PREFILTER;

use crate::{
    kernel::{KernelError, XdpIo},
    paths::Paths,
};

/// The real [`XdpIo`]: `xdp_prefilter` from its pin, links pinned at `links/<ifname>:xdp_prefilter`.
pub struct PinnedXdp {
    paths: Paths,
    program: Xdp,
    /// Its kernel id, read once.
    id: u32,
}

impl PinnedXdp {
    /// Opens the pinned `xdp_prefilter` program.
    pub fn open(paths: &Paths) -> Result<Self, KernelError> {
        let pin = paths.prog_pin(XDP_PREFILTER);
        let program =
            Xdp::from_pin(&pin, aya_obj::programs::XdpAttachType::Interface).map_err(|e| {
                KernelError::Attach {
                    op: "open",
                    what: pin.display().to_string(),
                    source: Box::new(e),
                }
            })?;
        let id = program
            .info()
            .map_err(|e| KernelError::Attach {
                op: "read the id of",
                what: pin.display().to_string(),
                source: Box::new(e),
            })?
            .id();
        Ok(Self {
            paths: paths.clone(),
            program,
            id,
        })
    }
}

impl XdpIo for PinnedXdp {
    fn pinned(&self) -> Result<Vec<String>, KernelError> {
        Ok(super::link_pins(&self.paths)?
            .into_iter()
            .filter(|(_, program)| program == XDP_PREFILTER)
            .map(|(ifname, _)| ifname)
            .collect())
    }

    fn pinned_program(&self, ifname: &str) -> Option<u32> {
        attach::pinned_link_program(&self.paths.link_pin(ifname, XDP_PREFILTER))
    }

    fn pin_is_live(&self, ifname: &str) -> bool {
        let pin = self.paths.link_pin(ifname, XDP_PREFILTER);
        match (
            crate::kernel::real::batch::xdp_link_ifindex(&pin),
            nix::net::if_::if_nametoindex(ifname),
        ) {
            (Ok(on), Ok(now)) => on == now,
            _ => false,
        }
    }

    fn current(&self) -> u32 {
        self.id
    }

    fn link_exists(&self, ifname: &str) -> bool {
        nix::net::if_::if_nametoindex(ifname).is_ok()
    }

    fn attach(&mut self, ifname: &str) -> Result<AttachMode, KernelError> {
        let pin = self.paths.link_pin(ifname, XDP_PREFILTER);
        attach::attach_xdp(&mut self.program, XDP_PREFILTER, ifname, &pin).map_err(|e| {
            KernelError::Attach {
                op: "attach",
                what: format!("{XDP_PREFILTER} to {ifname}"),
                source: Box::new(e),
            }
        })
    }

    fn unpin(&mut self, ifname: &str) -> Result<(), KernelError> {
        let pin = self.paths.link_pin(ifname, XDP_PREFILTER);
        crate::kernel::real::batch::detach_link_pin(&pin).map_err(|e| KernelError::Io {
            op: "unpin",
            what: pin.display().to_string(),
            source: e,
        })
    }
}
