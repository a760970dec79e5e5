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
    model::{NamedPortRef, Policy, PolicySet},
};
use crate::calc::policy::convert::DEFAULT_NAMESPACE;

/// One object that applies with a caveat.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning {
    /// The object.
    pub object: ObjectRef,
    /// What is odd and how to fix it.
    pub reason: String,
}

/// `TCP`, `UDP`, `SCTP`, or `protocol N`.
pub(crate) fn protocol_name(protocol: u8) -> String {
    match protocol {
        6 => "TCP".to_owned(),
        17 => "UDP".to_owned(),
        132 => "SCTP".to_owned(),
        other => format!("protocol {other}"),
    }
}

/// The caveats of one NetworkPolicy: its namespace has no Namespace object (`namespace_known`
/// false), or it names a port no Pod declares (`declared`).
pub fn of_policy(
    policy: &Policy,
    namespace_known: bool,
    declared: impl Fn(&NamedPortRef) -> bool,
) -> Vec<Warning> {
    let (ns, name) = (&policy.namespace, &policy.name);
    let mut out = Vec::new();
    if !namespace_known && ns != DEFAULT_NAMESPACE {
        out.push(Warning {
            object: ObjectRef::Policy(ns.clone(), name.clone()),
            reason: format!(
                "NetworkPolicy {ns}/{name} is in namespace {ns:?}, which has no Namespace object: it applies, to a namespace without labels (a namespaceSelector matches it only when empty); add a kind: Namespace document for {ns:?}"
            ),
        });
    }
    let named: BTreeSet<&NamedPortRef> = policy
        .ingress
        .iter()
        .chain(&policy.egress)
        .flat_map(|r| &r.named_ports)
        .filter(|n| !declared(n))
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
    out
}

/// The caveat of one Pod: its namespace has no Namespace object.
#[must_use]
pub fn of_pod(ns: &str, name: &str, namespace_known: bool) -> Option<Warning> {
    (!namespace_known && ns != DEFAULT_NAMESPACE).then(|| Warning {
        object: ObjectRef::Pod(ns.to_owned(), name.to_owned()),
        reason: format!(
            "Pod {ns}/{name} is in namespace {ns:?}, which has no Namespace object: its identity has no namespace labels; add a kind: Namespace document for {ns:?}"
        ),
    })
}

/// How a warning's text names its object (`NetworkPolicy ns/name `, `Pod ns/name `): a cluster
/// source replaces an object's warnings by this prefix when the object changes.
#[must_use]
pub fn prefix(kind: &str, ns: &str, name: &str) -> String {
    format!("{kind} {ns}/{name} ")
}

/// The warnings of `set`, sorted by object.
#[must_use]
pub fn check(set: &PolicySet) -> Vec<Warning> {
    let known = |ns: &str| set.namespaces.contains_key(ns);
    let declared: BTreeSet<NamedPortRef> = set
        .pods
        .values()
        .flat_map(|p| &p.named_ports)
        .map(|p| NamedPortRef {
            protocol: p.protocol,
            name: p.name.clone(),
        })
        .collect();
    let mut out: Vec<Warning> = set
        .policies
        .values()
        .flat_map(|p| of_policy(p, known(&p.namespace), |n| declared.contains(n)))
        .collect();
    out.extend(
        set.pods
            .keys()
            .filter_map(|(ns, name)| of_pod(ns, name, known(ns))),
    );
    out.sort_by(|a, b| a.object.cmp(&b.object));
    out
}
