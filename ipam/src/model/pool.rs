//! IP pools.

use std::{collections::BTreeMap, fmt};

use ipnetwork::IpNetwork;
use serde::{Deserialize, Serialize};

use super::selector::Selector;
use crate::cidr::Family;

/// What an address is for; a pool lists the uses it serves.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum IpUse {
    /// Pod addresses.
    Workload,
    /// Tunnel endpoint addresses.
    Tunnel,
    /// LoadBalancer service addresses.
    #[serde(rename = "loadbalancer")]
    LoadBalancer,
}

impl IpUse {
    /// Parses `workload`, `tunnel` or `loadbalancer`.
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "workload" => Some(Self::Workload),
            "tunnel" => Some(Self::Tunnel),
            "loadbalancer" => Some(Self::LoadBalancer),
            _ => None,
        }
    }
}

impl fmt::Display for IpUse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Workload => "workload",
            Self::Tunnel => "tunnel",
            Self::LoadBalancer => "loadbalancer",
        })
    }
}

fn default_uses() -> Vec<IpUse> {
    vec![IpUse::Workload, IpUse::Tunnel]
}

/// A pool of addresses carved into host-affine blocks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IpPool {
    /// The pool's name (its datastore key).
    pub name: String,
    /// The pool's network, host bits clear.
    #[schemars(with = "String")]
    pub cidr: IpNetwork,
    /// Prefix length of the pool's blocks; immutable once blocks exist.
    pub block_size: u8,
    /// Which nodes may take blocks from this pool (empty = all).
    #[serde(default)]
    pub node_selector: String,
    /// Which namespaces' pods may use this pool (empty = all).
    #[serde(default)]
    pub namespace_selector: String,
    /// What addresses from this pool may be used for.
    #[serde(default = "default_uses")]
    pub allowed_uses: Vec<IpUse>,
    /// A disabled pool hands out no new addresses; existing ones stay valid.
    #[serde(default)]
    pub disabled: bool,
}

impl IpPool {
    /// The pool's family.
    pub fn family(&self) -> Family {
        Family::of(&self.cidr)
    }

    /// Whether the pool serves `node` (by its labels) for `namespace` (by its labels).
    pub fn selects(
        &self,
        node_labels: &BTreeMap<String, String>,
        ns_labels: &BTreeMap<String, String>,
    ) -> bool {
        let node_ok = Selector::parse(&self.node_selector).is_ok_and(|s| s.matches(node_labels));
        let ns_ok = Selector::parse(&self.namespace_selector).is_ok_and(|s| s.matches(ns_labels));
        node_ok && ns_ok
    }

    /// Whether the pool serves `use_`.
    pub fn allows(&self, use_: IpUse) -> bool {
        self.allowed_uses.contains(&use_)
    }

    /// The default allowed uses (workload and tunnel), as Calico does.
    pub fn default_allowed_uses() -> Vec<IpUse> {
        default_uses()
    }
}
