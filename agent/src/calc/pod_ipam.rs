//! The IPAM annotations of a pod and its namespace (Calico's `ipv4pools`, `ipv6pools` and
//! `ipAddrs`, under `weir.dev/`): which pools an allocation may use, or which exact addresses the
//! pod asks for. Precedence per family: the pod's annotation, then its namespace's, then the CNI
//! config's `ipam.pools`, then every enabled pool that selects the node (DESIGN.md → "IPAM").
//!
//! The agent reads them on CNI ADD from the source's Pod and Namespace objects (the standalone
//! directory's documents, or the API server's objects), as the loop last took them: an annotation
//! changed on a running pod has no effect on its addresses (as Calico and Cilium).

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::IpAddr,
    sync::Arc,
};

use ipam::{cidr::Family, model::pool::IpPool};
use weir_api::AllocateRequest;

use crate::calc::policy::model::PolicySet;

/// Pools (names or CIDRs) the pod's IPv4 addresses come from: a JSON list of strings.
pub const IPV4_POOLS: &str = "weir.dev/ipv4pools";
/// Pools (names or CIDRs) the pod's IPv6 addresses come from: a JSON list of strings.
pub const IPV6_POOLS: &str = "weir.dev/ipv6pools";
/// Exact addresses the pod asks for, allocated through IPAM: a JSON list of strings (pod only).
pub const IP_ADDRS: &str = "weir.dev/ipAddrs";

const KEYS: [&str; 3] = [IPV4_POOLS, IPV6_POOLS, IP_ADDRS];

type Annotations = BTreeMap<String, String>;

/// The object an annotation was read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The Pod `namespace/name`.
    Pod(String),
    /// The Namespace.
    Namespace(String),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pod(key) => write!(f, "pod {key}"),
            Self::Namespace(name) => write!(f, "namespace {name}"),
        }
    }
}

/// An annotation that cannot be used (ADD fails naming it; nothing is allocated).
#[derive(Debug, thiserror::Error)]
pub enum AnnotationError {
    /// Not a JSON list of strings.
    #[error(
        "annotation {annotation} of {origin} is {value:?}, not a JSON list of strings ({source}); write it as '[\"blue\"]'"
    )]
    Syntax {
        /// The annotation.
        annotation: &'static str,
        /// Where it is.
        origin: Origin,
        /// Its value.
        value: String,
        /// Why it does not parse.
        #[source]
        source: serde_json::Error,
    },
    /// An entry of `ipAddrs` is not an address.
    #[error(
        "annotation {IP_ADDRS} of {origin} lists {entry:?}, which is not an IP address; list addresses such as \"10.244.1.5\""
    )]
    Address {
        /// Where it is.
        origin: Origin,
        /// The entry.
        entry: String,
    },
    /// `ipAddrs` together with a pool annotation of the pod.
    #[error(
        "{origin} has both {IP_ADDRS} and {pools}: an address request takes no pools; remove one of them"
    )]
    AddressesAndPools {
        /// Where it is.
        origin: Origin,
        /// The pool annotation.
        pools: &'static str,
    },
    /// `ipAddrs` together with `CNI_ARGS` `IP=`.
    #[error(
        "annotation {IP_ADDRS} of {origin} asks for addresses and so does the runtime (CNI_ARGS IP=); use one of them"
    )]
    AddressesTwice {
        /// Where it is.
        origin: Origin,
    },
    /// A pool annotation names a pool that does not exist.
    #[error(
        "annotation {annotation} of {origin} names pool {pool:?}, which does not exist ({known}); fix the annotation or add the pool with `weir ipam pool add`"
    )]
    UnknownPool {
        /// The annotation.
        annotation: &'static str,
        /// Where it is.
        origin: Origin,
        /// The name (or CIDR) as written.
        pool: String,
        /// The pools there are.
        known: String,
    },
    /// A pool annotation names a pool of the other family.
    #[error(
        "annotation {annotation} of {origin} names pool {pool:?} ({cidr}), which is not {family}; name {family} pools only"
    )]
    Family {
        /// The annotation.
        annotation: &'static str,
        /// Where it is.
        origin: Origin,
        /// The pool.
        pool: String,
        /// Its CIDR.
        cidr: String,
        /// The family the annotation is for.
        family: &'static str,
    },
}

/// One annotation's value and where it was read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sourced<T> {
    /// The annotation.
    pub annotation: &'static str,
    /// The object it is on.
    pub origin: Origin,
    /// Its value.
    pub value: T,
}

impl<T> fmt::Display for Sourced<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "annotation {} of {}", self.annotation, self.origin)
    }
}

/// What a pod's annotations (and its namespace's) ask of its allocation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Wanted {
    /// IPv4 pools, as written (names or CIDRs).
    pub v4_pools: Option<Sourced<Vec<String>>>,
    /// IPv6 pools, as written.
    pub v6_pools: Option<Sourced<Vec<String>>>,
    /// Exact addresses.
    pub ips: Option<Sourced<Vec<IpAddr>>>,
}

