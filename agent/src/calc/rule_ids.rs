//! Rule ids: the number a policy entry carries to say which rule admitted it (`weir policy trace`
//! maps it back to `namespace/name direction[index]`).
//!
//! An id is derived from the rule's name (FNV-1a of `namespace/name`, direction and index, folded
//! into `1..RULE_HITS_MAX`, so every id has its own slot in the per-rule hit counters), probing to
//! the next id while that one is taken; a removed rule's id is free for
//! reuse at once. So a rule keeps its id while other policies come and go (their edits rewrite
//! only their own entries), and the id does not depend on the order policies arrived in: a
//! restart, which adds them in sorted order, finds the same ids in the kernel and writes nothing.
//! Only rules whose names hash to the same id and that arrived out of sorted order can swap ids
//! across a restart, which rewrites just their entries. With every id taken (16,383 rules) further
//! rules share id 0: their entries still work, but traces and hit counters cannot name them.

use std::collections::BTreeMap;

use crate::calc::policy::compile::RuleRef;

/// Ids are 1..=`SPACE` (0 is never a rule's own id): one slot each in `rule_hits_v1`.
const SPACE: u32 = maps_schema::maps::RULE_HITS_MAX - 1;

/// Live rule ids and where each came from, in id order (the snapshot compares them with the
/// ones it published, in order, to share an unchanged set).
#[derive(Default)]
pub(crate) struct RuleIds {
    refs: BTreeMap<u32, RuleRef>,
}

impl RuleIds {
    /// An id for `rule` (which must not hold one already).
    pub(crate) fn allocate(&mut self, rule: RuleRef) -> u32 {
        if self.refs.len() >= SPACE as usize {
            tracing::warn!(policy = %rule.policy, index = rule.index, "every rule id is taken; this rule shares id 0 (traces and hit counters cannot name it)");
            return 0;
        }
        let mut id = home(&rule);
        while self.refs.contains_key(&id) {
            id = id % SPACE + 1;
        }
        self.refs.insert(id, rule);
        id
    }

    /// Frees `id` for reuse.
    pub(super) fn free(&mut self, id: u32) {
        self.refs.remove(&id);
    }

    /// Where `id` came from.
    pub(super) fn get(&self, id: u32) -> Option<&RuleRef> {
        self.refs.get(&id)
    }

    /// Every live id, in id order.
    pub(super) fn all(&self) -> Vec<(u32, &RuleRef)> {
        self.refs.iter().map(|(id, r)| (*id, r)).collect()
    }
}

fn home(rule: &RuleRef) -> u32 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0100_0000_01b3;
    let index = u64::try_from(rule.index).unwrap_or(u64::MAX);
    let hash = rule
        .policy
        .bytes()
        .chain([0])
        .chain(rule.direction.bytes())
        .chain([0])
        .chain(index.to_le_bytes())
        .fold(OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME));
    // SPACE < 2³², so the remainder fits.
    u32::try_from(hash % u64::from(SPACE)).unwrap_or(0) + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(policy: &str, index: usize) -> RuleRef {
        RuleRef {
            policy: policy.into(),
            direction: "ingress",
            index,
        }
    }

    #[test]
    fn ids_follow_the_name_not_the_order_and_collisions_probe() {
        let mut a = RuleIds::default();
        let mut b = RuleIds::default();
        let ids_a: Vec<u32> = (0..50).map(|i| a.allocate(rule("ns/p", i))).collect();
        let mut ids_b: Vec<u32> = (0..50).rev().map(|i| b.allocate(rule("ns/p", i))).collect();
        ids_b.reverse();
        assert_eq!(ids_a, ids_b, "the same rules get the same ids in any order");
        assert!(ids_a.iter().all(|id| (1..=SPACE).contains(id)));

        // A collision: the second rule with the same home probes to the next free id.
        let mut ids = RuleIds::default();
        let home_id = home(&rule("ns/p", 0));
        ids.refs.insert(home_id, rule("other/q", 7));
        let probed = ids.allocate(rule("ns/p", 0));
        assert_eq!(probed, home_id % SPACE + 1);
        assert_eq!(ids.get(probed), Some(&rule("ns/p", 0)));
        // Freed ids are reused: with its home free again, the rule gets its home id back.
        ids.free(home_id);
        ids.free(probed);
        assert_eq!(ids.get(home_id), None);
        assert_eq!(ids.allocate(rule("ns/p", 0)), home_id);
    }
}
