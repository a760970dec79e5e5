//! The agent's one validated configuration: every flag has an environment variable, a default from
//! `paths`, and the whole is dumpable as JSON (`weir agent --dump-config`).

pub mod vxlan;

use std::{net::SocketAddr, path::PathBuf};

use clap::Args;
use serde::Serialize;

use crate::paths::{self, Paths};

/// Errors validating the configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A flag has a value that cannot work.
    #[error("invalid {flag} {value:?}: {reason}")]
    Invalid {
        /// The flag (and its environment variable).
        flag: &'static str,
        /// The value given.
        value: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
}

/// `weir agent` flags.
#[derive(Debug, Clone, Args, Serialize)]
pub struct AgentArgs {
    /// IPAM datastore: `embedded:PATH`, `etcd:URL[,URL…]` or `kubernetes`. Default: embedded file
    /// `ipam.redb` in the state directory.
    #[arg(long, env = "WEIR_DATASTORE")]
    pub datastore: Option<String>,
    /// This node's name (defaults to the host name).
    #[arg(long, env = "WEIR_NODE")]
    pub node: Option<String>,
    /// Node labels in standalone mode, `K=V,…`.
    #[arg(long, env = "WEIR_NODE_LABELS", value_delimiter = ',')]
    pub node_labels: Vec<String>,
    /// IP pools to create when missing (one per family: `default-ipv4`, `default-ipv6`).
    #[arg(long = "pool", env = "WEIR_POOLS", value_delimiter = ',')]
    pub pools: Vec<String>,
    /// IPv4 block size for pools the agent creates.
    #[arg(long, env = "WEIR_BLOCK_SIZE_V4", default_value_t = 26)]
    pub block_size_v4: u8,
    /// IPv6 block size for pools the agent creates.
    #[arg(long, env = "WEIR_BLOCK_SIZE_V6", default_value_t = 122)]
    pub block_size_v6: u8,
    /// Agent API unix socket.
    #[arg(long, env = "WEIR_API_SOCKET", default_value = paths::DEFAULT_API_SOCKET)]
    pub api_socket: PathBuf,
    /// bpffs pin root.
    #[arg(long, env = "WEIR_BPF_ROOT", default_value = paths::DEFAULT_BPF_ROOT)]
    pub bpf_root: PathBuf,
    /// State directory (embedded datastore, endpoint registry).
    #[arg(long, env = "WEIR_STATE_DIR", default_value = paths::DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// Where pods, namespaces, NetworkPolicies and nodes come from: `standalone` (the
    /// `--policy-dir` files) or `kubernetes` (watchers on the API server, through `--kubeconfig`
    /// or, without it, the in-cluster service account). See docs/kubernetes.md.
    #[arg(long, env = "WEIR_SOURCE", default_value_t = SourceMode::Standalone)]
    pub source: SourceMode,
    /// A kubeconfig for `--source kubernetes` (default: the in-cluster configuration from the
    /// pod's service account).
    #[arg(long, env = "WEIR_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Directory of NetworkPolicy YAML files (standalone mode).
    #[arg(long, env = "WEIR_POLICY_DIR", default_value = paths::DEFAULT_POLICY_DIR)]
    pub policy_dir: PathBuf,
    /// Where the agent writes its CNI conflist.
    #[arg(long, env = "WEIR_CNI_CONF_DIR", default_value = paths::DEFAULT_CNI_CONF_DIR)]
    pub cni_conf_dir: PathBuf,
    /// The network sysctls of the agent's namespace (`ip_forward`, `rp_filter`). In a container,
    /// whose `/proc/sys` is read-only, mount the host's `/proc/sys/net` elsewhere and name it here.
    #[arg(long, env = "WEIR_PROC_SYS_NET", default_value = paths::DEFAULT_PROC_SYS_NET)]
    pub proc_sys_net: PathBuf,
    /// The `cniVersion` of the conflist the agent writes. The default, 1.0.0, is read by every
    /// supported runtime (containerd 1.6 and 1.7 read results up to 1.0.0); raise it to 1.1.0 for
    /// runtimes that use GC and STATUS (containerd 2.x, CRI-O 1.30+). See docs/cni.md.
    #[arg(long, env = "WEIR_CNI_VERSION", default_value = crate::setup::host::DEFAULT_CNI_VERSION)]
    pub cni_version: String,
    /// Interfaces to attach `xdp_prefilter` to (none by default: the agent never touches a host
    /// interface it was not told to).
    #[arg(long, env = "WEIR_PREFILTER_INTERFACES", value_delimiter = ',')]
    pub prefilter_interfaces: Vec<String>,
    /// CIDRs whose traffic `xdp_prefilter` drops on the prefilter interfaces, comma-separated
    /// (a bare address is a /32 or /128).
    #[arg(long, env = "WEIR_PREFILTER_DENY", value_delimiter = ',')]
    pub prefilter_deny: Vec<String>,
    /// A file of deny CIDRs, one per line (`#` starts a comment), added to `--prefilter-deny` and
    /// reloaded when it changes; a bad line is logged as FILE:LINE and the last good set stays.
    #[arg(long, env = "WEIR_PREFILTER_DENY_FILE")]
    pub prefilter_deny_file: Option<PathBuf>,
    /// Interfaces whose outgoing pod traffic to destinations outside the IPv4 pools is
    /// masqueraded by BPF (`masq_egress`/`masq_ingress`), comma-separated `IFNAME` or
    /// `IFNAME=ADDRESS` (the address to translate to; default: the interface's first IPv4
    /// address). None by default: the agent never touches a host interface it was not told to.
    /// See docs/masquerade.md.
    #[arg(long, env = "WEIR_MASQUERADE_INTERFACES", value_delimiter = ',')]
    pub masquerade_interfaces: Vec<String>,
    /// Host interfaces whose address serves the Services' NodePorts (the same programs:
    /// translated to a backend on this node, or on another node with this node's address as the
    /// source; `externalTrafficPolicy: Local` only to this node's), comma-separated `IFNAME` or
    /// `IFNAME=ADDRESS`. Name every interface NodePort traffic and the replies from other nodes
    /// arrive on (the uplink and the node-to-node one). None by default. See docs/services.md.
    #[arg(long, env = "WEIR_NODEPORT_INTERFACES", value_delimiter = ',')]
    pub nodeport_interfaces: Vec<String>,
    /// How the endpoint programs attach to workload veths: `filter` (clsact + `cls_bpf`
    /// direct-action filters at weir's priority and handle; the default: a tenth of tcx's attach
    /// cost, see BENCHMARKS.md) or `tcx` (pinned tcx links). The conflist the agent writes tells
    /// weir-cni the same; an attachment of the other kind is replaced and swept.
    #[arg(long, env = "WEIR_TC_ATTACH", default_value_t = attach::Mechanism::Filter)]
    pub tc_attach: attach::Mechanism,
    /// Metrics and health address.
    #[arg(long, env = "WEIR_METRICS", default_value = paths::DEFAULT_METRICS_ADDR)]
    pub metrics: String,
    /// Seconds before an allocation that no endpoint confirmed is released.
    #[arg(long, env = "WEIR_ALLOCATION_EXPIRY", default_value_t = 600)]
    pub allocation_expiry: u64,
    /// Seconds between conntrack sweeps.
    #[arg(long, env = "WEIR_CT_SWEEP_INTERVAL", default_value_t = 10)]
    pub ct_sweep_interval: u64,
    /// Seconds between periodic refreshes: every driver reads its kernel state back (maps, pins,
    /// workload attachments, routes, the VXLAN device) and repairs what was changed from outside.
    /// 0 turns the periodic refresh off (start, failed writes and the kernel's deletion events still
    /// repair).
    #[arg(long, env = "WEIR_REFRESH_INTERVAL", default_value_t = 10)]
    pub refresh_interval: u64,
    /// Seconds a cluster-wide security identity (etcd or kubernetes datastore) stays allocated once no
    /// node uses it; nodes renew the ones they use every quarter of it.
    #[arg(long, env = "WEIR_IDENTITY_GC_GRACE", default_value_t = 900)]
    pub identity_gc_grace: u64,
    /// Conntrack timeout of TCP flows before the handshake completes, seconds.
    #[arg(long, env = "WEIR_CT_TIMEOUT_TCP_SYN", default_value_t = 60)]
    pub ct_timeout_tcp_syn: u64,
    /// Conntrack timeout of established TCP flows, seconds.
    #[arg(
        long,
        env = "WEIR_CT_TIMEOUT_TCP_ESTABLISHED",
        default_value_t = 21_600
    )]
    pub ct_timeout_tcp_established: u64,
    /// Conntrack timeout of closed TCP flows (both FINs or an RST), seconds.
    #[arg(long, env = "WEIR_CT_TIMEOUT_TCP_CLOSED", default_value_t = 10)]
    pub ct_timeout_tcp_closed: u64,
    /// Conntrack timeout of ICMP flows, seconds.
    #[arg(long, env = "WEIR_CT_TIMEOUT_ICMP", default_value_t = 10)]
    pub ct_timeout_icmp: u64,
    /// Conntrack timeout of UDP and other flows, seconds.
    #[arg(long, env = "WEIR_CT_TIMEOUT_OTHER", default_value_t = 60)]
    pub ct_timeout_other: u64,
    /// Entries of each conntrack map (`ct4`, `ct6`). A change resizes the pinned maps at the
    /// next start, copying every entry (through `<name>_old`); a map is never made smaller than
    /// its entries need (plus 10%), so a resize or layout migration evicts nothing.
    #[arg(long, env = "WEIR_CT_MAX_ENTRIES", default_value_t = maps_schema::maps::CT_MAX)]
    pub ct_max_entries: u32,
    /// Load this eBPF object instead of the one built into the binary (a locally built
    /// object, or an older release's in upgrade tests). Its conntrack layout is the agent's.
    #[arg(long, env = "WEIR_EBPF_OBJECT_FILE")]
    pub ebpf_object: Option<PathBuf>,
    /// How pods on other nodes are reached (with a shared `etcd:` datastore, whose node records and
    /// block affinities say where every block lives): `native` (one route per remote block via that
    /// node's address: the nodes share an L2, or the fabric routes pod CIDRs) or `vxlan` (a VXLAN
    /// device with forwarding and neighbour entries per remote node).
    #[arg(long, env = "WEIR_ROUTING", default_value_t = RoutingMode::Native)]
    pub routing: RoutingMode,
    /// Who forwards a pod's packets bound for another node or outside once `from_endpoint` has
    /// passed them: `bpf` (a FIB lookup and a redirect straight out of the interface the route
    /// names, skipping the kernel's IP forwarding and netfilter's forward and post-routing hooks, as
    /// Cilium's BPF host routing) or `kernel` (the kernel's IP forwarding, for hosts whose own
    /// iptables/nftables forward rules must see pod traffic).
    #[arg(long, env = "WEIR_HOST_ROUTING", default_value_t = HostRouting::Bpf)]
    pub host_routing: HostRouting,
    /// Socket LB (Cilium's): attach `cgroup/connect4` and `getpeername4` programs (and their IPv6
    /// hooks, for IPv4-mapped addresses) to this cgroup v2 directory, so a TCP socket of a process
    /// in it (or below it) that connects to a Service gets a backend at `connect` and its packets
    /// need no translation; the socket still reads the frontend as its peer. UDP stays translated
    /// per packet. On a node: the root of the host's cgroup v2 hierarchy (docs/install.md for the
    /// DaemonSet). Unset: off (links left by an earlier start are detached); Services are then
    /// translated per packet by `from_endpoint`, as they are for sockets outside the cgroup.
    #[arg(long, env = "WEIR_SOCKET_LB_CGROUP")]
    pub socket_lb_cgroup: Option<PathBuf>,
    /// Which sockets in the socket LB cgroup are placed: `all`, or `host` — only those of the
    /// node's own network namespace (the node's processes and `hostNetwork` pods), so pods' flows
    /// to Services are translated per packet and a service mesh's sidecar in a pod still sees the
    /// ClusterIP (Cilium's `socketLB.hostNamespaceOnly`).
    #[arg(long, env = "WEIR_SOCKET_LB_SCOPE", default_value_t = SocketLbScope::All)]
    pub socket_lb_scope: SocketLbScope,
    /// This node's addresses in its node record (the next hop other nodes route its blocks
    /// through), comma-separated. Default: the source address of this node's route to the first
    /// etcd endpoint.
    #[arg(
        long = "node-address",
        env = "WEIR_NODE_ADDRESSES",
        value_delimiter = ','
    )]
    pub node_addresses: Vec<std::net::IpAddr>,
    /// Seconds a node record stays live without a heartbeat; the agent renews its own every third
    /// of it, and other nodes show a node whose heartbeat is older as silent (degraded; its routes
    /// stay until its record is deleted, e.g. by `weir ipam release-node`). Under `--source
    /// kubernetes`: how long a Node may be not Ready before it shows as silent.
    #[arg(long, env = "WEIR_NODE_EXPIRY", default_value_t = 40)]
    pub node_expiry: u64,
    /// The VXLAN device of `--routing vxlan`.
    #[command(flatten)]
    pub vxlan: crate::config::vxlan::VxlanArgs,
    /// Print the validated configuration as JSON and exit.
    #[arg(long)]
    #[serde(skip)]
    pub dump_config: bool,
}

