//! The agent API contract (`docs/agent-api.md`): every request and response body of the agent's
//! unix-socket API (JSON over HTTP/1.1, `/v1/…`), its error object, and the one client that
//! `weir` (the operator CLI) and `weir-cni` use to talk to it. The agent's server answers with
//! these same types, so the two sides cannot drift apart.
//!
//! Light on purpose: serde (and ipnetwork for node blocks) only, plus hyper and tokio for the
//! client (feature `client`, on by default). Nothing of the agent (aya, axum, the datastores)
//! comes with it: the agent builds these types from its own state. The one body that is not this
//! crate's is the operation and outcome of `POST /v1/ipam/ops`, the IPAM library's types.
//!
//! - `endpoint`: `PUT/GET/DELETE /v1/endpoints/…` and the endpoint key.
//! - `ipam`: `POST /v1/ipam/allocate|release|ops`, `GET /v1/ipam/handles/{handle}`.
//! - `status`: `GET /v1/status` (the part every client reads, and the agent's detail).
//! - `nodes`: `GET /v1/nodes`, `GET /v1/addresses`.
//! - `services`: `GET /v1/services`, `GET /v1/services/flows`.
//! - `bpf`: `GET /v1/bpf/maps|counters|nat`, `GET|DELETE /v1/bpf/ct`.
//! - `policy`: `POST /v1/policy/trace`, `GET /v1/policy/rules`.
//! - `mechanism`: how the endpoint programs attach (`filter` or `tcx`).
//! - `monitor`: `GET /v1/monitor`, the drop events stream.
//! - `log_level`: `POST /v1/log-level`, the agent's log filter.
//! - `error`: the error object and its codes.
//! - `client`: the client over the unix socket.

pub mod bpf;
#[cfg(feature = "client")]
pub mod client;
pub mod endpoint;
pub mod error;
pub mod ipam;
pub mod log_level;
pub mod mechanism;
pub mod monitor;
pub mod nodes;
pub mod policy;
pub mod services;
pub mod status;

pub use bpf::{CounterView, CtFlushResponse, CtView, MapView, NatView};
/// Where the agent listens by default (`weir agent --api-socket`, `weir … --api-socket`,
/// weir-cni's `agentSocket`).
pub const DEFAULT_SOCKET: &str = "/run/weir/weir.sock";

#[cfg(feature = "client")]
pub use client::{Client, ClientError};
pub use endpoint::{DeleteResponse, Endpoint, EndpointRequest, EndpointView, endpoint_key};
pub use error::{ErrorBody, ErrorObject, code};
pub use ipam::{
    AllocateRequest, AllocateResponse, Allocation, HandleStatus, IpamOpsRequest, ReleaseRequest,
    ReleaseResponse,
};
pub use log_level::LogLevel;
pub use mechanism::{Mechanism, UnknownMechanism};
pub use monitor::DropEventView;
pub use nodes::{AddressView, NodeSource, NodeStatus};
pub use policy::{
    KernelStep, KernelTrace, RuleHitsView, ServiceStep, Step, TraceRequest, TraceResult,
};
pub use services::{BackendState, BackendView, FlowView, ServiceView};
pub use status::{
    Applied, AttachCounters, ConntrackStats, DataplaneStatus, DriverCounters, NatStats,
    NodeSummary, PoolStatus, SocketLbScope, Status, StatusDetail, StorageFault, StorageStatus,
};
