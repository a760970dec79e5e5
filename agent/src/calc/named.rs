//! Named ports (`port: http` in a NetworkPolicy) resolve on the destination pod's named container
//! ports: for ingress, the selected local endpoint's own (exact: entries are per endpoint); for
//! egress, the peer's. Egress entries are per peer identity, so a name resolves to the union of
//! the ports it names on the pods of that identity (local endpoints and remote pods): pods with
//! the same namespace and labels that give one name different numbers are all reachable on each
//! of those numbers (Cilium has the same union). A pod without the name adds nothing: the clause
//! matches nothing for it (upstream semantics).
//!
//! Re-resolution is coarse: when a pod's named ports or a class's members change while some rule
//! has named ports, every group of those rules is recompiled at the next flush.

use std::collections::{BTreeMap, BTreeSet};

use maps_schema::policy::INGRESS;

use super::{Calculation, RuleState, fasthash::FastMap, groups::GroupKey};
use crate::calc::policy::model::{NamedPort, PortSpec};

/// Named ports by local endpoint id and by peer identity, for one flush.
#[derive(Default)]
pub(super) struct Resolved {
    by_endpoint: FastMap<u32, Vec<NamedPort>>,
    by_identity: FastMap<u32, BTreeSet<NamedPort>>,
}

impl Resolved {
    /// The port clauses `rule`'s named ports resolve to in `key`'s group.
    pub(super) fn ports(&self, rule: &RuleState, key: &GroupKey) -> Vec<PortSpec> {
        if rule.named.is_empty() {
            return Vec::new();
        }
        let mut out: Vec<PortSpec> = Vec::new();
        let mut add = |port: u16| {
            let spec = PortSpec {
                protocol: key.protocol,
                port: Some(port),
                end_port: None,
            };
            if !out.contains(&spec) {
                out.push(spec);
            }
        };
        for named in rule.named.iter().filter(|n| n.protocol == key.protocol) {
            if key.direction == INGRESS {
                if let Some(p) = self.by_endpoint.get(&key.endpoint).and_then(|ports| {
                    ports
                        .iter()
                        .find(|p| p.name == named.name && p.protocol == named.protocol)
                }) {
                    add(p.port);
                }
            } else {
                let mut ports: Vec<u16> = self
                    .by_identity
                    .get(&key.peer)
                    .into_iter()
                    .flatten()
                    .filter(|p| p.name == named.name && p.protocol == named.protocol)
                    .map(|p| p.port)
                    .collect();
                ports.sort_unstable();
                for p in ports {
                    add(p);
                }
            }
        }
        out
    }
}

/// The first port of each (name, protocol), as upstream resolves a name on one pod.
fn first_of_each(ports: &[NamedPort]) -> Vec<NamedPort> {
    let mut seen = BTreeMap::new();
    for p in ports {
        seen.entry((p.name.clone(), p.protocol))
            .or_insert_with(|| p.clone());
    }
    seen.into_values().collect()
}

impl Calculation {
    /// Sets the named container ports of local endpoint `key` (from its Pod object).
    pub fn set_endpoint_ports(&mut self, key: &str, ports: Vec<NamedPort>) {
        let old = if ports.is_empty() {
            self.endpoint_ports.remove(key)
        } else {
            self.endpoint_ports.insert(key.to_owned(), ports.clone())
        };
        if old.unwrap_or_default() != ports {
            self.named_inputs_changed();
        }
    }

    /// Named ports, a pod's or a class's members, changed: groups of rules with named ports
    /// are recompiled at the next flush.
    pub(super) fn named_inputs_changed(&mut self) {
        if !self.named_rules.is_empty() {
            self.groups.mark_rules(&self.named_rules);
        }
    }

    /// Named ports by endpoint id and by identity, as they are now.
    pub(super) fn resolve_named(&self) -> Resolved {
        let mut resolved = Resolved::default();
        for (key, member) in &self.members {
            let Some(ports) = self.endpoint_ports.get(key) else {
                continue;
            };
            let ports = first_of_each(ports);
            if let Some(class) = self.classes.get(member.class) {
                resolved
                    .by_identity
                    .entry(class.identity)
                    .or_default()
                    .extend(ports.iter().cloned());
            }
            resolved.by_endpoint.insert(member.id, ports);
        }
        for (pod, class) in self.remote_pods.values() {
            if let Some(class) = self.classes.get(*class) {
                resolved
                    .by_identity
                    .entry(class.identity)
                    .or_default()
                    .extend(first_of_each(&pod.named_ports));
            }
        }
        resolved
    }
}
