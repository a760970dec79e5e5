//! Cluster-wide security identities: one number per label set, the same on every node.
//!
//! Two objects per identity, written together: the [`Identity`] (named by its number, claims it) and its
//! [`IdentityKey`] (named by a hash of the labels, finds it). Users are nodes, each renewing its use; an
//! identity whose users have all gone or stopped renewing is released after a grace period (see
//! [`crate::identity`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// An allocated identity.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Identity {
    /// The number.
    pub id: u32,
    /// The label set, canonical (sorted).
    pub labels: BTreeMap<String, String>,
    /// The name of its [`IdentityKey`].
    pub key: String,
    /// Node name → when it last said it uses this identity (seconds since the Unix epoch).
    #[serde(default)]
    pub users: BTreeMap<String, u64>,
    /// When the last user let go (seconds since the Unix epoch); `None` while in use.
    #[serde(default)]
    pub unused_since: Option<u64>,
}

/// The index from a label set to its identity.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IdentityKey {
    /// The label set (compared in full: the key's name is only a hash).
    pub labels: BTreeMap<String, String>,
    /// Its identity.
    pub id: u32,
}
