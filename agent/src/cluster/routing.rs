//! Routes to remote nodes' blocks, kept by the loop: the nodes source's deltas update the cluster's nodes,
//! which give [`crate::dataplane::node_routes::NodeRoutes`] its node view (this node, every other live node
//! with its address, VTEP and blocks); it drives the VXLAN device (vxlan mode) and then the route driver, in
//! either mode. Nothing is reconciled before the source's first full listing, so a restart never sweeps
//! routes it has not yet been told about. A node's routes follow its record, not its heartbeat (fail
//! static): a silent node (heartbeat older than its expiry, or a Node not Ready for `--node-expiry`) stays
//! in the view, its pods' datapath keeps running and stays reachable, and it shows as `silent` in the
//! status; only a node that is gone (record deleted, `weir ipam release-node`, Node object deleted) leaves
//! the view, and its routes (and tunnel entries) are swept.
//!
//! A node's VTEP address is derived from its record alone: its first IPv4 address ([`vtep_of`]), so no
//! record carries more than its addresses, Node objects included, and traffic from a node's host through
//! the tunnel has that node's own address as its source.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr},
};

use ipnetwork::IpNetwork;

use super::{ClusterNode, NodeDelta, NodeSource};
use crate::dataplane::{
    node_routes::{self, LocalNode, NodeRoutesError, RemoteNode},
    routes::NextHop,
};

/// A node as `weir status` shows it (the API contract's).
pub use weir_api::NodeStatus;

/// A node's VTEP address (vxlan mode): its first IPv4 address, `None` without one.
#[must_use]
pub fn vtep_of(addresses: &[IpAddr]) -> Option<Ipv4Addr> {
    addresses.iter().find_map(|a| match a {
        IpAddr::V4(v) => Some(*v),
        IpAddr::V6(_) => None,
    })
}

/// The node view of node `local`: itself (unspecified address and no VTEP until its record is known) and
/// every remote node with a record, silent or not, once per address family it has an address and blocks of. A block of this node,
/// or a block already claimed by another node (two nodes claiming one block: the first by name wins), is
/// left out.
#[must_use]
pub fn node_view<'a>(
    local: &str,
    nodes: impl IntoIterator<Item = &'a ClusterNode>,
) -> (LocalNode, Vec<RemoteNode>) {
    let nodes: Vec<&ClusterNode> = nodes.into_iter().collect();
    let me = nodes.iter().find(|n| n.name == local);
    let local_node = LocalNode {
        name: local.to_owned(),
        address: me
            .and_then(|n| {
                vtep_of(&n.addresses)
                    .map(IpAddr::V4)
                    .or(n.addresses.first().copied())
            })
            .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        vtep: me.and_then(|n| vtep_of(&n.addresses)),
    };
    let mut claimed: BTreeSet<IpNetwork> = me
        .map(|n| n.blocks.iter().copied().collect())
        .unwrap_or_default();
    let mut remotes = Vec::new();
    for node in nodes.iter().filter(|n| n.name != local) {
        let blocks: Vec<IpNetwork> = node
            .blocks
            .iter()
            .copied()
            .filter(|b| claimed.insert(*b))
            .collect();
        for v4 in [true, false] {
            let Some(address) = node.addresses.iter().find(|a| a.is_ipv4() == v4) else {
                continue;
            };
            let family: Vec<IpNetwork> = blocks
                .iter()
                .copied()
                .filter(|b| b.is_ipv4() == v4)
                .collect();
            if family.is_empty() {
                continue;
            }
            remotes.push(RemoteNode {
                name: node.name.clone(),
                address: *address,
                vtep: if v4 { vtep_of(&node.addresses) } else { None },
                blocks: family,
            });
        }
    }
    (local_node, remotes)
}

/// `nodes` with their last-seen ages as of now (the snapshot's are as of its publication).
#[must_use]
pub fn seen_now(nodes: &[NodeStatus]) -> Vec<NodeStatus> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    nodes.iter().cloned().map(|n| n.seen_at(now)).collect()
}

/// The cluster's nodes and the routing that follows them.
pub struct NodeRoutes {
    local: String,
    nodes: BTreeMap<String, ClusterNode>,
    synced: bool,
    routes: node_routes::NodeRoutes,
    source: NodeSource,
}

impl NodeRoutes {
    /// Routes for node `local` through `routes` (native or vxlan).
    #[must_use]
    pub fn new(local: &str, routes: node_routes::NodeRoutes) -> Self {
        Self {
            local: local.to_owned(),
            nodes: BTreeMap::new(),
            synced: false,
            routes,
            source: NodeSource::Etcd,
        }
    }

