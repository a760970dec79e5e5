//! A node record (standalone with a shared datastore): who the node is, where it is reached, and its
//! heartbeat. Its pod blocks are not here: they are its block affinities.

use std::{collections::BTreeMap, net::IpAddr};

use serde::{Deserialize, Serialize};

/// One node, written by its own agent and renewed by its heartbeat.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeRecord {
    /// The node's name (its IPAM host name).
    pub name: String,
    /// The node's own addresses (the next hops of routes to its blocks).
    #[schemars(with = "Vec<String>")]
    pub addresses: Vec<IpAddr>,
    /// The node's labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// When the agent last renewed the record (Unix seconds).
    pub heartbeat: u64,
    /// Seconds after `heartbeat` at which the node counts as gone (the agent's `--node-expiry`).
    pub expiry: u64,
}

impl NodeRecord {
    /// Whether the heartbeat is still within its expiry at `now` (Unix seconds).
    #[must_use]
    pub fn alive(&self, now: u64) -> bool {
        now < self.heartbeat.saturating_add(self.expiry)
    }
}
