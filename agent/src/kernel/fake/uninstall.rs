//! The fake kernel's uninstall side ([`UninstallIo`] for [`FakeKernel`]): a node's interfaces with the `bpf`
//! filters at each hook, its files and directories, interfaces that vanish once listed, and whether an
//! agent answers on its socket.

use std::{
    collections::{BTreeMap, BTreeSet},
    io,
    path::{Path, PathBuf},
};

use attach::filter::BpfFilter;
use aya::programs::TcAttachType;

use crate::kernel::{KernelError, UninstallIo, fake::FakeKernel};

/// The uninstall side of one fake kernel.
#[derive(Default)]
pub(crate) struct UninstallTable {
    /// Interfaces: index → name.
    pub(crate) interfaces: BTreeMap<u32, String>,
    /// Interfaces deleted between the listing and the filter read (a pod's veth dying).
    pub(crate) vanishing: BTreeSet<u32>,
    /// Filters: (interface, ingress) → the filters there.
    pub(crate) filters: BTreeMap<(u32, bool), Vec<BpfFilter>>,
    /// Files (and sockets, pins) that exist.
    pub(crate) files: BTreeSet<PathBuf>,
    /// Directories that exist.
    pub(crate) dirs: BTreeSet<PathBuf>,
    /// Sockets an agent answers on.
    pub(crate) agents: BTreeSet<PathBuf>,
}

fn ingress(hook: TcAttachType) -> bool {
    matches!(hook, TcAttachType::Ingress)
}

impl UninstallIo for FakeKernel {
    fn agent_running(&self, socket: &Path) -> bool {
        self.uninstall_table().agents.contains(socket)
    }

    fn interfaces(&mut self) -> Result<Vec<(u32, String)>, KernelError> {
        Ok(self
            .uninstall_table()
            .interfaces
            .iter()
            .map(|(i, n)| (*i, n.clone()))
            .collect())
    }

    fn filters(
        &mut self,
        ifindex: u32,
        hook: TcAttachType,
    ) -> Result<Option<Vec<BpfFilter>>, KernelError> {
        let t = self.uninstall_table();
        if t.vanishing.contains(&ifindex) || !t.interfaces.contains_key(&ifindex) {
            return Ok(None);
        }
        Ok(Some(
            t.filters
                .get(&(ifindex, ingress(hook)))
                .cloned()
                .unwrap_or_default(),
        ))
    }

    fn delete_filter(
        &mut self,
        ifindex: u32,
        hook: TcAttachType,
        filter: &BpfFilter,
    ) -> Result<(), KernelError> {
        let mut t = self.uninstall_table();
        let filters = t.filters.entry((ifindex, ingress(hook))).or_default();
        let before = filters.len();
        filters.retain(|f| f != filter);
        if filters.len() == before {
            return Err(KernelError::Io {
                op: "delete",
                what: format!("filter {} on interface {ifindex}", filter.name),
                source: io::Error::from_raw_os_error(libc::ENOENT),
            });
        }
        Ok(())
    }

    fn list(&mut self, dir: &Path) -> io::Result<Option<Vec<String>>> {
        let t = self.uninstall_table();
        if !t.dirs.contains(dir) {
            return Ok(None);
        }
        let children = t
            .files
            .iter()
            .chain(&t.dirs)
            .filter(|p| p.parent() == Some(dir));
        Ok(Some(
            children
                .filter_map(|p| Some(p.file_name()?.to_string_lossy().into_owned()))
                .collect(),
        ))
    }

    fn remove_file(&mut self, path: &Path) -> io::Result<bool> {
        let mut t = self.uninstall_table();
        if t.dirs.contains(path) {
            return Err(io::Error::from_raw_os_error(libc::EISDIR));
        }
        Ok(t.files.remove(path))
    }

    fn remove_tree(&mut self, dir: &Path) -> io::Result<bool> {
        let mut t = self.uninstall_table();
        if !t.dirs.contains(dir) {
            return Ok(false);
        }
        t.files.retain(|p| !p.starts_with(dir));
        t.dirs.retain(|p| !p.starts_with(dir));
        Ok(true)
    }
}
