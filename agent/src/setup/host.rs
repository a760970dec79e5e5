//! What the node needs from the kernel outside BPF, and the CNI configuration the runtime reads:
//! forwarding on, `rp_filter` off on workload links (pods' source addresses are checked by
//! `from_endpoint` instead), and `04-weir.conflist` written once the agent is ready.

use std::{fs, io, path::PathBuf};

use crate::{
    kernel::SysctlIo,
    paths::{CNI_CONFLIST, Paths},
};

/// Errors of node set-up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// A sysctl could not be written.
    #[error(
        "cannot set {path} to {value}: {source}; run the agent as root (in a container, mount the host's /proc/sys/net and pass --proc-sys-net)"
    )]
    Sysctl {
        /// The sysctl file.
        path: String,
        /// The value.
        value: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The conflist could not be written.
    #[error("cannot write the CNI configuration {path}: {source}; check --cni-conf-dir")]
    Conflist {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// The real [`SysctlIo`]: files under `/proc/sys`, the network ones (`/proc/sys/net/…`) read and
/// written under `--proc-sys-net` (a container's `/proc/sys` is read-only: the DaemonSet mounts
/// the host's `/proc/sys/net` elsewhere).
pub struct ProcSysctl {
    net: PathBuf,
}

impl ProcSysctl {
    /// The sysctls of the agent configured by `paths`.
    #[must_use]
    pub fn new(paths: &Paths) -> Self {
        Self {
            net: paths.proc_sys_net.clone(),
        }
    }

    fn file(&self, path: &str) -> PathBuf {
        match path.strip_prefix("/proc/sys/net/") {
            Some(rest) => self.net.join(rest),
            None => PathBuf::from(path),
        }
    }
}

impl SysctlIo for ProcSysctl {
    fn get(&self, path: &str) -> Option<String> {
        fs::read_to_string(self.file(path))
            .ok()
            .map(|v| v.trim().to_owned())
    }

    fn set(&mut self, path: &str, value: &str) -> Result<(), io::Error> {
        fs::write(self.file(path), value)
    }
}

/// Writes `value` unless the setting already has it.
fn sysctl(io: &mut dyn SysctlIo, path: String, value: &'static str) -> Result<(), SetupError> {
    if io.get(&path).is_some_and(|v| v == value) {
        return Ok(());
    }
    io.set(&path, value).map_err(|source| SetupError::Sysctl {
        path,
        value,
        source,
    })
}

/// Forwarding on for both families (in the agent's network namespace).
pub fn enable_forwarding(paths: &Paths) -> Result<(), SetupError> {
    enable_forwarding_with(&mut ProcSysctl::new(paths))
}

/// [`enable_forwarding`] over `io`.
pub fn enable_forwarding_with(io: &mut dyn SysctlIo) -> Result<(), SetupError> {
    sysctl(io, "/proc/sys/net/ipv4/ip_forward".into(), "1")?;
    sysctl(io, "/proc/sys/net/ipv6/conf/all/forwarding".into(), "1")
}

/// `rp_filter` off on a workload link (anti-spoofing is `from_endpoint`'s job).
pub fn workload_link_sysctls(paths: &Paths, ifname: &str) -> Result<(), SetupError> {
    workload_link_sysctls_with(&mut ProcSysctl::new(paths), ifname)
}

/// [`workload_link_sysctls`] over `io`.
pub fn workload_link_sysctls_with(io: &mut dyn SysctlIo, ifname: &str) -> Result<(), SetupError> {
    sysctl(
        io,
        format!("/proc/sys/net/ipv4/conf/{ifname}/rp_filter"),
        "0",
    )
}

/// The CNI versions weir-cni speaks, oldest first (the conflist may name either).
pub const CNI_VERSIONS: &[&str] = &["1.0.0", "1.1.0"];

/// The conflist's default `cniVersion`: the newest that every supported runtime reads.
/// containerd 1.6 and 1.7 (libcni 1.1) refuse results newer than 1.0.0 ("unsupported CNI result
/// version"), so a 1.1.0 conflist would fail every pod sandbox there; `--cni-version 1.1.0`
/// raises it where every runtime reads it (docs/cni.md).
pub const DEFAULT_CNI_VERSION: &str = "1.0.0";

/// The conflist the runtime reads, at `cni_version`: weir-cni pointed at this agent's socket and
/// pin root, asking for the address families the node's pools serve, and accepting requested
/// addresses; `tcAttach` makes weir-cni attach the way this agent does.
#[must_use]
pub fn conflist(
    paths: &Paths,
    families: &[&str],
    cni_version: &str,
    tc_attach: attach::Mechanism,
) -> serde_json::Value {
    serde_json::json!({
        "cniVersion": cni_version,
        "name": "weir",
        "plugins": [{
            "type": "weir-cni",
            "agentSocket": paths.api_socket,
            "bpfRoot": paths.bpf_root,
            "tcAttach": tc_attach,
            "ipam": {"families": families},
            "capabilities": {"ips": true},
        }],
    })
}

/// Writes `04-weir.conflist` atomically into `paths.cni_conf_dir`.
pub fn write_conflist(
    paths: &Paths,
    families: &[&str],
    cni_version: &str,
    tc_attach: attach::Mechanism,
) -> Result<PathBuf, SetupError> {
    write_conflist_with_mtu(paths, families, cni_version, tc_attach, None)
}

/// As [`write_conflist`], with the pods' MTU when routing lowers it (vxlan mode: the VXLAN device's MTU,
/// `dataplane::node_routes::NodeRoutes::pod_mtu`), so weir-cni gives every pod veth that MTU; `None` leaves
/// weir-cni's default.
pub fn write_conflist_with_mtu(
    paths: &Paths,
    families: &[&str],
    cni_version: &str,
    tc_attach: attach::Mechanism,
    mtu: Option<u32>,
) -> Result<PathBuf, SetupError> {
    let path = paths.cni_conf_dir.join(CNI_CONFLIST);
    let err = |source| SetupError::Conflist {
        path: path.clone(),
        source,
    };
    fs::create_dir_all(&paths.cni_conf_dir).map_err(err)?;
    let mut value = conflist(paths, families, cni_version, tc_attach);
    if let Some(mtu) = mtu {
        value["plugins"][0]["mtu"] = serde_json::json!(mtu);
    }
    let text = serde_json::to_string_pretty(&value).map_err(|e| err(io::Error::other(e)))?;
    crate::fsutil::write_atomic(&path, text.as_bytes()).map_err(err)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::fake::FakeKernel;

    #[test]
    fn sysctls_are_written_only_when_they_differ_and_a_failure_names_the_setting() {
        let k = FakeKernel::default();
        k.sysctls()
            .insert("/proc/sys/net/ipv4/ip_forward".into(), "1".into());
        enable_forwarding_with(&mut k.clone()).expect("forwarding");
        workload_link_sysctls_with(&mut k.clone(), "weir1").expect("rp_filter");
        assert_eq!(
            k.sysctls().clone().into_iter().collect::<Vec<_>>(),
            vec![
                ("/proc/sys/net/ipv4/conf/weir1/rp_filter".into(), "0".into()),
                ("/proc/sys/net/ipv4/ip_forward".into(), "1".into()),
                ("/proc/sys/net/ipv6/conf/all/forwarding".into(), "1".into()),
            ]
        );
        k.drop_all_writes(true);
        // Already set: nothing written, so no failure.
        enable_forwarding_with(&mut k.clone()).expect("unchanged settings are not written");
        let err = workload_link_sysctls_with(&mut k.clone(), "weir2")
            .expect_err("the write fails")
            .to_string();
        assert!(err.contains("weir2/rp_filter"), "{err}");
    }

    #[test]
    fn the_conflist_names_the_plugin_socket_and_pin_root() {
        let dir = tempfile::tempdir().expect("tmp");
        let mut paths = Paths::with_bpf_root("/sys/fs/bpf/wt-x");
        paths.cni_conf_dir = dir.path().join("net.d");
        let path = write_conflist(
            &paths,
            &["ipv4"],
            DEFAULT_CNI_VERSION,
            attach::Mechanism::Tcx,
        )
        .expect("write");
        assert!(path.ends_with("04-weir.conflist"));
        let v: serde_json::Value =
            serde_json::from_slice(&fs::read(&path).expect("read")).expect("json");
        assert_eq!(v["plugins"][0]["type"], "weir-cni");
        assert_eq!(v["plugins"][0]["bpfRoot"], "/sys/fs/bpf/wt-x");
        assert_eq!(v["plugins"][0]["agentSocket"], "/run/weir/weir.sock");
        assert_eq!(v["plugins"][0]["ipam"]["families"][0], "ipv4");
        assert_eq!(
            v["plugins"][0]["tcAttach"], "tcx",
            "weir-cni attaches as the agent does"
        );
        assert_eq!(v["cniVersion"], "1.0.0");
        write_conflist(&paths, &["ipv4"], "1.1.0", attach::Mechanism::Filter).expect("write");
        let v: serde_json::Value =
            serde_json::from_slice(&fs::read(&path).expect("read")).expect("json");
        assert_eq!(v["cniVersion"], "1.1.0");
        assert!(
            v["plugins"][0].get("mtu").is_none(),
            "weir-cni's default MTU"
        );
        write_conflist_with_mtu(
            &paths,
            &["ipv4"],
            DEFAULT_CNI_VERSION,
            attach::Mechanism::Tcx,
            Some(1450),
        )
        .expect("write");
        let v: serde_json::Value =
            serde_json::from_slice(&fs::read(&path).expect("read")).expect("json");
        assert_eq!(
            v["plugins"][0]["mtu"], 1450,
            "the pods' MTU follows the tunnel"
        );
    }
}
