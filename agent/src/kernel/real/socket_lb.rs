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

use aya::maps::{Array, Map, MapData};
use aya::programs::{
    CgroupAttachMode, CgroupSockAddr, ProgramError, cgroup_sock_addr::CgroupSockAddrAttachType,
    links::FdLink,
};
use maps_schema::programs::{
    SOCK_CONNECT4, SOCK_CONNECT6, SOCK_GETPEER4, SOCK_GETPEER6, SOCK_RECVMSG4, SOCK_RECVMSG6,
    SOCK_SENDMSG4, SOCK_SENDMSG6, SOCKET_LB,
};
use maps_schema::socket_lb::{SOCK_CFG, SockLbConfig};
use serde::Serialize;

use crate::{config::SocketLbScope, paths::Paths};

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
    /// Which sockets to place cannot be told to the programs.
    #[error(transparent)]
    Scope(#[from] ScopeError),
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

/// `sock_cfg_v1` cannot be written, or this node's network namespace cookie read.
#[derive(Debug, thiserror::Error)]
pub enum ScopeError {
    /// The node's network namespace cookie cannot be read.
    #[error(
        "cannot read this node's network namespace cookie (SO_NETNS_COOKIE, kernel 5.14 or later) for --socket-lb-scope host: {0}; use --socket-lb-scope all on this kernel"
    )]
    NetnsCookie(#[source] io::Error),
    /// The settings map cannot be opened or written.
    #[error(
        "cannot {op} socket LB's settings map {path}: {source}; restart the agent, or run it without --socket-lb-cgroup"
    )]
    Map {
        /// "open" or "write".
        op: &'static str,
        /// Its pin.
        path: PathBuf,
        /// The cause.
        #[source]
        source: Box<aya::maps::MapError>,
    },
}

/// What [`reconcile`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SocketLbReport {
    /// The cgroup the programs are attached to (None: socket LB off).
    pub cgroup: Option<PathBuf>,
    /// Which sockets in it are placed (None: socket LB off).
    pub scope: Option<SocketLbScope>,
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

/// The network namespace cookie of the calling thread's namespace (`SO_NETNS_COOKIE` of a
/// socket made there).
fn own_netns_cookie() -> Result<u64, ScopeError> {
    use std::os::fd::AsRawFd as _;
    let socket = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| ScopeError::NetnsCookie(io::Error::from(e)))?;
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: a valid socket descriptor, and a buffer of `len` bytes the call writes at most.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NETNS_COOKIE,
            std::ptr::from_mut(&mut cookie).cast(),
            &raw mut len,
        )
    };
    if rc != 0 {
        return Err(ScopeError::NetnsCookie(io::Error::last_os_error()));
    }
    Ok(cookie)
}

/// Writes which sockets the programs place into `sock_cfg_v1`: every one (`all`), or only the
/// node's own network namespace's (`host`: the agent's, whose cookie it reads).
fn write_scope(paths: &Paths, scope: SocketLbScope) -> Result<(), ScopeError> {
    let netns_cookie = match scope {
        SocketLbScope::All => 0,
        SocketLbScope::Host => own_netns_cookie()?,
    };
    let pin = paths.map_pin(SOCK_CFG);
    let err = |op| {
        let path = pin.clone();
        move |source| ScopeError::Map {
            op,
            path,
            source: Box::new(source),
        }
    };
    let data = MapData::from_pin(&pin).map_err(err("open"))?;
    let mut array: Array<MapData, SockLbConfig> =
        Array::try_from(Map::Array(data)).map_err(err("open"))?;
    array
        .set(0, &SockLbConfig { netns_cookie }, 0)
        .map_err(err("write"))
}

/// Attaches the pinned socket LB programs to `cgroup` (replacing the links pinned before), placing
/// the sockets `scope` names, or with `None` detaches them.
pub fn reconcile(
    paths: &Paths,
    cgroup: Option<&Path>,
    scope: SocketLbScope,
) -> Result<SocketLbReport, SocketLbError> {
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
    // The scope first: a link attached before it would place every socket for a moment.
    write_scope(paths, scope)?;
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
        crate::kernel::real::bpffs::pin_by_rename(&pin, |staging| {
            link.pin(staging).map(drop).map_err(io::Error::other)
        })
        .map_err(|source| SocketLbError::Pin {
            op: "write",
            path: pin.clone(),
            source,
        })?;
    }
    tracing::info!(cgroup = %cgroup.display(), %scope, programs = ?SOCKET_LB, "socket LB attached");
    Ok(SocketLbReport {
        cgroup: Some(cgroup.to_owned()),
        scope: Some(scope),
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
