//! Allocation blocks: a FIFO free list, per-ordinal attributes and sequence numbers.
//!
//! Every method works on the value it is given; callers mutate a copy and write it with compare-and-swap,
//! so a failed write never leaves a half-changed block behind.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    net::IpAddr,
};

use ipnetwork::IpNetwork;
use serde::{Deserialize, Serialize};

use super::reservation::{Reservation, is_reserved};
use crate::cidr;

/// Who holds an address.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AllocationAttr {
    /// The handle the address was allocated under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handle: Option<String>,
    /// Owner attributes (pod, namespace, node, …).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attrs: BTreeMap<String, String>,
    /// Set when the address was released and waits out its cooldown (unix seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released_at: Option<u64>,
}

/// A block of addresses, affine to at most one host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Block {
    /// The block's network.
    #[schemars(with = "String")]
    pub cidr: IpNetwork,
    /// `host:<name>` when a host owns the block.
    #[serde(default)]
    pub affinity: Option<String>,
    /// When the affinity was claimed (unix seconds).
    #[serde(default)]
    pub affinity_claim_time: u64,
    /// Per ordinal: the index of its attribute, or `None` when free.
    pub allocations: Vec<Option<u32>>,
    /// Free ordinals in the order they will be handed out (head first).
    pub unallocated: VecDeque<u32>,
    /// Attributes referenced from `allocations`.
    pub attributes: Vec<AllocationAttr>,
    /// Bumped on every write; only goes up.
    pub sequence_number: u64,
    /// Per allocated (or cooling) ordinal: the block sequence number when it was allocated or released.
    /// (Keys are decimal ordinals; the schema says string keys, as Kubernetes structural schemas need.)
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, u64>")]
    pub sequence_number_for_allocation: BTreeMap<u32, u64>,
    /// Soft-delete marker; readers skip deleted blocks.
    #[serde(default)]
    pub deleted: bool,
}

/// Why a block operation was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BlockError {
    /// The address is not in this block.
    #[error("address {ip} is not in block {block}")]
    NotInBlock {
        /// The address.
        ip: IpAddr,
        /// The block.
        block: IpNetwork,
    },
    /// The address is already allocated.
    #[error("address {ip} is already allocated: release it first, or pick another address")]
    AlreadyAllocated {
        /// The address.
        ip: IpAddr,
    },
    /// The address is reserved.
    #[error("address {ip} is reserved: remove the reservation, or pick another address")]
    Reserved {
        /// The address.
        ip: IpAddr,
    },
    /// A release carried a stale sequence number (the address was reallocated since).
    #[error(
        "address {ip} was reallocated since sequence number {expected} (now {actual}): read it again before releasing"
    )]
    BadSequenceNumber {
        /// The address.
        ip: IpAddr,
        /// What the caller expected.
        expected: u64,
        /// What the block holds.
        actual: u64,
    },
    /// A release named another handle.
    #[error(
        "address {ip} belongs to handle {actual:?}, not {expected:?}: release it under its own handle"
    )]
    BadHandle {
        /// The address.
        ip: IpAddr,
        /// The handle the caller named.
        expected: String,
        /// The handle holding the address.
        actual: Option<String>,
    },
}

/// What a release must match.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReleaseCheck {
    /// The ordinal's sequence number must equal this.
    pub sequence_number: Option<u64>,
    /// The address must belong to this handle.
    pub handle: Option<String>,
}

/// Result of a release on one block.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Released {
    /// Released addresses with the handle each held.
    pub released: Vec<(IpAddr, Option<String>)>,
    /// Addresses that were not allocated (reported, not an error).
    pub not_allocated: Vec<IpAddr>,
}

impl Block {
    /// A fresh block: every ordinal free, the network address first. The sequence number starts at `seq_seed`
    /// (a clock reading), so a deleted-and-recreated block never repeats old sequence numbers.
    pub fn new(cidr: IpNetwork, affinity: Option<String>, now: u64, seq_seed: u64) -> Self {
        let n = u32::try_from(cidr::size(&cidr)).unwrap_or(u32::MAX);
        Self {
            cidr: cidr::normalize(&cidr),
            affinity,
            affinity_claim_time: now,
            allocations: vec![None; n as usize],
            unallocated: (0..n).collect(),
            attributes: Vec::new(),
            sequence_number: seq_seed,
            sequence_number_for_allocation: BTreeMap::new(),
            deleted: false,
        }
    }

