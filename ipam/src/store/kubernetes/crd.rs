//! The custom resources of group `ipam.weir.dev`, one per [`Kind`]. Each spec is the model type itself, so the
//! objects hold exactly what the other backends store. All are cluster-scoped.
//!
//! `deploy/crds/*.yaml` is generated from these types: `cargo run -p ipam --example gen-crds`
//! (`ipam/tests/crd_drift.rs` fails when the committed files differ).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{
    model::{
        self, Block, EndpointRecord, Handle, Identity, IdentityKey, IpPool, IpamConfig, NodeRecord,
        Reservation,
    },
    store::Kind,
};

/// The API group.
pub const GROUP: &str = "ipam.weir.dev";
/// The API version.
pub const VERSION: &str = "v1";

/// Spec of an `IPPool`: a pool of addresses carved into blocks.
#[derive(CustomResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "ipam.weir.dev",
    version = "v1",
    kind = "IPPool",
    plural = "ippools",
    doc = "A pool of addresses that weir carves into host-affine blocks."
)]
pub struct IPPoolSpec {
    /// The pool.
    #[serde(flatten)]
    pub pool: IpPool,
}

/// Spec of the `IPAMConfig` singleton (named `default`).
#[derive(CustomResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "ipam.weir.dev",
    version = "v1",
    kind = "IPAMConfig",
    plural = "ipamconfigs",
    doc = "weir's IPAM settings; one object, named default."
)]
pub struct IPAMConfigSpec {
    /// The settings.
    #[serde(flatten)]
    pub config: IpamConfig,
}

/// Spec of an `IPReservation`: addresses no allocation may hand out.
#[derive(CustomResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "ipam.weir.dev",
    version = "v1",
    kind = "IPReservation",
    plural = "ipreservations",
    doc = "Addresses weir's IPAM never hands out."
)]
pub struct IPReservationSpec {
    /// The reservation.
    #[serde(flatten)]
    pub reservation: Reservation,
}

/// Spec of an `IPAMBlock`: one block's allocations and free list.
#[derive(CustomResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "ipam.weir.dev",
    version = "v1",
    kind = "IPAMBlock",
    plural = "ipamblocks",
    doc = "A block of addresses, its allocations and its free list. Written only by weir."
)]
pub struct IPAMBlockSpec {
    /// The block.
    #[serde(flatten)]
    pub block: Block,
}

/// Spec of a `BlockAffinity`: a host's claim on a block.
#[derive(CustomResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "ipam.weir.dev",
    version = "v1",
    kind = "BlockAffinity",
    plural = "blockaffinities",
    doc = "A host's claim on a block (pending, confirmed, pendingDeletion). Written only by weir."
)]
pub struct BlockAffinitySpec {
    /// The affinity.
    #[serde(flatten)]
    pub affinity: model::BlockAffinity,
}

/// Spec of an `IPAMHandle`: which blocks hold an owner's addresses.
#[derive(CustomResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "ipam.weir.dev",
    version = "v1",
    kind = "IPAMHandle",
    plural = "ipamhandles",
    doc = "An allocation handle and how many addresses it holds in each block. Written only by weir."
)]
pub struct IPAMHandleSpec {
    /// The handle.
    #[serde(flatten)]
    pub handle: Handle,
}

/// Spec of a `SecurityIdentity`: one cluster-wide identity number and its label set.
#[derive(CustomResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "ipam.weir.dev",
    version = "v1",
    kind = "SecurityIdentity",
    plural = "securityidentities",
    doc = "A cluster-wide security identity: its number, label set and the nodes using it. Written only by weir."
)]
pub struct SecurityIdentitySpec {
    /// The identity.
    #[serde(flatten)]
    pub identity: Identity,
}

/// Spec of a `SecurityIdentityKey`: the index from a label set to its identity.
#[derive(CustomResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "ipam.weir.dev",
    version = "v1",
    kind = "SecurityIdentityKey",
    plural = "securityidentitykeys",
    doc = "The index from a label set to its security identity. Written only by weir."
)]
pub struct SecurityIdentityKeySpec {
    /// The index entry.
    #[serde(flatten)]
    pub key: IdentityKey,
}

/// Spec of a `WeirNode`: a node record (standalone nodes sharing this datastore).
#[derive(CustomResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "ipam.weir.dev",
    version = "v1",
    kind = "WeirNode",
    plural = "weirnodes",
    doc = "A node record: the node's addresses, labels and heartbeat. Written only by weir."
)]
pub struct WeirNodeSpec {
    /// The record.
    #[serde(flatten)]
    pub node: NodeRecord,
}

/// Spec of a `WeirEndpoint`: a pod's addresses and labels as its node publishes them.
#[derive(CustomResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "ipam.weir.dev",
    version = "v1",
    kind = "WeirEndpoint",
    plural = "weirendpoints",
    doc = "A pod's addresses and labels as its node publishes them. Written only by weir."
)]
pub struct WeirEndpointSpec {
    /// The record.
    #[serde(flatten)]
    pub endpoint: EndpointRecord,
}

/// The resource that stores `kind`.
pub fn api_resource(kind: Kind) -> kube::core::ApiResource {
    match kind {
        Kind::Pool => IPPool::api_resource(),
        Kind::Config => IPAMConfig::api_resource(),
        Kind::Reservation => IPReservation::api_resource(),
        Kind::Block => IPAMBlock::api_resource(),
        Kind::Affinity => BlockAffinity::api_resource(),
        Kind::Handle => IPAMHandle::api_resource(),
        Kind::Identity => SecurityIdentity::api_resource(),
        Kind::IdentityKey => SecurityIdentityKey::api_resource(),
        Kind::Node => WeirNode::api_resource(),
        Kind::Endpoint => WeirEndpoint::api_resource(),
    }
}

/// Every definition, in [`Kind::ALL`] order.
pub fn definitions() -> Vec<CustomResourceDefinition> {
    vec![
        IPPool::crd(),
        IPAMConfig::crd(),
        IPReservation::crd(),
        IPAMBlock::crd(),
        BlockAffinity::crd(),
        IPAMHandle::crd(),
        SecurityIdentity::crd(),
        SecurityIdentityKey::crd(),
        WeirNode::crd(),
        WeirEndpoint::crd(),
    ]
}

/// The definitions as `deploy/crds/` holds them: file name (`<plural>.yaml`) and YAML text.
pub fn definition_files() -> Result<Vec<(String, String)>, serde_norway::Error> {
    definitions()
        .into_iter()
        .map(|crd| {
            let file = format!("{}.yaml", crd.spec.names.plural);
            let text = serde_norway::to_string(&crd)?;
            Ok((
                file,
                format!(
                    "# Generated by `cargo run -p ipam --example gen-crds`; do not edit.\n{text}"
                ),
            ))
        })
        .collect()
}
