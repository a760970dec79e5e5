//! From Kubernetes objects (`k8s_openapi` types) to the model: one conversion per kind, used by
//! the standalone directory (`load`) and the Kubernetes watchers alike, so both agree exactly.
//! Each refusal names the field and how to fix it; the caller adds where the object came from
//! (file:line, or `namespace/name`).

use std::{collections::BTreeMap, net::IpAddr};

use k8s_openapi::{
    api::{
        core::v1::{Namespace, Node, Pod as K8sPod},
        networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort},
    },
    apimachinery::pkg::{apis::meta::v1::ObjectMeta, util::intstr::IntOrString},
};

use super::{
    model::{Labels, NamedPort, NamedPortRef, NodeInfo, Peer, Pod, Policy, PortSpec, Rule},
    selector::Selector,
};

/// The prefix of the annotations a Pod or Namespace keeps (pool annotations and the like).
pub const ANNOTATION_PREFIX: &str = "weir.dev/";

/// Why an object cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConvertError {
    /// A required field is absent.
    #[error("{field} is missing; {hint}")]
    Missing {
        /// The field's path.
        field: String,
        /// How to fix it.
        hint: &'static str,
    },
    /// A field's value is not acceptable.
    #[error("{field}: {reason}")]
    Invalid {
        /// The field's path (`spec.ingress[0].ports[1].port`).
        field: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
}

impl ConvertError {
    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// The namespace an object without `metadata.namespace` is in (as `kubectl apply` does).
pub const DEFAULT_NAMESPACE: &str = "default";

/// A NetworkPolicy. `policyTypes`, when absent or empty, is defaulted as the API server's
/// `SetDefaults_NetworkPolicy` does: Ingress always, Egress when the egress list is non-empty.
pub fn policy(np: &NetworkPolicy) -> Result<Policy, ConvertError> {
    let name = np.metadata.name.clone().ok_or(ConvertError::Missing {
        field: "metadata.name".into(),
        hint: "give the NetworkPolicy a name",
    })?;
    let namespace = np
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned());
    let spec = np.spec.clone().unwrap_or_default();
    let pod_selector = Selector::from_k8s(&spec.pod_selector.clone().unwrap_or_default())
        .map_err(|e| ConvertError::invalid("spec.podSelector", e))?;
    let ingress_rules = spec.ingress.clone().unwrap_or_default();
    let egress_rules = spec.egress.clone().unwrap_or_default();
    let (ingress_isolated, egress_isolated) = match spec.policy_types.as_deref() {
        Some(types) if !types.is_empty() => {
            for (i, t) in types.iter().enumerate() {
                if t != "Ingress" && t != "Egress" {
                    return Err(ConvertError::invalid(
                        format!("spec.policyTypes[{i}]"),
                        format!("{t:?} is not Ingress or Egress"),
                    ));
                }
            }
            (
                types.iter().any(|t| t == "Ingress"),
                types.iter().any(|t| t == "Egress"),
            )
        }
        _ => (true, !egress_rules.is_empty()),
    };
    let mut ingress = Vec::with_capacity(ingress_rules.len());
    for (i, r) in ingress_rules.iter().enumerate() {
        ingress.push(rule(
            r.from.as_deref(),
            r.ports.as_deref(),
            &format!("spec.ingress[{i}]"),
            "from",
        )?);
    }
    let mut egress = Vec::with_capacity(egress_rules.len());
    for (i, r) in egress_rules.iter().enumerate() {
        egress.push(rule(
            r.to.as_deref(),
            r.ports.as_deref(),
            &format!("spec.egress[{i}]"),
            "to",
        )?);
    }
    named_ports_to_every_pod(&mut egress);
    Ok(Policy {
        namespace,
        name,
        pod_selector,
        ingress_isolated,
        egress_isolated,
        ingress,
        egress,
    })
}

/// An egress rule with no `to` allows its named ports toward every destination that resolves the
/// name: every pod of every namespace with that named container port (a name means nothing on an
/// address outside the cluster). So a rule without peers carries its named ports to the peer "every
/// pod in every namespace": a rule with only named ports gets that peer; a rule with numbered ports
/// too keeps them toward every peer and its named ports move to a rule of their own, appended after
/// the policy's rules (so the earlier rules keep their positions and rule ids).
fn named_ports_to_every_pod(egress: &mut Vec<Rule>) {
    let every_pod = || Peer::Pods {
        namespaces: Some(Selector::everything()),
        pods: None,
    };
    let mut appended = Vec::new();
    for r in egress.iter_mut() {
        if !r.peers.is_empty() || r.named_ports.is_empty() {
            continue;
        }
        if r.ports.is_empty() {
            r.peers.push(every_pod());
        } else {
            appended.push(Rule {
                peers: vec![every_pod()],
                ports: Vec::new(),
                named_ports: std::mem::take(&mut r.named_ports),
            });
        }
    }
    egress.extend(appended);
}

