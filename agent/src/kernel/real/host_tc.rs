//! The real [`HostTcIo`]: the masquerade's programs (`masq_egress`, `masq_ingress`) from their pins, their tcx
//! links pinned at `links/<ifname>:<program>`, and the interfaces' indexes and first IPv4 addresses.

use std::{collections::BTreeMap, io, net::Ipv4Addr};

use attach::AttachMode;
use aya::programs::SchedClassifier;
use maps_schema::programs::MASQ_INGRESS;

use crate::{
    kernel::{HostTcIo, KernelError, MASQ_PROGRAMS, TcAttachType},
    paths::Paths,
};

/// The real [`HostTcIo`]: both programs from their pins, links at `links/<ifname>:<program>`.
pub struct PinnedHostTc {
    paths: Paths,
    programs: BTreeMap<&'static str, (SchedClassifier, u32)>,
}

impl PinnedHostTc {
    /// Opens the pinned masquerade programs.
    pub fn open(paths: &Paths) -> Result<Self, KernelError> {
        let mut programs = BTreeMap::new();
        for (name, _) in MASQ_PROGRAMS {
            let pin = paths.prog_pin(name);
            let err = |op: &'static str| {
                let what = pin.display().to_string();
                move |e: aya::programs::ProgramError| KernelError::Attach {
                    op,
                    what,
                    source: Box::new(e),
                }
            };
            let program = SchedClassifier::from_pin(&pin).map_err(err("open"))?;
            let id = program.info().map_err(err("read the id of"))?.id();
            programs.insert(name, (program, id));
        }
        Ok(Self {
            paths: paths.clone(),
            programs,
        })
    }
}

fn hook_of(program: &str) -> TcAttachType {
    if program == MASQ_INGRESS {
        TcAttachType::Ingress
    } else {
        TcAttachType::Egress
    }
}

impl HostTcIo for PinnedHostTc {
    fn pinned(&self) -> Result<Vec<(String, String)>, KernelError> {
        Ok(super::link_pins(&self.paths)?
            .into_iter()
            .filter(|(_, program)| MASQ_PROGRAMS.iter().any(|(p, _)| p == program))
            .collect())
    }

    fn pinned_program(&self, ifname: &str, program: &str) -> Option<u32> {
        attach::pinned_link_program(&self.paths.link_pin(ifname, program))
    }

    fn pin_is_live(&self, ifname: &str, program: &str) -> bool {
        let (Some(id), Ok(ifindex)) = (
            self.pinned_program(ifname, program),
            nix::net::if_::if_nametoindex(ifname),
        ) else {
            return false;
        };
        attach::tcx::tcx_programs(ifindex, hook_of(program)).contains(&id)
    }

    fn current(&self, program: &str) -> u32 {
        self.programs.get(program).map_or(0, |(_, id)| *id)
    }

    fn interface(&self, ifname: &str) -> Option<(u32, Option<Ipv4Addr>)> {
        let ifindex = nix::net::if_::if_nametoindex(ifname).ok()?;
        let addr = nix::ifaddrs::getifaddrs().ok().and_then(|mut addrs| {
            addrs.find_map(|a| {
                (a.interface_name == ifname)
                    .then(|| {
                        a.address?
                            .as_sockaddr_in()
                            .map(nix::sys::socket::SockaddrIn::ip)
                    })
                    .flatten()
            })
        });
        Some((ifindex, addr))
    }

    fn attach(&mut self, ifname: &str, program: &str) -> Result<AttachMode, KernelError> {
        let pin = self.paths.link_pin(ifname, program);
        let Some((prog, _)) = self.programs.get_mut(program) else {
            return Err(KernelError::Attach {
                op: "attach",
                what: format!("{program} to {ifname}"),
                source: Box::new(io::Error::from(io::ErrorKind::NotFound)),
            });
        };
        attach::attach_tc(prog, program, ifname, hook_of(program), &pin).map_err(|e| {
            KernelError::Attach {
                op: "attach",
                what: format!("{program} to {ifname}"),
                source: Box::new(e),
            }
        })
    }

    fn unpin(&mut self, ifname: &str, program: &str) -> Result<(), KernelError> {
        let pin = self.paths.link_pin(ifname, program);
        crate::kernel::real::batch::detach_link_pin(&pin).map_err(|e| KernelError::Io {
            op: "unpin",
            what: pin.display().to_string(),
            source: e,
        })
    }
}
