//! Policies and their rules, the selector cache's entries, and policy CIDRs: adding and removing
//! them, and passing a change of what a peer selects on to the rules using it.

use std::collections::BTreeSet;

use ipnetwork::IpNetwork;
use maps_schema::{
    identity::ANY,
    policy::{ANY_PROTO, EGRESS, INGRESS},
};

use super::{
    Calculation, CidrState, PolicyState, RuleState,
    fasthash::FastMap,
    groups::GroupKey,
    peers::{Namespaces, PeerEntry, PeerKey},
};
use crate::calc::policy::{
    compile::RuleRef,
    model::{Policy, PortSpec, Rule},
};

impl Calculation {
    pub(super) fn add_policy(&mut self, key: (String, String), policy: Policy) {
        let namespace = policy.namespace.clone();
        let selected: BTreeSet<usize> = self
            .classes_by_namespace
            .get(&namespace)
            .into_iter()
            .flatten()
            .copied()
            .filter(|c| {
                self.classes
                    .get(*c)
                    .is_some_and(|c| policy.pod_selector.matches(&c.labels))
            })
            .collect();
        let directions = [
            (policy.ingress_isolated, policy.ingress.clone(), INGRESS, 0),
            (policy.egress_isolated, policy.egress.clone(), EGRESS, 1),
        ];
        let idle_cidrs: Vec<IpNetwork> = directions
            .iter()
            .filter(|(isolated, ..)| !isolated)
            .flat_map(|(_, rules, ..)| rules.iter().flat_map(|r| &r.peers))
            .flat_map(|peer| PeerKey::of(peer, &namespace).cidrs())
            .collect();
        for net in &idle_cidrs {
            self.cidr_ref(*net, true);
        }
        let id = self.policies.insert(PolicyState {
            policy,
            classes: selected.clone(),
            rules: Vec::new(),
            idle_cidrs,
        });
        self.policy_index.insert(key.clone(), id);
        self.policies_by_namespace
            .entry(namespace)
            .or_default()
            .insert(id);
        for class in &selected {
            if let Some(c) = self.classes.get_mut(*class) {
                c.subject_of.insert(id);
            }
            self.mark_class_dirty(*class);
        }
        let mut rules = Vec::new();
        for (isolated, list, direction, order) in directions {
            if !isolated {
                continue;
            }
            for (index, rule) in list.iter().enumerate() {
                let order = (key.0.clone(), key.1.clone(), order, index);
                rules.push(self.create_rule(id, direction, order, rule));
            }
        }
        if let Some(p) = self.policies.get_mut(id) {
            p.rules = rules;
        }
    }

    pub(super) fn remove_policy(&mut self, key: &(String, String)) {
        let Some(id) = self.policy_index.remove(key) else {
            return;
        };
        let rules = self
            .policies
            .get_mut(id)
            .map(|p| std::mem::take(&mut p.rules))
            .unwrap_or_default();
        for rule in rules {
            self.remove_rule(rule);
        }
        let Some(policy) = self.policies.remove(id) else {
            return;
        };
        for net in &policy.idle_cidrs {
            self.cidr_ref(*net, false);
        }
        if let Some(set) = self.policies_by_namespace.get_mut(&policy.policy.namespace) {
            set.remove(&id);
            if set.is_empty() {
                self.policies_by_namespace.remove(&policy.policy.namespace);
            }
        }
        for class in policy.classes {
            if let Some(c) = self.classes.get_mut(class) {
                c.subject_of.remove(&id);
            }
            self.mark_class_dirty(class);
        }
    }

