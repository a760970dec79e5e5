//! Routes to the other nodes' pod blocks in either routing mode (DESIGN.md → "Nodes and routing"), the one
//! API the loop calls with (mode, local node, remote nodes): `native` — a route per remote block via the
//! remote node's address; `vxlan` — the VXLAN device with a forwarding and a neighbour entry per remote node
//! (`vxlan`), and a route per remote IPv4 block through it, `onlink` via the remote node's VTEP address. In
//! native mode a VXLAN device left by an earlier vxlan run is removed. Remote IPv6 blocks are routed natively
//! in both modes (the tunnel is IPv4 only).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr},
};

use ipnetwork::IpNetwork;

use super::{
    map_driver::DriverStats,
    routes::RouteDriver,
    vxlan::{Vtep, VxlanConfig, VxlanDriver},
};
use crate::kernel::{NextHop, RouteError, RouteIo, VxlanError, VxlanIo};

/// How remote blocks are reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RoutingMode {
    /// Via the remote node's address (shared L2, or a fabric that routes pod CIDRs).
    Native,
    /// Through the VXLAN device.
    Vxlan(VxlanConfig),
}

/// This node, as routing needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalNode {
    /// Its name.
    pub name: String,
    /// Its underlay address (the tunnel's source).
    pub address: IpAddr,
    /// Its VTEP address (vxlan mode: put on the device; unique per node). The agent uses the node's own
    /// IPv4 address (`cluster::routing::vtep_of`), so every node derives it from the node record alone.
    pub vtep: Option<Ipv4Addr>,
}

/// Another node, as routing needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteNode {
    /// Its name.
    pub name: String,
    /// Its underlay address.
    pub address: IpAddr,
    /// Its VTEP address (vxlan mode).
    pub vtep: Option<Ipv4Addr>,
    /// Its pod blocks (its IPAM block affinities).
    pub blocks: Vec<IpNetwork>,
}

/// A routing failure.
#[derive(Debug, thiserror::Error)]
pub enum NodeRoutesError {
    /// The route table.
    #[error(transparent)]
    Route(#[from] RouteError),
    /// The VXLAN device or its entries.
    #[error(transparent)]
    Vxlan(#[from] VxlanError),
    /// vxlan mode needs IPv4 underlay and VTEP addresses.
    #[error(
        "node {node} has no IPv4 underlay or VTEP address, which vxlan routing needs; give it one or use --routing native"
    )]
    NoVtep {
        /// The node.
        node: String,
    },
}

/// The route driver and, in vxlan mode, the VXLAN driver, fed from one node view.
pub struct NodeRoutes {
    mode: RoutingMode,
    routes: RouteDriver,
    vxlan: VxlanDriver,
    /// The node view, kept until the device's index is known (vxlan routes name it).
    nodes: Option<(LocalNode, Vec<RemoteNode>)>,
    dirty: bool,
}

/// The VXLAN driver's config when `mode` is native: only its device name matters (for the teardown).
fn teardown_config(mode: &RoutingMode) -> VxlanConfig {
    match mode {
        RoutingMode::Vxlan(c) => c.clone(),
        RoutingMode::Native => VxlanConfig {
            device: crate::paths::DEFAULT_VXLAN_DEVICE.into(),
            vni: crate::paths::DEFAULT_VXLAN_VNI,
            port: crate::paths::DEFAULT_VXLAN_PORT,
            underlay: String::new(),
        },
    }
}

fn v4(a: IpAddr) -> Option<Ipv4Addr> {
    match a {
        IpAddr::V4(v) => Some(v),
        IpAddr::V6(_) => None,
    }
}

impl NodeRoutes {
    /// Drivers over `route_io` and `vxlan_io` in `mode`. In native mode, `vxlan_device` names the device
    /// an earlier vxlan run may have left (removed on the first apply); `None` for the default name.
    #[must_use]
    pub fn new(
        mode: RoutingMode,
        route_io: Box<dyn RouteIo>,
        vxlan_io: Box<dyn VxlanIo>,
        vxlan_device: Option<String>,
    ) -> Self {
        let mut config = teardown_config(&mode);
        if let (RoutingMode::Native, Some(name)) = (&mode, vxlan_device) {
            config.device = name;
        }
        Self {
            routes: RouteDriver::new(route_io),
            vxlan: VxlanDriver::new(vxlan_io, config),
            mode,
            nodes: None,
            dirty: true,
        }
    }

    /// The routing mode.
    #[must_use]
    pub fn mode(&self) -> &RoutingMode {
        &self.mode
    }

