//! Builders for the NetworkPolicies of the conformance cases (the `k8s-openapi` types the model
//! reads and the agent's policy directory receives), in the spirit of upstream's `Gen…` helpers.

use k8s_openapi::{
    api::networking::v1::{
        IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule,
        NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
    },
    apimachinery::pkg::{
        apis::meta::v1::{LabelSelector, LabelSelectorRequirement, ObjectMeta},
        util::intstr::IntOrString,
    },
};

use crate::netpol::{Proto, match_labels};

/// A policy under construction.
#[derive(Debug, Clone)]
pub struct Pol(NetworkPolicy);

/// A policy `name` in `namespace` selecting `pods` (no rules, no `policyTypes` yet).
#[must_use]
pub fn policy(namespace: &str, name: &str, pods: LabelSelector) -> Pol {
    Pol(NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(pods),
            ..NetworkPolicySpec::default()
        }),
    })
}

impl Pol {
    fn spec(&mut self) -> &mut NetworkPolicySpec {
        self.0.spec.as_mut().expect("a spec")
    }

    /// Sets `policyTypes`.
    #[must_use]
    pub fn types(mut self, types: &[&str]) -> Self {
        self.spec().policy_types = Some(types.iter().map(|t| (*t).to_owned()).collect());
        self
    }

    /// An ingress rule from `peers` (empty: every source) on `ports` (empty: every port).
    #[must_use]
    pub fn ingress(mut self, peers: Vec<NetworkPolicyPeer>, ports: Vec<NetworkPolicyPort>) -> Self {
        let rule = NetworkPolicyIngressRule {
            from: (!peers.is_empty()).then_some(peers),
            ports: (!ports.is_empty()).then_some(ports),
        };
        self.spec().ingress.get_or_insert_with(Vec::new).push(rule);
        self
    }

    /// An egress rule to `peers` (empty: every destination) on `ports` (empty: every port).
    #[must_use]
    pub fn egress(mut self, peers: Vec<NetworkPolicyPeer>, ports: Vec<NetworkPolicyPort>) -> Self {
        let rule = NetworkPolicyEgressRule {
            to: (!peers.is_empty()).then_some(peers),
            ports: (!ports.is_empty()).then_some(ports),
        };
        self.spec().egress.get_or_insert_with(Vec::new).push(rule);
        self
    }

    /// The policy with an empty ingress list (`ingress: []`, policyTypes defaulted): it admits
    /// nothing into the pods it selects.
    #[must_use]
    pub fn ingress_none(mut self) -> NetworkPolicy {
        self.spec().ingress = Some(Vec::new());
        self.0
    }

    /// An explicit empty egress list (`egress: []`).
    #[must_use]
    pub fn empty_egress(mut self) -> Self {
        self.spec().egress = Some(Vec::new());
        self
    }

    /// The policy.
    #[must_use]
    pub fn build(self) -> NetworkPolicy {
        self.0
    }
}

/// The empty selector (selects everything).
#[must_use]
pub fn all() -> LabelSelector {
    LabelSelector::default()
}

/// `pod: <name>`.
#[must_use]
pub fn pod(name: &str) -> LabelSelector {
    match_labels(&[("pod", name)])
}

/// `ns: <name>`.
#[must_use]
pub fn ns(name: &str) -> LabelSelector {
    match_labels(&[("ns", name)])
}

/// A one-expression selector: `key operator values`.
#[must_use]
pub fn expr(key: &str, operator: &str, values: &[&str]) -> LabelSelector {
    LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: key.to_owned(),
            operator: operator.to_owned(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| (*v).to_owned()).collect()),
        }]),
        ..LabelSelector::default()
    }
}

/// A peer by pod selector (the policy's namespace).
#[must_use]
pub fn from_pods(pods: LabelSelector) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        pod_selector: Some(pods),
        ..NetworkPolicyPeer::default()
    }
}

/// A peer by namespace selector (every pod there).
#[must_use]
pub fn from_namespaces(namespaces: LabelSelector) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        namespace_selector: Some(namespaces),
        ..NetworkPolicyPeer::default()
    }
}

/// A peer by both, in one peer (pods matching `pods` in namespaces matching `namespaces`).
#[must_use]
pub fn from_both(namespaces: LabelSelector, pods: LabelSelector) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        namespace_selector: Some(namespaces),
        pod_selector: Some(pods),
        ..NetworkPolicyPeer::default()
    }
}

/// An `ipBlock` peer.
#[must_use]
pub fn from_cidr(cidr: &str, except: &[&str]) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        ip_block: Some(IPBlock {
            cidr: cidr.to_owned(),
            except: (!except.is_empty()).then(|| except.iter().map(|e| (*e).to_owned()).collect()),
        }),
        ..NetworkPolicyPeer::default()
    }
}

/// A numeric port.
#[must_use]
pub fn port(proto: Proto, port: i32) -> NetworkPolicyPort {
    NetworkPolicyPort {
        protocol: Some(proto.name().to_owned()),
        port: Some(IntOrString::Int(port)),
        end_port: None,
    }
}

/// A port range (`endPort`).
#[must_use]
pub fn port_range(proto: Proto, first: i32, last: i32) -> NetworkPolicyPort {
    NetworkPolicyPort {
        end_port: Some(last),
        ..port(proto, first)
    }
}

/// A named port.
#[must_use]
pub fn named(proto: Proto, name: &str) -> NetworkPolicyPort {
    NetworkPolicyPort {
        protocol: Some(proto.name().to_owned()),
        port: Some(IntOrString::String(name.to_owned())),
        end_port: None,
    }
}

/// Every port of a protocol.
#[must_use]
pub fn protocol(proto: Proto) -> NetworkPolicyPort {
    NetworkPolicyPort {
        protocol: Some(proto.name().to_owned()),
        port: None,
        end_port: None,
    }
}
