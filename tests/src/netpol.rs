//! A model of upstream NetworkPolicy semantics for computing the connectivity a test expects
//! (as the upstream e2e truth tables do), never written by hand: given the namespaces' labels,
//! the pods and the policies, whether a TCP connection from one pod (or the node) to another's
//! port is allowed. Covers ingress and egress, `podSelector`, `namespaceSelector` (alone and
//! together in one peer), `matchLabels` and `matchExpressions`, numeric ports with `endPort`,
//! and `policyTypes` defaulted as the API server defaults them. weir's documented exception is
//! modelled too: the node's own traffic may always enter a pod (kubelet probes).
//!
//! Policies are built with the `k8s-openapi` types, so the same objects the model reads are what
//! [`manifest`] writes for the agent.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        core::v1::Namespace,
        networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort},
    },
    apimachinery::pkg::{apis::meta::v1::LabelSelector, util::intstr::IntOrString},
};

/// Labels.
pub type Labels = BTreeMap<String, String>;

/// A pod as the model sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelPod {
    /// Its namespace.
    pub namespace: String,
    /// Its labels.
    pub labels: Labels,
}

/// Where a connection comes from.
#[derive(Debug, Clone, Copy)]
pub enum Source<'a> {
    /// A pod.
    Pod(&'a ModelPod),
    /// The node itself (kubelet, the host's own processes).
    Node,
}

/// Namespaces (with labels) and policies.
#[derive(Debug, Clone, Default)]
pub struct Model {
    /// Namespace labels by name (a namespace not listed has no labels).
    pub namespaces: BTreeMap<String, Labels>,
    /// The policies in force.
    pub policies: Vec<NetworkPolicy>,
}

/// Whether `selector` selects `labels` (an empty selector selects everything).
#[must_use]
pub fn selects(selector: &LabelSelector, labels: &Labels) -> bool {
    let by_labels = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let by_expressions = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.clone().unwrap_or_default();
        let value = labels.get(&e.key);
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            other => panic!("the model does not know selector operator {other}"),
        }
    });
    by_labels && by_expressions
}

/// The policy types in force, defaulted as the API server's `SetDefaults_NetworkPolicy`: Ingress
/// always, Egress when the egress list is non-empty — unless `policyTypes` is given.
fn types(policy: &NetworkPolicy) -> (bool, bool) {
    let spec = policy.spec.as_ref().expect("a policy has a spec");
    match &spec.policy_types {
        Some(types) if !types.is_empty() => (
            types.iter().any(|t| t == "Ingress"),
            types.iter().any(|t| t == "Egress"),
        ),
        _ => (true, spec.egress.as_ref().is_some_and(|e| !e.is_empty())),
    }
}

fn port_matches(ports: Option<&Vec<NetworkPolicyPort>>, port: u16) -> bool {
    let Some(ports) = ports.filter(|p| !p.is_empty()) else {
        return true;
    };
    ports.iter().any(|p| {
        if p.protocol.as_deref().is_some_and(|proto| proto != "TCP") {
            return false;
        }
        match &p.port {
            None => true,
            Some(IntOrString::Int(first)) => {
                let last = p.end_port.unwrap_or(*first);
                (*first..=last).contains(&i32::from(port))
            }
            Some(IntOrString::String(name)) => {
                panic!("the model resolves no named port ({name}); use numbers")
            }
        }
    })
}

impl Model {
    fn ns_labels(&self, namespace: &str) -> Labels {
        self.namespaces.get(namespace).cloned().unwrap_or_default()
    }

    fn peer_matches(&self, peer: &NetworkPolicyPeer, policy_ns: &str, pod: &ModelPod) -> bool {
        assert!(
            peer.ip_block.is_none(),
            "the model evaluates pod peers only; ipBlock selects CIDR identities in weir"
        );
        let ns_ok = match &peer.namespace_selector {
            Some(sel) => selects(sel, &self.ns_labels(&pod.namespace)),
            None => pod.namespace == policy_ns,
        };
        let pod_ok = peer
            .pod_selector
            .as_ref()
            .is_none_or(|sel| selects(sel, &pod.labels));
        ns_ok && pod_ok
    }