fn rule(
    peers: Option<&[NetworkPolicyPeer]>,
    ports: Option<&[NetworkPolicyPort]>,
    at: &str,
    peers_field: &str,
) -> Result<Rule, ConvertError> {
    let peers = peers
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, p)| peer(p, &format!("{at}.{peers_field}[{i}]")))
        .collect::<Result<_, _>>()?;
    let mut numbered = Vec::new();
    let mut named = Vec::new();
    for (i, p) in ports.unwrap_or_default().iter().enumerate() {
        match port(p, &format!("{at}.ports[{i}]"))? {
            Port::Number(spec) => numbered.push(spec),
            Port::Named(reference) => named.push(reference),
        }
    }
    Ok(Rule {
        peers,
        ports: numbered,
        named_ports: named,
    })
}

fn peer(p: &NetworkPolicyPeer, at: &str) -> Result<Peer, ConvertError> {
    if let Some(block) = &p.ip_block {
        if p.pod_selector.is_some() || p.namespace_selector.is_some() {
            return Err(ConvertError::invalid(
                at,
                "ipBlock cannot be combined with podSelector or namespaceSelector in one peer; \
                 write them as two peers",
            ));
        }
        let cidr: ipnetwork::IpNetwork = block.cidr.parse().map_err(|_| {
            ConvertError::invalid(
                format!("{at}.ipBlock.cidr"),
                format!("{:?} is not a CIDR (write e.g. 10.0.0.0/8)", block.cidr),
            )
        })?;
        let cidr = ipnetwork::IpNetwork::new(cidr.network(), cidr.prefix())
            .map_err(|e| ConvertError::invalid(format!("{at}.ipBlock.cidr"), e.to_string()))?;
        let mut except = Vec::new();
        for (i, e) in block.except.iter().flatten().enumerate() {
            let field = format!("{at}.ipBlock.except[{i}]");
            let net: ipnetwork::IpNetwork = e.parse().map_err(|_| {
                ConvertError::invalid(
                    &field,
                    format!("{e:?} is not a CIDR (write e.g. 10.1.0.0/16)"),
                )
            })?;
            if net.is_ipv4() != cidr.is_ipv4()
                || net.prefix() <= cidr.prefix()
                || !cidr.contains(net.network())
            {
                return Err(ConvertError::invalid(
                    field,
                    format!("{e} must be a strictly smaller prefix inside {cidr}"),
                ));
            }
            except.push(net);
        }
        return Ok(Peer::Cidr { cidr, except });
    }
    if p.pod_selector.is_none() && p.namespace_selector.is_none() {
        return Err(ConvertError::invalid(
            at,
            "a peer needs podSelector, namespaceSelector or ipBlock",
        ));
    }
    let namespaces = p
        .namespace_selector
        .as_ref()
        .map(Selector::from_k8s)
        .transpose()
        .map_err(|e| ConvertError::invalid(format!("{at}.namespaceSelector"), e))?;
    let pods = p
        .pod_selector
        .as_ref()
        .map(Selector::from_k8s)
        .transpose()
        .map_err(|e| ConvertError::invalid(format!("{at}.podSelector"), e))?;
    Ok(Peer::Pods { namespaces, pods })
}

enum Port {
    Number(PortSpec),
    Named(NamedPortRef),
}

/// A protocol name (absent: TCP) as its IP protocol number.
pub(crate) fn protocol(name: Option<&str>, field: &str) -> Result<u8, ConvertError> {
    match name.unwrap_or("TCP") {
        "TCP" => Ok(6),
        "UDP" => Ok(17),
        "SCTP" => Ok(132),
        other => Err(ConvertError::invalid(
            field,
            format!("{other:?} is not TCP, UDP or SCTP"),
        )),
    }
}

pub(crate) fn port_number(n: i32, field: &str) -> Result<u16, ConvertError> {
    u16::try_from(n)
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| ConvertError::invalid(field, format!("port {n} is not between 1 and 65535")))
}

/// A port name as upstream validates it (`IsValidPortName`, an IANA service name): at most 15
/// characters of `a-z`, `0-9` and `-`, at least one letter, no `-` at either end or twice in a row.
pub(crate) fn valid_port_name(name: &str) -> Result<(), String> {
    let problem = if name.is_empty() || name.len() > 15 {
        Some("must be 1 to 15 characters")
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        Some("may contain only a-z, 0-9 and '-'")
    } else if !name.bytes().any(|b| b.is_ascii_lowercase()) {
        Some("must contain at least one letter")
    } else if name.starts_with('-') || name.ends_with('-') || name.contains("--") {
        Some("must not begin or end with '-' or contain '--'")
    } else {
        None
    };
    problem.map_or(Ok(()), |p| Err(format!("port name {name:?} {p}")))
}