    /// The same, its records coming from `source` (what the status says).
    #[must_use]
    pub fn with_source(mut self, source: NodeSource) -> Self {
        self.source = source;
        self
    }

    /// Takes one delta; the node view follows.
    pub fn on_delta(&mut self, delta: NodeDelta) {
        match delta {
            NodeDelta::Upsert(node) => {
                let was = self.nodes.get(&node.name).map(|n| n.alive);
                if node.name != self.local {
                    if !node.alive && was != Some(false) {
                        tracing::warn!(node = %node.name, heartbeat = node.heartbeat, "node silent: no heartbeat within its expiry; its routes stay until its record is deleted (weir ipam release-node)");
                    } else if node.alive && was == Some(false) {
                        tracing::info!(node = %node.name, heartbeat = node.heartbeat, "node heard from again");
                    }
                }
                self.nodes.insert(node.name.clone(), node);
            }
            NodeDelta::Gone(name) => {
                if self.nodes.remove(&name).is_some() {
                    tracing::info!(node = %name, "node record deleted; its routes are swept");
                }
            }
            NodeDelta::Synced => self.synced = true,
        }
        let (local, remotes) = node_view(&self.local, self.nodes.values());
        self.routes.set_nodes(local, remotes);
    }

    /// True when an apply has route work to do (never before the first full listing).
    #[must_use]
    pub fn is_dirty(&self) -> bool {
        self.synced && self.routes.is_dirty()
    }

    /// The next apply reads the routes (and the VXLAN device) back and repairs drift.
    pub fn refresh(&mut self) {
        self.routes.resync();
    }

    /// Reconciles the VXLAN device (vxlan mode) and the routes (nothing before the first full listing).
    pub fn apply(&mut self) -> Result<(), NodeRoutesError> {
        if !self.synced {
            return Ok(());
        }
        self.routes.apply()
    }

    /// Every known node as the status shows it.
    #[must_use]
    pub fn status(&self) -> Vec<NodeStatus> {
        let desired = self.routes.desired_routes();
        self.nodes
            .values()
            .map(|n| NodeStatus {
                name: n.name.clone(),
                addresses: n.addresses.clone(),
                blocks: n.blocks.clone(),
                routes: if n.name == self.local {
                    0
                } else {
                    n.blocks
                        .iter()
                        .filter(|b| {
                            desired.get(b).is_some_and(|hop| match hop {
                                NextHop::Via(via) | NextHop::Device { via, .. } => {
                                    n.addresses.contains(via)
                                }
                            })
                        })
                        .count()
                },
                health: if n.name == self.local {
                    NodeStatus::LOCAL
                } else if n.alive {
                    NodeStatus::ALIVE
                } else {
                    NodeStatus::SILENT
                }
                .to_owned(),
                heartbeat: n.heartbeat,
                last_seen_secs: None,
                source: self.source,
            })
            .collect()
    }

    /// The routing (its mode, its drivers' counters).
    #[must_use]
    pub fn routing(&self) -> &node_routes::NodeRoutes {
        &self.routes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        dataplane::{node_routes::RoutingMode, vxlan::VxlanConfig},
        kernel::{Underlay, fake::FakeKernel},
    };

    fn native(kernel: &FakeKernel) -> node_routes::NodeRoutes {
        node_routes::NodeRoutes::new(
            RoutingMode::Native,
            Box::new(kernel.clone()),
            Box::new(kernel.clone()),
            None,
        )
    }

    fn node(name: &str, addr: &str, blocks: &[&str]) -> ClusterNode {
        ClusterNode {
            name: name.into(),
            addresses: vec![addr.parse().expect("ip")],
            labels: BTreeMap::new(),
            blocks: blocks.iter().map(|b| b.parse().expect("cidr")).collect(),
            alive: true,
            heartbeat: 1,
        }
    }

    fn net(s: &str) -> IpNetwork {
        s.parse().expect("cidr")
    }

