//! What `weir uninstall` reads and removes ([`UninstallIo`]): this network namespace's interfaces
//! (`if_nameindex`), their `bpf` filters (tc over netlink, `attach::filter::Tc`), and files, pins and
//! directories. Which of them are weir's is the uninstall's decision (`setup::uninstall`).

use std::{io, path::Path};

use attach::filter::{BpfFilter, FilterError, Tc};
use aya::programs::TcAttachType;

use crate::kernel::{KernelError, UninstallIo};

/// The host's side of `weir uninstall`; the netlink socket is opened on first use.
#[derive(Debug, Default)]
pub struct HostUninstall {
    tc: Option<Tc>,
}

impl HostUninstall {
    /// An uninstall in the calling thread's network namespace.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn tc(&mut self) -> Result<&mut Tc, KernelError> {
        let tc = match self.tc.take() {
            Some(tc) => tc,
            None => Tc::open().map_err(|e| filter_err("open", "a netlink socket", e))?,
        };
        Ok(self.tc.insert(tc))
    }
}

fn filter_err(op: &'static str, what: impl Into<String>, source: FilterError) -> KernelError {
    KernelError::Attach {
        op,
        what: what.into(),
        source: Box::new(source),
    }
}

impl UninstallIo for HostUninstall {
    fn agent_running(&self, socket: &Path) -> bool {
        std::os::unix::net::UnixStream::connect(socket).is_ok()
    }

    fn interfaces(&mut self) -> Result<Vec<(u32, String)>, KernelError> {
        let list = nix::net::if_::if_nameindex().map_err(|e| KernelError::Io {
            op: "list",
            what: "the network interfaces".into(),
            source: io::Error::from(e),
        })?;
        Ok(list
            .iter()
            .map(|i| (i.index(), i.name().to_string_lossy().into_owned()))
            .collect())
    }

    fn filters(
        &mut self,
        ifindex: u32,
        hook: TcAttachType,
    ) -> Result<Option<Vec<BpfFilter>>, KernelError> {
        match self.tc()?.bpf_filters(ifindex, hook) {
            Ok(filters) => Ok(Some(filters)),
            // The interface went away since the listing: nothing left to detach.
            Err(e) if e.errno() == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(filter_err(
                "list the filters of",
                format!("interface {ifindex}"),
                e,
            )),
        }
    }

    fn delete_filter(
        &mut self,
        ifindex: u32,
        hook: TcAttachType,
        filter: &BpfFilter,
    ) -> Result<(), KernelError> {
        self.tc()?
            .delete_filter(ifindex, hook, filter.priority, filter.handle)
            .map_err(|e| {
                filter_err(
                    "delete",
                    format!("the filter {} on interface {ifindex}", filter.name),
                    e,
                )
            })
    }

    fn list(&mut self, dir: &Path) -> io::Result<Option<Vec<String>>> {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut names = Vec::new();
        for entry in entries {
            names.push(entry?.file_name().to_string_lossy().into_owned());
        }
        Ok(Some(names))
    }

    fn remove_file(&mut self, path: &Path) -> io::Result<bool> {
        match std::fs::remove_file(path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn remove_tree(&mut self, dir: &Path) -> io::Result<bool> {
        match std::fs::remove_dir_all(dir) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }
}
