//! Block affinities: the two-phase claim (pending → block created → confirmed), release, and reclaim.
//!
//! On a store whose transactions are atomic over several keys (etcd, embedded, memory), the pending affinity
//! and the block are one write, and an allocation's claim confirms the affinity in the write that takes its
//! first addresses ([`Confirm::WithFirstTake`]): the two phases stay two writes, with nothing between them. On
//! the Kubernetes store (writes one by one) each step is its own write, in Calico's order.

use std::sync::Arc;

use ipnetwork::IpNetwork;

use super::{EMPTY_BLOCK_MIN_RECLAIM_AGE, Ipam, Snapshot, decode, encode};
use crate::{
    IpamError,
    cidr::{self, fnv1a},
    model::{AffinityState, Block, BlockAffinity, IpPool, reservation::reserved_count},
    store::{Key, Kind, Op, Store, Write},
};

/// Candidate blocks probed one by one before listing the pool's blocks once.
const PROBES: u128 = 8;

/// How a claim ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    /// The block is ours, affinity confirmed.
    Claimed,
    /// Another host has it.
    Taken,
}

/// When a claim confirms the affinity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Confirm {
    /// In the claim itself.
    Now,
    /// In the allocation's first take from the block (`take_from_block` with `confirm`), on atomic stores
    /// only: the claim leaves the affinity pending. A crash between the two leaves a pending affinity with its
    /// block, which the host's next allocation confirms (`settle_affinity`).
    WithFirstTake,
}

/// What the first phase of a claim found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PhaseOne {
    /// The block was created for this host (affinity pending, or already confirmed).
    Created,
    /// The block already names this host.
    Ours,
    /// Another host's block; an unconfirmed affinity of ours for it was deleted.
    Taken,
}

pub(crate) fn affinity_key(host: &str, cidr: &IpNetwork) -> Key {
    Key::new(Kind::Affinity, BlockAffinity::key_name(host, cidr))
}

pub(crate) fn block_key(cidr: &IpNetwork) -> Key {
    Key::new(Kind::Block, cidr::cidr_name(cidr))
}

impl<S: Store + Clone> Ipam<S> {
    /// Claims `cidr` for `host`: a pending affinity, then the block (create), then the affinity confirmed in
    /// one write that also checks the block still names this host.
    pub(crate) async fn claim_block(
        &self,
        host: &str,
        cidr: IpNetwork,
    ) -> Result<Claim, IpamError> {
        if !self.atomic_store() {
            return self.claim_block_stepwise(host, cidr).await;
        }
        match self.claim_phase_one(host, cidr).await? {
            PhaseOne::Taken => Ok(Claim::Taken),
            PhaseOne::Created | PhaseOne::Ours => self.confirm_affinity(host, cidr).await,
        }
    }

    /// Whether several keys can be written as one: the claim's phases then take fewer writes.
    pub(crate) fn atomic_store(&self) -> bool {
        self.store.atomic_txn_limit().is_some_and(|n| n >= 3)
    }

    /// Claims `cidr` for `host` only if the block does not exist yet (a new block for an allocation);
    /// `WithFirstTake` (atomic stores only) leaves the affinity pending for the allocation's first take.
    async fn claim_fresh(
        &self,
        host: &str,
        cidr: IpNetwork,
        confirm: Confirm,
    ) -> Result<bool, IpamError> {
        if !self.atomic_store() {
            return Ok(self.claim_block_stepwise(host, cidr).await? == Claim::Claimed);
        }
        Ok(match self.claim_phase_one(host, cidr).await? {
            PhaseOne::Created => match confirm {
                Confirm::WithFirstTake => true,
                Confirm::Now => self.confirm_affinity(host, cidr).await? == Claim::Claimed,
            },
            // An existing block of this host's is found through its affinity, not claimed anew.
            PhaseOne::Ours | PhaseOne::Taken => false,
        })
    }

