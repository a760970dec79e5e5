//! The endpoint programs on a workload veth, as weir-cni attaches, checks and detaches them, and
//! as the agent reads them back: whichever [`Mechanism`] put a program on a hook, the program id
//! is found (tcx query, or weir's filter slot), so neither side needs memory of a previous run.

use std::{
    ffi::CString,
    os::fd::{AsFd as _, AsRawFd as _},
    path::{Path, PathBuf},
};

use aya::programs::{
    LinkOrder, ProgramError, SchedClassifier, TcAttachType,
    links::{FdLink, PinnedLink},
    tc::TcAttach,
};
use maps_schema::programs::{FROM_ENDPOINT, TO_ENDPOINT};

use crate::{
    Mechanism,
    filter::{BpfFilter, FilterError, Tc},
    tcx::tcx_programs,
};

/// The endpoint programs and their hooks.
pub const ENDPOINT_PROGRAMS: [(&str, TcAttachType); 2] = [
    (FROM_ENDPOINT, TcAttachType::Ingress),
    (TO_ENDPOINT, TcAttachType::Egress),
];

/// Errors attaching or checking the endpoint programs.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// The agent has not pinned the program (not running, or another pin root).
    #[error(
        "the agent's program {program} is not pinned at {pin}: {source}; start the weir agent, or set bpfRoot in the conflist to the agent's --bpf-root"
    )]
    MissingProgram {
        /// The program.
        program: &'static str,
        /// Where it should be.
        pin: PathBuf,
        /// The cause.
        #[source]
        source: ProgramError,
    },
    /// Attaching failed.
    #[error("cannot attach {program} to {ifname}: {source}")]
    Attach {
        /// The program.
        program: &'static str,
        /// The interface.
        ifname: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Reading the interface's filters back failed.
    #[error("cannot read the tc filters of interface {ifindex}: {source}")]
    Read {
        /// The interface.
        ifindex: u32,
        /// The cause.
        #[source]
        source: FilterError,
    },
    /// Removing a link pin failed.
    #[error("cannot remove the link pin {pin}: {source}")]
    Unpin {
        /// The pin.
        pin: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The interface name cannot be passed to the kernel.
    #[error("interface name {0:?} is not valid (1 to 15 bytes, no NUL)")]
    BadName(String),
    /// The interface does not exist in this network namespace.
    #[error("interface {ifname} does not exist in this network namespace: {source}")]
    NoInterface {
        /// The interface.
        ifname: String,
        /// The cause.
        #[source]
        source: nix::Error,
    },
}

/// The pin of program `program` under `bpf_root`.
#[must_use]
pub fn program_pin(bpf_root: &Path, program: &str) -> PathBuf {
    bpf_root.join(maps_schema::pins::PROGS_DIR).join(program)
}

/// The pin of the tcx link attaching `program` to `ifname` (the agent's `Paths::link_pin`).
#[must_use]
pub fn link_pin(bpf_root: &Path, ifname: &str, program: &str) -> PathBuf {
    bpf_root
        .join(maps_schema::pins::LINKS_DIR)
        .join(maps_schema::pins::link_pin_name(ifname, program))
}

/// What runs on one hook of an interface.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HookState {
    /// Programs on tcx links at this hook.
    pub tcx: Vec<u32>,
    /// weir's filter slot, when a `bpf` filter sits there.
    pub slot: Option<BpfFilter>,
    /// Other `bpf` filters named after `program` (left by something else; weir sweeps them).
    pub strays: Vec<BpfFilter>,
}

impl HookState {
    /// The program in weir's filter slot, when it carries `program`'s name.
    #[must_use]
    pub fn filter_program(&self) -> Option<u32> {
        self.slot.as_ref().map(|f| f.program_id)
    }

    /// True when program `id` runs at this hook by either mechanism.
    #[must_use]
    pub fn runs(&self, id: u32) -> bool {
        self.tcx.contains(&id) || self.filter_program() == Some(id)
    }
}

