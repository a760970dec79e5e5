//! Attaches programs to interfaces through pinned links, so attachments survive the process and a
//! later load replaces the program atomically (`bpf_link_update`) instead of detaching it.
//!
//! tc: tcx links (kernel ≥ 6.6), pinned at `<root>/links/<ifname>:<program>`; on older kernels
//! aya falls back to a clsact filter, which lives on the qdisc and survives the process as well.
//! XDP: a pinned XDP link.

use std::{
    io,
    path::{Path, PathBuf},
};

use aya::programs::{
    ProgramError, SchedClassifier, TcAttachType, Xdp,
    links::{FdLink, LinkError, LinkOrder, PinnedLink},
    tc::{NlOptions, SchedClassifierLink, TcAttach, TcHandle},
    xdp::{XdpLink, XdpMode},
};

/// How a program ended up attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttachMode {
    /// A new pinned bpf link.
    NewLink,
    /// An existing pinned link now runs the given program (atomic replacement).
    Replaced,
    /// A legacy clsact filter (kernels without tcx).
    Clsact,
    /// The pinned link already runs this program: nothing written.
    Unchanged,
}

/// The program id a pinned link runs, if the pin opens.
#[must_use]
pub fn pinned_link_program(link_pin: &Path) -> Option<u32> {
    let link = FdLink::from(PinnedLink::from_pin(link_pin).ok()?);
    link.info().ok().map(|info| info.program_id())
}

/// The ids of the programs on the tcx hook `hook` of `ifindex` (empty when the query fails: no
/// such interface, or no tcx on this kernel).
#[must_use]
pub fn tcx_programs(ifindex: u32, hook: TcAttachType) -> Vec<u32> {
    SchedClassifier::query_tcx(ifindex, hook)
        .map(|(_, progs)| progs.iter().map(aya::programs::ProgramInfo::id).collect())
        .unwrap_or_default()
}

/// Errors attaching a program.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// The interface name is not usable.
    #[error("interface name {ifname:?} is not valid: {reason}")]
    BadInterface {
        /// The name.
        ifname: String,
        /// Why.
        reason: &'static str,
    },
    /// Attaching failed.
    #[error(
        "cannot attach {program} to {ifname}: {source}; check that the interface exists in this network namespace"
    )]
    Attach {
        /// The program.
        program: String,
        /// The interface.
        ifname: String,
        /// The cause.
        #[source]
        source: Box<ProgramError>,
    },
    /// Reopening or pinning the link failed.
    #[error("cannot use the link pin {path}: {source}")]
    Link {
        /// The pin.
        path: PathBuf,
        /// The cause.
        #[source]
        source: LinkError,
    },
    /// Pinning failed.
    #[error("cannot pin the link at {path}: {source}")]
    Pin {
        /// The pin.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// The link pinned at `link_pin`, as the typed link of its program kind (for `attach_to_link`).
fn open_pinned<L: TryFrom<FdLink, Error = LinkError>>(link_pin: &Path) -> Result<L, AttachError> {
    let err = |source| AttachError::Link {
        path: link_pin.to_owned(),
        source,
    };
    let pinned = PinnedLink::from_pin(link_pin).map_err(err)?;
    L::try_from(FdLink::from(pinned)).map_err(err)
}

fn ifname_cstr(ifname: &str) -> Result<std::ffi::CString, AttachError> {
    if ifname.is_empty() || ifname.len() > 15 {
        return Err(AttachError::BadInterface {
            ifname: ifname.to_owned(),
            reason: "must be 1 to 15 bytes",
        });
    }
    std::ffi::CString::new(ifname).map_err(|_| AttachError::BadInterface {
        ifname: ifname.to_owned(),
        reason: "contains a NUL byte",
    })
}

/// Attaches a loaded tc program to `ifname` at `hook`, reusing the link pinned at `link_pin`
/// when there is one (atomic program replacement) and pinning a new link otherwise.
pub fn attach_tc(
    program: &mut SchedClassifier,
    program_name: &str,
    ifname: &str,
    hook: TcAttachType,
    link_pin: &Path,
) -> Result<AttachMode, AttachError> {
    let attach_err = |source| AttachError::Attach {
        program: program_name.to_owned(),
        ifname: ifname.to_owned(),
        source: Box::new(source),
    };
    if link_pin.exists() {
        let link: SchedClassifierLink = open_pinned(link_pin)?;
        let id = program.attach_to_link(link).map_err(attach_err)?;
        // The pin keeps the link alive; forget our handle so dropping it does not detach.
        std::mem::forget(program.take_link(id).map_err(attach_err)?);
        return Ok(AttachMode::Replaced);
    }
    let name = ifname_cstr(ifname)?;
    let tcx = TcAttach::Tcx {
        attach_type: hook,
        order: LinkOrder::default(),
    };
    match program.attach(name.as_c_str(), tcx) {
        Ok(id) => {
            let link = program.take_link(id).map_err(attach_err)?;
            let fd_link = FdLink::try_from(link).map_err(|source| AttachError::Link {
                path: link_pin.to_owned(),
                source,
            })?;
            fd_link.pin(link_pin).map_err(|e| AttachError::Pin {
                path: link_pin.to_owned(),
                source: io::Error::other(e),
            })?;
            Ok(AttachMode::NewLink)
        }
        Err(tcx_error) => {
            // No tcx (kernel < 6.6): a clsact filter, which the kernel keeps after we exit.
            tracing::debug!(ifname, error = %tcx_error, "tcx attach failed, falling back to clsact");
            if let Err(e) = aya::programs::tc::qdisc_add_clsact(name.as_c_str()) {
                // EEXIST: clsact is already there, which is what we need.
                tracing::debug!(ifname, error = %e, "adding clsact");
            }
            let id = program
                .attach(name.as_c_str(), hook_netlink(hook))
                .map_err(attach_err)?;
            // Dropping the link would delete the filter: keep it attached past this process.
            std::mem::forget(program.take_link(id).map_err(attach_err)?);
            Ok(AttachMode::Clsact)
        }
    }
}

fn hook_netlink(hook: TcAttachType) -> TcAttach {
    TcAttach::Netlink {
        parent: TcHandle::from(hook),
        options: NlOptions::default(),
    }
}

/// Attaches a loaded XDP program to `ifname` through a pinned link (replacing the program of an
/// existing pinned link atomically).
pub fn attach_xdp(
    program: &mut Xdp,
    program_name: &str,
    ifname: &str,
    link_pin: &Path,
) -> Result<AttachMode, AttachError> {
    let attach_err = |source| AttachError::Attach {
        program: program_name.to_owned(),
        ifname: ifname.to_owned(),
        source: Box::new(source),
    };
    if link_pin.exists() {
        let link: XdpLink = open_pinned(link_pin)?;
        let id = program.attach_to_link(link).map_err(attach_err)?;
        std::mem::forget(program.take_link(id).map_err(attach_err)?);
        return Ok(AttachMode::Replaced);
    }
    let name = ifname_cstr(ifname)?;
    let id = program
        .attach(name.as_c_str(), XdpMode::Default)
        .map_err(attach_err)?;
    let link = program.take_link(id).map_err(attach_err)?;
    let fd_link = FdLink::try_from(link).map_err(|source| AttachError::Link {
        path: link_pin.to_owned(),
        source,
    })?;
    fd_link.pin(link_pin).map_err(|e| AttachError::Pin {
        path: link_pin.to_owned(),
        source: io::Error::other(e),
    })?;
    Ok(AttachMode::NewLink)
}
