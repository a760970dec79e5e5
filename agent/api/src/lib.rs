//! The agent API contract (`docs/agent-api.md`): every request and response body of the agent's
//! unix-socket API (JSON over HTTP/1.1, `/v1/…`), its error object, and the one client that
//! `weir` (the operator CLI) and `weir-cni` use to talk to it. The agent's server answers with
//! these same types, so the two sides cannot drift apart.
//!
//! Light on purpose: serde only, plus hyper and tokio for the client (feature `client`, on by
//! default). Nothing of the agent (aya, axum, the datastores) comes with it.
//!
//! - `endpoint`: `PUT/GET/DELETE /v1/endpoints/…` and the endpoint key.
//! - `ipam`: `POST /v1/ipam/allocate|release|ops`, `GET /v1/ipam/handles/{handle}`.
//! - `status`: `GET /v1/status` (the part every client reads, and the agent's detail).
//! - `mechanism`: how the endpoint programs attach (`filter` or `tcx`).
//! - `monitor`: `GET /v1/monitor`, the drop events stream.
//! - `error`: the error object and its codes.
//! - `client`: the client over the unix socket.

#[cfg(feature = "client")]
pub mod client;
pub mod endpoint;
pub mod error;
pub mod ipam;
pub mod mechanism;
pub mod monitor;
pub mod status;

#[cfg(feature = "client")]
pub use client::{Client, ClientError};
pub use endpoint::{DeleteResponse, Endpoint, EndpointRequest, EndpointView, endpoint_key};
pub use error::{ErrorBody, ErrorObject, code};
pub use ipam::{
    AllocateRequest, AllocateResponse, Allocation, HandleStatus, IpamOpsRequest, ReleaseRequest,
    ReleaseResponse,
};
pub use mechanism::{Mechanism, UnknownMechanism};
pub use monitor::DropEventView;
pub use status::{PoolStatus, Status};
