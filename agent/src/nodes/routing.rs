//! Routes to remote nodes' blocks, kept by the loop: the nodes source's deltas update the cluster's nodes,
//! which give the route driver its desired routes (native mode: one route per remote block via the node's
//! address of the block's family). Nothing is reconciled before the source's first full listing, so a
//! restart never sweeps routes it has not yet been told about; a node that is gone (record deleted) or
//! expired (heartbeat too old) has no routes, and the driver sweeps them.

use std::{collections::BTreeMap, net::IpAddr};

use ipnetwork::IpNetwork;
use serde::{Deserialize, Serialize};

use super::{ClusterNode, NodeDelta, NodeSource};
use crate::dataplane::routes::{NextHop, RouteDriver, RouteError};

/// A node as `weir status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// The node.
    pub name: String,
    /// Its addresses.
    pub addresses: Vec<IpAddr>,
    /// Its blocks.
    pub blocks: Vec<IpNetwork>,
    /// Routes this node wants to its blocks (0 for this node itself).
    pub routes: usize,
    /// `local` (this node), `alive` or `expired`.
    pub health: String,
    /// Its last heartbeat (Unix seconds).
    pub heartbeat: u64,
    /// Where its record comes from.
    #[serde(default)]
    pub source: NodeSource,
}

/// The desired routes to every remote, live node's blocks (native routing). A block of this node, or a
/// block already routed to another node (two nodes claiming one block: the first by name wins), gets none;
/// a node without an address of a block's family routes none of that family.
#[must_use]
pub fn native_routes<'a>(
    local: &str,
    nodes: impl IntoIterator<Item = &'a ClusterNode>,
) -> BTreeMap<IpNetwork, NextHop> {
    let mut routes = BTreeMap::new();
    for node in nodes {
        if node.name == local || !node.alive {
            continue;
        }
        for block in &node.blocks {
            let Some(via) = node
                .addresses
                .iter()
                .find(|a| a.is_ipv4() == block.is_ipv4())
            else {
                continue;
            };
            routes.entry(*block).or_insert(NextHop::Via(*via));
        }
    }
    routes
}

/// The cluster's nodes and the route driver that follows them.
pub struct NodeRoutes {
    local: String,
    nodes: BTreeMap<String, ClusterNode>,
    synced: bool,
    driver: RouteDriver,
    source: NodeSource,
}

impl NodeRoutes {
    /// Routes for node `local` through `driver`.
    #[must_use]
    pub fn new(local: &str, driver: RouteDriver) -> Self {
        Self {
            local: local.to_owned(),
            nodes: BTreeMap::new(),
            synced: false,
            driver,
            source: NodeSource::Etcd,
        }
    }

    /// The same, its records coming from `source` (what the status says).
    #[must_use]
    pub fn with_source(mut self, source: NodeSource) -> Self {
        self.source = source;
        self
    }

    /// Takes one delta; the desired routes follow.
    pub fn on_delta(&mut self, delta: NodeDelta) {
        match delta {
            NodeDelta::Upsert(node) => {
                if !node.alive && self.nodes.get(&node.name).is_some_and(|n| n.alive) {
                    tracing::warn!(node = %node.name, heartbeat = node.heartbeat, "node heartbeat expired; its routes are swept");
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
        self.driver
            .set_desired(native_routes(&self.local, self.nodes.values()));
    }

    /// True when an apply has route work to do (never before the first full listing).
    #[must_use]
    pub fn is_dirty(&self) -> bool {
        self.synced && self.driver.is_dirty()
    }

    /// Reconciles the routes (nothing before the first full listing).
    pub fn apply(&mut self) -> Result<(), RouteError> {
        if !self.synced {
            return Ok(());
        }
        self.driver.apply()
    }

    /// Every known node as the status shows it.
    #[must_use]
    pub fn status(&self) -> Vec<NodeStatus> {
        let desired = self.driver.desired();
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
                    "local"
                } else if n.alive {
                    "alive"
                } else {
                    "expired"
                }
                .to_owned(),
                heartbeat: n.heartbeat,
                source: self.source,
            })
            .collect()
    }

    /// The route driver (its counters).
    #[must_use]
    pub fn driver(&self) -> &RouteDriver {
        &self.driver
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::fake::FakeKernel;

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
    fn remote_blocks_are_routed_and_a_gone_or_expired_node_is_swept() {
        let kernel = FakeKernel::default();
        let mut routes = NodeRoutes::new("a", RouteDriver::new(Box::new(kernel.clone())));
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

        // c expires, b is deleted: both are swept.
        let mut expired = node("c", "192.0.2.3", &["10.244.0.128/26"]);
        expired.alive = false;
        routes.on_delta(NodeDelta::Upsert(expired));
        routes.on_delta(NodeDelta::Gone("b".into()));
        routes.apply().expect("apply");
        assert!(kernel.routes().routes.is_empty());

        // A restarted agent over the same table and nodes writes nothing.
        routes.on_delta(NodeDelta::Upsert(node(
            "d",
            "192.0.2.4",
            &["10.244.1.0/26"],
        )));
        routes.apply().expect("apply");
        let mut restarted = NodeRoutes::new("a", RouteDriver::new(Box::new(kernel.clone())));
        for n in [
            node("a", "192.0.2.1", &["10.244.0.0/26"]),
            node("d", "192.0.2.4", &["10.244.1.0/26"]),
        ] {
            restarted.on_delta(NodeDelta::Upsert(n));
        }
        restarted.on_delta(NodeDelta::Synced);
        restarted.apply().expect("apply");
        let stats = restarted.driver().stats();
        assert_eq!((stats.writes, stats.deletes), (0, 0));
    }
}
