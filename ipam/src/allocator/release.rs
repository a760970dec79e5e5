//! Releasing addresses: by address (with sequence-number and handle checks) and by handle.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use ipnetwork::IpNetwork;
use serde::{Deserialize, Serialize};

use super::{Ipam, claim::block_key, decode, decode_block, encode, pools::pool_for_ip};
use crate::{
    IpamError, cidr,
    model::{Block, Handle, ReleaseCheck, handle::sanitize},
    store::{Key, Kind, RMW_RETRIES, Store, Write},
};

/// What a release did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseReport {
    /// Released addresses and the handle each held.
    pub released: Vec<(IpAddr, Option<String>)>,
    /// Addresses that were not allocated (not an error).
    pub not_allocated: Vec<IpAddr>,
}

enum Step {
    Done(ReleaseReport),
    Retry,
    Failed(IpamError),
}

fn handle_key(h: &str) -> Key {
    Key::new(Kind::Handle, sanitize(h))
}

fn handles_of(block: &Block, ips: &[(IpAddr, ReleaseCheck)]) -> BTreeSet<String> {
    ips.iter()
        .filter_map(|(ip, _)| cidr::ordinal(&block.cidr, *ip))
        .filter_map(|o| block.attr_of(o).and_then(|a| a.handle.clone()))
        .collect()
}

impl<S: Store + Clone> Ipam<S> {
    /// Releases addresses. Each block is one atomic write over the block and the handles it held. An address
    /// that is not allocated is reported, not an error; a stale sequence number or a wrong handle refuses that
    /// block's release.
    pub async fn release_ips(
        &self,
        ips: &[(IpAddr, ReleaseCheck)],
    ) -> Result<ReleaseReport, IpamError> {
        let pools = self.pools().await?;
        let cooldown = self.config().await?.ip_cooldown_seconds;
        let mut by_block: BTreeMap<IpNetwork, Vec<(IpAddr, ReleaseCheck)>> = BTreeMap::new();
        let mut report = ReleaseReport::default();
        let mut orphans = Vec::new();
        for (ip, check) in ips {
            match pool_for_ip(&pools, *ip)
                .and_then(|p| cidr::block_containing(&p.cidr, p.block_size, *ip))
            {
                Some(b) => by_block.entry(b).or_default().push((*ip, check.clone())),
                None => orphans.push((*ip, check.clone())),
            }
        }
        if !orphans.is_empty() {
            // Outside every pool (its pool was deleted): find the block the slow way.
            let blocks: Vec<Block> = self
                .list_objs::<Block>(Kind::Block, "")
                .await?
                .into_iter()
                .map(|(b, _)| b)
                .collect();
            for (ip, check) in orphans {
                match blocks.iter().find(|b| b.cidr.contains(ip)) {
                    Some(b) => by_block.entry(b.cidr).or_default().push((ip, check)),
                    None => report.not_allocated.push(ip),
                }
            }
        }
        for (cidr, ips) in by_block {
            let r = self.release_in_block(cidr, ips, cooldown).await?;
            report.released.extend(r.released);
            report.not_allocated.extend(r.not_allocated);
        }
        Ok(report)
    }

