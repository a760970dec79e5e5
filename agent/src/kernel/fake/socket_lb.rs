//! The fake kernel's socket LB side ([`SocketLbIo`] for [`FakeKernel`]): cgroup directories (cgroup v2 or
//! not), the network namespace's cookie, the scope written, the link pins by program with their cgroup,
//! every attach in order, and programs whose attach fails.

use std::{
    collections::{BTreeMap, BTreeSet},
    io,
    path::{Path, PathBuf},
};

use crate::kernel::{KernelError, SocketLbIo, fake::FakeKernel};

/// The socket LB side of one fake kernel.
#[derive(Default)]
pub(crate) struct SocketLbTable {
    /// Directories that exist: path → on a cgroup v2 filesystem.
    pub(crate) cgroups: BTreeMap<PathBuf, bool>,
    /// This namespace's cookie (`None`: the kernel cannot tell it).
    pub(crate) netns_cookie: Option<u64>,
    /// What `sock_cfg_v1` holds (`None`: never written).
    pub(crate) scope: Option<u64>,
    /// Link pins: program → the cgroup its link runs on.
    pub(crate) links: BTreeMap<String, PathBuf>,
    /// Every attach that succeeded, in order: (program, cgroup).
    pub(crate) attached: Vec<(String, PathBuf)>,
    /// Programs whose attach fails.
    pub(crate) failing: BTreeSet<String>,
}

impl SocketLbIo for FakeKernel {
    fn is_cgroup2(&mut self, cgroup: &Path) -> io::Result<bool> {
        self.socket_lb()
            .cgroups
            .get(cgroup)
            .copied()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }

    fn netns_cookie(&mut self) -> io::Result<u64> {
        self.socket_lb()
            .netns_cookie
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOPROTOOPT))
    }

    fn write_scope(&mut self, netns_cookie: u64) -> Result<(), KernelError> {
        self.socket_lb().scope = Some(netns_cookie);
        Ok(())
    }

    fn attach(&mut self, cgroup: &Path, program: &'static str) -> Result<(), KernelError> {
        let mut t = self.socket_lb();
        if t.failing.contains(program) || !t.cgroups.contains_key(cgroup) {
            return Err(KernelError::Attach {
                op: "attach",
                what: format!("{program} to {}", cgroup.display()),
                source: Box::new(io::Error::from_raw_os_error(libc::EPERM)),
            });
        }
        t.links.insert(program.to_owned(), cgroup.to_owned());
        t.attached.push((program.to_owned(), cgroup.to_owned()));
        Ok(())
    }

    fn detach(&mut self, program: &str) -> Result<bool, KernelError> {
        Ok(self.socket_lb().links.remove(program).is_some())
    }
}