/// Where the cluster's objects come from (`--source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SourceMode {
    /// The `--policy-dir` files, hot-reloaded.
    Standalone,
    /// Watchers on the Kubernetes API server.
    Kubernetes,
}

impl std::fmt::Display for SourceMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Standalone => "standalone",
            Self::Kubernetes => "kubernetes",
        })
    }
}

/// How remote nodes' blocks are routed (`--routing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum RoutingMode {
    /// A route per remote block via the remote node's address.
    Native,
    /// Routes through a VXLAN device, with forwarding and neighbour entries per remote node.
    Vxlan,
}

impl std::fmt::Display for RoutingMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Native => "native",
            Self::Vxlan => "vxlan",
        })
    }
}

/// Who forwards pod traffic leaving the node (`--host-routing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum HostRouting {
    /// `from_endpoint` hands passed packets to `host_fwd` (FIB lookup and redirect).
    Bpf,
    /// The kernel's IP forwarding.
    Kernel,
}

impl std::fmt::Display for HostRouting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Bpf => "bpf",
            Self::Kernel => "kernel",
        })
    }
}

/// Which sockets socket LB places (`--socket-lb-scope`), kept by its driver.
pub use crate::dataplane::socket_lb::SocketLbScope;

/// The validated configuration.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// Where the cluster's objects come from.
    pub source: SourceMode,
    /// The kubeconfig of `--source kubernetes` (None: in-cluster).
    pub kubeconfig: Option<PathBuf>,
    /// Every path the agent uses.
    pub paths: Paths,
    /// Datastore spec.
    pub datastore: String,
    /// Node name.
    pub node: String,
    /// Node labels.
    pub node_labels: Vec<(String, String)>,
    /// Pools to create when missing.
    pub pools: Vec<String>,
    /// IPv4 block size.
    pub block_size_v4: u8,
    /// IPv6 block size.
    pub block_size_v6: u8,
    /// Interfaces for `xdp_prefilter`.
    pub prefilter_interfaces: Vec<String>,
    /// Deny CIDRs from the flag, normalised to their network address.
    pub prefilter_deny: Vec<String>,
    /// The deny file (hot reloaded).
    pub prefilter_deny_file: Option<PathBuf>,
    /// The masquerade interfaces and the address each translates to (if named).
    pub masquerade_interfaces: Vec<crate::dataplane::masquerade::MasqSpec>,
    /// The NodePort interfaces and the address each serves (if named).
    pub nodeport_interfaces: Vec<crate::dataplane::masquerade::MasqSpec>,
    /// Both lists merged: each host interface the programs serve, with its roles.
    #[serde(skip)]
    pub host_interfaces: Vec<crate::dataplane::masquerade::MasqSpec>,
    /// How the endpoint programs attach.
    pub tc_attach: attach::Mechanism,
    /// Metrics address.
    pub metrics: SocketAddr,
    /// Expiry of unconfirmed allocations (dumped in seconds, as `--allocation-expiry` takes it).
    #[serde(serialize_with = "seconds")]
    pub allocation_expiry: std::time::Duration,
    /// Interval between conntrack sweeps (dumped in seconds).
    #[serde(serialize_with = "seconds")]
    pub ct_sweep_interval: std::time::Duration,
    /// Interval between periodic refreshes of every driver (dumped in seconds; 0: off).
    #[serde(serialize_with = "seconds")]
    pub refresh_interval: std::time::Duration,
    /// Grace period of unused cluster-wide identities (dumped in seconds).
    #[serde(serialize_with = "seconds")]
    pub identity_gc_grace: std::time::Duration,
    /// Conntrack timeouts.
    pub ct_timeouts: crate::dataplane::conntrack::CtTimeouts,
    /// Entries of each conntrack map.
    pub ct_max_entries: u32,
    /// An eBPF object file to load instead of the built-in one.
    pub ebpf_object: Option<PathBuf>,
    /// The `cniVersion` of the conflist the agent writes.
    pub cni_version: String,
    /// How remote nodes' blocks are routed.
    pub routing: RoutingMode,
    /// Who forwards pod traffic leaving the node.
    pub host_routing: HostRouting,
    /// The cgroup v2 directory socket LB is attached to (None: off).
    pub socket_lb_cgroup: Option<PathBuf>,
    /// Which sockets socket LB places.
    pub socket_lb_scope: SocketLbScope,
    /// This node's addresses for its node record (empty: found from the route to etcd).
    pub node_addresses: Vec<std::net::IpAddr>,
    /// How long a node record stays live without a heartbeat (dumped in seconds).
    #[serde(serialize_with = "seconds")]
    pub node_expiry: std::time::Duration,
    /// The VXLAN device's flags (checked; the underlay, when not given, is found at start).
    pub vxlan: crate::config::vxlan::VxlanArgs,
}