    /// The first phase in one write (atomic stores): the pending affinity and the new block together, or,
    /// when the block exists, nothing but the removal of an unconfirmed affinity of ours for another host's
    /// block.
    async fn claim_phase_one(&self, host: &str, cidr: IpNetwork) -> Result<PhaseOne, IpamError> {
        let akey = affinity_key(host, &cidr);
        let bkey = block_key(&cidr);
        let pending = encode(&BlockAffinity {
            host: host.to_owned(),
            cidr,
            state: AffinityState::Pending,
            deleted: false,
        });
        let block = encode(&Block::new(
            cidr,
            Some(Block::host_affinity(host)),
            self.clock.now(),
            self.clock.seq_seed(),
        ));
        let (ak, bk, h) = (akey.clone(), bkey.clone(), host.to_owned());
        Ok(self
            .store
            .read_modify_write(vec![akey, bkey], move |cur| {
                let aff = cur[0]
                    .as_deref()
                    .and_then(|v| decode::<BlockAffinity>(&ak, v).ok());
                let confirmed = aff
                    .as_ref()
                    .is_some_and(|a| a.state == AffinityState::Confirmed && !a.deleted);
                let pend = if confirmed {
                    Write::Keep
                } else {
                    Write::Put(pending.clone())
                };
                let Some(existing) = cur[1].as_deref() else {
                    return (vec![pend, Write::Put(block.clone())], PhaseOne::Created);
                };
                let ours = decode::<Block>(&bk, existing)
                    .ok()
                    .is_some_and(|b| b.is_affine_to(&h) && !b.deleted);
                if ours {
                    (vec![pend, Write::Keep], PhaseOne::Ours)
                } else {
                    let drop = if cur[0].is_some()
                        && !aff
                            .as_ref()
                            .is_some_and(|a| a.state == AffinityState::Confirmed)
                    {
                        Write::Delete
                    } else {
                        Write::Keep
                    };
                    (vec![drop, Write::Keep], PhaseOne::Taken)
                }
            })
            .await?)
    }

    /// The claim one write at a time (stores whose transactions are not atomic over several keys).
    async fn claim_block_stepwise(&self, host: &str, cidr: IpNetwork) -> Result<Claim, IpamError> {
        let akey = affinity_key(host, &cidr);
        let pending = encode(&BlockAffinity {
            host: host.to_owned(),
            cidr,
            state: AffinityState::Pending,
            deleted: false,
        });
        let k = akey.clone();
        self.store
            .read_modify_write(vec![akey.clone()], move |cur| {
                let confirmed = cur[0]
                    .as_deref()
                    .and_then(|v| decode::<BlockAffinity>(&k, v).ok())
                    .is_some_and(|a| a.state == AffinityState::Confirmed && !a.deleted);
                (
                    vec![if confirmed {
                        Write::Keep
                    } else {
                        Write::Put(pending.clone())
                    }],
                    (),
                )
            })
            .await?;
        let bkey = block_key(&cidr);
        let block = Block::new(
            cidr,
            Some(Block::host_affinity(host)),
            self.clock.now(),
            self.clock.seq_seed(),
        );
        match self
            .store
            .txn(vec![Op::Create {
                key: bkey.clone(),
                value: encode(&block),
            }])
            .await
        {
            Ok(()) => {}
            Err(e) if e.is_conflict() => {
                let ours = self
                    .get_obj::<Block>(&bkey)
                    .await?
                    .is_some_and(|(b, _)| b.is_affine_to(host) && !b.deleted);
                if !ours {
                    self.drop_unconfirmed_affinity(host, &cidr).await?;
                    return Ok(Claim::Taken);
                }
            }
            Err(e) => return Err(e.into()),
        }
        self.confirm_affinity(host, cidr).await
    }

