//! Auto-assign and assign-a-specific-address.

use std::{collections::BTreeSet, net::IpAddr, sync::Arc};

use ipnetwork::IpNetwork;

use super::{
    AssignArgs, AssignResult, Ipam, Snapshot,
    claim::{Claim, Confirm, affinity_key, block_key},
    decode, decode_block, encode,
    pools::{find_pool, pool_for_ip},
};
use crate::{
    IpamError,
    cidr::{self, Family},
    model::{
        AffinityState, AllocationAttr, Block, BlockAffinity, Handle, IpPool, IpUse, Reservation,
        handle::sanitize,
    },
    store::{Key, Kind, RMW_RETRIES, Store, StoreError, Write},
};

/// What one attempt on a block found.
enum Took {
    /// The addresses taken, and whether the block has nothing left to give (no free address and
    /// none cooling down).
    Ips(Vec<IpAddr>, bool),
    Missing,
    NotOurs,
    Corrupt(StoreError),
}

/// Whose block a take may use.
#[derive(Clone, Copy)]
enum Owner<'a> {
    /// Any block (borrowing).
    Any,
    /// Only while the block is affine to this host.
    Host(&'a str),
    /// As `Host`, and the host's affinity for the block (pending after its claim, or confirmed) is confirmed
    /// in the same write ([`Confirm::WithFirstTake`]).
    Claiming(&'a str),
}

fn handle_key(handle: &str) -> Key {
    Key::new(Kind::Handle, sanitize(handle))
}

impl<S: Store + Clone> Ipam<S> {
    /// Assigns addresses to `args.host`: from its own blocks first, then by claiming new blocks, then (unless
    /// strict affinity) by borrowing from other hosts' blocks. Running out is not an error: the result holds
    /// fewer addresses and messages naming the exhausted pools.
    pub async fn auto_assign(&self, args: &AssignArgs) -> Result<AssignResult, IpamError> {
        check_name("host", &args.host)?;
        check_name("handle", sanitize(&args.handle))?;
        let snap = self.snapshot().await?;
        let mut out = AssignResult::default();
        for (family, n) in [(Family::V4, args.num_v4), (Family::V6, args.num_v6)] {
            if n == 0 {
                continue;
            }
            let (ips, msgs) = self.assign_family(args, family, n, &snap).await?;
            match family {
                Family::V4 => out.ipv4 = ips,
                Family::V6 => out.ipv6 = ips,
            }
            out.messages.extend(msgs);
        }
        Ok(out)
    }

    fn select_pools(
        &self,
        args: &AssignArgs,
        family: Family,
        snap: &Snapshot,
    ) -> Result<Vec<IpPool>, IpamError> {
        let pools: Vec<IpPool> = if args.pools.is_empty() {
            snap.pools
                .iter()
                .filter(|p| {
                    p.family() == family
                        && !p.disabled
                        && p.selects(&args.node_labels, &args.namespace_labels)
                })
                .cloned()
                .collect()
        } else {
            let mut v = Vec::new();
            for name in &args.pools {
                let p = find_pool(&snap.pools, name)?;
                if p.disabled {
                    return Err(IpamError::PoolDisabled { name: name.clone() });
                }
                if p.family() == family {
                    v.push(p.clone());
                }
            }
            v
        };
        if pools.is_empty() {
            let why = if args.pools.is_empty() {
                format!("no enabled {family} pool selects node {:?}", args.host)
            } else {
                format!(
                    "none of the requested pools [{}] is {family}",
                    args.pools.join(", ")
                )
            };
            return Err(IpamError::NoQualifiedPool { family, why });
        }
        let allowed: Vec<IpPool> = pools
            .into_iter()
            .filter(|p| p.allows(args.intended_use))
            .collect();
        if allowed.is_empty() {
            return Err(IpamError::NoQualifiedPool {
                family,
                why: format!("no selected pool allows use {}", args.intended_use),
            });
        }
        Ok(allowed)
    }

    async fn assign_family(
        &self,
        args: &AssignArgs,
        family: Family,
        n: u32,
        snap: &Snapshot,
    ) -> Result<(Vec<IpNetwork>, Vec<String>), IpamError> {
        let pools = self.select_pools(args, family, snap)?;
        let mut msgs = Vec::new();
        let mut want = n;
        if let Some(max) = args.max_per_handle {
            let held = self.handle_family_ips(&args.handle, family).await?;
            let held_n = held.len() as u32;
            if held_n >= max || held_n + n > max {
                if held_n >= n {
                    return Ok((held.into_iter().take(n as usize).collect(), msgs));
                }
                return Err(IpamError::HandleCap {
                    handle: args.handle.clone(),
                    family,
                    max,
                    held: held_n,
                });
            }
        }
        let mut got: Vec<IpNetwork> = Vec::new();
        let attr = AllocationAttr {
            handle: Some(sanitize(&args.handle).to_owned()),
            attrs: args.attrs.clone(),
            released_at: None,
        };
        let in_pools = |c: &IpNetwork| pools.iter().any(|p| cidr::contains_net(&p.cidr, c));

        // 1. The host's own blocks: first those of its hint (`hints`), then, if they cannot serve, found
        // through its affinities (an index, not a scan of every block), read afresh before any claim.
        let mut tried: BTreeSet<IpNetwork> = BTreeSet::new();
        for cidr in self.hints.get(&args.host).unwrap_or_default() {
            if want == 0 || Family::of(&cidr) != family || !in_pools(&cidr) {
                continue;
            }
            tried.insert(cidr);
            if self.hints.is_full(&args.host, &cidr) {
                continue;
            }
            let ips = self
                .take_from_block(
                    cidr,
                    Owner::Host(&args.host),
                    want,
                    &attr,
                    &args.handle,
                    snap,
                )
                .await?;
            want -= ips.len() as u32;
            got.extend(ips);
        }
        if want == 0 {
            return Ok((got, msgs));
        }
        let mut owned = 0u32;
        let mut mine: Vec<IpNetwork> = Vec::new();
        let mut affs = self.host_affinities_relaxed(&args.host).await?;
        affs.sort_by_key(|a| a.cidr);
        for aff in affs {
            let state = if aff.state == AffinityState::Confirmed {
                Claim::Claimed
            } else {
                self.settle_affinity(&aff).await?
            };
            if state != Claim::Claimed {
                continue;
            }
            mine.push(aff.cidr);
            if Family::of(&aff.cidr) != family {
                continue;
            }
            owned += 1;
            if want == 0
                || !in_pools(&aff.cidr)
                || tried.contains(&aff.cidr)
                || self.hints.is_full(&args.host, &aff.cidr)
            {
                continue;
            }
            let ips = self
                .take_from_block(
                    aff.cidr,
                    Owner::Host(&args.host),
                    want,
                    &attr,
                    &args.handle,
                    snap,
                )
                .await?;
            want -= ips.len() as u32;
            got.extend(ips);
        }
        self.hints.set(&args.host, mine.clone());

        // 2. New blocks.
        let max_blocks = snap.config.effective_max_blocks(args.max_blocks);
        let mut exhausted = Vec::new();
        while want > 0 {
            if owned >= max_blocks {
                if snap.config.strict_affinity {
                    msgs.push(format!(
                        "need to allocate an ipam block but could not: limit of {max_blocks} blocks reached for this node"
                    ));
                    return Ok((got, msgs));
                }
                break;
            }
            if !snap.config.auto_allocate_blocks {
                break;
            }
            // On an atomic store the claim leaves the affinity pending and the first take confirms it: one
            // write fewer on the allocation that claims.
            let (confirm, owner) = if self.atomic_store() {
                (Confirm::WithFirstTake, Owner::Claiming(&args.host))
            } else {
                (Confirm::Now, Owner::Host(&args.host))
            };
            let mut claimed = None;
            for p in &pools {
                if let Some(b) = self.claim_new_block(&args.host, p, snap, confirm).await? {
                    claimed = Some(b);
                    break;
                }
            }
            let Some(b) = claimed else { break };
            owned += 1;
            let ips = self
                .take_from_block(b, owner, want, &attr, &args.handle, snap)
                .await?;
            if !ips.is_empty() {
                // The take confirmed the claim: the block is the host's.
                mine.push(b);
                self.hints.set(&args.host, mine.clone());
            }
            want -= ips.len() as u32;
            got.extend(ips);
        }
        if want > 0 && snap.config.strict_affinity {
            msgs.push("no more free affine blocks and strict affinity enabled".to_owned());
            return Ok((got, msgs));
        }

        // 3. Borrow from other hosts' blocks.
        if want > 0 {
            let blocks: Vec<Block> = self
                .list_objs::<Block>(Kind::Block, "")
                .await?
                .into_iter()
                .map(|(b, _)| b)
                .collect();
            for p in &pools {
                for b in blocks
                    .iter()
                    .filter(|b| !b.deleted && cidr::contains_net(&p.cidr, &b.cidr))
                {
                    if want == 0 {
                        break;
                    }
                    if b.free_count(&snap.reservations) == 0 {
                        continue;
                    }
                    let ips = self
                        .take_from_block(b.cidr, Owner::Any, want, &attr, &args.handle, snap)
                        .await?;
                    want -= ips.len() as u32;
                    got.extend(ips);
                }
                if want > 0 {
                    exhausted.push(p.cidr.to_string());
                }
            }
        }
        if want > 0 {
            msgs.push(format!(
                "no IPs available in pools: [{}]",
                exhausted.join(" ")
            ));
        }
        Ok((got, msgs))
    }

    /// Takes up to `n` addresses from the head of one block's free list: one atomic write over the block and
    /// the handle. With `host`, only while the block is affine to it.
    async fn take_from_block(
        &self,
        cidr: IpNetwork,
        owner: Owner<'_>,
        n: u32,
        attr: &AllocationAttr,
        handle: &str,
        snap: &Snapshot,
    ) -> Result<Vec<IpNetwork>, IpamError> {
        let bkey = block_key(&cidr);
        let hkey = handle_key(handle);
        let (bk, hk) = (bkey.clone(), hkey.clone());
        let (host, claiming) = match owner {
            Owner::Any => (None, false),
            Owner::Host(h) => (Some(h.to_owned()), false),
            Owner::Claiming(h) => (Some(h.to_owned()), true),
        };
        let mut keys = vec![bkey, hkey];
        let akey = host
            .as_deref()
            .filter(|_| claiming)
            .map(|h| affinity_key(h, &cidr));
        keys.extend(akey.clone());
        let attr = attr.clone();
        let reservations: Arc<Vec<Reservation>> = Arc::clone(&snap.reservations);
        let (now, cooldown) = (self.clock.now(), snap.config.ip_cooldown_seconds);
        let hid = sanitize(handle).to_owned();
        let took = self
            .store
            .read_modify_write(keys, move |cur| {
                // Nothing taken: the decision rested on the block (and the affinity), never on the handle.
                let mut keep = vec![Write::Keep, Write::Unread, Write::Keep];
                keep.truncate(cur.len());
                let mut block: Block = match cur[0].as_deref().map(|v| decode_block(&bk, v)) {
                    None => return (keep, Took::Missing),
                    Some(Err(e)) => return (keep, Took::Corrupt(e)),
                    Some(Ok(b)) => b,
                };
                if block.deleted {
                    return (keep, Took::Missing);
                }
                if host.as_deref().is_some_and(|h| !block.is_affine_to(h)) {
                    return (keep, Took::NotOurs);
                }
                // Claiming: the affinity must still be the host's (pending or confirmed), and is confirmed
                // by this write.
                let confirm = match (&akey, cur.get(2)) {
                    (None, _) => Write::Keep,
                    (Some(ak), Some(Some(v))) => match decode::<BlockAffinity>(ak, v) {
                        Ok(a) if !a.deleted && a.state == AffinityState::Confirmed => Write::Keep,
                        Ok(mut a) if !a.deleted && a.state == AffinityState::Pending => {
                            a.state = AffinityState::Confirmed;
                            Write::Put(encode(&a))
                        }
                        Ok(_) => return (keep, Took::NotOurs),
                        Err(e) => return (keep, Took::Corrupt(e)),
                    },
                    (Some(_), _) => return (keep, Took::NotOurs),
                };
                let mut handle: Handle = match cur[1].as_deref().map(|v| decode(&hk, v)) {
                    None => Handle {
                        id: hid.clone(),
                        ..Handle::default()
                    },
                    Some(Err(e)) => {
                        keep[1] = Write::Keep;
                        return (keep, Took::Corrupt(e));
                    }
                    Some(Ok(h)) => h,
                };
                block.garbage_collect(now, cooldown);
                let ips = block.assign_from_head(n, &attr, &reservations);
                let exhausted = block.exhausted(&reservations);
                if ips.is_empty() {
                    return (
                        vec![Write::Keep, Write::Unread, confirm],
                        Took::Ips(ips, exhausted),
                    );
                }
                block.touch();
                handle.deleted = false;
                handle.add(&block.key_name(), ips.len() as u32);
                (
                    vec![
                        Write::Put(encode(&block)),
                        Write::Put(encode(&handle)),
                        confirm,
                    ],
                    Took::Ips(ips, exhausted),
                )
            })
            .await?;
        match took {
            Took::Ips(ips, exhausted) => {
                if exhausted && let Owner::Host(h) | Owner::Claiming(h) = owner {
                    self.hints.mark_full(h, cidr);
                }
                Ok(ips
                    .into_iter()
                    .filter_map(|ip| IpNetwork::new(ip, cidr.prefix()).ok())
                    .collect())
            }
            Took::Missing | Took::NotOurs => Ok(Vec::new()),
            Took::Corrupt(e) => Err(e.into()),
        }
    }

    /// Assigns the specific address `ip` to `handle` on `host`, claiming its block if nobody has it.
    pub async fn assign_ip(
        &self,
        ip: IpAddr,
        handle: &str,
        attrs: std::collections::BTreeMap<String, String>,
        host: &str,
        intended_use: Option<IpUse>,
    ) -> Result<IpNetwork, IpamError> {
        check_name("host", host)?;
        check_name("handle", sanitize(handle))?;
        let snap = self.snapshot().await?;
        let pool = pool_for_ip(&snap.pools, ip)
            .ok_or(IpamError::NotInAnyPool { ip })?
            .clone();
        if let Some(u) = intended_use
            && !pool.allows(u)
        {
            return Err(IpamError::NoQualifiedPool {
                family: pool.family(),
                why: format!("pool {:?} holding {ip} does not allow use {u}", pool.name),
            });
        }
        let cidr = cidr::block_containing(&pool.cidr, pool.block_size, ip)
            .ok_or(IpamError::NotInAnyPool { ip })?;
        let attr = AllocationAttr {
            handle: Some(sanitize(handle).to_owned()),
            attrs,
            released_at: None,
        };
        for _ in 0..RMW_RETRIES {
            if self.store.get(&block_key(&cidr)).await?.is_none() {
                // Claim it for this host; losing the race is fine, the block then exists.
                self.claim_block(host, cidr).await?;
                continue;
            }
            let (bk, hk) = (block_key(&cidr), handle_key(handle));
            let (bk2, hk2) = (bk.clone(), hk.clone());
            let attr = attr.clone();
            let reservations = Arc::clone(&snap.reservations);
            let strict_host = snap.config.strict_affinity.then(|| host.to_owned());
            let (now, cooldown) = (self.clock.now(), snap.config.ip_cooldown_seconds);
            let hid = sanitize(handle).to_owned();
            let r: Result<bool, IpamError> = self
                .store
                .read_modify_write(vec![bk, hk], move |cur| {
                    let keep = vec![Write::Keep, Write::Keep];
                    let mut block: Block = match cur[0].as_deref().map(|v| decode_block(&bk2, v)) {
                        None => return (keep, Ok(false)),
                        Some(Err(e)) => return (keep, Err(e.into())),
                        Some(Ok(b)) => b,
                    };
                    if let Some(h) = &strict_host
                        && !block.is_affine_to(h)
                    {
                        let e = IpamError::NotAffine {
                            block: block.cidr,
                            host: h.clone(),
                        };
                        return (keep, Err(e));
                    }
                    let mut handle: Handle = match cur[1].as_deref().map(|v| decode(&hk2, v)) {
                        None => Handle {
                            id: hid.clone(),
                            ..Handle::default()
                        },
                        Some(Err(e)) => return (keep, Err(e.into())),
                        Some(Ok(h)) => h,
                    };
                    block.garbage_collect(now, cooldown);
                    if let Err(e) = block.assign_ip(ip, &attr, &reservations) {
                        return (keep, Err(IpamError::block(block.cidr, e)));
                    }
                    block.touch();
                    handle.deleted = false;
                    handle.add(&block.key_name(), 1);
                    (
                        vec![Write::Put(encode(&block)), Write::Put(encode(&handle))],
                        Ok(true),
                    )
                })
                .await?;
            if r? {
                return IpNetwork::new(ip, cidr.prefix())
                    .map_err(|_| IpamError::NotInAnyPool { ip });
            }
        }
        Err(IpamError::TooManyRetries {
            what: format!("block {cidr}"),
            retries: RMW_RETRIES,
        })
    }

    /// Every address held by `handle`.
    pub async fn ips_by_handle(&self, handle: &str) -> Result<Vec<IpNetwork>, IpamError> {
        let hkey = handle_key(handle);
        let Some((h, _)) = self.get_obj::<Handle>(&hkey).await? else {
            return Err(IpamError::HandleNotFound {
                handle: handle.to_owned(),
            });
        };
        let mut out = Vec::new();
        for name in h.blocks.keys() {
            let Some((b, _)) = self
                .get_obj::<Block>(&Key::new(Kind::Block, name.clone()))
                .await?
            else {
                continue;
            };
            for o in b.live_ordinals() {
                if b.attr_of(o).and_then(|a| a.handle.as_deref()) == Some(sanitize(handle))
                    && let Ok(n) = IpNetwork::new(b.ip(o), b.cidr.prefix())
                {
                    out.push(n);
                }
            }
        }
        Ok(out)
    }

    async fn handle_family_ips(
        &self,
        handle: &str,
        family: Family,
    ) -> Result<Vec<IpNetwork>, IpamError> {
        match self.ips_by_handle(handle).await {
            Ok(v) => Ok(v.into_iter().filter(|n| Family::of(n) == family).collect()),
            Err(IpamError::HandleNotFound { .. }) => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }
}

/// Checks a host or handle name: non-empty, no `/`, no whitespace, at most 253 bytes.
pub(crate) fn check_name(what: &str, v: &str) -> Result<(), IpamError> {
    let ok =
        !v.is_empty() && v.len() <= 253 && !v.contains('/') && !v.chars().any(char::is_whitespace);
    if ok {
        Ok(())
    } else {
        Err(IpamError::InvalidArgument {
            what: format!("{what} {v:?} is not valid"),
            fix: format!("give a non-empty {what} of at most 253 characters without '/' or spaces"),
        })
    }
}
