//! IPAM: `POST /v1/ipam/allocate`, `POST /v1/ipam/release`, `GET /v1/ipam/handles/{handle}`,
//! `POST /v1/ipam/ops`.

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use crate::Mechanism;

/// `POST /v1/ipam/allocate` body.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllocateRequest {
    /// Owner handle (`<network>.<container id>` from weir-cni).
    pub handle: String,
    /// IPv4 addresses wanted.
    #[serde(default)]
    pub ipv4: u32,
    /// IPv6 addresses wanted.
    #[serde(default)]
    pub ipv6: u32,
    /// Restrict to these pools.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<String>,
    /// Exact addresses wanted (instead of counts).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<IpAddr>,
    /// Pod namespace (empty: none known), as in [`crate::EndpointRequest`].
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Pod name (empty: none known).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod: String,
    /// Container id.
    #[serde(default)]
    pub container_id: String,
    /// Seconds until an unconfirmed allocation is released (the agent's default when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in_secs: Option<u64>,
}

/// An allocation: what a handle holds until an endpoint confirms it or it expires.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    /// The handle.
    pub handle: String,
    /// The addresses.
    pub ips: Vec<IpAddr>,
    /// Unix seconds after which it is released unless confirmed.
    pub expires_at: u64,
}

/// `POST /v1/ipam/allocate` answer: the allocation, and the agent's pin root and attach
/// mechanism, so weir-cni attaches this agent's programs (never another agent's, nor stale
/// pins) the way this agent does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocateResponse {
    /// The allocation.
    #[serde(flatten)]
    pub allocation: Allocation,
    /// The agent's bpffs pin root (empty from an agent that does not say: see
    /// [`AllocateResponse::agent_pin_root`]).
    #[serde(default)]
    pub bpf_root: PathBuf,
    /// How this agent attaches the endpoint programs (`--tc-attach`); `None` from an agent that
    /// does not say.
    #[serde(default)]
    pub tc_attach: Option<Mechanism>,
}

impl AllocateResponse {
    /// The agent's pin root, `None` when the agent did not say.
    #[must_use]
    pub fn agent_pin_root(&self) -> Option<&Path> {
        crate::status::pin_root(&self.bpf_root)
    }
}

/// `GET /v1/ipam/handles/{handle}`: what the agent holds under a handle.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandleStatus {
    /// The handle.
    #[serde(default)]
    pub handle: String,
    /// Its addresses (empty: it holds none).
    #[serde(default)]
    pub ips: Vec<IpAddr>,
    /// True once an endpoint confirmed the allocation (it no longer expires).
    #[serde(default)]
    pub confirmed: bool,
    /// When an unconfirmed allocation is released.
    #[serde(default)]
    pub expires_at: Option<u64>,
}

/// `POST /v1/ipam/release` body: a handle, or addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseRequest {
    /// Release everything under this handle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handle: Option<String>,
    /// Or these addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<IpAddr>,
}

/// `POST /v1/ipam/release` answer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseResponse {
    /// Released addresses.
    #[serde(default)]
    pub released: Vec<IpAddr>,
    /// Addresses that were not allocated.
    #[serde(default)]
    pub not_allocated: Vec<IpAddr>,
}

/// `POST /v1/ipam/ops` body: a `weir ipam` operation for the agent to run on its datastore. The
/// operation is the IPAM library's (`ipam::ops::Operation`), a type parameter here so this crate
/// stays free of the library.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IpamOpsRequest<O> {
    /// The datastore the command was given (`embedded:ABSOLUTE-PATH`); the agent runs the
    /// operation only when it holds that datastore, else it answers
    /// [`code::NOT_THIS_DATASTORE`](crate::code::NOT_THIS_DATASTORE).
    pub datastore: String,
    /// The operation.
    pub operation: O,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_bodies_parse_and_unknown_parts_stay_off_the_wire() {
        let req: AllocateRequest = serde_json::from_str(
            r#"{"handle": "weir-net.3f9a", "ipv4": 1, "ipv6": 0, "pools": ["default-ipv4"],
                "namespace": "default", "pod": "web-0", "container_id": "3f9a",
                "expires_in_secs": 600}"#,
        )
        .expect("documented request");
        assert_eq!(
            (req.namespace.as_str(), req.pod.as_str()),
            ("default", "web-0")
        );
        // What a CNI call without Kubernetes arguments sends: no namespace, pod, pools or ips.
        let bare = AllocateRequest {
            handle: "n.c".into(),
            ipv4: 1,
            container_id: "c".into(),
            ..AllocateRequest::default()
        };
        assert_eq!(
            serde_json::to_value(&bare).expect("json"),
            serde_json::json!({"handle": "n.c", "ipv4": 1, "ipv6": 0, "container_id": "c"})
        );
        assert!(
            serde_json::from_str::<AllocateRequest>(r#"{"handle": "h", "size": 1}"#).is_err(),
            "an unknown field is refused"
        );
        let answer: AllocateResponse = serde_json::from_str(
            r#"{"handle": "h", "ips": ["10.244.0.9"], "expires_at": 1767000000,
                "bpf_root": "/sys/fs/bpf/weir", "tc_attach": "filter"}"#,
        )
        .expect("documented answer");
        assert_eq!(answer.agent_pin_root(), Some(Path::new("/sys/fs/bpf/weir")));
        assert_eq!(answer.tc_attach, Some(Mechanism::Filter));
        // An agent that says neither.
        let older: AllocateResponse =
            serde_json::from_str(r#"{"handle": "h", "ips": [], "expires_at": 0}"#).expect("older");
        assert_eq!((older.agent_pin_root(), older.tc_attach), (None, None));
    }
}
