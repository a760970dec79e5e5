//! The real [`Attacher`]: the endpoint programs (from `programs::Programs`) on workload links by
//! the configured [`Mechanism`] — weir's `cls_bpf` filter slot on clsact, or tcx links pinned
//! under `links/` — with the other mechanism's attachments read back as leftovers. One exception:
//! with filters, a live link that already runs weir's tcx links keeps them (see `hook`
//! below): moving it would need a clsact qdisc on an up device, which drops packets.

use std::{
    fs, io,
    os::fd::{AsFd as _, AsRawFd as _},
};

use attach::{
    Mechanism,
    endpoint::{HookState, hook_state},
    filter::Tc,
};
use aya::programs::{SchedClassifier, TcAttachType};

use crate::kernel::{Attacher, Hook, KernelError};
use crate::{kernel::real::programs::Programs, paths::Paths};

/// Attaches the agent's tc programs to workload links.
pub struct TcLinks {
    paths: Paths,
    mechanism: Mechanism,
    from_endpoint: SchedClassifier,
    to_endpoint: SchedClassifier,
    /// The kernel ids of (`from_endpoint`, `to_endpoint`), read once.
    ids: (u32, u32),
    tc: Tc,
}

fn kerr(
    op: &'static str,
    what: String,
    e: impl std::error::Error + Send + Sync + 'static,
) -> KernelError {
    KernelError::Attach {
        op,
        what,
        source: Box::new(e),
    }
}

impl TcLinks {
    /// Uses the agent's tc programs, attaching them by `mechanism`.
    pub fn new(
        paths: Paths,
        programs: Programs,
        mechanism: Mechanism,
    ) -> Result<Self, KernelError> {
        let tc = Tc::open().map_err(|e| kerr("open", "a netlink socket".into(), e))?;
        let id = |p: &SchedClassifier, name: &str| {
            p.info()
                .map(|i| i.id())
                .map_err(|e| kerr("read the id of", format!("the program {name}"), e))
        };
        let ids = (
            id(
                &programs.from_endpoint,
                maps_schema::programs::FROM_ENDPOINT,
            )?,
            id(&programs.to_endpoint, maps_schema::programs::TO_ENDPOINT)?,
        );
        Ok(Self {
            paths,
            mechanism,
            from_endpoint: programs.from_endpoint,
            to_endpoint: programs.to_endpoint,
            ids,
            tc,
        })
    }

    fn program(&mut self, name: &str) -> &mut SchedClassifier {
        if name == maps_schema::programs::FROM_ENDPOINT {
            &mut self.from_endpoint
        } else {
            &mut self.to_endpoint
        }
    }

    fn read(
        &mut self,
        ifindex: u32,
        program: &str,
        hook: TcAttachType,
    ) -> Result<HookState, KernelError> {
        hook_state(&mut self.tc, ifindex, hook, program)
            .map_err(|e| kerr("read back", format!("{program} on interface {ifindex}"), e))
    }

    fn set_filter(
        &mut self,
        ifname: &str,
        ifindex: u32,
        program: &str,
        hook: TcAttachType,
    ) -> Result<(), KernelError> {
        let what = || format!("{program} to {ifname}");
        let fd = self
            .program(program)
            .fd()
            .map_err(|e| kerr("attach", what(), e))?
            .as_fd()
            .as_raw_fd();
        self.tc
            .set_filter(ifindex, hook, fd, program)
            .map_err(|e| kerr("attach", what(), e))
    }

    fn has_filter(
        &mut self,
        ifindex: u32,
        program: &str,
        hook: TcAttachType,
    ) -> Result<bool, KernelError> {
        let state = self.read(ifindex, program, hook)?;
        Ok(state.slot.is_some_and(|f| f.name == program))
    }

    fn attach_tcx(
        &mut self,
        ifname: &str,
        program: &str,
        hook: TcAttachType,
    ) -> Result<(), KernelError> {
        let pin = self.paths.link_pin(ifname, program);
        let prog = self.program(program);
        attach::attach_tc(prog, program, ifname, hook, &pin)
            .map_err(|e| kerr("attach", format!("{program} to {ifname}"), e))?;
        Ok(())
    }
}

impl Attacher for TcLinks {
    fn pinned(&self) -> Result<Vec<(String, String)>, KernelError> {
        let dir = self.paths.links_dir();
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(kerr("list", dir.display().to_string(), e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| kerr("list", dir.display().to_string(), e))?;
            out.extend(crate::paths::parse_link_pin(
                &entry.file_name().to_string_lossy(),
            ));
        }
        Ok(out)
    }

