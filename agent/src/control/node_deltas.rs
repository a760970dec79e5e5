//! Per-object changes from a watching source (the Kubernetes source once its first whole set is
//! in): each delta touches only what its object affects — one policy's rules, one namespace's
//! classes, one pod's endpoint or remote entry — instead of diffing the whole set.

use std::{collections::BTreeSet, sync::Arc};

use super::{Node, NodeError};

use weir_api::Endpoint;

use crate::calc::policy::{
    delta::{Delta, Key, NamespaceObject, ObjectChange},
    model::Pod,
    pods, warnings,
};

/// What a batch of deltas did.
#[derive(Debug, Default)]
pub struct DeltasApplied {
    /// Endpoints whose view may have changed (their Pod's or their namespace's labels moved
    /// them to another identity).
    pub relabelled: BTreeSet<String>,
    /// A policy changed (the rules in force must be listed again).
    pub policies: bool,
    /// A Service or an EndpointSlice changed (the service views must be rebuilt).
    pub services: bool,
    /// Objects whose change could not be applied, and why (each keeps its previous form).
    pub failed: Vec<(String, NodeError)>,
    /// The generation to apply.
    pub generation: u64,
}

impl Node {
    /// Applies a watching source's per-object changes (after its first whole set): each object
    /// takes its new form, or goes; a refused object goes and is listed in status by name.
    pub fn apply_deltas(&mut self, deltas: Vec<Delta>) -> DeltasApplied {
        let mut out = DeltasApplied::default();
        let (mut service_keys, mut slice_keys) = (Vec::new(), Vec::new());
        for delta in deltas {
            self.policy_errors
                .retain(|e| e.file.as_os_str() != delta.object.as_str());
            if let Some(error) = delta.error() {
                self.policy_errors.push(error);
            }
            self.delta_warnings(&delta.change);
            let result = match delta.change {
                ObjectChange::Policy(key, policy) => {
                    out.policies = true;
                    self.calc
                        .set_policy(&key, policy.as_ref())
                        .map(drop)
                        .map_err(NodeError::from)
                }
                ObjectChange::Namespace(name, ns) => {
                    self.namespace_delta(&name, ns.as_ref(), &mut out.relabelled)
                }
                ObjectChange::Pod(key, pod) => self.pod_delta(key, pod, &mut out.relabelled),
                ObjectChange::Node(name, node) => {
                    match node {
                        Some(node) => self.cluster.nodes.insert(name, node),
                        None => self.cluster.nodes.remove(&name),
                    };
                    Ok(())
                }
                ObjectChange::Service(key, service) => {
                    out.services = true;
                    service_keys.push(key.clone());
                    match service {
                        Some(service) => self.cluster.services.insert(key, service),
                        None => self.cluster.services.remove(&key),
                    };
                    Ok(())
                }
                ObjectChange::EndpointSlice(key, slice) => {
                    out.services = true;
                    slice_keys.push(key.clone());
                    match slice {
                        Some(slice) => self.cluster.endpoint_slices.insert(key, slice),
                        None => self.cluster.endpoint_slices.remove(&key),
                    };
                    Ok(())
                }
            };
            if let Err(e) = result {
                out.failed.push((delta.object, e));
            }
        }
        if out.services {
            // The service maps follow the model: only the Services these objects touch are
            // recomputed, and the drivers write only what changed.
            let changed = self.dataplane.services.update(
                &self.cluster.services,
                &self.cluster.endpoint_slices,
                service_keys,
                slice_keys,
            );
            self.refresh_service_views(changed);
        }
        self.flush();
        out.generation = self.changed();
        out
    }