fn port(p: &NetworkPolicyPort, at: &str) -> Result<Port, ConvertError> {
    let protocol = protocol(p.protocol.as_deref(), &format!("{at}.protocol"))?;
    let field = format!("{at}.port");
    let port = match &p.port {
        None => None,
        Some(IntOrString::Int(n)) => Some(port_number(*n, &field)?),
        Some(IntOrString::String(name)) => {
            // A number written as a string (`port: "80"`) is a number, as upstream's IntOrString.
            if let Ok(n) = name.parse::<i32>() {
                Some(port_number(n, &field)?)
            } else {
                valid_port_name(name).map_err(|e| ConvertError::invalid(&field, e))?;
                if p.end_port.is_some() {
                    return Err(ConvertError::invalid(
                        format!("{at}.endPort"),
                        "endPort needs a numbered port, not a named one",
                    ));
                }
                return Ok(Port::Named(NamedPortRef {
                    protocol,
                    name: name.clone(),
                }));
            }
        }
    };
    let end_port = match p.end_port {
        None => None,
        Some(_) if port.is_none() => {
            return Err(ConvertError::invalid(
                format!("{at}.endPort"),
                "endPort needs port",
            ));
        }
        Some(end) => Some(
            u16::try_from(end)
                .ok()
                .filter(|e| Some(*e) >= port)
                .ok_or_else(|| {
                    ConvertError::invalid(
                        format!("{at}.endPort"),
                        format!("endPort {end} must be between port and 65535"),
                    )
                })?,
        ),
    };
    Ok(Port::Number(PortSpec {
        protocol,
        port,
        end_port,
    }))
}

/// A Namespace: its name and labels.
pub fn namespace(ns: &Namespace) -> Result<(String, Labels), ConvertError> {
    let name = ns.metadata.name.clone().ok_or(ConvertError::Missing {
        field: "metadata.name".into(),
        hint: "give the Namespace a name",
    })?;
    Ok((name, ns.metadata.labels.clone().unwrap_or_default()))
}

/// The `weir.dev/` annotations of an object's metadata (the rest are not the dataplane's).
#[must_use]
pub fn weir_annotations(meta: &ObjectMeta) -> BTreeMap<String, String> {
    meta.annotations
        .iter()
        .flatten()
        .filter(|(k, _)| k.starts_with(ANNOTATION_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

pub(crate) fn address(text: &str, field: &str) -> Result<IpAddr, ConvertError> {
    text.parse()
        .map_err(|_| ConvertError::invalid(field, format!("{text:?} is not an IP address")))
}

/// A Pod: labels, addresses (`status.podIPs`, else `status.podIP`), node, hostNetwork, the named
/// ports of its containers and its `weir.dev/` annotations.
pub fn pod(p: &K8sPod) -> Result<Pod, ConvertError> {
    let name = p.metadata.name.clone().ok_or(ConvertError::Missing {
        field: "metadata.name".into(),
        hint: "give the Pod a name",
    })?;
    let namespace = p
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned());
    let spec = p.spec.as_ref();
    let mut named_ports = Vec::new();
    for (c, container) in spec
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        for (i, port) in container.ports.iter().flatten().enumerate() {
            let at = format!("spec.containers[{c}].ports[{i}]");
            let number = port_number(port.container_port, &format!("{at}.containerPort"))?;
            let protocol = protocol(port.protocol.as_deref(), &format!("{at}.protocol"))?;
            if let Some(name) = &port.name {
                valid_port_name(name)
                    .map_err(|e| ConvertError::invalid(format!("{at}.name"), e))?;
                named_ports.push(NamedPort {
                    name: name.clone(),
                    protocol,
                    port: number,
                });
            }
        }
    }
    let mut ips = Vec::new();
    if let Some(status) = &p.status {
        match status.pod_ips.as_deref() {
            Some(list) if !list.is_empty() => {
                for (i, ip) in list.iter().enumerate() {
                    ips.push(address(&ip.ip, &format!("status.podIPs[{i}].ip"))?);
                }
            }
            _ => {
                if let Some(ip) = &status.pod_ip {
                    ips.push(address(ip, "status.podIP")?);
                }
            }
        }
    }
    let annotations = weir_annotations(&p.metadata);
    Ok(Pod {
        namespace,
        name,
        uid: p.metadata.uid.clone(),
        labels: p.metadata.labels.clone().unwrap_or_default(),
        ips,
        node: spec.and_then(|s| s.node_name.clone()),
        host_network: spec.and_then(|s| s.host_network).unwrap_or(false),
        named_ports,
        annotations,
    })
}

/// A Node: name, labels and its IP addresses (`InternalIP` and `ExternalIP` entries; host names
/// are skipped).
pub fn node(n: &Node) -> Result<NodeInfo, ConvertError> {
    let name = n.metadata.name.clone().ok_or(ConvertError::Missing {
        field: "metadata.name".into(),
        hint: "give the Node a name",
    })?;
    let listed = n
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_deref())
        .unwrap_or_default();
    let mut addresses = Vec::new();
    // InternalIP first (the next hop other nodes route this node's blocks through), then ExternalIP.
    for kind in ["InternalIP", "ExternalIP"] {
        for (i, a) in listed.iter().enumerate().filter(|(_, a)| a.type_ == kind) {
            let ip = address(&a.address, &format!("status.addresses[{i}].address"))?;
            if !addresses.contains(&ip) {
                addresses.push(ip);
            }
        }
    }
    Ok(NodeInfo {
        name,
        addresses,
        labels: n.metadata.labels.clone().unwrap_or_default(),
    })
}

#[cfg(test)]
#[path = "convert_tests.rs"]
mod tests;
