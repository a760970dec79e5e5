//! Socket LB's kernel side ([`SocketLbIo`]): the `SOCKET_LB` programs attached to a cgroup v2 directory by
//! bpf links pinned as `links/<program>` (a new link's pin is renamed over the old one, which detaches the
//! old link), and the settings map `sock_cfg_v1`. What to attach, and when, is the driver's
//! (`dataplane::socket_lb`).

use std::{fs, io, path::Path};

use aya::maps::{Array, Map, MapData};
use aya::programs::{
    CgroupAttachMode, CgroupSockAddr, ProgramError, cgroup_sock_addr::CgroupSockAddrAttachType,
    links::FdLink,
};
use maps_schema::programs::{
    SOCK_CONNECT4, SOCK_CONNECT6, SOCK_GETPEER4, SOCK_GETPEER6, SOCK_RECVMSG4, SOCK_RECVMSG6,
    SOCK_SENDMSG4, SOCK_SENDMSG6,
};
use maps_schema::socket_lb::{SOCK_CFG, SockLbConfig};

use crate::{
    kernel::{KernelError, SocketLbIo},
    paths::Paths,
};

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

/// Socket LB's links and settings under the pin root `paths` names.
pub struct PinnedSocketLb {
    paths: Paths,
}

impl PinnedSocketLb {
    /// Socket LB under the pin root of `paths`.
    #[must_use]
    pub fn new(paths: &Paths) -> Self {
        Self {
            paths: paths.clone(),
        }
    }
}

impl SocketLbIo for PinnedSocketLb {
    fn is_cgroup2(&mut self, cgroup: &Path) -> io::Result<bool> {
        let fs_type = nix::sys::statfs::statfs(cgroup)
            .map_err(io::Error::from)?
            .filesystem_type();
        Ok(fs_type == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
    }

    /// `SO_NETNS_COOKIE` of a socket made in the calling thread's namespace.
    fn netns_cookie(&mut self) -> io::Result<u64> {
        use std::os::fd::AsRawFd as _;
        let socket = nix::sys::socket::socket(
            nix::sys::socket::AddressFamily::Inet,
            nix::sys::socket::SockType::Datagram,
            nix::sys::socket::SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(io::Error::from)?;
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
            return Err(io::Error::last_os_error());
        }
        Ok(cookie)
    }

    fn write_scope(&mut self, netns_cookie: u64) -> Result<(), KernelError> {
        let pin = self.paths.map_pin(SOCK_CFG);
        let open_err = |source| KernelError::OpenMap {
            path: pin.display().to_string(),
            source: Box::new(source),
        };
        let data = MapData::from_pin(&pin).map_err(open_err)?;
        let mut array: Array<MapData, SockLbConfig> =
            Array::try_from(Map::Array(data)).map_err(open_err)?;
        array
            .set(0, &SockLbConfig { netns_cookie }, 0)
            .map_err(|source| KernelError::MapOp {
                map: SOCK_CFG.to_owned(),
                op: "write",
                source: Box::new(source),
            })
    }

    fn attach(&mut self, cgroup: &Path, program: &'static str) -> Result<(), KernelError> {
        let Some((_, hook)) = HOOKS.iter().find(|(name, _)| *name == program) else {
            return Err(KernelError::Io {
                op: "attach",
                what: format!("{program} (not a socket LB program)"),
                source: io::Error::from(io::ErrorKind::InvalidInput),
            });
        };
        let dir = fs::File::open(cgroup).map_err(|source| KernelError::Io {
            op: "open",
            what: format!("the cgroup {}", cgroup.display()),
            source,
        })?;
        let prog_pin = self.paths.prog_pin(program);
        let mut prog = CgroupSockAddr::from_pin(&prog_pin, *hook).map_err(|source| {
            KernelError::OpenProgram {
                path: prog_pin.display().to_string(),
                source: Box::new(source),
            }
        })?;
        let attach_err = |source: ProgramError| KernelError::Attach {
            op: "attach",
            what: format!("{program} to {}", cgroup.display()),
            source: Box::new(source),
        };
        // A bpf link takes no attach flags (the kernel refuses any) and always coexists with the
        // cgroup's other programs, as `BPF_F_ALLOW_MULTI` would; `Single` is the mode that passes none.
        let id = prog
            .attach(&dir, CgroupAttachMode::Single)
            .map_err(attach_err)?;
        let link = prog.take_link(id).map_err(attach_err)?;
        let link = FdLink::try_from(link).map_err(|e| attach_err(ProgramError::from(e)))?;
        let pin = self.paths.links_dir().join(program);
        crate::kernel::real::bpffs::pin_by_rename(&pin, |staging| {
            link.pin(staging).map(drop).map_err(io::Error::other)
        })
        .map_err(|source| KernelError::Io {
            op: "write the link pin",
            what: pin.display().to_string(),
            source,
        })
    }

    fn detach(&mut self, program: &str) -> Result<bool, KernelError> {
        let pin = self.paths.links_dir().join(program);
        match fs::remove_file(&pin) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(source) => Err(KernelError::Io {
                op: "remove the link pin",
                what: pin.display().to_string(),
                source,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_socket_lb_program_has_its_hook() {
        let names: Vec<&str> = HOOKS.iter().map(|(name, _)| *name).collect();
        assert_eq!(names, maps_schema::programs::SOCKET_LB);
    }
}
