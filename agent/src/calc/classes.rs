//! Endpoints and their label classes: joining and leaving a class, creating a class (the
//! policies and selector-cache entries that select it), and a namespace's labels changing the
//! identities of its classes.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{Calculation, Class, Member, Source, groups::GroupKey};
use weir_api::Endpoint;

impl Calculation {
    /// An endpoint registered or replaced; `identity` is its label set's (already allocated).
    pub(super) fn apply_endpoint(&mut self, endpoint: &Endpoint, identity: u32) {
        let key = endpoint.key();
        if let Some(old) = self.members.get(&key) {
            let same_class = old.id == endpoint.id
                && self.classes.get(old.class).is_some_and(|c| {
                    c.namespace == endpoint.namespace && c.labels == endpoint.labels
                });
            if same_class && old.host_ifname == endpoint.host_ifname && old.ips == endpoint.ips {
                // Nothing the calculation uses changed (its entry stays, even if another
                // endpoint on its interface left in this batch).
                if self.gone_links.remove(&endpoint.host_ifname) {
                    self.dirty_endpoints.insert(key);
                }
                return;
            }
            if old.host_ifname != endpoint.host_ifname {
                self.gone_links.insert(old.host_ifname.clone());
            }
            if same_class {
                // Addresses or interface changed: only its own entries.
                let class = old.class;
                let identity = self.classes.get(class).map_or(identity, |c| c.identity);
                let source = Source::Endpoint(key.clone());
                for ip in &old.ips {
                    if !endpoint.ips.contains(ip) {
                        self.ident.unset(*ip, &source);
                    }
                }
                self.set_member(endpoint, class, identity);
                self.gone_links.remove(&endpoint.host_ifname);
                self.dirty_endpoints.insert(key);
                return;
            }
            self.leave(&key);
        }
        self.gone_links.remove(&endpoint.host_ifname);
        self.join(endpoint, identity);
    }

    fn join(&mut self, endpoint: &Endpoint, identity: u32) {
        let key = endpoint.key();
        let class_key = (endpoint.namespace.clone(), endpoint.labels.clone());
        let class = match self.class_index.get(&class_key) {
            Some(c) => *c,
            None => self.create_class(class_key, identity),
        };
        let Some(c) = self.classes.get_mut(class) else {
            return;
        };
        c.members.insert(endpoint.id, key.clone());
        let identity = c.identity;
        self.set_member(endpoint, class, identity);
        self.endpoint_contributions(class, endpoint.id, true);
        self.dirty_endpoints.insert(key);
    }

    /// Records the endpoint as a member of `class` and its addresses as holding `identity`.
    fn set_member(&mut self, endpoint: &Endpoint, class: usize, identity: u32) {
        let key = endpoint.key();
        let source = Source::Endpoint(key.clone());
        for ip in &endpoint.ips {
            self.ident.set(*ip, source.clone(), identity);
        }
        self.members.insert(
            key,
            Member {
                id: endpoint.id,
                host_ifname: endpoint.host_ifname.clone(),
                ips: endpoint.ips.clone(),
                class,
            },
        );
    }

    /// Takes an endpoint out (its entries, its addresses, its class if it was the last member);
    /// returns its host-side interface.
    pub(super) fn leave(&mut self, key: &str) -> Option<String> {
        let member = self.members.remove(key)?;
        let source = Source::Endpoint(key.to_owned());
        for ip in &member.ips {
            self.ident.unset(*ip, &source);
        }
        self.endpoint_contributions(member.class, member.id, false);
        self.dirty_endpoints.remove(key);
        if let Some(class) = self.classes.get_mut(member.class) {
            class.members.remove(&member.id);
            if class.members.is_empty() && class.remote.is_empty() {
                self.destroy_class(member.class);
            }
        }
        Some(member.host_ifname)
    }

    /// Adds (or withdraws) one endpoint's entries: every rule of every policy selecting its class,
    /// for every peer identity the rule has now.
    fn endpoint_contributions(&mut self, class: usize, endpoint: u32, add: bool) {
        let Some(c) = self.classes.get(class) else {
            return;
        };
        for policy in &c.subject_of {
            let Some(p) = self.policies.get(*policy) else {
                continue;
            };
            for rule_id in &p.rules {
                let Some(rule) = self.rules.get(rule_id) else {
                    continue;
                };
                for peer in rule.identities.keys() {
                    for (protocol, _) in &rule.ports {
                        let key = GroupKey {
                            endpoint,
                            direction: rule.direction,
                            peer: *peer,
                            protocol: *protocol,
                        };
                        self.groups.toggle(key, *rule_id, add);
                    }
                }
            }
        }
    }

