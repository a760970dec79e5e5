//! Per-rule hit counters: packets and bytes per policy rule id, per CPU.
//!
//! **What counts**: a packet is counted under a rule when the programs looked the policy map up for
//! it and the entry found (allow or deny) carries that rule id — the first packet of each new flow
//! on the isolated side, a reply-direction packet judged statelessly, and every packet of a
//! stateless protocol. Packets conntrack passes as established or related (`pass-established`,
//! `pass-related`) never reach the policy lookup and are not counted, and neither are packets
//! denied because no entry matched (`policy-denied` with no rule) nor the node's own traffic into
//! a pod (the host exception).

use crate::CounterValue;

/// Index into the rule hits array: the rule id, or 0 for every id beyond the array.
pub type RuleHitKey = u32;

/// The slot of `rule_id` in [`crate::maps::RULE_HITS`] (0: ids the array has no room for).
#[inline(always)]
#[must_use]
pub const fn rule_slot(rule_id: u32) -> RuleHitKey {
    if rule_id < crate::maps::RULE_HITS_MAX {
        rule_id
    } else {
        0
    }
}

/// One rule's hits on one CPU (the verdict counters' value type).
pub type RuleHits = CounterValue;