    /// Confirms the affinity if the block names `host` (checked in the same write).
    async fn confirm_affinity(&self, host: &str, cidr: IpNetwork) -> Result<Claim, IpamError> {
        let akey = affinity_key(host, &cidr);
        let bkey = block_key(&cidr);
        let (ak, bk, h) = (akey.clone(), bkey.clone(), host.to_owned());
        let confirmed = self
            .store
            .read_modify_write(vec![akey, bkey], move |cur| {
                let aff = cur[0]
                    .as_deref()
                    .and_then(|v| decode::<BlockAffinity>(&ak, v).ok());
                let ours = cur[1]
                    .as_deref()
                    .and_then(|v| decode::<Block>(&bk, v).ok())
                    .is_some_and(|b| b.is_affine_to(&h) && !b.deleted);
                match aff {
                    Some(mut a)
                        if ours
                            && matches!(
                                a.state,
                                AffinityState::Pending | AffinityState::Confirmed
                            ) =>
                    {
                        let already = a.state == AffinityState::Confirmed;
                        a.state = AffinityState::Confirmed;
                        (
                            vec![
                                if already {
                                    Write::Keep
                                } else {
                                    Write::Put(encode(&a))
                                },
                                Write::Keep,
                            ],
                            true,
                        )
                    }
                    _ => (vec![Write::Keep, Write::Keep], false),
                }
            })
            .await?;
        Ok(if confirmed {
            Claim::Claimed
        } else {
            Claim::Taken
        })
    }

    /// Deletes `host`'s affinity for `cidr` unless it is confirmed.
    async fn drop_unconfirmed_affinity(
        &self,
        host: &str,
        cidr: &IpNetwork,
    ) -> Result<(), IpamError> {
        let akey = affinity_key(host, cidr);
        let k = akey.clone();
        self.store
            .read_modify_write(vec![akey], move |cur| {
                let confirmed = cur[0]
                    .as_deref()
                    .and_then(|v| decode::<BlockAffinity>(&k, v).ok())
                    .is_some_and(|a| a.state == AffinityState::Confirmed);
                (
                    vec![if confirmed || cur[0].is_none() {
                        Write::Keep
                    } else {
                        Write::Delete
                    }],
                    (),
                )
            })
            .await?;
        Ok(())
    }

    /// Brings an unconfirmed affinity (left by a crash or a race) to a settled state.
    pub(crate) async fn settle_affinity(&self, aff: &BlockAffinity) -> Result<Claim, IpamError> {
        match aff.state {
            AffinityState::Confirmed => Ok(Claim::Claimed),
            AffinityState::PendingDeletion => {
                self.release_affinity(&aff.host, aff.cidr, false).await?;
                Ok(Claim::Taken)
            }
            AffinityState::Pending => match self.get_obj::<Block>(&block_key(&aff.cidr)).await? {
                None => self.claim_block(&aff.host, aff.cidr).await,
                Some((b, _)) if b.is_affine_to(&aff.host) => {
                    self.confirm_affinity(&aff.host, aff.cidr).await
                }
                Some(_) => {
                    self.drop_unconfirmed_affinity(&aff.host, &aff.cidr).await?;
                    Ok(Claim::Taken)
                }
            },
        }
    }

    /// Releases `host`'s affinity for `cidr`: the affinity goes to pending-deletion, an empty block is deleted
    /// (a non-empty one loses its affinity and becomes borrowable, unless `require_empty`), then the affinity
    /// is deleted.
    pub async fn release_affinity(
        &self,
        host: &str,
        cidr: IpNetwork,
        require_empty: bool,
    ) -> Result<(), IpamError> {
        self.release_affinity_if(host, cidr, require_empty, None)
            .await
            .map(|_| ())
    }