    fn create_rule(
        &mut self,
        policy: usize,
        direction: u8,
        order: (String, String, u8, usize),
        rule: &Rule,
    ) -> u32 {
        let (namespace, name, _, index) = &order;
        let id = self.rule_ids.allocate(RuleRef {
            policy: format!("{namespace}/{name}"),
            direction: if direction == INGRESS {
                "ingress"
            } else {
                "egress"
            },
            index: *index,
        });
        // Every peer entry exists before the rule uses any: creating one may change another.
        let peers: Vec<usize> = rule
            .peers
            .iter()
            .map(|p| self.peer_get_or_create(PeerKey::of(p, namespace)))
            .collect();
        let mut identities = FastMap::default();
        if peers.is_empty() {
            identities.insert(ANY, 1);
        }
        for p in &peers {
            if let Some(peer) = self.peers.get_mut(*p) {
                *peer.users.entry(id).or_default() += 1;
                for identity in peer.identities.keys() {
                    *identities.entry(*identity).or_default() += 1;
                }
            }
        }
        let state = RuleState {
            order,
            policy,
            direction,
            ports: ports_by_protocol(rule),
            named: rule.named_ports.clone(),
            peers,
            identities,
        };
        let peer_identities: Vec<u32> = state.identities.keys().copied().collect();
        if !state.named.is_empty() {
            self.named_rules.insert(id);
        }
        self.rules.insert(id, state);
        for identity in peer_identities {
            self.rule_contributions(id, identity, true);
        }
        id
    }

    fn remove_rule(&mut self, id: u32) {
        let peer_identities: Vec<u32> = self
            .rules
            .get(&id)
            .map(|r| r.identities.keys().copied().collect())
            .unwrap_or_default();
        for identity in peer_identities {
            self.rule_contributions(id, identity, false);
        }
        let Some(rule) = self.rules.remove(&id) else {
            return;
        };
        self.named_rules.remove(&id);
        let mut unused = Vec::new();
        for p in rule.peers {
            if let Some(peer) = self.peers.get_mut(p)
                && let Some(n) = peer.users.get_mut(&id)
            {
                *n -= 1;
                if *n == 0 {
                    peer.users.remove(&id);
                    if peer.users.is_empty() {
                        unused.push(p);
                    }
                }
            }
        }
        for p in unused {
            self.peer_release(p);
        }
        self.rule_ids.free(id);
    }

    /// Adds (or withdraws) rule `id`'s entries for peer `identity` on every endpoint its policy
    /// selects.
    fn rule_contributions(&mut self, id: u32, identity: u32, add: bool) {
        let Some(rule) = self.rules.get(&id) else {
            return;
        };
        let Some(policy) = self.policies.get(rule.policy) else {
            return;
        };
        for class in &policy.classes {
            let Some(c) = self.classes.get(*class) else {
                continue;
            };
            for endpoint in c.members.keys() {
                for (protocol, _) in &rule.ports {
                    let key = GroupKey {
                        endpoint: *endpoint,
                        direction: rule.direction,
                        peer: identity,
                        protocol: *protocol,
                    };
                    self.groups.toggle(key, id, add);
                }
            }
        }
    }

    fn peer_get_or_create(&mut self, key: PeerKey) -> usize {
        if let Some(id) = self.peer_index.get(&key) {
            return *id;
        }
        // A block's CIDRs are policy CIDRs from now on (this may widen other blocks' peers).
        for net in key.cidrs() {
            self.cidr_ref(net, true);
        }
        let mut entry = PeerEntry::new(key.clone());
        for (net, cidr) in &self.cidrs {
            if key.selects_cidr(net) {
                *entry.identities.entry(cidr.identity).or_default() += 1;
            }
        }
        let candidates: Vec<usize> = match &key {
            // A selector of the policy's own namespace looks at that namespace's classes only.
            PeerKey::Pods {
                namespaces: Namespaces::Own(ns),
                ..
            } => self
                .classes_by_namespace
                .get(ns)
                .into_iter()
                .flatten()
                .copied()
                .collect(),
            PeerKey::Pods { .. } => self.classes.iter().map(|(id, _)| id).collect(),
            PeerKey::Cidr { .. } => Vec::new(),
        };
        for class_id in candidates {
            let Some(class) = self.classes.get(class_id) else {
                continue;
            };
            let labels = self.namespace_labels(&class.namespace);
            if key.matches_class(&class.namespace, &class.labels, labels) {
                entry.classes.insert(class_id);
                *entry.identities.entry(class.identity).or_default() += 1;
            }
        }
        let classes: Vec<usize> = entry.classes.iter().copied().collect();
        let id = self.peers.insert(entry);
        for class in classes {
            if let Some(c) = self.classes.get_mut(class) {
                c.peer_of.insert(id);
            }
        }
        self.peer_index.insert(key, id);
        id
    }

