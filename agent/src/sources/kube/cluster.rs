//! The cluster as the watchers delivered it: one store per kind of converted objects (Services and
//! EndpointSlices by `services::convert`, the other kinds by `policy::convert`), the
//! conversion errors by object, the whole `PolicySet` the loop takes first and the per-object
//! deltas it takes afterwards.

use std::{collections::BTreeMap, path::PathBuf};

use k8s_openapi::api::{
    core::v1::{Namespace, Node, Pod, Service as K8sService},
    discovery::v1::EndpointSlice as K8sSlice,
    networking::v1::NetworkPolicy,
};

use super::{
    nodes::KubeNode,
    store::{Key, KindStore},
    watch::{Change, Kind},
};
use crate::calc::{
    policy::{
        convert,
        delta::{Delta, NamespaceObject, ObjectChange},
        load::PolicyFileError,
        model::{Pod as PodInfo, Policy, PolicySet},
    },
    services::{
        self,
        model::{EndpointSlice, Service},
    },
};

/// A converted object (by `policy::convert`, as the standalone directory's), or why it could
/// not be converted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Object {
    /// A NetworkPolicy.
    Policy(Result<Policy, String>),
    /// A Namespace's labels and weir annotations.
    Namespace(Result<NamespaceObject, String>),
    /// A Pod.
    Pod(Result<PodInfo, String>),
    /// A Node (with its readiness, for the node records).
    Node(Result<KubeNode, String>),
    /// A Service (by `services::convert`, as the standalone directory's).
    Service(Result<Service, String>),
    /// An EndpointSlice.
    EndpointSlice(Result<EndpointSlice, String>),
}

/// Converts a NetworkPolicy.
pub fn policy(np: &NetworkPolicy) -> Object {
    Object::Policy(convert::policy(np).map_err(|e| e.to_string()))
}

/// Converts a Namespace.
pub fn namespace(ns: &Namespace) -> Object {
    Object::Namespace(
        convert::namespace(ns)
            .map(|(_, labels)| NamespaceObject {
                labels,
                annotations: convert::weir_annotations(&ns.metadata),
            })
            .map_err(|e| e.to_string()),
    )
}

/// Converts a Pod.
pub fn pod(pod: &Pod) -> Object {
    Object::Pod(convert::pod(pod).map_err(|e| e.to_string()))
}

/// Converts a Node.
pub fn node(node: &Node) -> Object {
    Object::Node(
        convert::node(node)
            .map(|info| KubeNode {
                info,
                not_ready_since: super::nodes::not_ready_since(node),
            })
            .map_err(|e| e.to_string()),
    )
}

/// Converts a Service.
pub fn service(s: &K8sService) -> Object {
    Object::Service(services::convert::service(s).map_err(|e| e.to_string()))
}

/// Converts an EndpointSlice.
pub fn endpoint_slice(s: &K8sSlice) -> Object {
    Object::EndpointSlice(services::convert::endpoint_slice(s).map_err(|e| e.to_string()))
}

/// Every kind's objects.
#[derive(Debug, Default)]
pub struct Cluster {
    objects: BTreeMap<Kind, KindStore<Object>>,
}

impl Cluster {
    /// Takes one watcher change; answers the objects it changed (none while a list is under
    /// way, nor for a relist of unchanged objects).
    pub fn take(&mut self, change: Change) -> Vec<Key> {
        let store = self.objects.entry(change.kind()).or_default();
        match change {
            Change::Init(_) => {
                store.init();
                Vec::new()
            }
            Change::InitApply(_, key, object) => {
                store.init_apply(key, object);
                Vec::new()
            }
            Change::InitDone(_) => store.init_done(),
            Change::Apply(_, key, object) => {
                if store.apply(key.clone(), object) {
                    vec![key]
                } else {
                    Vec::new()
                }
            }
            Change::Delete(_, key) => {
                if store.delete(&key) {
                    vec![key]
                } else {
                    Vec::new()
                }
            }
            Change::Error(..) => Vec::new(),
        }
    }

