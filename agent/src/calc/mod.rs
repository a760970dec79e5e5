//! The calculation layer: security identities (`identity`, cluster-wide in `identity_store`), the cluster
//! model and NetworkPolicy (`policy/`), Services (`services/`), pod IPAM (`pod_ipam`: the annotations;
//! `ipam_service`: allocations), the reference compile (`reference`), and, in this module, the
//! incremental calculation (Cilium's selector cache, Felix's calculation graph): the
//! sources (endpoints, namespace labels, policies, node addresses) arrive as changes, and each
//! change touches only what it affects, recording the map keys it changed in the map drivers'
//! desired state (their dirty sets then hold exactly what the next apply must write):
//!
//! - endpoints with the same namespace and labels form a **label class**, which has one identity;
//!   policies select classes (`podSelector`, fixed once a class exists) and rules' peers select
//!   them (the selector cache, `peers`). A pod whose labels change moves to another class: its
//!   own entries, and the entries of rules whose peers gain or lose an identity by it, change;
//! - a namespace's labels change the identities of its classes and what namespace selectors match;
//! - a policy added, changed or removed (`set_policies` diffs the new set against the old by
//!   namespace/name) adds or withdraws the entries of its rules for the endpoints it selects;
//! - node addresses (this node's: host; other nodes': remote-node, `node_addresses`) change only
//!   their `ident` entries.
//!
//! Policy entries are kept by group (`groups`): a group is recompiled from its contributing
//! rules in the full compile's order, so the result equals `policy::compile::compile` over the
//! same sources (the tests check that after random sequences of changes), with rule ids from
//! `rule_ids` instead of the full compile's positions.
//!
//! Every identity a change needs is allocated and persisted before anything else changes, so a
//! failure leaves the calculation as it was. No kernel I/O here: `flush` writes desired state.

pub mod identity;
pub mod identity_store;
pub mod ipam_service;
pub mod pod_ipam;
pub mod policy;
pub mod reference;
pub mod services;

mod classes;
mod deltas;
pub(crate) use crate::fasthash;
mod groups;
mod layered;
mod named;
mod node_addresses;
mod peers;
mod policies;
mod remote;
pub(crate) mod rule_ids;
mod slab;

#[cfg(test)]
mod bench;
#[cfg(test)]
mod equivalence;
#[cfg(test)]
pub(crate) mod testkit;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    hash::Hash,
    net::IpAddr,
};

use ipnetwork::IpNetwork;
use maps_schema::{
    IdentityInfo,
    endpoint::{FLAG_ISOLATED_EGRESS, FLAG_ISOLATED_INGRESS},
    identity::HOST,
};

use self::{
    fasthash::FastMap,
    groups::Groups,
    layered::Layered,
    peers::{PeerEntry, PeerKey},
    rule_ids::RuleIds,
    slab::Slab,
};

use weir_api::Endpoint;

use crate::{
    calc::{
        identity::{Identities, IdentityError, LabelSet},
        policy::{
            compile::RuleRef,
            model::{NamedPort, NamedPortRef, Peer, Policy, PolicySet, PortSpec},
            pods::RemotePod,
        },
    },
    dataplane::{endpoints, map_driver::MapDriver, plane::Dataplane},
    kernel::Prefix,
};

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

fn identity_info(identity: u32) -> IdentityInfo {
    IdentityInfo { identity, flags: 0 }
}

/// The key should hold `value`, or not exist.
fn put<K: Clone + Eq + Hash + Send + std::fmt::Debug>(
    driver: &mut MapDriver<K, IdentityInfo>,
    key: K,
    value: Option<IdentityInfo>,
) {
    match value {
        Some(v) => driver.set(key, v),
        None => driver.remove(&key),
    }
}

/// Who says an address has an identity: another node (remote-node, by name), the node (host), a remote pod (by `namespace/name`) or an
/// endpoint (by registry key). Later variants win (a local endpoint over a remote pod's stale
/// address), and among endpoints the last key (as a full rebuild wrote them).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Source {
    RemoteNode(String),
    Node,
    Remote(String),
    Endpoint(String),
}

/// Endpoints sharing namespace and labels (so an identity and every selector's verdict).
struct Class {
    namespace: String,
    labels: BTreeMap<String, String>,
    identity: u32,
    /// Endpoint id → registry key.
    members: BTreeMap<u32, String>,
    /// Remote pods (`namespace/name`) of the class: peers by label, no entries of their own.
    remote: BTreeSet<String>,
    /// Policies whose `podSelector` selects the class.
    subject_of: BTreeSet<usize>,
    /// Selector-cache entries matching the class.
    peer_of: BTreeSet<usize>,
}