    /// The datastore name.
    pub fn key_name(&self) -> String {
        cidr::cidr_name(&self.cidr)
    }

    /// `host:<name>` for a host.
    pub fn host_affinity(host: &str) -> String {
        format!("host:{host}")
    }

    /// Whether `host` owns the block.
    pub fn is_affine_to(&self, host: &str) -> bool {
        self.affinity
            .as_deref()
            .and_then(|a| a.strip_prefix("host:"))
            == Some(host)
    }

    /// Ordinals count.
    pub fn len(&self) -> u32 {
        u32::try_from(self.allocations.len()).unwrap_or(u32::MAX)
    }

    /// Whether the block has no ordinals (never true for a valid block).
    pub fn is_empty_block(&self) -> bool {
        self.allocations.is_empty()
    }

    /// Whether no address is allocated or cooling down.
    pub fn is_empty(&self) -> bool {
        self.allocations.iter().all(Option::is_none)
    }

    /// Free addresses that are not reserved.
    pub fn free_count(&self, reservations: &[Reservation]) -> u32 {
        let free = self
            .unallocated
            .iter()
            .filter(|&&o| !is_reserved(reservations, self.ip(o)))
            .count();
        u32::try_from(free).unwrap_or(u32::MAX)
    }

    /// True when the block has nothing left to give: no free address (reserved ones aside) and
    /// none cooling down.
    pub fn exhausted(&self, reservations: &[Reservation]) -> bool {
        self.free_count(reservations) == 0
            && self.allocations.iter().flatten().count() as u32 == self.in_use()
    }

    /// Allocated (live, not cooling) addresses.
    pub fn in_use(&self) -> u32 {
        let n = self.live_ordinals().count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// The address at `ordinal`.
    pub fn ip(&self, ordinal: u32) -> IpAddr {
        cidr::ip_at(&self.cidr, ordinal)
    }

    /// Ordinals holding a live allocation (not cooling down).
    pub fn live_ordinals(&self) -> impl Iterator<Item = u32> + '_ {
        self.allocations.iter().enumerate().filter_map(|(o, a)| {
            let idx = (*a)? as usize;
            let attr = self.attributes.get(idx)?;
            attr.released_at.is_none().then_some(o as u32)
        })
    }

    /// The attribute of a live allocation at `ordinal`.
    pub fn attr_of(&self, ordinal: u32) -> Option<&AllocationAttr> {
        let idx = (*self.allocations.get(ordinal as usize)?)?;
        self.attributes
            .get(idx as usize)
            .filter(|a| a.released_at.is_none())
    }

    /// Records a write: bumps the sequence number. Call once on the copy about to be written.
    pub fn touch(&mut self) {
        self.sequence_number += 1;
    }

    fn attr_index(&mut self, attr: &AllocationAttr) -> u32 {
        if let Some(i) = self.attributes.iter().position(|a| a == attr) {
            return i as u32;
        }
        self.attributes.push(attr.clone());
        (self.attributes.len() - 1) as u32
    }

    /// Takes up to `n` free addresses from the head of the free list, skipping (and leaving in place) reserved ones.
    pub fn assign_from_head(
        &mut self,
        n: u32,
        attr: &AllocationAttr,
        reservations: &[Reservation],
    ) -> Vec<IpAddr> {
        let mut picked = Vec::new();
        let mut kept = VecDeque::with_capacity(self.unallocated.len());
        while let Some(o) = self.unallocated.pop_front() {
            if (picked.len() as u32) < n && !is_reserved(reservations, self.ip(o)) {
                picked.push(o);
            } else {
                kept.push_back(o);
            }
        }
        self.unallocated = kept;
        if picked.is_empty() {
            return Vec::new();
        }
        let idx = self.attr_index(attr);
        for &o in &picked {
            self.allocations[o as usize] = Some(idx);
            self.sequence_number_for_allocation
                .insert(o, self.sequence_number);
        }
        picked.into_iter().map(|o| self.ip(o)).collect()
    }

