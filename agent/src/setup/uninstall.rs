//! `weir uninstall`: removes weir from a node, as `cilium-dbg cleanup` does, with the agent
//! stopped. In this order, so no new pod starts on a half-removed weir:
//! 1. the conflist `04-weir.conflist` (the runtime stops handing pods to weir-cni);
//! 2. weir's `cls_bpf` filters (its slot, its program names) on every interface of this network
//!    namespace, and every pinned link under `links/` (tcx links on workload veths, the XDP
//!    prefilter on host interfaces): unpinning the last reference detaches the program;
//! 3. the pin root itself (maps and programs), and a stale API socket.
//!
//! The state directory (IPAM datastore, endpoint registry) stays: it is the record of addresses a
//! reinstall would need. Running pods keep their veths and addresses, with no policy enforced.

use std::{io, path::PathBuf};

use serde::Serialize;

use crate::{
    attach::{
        endpoint::ENDPOINT_PROGRAMS,
        filter::{FilterError, Tc},
    },
    paths::{CNI_CONFLIST, Paths},
};

/// Errors of the uninstall.
#[derive(Debug, thiserror::Error)]
pub enum UninstallError {
    /// An agent answers on the socket.
    #[error(
        "an agent is running on {0}: stop it first (delete the DaemonSet, or stop the service), then run `weir uninstall` again"
    )]
    AgentRunning(PathBuf),
    /// A file or pin could not be removed.
    #[error("cannot remove {path}: {source}; run as root on the node")]
    Remove {
        /// What.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A directory of pins could not be listed.
    #[error("cannot list {path}: {source}; run as root on the node")]
    List {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Interfaces could not be listed.
    #[error("cannot list the network interfaces: {0}")]
    Interfaces(#[source] nix::Error),
    /// A filter could not be read or deleted.
    #[error("cannot remove weir's tc filters: {0}; run as root on the node (CAP_NET_ADMIN)")]
    Filter(#[source] FilterError),
}

/// What the uninstall removed.
#[derive(Debug, Default, Serialize)]
pub struct UninstallReport {
    /// The conflist, when it was there.
    pub conflist: Option<PathBuf>,
    /// `<interface>:<program>` of each filter deleted.
    pub filters: Vec<String>,
    /// Each link pin removed (its program detached).
    pub links: Vec<String>,
    /// The pin root, when it was there.
    pub pin_root: Option<PathBuf>,
}

fn remove_file(path: PathBuf) -> Result<Option<PathBuf>, UninstallError> {
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(Some(path)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(UninstallError::Remove { path, source }),
    }
}

/// Removes weir's conflist, attachments and pins for the agent configured by `paths`.
pub fn run(paths: &Paths) -> Result<UninstallReport, UninstallError> {
    if std::os::unix::net::UnixStream::connect(&paths.api_socket).is_ok() {
        return Err(UninstallError::AgentRunning(paths.api_socket.clone()));
    }
    let mut report = UninstallReport {
        conflist: remove_file(paths.cni_conf_dir.join(CNI_CONFLIST))?,
        ..UninstallReport::default()
    };
    let mut tc = Tc::open().map_err(UninstallError::Filter)?;
    for iface in nix::net::if_::if_nameindex()
        .map_err(UninstallError::Interfaces)?
        .iter()
    {
        let ifname = iface.name().to_string_lossy();
        for (program, hook) in ENDPOINT_PROGRAMS {
            let filters = match tc.bpf_filters(iface.index(), hook) {
                Ok(filters) => filters,
                // The interface went away since the listing: nothing left to detach.
                Err(e) if e.errno() == Some(nix::errno::Errno::ENODEV as i32) => continue,
                Err(e) => return Err(UninstallError::Filter(e)),
            };
            for filter in filters {
                if filter.is_weir_slot() && filter.name == program {
                    tc.delete_filter(iface.index(), hook, filter.priority, filter.handle)
                        .map_err(UninstallError::Filter)?;
                    report.filters.push(format!("{ifname}:{program}"));
                }
            }
        }
    }
    let links_dir = paths.links_dir();
    let list_err = |source| UninstallError::List {
        path: links_dir.clone(),
        source,
    };
    let entries = match std::fs::read_dir(&links_dir) {
        Ok(entries) => Some(entries),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(list_err(e)),
    };
    for entry in entries.into_iter().flatten() {
        let entry = entry.map_err(list_err)?;
        if remove_file(entry.path())?.is_some() {
            report
                .links
                .push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    report.pin_root = match std::fs::remove_dir_all(&paths.bpf_root) {
        Ok(()) => Some(paths.bpf_root.clone()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(source) => {
            return Err(UninstallError::Remove {
                path: paths.bpf_root.clone(),
                source,
            });
        }
    };
    remove_file(paths.api_socket.clone())?;
    Ok(report)
}
