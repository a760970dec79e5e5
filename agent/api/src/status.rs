//! `GET /v1/status`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// `GET /v1/status`: what every client reads, and the agent's detail beside it (`D`, flattened
/// into the same object: the operator CLI reads it as the agent's own type; weir-cni keeps it as
/// raw JSON).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Status<D = serde_json::Map<String, serde_json::Value>> {
    /// Ready: first in-sync applied and the dataplane is not failing.
    pub ready: bool,
    /// Node name.
    #[serde(default)]
    pub node: String,
    /// The agent's bpffs pin root: where weir-cni finds the programs to attach (empty from an
    /// agent that does not say; see [`Status::agent_pin_root`]).
    #[serde(default)]
    pub bpf_root: PathBuf,
    /// Registered endpoints.
    #[serde(default)]
    pub endpoints: usize,
    /// Pools.
    #[serde(default)]
    pub pools: Vec<PoolStatus>,
    /// The agent's detail (node state, applier, dataplane and conntrack counters).
    #[serde(flatten)]
    pub detail: D,
}

impl<D> Status<D> {
    /// The agent's pin root, `None` when the agent did not say (an older agent).
    #[must_use]
    pub fn agent_pin_root(&self) -> Option<&Path> {
        pin_root(&self.bpf_root)
    }
}

/// A pin root from an answer: `None` when empty (the agent did not say).
#[must_use]
pub fn pin_root(path: &Path) -> Option<&Path> {
    (!path.as_os_str().is_empty()).then_some(path)
}

/// A pool as the status shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolStatus {
    /// Name.
    pub name: String,
    /// CIDR.
    pub cidr: String,
    /// Free addresses.
    pub free: u64,
    /// Disabled pools hand out nothing.
    #[serde(default)]
    pub disabled: bool,
}