    /// Object `key` of `kind` as it is now, as a delta for the loop: its converted form, or its
    /// absence (deleted, or refused — with the reason).
    #[must_use]
    pub fn delta(&self, kind: Kind, key: &Key) -> Delta {
        let object = self.objects.get(&kind).and_then(|s| s.live().get(key));
        let change = match kind {
            Kind::Pods => ObjectChange::Pod(
                key.clone(),
                match object {
                    Some(Object::Pod(Ok(p))) => Some(p.clone()),
                    _ => None,
                },
            ),
            Kind::Namespaces => ObjectChange::Namespace(
                key.1.clone(),
                match object {
                    Some(Object::Namespace(Ok(ns))) => Some(ns.clone()),
                    _ => None,
                },
            ),
            Kind::NetworkPolicies => ObjectChange::Policy(
                key.clone(),
                match object {
                    Some(Object::Policy(Ok(p))) => Some(p.clone()),
                    _ => None,
                },
            ),
            Kind::Nodes => ObjectChange::Node(
                key.1.clone(),
                match object {
                    Some(Object::Node(Ok(n))) => Some(n.info.clone()),
                    _ => None,
                },
            ),
            Kind::Services => ObjectChange::Service(
                key.clone(),
                match object {
                    Some(Object::Service(Ok(s))) => Some(s.clone()),
                    _ => None,
                },
            ),
            Kind::EndpointSlices => ObjectChange::EndpointSlice(
                key.clone(),
                match object {
                    Some(Object::EndpointSlice(Ok(s))) => Some(s.clone()),
                    _ => None,
                },
            ),
        };
        Delta {
            object: object_name(kind, key),
            change,
            refused: object.and_then(Object::error).map(str::to_owned),
        }
    }

    /// True once every kind delivered its initial list.
    #[must_use]
    pub fn synced(&self) -> bool {
        Kind::ALL
            .iter()
            .all(|k| self.objects.get(k).is_some_and(KindStore::synced))
    }

    /// Every Node that converted, by name, once the Nodes' first list is in.
    #[must_use]
    pub fn nodes(&self) -> Option<BTreeMap<String, KubeNode>> {
        let store = self.objects.get(&Kind::Nodes).filter(|s| s.synced())?;
        Some(
            store
                .live()
                .values()
                .filter_map(|object| match object {
                    Object::Node(Ok(n)) => Some((n.info.name.clone(), n.clone())),
                    _ => None,
                })
                .collect(),
        )
    }

    /// Objects known, by kind.
    #[must_use]
    pub fn counts(&self) -> BTreeMap<Kind, usize> {
        self.objects
            .iter()
            .map(|(k, s)| (*k, s.live().len()))
            .collect()
    }

    /// The whole set, and every object that could not be converted (named `Kind ns/name`).
    #[must_use]
    pub fn set(&self) -> (PolicySet, Vec<PolicyFileError>) {
        let mut set = PolicySet::default();
        let mut errors = Vec::new();
        let mut refuse = |kind: Kind, key: &Key, reason: &String| {
            errors.push(PolicyFileError {
                file: PathBuf::from(object_name(kind, key)),
                line: 0,
                reason: reason.clone(),
            });
        };
        for (kind, store) in &self.objects {
            for (key, object) in store.live() {
                match object {
                    Object::Policy(Ok(p)) => {
                        set.policies.insert(key.clone(), p.clone());
                    }
                    Object::Namespace(Ok(ns)) => {
                        set.namespaces.insert(key.1.clone(), ns.labels.clone());
                        if !ns.annotations.is_empty() {
                            set.namespace_annotations
                                .insert(key.1.clone(), ns.annotations.clone());
                        }
                    }
                    Object::Pod(Ok(p)) => {
                        set.pods.insert(key.clone(), p.clone());
                    }
                    Object::Node(Ok(n)) => {
                        set.nodes.insert(key.1.clone(), n.info.clone());
                    }
                    Object::Service(Ok(s)) => {
                        set.services.insert(key.clone(), s.clone());
                    }
                    Object::EndpointSlice(Ok(s)) => {
                        set.endpoint_slices.insert(key.clone(), s.clone());
                    }
                    Object::Policy(Err(e))
                    | Object::Namespace(Err(e))
                    | Object::Pod(Err(e))
                    | Object::Node(Err(e))
                    | Object::Service(Err(e))
                    | Object::EndpointSlice(Err(e)) => refuse(*kind, key, e),
                }
            }
        }
        (set, errors)
    }
}

/// `NetworkPolicy ns/name`, `Node name`: how the log and the status name an object.
#[must_use]
pub fn object_name(kind: Kind, (namespace, name): &Key) -> String {
    if namespace.is_empty() {
        format!("{} {name}", kind.name())
    } else {
        format!("{} {namespace}/{name}", kind.name())
    }
}

impl Object {
    /// Why the object could not be converted, if it could not.
    #[must_use]
    pub fn error(&self) -> Option<&str> {
        match self {
            Self::Policy(Err(e))
            | Self::Namespace(Err(e))
            | Self::Pod(Err(e))
            | Self::Node(Err(e))
            | Self::Service(Err(e))
            | Self::EndpointSlice(Err(e)) => Some(e),
            _ => None,
        }
    }
}