    #[test]
    fn remote_blocks_are_routed_a_silent_node_keeps_them_and_a_gone_one_is_swept() {
        let kernel = FakeKernel::default();
        let mut routes = NodeRoutes::new("a", native(&kernel));
        // A leftover of a node that no longer exists: swept once in sync, never before.
        kernel.routes().routes.insert(
            net("10.9.0.0/26"),
            NextHop::Via("192.0.2.9".parse().expect("ip")),
        );
        routes.on_delta(NodeDelta::Upsert(node(
            "a",
            "192.0.2.1",
            &["10.244.0.0/26"],
        )));
        routes.on_delta(NodeDelta::Upsert(node(
            "b",
            "192.0.2.2",
            &["10.244.0.64/26", "fd00::/122"],
        )));
        routes.on_delta(NodeDelta::Upsert(node(
            "c",
            "192.0.2.3",
            &["10.244.0.128/26"],
        )));
        assert!(
            !routes.is_dirty(),
            "nothing is reconciled before the first listing"
        );
        routes.apply().expect("apply");
        assert_eq!(
            kernel.routes().routes.len(),
            1,
            "the leftover is not swept yet"
        );
        routes.on_delta(NodeDelta::Synced);
        assert!(routes.is_dirty());
        routes.apply().expect("apply");
        let via = |s: &str| NextHop::Via(s.parse().expect("ip"));
        assert_eq!(
            kernel.routes().routes,
            BTreeMap::from([
                (net("10.244.0.64/26"), via("192.0.2.2")),
                (net("10.244.0.128/26"), via("192.0.2.3")),
            ]),
            "remote blocks only, of the families the node has addresses of; the leftover swept"
        );
        let status = routes.status();
        assert_eq!(
            status
                .iter()
                .map(|s| (s.name.as_str(), s.routes, s.health.as_str()))
                .collect::<Vec<_>>(),
            [("a", 0, "local"), ("b", 1, "alive"), ("c", 1, "alive")]
        );

        // c falls silent: its routes stay (fail static), its health says so.
        let mut silent = node("c", "192.0.2.3", &["10.244.0.128/26"]);
        silent.alive = false;
        routes.on_delta(NodeDelta::Upsert(silent));
        routes.apply().expect("apply");
        assert_eq!(
            kernel.routes().routes.len(),
            2,
            "a silent node keeps its routes"
        );
        assert_eq!(
            routes
                .status()
                .iter()
                .map(|s| (s.name.as_str(), s.routes, s.health.as_str()))
                .collect::<Vec<_>>(),
            [("a", 0, "local"), ("b", 1, "alive"), ("c", 1, "silent")]
        );
        // b and c are deleted: both are swept.
        routes.on_delta(NodeDelta::Gone("b".into()));
        routes.on_delta(NodeDelta::Gone("c".into()));
        routes.apply().expect("apply");
        assert!(kernel.routes().routes.is_empty());

        // A restarted agent over the same table and nodes writes nothing.
        routes.on_delta(NodeDelta::Upsert(node(
            "d",
            "192.0.2.4",
            &["10.244.1.0/26"],
        )));
        routes.apply().expect("apply");
        let mut restarted = NodeRoutes::new("a", native(&kernel));
        for n in [
            node("a", "192.0.2.1", &["10.244.0.0/26"]),
            node("d", "192.0.2.4", &["10.244.1.0/26"]),
        ] {
            restarted.on_delta(NodeDelta::Upsert(n));
        }
        restarted.on_delta(NodeDelta::Synced);
        restarted.apply().expect("apply");
        let (stats, _) = restarted.routing().stats();
        assert_eq!((stats.writes, stats.deletes), (0, 0));
    }

    fn vxlan(kernel: &FakeKernel) -> node_routes::NodeRoutes {
        node_routes::NodeRoutes::new(
            RoutingMode::Vxlan(VxlanConfig {
                device: "wvx0".into(),
                vni: 87,
                port: 4789,
                underlay: "eth0".into(),
            }),
            Box::new(kernel.clone()),
            Box::new(kernel.clone()),
            None,
        )
    }

