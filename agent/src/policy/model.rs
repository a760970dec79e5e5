//! The validated policy model (what `load` produces and `compile` consumes).

use std::collections::BTreeMap;

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
    /// Ports; empty means every protocol and port.
    pub ports: Vec<PortSpec>,
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

/// Everything the policy directory says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicySet {
    /// Policies, by (namespace, name).
    pub policies: BTreeMap<(String, String), Policy>,
    /// Namespace labels, by namespace.
    pub namespaces: BTreeMap<String, BTreeMap<String, String>>,
}
