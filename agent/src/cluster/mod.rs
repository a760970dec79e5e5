//! Nodes of the cluster (DESIGN.md → "Nodes and routing"): every node has a record — in standalone mode with
//! an `etcd:` datastore, a [`ipam::model::NodeRecord`] its agent renews; under `--source kubernetes`, its
//! Node object (kubelet writes it) — and its pod blocks are its IPAM block affinities. `store` reads them
//! behind a small trait, `sources::nodes` (etcd records) or `sources::kube::nodes` (Node objects) turns them
//! into deltas for the loop, and `routing` keeps the route driver's desired routes from them.
//!
//! Fail static (DESIGN.md → "Decisions for the next round"): a node's routes, forwarding and neighbour
//! entries, and its pods' identities, follow its record, never its heartbeat. A node whose heartbeat is older
//! than its expiry (or, under Kubernetes, whose Ready condition has not been True for `--node-expiry`) is
//! *silent*: still routed, shown as degraded in `weir node list`, `weir status` and `/metrics`. Only its
//! removal (record deleted, `weir ipam release-node`, Node object deleted) withdraws what points at it.

pub mod records;
pub mod routing;
pub mod setup;
pub mod store;

use std::{collections::BTreeMap, net::IpAddr};

use ipnetwork::IpNetwork;
use serde::{Deserialize, Serialize};

/// Where the node records come from (the API contract's).
pub use weir_api::NodeSource;

/// A node as the loop knows it: its record and its blocks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterNode {
    /// The node's name (its IPAM host).
    pub name: String,
    /// Its addresses (next hops of the routes to its blocks).
    pub addresses: Vec<IpAddr>,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its pod blocks (confirmed affinities).
    pub blocks: Vec<IpNetwork>,
    /// Whether its heartbeat is within its expiry; a node that is not is silent (degraded), and keeps its
    /// routes while its record exists.
    pub alive: bool,
    /// Its last heartbeat (Unix seconds).
    pub heartbeat: u64,
}

/// A pod of another node, from its endpoint record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterPod {
    /// The node it runs on.
    pub node: String,
    /// The pod as the calculation takes it.
    pub pod: crate::calc::policy::pods::RemotePod,
}

/// A pod address known cluster-wide (the API contract's).
pub use weir_api::AddressView;

/// One change of the cluster's nodes, as the nodes source sends it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeDelta {
    /// A node appeared or changed (addresses, labels, blocks, liveness).
    Upsert(ClusterNode),
    /// A node's record is gone.
    Gone(String),
    /// The source has delivered every node once: routes may be reconciled (swept) from now on.
    Synced,
}

/// The deltas that turn `old` into `new` (both by name).
#[must_use]
pub fn diff(
    old: &BTreeMap<String, ClusterNode>,
    new: &BTreeMap<String, ClusterNode>,
) -> Vec<NodeDelta> {
    let gone = old
        .keys()
        .filter(|name| !new.contains_key(*name))
        .map(|name| NodeDelta::Gone(name.clone()));
    let changed = new
        .iter()
        .filter(|(name, node)| old.get(*name) != Some(*node))
        .map(|(_, node)| NodeDelta::Upsert(node.clone()));
    gone.chain(changed).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, block: &str) -> ClusterNode {
        ClusterNode {
            name: name.into(),
            addresses: vec!["192.0.2.1".parse().expect("ip")],
            labels: BTreeMap::new(),
            blocks: vec![block.parse().expect("cidr")],
            alive: true,
            heartbeat: 1,
        }
    }

    #[test]
    fn the_diff_names_what_came_changed_and_went() {
        let a = node("a", "10.0.0.0/26");
        let b = node("b", "10.0.0.64/26");
        let old = BTreeMap::from([("a".to_owned(), a.clone()), ("b".to_owned(), b)]);
        let a2 = node("a", "10.0.1.0/26");
        let c = node("c", "10.0.2.0/26");
        let new = BTreeMap::from([("a".to_owned(), a2.clone()), ("c".to_owned(), c.clone())]);
        assert_eq!(
            diff(&old, &new),
            vec![
                NodeDelta::Gone("b".into()),
                NodeDelta::Upsert(a2),
                NodeDelta::Upsert(c)
            ]
        );
        assert!(diff(&new, &new).is_empty(), "no change, no delta");
        assert_eq!(
            diff(
                &BTreeMap::new(),
                &BTreeMap::from([("a".to_owned(), a.clone())])
            ),
            vec![NodeDelta::Upsert(a)]
        );
    }
}