    fn peer_release(&mut self, id: usize) {
        let Some(entry) = self.peers.remove(id) else {
            return;
        };
        self.peer_index.remove(&entry.key);
        for class in &entry.classes {
            if let Some(c) = self.classes.get_mut(*class) {
                c.peer_of.remove(&id);
            }
        }
        for net in entry.key.cidrs() {
            self.cidr_ref(net, false);
        }
    }

    /// Peer `id` selects one more (or one fewer) class or CIDR of `identity`; when that starts
    /// or stops it selecting the identity at all, its rules learn it.
    pub(super) fn peer_identity(&mut self, id: usize, identity: u32, add: bool) {
        let Some(peer) = self.peers.get_mut(id) else {
            return;
        };
        let count = peer.identities.entry(identity).or_default();
        let edge = if add {
            *count += 1;
            *count == 1
        } else if *count > 0 {
            *count -= 1;
            *count == 0
        } else {
            false
        };
        if *count == 0 {
            peer.identities.remove(&identity);
        }
        if !edge {
            return;
        }
        let users: Vec<(u32, u32)> = peer.users.iter().map(|(r, n)| (*r, *n)).collect();
        for (rule, times) in users {
            self.rule_identity(rule, identity, add, times);
        }
    }

    /// `times` of rule `id`'s peers start (or stop) selecting `identity`.
    fn rule_identity(&mut self, id: u32, identity: u32, add: bool, times: u32) {
        let Some(rule) = self.rules.get_mut(&id) else {
            return;
        };
        let count = rule.identities.entry(identity).or_default();
        let before = *count;
        *count = if add {
            before + times
        } else {
            before.saturating_sub(times)
        };
        let after = *count;
        if after == 0 {
            rule.identities.remove(&identity);
        }
        if (before == 0) != (after == 0) {
            self.rule_contributions(id, identity, add);
        }
    }

    /// One more (or one fewer) peer names policy CIDR `net`.
    fn cidr_ref(&mut self, net: IpNetwork, add: bool) {
        let prefix = IpNetwork::new(net.network(), net.prefix()).unwrap_or(net);
        let identity = if add {
            let Some(identity) = self.cidr_identities.get(&net).copied() else {
                // set_policies allocates every CIDR of the set before it applies the set.
                debug_assert!(false, "policy CIDR {net} has no identity");
                tracing::error!(%net, "policy CIDR without an identity: ignored");
                return;
            };
            let state = self
                .cidrs
                .entry(net)
                .or_insert(CidrState { refs: 0, identity });
            state.refs += 1;
            if state.refs > 1 {
                return;
            }
            self.ipcache.set(prefix, net, identity);
            identity
        } else {
            let Some(state) = self.cidrs.get_mut(&net) else {
                return;
            };
            state.refs -= 1;
            if state.refs > 0 {
                return;
            }
            let identity = state.identity;
            self.cidrs.remove(&net);
            self.ipcache.unset(prefix, &net);
            identity
        };
        let blocks: Vec<usize> = self
            .peers
            .iter()
            .filter(|(_, p)| p.key.selects_cidr(&net))
            .map(|(id, _)| id)
            .collect();
        for p in blocks {
            self.peer_identity(p, identity, add);
        }
    }
}

/// A rule's numbered port clauses grouped by protocol, in first-appearance order; a rule without
/// any clause has one group, `ANY_PROTO`, with none.
fn ports_by_protocol(rule: &Rule) -> Vec<(u8, Vec<PortSpec>)> {
    if rule.all_ports() {
        return vec![(ANY_PROTO, Vec::new())];
    }
    let mut groups: Vec<(u8, Vec<PortSpec>)> = Vec::new();
    for spec in &rule.ports {
        match groups.iter_mut().find(|(p, _)| *p == spec.protocol) {
            Some((_, specs)) => specs.push(*spec),
            None => groups.push((spec.protocol, vec![*spec])),
        }
    }
    // A protocol named only by named ports has a group too (its ports resolve per pod).
    for named in &rule.named_ports {
        if !groups.iter().any(|(p, _)| *p == named.protocol) {
            groups.push((named.protocol, Vec::new()));
        }
    }
    groups
}