/// A duration as the whole seconds the flags take.
pub(crate) fn seconds<S: serde::Serializer>(
    d: &std::time::Duration,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_secs())
}

fn invalid(flag: &'static str, value: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        flag,
        value: value.to_owned(),
        reason: reason.into(),
    }
}

fn absolute(flag: &'static str, path: &std::path::Path) -> Result<PathBuf, ConfigError> {
    if path.is_absolute() {
        Ok(path.to_owned())
    } else {
        Err(invalid(
            flag,
            &path.display().to_string(),
            "must be an absolute path",
        ))
    }
}

impl AgentArgs {
    /// Validates the flags into a [`Config`].
    pub fn validate(&self) -> Result<Config, ConfigError> {
        let paths = Paths {
            bpf_root: absolute("--bpf-root (WEIR_BPF_ROOT)", &self.bpf_root)?,
            api_socket: absolute("--api-socket (WEIR_API_SOCKET)", &self.api_socket)?,
            state_dir: absolute("--state-dir (WEIR_STATE_DIR)", &self.state_dir)?,
            policy_dir: absolute("--policy-dir (WEIR_POLICY_DIR)", &self.policy_dir)?,
            cni_conf_dir: absolute("--cni-conf-dir (WEIR_CNI_CONF_DIR)", &self.cni_conf_dir)?,
            proc_sys_net: absolute("--proc-sys-net (WEIR_PROC_SYS_NET)", &self.proc_sys_net)?,
        };
        if !paths.bpf_root.starts_with(paths::BPFFS_MOUNT)
            || paths.bpf_root == std::path::Path::new(paths::BPFFS_MOUNT)
        {
            return Err(invalid(
                "--bpf-root (WEIR_BPF_ROOT)",
                &paths.bpf_root.display().to_string(),
                format!("must be a directory below {}", paths::BPFFS_MOUNT),
            ));
        }
        let datastore = match &self.datastore {
            Some(spec) => validate_datastore(spec)?,
            None => format!("embedded:{}", paths.ipam_db().display()),
        };
        let node = match &self.node {
            Some(node) if valid_node_name(node) => node.clone(),
            Some(node) => {
                return Err(invalid(
                    "--node (WEIR_NODE)",
                    node,
                    "use a DNS-1123 name: lowercase letters, digits, '-' and '.'",
                ));
            }
            None => hostname().ok_or_else(|| {
                invalid(
                    "--node (WEIR_NODE)",
                    "",
                    "the host name is unreadable; pass --node",
                )
            })?,
        };
        let mut node_labels = Vec::new();
        for label in &self.node_labels {
            match label.split_once('=') {
                Some((k, v)) if !k.is_empty() => node_labels.push((k.to_owned(), v.to_owned())),
                _ => {
                    return Err(invalid(
                        "--node-labels (WEIR_NODE_LABELS)",
                        label,
                        "write labels as KEY=VALUE,…",
                    ));
                }
            }
        }
        let mut families = Vec::new();
        for pool in &self.pools {
            let Ok(net) = pool.parse::<ipnetwork::IpNetwork>() else {
                return Err(invalid(
                    "--pool (WEIR_POOLS)",
                    pool,
                    "use a CIDR such as 10.244.0.0/16 or fd00:10:244::/56",
                ));
            };
            if net.network() != net.ip() {
                return Err(invalid(
                    "--pool (WEIR_POOLS)",
                    pool,
                    format!(
                        "host bits are set: write {}/{}",
                        net.network(),
                        net.prefix()
                    ),
                ));
            }
            let (family, block) = if net.is_ipv4() {
                ("IPv4", self.block_size_v4)
            } else {
                ("IPv6", self.block_size_v6)
            };
            if families.contains(&family) {
                return Err(invalid(
                    "--pool (WEIR_POOLS)",
                    pool,
                    format!(
                        "one pool per family: a second {family} pool goes through `weir ipam pool add`"
                    ),
                ));
            }
            families.push(family);
            if net.prefix() > block {
                return Err(invalid(
                    "--pool (WEIR_POOLS)",
                    pool,
                    format!(
                        "the pool is smaller than one /{block} block: widen it or lower --block-size"
                    ),
                ));
            }
        }
        if !(16..=32).contains(&self.block_size_v4) {
            return Err(invalid(
                "--block-size-v4",
                &self.block_size_v4.to_string(),
                "must be between 16 and 32",
            ));
        }
        if !(112..=128).contains(&self.block_size_v6) {
            return Err(invalid(
                "--block-size-v6",
                &self.block_size_v6.to_string(),
                "must be between 112 and 128",
            ));
        }
        for ifname in &self.prefilter_interfaces {
            if ifname.is_empty() || ifname.len() > 15 || ifname.contains(['/', ' ', '\0']) {
                return Err(invalid(
                    "--prefilter-interfaces",
                    ifname,
                    "interface names are 1-15 characters without '/' or spaces",
                ));
            }
        }
        let mut masquerade_interfaces = Vec::new();
        for item in &self.masquerade_interfaces {
            let spec = crate::dataplane::masquerade::parse_spec(item).ok_or_else(|| {
                invalid(
                    "--masquerade-interfaces (WEIR_MASQUERADE_INTERFACES)",
                    item,
                    "write IFNAME or IFNAME=IPV4-ADDRESS, e.g. eth0 or eth0=192.0.2.10 (names are 1-15 characters without '/' or spaces)",
                )
            })?;
            masquerade_interfaces.push(spec);
        }
        let mut nodeport_interfaces = Vec::new();
        for item in &self.nodeport_interfaces {
            let spec = crate::dataplane::masquerade::parse_spec(item).ok_or_else(|| {
                invalid(
                    "--nodeport-interfaces (WEIR_NODEPORT_INTERFACES)",
                    item,
                    "write IFNAME or IFNAME=IPV4-ADDRESS, e.g. eth0 or eth0=192.0.2.10 (names are 1-15 characters without '/' or spaces)",
                )
            })?;
            nodeport_interfaces.push(spec);
        }
        let host_interfaces = crate::dataplane::masquerade::host_interfaces(
            &masquerade_interfaces,
            &nodeport_interfaces,
        )
        .map_err(|ifname| {
            invalid(
                "--nodeport-interfaces (WEIR_NODEPORT_INTERFACES)",
                &ifname,
                "the interface is also in --masquerade-interfaces with another address; name one address (or none) for it in both",
            )
        })?;
        let mut prefilter_deny = Vec::new();
        for cidr in &self.prefilter_deny {
            let net = crate::dataplane::prefilter::parse_cidr(cidr).ok_or_else(|| {
                invalid(
                    "--prefilter-deny (WEIR_PREFILTER_DENY)",
                    cidr,
                    "use CIDRs such as 192.0.2.0/24 or 2001:db8::/32, comma-separated",
                )
            })?;
            prefilter_deny.push(net.to_string());
        }
        if let Some(file) = &self.kubeconfig {
            if !file.is_absolute() {
                return Err(invalid(
                    "--kubeconfig (WEIR_KUBECONFIG)",
                    &file.display().to_string(),
                    "use an absolute path",
                ));
            }
            if self.source != SourceMode::Kubernetes {
                return Err(invalid(
                    "--kubeconfig (WEIR_KUBECONFIG)",
                    &file.display().to_string(),
                    "it is read only with --source kubernetes: add that flag or drop this one",
                ));
            }
        }
        if let Some(file) = &self.prefilter_deny_file
            && !file.is_absolute()
        {
            return Err(invalid(
                "--prefilter-deny-file (WEIR_PREFILTER_DENY_FILE)",
                &file.display().to_string(),
                "use an absolute path",
            ));
        }
        if self.allocation_expiry == 0 || self.allocation_expiry > 86_400 {
            return Err(invalid(
                "--allocation-expiry (WEIR_ALLOCATION_EXPIRY)",
                &self.allocation_expiry.to_string(),
                "must be between 1 and 86400 seconds",
            ));
        }
        if self.refresh_interval > 3600 {
            return Err(invalid(
                "--refresh-interval (WEIR_REFRESH_INTERVAL)",
                &self.refresh_interval.to_string(),
                "must be at most 3600 seconds (0 turns the periodic refresh off)",
            ));
        }
        if self.identity_gc_grace < 4 || self.identity_gc_grace > 30 * 86_400 {
            return Err(invalid(
                "--identity-gc-grace (WEIR_IDENTITY_GC_GRACE)",
                &self.identity_gc_grace.to_string(),
                "must be between 4 seconds and 30 days (2592000)",
            ));
        }
        for (flag, value) in [
            (
                "--ct-sweep-interval (WEIR_CT_SWEEP_INTERVAL)",
                self.ct_sweep_interval,
            ),
            (
                "--ct-timeout-tcp-syn (WEIR_CT_TIMEOUT_TCP_SYN)",
                self.ct_timeout_tcp_syn,
            ),
            (
                "--ct-timeout-tcp-established (WEIR_CT_TIMEOUT_TCP_ESTABLISHED)",
                self.ct_timeout_tcp_established,
            ),
            (
                "--ct-timeout-tcp-closed (WEIR_CT_TIMEOUT_TCP_CLOSED)",
                self.ct_timeout_tcp_closed,
            ),
            (
                "--ct-timeout-icmp (WEIR_CT_TIMEOUT_ICMP)",
                self.ct_timeout_icmp,
            ),
            (
                "--ct-timeout-other (WEIR_CT_TIMEOUT_OTHER)",
                self.ct_timeout_other,
            ),
        ] {
            if value == 0 || value > 7 * 86_400 {
                return Err(invalid(
                    flag,
                    &value.to_string(),
                    "must be between 1 and 604800 seconds",
                ));
            }
        }
        if !(1024..=16_777_216).contains(&self.ct_max_entries) {
            return Err(invalid(
                "--ct-max-entries (WEIR_CT_MAX_ENTRIES)",
                &self.ct_max_entries.to_string(),
                "must be between 1024 and 16777216",
            ));
        }
        let ebpf_object = match &self.ebpf_object {
            Some(path) => {
                let path = absolute("--ebpf-object (WEIR_EBPF_OBJECT_FILE)", path)?;
                if !path.is_file() {
                    return Err(invalid(
                        "--ebpf-object (WEIR_EBPF_OBJECT_FILE)",
                        &path.display().to_string(),
                        "no such file: build one with `cargo xtask build-ebpf`",
                    ));
                }
                Some(path)
            }
            None => None,
        };
        if !crate::setup::host::CNI_VERSIONS.contains(&self.cni_version.as_str()) {
            return Err(invalid(
                "--cni-version (WEIR_CNI_VERSION)",
                &self.cni_version,
                format!(
                    "weir-cni speaks {}; use 1.0.0 unless every runtime on the node reads 1.1.0",
                    crate::setup::host::CNI_VERSIONS.join(" and ")
                ),
            ));
        }
        if !(3..=86_400).contains(&self.node_expiry) {
            return Err(invalid(
                "--node-expiry (WEIR_NODE_EXPIRY)",
                &self.node_expiry.to_string(),
                "must be between 3 and 86400 seconds",
            ));
        }
        if let Some(bad) = self
            .node_addresses
            .iter()
            .find(|a| a.is_unspecified() || a.is_loopback() || a.is_multicast())
        {
            return Err(invalid(
                "--node-address (WEIR_NODE_ADDRESSES)",
                &bad.to_string(),
                "use an address other nodes reach this node at (not unspecified, loopback or multicast)",
            ));
        }
        self.vxlan.check()?;
        let socket_lb_cgroup = match &self.socket_lb_cgroup {
            Some(dir) if !dir.is_absolute() || dir.as_os_str().is_empty() => {
                return Err(invalid(
                    "--socket-lb-cgroup (WEIR_SOCKET_LB_CGROUP)",
                    &dir.display().to_string(),
                    "give the absolute path of a cgroup v2 directory, e.g. /sys/fs/cgroup",
                ));
            }
            other => other.clone(),
        };
        if socket_lb_cgroup.is_none() && self.socket_lb_scope != SocketLbScope::All {
            return Err(invalid(
                "--socket-lb-scope (WEIR_SOCKET_LB_SCOPE)",
                &self.socket_lb_scope.to_string(),
                "it applies to socket LB: give --socket-lb-cgroup too, or leave the scope out",
            ));
        }
        let metrics = self.metrics.parse().map_err(|_| {
            invalid(
                "--metrics (WEIR_METRICS)",
                &self.metrics,
                "use ADDRESS:PORT, e.g. 127.0.0.1:9972",
            )
        })?;
        Ok(Config {
            source: self.source,
            kubeconfig: self.kubeconfig.clone(),
            paths,
            datastore,
            node,
            node_labels,
            pools: self.pools.clone(),
            block_size_v4: self.block_size_v4,
            block_size_v6: self.block_size_v6,
            prefilter_interfaces: self.prefilter_interfaces.clone(),
            prefilter_deny,
            prefilter_deny_file: self.prefilter_deny_file.clone(),
            masquerade_interfaces,
            nodeport_interfaces,
            host_interfaces,
            tc_attach: self.tc_attach,
            metrics,
            allocation_expiry: std::time::Duration::from_secs(self.allocation_expiry),
            ct_sweep_interval: std::time::Duration::from_secs(self.ct_sweep_interval),
            refresh_interval: std::time::Duration::from_secs(self.refresh_interval),
            identity_gc_grace: std::time::Duration::from_secs(self.identity_gc_grace),
            ct_timeouts: crate::dataplane::conntrack::CtTimeouts {
                tcp_syn: std::time::Duration::from_secs(self.ct_timeout_tcp_syn),
                tcp_established: std::time::Duration::from_secs(self.ct_timeout_tcp_established),
                tcp_closed: std::time::Duration::from_secs(self.ct_timeout_tcp_closed),
                icmp: std::time::Duration::from_secs(self.ct_timeout_icmp),
                other: std::time::Duration::from_secs(self.ct_timeout_other),
            },
            ct_max_entries: self.ct_max_entries,
            ebpf_object,
            cni_version: self.cni_version.clone(),
            routing: self.routing,
            host_routing: self.host_routing,
            socket_lb_cgroup,
            socket_lb_scope: self.socket_lb_scope,
            node_addresses: self.node_addresses.clone(),
            node_expiry: std::time::Duration::from_secs(self.node_expiry),
            vxlan: self.vxlan.clone(),
        })
    }
}

