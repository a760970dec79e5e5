//! Objects that apply but probably not as their author meant: a Pod or NetworkPolicy in a namespace
//! the source has no Namespace object for, and a named port no Pod declares. Neither is refused
//! (upstream applies both; the API server would not even admit the first): they are reported so
//! the operator can fix the source. The standalone directory reports them with file:line
//! (`load::Loaded::warnings`), a cluster source by object name.
//!
//! A namespace without a Namespace object counts as one without labels: its name is still part of
//! its pods' identity, and a `namespaceSelector` selects it only when the selector is empty
//! (`{}`). `default` always exists in a cluster, so it is never reported.

use std::collections::BTreeSet;

use super::{
    load::ObjectRef,
    model::{NamedPortRef, PolicySet},
};
use crate::policy::convert::DEFAULT_NAMESPACE;

/// One object that applies with a caveat.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning {
    /// The object.
    pub object: ObjectRef,
    /// What is odd and how to fix it.
    pub reason: String,
}

fn protocol_name(protocol: u8) -> String {
    match protocol {
        6 => "TCP".to_owned(),
        17 => "UDP".to_owned(),
        132 => "SCTP".to_owned(),
        other => format!("protocol {other}"),
    }
}

/// The warnings of `set`, sorted by object.
#[must_use]
pub fn check(set: &PolicySet) -> Vec<Warning> {
    let missing = |ns: &str| ns != DEFAULT_NAMESPACE && !set.namespaces.contains_key(ns);
    let mut out = Vec::new();
    for (ns, name) in set.policies.keys() {
        if missing(ns) {
            out.push(Warning {
                object: ObjectRef::Policy(ns.clone(), name.clone()),
                reason: format!(
                    "NetworkPolicy {ns}/{name} is in namespace {ns:?}, which has no Namespace object: it applies, to a namespace without labels (a namespaceSelector matches it only when empty); add a kind: Namespace document for {ns:?}"
                ),
            });
        }
    }
    for (ns, name) in set.pods.keys() {
        if missing(ns) {
            out.push(Warning {
                object: ObjectRef::Pod(ns.clone(), name.clone()),
                reason: format!(
                    "Pod {ns}/{name} is in namespace {ns:?}, which has no Namespace object: its identity has no namespace labels; add a kind: Namespace document for {ns:?}"
                ),
            });
        }
    }
    let declared: BTreeSet<NamedPortRef> = set
        .pods
        .values()
        .flat_map(|p| &p.named_ports)
        .map(|p| NamedPortRef {
            protocol: p.protocol,
            name: p.name.clone(),
        })
        .collect();
    for ((ns, name), policy) in &set.policies {
        let named: BTreeSet<&NamedPortRef> = policy
            .ingress
            .iter()
            .chain(&policy.egress)
            .flat_map(|r| &r.named_ports)
            .filter(|n| !declared.contains(*n))
            .collect();
        for port in named {
            out.push(Warning {
                object: ObjectRef::Policy(ns.clone(), name.clone()),
                reason: format!(
                    "NetworkPolicy {ns}/{name} names port {:?} ({}), which no Pod declares: that port clause matches no traffic until a pod has a container port of that name; check the name",
                    port.name,
                    protocol_name(port.protocol)
                ),
            });
        }
    }
    out.sort_by(|a, b| a.object.cmp(&b.object));
    out
}