    /// Replaces the caveats (`policy::warnings`) of the object `change` names with its new ones
    /// (each new one logged naming the object). A Pod's change does not re-check the named ports
    /// of other policies; the next change of such a policy does.
    fn delta_warnings(&mut self, change: &ObjectChange) {
        let mut new = Vec::new();
        match change {
            ObjectChange::Policy((ns, name), policy) => {
                let prefix = warnings::prefix("NetworkPolicy", ns, name);
                self.policy_warnings.retain(|w| !w.starts_with(&prefix));
                if let Some(policy) = policy {
                    let pods = &self.cluster.pods;
                    new.extend(
                        warnings::of_policy(policy, self.calc.has_namespace(ns), |n| {
                            pods.values().any(|p| {
                                p.named_ports
                                    .iter()
                                    .any(|d| d.protocol == n.protocol && d.name == n.name)
                            })
                        })
                        .into_iter()
                        .map(|w| w.reason),
                    );
                }
            }
            ObjectChange::Pod((ns, name), pod) => {
                let prefix = warnings::prefix("Pod", ns, name);
                self.policy_warnings.retain(|w| !w.starts_with(&prefix));
                if pod.is_some() {
                    new.extend(
                        warnings::of_pod(ns, name, self.calc.has_namespace(ns)).map(|w| w.reason),
                    );
                }
            }
            ObjectChange::Namespace(name, Some(_)) => {
                let missing = format!("is in namespace {name:?}, which has no Namespace object");
                self.policy_warnings.retain(|w| !w.contains(&missing));
            }
            ObjectChange::Namespace(_, None)
            | ObjectChange::Node(..)
            | ObjectChange::Service(..)
            | ObjectChange::EndpointSlice(..) => {}
        }
        for w in &new {
            tracing::warn!(warning = %w, "a source object applies with a caveat");
        }
        self.policy_warnings.extend(new);
    }

    fn namespace_delta(
        &mut self,
        name: &str,
        ns: Option<&NamespaceObject>,
        relabelled: &mut BTreeSet<String>,
    ) -> Result<(), NodeError> {
        let annotations = ns.map(|ns| &ns.annotations).filter(|a| !a.is_empty());
        match annotations {
            Some(a) => self
                .cluster
                .namespace_annotations
                .insert(name.to_owned(), a.clone()),
            None => self.cluster.namespace_annotations.remove(name),
        };
        Arc::make_mut(&mut self.ipam_hints).set_namespace(name, annotations);
        if self.calc.set_namespace(name, ns.map(|ns| &ns.labels))? {
            relabelled.extend(
                self.registry
                    .endpoints()
                    .filter(|e| e.namespace == name)
                    .map(Endpoint::key),
            );
        }
        Ok(())
    }

    /// A Pod changed: a local endpoint of it takes its labels and named ports; any other pod is
    /// a remote pod (or none: on this node, on the host network, without an address).
    fn pod_delta(
        &mut self,
        key: Key,
        pod: Option<Pod>,
        relabelled: &mut BTreeSet<String>,
    ) -> Result<(), NodeError> {
        let locals: Vec<&Endpoint> = self
            .registry
            .endpoints()
            .filter(|e| !e.pod.is_empty() && e.namespace == key.0 && e.pod == key.1)
            .collect();
        let remote_key = pods::remote_key(&key.0, &key.1);
        if locals.is_empty() {
            let remote = pod
                .as_ref()
                .and_then(|p| pods::remote_pod(p, false, self.node_name.as_deref()));
            self.calc.set_remote_pod(&remote_key, remote.as_ref())?;
        } else {
            let moved: Vec<Endpoint> = locals
                .iter()
                .filter_map(|e| {
                    let labels = pod.as_ref().map_or(&e.labels, |p| &p.labels);
                    (*labels != pods::effective(e, &self.cluster).labels).then(|| Endpoint {
                        labels: labels.clone(),
                        ..(*e).clone()
                    })
                })
                .collect();
            let keys: Vec<String> = locals.iter().map(|e| e.key()).collect();
            self.calc
                .upsert_endpoints(&moved.iter().collect::<Vec<_>>())?;
            relabelled.extend(moved.iter().map(Endpoint::key));
            let ports = pod
                .as_ref()
                .map(|p| p.named_ports.clone())
                .unwrap_or_default();
            for key in keys {
                self.calc.set_endpoint_ports(&key, ports.clone());
            }
            self.calc.set_remote_pod(&remote_key, None)?;
        }
        Arc::make_mut(&mut self.ipam_hints).set_pod(&key, pod.as_ref().map(|p| &p.annotations));
        match pod {
            Some(pod) => self.cluster.pods.insert(key, pod),
            None => self.cluster.pods.remove(&key),
        };
        Ok(())
    }
}