    /// As [`Self::release_affinity`], only if the block's sequence number is still `required_seq`. Returns
    /// whether the block was released.
    async fn release_affinity_if(
        &self,
        host: &str,
        cidr: IpNetwork,
        require_empty: bool,
        required_seq: Option<u64>,
    ) -> Result<bool, IpamError> {
        self.hints.forget(host);
        let bkey = block_key(&cidr);
        if let Some((b, _)) = self.get_obj::<Block>(&bkey).await?
            && b.is_affine_to(host)
        {
            if require_empty && !b.is_empty() {
                return Err(IpamError::BlockNotEmpty { cidr });
            }
            if required_seq.is_some_and(|s| s != b.sequence_number) {
                return Ok(false);
            }
        }
        self.set_affinity_state(host, &cidr, AffinityState::PendingDeletion, None)
            .await?;
        let (bk, h, now) = (bkey.clone(), host.to_owned(), self.clock.now());
        #[derive(PartialEq)]
        enum Outcome {
            Done,
            NotEmpty,
            Moved,
        }
        let outcome = self
            .store
            .read_modify_write(vec![bkey], move |cur| {
                let Some(mut b) = cur[0].as_deref().and_then(|v| decode::<Block>(&bk, v).ok())
                else {
                    return (vec![Write::Keep], Outcome::Done);
                };
                if !b.is_affine_to(&h) {
                    return (vec![Write::Keep], Outcome::Done);
                }
                if required_seq.is_some_and(|s| s != b.sequence_number) {
                    return (vec![Write::Keep], Outcome::Moved);
                }
                if b.is_empty() {
                    return (vec![Write::Delete], Outcome::Done);
                }
                if require_empty {
                    return (vec![Write::Keep], Outcome::NotEmpty);
                }
                b.affinity = None;
                b.affinity_claim_time = now;
                b.touch();
                (vec![Write::Put(encode(&b))], Outcome::Done)
            })
            .await?;
        if outcome != Outcome::Done {
            self.set_affinity_state(
                host,
                &cidr,
                AffinityState::Confirmed,
                Some(AffinityState::PendingDeletion),
            )
            .await?;
            return match outcome {
                Outcome::NotEmpty => Err(IpamError::BlockNotEmpty { cidr }),
                _ => Ok(false),
            };
        }
        let akey = affinity_key(host, &cidr);
        self.store
            .read_modify_write(vec![akey], |cur| {
                (
                    vec![if cur[0].is_some() {
                        Write::Delete
                    } else {
                        Write::Keep
                    }],
                    (),
                )
            })
            .await?;
        Ok(true)
    }

    async fn set_affinity_state(
        &self,
        host: &str,
        cidr: &IpNetwork,
        state: AffinityState,
        only_from: Option<AffinityState>,
    ) -> Result<(), IpamError> {
        let akey = affinity_key(host, cidr);
        let k = akey.clone();
        self.store
            .read_modify_write(vec![akey], move |cur| {
                match cur[0]
                    .as_deref()
                    .and_then(|v| decode::<BlockAffinity>(&k, v).ok())
                {
                    Some(mut a) if only_from.is_none_or(|f| f == a.state) && a.state != state => {
                        a.state = state;
                        (vec![Write::Put(encode(&a))], ())
                    }
                    _ => (vec![Write::Keep], ()),
                }
            })
            .await?;
        Ok(())
    }

    /// Every affinity of `host` (soft-deleted rows skipped).
    pub async fn host_affinities(&self, host: &str) -> Result<Vec<BlockAffinity>, IpamError> {
        Ok(self
            .list_objs::<BlockAffinity>(Kind::Affinity, &BlockAffinity::host_prefix(host))
            .await?
            .into_iter()
            .map(|(a, _)| a)
            .filter(|a| !a.deleted && a.host == host)
            .collect())
    }

    /// [`Self::host_affinities`] from a listing that may lag the newest writes a little ([`Store::list_relaxed`]):
    /// for allocation, where every block taken is then compare-and-swapped with its affinity checked, so a
    /// stale row costs at most a retry or one more block, never an address.
    pub(crate) async fn host_affinities_relaxed(
        &self,
        host: &str,
    ) -> Result<Vec<BlockAffinity>, IpamError> {
        let prefix = BlockAffinity::host_prefix(host);
        let mut out = Vec::new();
        for (name, v) in self.store.list_relaxed(Kind::Affinity, &prefix).await? {
            let a: BlockAffinity = super::decode(&Key::new(Kind::Affinity, name), &v.value)?;
            if !a.deleted && a.host == host {
                out.push(a);
            }
        }
        Ok(out)
    }

