//! The cluster's nodes and pod addresses: `GET /v1/nodes`, `GET /v1/addresses` (and `nodes` in
//! the status).

use std::net::IpAddr;

use ipnetwork::IpNetwork;
use serde::{Deserialize, Serialize};

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

/// Where the node records come from (`weir status` shows it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeSource {
    /// Node records in etcd, renewed by their agents.
    #[default]
    Etcd,
    /// Kubernetes Node objects.
    Kubernetes,
}

impl std::fmt::Display for NodeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Etcd => "etcd",
            Self::Kubernetes => "kubernetes",
        })
    }
}

/// A pod address known cluster-wide, as `weir status --all-addresses` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddressView {
    /// The address.
    pub ip: IpAddr,
    /// Its identity in this node's maps (`None`: not written yet).
    pub identity: Option<u32>,
    /// The node the pod runs on.
    pub node: String,
    /// `namespace/pod`.
    pub pod: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nodes_and_addresses_round_trip() {
        let node = json!({"name": "n2", "addresses": ["192.0.2.2"], "blocks": ["10.244.1.0/26"],
            "routes": 1, "health": "alive", "heartbeat": 1767000000, "source": "kubernetes"});
        let parsed: NodeStatus = serde_json::from_value(node.clone()).expect("node");
        assert_eq!(
            (parsed.source, parsed.source.to_string()),
            (NodeSource::Kubernetes, "kubernetes".into())
        );
        assert_eq!(serde_json::to_value(&parsed).expect("json"), node);
        let address =
            json!({"ip": "10.244.1.5", "identity": null, "node": "n2", "pod": "prod/web-0"});
        let parsed: AddressView = serde_json::from_value(address.clone()).expect("address");
        assert_eq!(serde_json::to_value(&parsed).expect("json"), address);
    }
}
