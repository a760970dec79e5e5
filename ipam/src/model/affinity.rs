//! Block affinities: which host owns which block, claimed in two phases.

use ipnetwork::IpNetwork;
use serde::{Deserialize, Serialize};

/// Where an affinity is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum AffinityState {
    /// Written before the block is claimed.
    Pending,
    /// The block is this host's.
    Confirmed,
    /// Being released.
    PendingDeletion,
}

/// A host's claim on a block. Keyed `<host>/<cidr>`, so a host's affinities are one prefix listing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BlockAffinity {
    /// The host.
    pub host: String,
    /// The block.
    #[schemars(with = "String")]
    pub cidr: IpNetwork,
    /// The claim's state.
    pub state: AffinityState,
    /// Soft-delete marker; readers skip deleted rows.
    #[serde(default)]
    pub deleted: bool,
}

impl BlockAffinity {
    /// The datastore name of the affinity of `host` for `cidr`.
    pub fn key_name(host: &str, cidr: &IpNetwork) -> String {
        format!("{host}/{}", crate::cidr::cidr_name(cidr))
    }

    /// The listing prefix for every affinity of `host`.
    pub fn host_prefix(host: &str) -> String {
        format!("{host}/")
    }
}