    fn has_pin(&self, ifname: &str, program: &str) -> bool {
        self.paths
            .link_pin(ifname, program)
            .symlink_metadata()
            .is_ok()
    }

    fn hook(
        &mut self,
        ifname: &str,
        ifindex: u32,
        program: &str,
        hook: TcAttachType,
    ) -> Result<Hook, KernelError> {
        let state = self.read(ifindex, program, hook)?;
        let pin = self.paths.link_pin(ifname, program);
        let pinned = attach::pinned_link_program(&pin);
        let pin_exists = pinned.is_some() || pin.symlink_metadata().is_ok();
        let pin_live = pinned.filter(|id| state.tcx.contains(id));
        let slot = state
            .slot
            .as_ref()
            .filter(|f| f.name == program)
            .map(|f| f.program_id);
        let strays = !state.strays.is_empty();
        Ok(match self.mechanism {
            // A live link that runs weir's tcx link and no filter keeps the link (updated through
            // it): adding a clsact qdisc to an up device deactivates it for a moment
            // (`qdisc_graft` → `dev_deactivate`), dropping what it sends meanwhile.
            Mechanism::Filter if slot.is_none() && pin_live.is_some() => Hook {
                ours: pin_live,
                leftovers: strays,
            },
            Mechanism::Filter => Hook {
                ours: slot,
                leftovers: pin_exists || strays,
            },
            Mechanism::Tcx => Hook {
                ours: pin_live,
                leftovers: slot.is_some() || strays || (pin_exists && pin_live.is_none()),
            },
        })
    }

    fn link_exists(&self, ifname: &str, ifindex: u32) -> bool {
        nix::net::if_::if_nametoindex(ifname).is_ok_and(|i| i == ifindex)
    }

    fn current(&self, program: &str) -> u32 {
        if program == maps_schema::programs::FROM_ENDPOINT {
            self.ids.0
        } else {
            self.ids.1
        }
    }

    fn attach(
        &mut self,
        ifname: &str,
        ifindex: u32,
        program: &str,
        hook: TcAttachType,
    ) -> Result<(), KernelError> {
        match self.mechanism {
            Mechanism::Filter => {
                self.tc
                    .add_clsact(ifindex)
                    .map_err(|e| kerr("attach", format!("clsact to {ifname}"), e))?;
                self.set_filter(ifname, ifindex, program, hook)
            }
            Mechanism::Tcx => {
                // A pin that outlived its interface holds a dead link: a new one replaces it.
                self.unpin(ifname, program)?;
                self.attach_tcx(ifname, program, hook)
            }
        }
    }

    fn update(
        &mut self,
        ifname: &str,
        ifindex: u32,
        program: &str,
        hook: TcAttachType,
    ) -> Result<(), KernelError> {
        let mechanism = self.mechanism;
        match mechanism {
            // A link kept on its tcx link (see `hook`) is updated through it.
            Mechanism::Filter if !self.has_filter(ifindex, program, hook)? => {
                self.attach_tcx(ifname, program, hook)
            }
            // The same slot: cls_bpf swaps the program in place.
            Mechanism::Filter => self.set_filter(ifname, ifindex, program, hook),
            // attach_tc reuses an existing pin through bpf_link_update.
            Mechanism::Tcx => self.attach_tcx(ifname, program, hook),
        }
    }

    fn sweep(
        &mut self,
        ifname: &str,
        ifindex: u32,
        program: &str,
        hook: TcAttachType,
    ) -> Result<u64, KernelError> {
        let state = self.read(ifindex, program, hook)?;
        let has_filter = state.slot.as_ref().is_some_and(|f| f.name == program);
        let mut filters = state.strays;
        let mut removed = 0;
        match self.mechanism {
            Mechanism::Filter => {
                // The pin goes only once weir's filter runs here (a kept tcx link stays).
                if has_filter && self.has_pin(ifname, program) {
                    self.unpin(ifname, program)?;
                    removed += 1;
                }
            }
            Mechanism::Tcx => filters.extend(state.slot.filter(|f| f.name == program)),
        }
        for f in filters {
            self.tc
                .delete_filter(ifindex, hook, f.priority, f.handle)
                .map_err(|e| kerr("sweep", format!("filter {} on {ifname}", f.name), e))?;
            removed += 1;
        }
        tracing::debug!(ifname, program, removed, "swept leftover attachments");
        Ok(removed)
    }

    fn unpin(&mut self, ifname: &str, program: &str) -> Result<(), KernelError> {
        let pin = self.paths.link_pin(ifname, program);
        super::batch::detach_link_pin(&pin).map_err(|e| kerr("unpin", pin.display().to_string(), e))
    }
}