    /// Releases every affinity of `host`, best effort; returns the last error.
    pub async fn release_host_affinities(
        &self,
        host: &str,
        require_empty: bool,
    ) -> Result<usize, IpamError> {
        let mut released = 0;
        let mut last = None;
        for a in self.host_affinities(host).await? {
            match self.release_affinity(host, a.cidr, require_empty).await {
                Ok(()) => released += 1,
                Err(e) => last = Some(e),
            }
        }
        last.map_or(Ok(released), Err)
    }

    /// Claims every block of `cidr` (which must lie in a pool and hold at least one block) for `host`.
    /// Returns the blocks claimed and those another host has.
    pub async fn claim_affinity(
        &self,
        host: &str,
        cidr: IpNetwork,
    ) -> Result<(Vec<IpNetwork>, Vec<IpNetwork>), IpamError> {
        let pools = self.pools().await?;
        let pool = pools
            .iter()
            .find(|p| cidr::contains_net(&p.cidr, &cidr))
            .ok_or(IpamError::NotInAnyPool { ip: cidr.network() })?;
        if cidr.prefix() > pool.block_size {
            return Err(IpamError::CidrTooSmall {
                cidr,
                block_size: pool.block_size,
            });
        }
        let (mut claimed, mut failed) = (Vec::new(), Vec::new());
        for i in 0..cidr::block_count(&cidr, pool.block_size) {
            let Some(b) = cidr::nth_block(&cidr, pool.block_size, i) else {
                break;
            };
            match self.claim_block(host, b).await? {
                Claim::Claimed => claimed.push(b),
                Claim::Taken => failed.push(b),
            }
        }
        Ok((claimed, failed))
    }