/// A registered endpoint as the calculation needs it (its namespace and labels are its
/// class's; the registry holds the rest) and its class.
struct Member {
    id: u32,
    host_ifname: String,
    ips: Vec<IpAddr>,
    class: usize,
}

/// A policy in force.
struct PolicyState {
    policy: Policy,
    /// Classes its `podSelector` selects.
    classes: BTreeSet<usize>,
    /// Ids of its rules (directions it isolates only).
    rules: Vec<u32>,
    /// CIDRs of the rules of a direction it does not isolate: no entries, but, as in the full
    /// compile, policy CIDRs all the same (identities, ipcache, inside other blocks).
    idle_cidrs: Vec<IpNetwork>,
}

/// A rule in force.
pub(super) struct RuleState {
    /// The full compile's order: namespace, name, direction (ingress first), index.
    pub(super) order: (String, String, u8, usize),
    policy: usize,
    direction: u8,
    /// Port clauses by protocol (one `ANY_PROTO` group without clauses for a rule without ports).
    ports: Vec<(u8, Vec<PortSpec>)>,
    /// Named port clauses, resolved per destination pod (`named`).
    pub(super) named: Vec<NamedPortRef>,
    /// Selector-cache entries of its peers (a peer named twice is here twice).
    peers: Vec<usize>,
    /// Peer identity → how many of its peers select it (`ANY` for a rule without peers).
    identities: FastMap<u32, u32>,
}

impl RuleState {
    /// The port clauses of `protocol` (none: every port of every protocol).
    pub(super) fn ports_of(&self, protocol: u8) -> &[PortSpec] {
        self.ports
            .iter()
            .find(|(p, _)| *p == protocol)
            .map_or(&[], |(_, specs)| specs.as_slice())
    }
}

/// A policy CIDR in force.
struct CidrState {
    /// Peers naming it (as block or exception).
    refs: u32,
    identity: u32,
}

/// The incremental calculation: sources in, desired map contents out.
pub struct Calculation {
    identities: Identities,
    namespaces: BTreeMap<String, BTreeMap<String, String>>,
    node_addresses: BTreeSet<IpAddr>,
    /// Other nodes' addresses by node name (remote-node unless a policy CIDR covers them).
    remote_nodes: BTreeMap<String, Vec<IpAddr>>,
    members: HashMap<String, Member>,
    /// Remote pods by `namespace/name`, with their class.
    remote_pods: HashMap<String, (RemotePod, usize)>,
    classes: Slab<Class>,
    class_index: HashMap<(String, BTreeMap<String, String>), usize>,
    classes_by_namespace: HashMap<String, BTreeSet<usize>>,
    policies: Slab<PolicyState>,
    policy_index: BTreeMap<(String, String), usize>,
    policies_by_namespace: HashMap<String, BTreeSet<usize>>,
    rules: FastMap<u32, RuleState>,
    /// Rules with named port clauses (their groups are recompiled when named ports change).
    named_rules: BTreeSet<u32>,
    /// Named container ports of local endpoints, by registry key.
    endpoint_ports: HashMap<String, Vec<NamedPort>>,
    rule_ids: RuleIds,
    peers: Slab<PeerEntry>,
    peer_index: HashMap<PeerKey, usize>,
    cidrs: BTreeMap<IpNetwork, CidrState>,
    /// Identities of every policy CIDR seen (allocated before a policy naming it is applied;
    /// CIDR identities stay allocated, as label-set identities do).
    cidr_identities: HashMap<IpNetwork, u32>,
    groups: Groups,
    ident: Layered<IpAddr, Source>,
    /// Normalised prefix → the CIDRs with that prefix (an `except` keeps its host bits).
    ipcache: Layered<IpNetwork, IpNetwork>,
    /// Endpoints (registry keys) whose map entry may have changed.
    dirty_endpoints: BTreeSet<String>,
    /// Host-side interfaces whose endpoint entry must go.
    gone_links: BTreeSet<String>,
}

impl Calculation {
    /// An empty calculation allocating from `identities`.
    #[must_use]
    pub fn new(identities: Identities) -> Self {
        Self {
            identities,
            namespaces: BTreeMap::new(),
            node_addresses: BTreeSet::new(),
            remote_nodes: BTreeMap::new(),
            members: HashMap::new(),
            remote_pods: HashMap::new(),
            classes: Slab::new(),
            class_index: HashMap::new(),
            classes_by_namespace: HashMap::new(),
            policies: Slab::new(),
            policy_index: BTreeMap::new(),
            policies_by_namespace: HashMap::new(),
            rules: FastMap::default(),
            named_rules: BTreeSet::new(),
            endpoint_ports: HashMap::new(),
            rule_ids: RuleIds::default(),
            peers: Slab::new(),
            peer_index: HashMap::new(),
            cidrs: BTreeMap::new(),
            cidr_identities: HashMap::new(),
            groups: Groups::default(),
            ident: Layered::new(),
            ipcache: Layered::new(),
            dirty_endpoints: BTreeSet::new(),
            gone_links: BTreeSet::new(),
        }
    }

