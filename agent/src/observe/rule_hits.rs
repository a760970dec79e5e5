//! Per-rule hit counters (`rule_hits_v1`) as operators read them: every rule id with hits, summed
//! over CPUs, named back to its policy and rule index. Which packets count is
//! `maps_schema::rules`: the packets a rule *decided* (a new flow's first packet on the isolated
//! side, stateless packets); packets conntrack passes as established are not counted.

use maps_schema::maps::RULE_HITS_MAX;

use std::collections::BTreeMap;

use crate::{
    calc::policy::compile::RuleRef,
    kernel::{CountersIo, InspectIo, KernelError},
};

/// One rule's hits (the API contract's).
pub use weir_api::RuleHitsView;

/// The rule ids in force (ids are spread over `1..RULE_HITS_MAX`).
pub fn rule_ids(rules: &BTreeMap<u32, RuleRef>) -> Vec<u32> {
    rules.keys().copied().collect()
}

/// Slot 0 (ids beyond the array, and rules that share id 0) and the slots of `ids` of the rule
/// hits array `io`: packets and bytes summed over CPUs.
pub fn read_raw(io: &dyn CountersIo, ids: &[u32]) -> Result<Vec<(u32, u64, u64)>, KernelError> {
    let slots = std::iter::once(0).chain(
        ids.iter()
            .copied()
            .filter(|id| (1..RULE_HITS_MAX).contains(id)),
    );
    slots
        .map(|id| io.slot(id).map(|(packets, bytes)| (id, packets, bytes)))
        .collect()
}

/// The rule hits of the pinned array read through `kernel`, named by `rules`.
pub fn read(
    kernel: &dyn InspectIo,
    rules: &BTreeMap<u32, RuleRef>,
) -> Result<Vec<RuleHitsView>, KernelError> {
    let io = kernel.counter_array(maps_schema::maps::RULE_HITS)?;
    Ok(views(rules, &read_raw(&*io, &rule_ids(rules))?))
}

/// Every rule the node knows (with its hits, zero included) and every other slot with hits.
pub fn views(rules: &BTreeMap<u32, RuleRef>, raw: &[(u32, u64, u64)]) -> Vec<RuleHitsView> {
    let mut out = Vec::new();
    for &(rule_id, packets, bytes) in raw {
        match rules.get(&rule_id) {
            Some(r) => out.push(RuleHitsView {
                rule_id,
                policy: r.policy.clone(),
                direction: r.direction.to_owned(),
                index: r.index,
                packets,
                bytes,
            }),
            None if packets > 0 => out.push(RuleHitsView {
                rule_id,
                policy: String::new(),
                direction: String::new(),
                index: 0,
                packets,
                bytes,
            }),
            None => {}
        }
    }
    out
}