    /// Finds a block of `pool` nobody has (or an empty one another host has held for over a minute) and
    /// claims it for `host`. Probes a few candidates in this host's order, then lists the pool's blocks once.
    pub(crate) async fn claim_new_block(
        &self,
        host: &str,
        pool: &IpPool,
        snap: &Snapshot,
        confirm: Confirm,
    ) -> Result<Option<IpNetwork>, IpamError> {
        // On an atomic store the claim reads the block itself: no probe read first.
        let probe = !self.atomic_store();
        let count = cidr::block_count(&pool.cidr, pool.block_size);
        let start = u128::from(fnv1a(host)) % count;
        let candidate = |i: u128| cidr::nth_block(&pool.cidr, pool.block_size, (start + i) % count);
        let usable = |b: &IpNetwork| reserved_count(&snap.reservations, b) < cidr::size(b);
        for i in 0..count.min(PROBES) {
            let Some(b) = candidate(i).filter(usable) else {
                continue;
            };
            if (!probe || self.store.get(&block_key(&b)).await?.is_none())
                && self.claim_fresh(host, b, confirm).await?
            {
                return Ok(Some(b));
            }
        }
        let existing: Vec<Block> = self
            .list_objs::<Block>(Kind::Block, "")
            .await?
            .into_iter()
            .map(|(b, _)| b)
            .filter(|b| cidr::contains_net(&pool.cidr, &b.cidr))
            .collect();
        let taken: std::collections::BTreeSet<IpNetwork> =
            existing.iter().map(|b| b.cidr).collect();
        // At most `taken.len() + 1` candidates past the probes are taken before a free one turns up.
        let limit = count.min(PROBES + taken.len() as u128 + 1);
        for i in 0..limit {
            let Some(b) = candidate(i).filter(usable) else {
                continue;
            };
            if !taken.contains(&b) && self.claim_fresh(host, b, confirm).await? {
                return Ok(Some(b));
            }
        }
        let now = self.clock.now();
        let reservations = Arc::clone(&snap.reservations);
        for b in existing
            .iter()
            .filter(|b| b.is_empty() && !b.is_affine_to(host) && b.free_count(&reservations) > 0)
        {
            let Some(owner) = b.affinity.as_deref().and_then(|a| a.strip_prefix("host:")) else {
                continue;
            };
            if now.saturating_sub(b.affinity_claim_time) < EMPTY_BLOCK_MIN_RECLAIM_AGE {
                continue;
            }
            match self
                .release_affinity_if(owner, b.cidr, true, Some(b.sequence_number))
                .await
            {
                Ok(true) => {
                    tracing::info!(block = %b.cidr, from = owner, to = host, "reclaimed an empty block");
                    if self.claim_fresh(host, b.cidr, confirm).await? {
                        return Ok(Some(b.cidr));
                    }
                }
                Ok(false) | Err(IpamError::BlockNotEmpty { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        AssignArgs,
        model::{IpPool, IpUse},
        store::memory::MemoryStore,
    };

    async fn ipam() -> Ipam<MemoryStore> {
        let ipam = Ipam::new(MemoryStore::default());
        ipam.add_pool(IpPool {
            name: "p".into(),
            cidr: "10.41.0.0/24".parse().expect("cidr"),
            block_size: 26,
            node_selector: String::new(),
            namespace_selector: String::new(),
            allowed_uses: vec![IpUse::Workload],
            disabled: false,
        })
        .await
        .expect("pool");
        ipam
    }

    fn state(affs: &[BlockAffinity], cidr: IpNetwork) -> Option<AffinityState> {
        affs.iter().find(|a| a.cidr == cidr).map(|a| a.state)
    }

    #[tokio::test]
    async fn an_allocation_that_claims_confirms_in_its_first_take() {
        let ipam = ipam().await;
        let got = ipam
            .auto_assign(&AssignArgs::new("h1", "x", 1, 0))
            .await
            .expect("assign");
        assert_eq!(got.ipv4.len(), 1, "{:?}", got.messages);
        let affs = ipam.host_affinities("h1").await.expect("affinities");
        assert_eq!(affs.len(), 1, "{affs:?}");
        assert_eq!(affs[0].state, AffinityState::Confirmed);
        assert!(cidr::contains_net(&affs[0].cidr, &got.ipv4[0]));
    }

    /// A crash between the claim and the first take leaves a pending affinity beside its block: the host's
    /// next allocation confirms it and allocates from it, and no other host can take the block meanwhile.
    #[tokio::test]
    async fn a_claim_left_pending_is_confirmed_by_the_hosts_next_allocation() {
        let ipam = ipam().await;
        let b: IpNetwork = "10.41.0.64/26".parse().expect("cidr");
        assert!(
            ipam.claim_fresh("h1", b, Confirm::WithFirstTake)
                .await
                .expect("claim")
        );
        let affs = ipam.host_affinities("h1").await.expect("affinities");
        assert_eq!(state(&affs, b), Some(AffinityState::Pending));
        assert!(
            !ipam
                .claim_fresh("h2", b, Confirm::WithFirstTake)
                .await
                .expect("claim on h2"),
            "the block exists: another host cannot claim it"
        );
        assert!(
            !ipam
                .claim_fresh("h1", b, Confirm::Now)
                .await
                .expect("claim again"),
            "an existing block is not claimed anew"
        );
        let got = ipam
            .auto_assign(&AssignArgs::new("h1", "x", 1, 0))
            .await
            .expect("assign");
        assert_eq!(got.ipv4.len(), 1, "{:?}", got.messages);
        assert!(cidr::contains_net(&b, &got.ipv4[0]), "{got:?}");
        let affs = ipam.host_affinities("h1").await.expect("affinities");
        assert_eq!(state(&affs, b), Some(AffinityState::Confirmed));
        assert!(ipam.host_affinities("h2").await.expect("h2").is_empty());
    }
}