    /// True when the source has a Namespace object `namespace` (its labels are known).
    #[must_use]
    pub fn has_namespace(&self, namespace: &str) -> bool {
        self.namespaces.contains_key(namespace)
    }

    fn namespace_labels(&self, namespace: &str) -> &BTreeMap<String, String> {
        self.namespaces.get(namespace).unwrap_or(&NO_LABELS)
    }

    fn labels_of(&self, endpoint: &Endpoint) -> LabelSet {
        LabelSet::for_pod(
            &endpoint.labels,
            &endpoint.namespace,
            self.namespace_labels(&endpoint.namespace),
        )
    }

    /// The identity of an endpoint's label set, if allocated.
    #[must_use]
    pub fn identity_of(&self, endpoint: &Endpoint) -> Option<u32> {
        self.identities.get(&self.labels_of(endpoint))
    }

    /// Allocates (and persists) the identity an endpoint would have, changing nothing else: done
    /// before the endpoint is stored anywhere, so a failure leaves every source as it was.
    pub fn prepare_endpoint(&mut self, endpoint: &Endpoint) -> Result<u32, IdentityError> {
        let identity = self.identities.allocate(&self.labels_of(endpoint))?;
        self.identities.persist_allocated()?;
        Ok(identity)
    }

    /// Adds or replaces endpoints (by registry key); returns their identities.
    pub fn upsert_endpoints(&mut self, endpoints: &[&Endpoint]) -> Result<Vec<u32>, IdentityError> {
        let mut identities = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            identities.push(self.identities.allocate(&self.labels_of(endpoint))?);
        }
        self.identities.persist_allocated()?;
        for (endpoint, identity) in endpoints.iter().zip(&identities) {
            self.apply_endpoint(endpoint, *identity);
        }
        if !endpoints.is_empty() {
            self.named_inputs_changed();
        }
        Ok(identities)
    }

    /// Removes an endpoint (by registry key).
    pub fn remove_endpoint(&mut self, key: &str) {
        if let Some(host_ifname) = self.leave(key) {
            self.gone_links.insert(host_ifname);
            self.named_inputs_changed();
        }
    }

    /// The node's own addresses, which carry the host identity.
    pub fn set_node_addresses(&mut self, addresses: &BTreeSet<IpAddr>) {
        for gone in self.node_addresses.difference(addresses) {
            self.ident.unset(*gone, &Source::Node);
        }
        for new in addresses.difference(&self.node_addresses) {
            self.ident.set(*new, Source::Node, HOST);
        }
        self.node_addresses.clone_from(addresses);
    }

    /// Where a rule id came from.
    #[must_use]
    pub fn rule(&self, rule_id: u32) -> Option<&RuleRef> {
        self.rule_ids.get(rule_id)
    }

    /// Every rule id in use with its origin, in id order.
    #[must_use]
    pub fn rules(&self) -> Vec<(u32, &RuleRef)> {
        self.rule_ids.all()
    }

    /// Number of policies in force.
    #[must_use]
    pub fn policy_count(&self) -> usize {
        self.policy_index.len()
    }

    /// True when changes wait for `flush`.
    #[must_use]
    pub fn is_dirty(&self) -> bool {
        self.groups.is_dirty() || !self.dirty_endpoints.is_empty() || !self.gone_links.is_empty()
    }

    /// Writes what changed into the managers' and drivers' desired state (no kernel I/O).
    pub fn flush(&mut self, dp: &mut Dataplane) {
        let ipcache_dirty = self.ipcache.take_dirty();
        if !ipcache_dirty.is_empty() {
            // Policy CIDRs changed: which node addresses they cover may have too.
            self.sync_remote_nodes(None);
        }
        for address in self.ident.take_dirty() {
            let value = self.ident.winner(&address).map(identity_info);
            match address {
                IpAddr::V4(a) => put(&mut dp.ident4, a.octets(), value),
                IpAddr::V6(a) => put(&mut dp.ident6, a.octets(), value),
            }
        }
        for net in ipcache_dirty {
            let value = self.ipcache.winner(&net).map(identity_info);
            let len = u32::from(net.prefix());
            match net {
                IpNetwork::V4(n) => {
                    let data = n.network().octets();
                    put(&mut dp.ipcache4, Prefix { len, data }, value);
                }
                IpNetwork::V6(n) => {
                    let data = n.network().octets();
                    put(&mut dp.ipcache6, Prefix { len, data }, value);
                }
            }
        }
        if self.named_rules.is_empty() || !self.groups.is_dirty() {
            self.groups
                .flush(&self.rules, &named::Resolved::default(), &mut dp.policy);
        } else {
            let resolved = self.resolve_named();
            self.groups.flush(&self.rules, &resolved, &mut dp.policy);
        }
        for host_ifname in std::mem::take(&mut self.gone_links) {
            dp.endpoints_manager.remove(&mut dp.endpoints, &host_ifname);
        }
        for key in std::mem::take(&mut self.dirty_endpoints) {
            let Some(member) = self.members.get(&key) else {
                continue;
            };
            let Some(class) = self.classes.get(member.class) else {
                continue;
            };
            let info =
                endpoints::entry_of(member.id, &member.ips, class.identity, self.flags_of(class));
            dp.endpoints_manager
                .upsert(&mut dp.endpoints, &member.host_ifname, info);
        }
    }

    /// Isolation flags of a class's endpoints: every policy selecting it isolates its directions.
    fn flags_of(&self, class: &Class) -> u32 {
        class
            .subject_of
            .iter()
            .filter_map(|p| self.policies.get(*p))
            .fold(0, |flags, p| {
                let mut f = flags;
                if p.policy.ingress_isolated {
                    f |= FLAG_ISOLATED_INGRESS;
                }
                if p.policy.egress_isolated {
                    f |= FLAG_ISOLATED_EGRESS;
                }
                f
            })
    }

    /// Sizes, for tests and benchmarks: (classes, policies, rules, selector-cache entries, groups).
    #[must_use]
    pub fn sizes(&self) -> (usize, usize, usize, usize, usize) {
        (
            self.classes.len(),
            self.policies.len(),
            self.rules.len(),
            self.peers.len(),
            self.groups.len(),
        )
    }

    /// The namespaces whose labels `set` changes (their endpoints' identities follow).
    #[must_use]
    pub fn relabelled_namespaces(&self, set: &PolicySet) -> BTreeSet<String> {
        self.namespaces
            .keys()
            .chain(set.namespaces.keys())
            .filter(|ns| self.namespace_labels(ns) != set.namespaces.get(*ns).unwrap_or(&NO_LABELS))
            .cloned()
            .collect()
    }

    /// Applies a whole new policy set (namespaces' labels included), diffed against the last.
    pub fn set_policies(&mut self, set: &PolicySet) -> Result<(), IdentityError> {
        let changed_namespaces = self.relabelled_namespaces(set);
        let stale: Vec<(String, String)> = self
            .policy_index
            .iter()
            .filter(|(key, id)| {
                set.policies
                    .get(*key)
                    .is_none_or(|new| self.policies.get(**id).is_none_or(|old| old.policy != *new))
            })
            .map(|(key, _)| key.clone())
            .collect();
        let fresh: Vec<(&(String, String), &Policy)> = set
            .policies
            .iter()
            .filter(|(key, _)| !self.policy_index.contains_key(*key) || stale.contains(key))
            .collect();

        // Allocate first: nothing changes unless every identity the new set needs is persisted.
        let mut relabelled = HashMap::new();
        for ns in &changed_namespaces {
            let labels = set.namespaces.get(ns).unwrap_or(&NO_LABELS);
            for id in self.classes_by_namespace.get(ns).into_iter().flatten() {
                if let Some(class) = self.classes.get(*id) {
                    let set = LabelSet::for_pod(&class.labels, ns, labels);
                    relabelled.insert(*id, self.identities.allocate(&set)?);
                }
            }
        }
        for (_, policy) in &fresh {
            for rule in policy.ingress.iter().chain(&policy.egress) {
                for peer in &rule.peers {
                    if let Peer::Cidr { cidr, except } = peer {
                        for net in std::iter::once(cidr).chain(except) {
                            if !self.cidr_identities.contains_key(net) {
                                let id = self.identities.allocate(&LabelSet::for_cidr(net))?;
                                self.cidr_identities.insert(*net, id);
                            }
                        }
                    }
                }
            }
        }
        self.identities.persist_allocated()?;

        for key in &stale {
            self.remove_policy(key);
        }
        if !changed_namespaces.is_empty() {
            self.namespaces.clone_from(&set.namespaces);
            for ns in &changed_namespaces {
                self.relabel_namespace(ns, &relabelled);
            }
            self.named_inputs_changed();
        }
        for (key, policy) in fresh {
            self.add_policy(key.clone(), policy.clone());
        }
        Ok(())
    }
}
