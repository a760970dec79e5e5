//! The selector cache: one entry per distinct peer of any rule (a pod/namespace selector pair, or
//! an `ipBlock`), shared by every rule that names it. An entry knows the identities it selects now
//! (counted: several label classes can share an identity), the rules using it, and, for selectors,
//! the label classes it matches, so a change of one class or CIDR touches only the entries whose
//! match set it changes.

use std::collections::BTreeMap;

use ipnetwork::IpNetwork;

use super::fasthash::{FastMap, FastSet};
use crate::calc::policy::{compile::contains, model::Peer, selector::Selector};

/// Which namespaces a pod peer looks in.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum Namespaces {
    /// The policy's own (no namespace selector).
    Own(String),
    /// Every namespace whose labels match.
    Matching(Selector),
}

/// A peer, as cached.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum PeerKey {
    /// Pods of the namespaces, matching `pods` (None: every pod).
    Pods {
        namespaces: Namespaces,
        pods: Option<Selector>,
    },
    /// Every policy CIDR inside `cidr` and inside none of `except`.
    Cidr {
        cidr: IpNetwork,
        except: Vec<IpNetwork>,
    },
}

impl PeerKey {
    /// The cache key of `peer` in a policy of `namespace`.
    pub(super) fn of(peer: &Peer, namespace: &str) -> Self {
        match peer {
            Peer::Pods { namespaces, pods } => Self::Pods {
                namespaces: namespaces.clone().map_or_else(
                    || Namespaces::Own(namespace.to_owned()),
                    Namespaces::Matching,
                ),
                pods: pods.clone(),
            },
            Peer::Cidr { cidr, except } => Self::Cidr {
                cidr: *cidr,
                except: except.clone(),
            },
        }
    }

    /// True when a selector selects the pods of a label class (a CIDR peer selects none).
    pub(super) fn matches_class(
        &self,
        namespace: &str,
        labels: &BTreeMap<String, String>,
        namespace_labels: &BTreeMap<String, String>,
    ) -> bool {
        match self {
            Self::Pods {
                namespaces,
                pods: selector,
            } => {
                let in_namespace = match namespaces {
                    Namespaces::Own(own) => own == namespace,
                    Namespaces::Matching(s) => s.matches(namespace_labels),
                };
                in_namespace && selector.as_ref().is_none_or(|s| s.matches(labels))
            }
            Self::Cidr { .. } => false,
        }
    }

    /// True when an `ipBlock` selects the identity of policy CIDR `net`: inside the block, outside
    /// its exceptions (so a more specific block of another policy inside it is still selected).
    pub(super) fn selects_cidr(&self, net: &IpNetwork) -> bool {
        match self {
            Self::Cidr { cidr, except } => {
                contains(cidr, net) && !except.iter().any(|e| contains(e, net))
            }
            Self::Pods { .. } => false,
        }
    }

    /// The CIDRs this peer names (each gets a CIDR identity and an ipcache entry).
    pub(super) fn cidrs(&self) -> Vec<IpNetwork> {
        match self {
            Self::Cidr { cidr, except } => std::iter::once(*cidr).chain(except.clone()).collect(),
            Self::Pods { .. } => Vec::new(),
        }
    }
}

/// One cached peer.
pub(super) struct PeerEntry {
    pub(super) key: PeerKey,
    /// Identity → how many label classes (or CIDRs) supply it; only non-zero counts are kept.
    pub(super) identities: FastMap<u32, u32>,
    /// Rule id → how many of the rule's peers are this one.
    pub(super) users: FastMap<u32, u32>,
    /// Label classes matched (selectors only).
    pub(super) classes: FastSet<usize>,
}

impl PeerEntry {
    pub(super) fn new(key: PeerKey) -> Self {
        Self {
            key,
            identities: FastMap::default(),
            users: FastMap::default(),
            classes: FastSet::default(),
        }
    }
}
