//! Every path and name the agent uses, in one place. Each default is overridable by flag and
//! environment variable (see `config`), so tests and several agents on one kernel never collide.
//! bpffs refuses names that contain a dot, so no pin name here has one.

use std::path::{Path, PathBuf};

use serde::Serialize;

/// bpffs mount point; the pin root lives below it.
pub const BPFFS_MOUNT: &str = "/sys/fs/bpf";
/// Default pin root.
pub const DEFAULT_BPF_ROOT: &str = "/sys/fs/bpf/weir";
/// Default agent API socket.
pub const DEFAULT_API_SOCKET: &str = weir_api::DEFAULT_SOCKET;
/// Default state directory (embedded datastore, endpoint registry).
pub const DEFAULT_STATE_DIR: &str = "/var/lib/weir";
/// Default directory of NetworkPolicy files in standalone mode.
pub const DEFAULT_POLICY_DIR: &str = "/etc/weir/policies";
/// Default CNI configuration directory.
pub const DEFAULT_CNI_CONF_DIR: &str = "/etc/cni/net.d";
/// The conflist the agent writes.
pub const CNI_CONFLIST: &str = "04-weir.conflist";
/// Where the network sysctls are written (`ip_forward`, `rp_filter`). A container's `/proc/sys`
/// is read-only, so the DaemonSet mounts the host's `/proc/sys/net` elsewhere and points here.
pub const DEFAULT_PROC_SYS_NET: &str = "/proc/sys/net";
/// Default metrics and health address (not 9962, which Cilium uses).
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9972";
/// The route protocol number of weir's routes to remote pod blocks (`ip route show proto 87`): the route
/// driver owns exactly the routes carrying it. Unassigned in `/etc/iproute2/rt_protos`.
pub const ROUTE_PROTOCOL: u8 = 87;
/// Default name of the VXLAN device of `--routing vxlan` (never `weir…`: that prefix means a workload veth).
pub const DEFAULT_VXLAN_DEVICE: &str = "wvx0";
/// Default VNI of the VXLAN device.
pub const DEFAULT_VXLAN_VNI: u32 = 87;
/// Default UDP port of the VXLAN device (IANA's VXLAN port; Flannel's Linux default is 8472).
pub const DEFAULT_VXLAN_PORT: u16 = 4789;

/// Resolved paths of one agent instance.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Paths {
    /// Pin root (mode 0700).
    pub bpf_root: PathBuf,
    /// API socket (mode 0600).
    pub api_socket: PathBuf,
    /// State directory.
    pub state_dir: PathBuf,
    /// NetworkPolicy files.
    pub policy_dir: PathBuf,
    /// CNI configuration directory.
    pub cni_conf_dir: PathBuf,
    /// The network sysctls (`/proc/sys/net` of the agent's network namespace).
    pub proc_sys_net: PathBuf,
}

impl Default for Paths {
    fn default() -> Self {
        Self {
            bpf_root: DEFAULT_BPF_ROOT.into(),
            api_socket: DEFAULT_API_SOCKET.into(),
            state_dir: DEFAULT_STATE_DIR.into(),
            policy_dir: DEFAULT_POLICY_DIR.into(),
            cni_conf_dir: DEFAULT_CNI_CONF_DIR.into(),
            proc_sys_net: DEFAULT_PROC_SYS_NET.into(),
        }
    }
}

impl Paths {
    /// Paths for an agent whose pin root is `bpf_root`, everything else default (tests).
    #[must_use]
    pub fn with_bpf_root(bpf_root: impl Into<PathBuf>) -> Self {
        Self {
            bpf_root: bpf_root.into(),
            ..Self::default()
        }
    }

    /// Directory of pinned maps.
    #[must_use]
    pub fn maps_dir(&self) -> PathBuf {
        self.bpf_root.join(maps_schema::pins::MAPS_DIR)
    }

    /// Pin of map `name` (a versioned name from `maps_schema::maps`).
    #[must_use]
    pub fn map_pin(&self, name: &str) -> PathBuf {
        self.maps_dir().join(name)
    }

    /// Directory of pinned programs.
    #[must_use]
    pub fn progs_dir(&self) -> PathBuf {
        self.bpf_root.join(maps_schema::pins::PROGS_DIR)
    }

    /// Pin of program `name` (from `maps_schema::programs`).
    #[must_use]
    pub fn prog_pin(&self, name: &str) -> PathBuf {
        self.progs_dir().join(name)
    }

    /// Directory of pinned links.
    #[must_use]
    pub fn links_dir(&self) -> PathBuf {
        self.bpf_root.join(maps_schema::pins::LINKS_DIR)
    }

    /// Pin of the link attaching `program` to interface `ifname`: `links/<ifname>:<program>`.
    /// bpffs refuses names with a dot, so a dot in the interface name (a VLAN such as `eth0.100`)
    /// is written as `:`, which no interface name contains.
    #[must_use]
    pub fn link_pin(&self, ifname: &str, program: &str) -> PathBuf {
        self.links_dir()
            .join(maps_schema::pins::link_pin_name(ifname, program))
    }

    /// The endpoint registry file.
    #[must_use]
    pub fn registry(&self) -> PathBuf {
        self.state_dir.join("endpoints.json")
    }

    /// The identity store file.
    #[must_use]
    pub fn identities(&self) -> PathBuf {
        self.state_dir.join("identities.json")
    }

    /// Embedded IPAM datastore file.
    #[must_use]
    pub fn ipam_db(&self) -> PathBuf {
        self.state_dir.join("ipam.redb")
    }

    /// True when `path` is inside the pin root.
    #[must_use]
    pub fn owns(&self, path: &Path) -> bool {
        path.starts_with(&self.bpf_root)
    }
}

/// The (interface, program) a link pin name stands for (inverse of [`Paths::link_pin`]).
#[must_use]
pub fn parse_link_pin(name: &str) -> Option<(String, String)> {
    maps_schema::pins::parse_link_pin_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_live_under_the_root() {
        let paths = Paths::with_bpf_root("/sys/fs/bpf/wt-x");
        assert_eq!(
            paths.map_pin("ct4_v1"),
            Path::new("/sys/fs/bpf/wt-x/maps/ct4_v1")
        );
        assert_eq!(
            paths.prog_pin("to_endpoint"),
            Path::new("/sys/fs/bpf/wt-x/progs/to_endpoint")
        );
        assert_eq!(
            paths.link_pin("weir0123456789a", "from_endpoint"),
            Path::new("/sys/fs/bpf/wt-x/links/weir0123456789a:from_endpoint")
        );
        assert_eq!(
            paths.link_pin("eth0.100", "xdp_prefilter"),
            Path::new("/sys/fs/bpf/wt-x/links/eth0:100:xdp_prefilter")
        );
        assert_eq!(
            parse_link_pin("eth0:100:xdp_prefilter"),
            Some(("eth0.100".to_owned(), "xdp_prefilter".to_owned()))
        );
        assert!(paths.owns(&paths.maps_dir()));
        assert!(!DEFAULT_VXLAN_DEVICE.starts_with("weir") && DEFAULT_VXLAN_DEVICE.len() <= 15);
        assert!(!paths.owns(Path::new("/sys/fs/bpf/other")));
    }
}