    /// Allocates the specific address `ip`.
    pub fn assign_ip(
        &mut self,
        ip: IpAddr,
        attr: &AllocationAttr,
        reservations: &[Reservation],
    ) -> Result<(), BlockError> {
        let o = cidr::ordinal(&self.cidr, ip).ok_or(BlockError::NotInBlock {
            ip,
            block: self.cidr,
        })?;
        if is_reserved(reservations, ip) {
            return Err(BlockError::Reserved { ip });
        }
        let Some(pos) = self.unallocated.iter().position(|&u| u == o) else {
            return Err(BlockError::AlreadyAllocated { ip });
        };
        self.unallocated.remove(pos);
        let idx = self.attr_index(attr);
        self.allocations[o as usize] = Some(idx);
        self.sequence_number_for_allocation
            .insert(o, self.sequence_number);
        Ok(())
    }

    /// Releases addresses, checking sequence numbers and handles. Any mismatch refuses the whole call.
    /// Addresses that are free or cooling are reported as not allocated.
    pub fn release(
        &mut self,
        ips: &[(IpAddr, ReleaseCheck)],
        now: u64,
        cooldown: u64,
    ) -> Result<Released, BlockError> {
        let mut out = Released::default();
        let mut seen = BTreeSet::new();
        let mut to_release = Vec::new();
        for (ip, check) in ips {
            if !seen.insert(*ip) {
                continue;
            }
            let o = cidr::ordinal(&self.cidr, *ip).ok_or(BlockError::NotInBlock {
                ip: *ip,
                block: self.cidr,
            })?;
            let Some(attr) = self.attr_of(o) else {
                out.not_allocated.push(*ip);
                continue;
            };
            if let Some(expected) = check.sequence_number {
                let actual = self
                    .sequence_number_for_allocation
                    .get(&o)
                    .copied()
                    .unwrap_or(0);
                if actual != expected {
                    return Err(BlockError::BadSequenceNumber {
                        ip: *ip,
                        expected,
                        actual,
                    });
                }
            }
            if let Some(h) = &check.handle
                && attr.handle.as_deref() != Some(super::handle::sanitize(h))
            {
                return Err(BlockError::BadHandle {
                    ip: *ip,
                    expected: h.clone(),
                    actual: attr.handle.clone(),
                });
            }
            to_release.push((o, attr.handle.clone()));
        }
        self.release_ordinals(&to_release, now);
        out.released = to_release
            .into_iter()
            .map(|(o, h)| (self.ip(o), h))
            .collect();
        self.garbage_collect(now, cooldown);
        Ok(out)
    }

    /// Releases every address held by `handle` (skipping ordinals whose sequence number differs when one is given).
    pub fn release_by_handle(
        &mut self,
        handle: &str,
        seq: Option<u64>,
        now: u64,
        cooldown: u64,
    ) -> Vec<IpAddr> {
        let handle = super::handle::sanitize(handle);
        let ords: Vec<(u32, Option<String>)> = self
            .live_ordinals()
            .filter(|&o| self.attr_of(o).and_then(|a| a.handle.as_deref()) == Some(handle))
            .filter(|o| seq.is_none_or(|s| self.sequence_number_for_allocation.get(o) == Some(&s)))
            .map(|o| (o, Some(handle.to_owned())))
            .collect();
        self.release_ordinals(&ords, now);
        let ips = ords.iter().map(|(o, _)| self.ip(*o)).collect();
        self.garbage_collect(now, cooldown);
        ips
    }

    fn release_ordinals(&mut self, ords: &[(u32, Option<String>)], now: u64) {
        if ords.is_empty() {
            return;
        }
        let cooling = AllocationAttr {
            handle: None,
            attrs: BTreeMap::new(),
            released_at: Some(now),
        };
        let idx = self.attr_index(&cooling);
        for (o, _) in ords {
            self.allocations[*o as usize] = Some(idx);
            self.sequence_number_for_allocation
                .insert(*o, self.sequence_number);
        }
    }