/// Reads back hook `hook` of `ifindex` for `program`: tcx programs, weir's filter slot, and
/// stray filters named after the program.
pub fn hook_state(
    tc: &mut Tc,
    ifindex: u32,
    hook: TcAttachType,
    program: &str,
) -> Result<HookState, FilterError> {
    let mut state = HookState {
        tcx: tcx_programs(ifindex, hook),
        ..HookState::default()
    };
    for f in tc.bpf_filters(ifindex, hook)? {
        if f.is_weir_slot() {
            state.slot = Some(f);
        } else if f.name == program {
            state.strays.push(f);
        }
    }
    Ok(state)
}

fn ifindex_of(ifname: &str) -> Result<(CString, u32), EndpointError> {
    if ifname.is_empty() || ifname.len() > 15 {
        return Err(EndpointError::BadName(ifname.to_owned()));
    }
    let name = CString::new(ifname).map_err(|_| EndpointError::BadName(ifname.to_owned()))?;
    let ifindex = nix::net::if_::if_nametoindex(name.as_c_str()).map_err(|source| {
        EndpointError::NoInterface {
            ifname: ifname.to_owned(),
            source,
        }
    })?;
    Ok((name, ifindex))
}

fn pinned_program(
    bpf_root: &Path,
    program: &'static str,
) -> Result<SchedClassifier, EndpointError> {
    let pin = program_pin(bpf_root, program);
    SchedClassifier::from_pin(&pin).map_err(|source| EndpointError::MissingProgram {
        program,
        pin,
        source,
    })
}

/// Attaches both endpoint programs the agent pinned under `bpf_root` to `ifname` (a fresh,
/// still-down host veth) with `mechanism`.
pub fn attach_endpoint_programs(
    bpf_root: &Path,
    ifname: &str,
    mechanism: Mechanism,
) -> Result<(), EndpointError> {
    let (name, ifindex) = ifindex_of(ifname)?;
    match mechanism {
        Mechanism::Filter => attach_filters(bpf_root, ifname, ifindex),
        Mechanism::Tcx => {
            for (program, hook) in ENDPOINT_PROGRAMS {
                attach_tcx(bpf_root, ifname, &name, ifindex, program, hook)?;
            }
            Ok(())
        }
    }
}

fn attach_filters(bpf_root: &Path, ifname: &str, ifindex: u32) -> Result<(), EndpointError> {
    let attach_err = |program, e: FilterError| EndpointError::Attach {
        program,
        ifname: ifname.to_owned(),
        source: Box::new(e),
    };
    // Both programs first: a missing pin touches nothing.
    let programs = ENDPOINT_PROGRAMS
        .map(|(program, hook)| pinned_program(bpf_root, program).map(|prog| (program, hook, prog)));
    let programs: Vec<_> = programs.into_iter().collect::<Result<_, _>>()?;
    let mut tc = Tc::open().map_err(|e| attach_err(FROM_ENDPOINT, e))?;
    tc.add_clsact(ifindex)
        .map_err(|e| attach_err(FROM_ENDPOINT, e))?;
    for (program, hook, prog) in &programs {
        let fd = prog
            .fd()
            .map_err(|e| EndpointError::Attach {
                program,
                ifname: ifname.to_owned(),
                source: Box::new(e),
            })?
            .as_fd()
            .as_raw_fd();
        // Create, or replace in place what the agent put there meanwhile (same programs).
        tc.set_filter(ifindex, *hook, fd, program)
            .map_err(|e| attach_err(program, e))?;
        // A pin left by an earlier veth of this name holds a dead link: drop it.
        remove_pin(&link_pin(bpf_root, ifname, program))?;
        tracing::debug!(ifname, program, "filter attached");
    }
    Ok(())
}

