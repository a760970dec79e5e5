//! Pods of the cluster model and the node's endpoints: a local endpoint (registered by weir-cni
//! or the API with namespace and pod name) takes its labels from `set.pods[(namespace, pod)]`
//! when the source has that Pod, and keeps the labels of its registration otherwise (the
//! fallback, e.g. an endpoint registered through the API without a `kind: Pod` document). Pods
//! that are not local endpoints and not on this node are *remote*: their addresses carry their
//! identity (so they are peers by label), unless they use the host's network.

use std::{borrow::Cow, collections::BTreeSet, net::IpAddr};

use super::model::{Labels, NamedPort, Pod, PolicySet};
use weir_api::Endpoint;

/// The Pod object of a local endpoint, if the source has one.
#[must_use]
pub fn pod_of<'a>(endpoint: &Endpoint, set: &'a PolicySet) -> Option<&'a Pod> {
    // The lookup key is owned: skip building it when there is nothing to find.
    if set.pods.is_empty() {
        return None;
    }
    set.pods
        .get(&(endpoint.namespace.clone(), endpoint.pod.clone()))
        .filter(|_| !endpoint.pod.is_empty())
}

/// The named container ports of a local endpoint (its Pod's; none without a Pod object).
#[must_use]
pub fn named_ports_of(endpoint: &Endpoint, set: &PolicySet) -> Vec<NamedPort> {
    pod_of(endpoint, set)
        .map(|p| p.named_ports.clone())
        .unwrap_or_default()
}

/// The endpoint as policy sees it: with its Pod's labels when the source has the Pod.
#[must_use]
pub fn effective<'a>(endpoint: &'a Endpoint, set: &PolicySet) -> Cow<'a, Endpoint> {
    match pod_of(endpoint, set) {
        Some(pod) if pod.labels != endpoint.labels => Cow::Owned(Endpoint {
            labels: pod.labels.clone(),
            ..endpoint.clone()
        }),
        _ => Cow::Borrowed(endpoint),
    }
}

/// A pod of another node (or of no known node) whose addresses carry its identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemotePod {
    /// `namespace/name`.
    pub key: String,
    /// Namespace.
    pub namespace: String,
    /// Labels.
    pub labels: Labels,
    /// Its addresses.
    pub ips: Vec<IpAddr>,
    /// Its named container ports (egress named ports resolve on them).
    pub named_ports: Vec<NamedPort>,
}

/// The remote pods of `set`: not a local endpoint (by namespace and name), not on `node` (this
/// node's name, when known), not on the host network, with at least one address. Sorted by key:
/// when two claim one address, the last key's identity is the address's (as the calculation).
pub fn remote<'a>(
    set: &'a PolicySet,
    locals: impl IntoIterator<Item = &'a Endpoint>,
    node: Option<&'a str>,
) -> Vec<RemotePod> {
    if set.pods.is_empty() {
        return Vec::new();
    }
    let local: BTreeSet<(&str, &str)> = locals
        .into_iter()
        .map(|e| (e.namespace.as_str(), e.pod.as_str()))
        .collect();
    let mut pods = set
        .pods
        .values()
        .filter_map(|p| {
            remote_pod(
                p,
                local.contains(&(p.namespace.as_str(), p.name.as_str())),
                node,
            )
        })
        .collect::<Vec<_>>();
    pods.sort_by(|a, b| a.key.cmp(&b.key));
    pods
}

/// The key a remote pod has: `namespace/name`.
#[must_use]
pub fn remote_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// Pod `p` as a remote pod, unless it is a local endpoint (`local`), on `node` (this node's name,
/// when known), on the host network or without an address (the rule of [`remote`], for one pod).
#[must_use]
pub fn remote_pod(p: &Pod, local: bool, node: Option<&str>) -> Option<RemotePod> {
    let remote = !p.host_network
        && !p.ips.is_empty()
        && !local
        && (node.is_none() || p.node.as_deref() != node);
    remote.then(|| RemotePod {
        key: remote_key(&p.namespace, &p.name),
        namespace: p.namespace.clone(),
        labels: p.labels.clone(),
        ips: p.ips.clone(),
        named_ports: p.named_ports.clone(),
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn endpoint(ns: &str, pod: &str, app: &str) -> Endpoint {
        Endpoint {
            id: 1,
            container_id: "c".into(),
            ifname: "eth0".into(),
            host_ifname: "weir0".into(),
            netns: String::new(),
            namespace: ns.into(),
            pod: pod.into(),
            labels: BTreeMap::from([("app".into(), app.into())]),
            handle: String::new(),
            ips: vec![],
        }
    }

    fn pod(ns: &str, name: &str, app: &str, node: Option<&str>, ip: &str) -> Pod {
        Pod {
            namespace: ns.into(),
            name: name.into(),
            labels: BTreeMap::from([("app".into(), app.into())]),
            ips: vec![ip.parse().expect("ip")],
            node: node.map(str::to_owned),
            ..Pod::default()
        }
    }

    #[test]
    fn the_pod_object_wins_over_the_registration_and_is_the_fallback_otherwise() {
        let mut set = PolicySet::default();
        let e = endpoint("prod", "web-1", "registered");
        assert_eq!(
            effective(&e, &set).labels["app"],
            "registered",
            "no Pod: the fallback"
        );
        set.pods.insert(
            ("prod".into(), "web-1".into()),
            pod("prod", "web-1", "web", None, "10.0.0.1"),
        );
        assert_eq!(effective(&e, &set).labels["app"], "web");
        let nameless = endpoint("prod", "", "registered");
        assert_eq!(effective(&nameless, &set).labels["app"], "registered");
    }

    #[test]
    fn remote_pods_are_the_others_with_addresses() {
        let mut set = PolicySet::default();
        for p in [
            pod("prod", "local", "a", Some("n1"), "10.0.0.1"),
            pod("prod", "here-unregistered", "a", Some("n1"), "10.0.0.2"),
            pod("prod", "there", "b", Some("n2"), "10.0.1.1"),
            pod("prod", "nowhere", "b", None, "10.0.2.1"),
            Pod {
                host_network: true,
                ..pod("prod", "host", "c", Some("n2"), "192.0.2.2")
            },
            Pod {
                ips: vec![],
                ..pod("prod", "pending", "c", Some("n2"), "10.0.3.1")
            },
        ] {
            set.pods.insert((p.namespace.clone(), p.name.clone()), p);
        }
        let locals = [endpoint("prod", "local", "a")];
        let keys = |node| {
            remote(&set, &locals, node)
                .into_iter()
                .map(|r| r.key)
                .collect::<Vec<_>>()
        };
        assert_eq!(keys(Some("n1")), ["prod/nowhere", "prod/there"]);
        assert_eq!(
            keys(None),
            ["prod/here-unregistered", "prod/nowhere", "prod/there"],
            "without a node name every non-local pod is remote"
        );
    }
}
