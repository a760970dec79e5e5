//! Policy entries by group. A group is (endpoint, direction, peer identity, protocol): every
//! policy-map key of the group (the protocol's exact ports, its any-port entry with the port
//! ranges, or the any-protocol entry) depends only on which rules contribute to it and in which
//! order they compile. A change marks the groups it touches; the flush recompiles each marked
//! group from its rules, in the full compile's order, and writes only the keys whose value
//! changed (and removes those no longer produced).

use maps_schema::{PolicyKey, PolicyValue};

use maps_schema::policy::ANY_PROTO;

use super::{
    RuleState,
    fasthash::{FastMap, FastSet},
    named::Resolved,
};
use crate::{dataplane::map_driver::MapDriver, policy::compile::add_ports};

/// One group's identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct GroupKey {
    pub(super) endpoint: u32,
    pub(super) direction: u8,
    pub(super) peer: u32,
    /// The protocol of the rule's port clauses, or `ANY_PROTO` for a rule without ports.
    pub(super) protocol: u8,
}

#[derive(Default)]
struct Group {
    /// Contributing rules (ids).
    rules: Vec<u32>,
    /// The keys the group wrote.
    keys: Vec<PolicyKey>,
}

/// Every group with a contribution, and the groups changed since the last flush.
#[derive(Default)]
pub(super) struct Groups {
    groups: FastMap<GroupKey, Group>,
    dirty: FastSet<GroupKey>,
}

impl Groups {
    /// Rule `rule` contributes to `key` (`add`) or no longer does.
    pub(super) fn toggle(&mut self, key: GroupKey, rule: u32, add: bool) {
        if add {
            let group = self.groups.entry(key).or_default();
            if !group.rules.contains(&rule) {
                group.rules.push(rule);
                self.dirty.insert(key);
            }
        } else if let Some(group) = self.groups.get_mut(&key)
            && let Some(at) = group.rules.iter().position(|r| *r == rule)
        {
            group.rules.swap_remove(at);
            self.dirty.insert(key);
        }
    }

    /// True when a flush has work.
    pub(super) fn is_dirty(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// Marks every group a rule of `rules` contributes to (their named ports may resolve anew).
    pub(super) fn mark_rules(&mut self, rules: &std::collections::BTreeSet<u32>) {
        for (key, group) in &self.groups {
            if group.rules.iter().any(|r| rules.contains(r)) {
                self.dirty.insert(*key);
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
        for key in std::mem::take(&mut self.dirty) {
            let Some(group) = self.groups.get_mut(&key) else {
                continue;
            };
            let mut contributing: Vec<(u32, &RuleState)> = group
                .rules
                .iter()
                .filter_map(|id| rules.get(id).map(|r| (*id, r)))
                .collect();
            contributing.sort_by(|a, b| a.1.order.cmp(&b.1.order));
            out.clear();
            for (id, rule) in contributing {
                let named = resolved.ports(rule, &key);
                let specs: std::borrow::Cow<'_, [crate::policy::model::PortSpec]> =
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
                add_ports(&mut out, key.endpoint, key.direction, key.peer, &specs, id);
            }
            for old in &group.keys {
                if !out.contains_key(old) {
                    policy.remove(old);
                }
            }
            group.keys.clear();
            for (k, v) in out.drain() {
                group.keys.push(k);
                policy.set(k, v);
            }
            if group.rules.is_empty() {
                self.groups.remove(&key);
            }
        }
    }

    /// Number of groups (for tests and benchmarks).
    pub(super) fn len(&self) -> usize {
        self.groups.len()
    }
}