    #[test]
    fn vxlan_routes_go_through_the_device_via_each_nodes_own_address() {
        let kernel = FakeKernel::default();
        kernel.vxlan_table().underlays.insert(
            "eth0".into(),
            Underlay {
                ifindex: 2,
                mtu: 1500,
            },
        );
        let nodes = [
            node("a", "192.0.2.1", &["10.244.0.0/26"]),
            node("b", "192.0.2.2", &["10.244.0.64/26"]),
            node("c", "192.0.2.3", &["10.244.0.128/26", "10.244.1.0/26"]),
        ];
        let mut routes = NodeRoutes::new("a", vxlan(&kernel));
        for n in &nodes {
            routes.on_delta(NodeDelta::Upsert(n.clone()));
        }
        routes.on_delta(NodeDelta::Synced);
        assert!(routes.is_dirty());
        routes.apply().expect("apply");
        let link = kernel.vxlan_table().links["wvx0"].clone();
        let ifindex = link.ifindex;
        let want: BTreeMap<IpNetwork, NextHop> = nodes[1..]
            .iter()
            .flat_map(|n| {
                let via = n.addresses[0];
                n.blocks
                    .iter()
                    .map(move |b| (*b, NextHop::Device { ifindex, via }))
            })
            .collect();
        assert_eq!(kernel.routes().routes, want, "via each node's own address");
        assert_eq!(routes.routing().pod_mtu(), Some(1500 - 50));
        let t = kernel.vxlan_table();
        assert_eq!(
            t.addresses[&ifindex],
            BTreeSet::from(["192.0.2.1/32".parse().expect("cidr")]),
            "the local VTEP is this node's address"
        );
        let peers: BTreeSet<Ipv4Addr> = ["192.0.2.2", "192.0.2.3"]
            .iter()
            .map(|a| a.parse().expect("ip"))
            .collect();
        assert_eq!(
            t.fdb[&ifindex].values().copied().collect::<BTreeSet<_>>(),
            peers
        );
        assert_eq!(
            t.neighbours[&ifindex]
                .keys()
                .copied()
                .collect::<BTreeSet<_>>(),
            peers
        );
        drop(t);
        let status = routes.status();
        assert_eq!(
            status.iter().map(|s| s.routes).collect::<Vec<_>>(),
            [0, 1, 2]
        );

        // A restart over the same kernel and nodes writes nothing, on either side.
        let mut restarted = NodeRoutes::new("a", vxlan(&kernel));
        for n in &nodes {
            restarted.on_delta(NodeDelta::Upsert(n.clone()));
        }
        restarted.on_delta(NodeDelta::Synced);
        restarted.apply().expect("apply");
        let (r, v) = restarted.routing().stats();
        assert_eq!((r.writes, r.deletes, v.writes, v.deletes), (0, 0, 0, 0));
        assert!(!restarted.is_dirty());

        // c silent: its routes, forwarding and neighbour entries stay; removed: they are swept.
        let mut silent = nodes[2].clone();
        silent.alive = false;
        restarted.on_delta(NodeDelta::Upsert(silent));
        restarted.apply().expect("apply");
        assert_eq!(kernel.routes().routes.len(), 3);
        assert_eq!(kernel.vxlan_table().fdb[&ifindex].len(), 2);
        assert_eq!(kernel.vxlan_table().neighbours[&ifindex].len(), 2);
        restarted.on_delta(NodeDelta::Gone("c".into()));
        restarted.apply().expect("apply");
        assert_eq!(kernel.routes().routes.len(), 1);
        let t = kernel.vxlan_table();
        assert_eq!(t.fdb[&ifindex].len(), 1);
        assert_eq!(t.neighbours[&ifindex].len(), 1);
    }

    #[test]
    fn a_dual_stack_node_gets_both_families_and_a_claimed_block_goes_to_the_first() {
        let mut b = node("b", "192.0.2.2", &["10.244.0.64/26", "fd00::/122"]);
        b.addresses.push("2001:db8::2".parse().expect("ip"));
        let c = node("c", "192.0.2.3", &["10.244.0.64/26", "10.244.0.128/26"]);
        let a = node("a", "192.0.2.1", &["10.244.0.0/26"]);
        let (local, remotes) = node_view("a", [&a, &b, &c]);
        assert_eq!(local.vtep, Some("192.0.2.1".parse().expect("ip")));
        let got: Vec<(&str, IpAddr, Option<Ipv4Addr>, Vec<IpNetwork>)> = remotes
            .iter()
            .map(|r| (r.name.as_str(), r.address, r.vtep, r.blocks.clone()))
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    "b",
                    "192.0.2.2".parse().expect("ip"),
                    Some("192.0.2.2".parse().expect("ip")),
                    vec![net("10.244.0.64/26")]
                ),
                (
                    "b",
                    "2001:db8::2".parse().expect("ip"),
                    None,
                    vec![net("fd00::/122")]
                ),
                (
                    "c",
                    "192.0.2.3".parse().expect("ip"),
                    Some("192.0.2.3".parse().expect("ip")),
                    vec![net("10.244.0.128/26")]
                ),
            ]
        );
        let (unknown, _) = node_view("z", [&a]);
        assert_eq!(unknown.vtep, None, "no record yet: no VTEP");
    }
}
