//! One object's change, as a watching source sends it once its initial lists are in (the
//! Kubernetes source): the object's new converted form, or its absence (deleted, or refused — then
//! with the reason, reported in status naming the object).

use std::collections::BTreeMap;

use super::{
    load::PolicyFileError,
    model::{Labels, NodeInfo, Pod, Policy},
};
use crate::calc::services::model::{EndpointSlice, Service};

/// An object's key: (namespace, name).
pub type Key = (String, String);

/// A Namespace as the calculation and IPAM take it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespaceObject {
    /// Its labels (its pods' identities carry them).
    pub labels: Labels,
    /// Its `weir.dev/` annotations (pools for its pods: `pod_ipam`).
    pub annotations: BTreeMap<String, String>,
}

/// What became of one object: `Some` its new form, `None` gone (or refused).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ObjectChange {
    /// A Pod, by (namespace, name).
    Pod(Key, Option<Pod>),
    /// A Namespace's labels and weir annotations, by name.
    Namespace(String, Option<NamespaceObject>),
    /// A NetworkPolicy, by (namespace, name).
    Policy(Key, Option<Policy>),
    /// A Node, by name.
    Node(String, Option<NodeInfo>),
    /// A Service, by (namespace, name).
    Service(Key, Option<Service>),
    /// An EndpointSlice, by (namespace, name).
    EndpointSlice(Key, Option<EndpointSlice>),
}

/// One object's change with its name (`Pod ns/name`, `Node name`) and, when the source could
/// not convert it, why (the object is then absent, the rest applies).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delta {
    /// How status and the log name the object.
    pub object: String,
    /// The change.
    pub change: ObjectChange,
    /// Why the object was refused, if it was.
    pub refused: Option<String>,
}

impl Delta {
    /// The refusal as status lists it (`object:0: reason`), if the object was refused.
    #[must_use]
    pub fn error(&self) -> Option<PolicyFileError> {
        self.refused.as_ref().map(|reason| PolicyFileError {
            file: self.object.clone().into(),
            line: 0,
            reason: reason.clone(),
        })
    }
}