fn attach_tcx(
    bpf_root: &Path,
    ifname: &str,
    name: &CString,
    ifindex: u32,
    program: &'static str,
    hook: TcAttachType,
) -> Result<(), EndpointError> {
    let mut prog = pinned_program(bpf_root, program)?;
    let attach_err = |source: Box<dyn std::error::Error + Send + Sync>| EndpointError::Attach {
        program,
        ifname: ifname.to_owned(),
        source,
    };
    let link_path = link_pin(bpf_root, ifname, program);
    // The agent watches `weir*` links and may have attached this program already: keep its
    // link. A pin left by an earlier veth of the same name points elsewhere: replace it.
    if pinned_and_attached(&link_path, ifindex, hook) {
        tracing::debug!(ifname, program, "already attached by the agent");
        return Ok(());
    }
    remove_pin(&link_path)?;
    let tcx = TcAttach::Tcx {
        attach_type: hook,
        order: LinkOrder::default(),
    };
    let id = prog
        .attach(name.as_c_str(), tcx)
        .map_err(|e| attach_err(Box::new(e)))?;
    let link = prog.take_link(id).map_err(|e| attach_err(Box::new(e)))?;
    let fd_link = FdLink::try_from(link).map_err(|e| attach_err(Box::new(e)))?;
    if let Err(e) = fd_link.pin(&link_path) {
        // The agent pinned its own link in between: ours is dropped (detached) and its link
        // stays.
        if !pinned_and_attached(&link_path, ifindex, hook) {
            return Err(attach_err(Box::new(e)));
        }
    }
    tracing::debug!(ifname, program, "tcx link attached");
    Ok(())
}

/// Removes both link pins of `ifname` (detaching tcx programs if the veth still exists). Filters
/// need nothing: they go with the veth.
pub fn detach_endpoint_programs(bpf_root: &Path, ifname: &str) -> Result<(), EndpointError> {
    for (program, _) in ENDPOINT_PROGRAMS {
        remove_pin(&link_pin(bpf_root, ifname, program))?;
    }
    Ok(())
}

/// True when the link pinned at `pin` runs its program on `ifindex` at `hook`.
fn pinned_and_attached(pin: &Path, ifindex: u32, hook: TcAttachType) -> bool {
    let Ok(pinned) = PinnedLink::from_pin(pin) else {
        return false;
    };
    let Ok(info) = FdLink::from(pinned).info() else {
        return false;
    };
    tcx_programs(ifindex, hook).contains(&info.program_id())
}

fn remove_pin(pin: &Path) -> Result<(), EndpointError> {
    match std::fs::remove_file(pin) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(EndpointError::Unpin {
            pin: pin.to_owned(),
            source,
        }),
    }
}

/// The programs missing from `ifindex`: each endpoint program must run at its hook as the
/// program the agent pinned (compared by id), through a tcx link or weir's filter.
pub fn missing_programs(bpf_root: &Path, ifindex: u32) -> Result<Vec<&'static str>, EndpointError> {
    let mut tc = Tc::open().map_err(|source| EndpointError::Read { ifindex, source })?;
    let mut missing = Vec::new();
    for (program, hook) in ENDPOINT_PROGRAMS {
        let pinned = pinned_program(bpf_root, program)?
            .info()
            .map_err(|source| EndpointError::MissingProgram {
                program,
                pin: program_pin(bpf_root, program),
                source,
            })?;
        let state = hook_state(&mut tc, ifindex, hook, program)
            .map_err(|source| EndpointError::Read { ifindex, source })?;
        if !state.runs(pinned.id()) {
            missing.push(program);
        }
    }
    Ok(missing)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_follow_the_agent_layout() {
        let root = Path::new("/sys/fs/bpf/wt-x");
        assert_eq!(
            program_pin(root, FROM_ENDPOINT),
            Path::new("/sys/fs/bpf/wt-x/progs/from_endpoint")
        );
        assert_eq!(
            link_pin(root, "weir0123456789a", TO_ENDPOINT),
            Path::new("/sys/fs/bpf/wt-x/links/weir0123456789a:to_endpoint")
        );
    }

    #[test]
    fn a_missing_program_says_what_to_fix() {
        let dir = tempfile::tempdir().expect("tempdir");
        for mechanism in [Mechanism::Filter, Mechanism::Tcx] {
            let err = attach_endpoint_programs(dir.path(), "lo", mechanism).expect_err("no pins");
            assert!(err.to_string().contains("bpfRoot"), "{err}");
        }
    }

    #[test]
    fn mechanisms_parse_from_their_names() {
        for m in [Mechanism::Filter, Mechanism::Tcx] {
            assert_eq!(m.as_str().parse::<Mechanism>(), Ok(m));
        }
        assert!("clsact".parse::<Mechanism>().is_err());
    }
}
