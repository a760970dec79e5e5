//! The records the nodes source follows (node records, block affinities, endpoint records), kept by key name
//! as the datastore has them: a listing fills them, watch changes update them, and the cluster's nodes and
//! remote pods are derived from them (a node's liveness at a given time: expiry needs no event).

use std::collections::BTreeMap;

use ipam::model::{EndpointRecord, NodeRecord};
use ipnetwork::IpNetwork;

use super::ClusterNode;

/// One record's change, as a watch reports it (`None`: deleted, or for a block, no longer a confirmed one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordChange {
    /// A node record, by node name.
    Node(String, Option<NodeRecord>),
    /// A block affinity, by its key name: the host and its block when confirmed and not deleted.
    Block(String, Option<(String, IpNetwork)>),
    /// An endpoint record, by key name (`node/namespace/pod`).
    Endpoint(String, Option<EndpointRecord>),
}

/// The followed records.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Records {
    /// Node records by node name.
    pub nodes: BTreeMap<String, NodeRecord>,
    /// Confirmed, not deleted affinities by key name: (host, block).
    pub blocks: BTreeMap<String, (String, IpNetwork)>,
    /// Endpoint records by key name.
    pub endpoints: BTreeMap<String, EndpointRecord>,
}

impl Records {
    /// Applies one change.
    pub fn apply(&mut self, change: RecordChange) {
        fn set<V>(m: &mut BTreeMap<String, V>, k: String, v: Option<V>) {
            match v {
                Some(v) => {
                    m.insert(k, v);
                }
                None => {
                    m.remove(&k);
                }
            }
        }
        match change {
            RecordChange::Node(k, v) => set(&mut self.nodes, k, v),
            RecordChange::Block(k, v) => set(&mut self.blocks, k, v),
            RecordChange::Endpoint(k, v) => set(&mut self.endpoints, k, v),
        }
    }

    /// Every node with a record, with its blocks (sorted) and its liveness at `now` (Unix seconds).
    #[must_use]
    pub fn cluster(&self, now: u64) -> BTreeMap<String, ClusterNode> {
        let mut blocks: BTreeMap<&str, Vec<IpNetwork>> = BTreeMap::new();
        for (host, cidr) in self.blocks.values() {
            blocks.entry(host.as_str()).or_default().push(*cidr);
        }
        self.nodes
            .iter()
            .map(|(name, r)| {
                let mut node_blocks = blocks.remove(name.as_str()).unwrap_or_default();
                node_blocks.sort();
                let node = ClusterNode {
                    alive: r.alive(now),
                    name: r.name.clone(),
                    addresses: r.addresses.clone(),
                    labels: r.labels.clone(),
                    blocks: node_blocks,
                    heartbeat: r.heartbeat,
                };
                (name.clone(), node)
            })
            .collect()
    }

    /// Every endpoint record, in key order.
    #[must_use]
    pub fn endpoint_records(&self) -> Vec<EndpointRecord> {
        self.endpoints.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_update_the_records_and_liveness_follows_the_clock() {
        let mut r = Records::default();
        let record = NodeRecord {
            name: "a".into(),
            addresses: vec!["192.0.2.1".parse().expect("ip")],
            labels: BTreeMap::new(),
            heartbeat: 100,
            expiry: 30,
        };
        r.apply(RecordChange::Node("a".into(), Some(record)));
        let block: IpNetwork = "10.0.0.0/26".parse().expect("cidr");
        r.apply(RecordChange::Block(
            "a/10.0.0.0-26".into(),
            Some(("a".into(), block)),
        ));
        let live = r.cluster(110);
        assert!(live["a"].alive);
        assert_eq!(live["a"].blocks, vec![block]);
        assert!(!r.cluster(131)["a"].alive, "past its expiry");
        r.apply(RecordChange::Block("a/10.0.0.0-26".into(), None));
        assert!(r.cluster(110)["a"].blocks.is_empty());
        r.apply(RecordChange::Node("a".into(), None));
        assert!(r.cluster(110).is_empty());
    }
}
