//! Policy entries by group. A group is (endpoint, direction, peer identity, protocol): every
//! policy-map key of the group (the protocol's exact ports, its any-port entry with the port
//! ranges, or the any-protocol entry) depends only on which rules contribute to it and in which
//! order they compile. A change marks the groups it touches; the flush recompiles each marked
//! group from its rules, in the full compile's order, and writes only the keys whose value
//! changed (and removes those no longer produced).

use maps_schema::{PolicyKey, PolicyValue};

use maps_schema::policy::ANY_PROTO;

use super::{RuleState, fasthash::FastMap, named::Resolved};
use crate::{calc::policy::compile::add_ports, dataplane::map_driver::MapDriver};

/// One group's identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct GroupKey {
    pub(super) endpoint: u32,
    pub(super) direction: u8,
    pub(super) peer: u32,
    /// The protocol of the rule's port clauses, or `ANY_PROTO` for a rule without ports.
    pub(super) protocol: u8,
}

/// One group's contributing rules and the ports of the keys it wrote (the rest of each key is the
/// group's own), laid out for the common case of one rule writing one key: a converge of 10,000
/// endpoints × 10 peers holds 100,000 groups, so a group is 24 bytes with nothing on the heap
/// unless it has a second rule or a second key.
#[derive(Default)]
struct Group {
    /// The first contributing rule (the rest, unordered, in `spill`).
    rule: Option<u32>,
    /// The port of the first key written (the rest in `spill`).
    port: Option<u16>,
    /// Queued in `Groups::dirty`.
    dirty: bool,
    spill: Option<Box<Spill>>,
}

/// A group's rules and ports past the first.
#[derive(Default)]
struct Spill {
    rules: Vec<u32>,
    ports: Vec<u16>,
}

impl Group {
    fn rules(&self) -> impl Iterator<Item = u32> + '_ {
        self.rule
            .into_iter()
            .chain(self.spill.iter().flat_map(|s| s.rules.iter().copied()))
    }

    fn has_rules(&self) -> bool {
        self.rule.is_some()
    }

    fn ports(&self) -> impl Iterator<Item = u16> + '_ {
        self.port
            .into_iter()
            .chain(self.spill.iter().flat_map(|s| s.ports.iter().copied()))
    }

    /// Adds `rule`; false when it already contributes.
    fn add_rule(&mut self, rule: u32) -> bool {
        if self.rules().any(|r| r == rule) {
            return false;
        }
        match self.rule {
            None => self.rule = Some(rule),
            Some(_) => self.spill.get_or_insert_default().rules.push(rule),
        }
        true
    }

    /// Removes `rule`; false when it did not contribute.
    fn remove_rule(&mut self, rule: u32) -> bool {
        if self.rule == Some(rule) {
            self.rule = self.spill.as_mut().and_then(|s| s.rules.pop());
        } else if let Some(spill) = &mut self.spill
            && let Some(at) = spill.rules.iter().position(|r| *r == rule)
        {
            spill.rules.swap_remove(at);
        } else {
            return false;
        }
        self.shrink();
        true
    }

    /// Replaces the ports written.
    fn set_ports(&mut self, ports: impl Iterator<Item = u16>) {
        self.port = None;
        if let Some(spill) = &mut self.spill {
            spill.ports.clear();
        }
        for port in ports {
            match self.port {
                None => self.port = Some(port),
                Some(_) => self.spill.get_or_insert_default().ports.push(port),
            }
        }
        self.shrink();
    }

    fn shrink(&mut self) {
        if self
            .spill
            .as_ref()
            .is_some_and(|s| s.rules.is_empty() && s.ports.is_empty())
        {
            self.spill = None;
        }
    }
}

/// Every group with a contribution, and the groups changed since the last flush (each once:
/// `Group::dirty` says it is queued).
#[derive(Default)]
pub(super) struct Groups {
    groups: FastMap<GroupKey, Group>,
    dirty: Vec<GroupKey>,
}

impl Groups {
    /// Rule `rule` contributes to `key` (`add`) or no longer does.
    pub(super) fn toggle(&mut self, key: GroupKey, rule: u32, add: bool) {
        let group = if add {
            let group = self.groups.entry(key).or_default();
            if !group.add_rule(rule) {
                return;
            }
            group
        } else {
            let Some(group) = self.groups.get_mut(&key) else {
                return;
            };
            if !group.remove_rule(rule) {
                return;
            }
            group
        };
        if !std::mem::replace(&mut group.dirty, true) {
            self.dirty.push(key);
        }
    }

    /// True when a flush has work.
    pub(super) fn is_dirty(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// Marks every group a rule of `rules` contributes to (their named ports may resolve anew).
    pub(super) fn mark_rules(&mut self, rules: &std::collections::BTreeSet<u32>) {
        for (key, group) in &mut self.groups {
            if group.rules().any(|r| rules.contains(&r))
                && !std::mem::replace(&mut group.dirty, true)
            {
                self.dirty.push(*key);
            }
        }
    }

    /// Recompiles the changed groups into the policy map's desired state (named ports resolved
    /// by `resolved`).
    pub(super) fn flush(
        &mut self,
        rules: &FastMap<u32, RuleState>,
        resolved: &Resolved,
        policy: &mut MapDriver<PolicyKey, PolicyValue>,
    ) {
        let mut out = FastMap::default();
        let mut contributing: Vec<(u32, &RuleState)> = Vec::new();
        for key in std::mem::take(&mut self.dirty) {
            let Some(group) = self.groups.get_mut(&key) else {
                continue;
            };
            group.dirty = false;
            contributing.clear();
            contributing.extend(
                group
                    .rules()
                    .filter_map(|id| rules.get(&id).map(|r| (id, r))),
            );
            if contributing.len() > 1 {
                contributing.sort_by(|a, b| a.1.order.cmp(&b.1.order));
            }
            out.clear();
            for (id, rule) in &contributing {
                let named = resolved.ports(rule, &key);
                let specs: std::borrow::Cow<'_, [crate::calc::policy::model::PortSpec]> =
                    if named.is_empty() {
                        rule.ports_of(key.protocol).into()
                    } else {
                        let mut all = rule.ports_of(key.protocol).to_vec();
                        all.extend(named);
                        all.into()
                    };
                if specs.is_empty() && key.protocol != ANY_PROTO {
                    // Named ports only, none resolved here: the rule matches nothing.
                    continue;
                }
                add_ports(&mut out, key.endpoint, key.direction, key.peer, &specs, *id);
            }
            let policy_key = |port| PolicyKey {
                endpoint_id: key.endpoint,
                peer_identity: key.peer,
                port,
                protocol: key.protocol,
                direction: key.direction,
            };
            for port in group.ports() {
                let old = policy_key(port);
                if !out.contains_key(&old) {
                    policy.remove(&old);
                }
            }
            group.set_ports(out.keys().map(|k| k.port));
            for (k, v) in out.drain() {
                policy.set(k, v);
            }
            if !group.has_rules() {
                self.groups.remove(&key);
            }
        }
    }

    /// Number of groups (for tests and benchmarks).
    pub(super) fn len(&self) -> usize {
        self.groups.len()
    }
}
