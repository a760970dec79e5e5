//! Request and response bodies of the agent API: the contract crate `weir-api` (shared with
//! weir-cni), with the agent's own part of the status filled in.

use serde::{Deserialize, Serialize};
pub use weir_api::{
    AllocateResponse, DeleteResponse, EndpointRequest, EndpointView, ReleaseRequest,
    ReleaseResponse, code::NOT_THIS_DATASTORE,
};

use crate::control::node::NodeSummary;

/// `GET /v1/status`, with the agent's detail.
pub type Status = weir_api::Status<StatusDetail>;

/// The agent's part of `GET /v1/status` (flattened into the same object).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StatusDetail {
    /// Node state.
    pub state: NodeSummary,
    /// Applier progress.
    pub applied: crate::control::applier::Applied,
    /// Driver counters.
    pub dataplane: serde_json::Value,
    /// Conntrack sweeps and map pressure.
    pub conntrack: crate::dataplane::conntrack::CtStats,
    /// The cluster's nodes (with node records: an `etcd:` datastore), their blocks, routes and health.
    #[serde(default)]
    pub nodes: Vec<crate::cluster::routing::NodeStatus>,
    /// The cgroup v2 directory socket LB is attached to (`--socket-lb-cgroup`); absent: off.
    #[serde(default)]
    pub socket_lb: Option<std::path::PathBuf>,
    /// Which sockets socket LB places (`--socket-lb-scope`); absent: off.
    #[serde(default)]
    pub socket_lb_scope: Option<crate::config::SocketLbScope>,
    /// The masquerade's NAT map (`nat4_v1`) as of its last sweep: entries, capacity, what the
    /// sweeps removed and what the programs counted.
    #[serde(default)]
    pub nat: crate::dataplane::nat_stats::NatStats,
}

/// `POST /v1/ipam/ops` body: a `weir ipam` operation for the agent to run on its datastore.
pub type IpamOpsRequest = weir_api::IpamOpsRequest<ipam::ops::Operation>;
