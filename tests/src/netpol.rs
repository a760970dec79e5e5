//! A model of upstream NetworkPolicy semantics for computing the connectivity a test expects
//! (as the upstream e2e truth tables do), never written by hand: given the namespaces' labels,
//! the pods and the policies, whether a TCP, UDP or SCTP flow from one pod (the node, or an
//! address outside the cluster) to a pod's (or an outside address's) port is allowed. Covers
//! ingress and egress, `podSelector`, `namespaceSelector` (alone and together in one peer),
//! `matchLabels` and `matchExpressions`, numeric ports with `endPort`, named ports (resolved on
//! the destination pod), protocols, `ipBlock` with `except`, several policies as a union, and
//! `policyTypes` defaulted as the API server defaults them (on the lists' lengths). weir's
//! documented semantics are modelled too: the node's own traffic may always enter a pod (kubelet
//! probes), and an `ipBlock` selects addresses outside the cluster only — CIDR identities, not pod
//! addresses, as in Cilium.
//!
//! Policies are built with the `k8s-openapi` types, so the same objects the model reads are what
//! [`manifest`] writes for the agent.

use std::{collections::BTreeMap, net::IpAddr};

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
    /// An address outside the cluster (no pod has it).
    External(IpAddr),
}

/// Where a connection goes.
#[derive(Debug, Clone, Copy)]
pub enum Target<'a> {
    /// A pod.
    Pod(&'a ModelPod),
    /// An address outside the cluster.
    External(IpAddr),
}

/// A transport protocol as NetworkPolicy names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Proto {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl Proto {
    /// The name a NetworkPolicy port uses.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
            Self::Sctp => "SCTP",
        }
    }
}

/// One side's judgement of a flow (the source's egress or the destination's ingress).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Side {
    /// No policy selects the pod in this direction: everything passes, no rule decides.
    NotIsolated,
    /// Isolated, and these rules admit the flow (`namespace/name ingress[i]`, in policy order).
    Allowed(Vec<String>),
    /// Isolated, and no rule admits the flow.
    Denied,
}

/// Namespaces (with labels), the named ports every pod declares, and policies.
#[derive(Debug, Clone, Default)]
pub struct Model {
    /// Namespace labels by name (a namespace not listed has no labels).
    pub namespaces: BTreeMap<String, Labels>,
    /// The policies in force.
    pub policies: Vec<NetworkPolicy>,
    /// Container port names every pod declares (name → protocol, port), as the upstream suite's
    /// pods do (`serve-80-tcp`, …). Empty: a named port resolves to nothing.
    pub named_ports: BTreeMap<String, (Proto, u16)>,
}

/// One side of a flow as a policy peer sees it.
#[derive(Debug, Clone, Copy)]
enum Who<'a> {
    Pod(&'a ModelPod),
    Addr(IpAddr),
}