    /// Returns addresses whose cooldown is over to the tail of the free list and drops unreferenced attributes.
    /// Returns whether anything changed.
    pub fn garbage_collect(&mut self, now: u64, cooldown: u64) -> bool {
        let mut changed = false;
        for o in 0..self.allocations.len() {
            let Some(idx) = self.allocations[o] else {
                continue;
            };
            let done = self
                .attributes
                .get(idx as usize)
                .and_then(|a| a.released_at)
                .is_some_and(|t| now.saturating_sub(t) >= cooldown);
            if done {
                self.allocations[o] = None;
                self.unallocated.push_back(o as u32);
                self.sequence_number_for_allocation.remove(&(o as u32));
                changed = true;
            }
        }
        changed | self.compact_attributes()
    }

    fn compact_attributes(&mut self) -> bool {
        let used: BTreeSet<u32> = self.allocations.iter().flatten().copied().collect();
        if used.len() == self.attributes.len() {
            return false;
        }
        let mut remap = BTreeMap::new();
        let mut attrs = Vec::with_capacity(used.len());
        for old in used {
            if let Some(a) = self.attributes.get(old as usize) {
                remap.insert(old, attrs.len() as u32);
                attrs.push(a.clone());
            }
        }
        for a in self.allocations.iter_mut().flatten() {
            *a = remap.get(a).copied().unwrap_or(*a);
        }
        self.attributes = attrs;
        true
    }

    /// Live addresses grouped by handle.
    pub fn handle_counts(&self) -> BTreeMap<String, u32> {
        let mut m = BTreeMap::new();
        for o in self.live_ordinals() {
            if let Some(h) = self.attr_of(o).and_then(|a| a.handle.clone()) {
                *m.entry(h).or_default() += 1;
            }
        }
        m
    }

