//! Several nodes on one kernel (DESIGN.md → "Nodes and routing"): an infra namespace holding the underlay
//! bridge, one namespace per node joined to it by a veth (`192.0.2.N/24`, forwarding on), and per node one
//! "pod" namespace behind a veth (`10.244.N.10/32` in block `10.244.N.0/24`, default route via the node's
//! `169.254.1.1` on the pod veth, a host route to the pod on the node). Nothing routes between the nodes'
//! blocks until a route driver does. Every namespace and link is `wt…` and goes with the lab.

use std::{
    net::{IpAddr, Ipv4Addr},
    thread::sleep,
    time::{Duration, Instant},
};

use ipnetwork::{IpNetwork, Ipv4Network};

use crate::{names, netns::NetNs};

/// One node of the lab.
#[derive(Debug)]
pub struct LabNode {
    /// The node's namespace.
    pub ns: NetNs,
    /// Its underlay link (inside `ns`).
    pub underlay: String,
    /// Its underlay address.
    pub address: Ipv4Addr,
    /// Its pod block.
    pub block: Ipv4Network,
    /// Its VTEP address (the block's `.1`, never a pod's).
    pub vtep: Ipv4Addr,
    /// The pod's namespace.
    pub pod: NetNs,
    /// The pod's address.
    pub pod_ip: Ipv4Addr,
    /// The node side of the pod's veth (inside `ns`).
    pub pod_link: String,
}

/// The infra namespace and its nodes.
#[derive(Debug)]
pub struct NodeLab {
    /// The nodes (dropped before the bridge's namespace).
    pub nodes: Vec<LabNode>,
    /// The namespace of the underlay bridge.
    pub infra: NetNs,
}

fn sh(ns: &NetNs, cmd: &str) {
    let args: Vec<&str> = cmd.split_whitespace().collect();
    ns.exec(&args);
}

impl NodeLab {
    /// `n` nodes (at most 200) on one bridge; `pod_link` names each node's pod veth (`None`: a `wt…` name;
    /// a `weir…` name makes it a workload link an agent attaches to).
    #[must_use]
    pub fn new(n: u8, pod_link: impl Fn(u8) -> Option<String>) -> Self {
        assert!((1..=200).contains(&n), "1 to 200 nodes");
        let infra = NetNs::new();
        let bridge = names::unique("br");
        sh(&infra, &format!("ip link add {bridge} type bridge"));
        sh(&infra, &format!("ip link set {bridge} up"));
        let nodes = (1..=n)
            .map(|i| {
                let ns = NetNs::new();
                let (underlay, port) = (names::unique("ul"), names::unique("bp"));
                infra.exec(&[
                    "ip",
                    "link",
                    "add",
                    &port,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    &underlay,
                    "netns",
                    ns.name(),
                ]);
                sh(&infra, &format!("ip link set {port} master {bridge} up"));
                let address = Ipv4Addr::new(192, 0, 2, i);
                sh(&ns, &format!("ip addr add {address}/24 dev {underlay}"));
                sh(&ns, &format!("ip link set {underlay} up"));
                sh(&ns, "sysctl -qw net.ipv4.ip_forward=1");
                let block = Ipv4Network::new(Ipv4Addr::new(10, 244, i, 0), 24).expect("block");
                let pod = NetNs::new();
                let pod_link = pod_link(i).unwrap_or_else(|| names::unique("pv"));
                ns.exec(&[
                    "ip",
                    "link",
                    "add",
                    &pod_link,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "eth0",
                    "netns",
                    pod.name(),
                ]);
                let pod_ip = Ipv4Addr::new(10, 244, i, 10);
                sh(&ns, &format!("ip addr add 169.254.1.1/32 dev {pod_link}"));
                sh(&ns, &format!("ip link set {pod_link} up"));
                sh(
                    &ns,
                    &format!("ip route add {pod_ip}/32 dev {pod_link} scope link"),
                );
                sh(&pod, &format!("ip addr add {pod_ip}/32 dev eth0"));
                sh(&pod, "ip link set eth0 up");
                sh(&pod, "ip route add 169.254.1.1/32 dev eth0 scope link");
                sh(&pod, "ip route add default via 169.254.1.1 dev eth0");
                LabNode {
                    ns,
                    underlay,
                    address,
                    block,
                    vtep: Ipv4Addr::new(10, 244, i, 1),
                    pod,
                    pod_ip,
                    pod_link,
                }
            })
            .collect();
        Self { nodes, infra }
    }

    /// Every node but `i`, as (underlay address, VTEP address, blocks).
    #[must_use]
    pub fn remotes_of(&self, i: usize) -> Vec<(IpAddr, Ipv4Addr, Vec<IpNetwork>)> {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, n)| (IpAddr::V4(n.address), n.vtep, vec![IpNetwork::V4(n.block)]))
            .collect()
    }
}

/// Whether a TCP connection from `from` (a namespace) to `to:port` completes within `bound`.
#[must_use]
pub fn tcp_connects(from: &NetNs, to: Ipv4Addr, port: u16, bound: Duration) -> bool {
    from.run(move || std::net::TcpStream::connect_timeout(&(to, port).into(), bound).is_ok())
}

/// Polls `f` until it is true or `bound` passes; whether it became true.
pub fn eventually(bound: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if f() {
            return true;
        }
        if start.elapsed() > bound {
            return false;
        }
        sleep(Duration::from_millis(50));
    }
}

/// The agent's own link watcher ([`agent::kernel::real::netlink_links::Netlink`]) in the calling
/// thread's network namespace (open it inside [`NetNs::run`]): what it reports when something of weir's
/// is deleted from outside.
pub struct DriftWatch {
    runtime: tokio::runtime::Runtime,
    watch: agent::kernel::LinkWatch,
}

impl DriftWatch {
    /// Subscribes in the calling thread's namespace (its dump is dropped).
    #[must_use]
    pub fn open() -> Self {
        use agent::kernel::LinkIo as _;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let watch = runtime
            .block_on(agent::kernel::real::netlink_links::Netlink.watch())
            .expect("the link watcher subscribes");
        Self { runtime, watch }
    }

    /// The first drift reported within `bound` (`None`: none).
    pub fn next_drift(&mut self, bound: Duration) -> Option<agent::kernel::Drift> {
        use futures_util::StreamExt as _;
        let events = &mut self.watch.events;
        self.runtime.block_on(async {
            tokio::time::timeout(bound, async {
                while let Some(event) = events.next().await {
                    if let Ok(agent::kernel::LinkEvent::Drift(drift)) = event {
                        return Some(drift);
                    }
                }
                None
            })
            .await
            .ok()
            .flatten()
        })
    }
}

/// Runs `command` (program and arguments) in the calling thread's network namespace; panics unless it
/// succeeds.
pub fn run_here(command: &[&str]) {
    let out = std::process::Command::new(command[0])
        .args(&command[1..])
        .output()
        .expect("spawn");
    assert!(
        out.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
