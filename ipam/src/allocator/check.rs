//! Consistency and leak check over the whole datastore.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::Ipam;
use super::{decode, encode};
use crate::{
    IpamError, cidr,
    model::{AffinityState, Block, BlockAffinity, Handle},
    store::{Key, Kind, Store, Write},
};

/// What `check` found. `problems` are broken invariants; `leaks` are addresses or blocks nobody accounts for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckReport {
    /// Blocks read.
    pub blocks: usize,
    /// Live allocations counted.
    pub allocations: usize,
    /// Handles read.
    pub handles: usize,
    /// Affinities read.
    pub affinities: usize,
    /// Broken invariants (must be empty).
    pub problems: Vec<String>,
    /// Leaked or dangling records (harmless to addressing, worth cleaning up).
    pub leaks: Vec<String>,
    /// (handle, block) pairs whose handle count differs from the block's.
    #[serde(skip)]
    pub(crate) mismatched_handles: Vec<(String, String)>,
}

impl CheckReport {
    /// Whether no invariant is broken.
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

impl<S: Store + Clone> Ipam<S> {
    /// Checks every invariant: no address with two live owners, at most one confirmed affinity per block and
    /// it matches the block, handle counts match the ordinals holding them, free lists have no duplicates and
    /// are disjoint from allocations.
    ///
    /// The reads are not one snapshot: while other writers run, a block and its handle may be read on either
    /// side of a write. A broken invariant persists, so a report with problems is taken again (three times at
    /// most) and the first clean one is returned.
    pub async fn check(&self) -> Result<CheckReport, IpamError> {
        self.check_with_nodes(None).await
    }

    /// [`Self::check`], with `nodes` the cluster's live nodes as another source lists them (the Kubernetes
    /// Node objects, where node records are Nodes rather than records in the datastore): a block whose node
    /// has neither a node record nor a name in `nodes` is reported as a decommissioned node's.
    pub async fn check_with_nodes(
        &self,
        nodes: Option<&BTreeSet<String>>,
    ) -> Result<CheckReport, IpamError> {
        let mut report = self.check_once(nodes).await?;
        for _ in 0..2 {
            if report.ok() {
                break;
            }
            report = self.check_once(nodes).await?;
        }
        Ok(report)
    }

    /// Makes every handle's per-block counts equal to what the blocks hold (the blocks are the truth for which
    /// address is whose) and returns the handles it rewrote. This is what a crash between the two writes of an
    /// allocation on Kubernetes (block, then handle) leaves behind; other stores never need it. Only handles that
    /// [`check`](Self::check) still reports after its re-reads are touched, and each is rewritten conditional on
    /// the block it was counted from being unchanged.
    pub async fn repair_handles(&self) -> Result<Vec<String>, IpamError> {
        let report = self.check().await?;
        let mismatched: BTreeSet<(String, String)> =
            report.mismatched_handles.into_iter().collect();
        let mut fixed = Vec::new();
        for (handle, block) in mismatched {
            let bkey = Key::new(Kind::Block, block.clone());
            let hkey = Key::new(Kind::Handle, handle.clone());
            let (bk, hk) = (bkey.clone(), hkey.clone());
            let (h, b) = (handle.clone(), block.clone());
            let changed = self
                .store
                .read_modify_write(vec![bkey, hkey], move |cur| {
                    let keep = vec![Write::Keep, Write::Keep];
                    let held = match cur[0].as_deref().map(|v| decode::<Block>(&bk, v)) {
                        Some(Ok(blk)) if !blk.deleted => {
                            blk.handle_counts().get(&h).copied().unwrap_or(0)
                        }
                        Some(Err(_)) => return (keep, false),
                        _ => 0,
                    };
                    let mut handle = match cur[1].as_deref().map(|v| decode::<Handle>(&hk, v)) {
                        Some(Ok(x)) => x,
                        Some(Err(_)) => return (keep, false),
                        None => Handle {
                            id: h.clone(),
                            ..Handle::default()
                        },
                    };
                    if handle.blocks.get(&b).copied().unwrap_or(0) == held && !handle.deleted {
                        return (keep, false);
                    }
                    handle.deleted = false;
                    handle.blocks.remove(&b);
                    handle.add(&b, held);
                    let w = if handle.total() == 0 {
                        if cur[1].is_some() {
                            Write::Delete
                        } else {
                            Write::Keep
                        }
                    } else {
                        Write::Put(encode(&handle))
                    };
                    (vec![Write::Keep, w], true)
                })
                .await?;
            if changed {
                fixed.push(handle);
            }
        }
        fixed.dedup();
        Ok(fixed)
    }