impl Wanted {
    /// True when no annotation applies.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.v4_pools.is_none() && self.v6_pools.is_none() && self.ips.is_none()
    }

    /// The annotations in force, for an error's context (`annotation X of pod Y, …`).
    #[must_use]
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(s) = &self.ips {
            parts.push(s.to_string());
        }
        if let Some(s) = &self.v4_pools {
            parts.push(s.to_string());
        }
        if let Some(s) = &self.v6_pools {
            parts.push(s.to_string());
        }
        parts.join(" and ")
    }
}

/// The annotations of one pod and of its namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodHints {
    namespace: String,
    pod: String,
    on_pod: Annotations,
    on_namespace: Annotations,
}

fn list(
    annotations: &Annotations,
    annotation: &'static str,
    origin: &dyn Fn() -> Origin,
) -> Result<Option<Sourced<Vec<String>>>, AnnotationError> {
    let Some(value) = annotations.get(annotation) else {
        return Ok(None);
    };
    let entries: Vec<String> =
        serde_json::from_str(value).map_err(|source| AnnotationError::Syntax {
            annotation,
            origin: origin(),
            value: value.clone(),
            source,
        })?;
    // An empty list asks for nothing: the next source of pools decides.
    Ok((!entries.is_empty()).then(|| Sourced {
        annotation,
        origin: origin(),
        value: entries,
    }))
}

impl PodHints {
    /// What the annotations ask, pod over namespace per annotation; `ipAddrs` is read on the pod
    /// only, and excludes the pod's own pool annotations.
    pub fn wanted(&self) -> Result<Wanted, AnnotationError> {
        let pod = || Origin::Pod(format!("{}/{}", self.namespace, self.pod));
        let namespace = || Origin::Namespace(self.namespace.clone());
        let pools = |annotation| -> Result<_, AnnotationError> {
            match list(&self.on_pod, annotation, &pod)? {
                Some(found) => Ok(Some(found)),
                None => list(&self.on_namespace, annotation, &namespace),
            }
        };
        let ips = match list(&self.on_pod, IP_ADDRS, &pod)? {
            None => None,
            Some(found) => {
                for annotation in [IPV4_POOLS, IPV6_POOLS] {
                    if self.on_pod.contains_key(annotation) {
                        return Err(AnnotationError::AddressesAndPools {
                            origin: pod(),
                            pools: annotation,
                        });
                    }
                }
                let mut ips = Vec::new();
                for entry in &found.value {
                    ips.push(entry.parse().map_err(|_| AnnotationError::Address {
                        origin: pod(),
                        entry: entry.clone(),
                    })?);
                }
                Some(Sourced {
                    annotation: IP_ADDRS,
                    origin: found.origin,
                    value: ips,
                })
            }
        };
        if ips.is_some() {
            // Exact addresses name their pools; the namespace's pools do not apply.
            return Ok(Wanted {
                ips,
                ..Wanted::default()
            });
        }
        Ok(Wanted {
            v4_pools: pools(IPV4_POOLS)?,
            v6_pools: pools(IPV6_POOLS)?,
            ips: None,
        })
    }
}

/// The IPAM annotations of every pod and namespace of the source that has any, and which pods the
/// source has at all (what the API reads from the loop's snapshot on CNI ADD).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IpamHints {
    pods: BTreeMap<(String, String), Annotations>,
    namespaces: BTreeMap<String, Annotations>,
    /// Every Pod of the source, by (namespace, name); shared between snapshots and copied only
    /// when a pod comes or goes (not when one is relabelled).
    known: Arc<BTreeSet<(String, String)>>,
}

