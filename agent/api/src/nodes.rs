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
    /// `local` (this node), `alive`, or `silent`: no heartbeat within its expiry (under Kubernetes, its
    /// Ready condition not True for `--node-expiry`). A silent node keeps its routes while its record
    /// exists (fail static); it is degraded, not removed.
    pub health: String,
    /// Its last heartbeat (Unix seconds; under Kubernetes, when its Ready condition stopped being True, 0
    /// while it is True).
    pub heartbeat: u64,
    /// Seconds since `heartbeat` when the answer was made; absent for this node and a Ready Node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen_secs: Option<u64>,
    /// Where its record comes from.
    #[serde(default)]
    pub source: NodeSource,
}

impl NodeStatus {
    /// The health of this node itself.
    pub const LOCAL: &'static str = "local";
    /// The health of a node heard from within its expiry.
    pub const ALIVE: &'static str = "alive";
    /// The health of a node not heard from within its expiry (still routed: degraded, not removed).
    pub const SILENT: &'static str = "silent";

    /// The same with [`Self::last_seen_secs`] as of `now` (Unix seconds).
    #[must_use]
    pub fn seen_at(mut self, now: u64) -> Self {
        self.last_seen_secs = (self.health != Self::LOCAL && self.heartbeat != 0)
            .then(|| now.saturating_sub(self.heartbeat));
        self
    }

    /// Whether the node is silent (degraded).
    #[must_use]
    pub fn is_silent(&self) -> bool {
        self.health == Self::SILENT
    }
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
        let silent = NodeStatus {
            health: NodeStatus::SILENT.into(),
            ..parsed
        }
        .seen_at(1_767_000_042);
        assert_eq!(silent.last_seen_secs, Some(42));
        assert!(silent.is_silent());
        assert_eq!(
            serde_json::to_value(&silent).expect("json")["last_seen_secs"],
            42
        );
        let local = NodeStatus {
            health: NodeStatus::LOCAL.into(),
            ..silent
        }
        .seen_at(1_767_000_042);
        assert_eq!(local.last_seen_secs, None, "this node is not seen, it is");
        let address =
            json!({"ip": "10.244.1.5", "identity": null, "node": "n2", "pod": "prod/web-0"});
        let parsed: AddressView = serde_json::from_value(address.clone()).expect("address");
        assert_eq!(serde_json::to_value(&parsed).expect("json"), address);
    }
}