    async fn check_once(&self, nodes: Option<&BTreeSet<String>>) -> Result<CheckReport, IpamError> {
        let blocks = self.blocks().await?;
        let handles: Vec<Handle> = self
            .list_objs::<Handle>(Kind::Handle, "")
            .await?
            .into_iter()
            .map(|(h, _)| h)
            .collect();
        let affs: Vec<BlockAffinity> = self
            .list_objs::<BlockAffinity>(Kind::Affinity, "")
            .await?
            .into_iter()
            .map(|(a, _)| a)
            .filter(|a| !a.deleted)
            .collect();
        let pools = self.pools().await?;
        let mut r = CheckReport {
            blocks: blocks.len(),
            handles: handles.len(),
            affinities: affs.len(),
            ..CheckReport::default()
        };

        let mut owners: BTreeMap<std::net::IpAddr, usize> = BTreeMap::new();
        let mut counted: BTreeMap<(String, String), u32> = BTreeMap::new();
        for b in &blocks {
            r.problems.extend(b.problems());
            for o in b.live_ordinals() {
                r.allocations += 1;
                *owners.entry(b.ip(o)).or_default() += 1;
            }
            for (h, n) in b.handle_counts() {
                counted.insert((h, b.key_name()), n);
            }
            if !pools.iter().any(|p| cidr::contains_net(&p.cidr, &b.cidr)) {
                r.leaks
                    .push(format!("block {} is outside every pool", b.cidr));
            }
        }
        for (ip, n) in owners.iter().filter(|(_, n)| **n > 1) {
            r.problems.push(format!("address {ip} has {n} live owners"));
        }
        for (i, a) in blocks.iter().enumerate() {
            for b in &blocks[i + 1..] {
                if cidr::overlaps(&a.cidr, &b.cidr) {
                    r.problems
                        .push(format!("blocks {} and {} overlap", a.cidr, b.cidr));
                }
            }
        }
        let mut held: BTreeMap<(String, String), u32> = BTreeMap::new();
        for h in &handles {
            for (block, n) in &h.blocks {
                held.insert((h.id.clone(), block.clone()), *n);
            }
        }
        for key in counted.keys().chain(held.keys()).collect::<BTreeSet<_>>() {
            let (c, h) = (
                counted.get(key).copied().unwrap_or(0),
                held.get(key).copied().unwrap_or(0),
            );
            if c != h {
                r.mismatched_handles.push(key.clone());
                r.problems.push(format!(
                    "handle {:?} records {h} addresses in block {} but the block holds {c}",
                    key.0, key.1
                ));
            }
        }
        let mut confirmed: BTreeMap<String, Vec<&str>> = BTreeMap::new();
        for a in affs.iter().filter(|a| a.state == AffinityState::Confirmed) {
            confirmed
                .entry(cidr::cidr_name(&a.cidr))
                .or_default()
                .push(&a.host);
        }
        for (block, hosts) in &confirmed {
            if hosts.len() > 1 {
                r.problems.push(format!(
                    "block {block} has {} confirmed affinities: {}",
                    hosts.len(),
                    hosts.join(", ")
                ));
            }
            match blocks.iter().find(|b| &b.key_name() == block) {
                None => r.leaks.push(format!(
                    "confirmed affinity of {} names block {block}, which does not exist",
                    hosts[0]
                )),
                Some(b) if !hosts.iter().any(|h| b.is_affine_to(h)) => r.problems.push(format!(
                    "block {block} is affine to {:?} but its confirmed affinity names {}",
                    b.affinity,
                    hosts.join(", ")
                )),
                Some(_) => {}
            }
        }
        for a in affs.iter().filter(|a| a.state != AffinityState::Confirmed) {
            r.leaks.push(format!(
                "affinity of {} for {} is {:?} (an interrupted claim or release)",
                a.host, a.cidr, a.state
            ));
        }
        for b in &blocks {
            if let Some(host) = b.affinity.as_deref().and_then(|a| a.strip_prefix("host:"))
                && !affs.iter().any(|a| a.host == host && a.cidr == b.cidr)
            {
                r.leaks.push(format!(
                    "block {} is affine to {host}, which has no affinity for it",
                    b.cidr
                ));
            }
        }
        // Where nodes keep records (agents on a shared etcd write them), a block whose node has none belongs
        // to a node that is gone: its addresses stay allocated until `weir ipam release-node` frees them.
        let mut live: BTreeSet<String> = self.nodes().await?.into_keys().collect();
        let what = match nodes {
            Some(nodes) => {
                live.extend(nodes.iter().cloned());
                "no node record and no Node object"
            }
            None => "no node record",
        };
        if !live.is_empty() {
            for a in affs.iter().filter(|a| a.state == AffinityState::Confirmed) {
                if !live.contains(&a.host) {
                    r.leaks.push(format!(
                        "block {} belongs to node {}, which has {what} (decommissioned?): \
                         `weir ipam release-node {}` frees it",
                        a.cidr, a.host, a.host
                    ));
                }
            }
        }
        Ok(r)
    }
}
