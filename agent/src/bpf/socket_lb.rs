//! Socket LB (`--socket-lb-cgroup`, `maps_schema::socket_lb`): the `SOCKET_LB` programs attached
//! to one cgroup v2 directory by bpf links pinned as `links/<program>`, so they stay attached
//! while the agent restarts. Each start attaches the pinned programs anew and renames the new
//! link's pin over the old one, which detaches the old link: for that moment both run, which is
//! harmless (the second sees a backend, no frontend, and leaves the call alone). Without the flag
//! the pins are removed, detaching them. A connect the programs do not see (before the first
//! attach, or from outside the cgroup) is translated per packet by `from_endpoint` as before.

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use aya::programs::{
    CgroupAttachMode, CgroupSockAddr, ProgramError, cgroup_sock_addr::CgroupSockAddrAttachType,
    links::FdLink,
};
use maps_schema::programs::{
    SOCK_CONNECT4, SOCK_CONNECT6, SOCK_GETPEER4, SOCK_GETPEER6, SOCK_RECVMSG4, SOCK_RECVMSG6,
    SOCK_SENDMSG4, SOCK_SENDMSG6, SOCKET_LB,
};
use serde::Serialize;

use crate::paths::Paths;

/// Errors attaching or detaching socket LB.
#[derive(Debug, thiserror::Error)]
pub enum SocketLbError {
    /// The cgroup directory cannot be opened or examined.
    #[error(
        "cannot open the cgroup {path} (--socket-lb-cgroup): {source}; give an existing cgroup v2 directory, or leave the flag out to turn socket LB off"
    )]
    Cgroup {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The directory is not on a cgroup v2 filesystem.
    #[error(
        "{path} (--socket-lb-cgroup) is not a cgroup v2 directory: give where cgroup2 is mounted (`mount -t cgroup2`; on hybrid hosts often /sys/fs/cgroup/unified) or a directory below it"
    )]
    NotCgroup2 {
        /// The directory.
        path: PathBuf,
    },
    /// A pinned program cannot be opened or attached.
    #[error(
        "cannot {op} the socket LB program {program} ({what}): {source}; restart the agent, or run it without --socket-lb-cgroup"
    )]
    Program {
        /// "open" or "attach".
        op: &'static str,
        /// The program.
        program: &'static str,
        /// Its pin, or the cgroup.
        what: String,
        /// The cause.
        #[source]
        source: Box<ProgramError>,
    },
    /// A link pin cannot be written or removed.
    #[error(
        "cannot {op} the link pin {path}: {source}; check that the pin root is on bpffs and writable"
    )]
    Pin {
        /// "write" or "remove".
        op: &'static str,
        /// The pin.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// What [`reconcile`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SocketLbReport {
    /// The cgroup the programs are attached to (None: socket LB off).
    pub cgroup: Option<PathBuf>,
    /// Link pins removed (socket LB turned off).
    pub removed: Vec<String>,
}

/// Each socket LB program with its hook (the same programs as `SOCKET_LB`, checked by a test).
const HOOKS: [(&str, CgroupSockAddrAttachType); 8] = [
    (SOCK_CONNECT4, CgroupSockAddrAttachType::Connect4),
    (SOCK_GETPEER4, CgroupSockAddrAttachType::GetPeerName4),
    (SOCK_CONNECT6, CgroupSockAddrAttachType::Connect6),
    (SOCK_GETPEER6, CgroupSockAddrAttachType::GetPeerName6),
    (SOCK_SENDMSG4, CgroupSockAddrAttachType::UDPSendMsg4),
    (SOCK_RECVMSG4, CgroupSockAddrAttachType::UDPRecvMsg4),
    (SOCK_SENDMSG6, CgroupSockAddrAttachType::UDPSendMsg6),
    (SOCK_RECVMSG6, CgroupSockAddrAttachType::UDPRecvMsg6),
];

/// Removes a link pin (detaching its link unless something else holds it); false when there was
/// none.
fn remove_pin(pin: &Path) -> Result<bool, SocketLbError> {
    match fs::remove_file(pin) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(SocketLbError::Pin {
            op: "remove",
            path: pin.to_owned(),
            source,
        }),
    }
}

/// Attaches the pinned socket LB programs to `cgroup` (replacing the links pinned before), or
/// with `None` detaches them.
pub fn reconcile(paths: &Paths, cgroup: Option<&Path>) -> Result<SocketLbReport, SocketLbError> {
    let Some(cgroup) = cgroup else {
        let mut report = SocketLbReport::default();
        for program in SOCKET_LB {
            if remove_pin(&paths.links_dir().join(program))? {
                report.removed.push((*program).to_owned());
            }
        }
        if !report.removed.is_empty() {
            tracing::info!(links = ?report.removed, "socket LB off: detached");
        }
        return Ok(report);
    };
    let cgroup_err = |source| SocketLbError::Cgroup {
        path: cgroup.to_owned(),
        source,
    };
    let fs_type = nix::sys::statfs::statfs(cgroup)
        .map_err(|e| cgroup_err(io::Error::from(e)))?
        .filesystem_type();
    if fs_type != nix::sys::statfs::CGROUP2_SUPER_MAGIC {
        return Err(SocketLbError::NotCgroup2 {
            path: cgroup.to_owned(),
        });
    }
    let dir = fs::File::open(cgroup).map_err(cgroup_err)?;
    for (program, hook) in HOOKS {
        let prog_pin = paths.prog_pin(program);
        let program_err = |op, what: String| {
            move |source: ProgramError| SocketLbError::Program {
                op,
                program,
                what,
                source: Box::new(source),
            }
        };
        let attach_err = || program_err("attach", format!("to {}", cgroup.display()));
        let mut prog = CgroupSockAddr::from_pin(&prog_pin, hook)
            .map_err(program_err("open", prog_pin.display().to_string()))?;
        // A bpf link takes no attach flags (the kernel refuses any) and always coexists with the
        // cgroup's other programs, as `BPF_F_ALLOW_MULTI` would; `Single` is the mode that passes none.
        let id = prog
            .attach(&dir, CgroupAttachMode::Single)
            .map_err(attach_err())?;
        let link = prog.take_link(id).map_err(attach_err())?;
        let link = FdLink::try_from(link).map_err(|e| attach_err()(ProgramError::from(e)))?;
        let pin = paths.links_dir().join(program);
        crate::bpf::bpffs::pin_by_rename(&pin, |staging| {
            link.pin(staging).map(drop).map_err(io::Error::other)
        })
        .map_err(|source| SocketLbError::Pin {
            op: "write",
            path: pin.clone(),
            source,
        })?;
    }
    tracing::info!(cgroup = %cgroup.display(), programs = ?SOCKET_LB, "socket LB attached");
    Ok(SocketLbReport {
        cgroup: Some(cgroup.to_owned()),
        removed: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_socket_lb_program_has_its_hook() {
        let names: Vec<&str> = HOOKS.iter().map(|(name, _)| *name).collect();
        assert_eq!(names, SOCKET_LB);
    }
}
