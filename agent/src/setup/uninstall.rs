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
//! Every read and removal goes through the kernel seam's [`UninstallIo`] (`kernel::real::uninstall`).

use std::{io, path::PathBuf};

use serde::Serialize;

use crate::{
    attach::endpoint::ENDPOINT_PROGRAMS,
    kernel::{KernelError, UninstallIo, real::uninstall::HostUninstall},
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
    Interfaces(#[source] KernelError),
    /// A filter could not be read or deleted.
    #[error("cannot remove weir's tc filters: {0}; run as root on the node (CAP_NET_ADMIN)")]
    Filter(#[source] KernelError),
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

fn remove_file(io: &mut dyn UninstallIo, path: PathBuf) -> Result<Option<PathBuf>, UninstallError> {
    match io.remove_file(&path) {
        Ok(true) => Ok(Some(path)),
        Ok(false) => Ok(None),
        Err(source) => Err(UninstallError::Remove { path, source }),
    }
}

/// Removes weir's conflist, attachments and pins for the agent configured by `paths`, on this host.
pub fn run(paths: &Paths) -> Result<UninstallReport, UninstallError> {
    remove(&mut HostUninstall::new(), paths)
}

/// Removes weir's conflist, attachments and pins for the agent configured by `paths` through `io`:
/// weir's filters (its slot, its program names) on every interface, every link pin, the pin root, the
/// API socket; nothing else.
pub fn remove(io: &mut dyn UninstallIo, paths: &Paths) -> Result<UninstallReport, UninstallError> {
    if io.agent_running(&paths.api_socket) {
        return Err(UninstallError::AgentRunning(paths.api_socket.clone()));
    }
    let mut report = UninstallReport {
        conflist: remove_file(io, paths.cni_conf_dir.join(CNI_CONFLIST))?,
        ..UninstallReport::default()
    };
    for (ifindex, ifname) in io.interfaces().map_err(UninstallError::Interfaces)? {
        for (program, hook) in ENDPOINT_PROGRAMS {
            // None: the interface went away since the listing, nothing left to detach.
            let Some(filters) = io.filters(ifindex, hook).map_err(UninstallError::Filter)? else {
                continue;
            };
            for filter in filters {
                if filter.is_weir_slot() && filter.name == program {
                    io.delete_filter(ifindex, hook, &filter)
                        .map_err(UninstallError::Filter)?;
                    report.filters.push(format!("{ifname}:{program}"));
                }
            }
        }
    }
    let links_dir = paths.links_dir();
    let names = io.list(&links_dir).map_err(|source| UninstallError::List {
        path: links_dir.clone(),
        source,
    })?;
    for name in names.into_iter().flatten() {
        if remove_file(io, links_dir.join(&name))?.is_some() {
            report.links.push(name);
        }
    }
    report.pin_root = match io.remove_tree(&paths.bpf_root) {
        Ok(true) => Some(paths.bpf_root.clone()),
        Ok(false) => None,
        Err(source) => {
            return Err(UninstallError::Remove {
                path: paths.bpf_root.clone(),
                source,
            });
        }
    };
    remove_file(io, paths.api_socket.clone())?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use attach::filter::{BpfFilter, HANDLE, PRIORITY};
    use maps_schema::programs::{FROM_ENDPOINT, TO_ENDPOINT};

    use super::*;
    use crate::kernel::fake::FakeKernel;

    fn paths() -> Paths {
        Paths {
            bpf_root: "/sys/fs/bpf/weir".into(),
            api_socket: "/run/weir/weir.sock".into(),
            cni_conf_dir: "/etc/cni/net.d".into(),
            ..Paths::default()
        }
    }

    fn filter(priority: u16, name: &str) -> BpfFilter {
        BpfFilter {
            priority,
            handle: HANDLE,
            name: name.to_owned(),
            program_id: 7,
        }
    }

    /// A node after weir ran on it, beside things that are not weir's: another conflist, another pin
    /// root, the state directory, a foreign filter at another priority and one of weir's slot under
    /// another program's name, on a `weir*` veth and on the host's `eth0`.
    fn node(paths: &Paths) -> FakeKernel {
        let kernel = FakeKernel::default();
        let mut t = kernel.uninstall_table();
        t.interfaces =
            BTreeMap::from([(1, "lo".into()), (2, "eth0".into()), (5, "weir1a2b".into())]);
        let ours = |program: &str| filter(PRIORITY, program);
        t.filters = BTreeMap::from([
            (
                (5, true),
                vec![ours(FROM_ENDPOINT), filter(PRIORITY + 1, FROM_ENDPOINT)],
            ),
            ((5, false), vec![ours(TO_ENDPOINT)]),
            (
                (2, true),
                vec![ours("cilium_from"), filter(49152, "foreign")],
            ),
        ]);
        let links = paths.links_dir();
        t.dirs = BTreeSet::from([
            paths.bpf_root.clone(),
            links.clone(),
            paths.maps_dir(),
            "/sys/fs/bpf/other".into(),
            paths.cni_conf_dir.clone(),
            paths.state_dir.clone(),
        ]);
        t.files = BTreeSet::from([
            paths.cni_conf_dir.join(CNI_CONFLIST),
            paths.cni_conf_dir.join("10-other.conflist"),
            links.join("weir1a2b:from_endpoint"),
            links.join("eth1:xdp_prefilter"),
            paths.maps_dir().join("policy_v1"),
            "/sys/fs/bpf/other/map".into(),
            paths.state_dir.join("endpoints.json"),
            paths.api_socket.clone(),
        ]);
        drop(t);
        kernel
    }

    #[test]
    fn removes_exactly_weirs_leftovers() {
        let paths = paths();
        let mut kernel = node(&paths);
        let report = remove(&mut kernel, &paths).expect("uninstalled");
        assert_eq!(report.conflist, Some(paths.cni_conf_dir.join(CNI_CONFLIST)));
        assert_eq!(
            report.filters,
            vec![
                "weir1a2b:from_endpoint".to_owned(),
                "weir1a2b:to_endpoint".to_owned()
            ]
        );
        let mut links = report.links.clone();
        links.sort();
        assert_eq!(links, vec!["eth1:xdp_prefilter", "weir1a2b:from_endpoint"]);
        assert_eq!(report.pin_root, Some(paths.bpf_root.clone()));

        let t = kernel.uninstall_table();
        // What is not weir's stays: the other conflist and pin root, the state directory, the foreign
        // filters (another priority, another program's name).
        assert_eq!(
            t.files,
            BTreeSet::from([
                paths.cni_conf_dir.join("10-other.conflist"),
                "/sys/fs/bpf/other/map".into(),
                paths.state_dir.join("endpoints.json"),
            ])
        );
        assert_eq!(
            t.dirs,
            BTreeSet::from([
                "/sys/fs/bpf/other".into(),
                paths.cni_conf_dir.clone(),
                paths.state_dir.clone(),
            ])
        );
        assert_eq!(
            t.filters[&(5, true)],
            vec![filter(PRIORITY + 1, FROM_ENDPOINT)]
        );
        assert!(t.filters[&(5, false)].is_empty());
        assert_eq!(
            t.filters[&(2, true)].len(),
            2,
            "the host's filters are not weir's"
        );
    }

    #[test]
    fn refuses_while_an_agent_answers_and_removes_nothing() {
        let paths = paths();
        let mut kernel = node(&paths);
        kernel
            .uninstall_table()
            .agents
            .insert(paths.api_socket.clone());
        let (files, filters) = {
            let t = kernel.uninstall_table();
            (t.files.clone(), t.filters.clone())
        };
        let e = remove(&mut kernel, &paths).expect_err("agent running");
        assert!(e.to_string().contains("stop it first"), "{e}");
        let t = kernel.uninstall_table();
        assert_eq!(t.files, files);
        assert_eq!(t.filters, filters);
    }

    #[test]
    fn an_interface_gone_since_the_listing_is_skipped_and_a_second_run_finds_nothing() {
        let paths = paths();
        let mut kernel = node(&paths);
        kernel.uninstall_table().vanishing.insert(5);
        let report = remove(&mut kernel, &paths).expect("uninstalled");
        assert!(report.filters.is_empty());
        assert_eq!(
            report.pin_root,
            Some(paths.bpf_root.clone()),
            "the rest still goes"
        );

        let again = remove(&mut kernel, &paths).expect("nothing left");
        assert_eq!(again.conflist, None);
        assert!(again.links.is_empty());
        assert_eq!(again.pin_root, None);
    }
}