    async fn release_in_block(
        &self,
        cidr: IpNetwork,
        ips: Vec<(IpAddr, ReleaseCheck)>,
        cooldown: u64,
    ) -> Result<ReleaseReport, IpamError> {
        // The block has room again (once its cooldown passes): no host skips it as full.
        self.hints.freed(&cidr);
        let bkey = block_key(&cidr);
        for _ in 0..RMW_RETRIES {
            let Some((seen, _)) = self.get_obj::<Block>(&bkey).await? else {
                return Ok(ReleaseReport {
                    released: Vec::new(),
                    not_allocated: ips.iter().map(|(ip, _)| *ip).collect(),
                });
            };
            let handles: Vec<String> = handles_of(&seen, &ips).into_iter().collect();
            let mut keys = vec![bkey.clone()];
            keys.extend(handles.iter().map(|h| handle_key(h)));
            let (bk, hkeys, now, ips2) = (
                bkey.clone(),
                keys[1..].to_vec(),
                self.clock.now(),
                ips.clone(),
            );
            let step = self
                .store
                .read_modify_write(keys, move |cur| {
                    let keep = vec![Write::Keep; cur.len()];
                    let Some(raw) = cur[0].as_deref() else {
                        let not = ips2.iter().map(|(ip, _)| *ip).collect();
                        return (
                            keep,
                            Step::Done(ReleaseReport {
                                released: Vec::new(),
                                not_allocated: not,
                            }),
                        );
                    };
                    let mut block: Block = match decode_block(&bk, raw) {
                        Ok(b) => b,
                        Err(e) => return (keep, Step::Failed(e.into())),
                    };
                    if handles_of(&block, &ips2).into_iter().collect::<Vec<_>>() != handles {
                        return (keep, Step::Retry);
                    }
                    let r = match block.release(&ips2, now, cooldown) {
                        Ok(r) => r,
                        Err(e) => return (keep, Step::Failed(IpamError::block(block.cidr, e))),
                    };
                    if r.released.is_empty() {
                        return (
                            keep,
                            Step::Done(ReleaseReport {
                                released: r.released,
                                not_allocated: r.not_allocated,
                            }),
                        );
                    }
                    let mut writes = Vec::with_capacity(cur.len());
                    if block.is_empty() && block.affinity.is_none() {
                        writes.push(Write::Delete);
                    } else {
                        block.touch();
                        writes.push(Write::Put(encode(&block)));
                    }
                    for (i, hk) in hkeys.iter().enumerate() {
                        let mut h: Handle = cur[i + 1]
                            .as_deref()
                            .and_then(|v| decode(hk, v).ok())
                            .unwrap_or_else(|| Handle {
                                id: hk.name.clone(),
                                ..Handle::default()
                            });
                        let n = r
                            .released
                            .iter()
                            .filter(|(_, rh)| rh.as_deref() == Some(hk.name.as_str()))
                            .count();
                        h.remove(&block.key_name(), n as u32);
                        writes.push(if h.total() == 0 {
                            Write::Delete
                        } else {
                            Write::Put(encode(&h))
                        });
                    }
                    // A handle key that was never stored and is now empty must not be "deleted" (it is absent).
                    for (i, w) in writes.iter_mut().enumerate().skip(1) {
                        if cur[i].is_none() && *w == Write::Delete {
                            *w = Write::Keep;
                        }
                    }
                    (
                        writes,
                        Step::Done(ReleaseReport {
                            released: r.released,
                            not_allocated: r.not_allocated,
                        }),
                    )
                })
                .await?;
            match step {
                Step::Done(r) => return Ok(r),
                Step::Failed(e) => return Err(e),
                Step::Retry => {}
            }
        }
        Err(IpamError::TooManyRetries {
            what: format!("block {cidr}"),
            retries: RMW_RETRIES,
        })
    }

    /// Releases every address held by `handle`; one atomic write per block. A handle that holds nothing is
    /// [`IpamError::HandleNotFound`] (CNI DEL treats that as success).
    pub async fn release_by_handle(&self, handle: &str) -> Result<Vec<IpAddr>, IpamError> {
        let hkey = handle_key(handle);
        let Some((h, _)) = self.get_obj::<Handle>(&hkey).await? else {
            return Err(IpamError::HandleNotFound {
                handle: handle.to_owned(),
            });
        };
        let cooldown = self.config().await?.ip_cooldown_seconds;
        let mut released = Vec::new();
        for name in h.blocks.keys() {
            let bkey = Key::new(Kind::Block, name.clone());
            let (bk, hk, now, hid, name) = (
                bkey.clone(),
                hkey.clone(),
                self.clock.now(),
                sanitize(handle).to_owned(),
                name.clone(),
            );
            let r: Result<Vec<IpAddr>, IpamError> = self
                .store
                .read_modify_write(vec![bkey, hkey.clone()], move |cur| {
                    let keep = vec![Write::Keep, Write::Keep];
                    let mut h: Handle = match cur[1].as_deref().map(|v| decode(&hk, v)) {
                        None => return (keep, Ok(Vec::new())),
                        Some(Err(e)) => return (keep, Err(e.into())),
                        Some(Ok(h)) => h,
                    };
                    let mut ips = Vec::new();
                    let block_write = match cur[0].as_deref().map(|v| decode_block(&bk, v)) {
                        None => Write::Keep,
                        Some(Err(e)) => return (keep, Err(e.into())),
                        Some(Ok(mut b)) => {
                            ips = b.release_by_handle(&hid, None, now, cooldown);
                            if ips.is_empty() {
                                Write::Keep
                            } else if b.is_empty() && b.affinity.is_none() {
                                Write::Delete
                            } else {
                                b.touch();
                                Write::Put(encode(&b))
                            }
                        }
                    };
                    h.blocks.remove(&name);
                    let hw = if h.total() == 0 {
                        Write::Delete
                    } else {
                        Write::Put(encode(&h))
                    };
                    (vec![block_write, hw], Ok(ips))
                })
                .await?;
            let ips = r?;
            for ip in &ips {
                self.hints.freed_addr(*ip);
            }
            released.extend(ips);
        }
        Ok(released)
    }
}