    /// Policies selecting `pod` in one direction (`ingress` true) — the pod is isolated in that
    /// direction when there is any.
    fn selecting<'a>(
        &'a self,
        pod: &'a ModelPod,
        ingress: bool,
    ) -> impl Iterator<Item = &'a NetworkPolicy> + 'a {
        self.policies.iter().filter(move |p| {
            let ns = p.metadata.namespace.as_deref().unwrap_or("default");
            let spec = p.spec.as_ref().expect("spec");
            let (i, e) = types(p);
            ns == pod.namespace
                && selects(&spec.pod_selector.clone().unwrap_or_default(), &pod.labels)
                && if ingress { i } else { e }
        })
    }

    /// Whether the policies selecting `subject` in one direction admit `peer` on `port` (a
    /// subject selected by none is not isolated there).
    fn side_allows(&self, subject: &ModelPod, peer: &ModelPod, port: u16, ingress: bool) -> bool {
        let mut policies = self.selecting(subject, ingress).peekable();
        if policies.peek().is_none() {
            return true;
        }
        policies.any(|p| {
            let ns = p.metadata.namespace.as_deref().unwrap_or("default");
            let spec = p.spec.as_ref().expect("spec");
            let rules: Vec<_> = if ingress {
                spec.ingress
                    .iter()
                    .flatten()
                    .map(|r| (r.ports.as_ref(), r.from.as_ref()))
                    .collect()
            } else {
                spec.egress
                    .iter()
                    .flatten()
                    .map(|r| (r.ports.as_ref(), r.to.as_ref()))
                    .collect()
            };
            rules.into_iter().any(|(ports, peers)| {
                port_matches(ports, port)
                    && peers.is_none_or(|peers| {
                        peers.is_empty() || peers.iter().any(|pp| self.peer_matches(pp, ns, peer))
                    })
            })
        })
    }

    /// Whether a TCP connection from `from` to `to`'s `port` is allowed.
    #[must_use]
    pub fn allows(&self, from: Source<'_>, to: &ModelPod, port: u16) -> bool {
        match from {
            // weir: the node's own traffic may always enter a pod (and leaves no pod's egress).
            Source::Node => true,
            Source::Pod(src) => {
                self.side_allows(src, to, port, false) && self.side_allows(to, src, port, true)
            }
        }
    }

    /// The agent's manifest for this model: one document per namespace and per policy.
    #[must_use]
    pub fn manifest(&self) -> String {
        let mut docs = Vec::new();
        for (name, labels) in &self.namespaces {
            let ns = Namespace {
                metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                    name: Some(name.clone()),
                    labels: Some(labels.clone()),
                    ..Default::default()
                },
                ..Default::default()
            };
            docs.push(document("v1", "Namespace", &ns));
        }
        for policy in &self.policies {
            docs.push(document("networking.k8s.io/v1", "NetworkPolicy", policy));
        }
        docs.join("\n---\n")
    }
}

/// One YAML document (JSON is YAML) with its apiVersion and kind.
fn document(api_version: &str, kind: &str, object: &impl serde::Serialize) -> String {
    let mut value = serde_json::to_value(object).expect("the object serialises");
    value["apiVersion"] = api_version.into();
    value["kind"] = kind.into();
    serde_json::to_string_pretty(&value).expect("json")
}

/// A `matchLabels` selector.
#[must_use]
pub fn match_labels(pairs: &[(&str, &str)]) -> LabelSelector {
    LabelSelector {
        match_labels: Some(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        ),
        ..LabelSelector::default()
    }
}

/// Labels from pairs.
#[must_use]
pub fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::networking::v1::{NetworkPolicyIngressRule, NetworkPolicySpec};

    use super::*;

    fn pod(ns: &str, app: &str) -> ModelPod {
        ModelPod {
            namespace: ns.into(),
            labels: labels(&[("app", app)]),
        }
    }

    #[test]
    fn ingress_from_a_namespace_isolates_only_the_selected_pods() {
        let policy = NetworkPolicy {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("p".into()),
                namespace: Some("b".into()),
                ..Default::default()
            },
            spec: Some(NetworkPolicySpec {
                pod_selector: Some(LabelSelector::default()),
                ingress: Some(vec![NetworkPolicyIngressRule {
                    from: Some(vec![NetworkPolicyPeer {
                        namespace_selector: Some(match_labels(&[("team", "a")])),
                        ..Default::default()
                    }]),
                    ports: None,
                }]),
                ..Default::default()
            }),
        };
        let model = Model {
            namespaces: [
                ("a".into(), labels(&[("team", "a")])),
                ("b".into(), Labels::new()),
            ]
            .into_iter()
            .collect(),
            policies: vec![policy],
        };
        let (a, b, c) = (pod("a", "x"), pod("b", "y"), pod("c", "z"));
        assert!(model.allows(Source::Pod(&a), &b, 80));
        assert!(!model.allows(Source::Pod(&c), &b, 80));
        assert!(
            !model.allows(Source::Pod(&b), &b, 80),
            "b's own pods are not team a"
        );
        assert!(
            model.allows(Source::Pod(&b), &c, 80),
            "c is selected by nothing"
        );
        assert!(
            model.allows(Source::Node, &b, 80),
            "the node may always enter"
        );
    }
}
