//! The API's error object: `{"error": {"code": "<kebab-case>", "message": "<what to fix>"}}`
//! with a 4xx/5xx status.

use serde::{Deserialize, Serialize};

/// The body of every error answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorObject,
}

/// An error: a machine-readable code and a message for the operator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorObject {
    /// Machine-readable code (kebab-case, one of [`code`]).
    pub code: String,
    /// What to fix.
    pub message: String,
}

/// The error codes the agent answers with.
pub mod code {
    /// 400: the request is malformed or names something invalid.
    pub const INVALID_REQUEST: &str = "invalid-request";
    /// 404: no such endpoint (or route).
    pub const NOT_FOUND: &str = "not-found";
    /// 409: the pools cannot satisfy the allocation.
    pub const EXHAUSTED: &str = "exhausted";
    /// 400: a pool named does not exist or is disabled.
    pub const UNKNOWN_POOL: &str = "unknown-pool";
    /// 400: an address requested is in no pool.
    pub const ADDRESS_NOT_IN_POOL: &str = "address-not-in-pool";
    /// 409: an address requested is already allocated.
    pub const ADDRESS_IN_USE: &str = "address-in-use";
    /// 503: the allocation did not complete in time.
    pub const TIMEOUT: &str = "timeout";
    /// 503: the datastore cannot be reached (or the allocator stopped).
    pub const DATASTORE_UNAVAILABLE: &str = "datastore-unavailable";
    /// 503: the agent cannot write a state file (a full disk): retry once it writes again.
    pub const STORAGE_UNAVAILABLE: &str = "storage-unavailable";
    /// 503: the cluster source has not delivered the pod a CNI request names (yet).
    pub const POD_UNKNOWN: &str = "pod-unknown";
    /// 503: the dataplane did not apply the change in time.
    pub const DATAPLANE_NOT_READY: &str = "dataplane-not-ready";
    /// 409 on `POST /v1/ipam/ops`: the agent does not hold the datastore named.
    pub const NOT_THIS_DATASTORE: &str = "not-this-datastore";
    /// 500: anything else.
    pub const INTERNAL: &str = "internal";
}