    /// Structural problems (empty when the block is sound).
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        let name = self.key_name();
        let size = cidr::size(&self.cidr);
        if u128::try_from(self.allocations.len()).ok() != Some(size) {
            p.push(format!(
                "block {name}: {} ordinals, but its CIDR holds {size} addresses",
                self.allocations.len()
            ));
        }
        let mut seen = BTreeSet::new();
        for &o in &self.unallocated {
            if !seen.insert(o) {
                p.push(format!(
                    "block {name}: ordinal {o} is twice in the free list"
                ));
            }
            match self.allocations.get(o as usize) {
                None => p.push(format!("block {name}: free ordinal {o} is out of range")),
                Some(Some(_)) => p.push(format!(
                    "block {name}: ordinal {o} is both free and allocated"
                )),
                Some(None) => {}
            }
        }
        let allocated = self.allocations.iter().filter(|a| a.is_some()).count();
        if allocated + seen.len() != self.allocations.len() {
            p.push(format!(
                "block {name}: {allocated} allocated + {} free != {} ordinals",
                seen.len(),
                self.allocations.len()
            ));
        }
        for (o, a) in self.allocations.iter().enumerate() {
            if let Some(i) = a
                && *i as usize >= self.attributes.len()
            {
                p.push(format!(
                    "block {name}: ordinal {o} points at missing attribute {i}"
                ));
            }
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block() -> Block {
        Block::new("100.64.0.0/24".parse().expect("net"), None, 0, 0)
    }

    fn attr(h: &str) -> AllocationAttr {
        AllocationAttr {
            handle: Some(h.into()),
            ..AllocationAttr::default()
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    fn res(cidrs: &[&str]) -> Vec<Reservation> {
        vec![Reservation {
            name: "r".into(),
            reserved_cidrs: cidrs.iter().map(|c| c.parse().expect("c")).collect(),
        }]
    }

    #[test]
    fn fresh_block_is_empty_and_starts_at_network_address() {
        let mut b = block();
        assert!(b.is_empty());
        assert_eq!(
            b.assign_from_head(1, &attr("h"), &[]),
            vec![ip("100.64.0.0")]
        );
        assert!(!b.is_empty());
        assert!(b.problems().is_empty());
    }

    #[test]
    fn free_and_reserved_counts() {
        let mut b = block();
        for o in [10, 20, 210, 220] {
            b.assign_ip(b.ip(o), &attr("h"), &[]).expect("assign");
        }
        assert_eq!(b.free_count(&[]), 252);
        assert_eq!(b.free_count(&res(&["100.64.0.128/25"])), 126);
        assert_eq!(b.free_count(&res(&["100.64.0.0/24"])), 0);
        assert_eq!(b.in_use(), 4);
    }

    #[test]
    fn release_checks_handle_and_sequence_number() {
        let mut b = block();
        b.assign_ip(ip("100.64.0.13"), &attr("unlucky"), &[])
            .expect("assign");
        let seq = b.sequence_number_for_allocation[&13];
        let wrong_handle = ReleaseCheck {
            handle: Some("other".into()),
            ..ReleaseCheck::default()
        };
        assert!(matches!(
            b.release(&[(ip("100.64.0.13"), wrong_handle)], 0, 0),
            Err(BlockError::BadHandle { .. })
        ));
        let wrong_seq = ReleaseCheck {
            sequence_number: Some(seq + 999),
            ..ReleaseCheck::default()
        };
        assert!(matches!(
            b.release(&[(ip("100.64.0.13"), wrong_seq)], 0, 0),
            Err(BlockError::BadSequenceNumber { .. })
        ));
        assert_eq!(b.handle_counts().get("unlucky"), Some(&1));
        let ok = ReleaseCheck {
            sequence_number: Some(seq),
            handle: Some("unlucky".into()),
        };
        let r = b
            .release(
                &[(ip("100.64.0.13"), ok.clone()), (ip("100.64.0.13"), ok)],
                0,
                0,
            )
            .expect("release");
        assert_eq!(r.released.len(), 1);
        assert_eq!(
            b.unallocated.back(),
            Some(&13),
            "released ordinals go to the tail"
        );
        let again = b
            .release(&[(ip("100.64.0.13"), ReleaseCheck::default())], 0, 0)
            .expect("idempotent");
        assert_eq!(again.not_allocated, vec![ip("100.64.0.13")]);
        assert!(b.problems().is_empty());
    }

    #[test]
    fn release_by_handle_skips_other_sequence_numbers() {
        let mut b = block();
        for o in [15, 16, 18] {
            b.assign_ip(b.ip(o), &attr("teens"), &[]).expect("assign");
        }
        b.sequence_number = 999;
        b.assign_ip(b.ip(17), &attr("teens"), &[]).expect("assign");
        let released = b.release_by_handle("teens", Some(0), 0, 0);
        assert_eq!(released.len(), 3);
        assert!(b.attr_of(17).is_some());
        let tail: Vec<u32> = b.unallocated.iter().rev().take(3).copied().collect();
        assert_eq!(
            tail.into_iter().collect::<BTreeSet<_>>(),
            BTreeSet::from([15, 16, 18])
        );
    }

    #[test]
    fn cooldown_holds_addresses_until_it_expires() {
        let mut b = block();
        let ips = b.assign_from_head(6, &attr("h"), &[]);
        b.release(
            &[
                (ips[0], ReleaseCheck::default()),
                (ips[1], ReleaseCheck::default()),
            ],
            100,
            30,
        )
        .expect("rel");
        assert_eq!(b.free_count(&[]), 250, "cooling addresses are not free");
        let again = b
            .release(&[(ips[0], ReleaseCheck::default())], 100, 30)
            .expect("rel");
        assert_eq!(
            again.not_allocated,
            vec![ips[0]],
            "a cooling address is reported not allocated"
        );
        assert!(!b.garbage_collect(120, 30));
        assert!(b.garbage_collect(130, 30));
        assert_eq!(b.free_count(&[]), 252);
        assert_eq!(b.in_use(), 4);
        assert!(b.problems().is_empty());
    }

    #[test]
    fn fifo_reuses_the_longest_free_address() {
        let mut b = Block::new("10.0.0.0/30".parse().expect("net"), None, 0, 0);
        let mut got = Vec::new();
        for _ in 0..5 {
            let ip = b.assign_from_head(1, &attr("h"), &[])[0];
            got.push(ip);
            b.release(&[(ip, ReleaseCheck::default())], 0, 0)
                .expect("release");
        }
        assert_eq!(got[..4].iter().collect::<BTreeSet<_>>().len(), 4);
        assert_eq!(got[4], got[0]);
    }
}
