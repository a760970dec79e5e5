//! Request and response bodies of the agent API.

use std::{collections::BTreeMap, net::IpAddr, path::PathBuf};

use serde::{Deserialize, Serialize};

use crate::{ipam_service::PoolStatus, node::NodeSummary, registry::Endpoint};

/// `GET /v1/status`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Status {
    /// Ready: first in-sync applied and the dataplane is not failing.
    pub ready: bool,
    /// Node name.
    pub node: String,
    /// The agent's bpffs pin root: where weir-cni finds the programs to attach.
    #[serde(default)]
    pub bpf_root: PathBuf,
    /// Registered endpoints.
    pub endpoints: usize,
    /// Pools.
    pub pools: Vec<PoolStatus>,
    /// Node state.
    pub state: NodeSummary,
    /// Applier progress.
    pub applied: crate::applier::Applied,
    /// Driver counters.
    pub dataplane: serde_json::Value,
    /// Conntrack sweeps and map pressure.
    pub conntrack: crate::dataplane::conntrack::CtStats,
}

/// `PUT /v1/endpoints/{container_id}:{ifname}` body.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointRequest {
    /// Container id.
    pub container_id: String,
    /// Interface inside the pod.
    pub ifname: String,
    /// Host-side veth.
    pub host_ifname: String,
    /// Pod netns path.
    #[serde(default)]
    pub netns: String,
    /// Namespace.
    #[serde(default)]
    pub namespace: String,
    /// Pod.
    #[serde(default)]
    pub pod: String,
    /// Labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// IPAM handle.
    #[serde(default)]
    pub handle: String,
    /// Addresses.
    pub ips: Vec<IpAddr>,
}

/// An endpoint as the API returns it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EndpointView {
    /// The endpoint.
    #[serde(flatten)]
    pub endpoint: Endpoint,
    /// Its security identity.
    pub identity: Option<u32>,
    /// The host link's ifindex, when the link exists.
    pub ifindex: Option<u32>,
}

/// `POST /v1/ipam/allocate` answer: the allocation, and the agent's pin root, so weir-cni
/// attaches this agent's programs (never another agent's, nor stale pins).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AllocateResponse {
    /// The allocation.
    #[serde(flatten)]
    pub allocation: crate::ipam_service::Allocation,
    /// The agent's bpffs pin root.
    pub bpf_root: PathBuf,
    /// How this agent attaches the endpoint programs (`--tc-attach`), so weir-cni attaches the
    /// same way whatever its conflist says.
    pub tc_attach: attach::Mechanism,
}

/// `DELETE /v1/endpoints/…` answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeleteResponse {
    /// True when an endpoint was removed.
    pub deleted: bool,
    /// Addresses released.
    pub released: Vec<IpAddr>,
    /// The agent's bpffs pin root (where weir-cni removes the link pins).
    #[serde(default)]
    pub bpf_root: PathBuf,
}

/// `POST /v1/ipam/ops` body: a `weir ipam` operation for the agent to run on its datastore.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IpamOpsRequest {
    /// The datastore the command was given (`embedded:ABSOLUTE-PATH`); the agent runs the operation only
    /// when it holds that datastore, else it answers [`NOT_THIS_DATASTORE`].
    pub datastore: String,
    /// The operation.
    pub operation: ipam::ops::Operation,
}

/// The error code of `POST /v1/ipam/ops` when the agent does not hold the datastore named.
pub const NOT_THIS_DATASTORE: &str = "not-this-datastore";

/// `POST /v1/ipam/release` body.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseRequest {
    /// Release everything under this handle.
    #[serde(default)]
    pub handle: Option<String>,
    /// Or these addresses.
    #[serde(default)]
    pub ips: Vec<IpAddr>,
}

/// `POST /v1/ipam/release` answer.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ReleaseResponse {
    /// Released addresses.
    pub released: Vec<IpAddr>,
    /// Addresses that were not allocated.
    pub not_allocated: Vec<IpAddr>,
}
