//! Attaching the agent's pinned `from_endpoint` (tc ingress) and `to_endpoint` (tc egress)
//! programs to a host veth through pinned tcx links (`<bpf root>/links/<ifname>:<program>`, the
//! agent's layout), so the attachment outlives weir-cni and the agent can replace the program
//! atomically. Kernels without tcx get a clsact filter, which the kernel keeps after we exit.

use std::{
    ffi::CString,
    path::{Path, PathBuf},
};

use aya::programs::{
    LinkOrder, ProgramError, SchedClassifier, TcAttachType,
    links::{FdLink, PinnedLink},
    tc::{NlOptions, TcAttach, TcHandle},
};
use maps_schema::programs::{FROM_ENDPOINT, TO_ENDPOINT};

use crate::error::{CniCode, Code};

/// The endpoint programs and their hooks.
pub const ENDPOINT_PROGRAMS: [(&str, TcAttachType); 2] = [
    (FROM_ENDPOINT, TcAttachType::Ingress),
    (TO_ENDPOINT, TcAttachType::Egress),
];

/// Errors attaching or checking the programs.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
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
    #[error("interface name {0:?} contains a NUL byte")]
    BadName(String),
}

impl CniCode for AttachError {
    fn code(&self) -> Code {
        Code::Attach
    }
}

/// The pin of program `program` under `bpf_root`.
#[must_use]
pub fn program_pin(bpf_root: &Path, program: &str) -> PathBuf {
    bpf_root.join(maps_schema::pins::PROGS_DIR).join(program)
}

/// The pin of the link attaching `program` to `ifname` (the agent's `Paths::link_pin`).
#[must_use]
pub fn link_pin(bpf_root: &Path, ifname: &str, program: &str) -> PathBuf {
    bpf_root
        .join(maps_schema::pins::LINKS_DIR)
        .join(maps_schema::pins::link_pin_name(ifname, program))
}

/// Attaches both endpoint programs to `ifname` (a fresh, still-down host veth).
pub fn attach_endpoint_programs(bpf_root: &Path, ifname: &str) -> Result<(), AttachError> {
    let name = CString::new(ifname).map_err(|_| AttachError::BadName(ifname.to_owned()))?;
    for (program, hook) in ENDPOINT_PROGRAMS {
        let pin = program_pin(bpf_root, program);
        let mut prog =
            SchedClassifier::from_pin(&pin).map_err(|source| AttachError::MissingProgram {
                program,
                pin: pin.clone(),
                source,
            })?;
        let attach_err = |source: Box<dyn std::error::Error + Send + Sync>| AttachError::Attach {
            program,
            ifname: ifname.to_owned(),
            source,
        };
        let link_path = link_pin(bpf_root, ifname, program);
        // The agent watches `weir*` links and may have attached this program already: keep its
        // link. A pin left by an earlier veth of the same name points elsewhere: replace it.
        if pinned_and_attached(&link_path, ifname, hook) {
            tracing::debug!(ifname, program, "already attached by the agent");
            continue;
        }
        remove_pin(&link_path)?;
        let tcx = TcAttach::Tcx {
            attach_type: hook,
            order: LinkOrder::default(),
        };
        match prog.attach(name.as_c_str(), tcx) {
            Ok(id) => {
                let link = prog.take_link(id).map_err(|e| attach_err(Box::new(e)))?;
                let fd_link = FdLink::try_from(link).map_err(|e| attach_err(Box::new(e)))?;
                if let Err(e) = fd_link.pin(&link_path) {
                    // The agent pinned its own link in between: ours is dropped (detached) and
                    // its link stays.
                    if !pinned_and_attached(&link_path, ifname, hook) {
                        return Err(attach_err(Box::new(e)));
                    }
                }
            }
            Err(tcx_error) => {
                tracing::debug!(ifname, error = %tcx_error, "tcx attach failed, using clsact");
                if let Err(e) = aya::programs::tc::qdisc_add_clsact(name.as_c_str()) {
                    tracing::debug!(ifname, error = %e, "adding clsact (it may exist)");
                }
                let netlink = TcAttach::Netlink {
                    parent: TcHandle::from(hook),
                    options: NlOptions::default(),
                };
                let id = prog
                    .attach(name.as_c_str(), netlink)
                    .map_err(|e| attach_err(Box::new(e)))?;
                // Dropping the link would delete the filter; the veth's removal deletes it.
                std::mem::forget(prog.take_link(id).map_err(|e| attach_err(Box::new(e)))?);
            }
        }
        tracing::debug!(ifname, program, "attached");
    }
    Ok(())
}

/// Removes both link pins of `ifname` (detaching the programs if the veth still exists).
pub fn detach_endpoint_programs(bpf_root: &Path, ifname: &str) -> Result<(), AttachError> {
    for (program, _) in ENDPOINT_PROGRAMS {
        remove_pin(&link_pin(bpf_root, ifname, program))?;
    }
    Ok(())
}

/// True when the link pinned at `pin` runs its program on `ifname` at `hook`.
fn pinned_and_attached(pin: &Path, ifname: &str, hook: TcAttachType) -> bool {
    let Ok(pinned) = PinnedLink::from_pin(pin) else {
        return false;
    };
    let Ok(info) = FdLink::from(pinned).info() else {
        return false;
    };
    let Ok(ifindex) = nix::net::if_::if_nametoindex(ifname) else {
        return false;
    };
    SchedClassifier::query_tcx(ifindex, hook)
        .is_ok_and(|(_, progs)| progs.iter().any(|p| p.id() == info.program_id()))
}

fn remove_pin(pin: &Path) -> Result<(), AttachError> {
    match std::fs::remove_file(pin) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(AttachError::Unpin {
            pin: pin.to_owned(),
            source,
        }),
    }
}

/// The programs missing from `ifindex`: each endpoint program must run at its hook, as the
/// program the agent pinned (compared by id). Kernels without tcx are not checked.
pub fn missing_programs(bpf_root: &Path, ifindex: u32) -> Result<Vec<&'static str>, AttachError> {
    let mut missing = Vec::new();
    for (program, hook) in ENDPOINT_PROGRAMS {
        let pin = program_pin(bpf_root, program);
        let pinned = SchedClassifier::from_pin(&pin)
            .and_then(|p| p.info())
            .map_err(|source| AttachError::MissingProgram {
                program,
                pin: pin.clone(),
                source,
            })?;
        match SchedClassifier::query_tcx(ifindex, hook) {
            Ok((_, attached)) => {
                if !attached.iter().any(|p| p.id() == pinned.id()) {
                    missing.push(program);
                }
            }
            Err(e) => {
                tracing::debug!(ifindex, error = %e, "cannot query tcx; not checking {program}");
            }
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
        let err = attach_endpoint_programs(dir.path(), "lo").expect_err("no pins");
        assert_eq!(err.code(), Code::Attach);
        assert!(err.to_string().contains("bpfRoot"), "{err}");
    }
}
