//! The validated cluster model (what `convert` produces from Kubernetes objects, `load` and the
//! Kubernetes watchers assemble, and `compile`/`calc` consume): NetworkPolicies, Namespaces' labels,
//! Pods, Nodes, Services and EndpointSlices.

use std::{collections::BTreeMap, net::IpAddr};

use ipnetwork::IpNetwork;

use super::selector::Selector;

/// One NetworkPolicy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Which pods of the namespace it selects.
    pub pod_selector: Selector,
    /// It isolates its pods for ingress.
    pub ingress_isolated: bool,
    /// It isolates its pods for egress.
    pub egress_isolated: bool,
    /// Ingress rules (any one allows).
    pub ingress: Vec<Rule>,
    /// Egress rules.
    pub egress: Vec<Rule>,
}

/// One rule: peers × ports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// Peers; empty means every peer.
    pub peers: Vec<Peer>,
    /// Numbered ports. When both this and `named_ports` are empty: every protocol and port.
    pub ports: Vec<PortSpec>,
    /// Ports given by name, resolved on the destination pod's named container ports (ingress:
    /// the selected pod's own; egress: each peer pod's). A pod without that name matches nothing
    /// of this clause.
    pub named_ports: Vec<NamedPortRef>,
}

impl Rule {
    /// True when the rule names no port at all (so allows every protocol and port).
    #[must_use]
    pub fn all_ports(&self) -> bool {
        self.ports.is_empty() && self.named_ports.is_empty()
    }
}

/// A port clause naming a container port (`port: http`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NamedPortRef {
    /// IP protocol number of the clause (TCP 6, UDP 17, SCTP 132).
    pub protocol: u8,
    /// The container port's name.
    pub name: String,
}

/// A peer of a rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Peer {
    /// Pods: in the policy's namespace (no namespace selector) or in the namespaces selected.
    Pods {
        /// Namespaces (None: the policy's own).
        namespaces: Option<Selector>,
        /// Pods (None: all).
        pods: Option<Selector>,
    },
    /// A CIDR minus exceptions.
    Cidr {
        /// The block.
        cidr: IpNetwork,
        /// Carved out of it.
        except: Vec<IpNetwork>,
    },
}

/// A port clause.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortSpec {
    /// IP protocol number (TCP 6, UDP 17, SCTP 132).
    pub protocol: u8,
    /// First port; None = every port of the protocol.
    pub port: Option<u16>,
    /// Last port of a range.
    pub end_port: Option<u16>,
}

/// Labels of an object.
pub type Labels = BTreeMap<String, String>;

/// A named container port of a pod.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NamedPort {
    /// The name (`ports[].name`).
    pub name: String,
    /// IP protocol number (TCP 6, UDP 17, SCTP 132).
    pub protocol: u8,
    /// `containerPort`.
    pub port: u16,
}

/// One Pod, as far as the dataplane cares.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pod {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `metadata.uid`, when known.
    pub uid: Option<String>,
    /// Labels (its identity, with its namespace's).
    pub labels: Labels,
    /// `status.podIPs` (empty until known).
    pub ips: Vec<IpAddr>,
    /// `spec.nodeName`.
    pub node: Option<String>,
    /// `spec.hostNetwork`: the pod has the node's addresses, so no identity of its own.
    pub host_network: bool,
    /// Named container ports of every container (init containers excluded), in spec order.
    pub named_ports: Vec<NamedPort>,
    /// Only the `weir.dev/` annotations (pool annotations and the like).
    pub annotations: BTreeMap<String, String>,
}

impl Pod {
    /// The port a named port clause resolves to on this pod, if it has a port of that name and
    /// protocol (the first one, as upstream).
    #[must_use]
    pub fn resolve(&self, named: &NamedPortRef) -> Option<u16> {
        self.named_ports
            .iter()
            .find(|p| p.name == named.name && p.protocol == named.protocol)
            .map(|p| p.port)
    }
}

/// One Node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeInfo {
    /// Name.
    pub name: String,
    /// `status.addresses` that are IP addresses: the InternalIPs, then the ExternalIPs, each in order.
    pub addresses: Vec<IpAddr>,
    /// Labels.
    pub labels: Labels,
}

/// The cluster as a source sees it: what the policy directory (or the API server) says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicySet {
    /// Policies, by (namespace, name).
    pub policies: BTreeMap<(String, String), Policy>,
    /// Namespace labels, by namespace.
    pub namespaces: BTreeMap<String, Labels>,
    /// The `weir.dev/` annotations of the Namespaces that have any (pool annotations), by
    /// namespace.
    pub namespace_annotations: BTreeMap<String, BTreeMap<String, String>>,
    /// Pods, by (namespace, name).
    pub pods: BTreeMap<(String, String), Pod>,
    /// Nodes, by name.
    pub nodes: BTreeMap<String, NodeInfo>,
    /// Services, by (namespace, name).
    pub services: crate::calc::services::desired::Services,
    /// EndpointSlices, by (namespace, name).
    pub endpoint_slices: crate::calc::services::desired::Slices,
}