    pub(super) fn create_class(
        &mut self,
        key: (String, BTreeMap<String, String>),
        identity: u32,
    ) -> usize {
        let (namespace, labels) = key.clone();
        let id = self.classes.insert(Class {
            namespace: namespace.clone(),
            labels,
            identity,
            members: BTreeMap::new(),
            remote: BTreeSet::new(),
            subject_of: BTreeSet::new(),
            peer_of: BTreeSet::new(),
        });
        self.class_index.insert(key, id);
        self.classes_by_namespace
            .entry(namespace.clone())
            .or_default()
            .insert(id);
        let Some(class) = self.classes.get(id) else {
            return id;
        };
        let subject_of: BTreeSet<usize> = self
            .policies_by_namespace
            .get(&namespace)
            .into_iter()
            .flatten()
            .copied()
            .filter(|p| {
                self.policies
                    .get(*p)
                    .is_some_and(|p| p.policy.pod_selector.matches(&class.labels))
            })
            .collect();
        let peer_of = self.matching_peers(class);
        for p in &subject_of {
            if let Some(policy) = self.policies.get_mut(*p) {
                policy.classes.insert(id);
            }
        }
        if let Some(class) = self.classes.get_mut(id) {
            class.subject_of = subject_of;
            class.peer_of.clone_from(&peer_of);
        }
        for p in peer_of {
            if let Some(peer) = self.peers.get_mut(p) {
                peer.classes.insert(id);
            }
            self.peer_identity(p, identity, true);
        }
        id
    }

    /// The selector-cache entries that select `class` now.
    fn matching_peers(&self, class: &Class) -> BTreeSet<usize> {
        let namespace_labels = self.namespace_labels(&class.namespace);
        self.peers
            .iter()
            .filter(|(_, peer)| {
                peer.key
                    .matches_class(&class.namespace, &class.labels, namespace_labels)
            })
            .map(|(id, _)| id)
            .collect()
    }

    pub(super) fn destroy_class(&mut self, id: usize) {
        let Some(class) = self.classes.remove(id) else {
            return;
        };
        self.class_index
            .remove(&(class.namespace.clone(), class.labels.clone()));
        if let Some(set) = self.classes_by_namespace.get_mut(&class.namespace) {
            set.remove(&id);
            if set.is_empty() {
                self.classes_by_namespace.remove(&class.namespace);
            }
        }
        for p in &class.subject_of {
            if let Some(policy) = self.policies.get_mut(*p) {
                policy.classes.remove(&id);
            }
        }
        for p in class.peer_of {
            if let Some(peer) = self.peers.get_mut(p) {
                peer.classes.remove(&id);
            }
            self.peer_identity(p, class.identity, false);
        }
    }

    /// Namespace `namespace` has new labels (already in `self.namespaces`): its classes take the
    /// identities allocated for them, and namespace selectors are matched again.
    pub(super) fn relabel_namespace(&mut self, namespace: &str, identities: &HashMap<usize, u32>) {
        let ids: Vec<usize> = self
            .classes_by_namespace
            .get(namespace)
            .into_iter()
            .flatten()
            .copied()
            .collect();
        for id in ids {
            let Some(class) = self.classes.get(id) else {
                continue;
            };
            let old_identity = class.identity;
            let new_identity = identities.get(&id).copied().unwrap_or(old_identity);
            let new_peers = self.matching_peers(class);
            let old_peers = class.peer_of.clone();
            let moved = new_identity != old_identity;
            for p in &old_peers {
                let kept = new_peers.contains(p);
                if !kept || moved {
                    self.peer_identity(*p, old_identity, false);
                }
                if !kept && let Some(peer) = self.peers.get_mut(*p) {
                    peer.classes.remove(&id);
                }
            }
            let Some(class) = self.classes.get_mut(id) else {
                continue;
            };
            class.identity = new_identity;
            class.peer_of.clone_from(&new_peers);
            let members: Vec<String> = class.members.values().cloned().collect();
            let remote: Vec<String> = class.remote.iter().cloned().collect();
            for p in &new_peers {
                if !old_peers.contains(p) || moved {
                    self.peer_identity(*p, new_identity, true);
                }
                if let Some(peer) = self.peers.get_mut(*p) {
                    peer.classes.insert(id);
                }
            }
            if moved {
                for key in remote {
                    if let Some((pod, _)) = self.remote_pods.get(&key) {
                        let source = Source::Remote(key.clone());
                        for ip in &pod.ips {
                            self.ident.set(*ip, source.clone(), new_identity);
                        }
                    }
                }
                for key in members {
                    if let Some(member) = self.members.get(&key) {
                        let source = Source::Endpoint(key.clone());
                        for ip in &member.ips {
                            self.ident.set(*ip, source.clone(), new_identity);
                        }
                    }
                    self.dirty_endpoints.insert(key);
                }
            }
        }
    }

    /// Every endpoint of `class` needs its entry rewritten (its flags may have changed).
    pub(super) fn mark_class_dirty(&mut self, class: usize) {
        if let Some(c) = self.classes.get(class) {
            self.dirty_endpoints.extend(c.members.values().cloned());
        }
    }
}
