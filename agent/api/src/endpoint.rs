//! Endpoints: `PUT/GET/DELETE /v1/endpoints/{container_id}:{ifname}`, `GET /v1/endpoints`.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

/// The key of a container's interface, `<container_id>:<ifname>`: the endpoint's path segment
/// in the API and its key in the agent's registry.
#[must_use]
pub fn endpoint_key(container_id: &str, ifname: &str) -> String {
    format!("{container_id}:{ifname}")
}

/// An endpoint: one workload interface, as the agent registers it (and persists it in its
/// registry) and answers it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    /// Stable numeric id (the programs key policy by it).
    pub id: u32,
    /// The container (sandbox) id.
    pub container_id: String,
    /// The interface name inside the pod.
    pub ifname: String,
    /// The host-side veth (`weir…`).
    pub host_ifname: String,
    /// The pod's network namespace path.
    #[serde(default)]
    pub netns: String,
    /// Kubernetes namespace (`default` when the CNI had none).
    #[serde(default)]
    pub namespace: String,
    /// Pod name.
    #[serde(default)]
    pub pod: String,
    /// Pod labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The IPAM handle holding its addresses.
    #[serde(default)]
    pub handle: String,
    /// Its addresses.
    pub ips: Vec<IpAddr>,
}

impl Endpoint {
    /// Its key `<container_id>:<ifname>`.
    #[must_use]
    pub fn key(&self) -> String {
        endpoint_key(&self.container_id, &self.ifname)
    }
}

/// `PUT /v1/endpoints/{container_id}:{ifname}` body.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
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
    /// Namespace (empty: none known; the agent files the endpoint under `default`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Pod (empty: none known).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod: String,
    /// Labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// IPAM handle holding `ips`.
    #[serde(default)]
    pub handle: String,
    /// Addresses.
    pub ips: Vec<IpAddr>,
}

impl EndpointRequest {
    /// Its key `<container_id>:<ifname>` (the path it is put at).
    #[must_use]
    pub fn key(&self) -> String {
        endpoint_key(&self.container_id, &self.ifname)
    }
}

/// An endpoint as the API returns it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointView {
    /// The endpoint.
    #[serde(flatten)]
    pub endpoint: Endpoint,
    /// Its security identity.
    #[serde(default)]
    pub identity: Option<u32>,
    /// The host link's ifindex, when the link exists.
    #[serde(default)]
    pub ifindex: Option<u32>,
}

/// `DELETE /v1/endpoints/…` answer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteResponse {
    /// True when an endpoint was removed.
    #[serde(default)]
    pub deleted: bool,
    /// Addresses released.
    #[serde(default)]
    pub released: Vec<IpAddr>,
    /// The agent's bpffs pin root (where weir-cni removes the link pins; empty from an agent
    /// that does not say: see [`DeleteResponse::agent_pin_root`]).
    #[serde(default)]
    pub bpf_root: PathBuf,
}

impl DeleteResponse {
    /// The agent's pin root, `None` when the agent did not say.
    #[must_use]
    pub fn agent_pin_root(&self) -> Option<&Path> {
        crate::status::pin_root(&self.bpf_root)
    }
}