/// Whether `addr` is inside `cidr` (`a.b.c.d/n` or an IPv6 prefix; other families never match).
#[must_use]
pub fn cidr_contains(cidr: &str, addr: IpAddr) -> bool {
    let (net, len) = cidr
        .split_once('/')
        .unwrap_or_else(|| panic!("the model wants a CIDR, not {cidr}"));
    let net: IpAddr = net.parse().unwrap_or_else(|e| panic!("{cidr}: {e}"));
    let len: u32 = len.parse().unwrap_or_else(|e| panic!("{cidr}: {e}"));
    let masked = |bits: u128, width: u32| {
        if len == 0 { 0 } else { bits >> (width - len) }
    };
    match (net, addr) {
        (IpAddr::V4(n), IpAddr::V4(a)) => {
            masked(u128::from(u32::from(n)), 32) == masked(u128::from(u32::from(a)), 32)
        }
        (IpAddr::V6(n), IpAddr::V6(a)) => masked(u128::from(n), 128) == masked(u128::from(a), 128),
        _ => false,
    }
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
/// always, Egress when the egress list is non-empty — unless `policyTypes` is given (non-empty).
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

impl Model {
    /// Whether a rule's `ports` admit `proto`/`port` on `dest` (named ports resolve on the
    /// destination pod; an outside address has none).
    fn port_matches(
        &self,
        ports: Option<&Vec<NetworkPolicyPort>>,
        proto: Proto,
        port: u16,
        dest: Who<'_>,
    ) -> bool {
        let Some(ports) = ports.filter(|p| !p.is_empty()) else {
            return true;
        };
        ports.iter().any(|p| {
            if p.protocol.as_deref().unwrap_or("TCP") != proto.name() {
                return false;
            }
            match &p.port {
                None => true,
                Some(IntOrString::Int(first)) => {
                    let last = p.end_port.unwrap_or(*first);
                    (*first..=last).contains(&i32::from(port))
                }
                Some(IntOrString::String(name)) => {
                    matches!(dest, Who::Pod(_))
                        && self.named_ports.get(name) == Some(&(proto, port))
                }
            }
        })
    }

    fn ns_labels(&self, namespace: &str) -> Labels {
        self.namespaces.get(namespace).cloned().unwrap_or_default()
    }

    fn peer_matches(&self, peer: &NetworkPolicyPeer, policy_ns: &str, who: Who<'_>) -> bool {
        if let Some(block) = &peer.ip_block {
            // weir: an ipBlock selects CIDR identities, never a pod's address.
            let Who::Addr(addr) = who else {
                return false;
            };
            return cidr_contains(&block.cidr, addr)
                && !block
                    .except
                    .iter()
                    .flatten()
                    .any(|except| cidr_contains(except, addr));
        }
        let Who::Pod(pod) = who else {
            return false;
        };
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

    /// Whether the policies selecting `subject` in one direction admit `peer` on `proto`/`port`
    /// (a subject selected by none is not isolated there).
    fn side_allows(
        &self,
        subject: &ModelPod,
        peer: Who<'_>,
        proto: Proto,
        port: u16,
        ingress: bool,
    ) -> bool {
        self.side_rules(subject, peer, proto, port, ingress)
            .is_none_or(|rules| !rules.is_empty())
    }

    /// The rules admitting `peer` on `proto`/`port` among the policies selecting `subject` in one
    /// direction, named as the agent names them (`namespace/name ingress[i]`, `… egress[i]`):
    /// `None` when no policy selects `subject` there (not isolated: everything passes), empty
    /// when it is isolated and no rule admits the flow. The destination, on which a named port
    /// resolves, is the subject for ingress and the peer for egress.
    fn side_rules(
        &self,
        subject: &ModelPod,
        peer: Who<'_>,
        proto: Proto,
        port: u16,
        ingress: bool,
    ) -> Option<Vec<String>> {
        let mut policies = self.selecting(subject, ingress).peekable();
        policies.peek()?;
        let dest = if ingress { Who::Pod(subject) } else { peer };
        let direction = if ingress { "ingress" } else { "egress" };
        let mut admitting = Vec::new();
        for p in policies {
            let ns = p.metadata.namespace.as_deref().unwrap_or("default");
            let name = p.metadata.name.as_deref().unwrap_or_default();
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
            for (index, (ports, peers)) in rules.into_iter().enumerate() {
                if self.port_matches(ports, proto, port, dest)
                    && peers.is_none_or(|peers| {
                        peers.is_empty() || peers.iter().any(|pp| self.peer_matches(pp, ns, peer))
                    })
                {
                    admitting.push(format!("{ns}/{name} {direction}[{index}]"));
                }
            }
        }
        Some(admitting)
    }

    /// How each side judges a `proto` flow from pod `from` to pod `to`'s `port`: the source's
    /// egress, then the destination's ingress (see [`Side`]).
    #[must_use]
    pub fn sides(&self, from: &ModelPod, to: &ModelPod, proto: Proto, port: u16) -> [Side; 2] {
        let side = |rules: Option<Vec<String>>| match rules {
            None => Side::NotIsolated,
            Some(rules) if rules.is_empty() => Side::Denied,
            Some(rules) => Side::Allowed(rules),
        };
        [
            side(self.side_rules(from, Who::Pod(to), proto, port, false)),
            side(self.side_rules(to, Who::Pod(from), proto, port, true)),
        ]
    }

    /// Whether a TCP connection from `from` to `to`'s `port` is allowed.
    #[must_use]
    pub fn allows(&self, from: Source<'_>, to: &ModelPod, port: u16) -> bool {
        self.allows_flow(from, Target::Pod(to), Proto::Tcp, port)
    }

    /// Whether a `proto` flow from `from` to `to`'s `port` is allowed: the source pod's egress
    /// and the destination pod's ingress must both admit it (an outside address has no policy).
    #[must_use]
    pub fn allows_flow(&self, from: Source<'_>, to: Target<'_>, proto: Proto, port: u16) -> bool {
        let src = match from {
            // weir: the node's own traffic may always enter a pod (and leaves no pod's egress).
            Source::Node => return true,
            Source::Pod(pod) => Who::Pod(pod),
            Source::External(addr) => Who::Addr(addr),
        };
        let dst = match to {
            Target::Pod(pod) => Who::Pod(pod),
            Target::External(addr) => Who::Addr(addr),
        };
        let egress_ok = match src {
            Who::Pod(pod) => self.side_allows(pod, dst, proto, port, false),
            Who::Addr(_) => true,
        };
        let ingress_ok = match dst {
            Who::Pod(pod) => self.side_allows(pod, src, proto, port, true),
            Who::Addr(_) => true,
        };
        egress_ok && ingress_ok
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
            ..Model::default()
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