fn validate_datastore(spec: &str) -> Result<String, ConfigError> {
    let flag = "--datastore (WEIR_DATASTORE)";
    match spec.split_once(':') {
        Some(("embedded", path)) if path.starts_with('/') => Ok(spec.to_owned()),
        Some(("etcd", urls)) if !urls.is_empty() => Ok(spec.to_owned()),
        None if spec == "kubernetes" => Ok(spec.to_owned()),
        _ => Err(invalid(
            flag,
            spec,
            "use embedded:/ABSOLUTE/PATH, etcd:URL[,URL…] or kubernetes",
        )),
    }
}

fn valid_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
}

fn hostname() -> Option<String> {
    let name = nix::unistd::gethostname().ok()?.into_string().ok()?;
    let name = name.to_ascii_lowercase();
    valid_node_name(&name).then_some(name)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        agent: AgentArgs,
    }

    fn parse(args: &[&str]) -> Result<Config, ConfigError> {
        let mut argv = vec!["weir"];
        argv.extend_from_slice(args);
        Cli::parse_from(argv).agent.validate()
    }

    #[test]
    fn defaults_validate() {
        let config = parse(&["--node", "n1"]).expect("defaults are valid");
        assert_eq!(config.paths, Paths::default());
        assert_eq!(config.datastore, "embedded:/var/lib/weir/ipam.redb");
        assert!(config.prefilter_interfaces.is_empty());
        assert!(
            config.masquerade_interfaces.is_empty(),
            "no interface masquerades unless named"
        );
        let masq = parse(&[
            "--node",
            "n1",
            "--masquerade-interfaces",
            "eth0,eth1=192.0.2.10",
        ])
        .expect("names and name=address are valid");
        assert_eq!(
            serde_json::to_value(&masq.masquerade_interfaces).expect("serialises"),
            serde_json::json!([
                {"ifname": "eth0", "address": null},
                {"ifname": "eth1", "address": "192.0.2.10"}
            ])
        );
        assert_eq!(config.metrics.port(), 9972);
        let json = serde_json::to_value(&config).expect("config serialises");
        assert_eq!(json["paths"]["bpf_root"], "/sys/fs/bpf/weir");
        assert_eq!(config.cni_version, "1.0.0", "a version every runtime reads");
        // Durations dump as the seconds their flags take.
        assert_eq!(json["allocation_expiry"], 600);
        assert_eq!(json["ct_timeouts"]["tcp_established"], 21_600);
        let deny = parse(&[
            "--node",
            "n1",
            "--prefilter-deny",
            "10.1.2.3/16,2001:db8::1",
        ])
        .expect("CIDRs and addresses are valid");
        assert_eq!(deny.prefilter_deny, vec!["10.1.0.0/16", "2001:db8::1/128"]);
        assert_eq!(json["source"], "standalone");
        let kube = parse(&[
            "--node",
            "n1",
            "--source",
            "kubernetes",
            "--kubeconfig",
            "/etc/weir/kubeconfig",
        ])
        .expect("a kubeconfig with the kubernetes source is valid");
        let dumped = serde_json::to_value(&kube).expect("json");
        assert_eq!(dumped["source"], "kubernetes");
        let again = parse(&[
            "--node",
            "n1",
            "--source",
            dumped["source"].as_str().expect("a string"),
            "--kubeconfig",
            dumped["kubeconfig"].as_str().expect("a path"),
        ])
        .expect("the dump parses back");
        assert_eq!(serde_json::to_value(&again).expect("json"), dumped);
        let raised = parse(&["--node", "n1", "--cni-version", "1.1.0"]).expect("1.1.0 is valid");
        assert_eq!(raised.cni_version, "1.1.0");
        // The VXLAN flags dump with their defaults (the underlay: found at start) and parse back.
        assert_eq!(json["vxlan"]["device"], paths::DEFAULT_VXLAN_DEVICE);
        assert_eq!(json["vxlan"]["vni"], paths::DEFAULT_VXLAN_VNI);
        assert!(json["vxlan"]["underlay"].is_null());
        let vx = parse(&[
            "--node",
            "n1",
            "--routing",
            "vxlan",
            "--vxlan-vni",
            "9",
            "--vxlan-underlay",
            "ens3",
        ])
        .expect("vxlan flags are valid");
        assert_eq!((vx.routing, vx.vxlan.vni), (RoutingMode::Vxlan, 9));
        assert_eq!(vx.vxlan.underlay.as_deref(), Some("ens3"));
    }

    /// Every duration dumps as a value its own flag takes back unchanged.
    #[test]
    fn dumped_durations_are_what_their_flags_take() {
        let base = ["--node", "n1"];
        let custom = [
            ("--allocation-expiry", "allocation_expiry", "90"),
            ("--ct-sweep-interval", "ct_sweep_interval", "7"),
            ("--refresh-interval", "refresh_interval", "3"),
            ("--identity-gc-grace", "identity_gc_grace", "120"),
            ("--node-expiry", "node_expiry", "12"),
            ("--ct-timeout-tcp-syn", "ct_timeouts.tcp_syn", "30"),
            (
                "--ct-timeout-tcp-established",
                "ct_timeouts.tcp_established",
                "7200",
            ),
            ("--ct-timeout-tcp-closed", "ct_timeouts.tcp_closed", "5"),
            ("--ct-timeout-icmp", "ct_timeouts.icmp", "3"),
            ("--ct-timeout-other", "ct_timeouts.other", "40"),
        ];
        let mut args: Vec<&str> = base.to_vec();
        for (flag, _, value) in &custom {
            args.extend([*flag, *value]);
        }
        let first = serde_json::to_value(parse(&args).expect("valid")).expect("json");
        let mut again: Vec<String> = base.iter().map(|s| (*s).to_owned()).collect();
        for (flag, field, value) in &custom {
            let dumped = field.split('.').fold(&first, |v, key| &v[key]);
            assert_eq!(
                dumped.to_string(),
                *value,
                "{field} dumps as its flag's value"
            );
            again.extend([(*flag).to_owned(), dumped.to_string()]);
        }
        let again: Vec<&str> = again.iter().map(String::as_str).collect();
        let second =
            serde_json::to_value(parse(&again).expect("the dump parses back")).expect("json");
        assert_eq!(first, second);
    }

    #[test]
    fn bad_values_name_the_flag() {
        for (args, flag) in [
            (vec!["--node", "n1", "--bpf-root", "relative"], "--bpf-root"),
            (vec!["--node", "n1", "--bpf-root", "/tmp/x"], "--bpf-root"),
            (vec!["--node", "N_1"], "--node"),
            (
                vec!["--node", "n1", "--datastore", "mysql:x"],
                "--datastore",
            ),
            (
                vec!["--node", "n1", "--node-labels", "novalue"],
                "--node-labels",
            ),
            (
                vec!["--node", "n1", "--block-size-v4", "8"],
                "--block-size-v4",
            ),
            (vec!["--node", "n1", "--metrics", "nope"], "--metrics"),
            (
                vec!["--node", "n1", "--socket-lb-cgroup", "sys/fs/cgroup"],
                "--socket-lb-cgroup",
            ),
            (
                vec!["--node", "n1", "--socket-lb-scope", "host"],
                "--socket-lb-scope",
            ),
            (
                vec!["--node", "n1", "--prefilter-interfaces", "a/b"],
                "--prefilter-interfaces",
            ),
            (
                vec![
                    "--node",
                    "n1",
                    "--masquerade-interfaces",
                    "eth0=2001:db8::1",
                ],
                "--masquerade-interfaces",
            ),
            (
                vec!["--node", "n1", "--masquerade-interfaces", "a/b"],
                "--masquerade-interfaces",
            ),
            (
                vec!["--node", "n1", "--prefilter-deny", "10.0.0.0/33"],
                "--prefilter-deny",
            ),
            (
                vec!["--node", "n1", "--prefilter-deny-file", "deny.txt"],
                "--prefilter-deny-file",
            ),
            (
                vec!["--node", "n1", "--ct-max-entries", "10"],
                "--ct-max-entries",
            ),
            (
                vec!["--node", "n1", "--ebpf-object", "weir.o"],
                "--ebpf-object",
            ),
            (
                vec!["--node", "n1", "--ebpf-object", "/nonexistent/weir.o"],
                "--ebpf-object",
            ),
            (
                vec!["--node", "n1", "--cni-version", "0.4.0"],
                "--cni-version",
            ),
            (
                vec!["--node", "n1", "--cni-version", "1.2"],
                "--cni-version",
            ),
            (vec!["--node", "n1", "--pool", "10.244.1.0/16"], "--pool"),
            (
                vec!["--node", "n1", "--vxlan-device", "weirtun"],
                "--vxlan-device",
            ),
            (vec!["--node", "n1", "--vxlan-vni", "0"], "--vxlan-vni"),
            (vec!["--node", "n1", "--vxlan-port", "0"], "--vxlan-port"),
            (
                vec!["--node", "n1", "--vxlan-underlay", ""],
                "--vxlan-underlay",
            ),
            (
                vec!["--node", "n1", "--pool", "10.244.0.0/16,10.245.0.0/16"],
                "--pool",
            ),
            (vec!["--node", "n1", "--pool", "10.244.0.0/28"], "--pool"),
            (
                vec!["--node", "n1", "--kubeconfig", "/etc/kubeconfig"],
                "--kubeconfig",
            ),
            (
                vec![
                    "--node",
                    "n1",
                    "--source",
                    "kubernetes",
                    "--kubeconfig",
                    "kubeconfig",
                ],
                "--kubeconfig",
            ),
            (
                vec!["--node", "n1", "--proc-sys-net", "proc/sys/net"],
                "--proc-sys-net",
            ),
        ] {
            let err = parse(&args)
                .expect_err("invalid flags are rejected")
                .to_string();
            assert!(err.contains(flag), "{err} does not name {flag}");
        }
    }
}
