//! An endpoint record (standalone nodes sharing a datastore): a pod's addresses and labels as its node
//! publishes them, so every other node knows the pod by its cluster-wide identity.

use std::{collections::BTreeMap, net::IpAddr};

use serde::{Deserialize, Serialize};

/// One pod of one node. Keyed `<node>/<namespace>/<pod>`, so a node's records are one prefix listing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointRecord {
    /// The node the pod runs on.
    pub node: String,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// Its labels (its identity, with its namespace's labels).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Its addresses.
    #[schemars(with = "Vec<String>")]
    pub ips: Vec<IpAddr>,
}

impl EndpointRecord {
    /// The datastore name of the record.
    #[must_use]
    pub fn key_name(&self) -> String {
        format!("{}/{}/{}", self.node, self.namespace, self.pod)
    }
}