    /// Replaces the node view: this node and every other node with its blocks.
    pub fn set_nodes(&mut self, local: LocalNode, remotes: Vec<RemoteNode>) {
        let next = Some((local, remotes));
        if next != self.nodes {
            self.nodes = next;
            self.dirty = true;
        }
    }

    /// True when the next apply has work to do (a changed node view, or a resync).
    #[must_use]
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// The MTU pods get: the VXLAN device's in vxlan mode (known after an apply), `None` in native mode.
    #[must_use]
    pub fn pod_mtu(&self) -> Option<u32> {
        self.vxlan.mtu()
    }

    /// The desired routes (after an apply in vxlan mode, as they name the device).
    #[must_use]
    pub fn desired_routes(&self) -> &BTreeMap<IpNetwork, NextHop> {
        self.routes.desired()
    }

    /// (route driver, VXLAN driver) statistics.
    #[must_use]
    pub fn stats(&self) -> (DriverStats, DriverStats) {
        (self.routes.stats(), self.vxlan.stats())
    }

    /// Marks everything for a read-back on the next apply (a periodic resync).
    pub fn resync(&mut self) {
        self.dirty = true;
        self.routes.refresh();
        self.vxlan.resync();
    }

    /// Reconciles the VXLAN side (vxlan mode), then the routes. In vxlan mode the routes wait for the device:
    /// when it fails, the routes are left as they are and the error returned, so the next apply retries.
    pub fn apply(&mut self) -> Result<(), NodeRoutesError> {
        if !self.dirty {
            return Ok(());
        }
        let Some((local, remotes)) = self.nodes.clone() else {
            return Ok(());
        };
        let desired = match &self.mode {
            RoutingMode::Native => {
                if self.vxlan.teardown()? {
                    tracing::info!(device = %self.vxlan.config().device, "removed the VXLAN device: routing is native");
                }
                native_routes(&remotes)
            }
            RoutingMode::Vxlan(_) => {
                let vtep = |name: &str, address: IpAddr, vtep: Option<Ipv4Addr>| {
                    Ok::<_, NodeRoutesError>(Vtep {
                        vtep: vtep.ok_or_else(|| NodeRoutesError::NoVtep { node: name.into() })?,
                        underlay: v4(address)
                            .ok_or_else(|| NodeRoutesError::NoVtep { node: name.into() })?,
                    })
                };
                let mine = vtep(&local.name, local.address, local.vtep)?;
                let mut peers = BTreeSet::new();
                let mut tunnelled = Vec::new();
                // A node reached over IPv6 has its (IPv6) blocks routed natively: the tunnel is IPv4 only.
                for r in remotes.iter().filter(|r| r.address.is_ipv4()) {
                    match vtep(&r.name, r.address, r.vtep) {
                        Ok(p) => {
                            peers.insert(p);
                            tunnelled.push((r, p.vtep));
                        }
                        Err(e) => {
                            tracing::warn!(node = %r.name, error = %e, "no tunnel to this node");
                        }
                    }
                }
                self.vxlan.set_desired(mine, peers);
                let ifindex = self.vxlan.apply()?.ok_or_else(|| NodeRoutesError::NoVtep {
                    node: local.name.clone(),
                })?;
                vxlan_routes(&remotes, &tunnelled, ifindex)
            }
        };
        self.routes.set_desired(desired);
        self.routes.apply()?;
        self.dirty = false;
        Ok(())
    }
}

/// Native mode: every remote block via its node's address (of the block's family).
fn native_routes(remotes: &[RemoteNode]) -> BTreeMap<IpNetwork, NextHop> {
    remotes
        .iter()
        .flat_map(|r| {
            r.blocks
                .iter()
                .filter(move |b| b.is_ipv4() == r.address.is_ipv4())
                .map(move |b| (*b, NextHop::Via(r.address)))
        })
        .collect()
}