fn ipam_only(annotations: &Annotations) -> Option<Annotations> {
    let kept: Annotations = annotations
        .iter()
        .filter(|(k, _)| KEYS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    (!kept.is_empty()).then_some(kept)
}

impl IpamHints {
    /// Pod `key`'s annotations changed (`None`: gone).
    pub fn set_pod(&mut self, key: &(String, String), annotations: Option<&Annotations>) {
        if annotations.is_some() != self.known.contains(key) {
            let known = Arc::make_mut(&mut self.known);
            if annotations.is_some() {
                known.insert(key.clone());
            } else {
                known.remove(key);
            }
        }
        match annotations.and_then(ipam_only) {
            Some(a) => self.pods.insert(key.clone(), a),
            None => self.pods.remove(key),
        };
    }

    /// True when the source has the Pod `namespace/pod`.
    #[must_use]
    pub fn knows_pod(&self, namespace: &str, pod: &str) -> bool {
        self.known.contains(&(namespace.to_owned(), pod.to_owned()))
    }

    /// Namespace `name`'s annotations changed (`None`: gone).
    pub fn set_namespace(&mut self, name: &str, annotations: Option<&Annotations>) {
        match annotations.and_then(ipam_only) {
            Some(a) => self.namespaces.insert(name.to_owned(), a),
            None => self.namespaces.remove(name),
        };
    }

    /// The hints of `set`'s Pods and Namespaces.
    #[must_use]
    pub fn of(set: &PolicySet) -> Arc<Self> {
        Arc::new(Self {
            pods: set
                .pods
                .iter()
                .filter_map(|(key, pod)| ipam_only(&pod.annotations).map(|a| (key.clone(), a)))
                .collect(),
            namespaces: set
                .namespace_annotations
                .iter()
                .filter_map(|(ns, a)| ipam_only(a).map(|a| (ns.clone(), a)))
                .collect(),
            known: Arc::new(set.pods.keys().cloned().collect()),
        })
    }

    /// The annotations of the pod `namespace/pod` and of its namespace (none when the source has
    /// neither object, or they carry none).
    #[must_use]
    pub fn for_pod(&self, namespace: &str, pod: &str) -> PodHints {
        PodHints {
            namespace: namespace.to_owned(),
            pod: pod.to_owned(),
            on_pod: self
                .pods
                .get(&(namespace.to_owned(), pod.to_owned()))
                .cloned()
                .unwrap_or_default(),
            on_namespace: self.namespaces.get(namespace).cloned().unwrap_or_default(),
        }
    }
}

fn family_name(family: Family) -> &'static str {
    match family {
        Family::V4 => "IPv4",
        Family::V6 => "IPv6",
    }
}

/// The pool names an annotation's entries (names or CIDRs) mean, each checked to exist and to be
/// of `family`.
fn resolve_pools(
    found: &Sourced<Vec<String>>,
    family: Family,
    pools: &[IpPool],
) -> Result<Vec<String>, AnnotationError> {
    let mut names = Vec::new();
    for entry in &found.value {
        let pool = pools
            .iter()
            .find(|p| p.name == *entry)
            .or_else(|| {
                let cidr: ipnetwork::IpNetwork = entry.parse().ok()?;
                pools.iter().find(|p| p.cidr == cidr)
            })
            .ok_or_else(|| AnnotationError::UnknownPool {
                annotation: found.annotation,
                origin: found.origin.clone(),
                pool: entry.clone(),
                known: if pools.is_empty() {
                    "there are none".to_owned()
                } else {
                    let known: Vec<String> = pools
                        .iter()
                        .map(|p| format!("{} {}", p.name, p.cidr))
                        .collect();
                    format!("the pools are {}", known.join(", "))
                },
            })?;
        if pool.family() != family {
            return Err(AnnotationError::Family {
                annotation: found.annotation,
                origin: found.origin.clone(),
                pool: entry.clone(),
                cidr: pool.cidr.to_string(),
                family: family_name(family),
            });
        }
        if !names.contains(&pool.name) {
            names.push(pool.name.clone());
        }
    }
    Ok(names)
}

/// `req` (the CNI's request: counts, or `CNI_ARGS` addresses, and the CNI config's pools) with
/// the annotations applied. The IPAM library takes one list of pools for both families, so each
/// family's list is made explicit when one family is annotated: the annotation's, else the CNI
/// config's pools of that family, else every enabled pool of the family that selects the node
/// (`node_labels`), as the library chooses without a list.
pub fn apply(
    req: &AllocateRequest,
    wanted: &Wanted,
    pools: &[IpPool],
    node_labels: &Annotations,
) -> Result<AllocateRequest, AnnotationError> {
    let mut out = req.clone();
    if let Some(ips) = &wanted.ips {
        if !req.ips.is_empty() {
            return Err(AnnotationError::AddressesTwice {
                origin: ips.origin.clone(),
            });
        }
        out.ips.clone_from(&ips.value);
        (out.ipv4, out.ipv6) = (0, 0);
        out.pools.clear();
        return Ok(out);
    }
    if wanted.v4_pools.is_none() && wanted.v6_pools.is_none() {
        return Ok(out);
    }
    let mut names: Vec<String> = Vec::new();
    for (family, count, annotated) in [
        (Family::V4, req.ipv4, &wanted.v4_pools),
        (Family::V6, req.ipv6, &wanted.v6_pools),
    ] {
        if count == 0 {
            continue;
        }
        let of_family = match annotated {
            Some(found) => resolve_pools(found, family, pools)?,
            None if !req.pools.is_empty() => req
                .pools
                .iter()
                // An unknown name stays: the library refuses it, naming it.
                .filter(|n| pools.iter().all(|p| p.name != **n || p.family() == family))
                .cloned()
                .collect(),
            None => pools
                .iter()
                .filter(|p| {
                    p.family() == family && !p.disabled && p.selects(node_labels, &BTreeMap::new())
                })
                .map(|p| p.name.clone())
                .collect(),
        };
        for name in of_family {
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    out.pools = names;
    Ok(out)
}

#[cfg(test)]
#[path = "pod_ipam_tests.rs"]
mod tests;