/// vxlan mode: each tunnelled node's IPv4 blocks through the device via its VTEP; the rest native.
fn vxlan_routes(
    remotes: &[RemoteNode],
    tunnelled: &[(&RemoteNode, Ipv4Addr)],
    ifindex: u32,
) -> BTreeMap<IpNetwork, NextHop> {
    let mut routes = native_routes(remotes);
    for (r, vtep) in tunnelled {
        for b in r.blocks.iter().filter(|b| b.is_ipv4()) {
            routes.insert(
                *b,
                NextHop::Device {
                    ifindex,
                    via: IpAddr::V4(*vtep),
                },
            );
        }
    }
    routes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::{Underlay, fake::FakeKernel};

    fn node(i: u8) -> RemoteNode {
        RemoteNode {
            name: format!("n{i}"),
            address: IpAddr::V4(Ipv4Addr::new(192, 0, 2, i)),
            vtep: Some(Ipv4Addr::new(10, 244, i, 1)),
            blocks: vec![
                format!("10.244.{i}.0/26").parse().expect("cidr"),
                format!("10.244.{i}.64/26").parse().expect("cidr"),
            ],
        }
    }

    fn local() -> LocalNode {
        LocalNode {
            name: "n1".into(),
            address: "192.0.2.1".parse().expect("ip"),
            vtep: Some(Ipv4Addr::new(10, 244, 1, 1)),
        }
    }

    fn vxlan_mode() -> RoutingMode {
        RoutingMode::Vxlan(VxlanConfig {
            device: "wvx0".into(),
            vni: 87,
            port: 4789,
            underlay: "eth0".into(),
        })
    }

    fn kernel() -> FakeKernel {
        let k = FakeKernel::default();
        k.vxlan_table().underlays.insert(
            "eth0".into(),
            Underlay {
                ifindex: 2,
                mtu: 9000,
            },
        );
        k
    }

    fn driver(k: &FakeKernel, mode: RoutingMode) -> NodeRoutes {
        NodeRoutes::new(mode, Box::new(k.clone()), Box::new(k.clone()), None)
    }

    #[test]
    fn vxlan_mode_routes_every_remote_block_through_the_device_onlink_via_its_vtep() {
        let k = kernel();
        let mut d = driver(&k, vxlan_mode());
        d.set_nodes(local(), vec![node(2), node(3)]);
        d.apply().expect("apply");
        let ifindex = k.vxlan_table().links["wvx0"].ifindex;
        let want: BTreeMap<IpNetwork, NextHop> = [node(2), node(3)]
            .iter()
            .flat_map(|n| {
                let via = IpAddr::V4(n.vtep.expect("vtep"));
                n.blocks
                    .iter()
                    .map(move |b| (*b, NextHop::Device { ifindex, via }))
            })
            .collect();
        assert_eq!(k.routes().routes, want);
        assert_eq!(d.pod_mtu(), Some(9000 - 50));
        // A restart over the same kernel writes nothing, on either side.
        let mut again = driver(&k, vxlan_mode());
        again.set_nodes(local(), vec![node(2), node(3)]);
        again.apply().expect("apply");
        let (r, v) = again.stats();
        assert_eq!((r.writes, r.deletes, v.writes, v.deletes), (0, 0, 0, 0));
        // A node removed: its routes and its entries are swept.
        again.set_nodes(local(), vec![node(3)]);
        again.apply().expect("apply");
        assert_eq!(k.routes().routes.len(), 2);
        assert_eq!(k.vxlan_table().fdb[&ifindex].len(), 1);
        assert_eq!(k.vxlan_table().neighbours[&ifindex].len(), 1);
    }

    #[test]
    fn native_mode_routes_via_node_addresses_and_removes_a_leftover_device() {
        let k = kernel();
        let mut d = driver(&k, vxlan_mode());
        d.set_nodes(local(), vec![node(2)]);
        d.apply().expect("apply");
        assert!(k.vxlan_table().links.contains_key("wvx0"));
        let mut native = driver(&k, RoutingMode::Native);
        native.set_nodes(local(), vec![node(2)]);
        native.apply().expect("apply");
        assert!(
            k.vxlan_table().links.is_empty(),
            "the device of the vxlan run is gone"
        );
        let want: BTreeMap<IpNetwork, NextHop> = node(2)
            .blocks
            .iter()
            .map(|b| (*b, NextHop::Via(node(2).address)))
            .collect();
        assert_eq!(k.routes().routes, want);
        assert_eq!(native.pod_mtu(), None);
    }

    #[test]
    fn a_node_without_a_vtep_gets_no_tunnel_and_the_others_still_do() {
        let k = kernel();
        let mut d = driver(&k, vxlan_mode());
        let mut bare = node(3);
        bare.vtep = None;
        d.set_nodes(local(), vec![node(2), bare.clone()]);
        d.apply().expect("apply");
        let routes = k.routes().routes.clone();
        assert!(matches!(routes[&node(2).blocks[0]], NextHop::Device { .. }));
        assert_eq!(
            routes[&bare.blocks[0]],
            NextHop::Via(bare.address),
            "routed natively"
        );
        let mut no_local = local();
        no_local.vtep = None;
        d.set_nodes(no_local, vec![node(2)]);
        let err = d
            .apply()
            .expect_err("the local node needs a vtep")
            .to_string();
        assert!(err.contains("--routing native"), "{err}");
    }
}
