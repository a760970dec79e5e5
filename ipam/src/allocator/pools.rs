//! Pool management: add, list, delete, with the checks an operator needs.

use std::net::IpAddr;

use ipnetwork::IpNetwork;

use super::{Ipam, encode};
use crate::{
    IpamError,
    cidr::{self, Family},
    model::{Block, IpPool},
    store::{Key, Kind, Op, Store},
};

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
}

/// Parses a CIDR the way an operator writes it, refusing host bits.
pub fn parse_pool_cidr(name: &str, s: &str) -> Result<IpNetwork, IpamError> {
    let net: IpNetwork = s.trim().parse().map_err(|_| IpamError::InvalidPool {
        name: name.to_owned(),
        reason: format!("{s:?} is not a CIDR: write it as ADDRESS/PREFIX, for example 10.244.0.0/16 or fd00:10::/64"),
    })?;
    let norm = cidr::normalize(&net);
    if norm.ip() != net.ip() {
        return Err(IpamError::InvalidPool {
            name: name.to_owned(),
            reason: format!("{s} has host bits set: write {norm}"),
        });
    }
    Ok(norm)
}

impl<S: Store + Clone> Ipam<S> {
    /// Every pool, by name.
    pub async fn pools(&self) -> Result<Vec<IpPool>, IpamError> {
        Ok(self
            .list_objs(Kind::Pool, "")
            .await?
            .into_iter()
            .map(|(p, _)| p)
            .collect())
    }

    /// The pool called `name`.
    pub async fn pool(&self, name: &str) -> Result<IpPool, IpamError> {
        let pools = self.pools().await?;
        find_pool(&pools, name).cloned()
    }

    /// Adds a pool after checking its CIDR, block size, selectors and overlap with every other pool.
    pub async fn add_pool(&self, pool: IpPool) -> Result<IpPool, IpamError> {
        let invalid = |reason: String| IpamError::InvalidPool {
            name: pool.name.clone(),
            reason,
        };
        if !valid_name(&pool.name) {
            return Err(invalid(
                "a pool name is lowercase letters, digits, '-' and '.': rename it".into(),
            ));
        }
        if cidr::normalize(&pool.cidr).ip() != pool.cidr.ip() {
            return Err(invalid(format!(
                "{} has host bits set: write {}",
                pool.cidr,
                cidr::normalize(&pool.cidr)
            )));
        }
        let family = Family::of(&pool.cidr);
        let min = pool.cidr.prefix().max(family.min_block_size());
        if pool.block_size < min || pool.block_size > family.bits() {
            return Err(invalid(format!(
                "block size /{} does not fit {}: choose a block size from /{min} to /{}",
                pool.block_size,
                pool.cidr,
                family.bits()
            )));
        }
        for sel in [&pool.node_selector, &pool.namespace_selector] {
            crate::model::Selector::parse(sel).map_err(|e| invalid(e.to_string()))?;
        }
        if pool.allowed_uses.is_empty() {
            return Err(invalid(
                "allowed uses is empty: list workload, tunnel and/or loadbalancer".into(),
            ));
        }
        let existing = self.pools().await?;
        if existing.iter().any(|p| p.name == pool.name) {
            return Err(IpamError::PoolExists {
                name: pool.name.clone(),
            });
        }
        if let Some(o) = existing
            .iter()
            .find(|p| cidr::overlaps(&p.cidr, &pool.cidr))
        {
            return Err(IpamError::PoolOverlap {
                name: pool.name.clone(),
                cidr: pool.cidr,
                other: o.name.clone(),
                other_cidr: o.cidr,
            });
        }
        let key = Key::new(Kind::Pool, pool.name.clone());
        match self
            .store
            .txn(vec![Op::Create {
                key,
                value: encode(&pool),
            }])
            .await
        {
            Ok(()) => Ok(pool),
            Err(e) if e.is_conflict() => Err(IpamError::PoolExists {
                name: pool.name.clone(),
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes a pool. Its empty blocks and their affinities go with it; a pool with addresses in use is
    /// refused unless `force` (then its blocks stay until their addresses are released).
    pub async fn delete_pool(&self, name: &str, force: bool) -> Result<IpPool, IpamError> {
        let key = Key::new(Kind::Pool, name);
        let Some((pool, rev)) = self.get_obj::<IpPool>(&key).await? else {
            let known = self
                .pools()
                .await?
                .iter()
                .map(|p| p.name.clone())
                .collect::<Vec<_>>()
                .join(", ");
            return Err(IpamError::UnknownPool {
                name: name.to_owned(),
                known,
            });
        };
        let blocks: Vec<Block> = self
            .list_objs::<Block>(Kind::Block, "")
            .await?
            .into_iter()
            .map(|(b, _)| b)
            .filter(|b| cidr::contains_net(&pool.cidr, &b.cidr))
            .collect();
        let in_use: u64 = blocks.iter().map(|b| u64::from(b.in_use())).sum();
        if in_use > 0 && !force {
            return Err(IpamError::PoolInUse {
                name: name.to_owned(),
                in_use,
            });
        }
        self.store
            .txn(vec![Op::Delete { key, revision: rev }])
            .await?;
        for b in blocks.iter().filter(|b| b.is_empty()) {
            if let Some(host) = b.affinity.as_deref().and_then(|a| a.strip_prefix("host:")) {
                // Best effort: a block that changed meanwhile stays, and `check` reports it.
                if let Err(e) = self.release_affinity(host, b.cidr, true).await {
                    tracing::debug!(block = %b.cidr, error = %e, "left a block of a deleted pool in place");
                }
            }
        }
        Ok(pool)
    }
}

pub(crate) fn find_pool<'a>(pools: &'a [IpPool], name: &str) -> Result<&'a IpPool, IpamError> {
    pools
        .iter()
        .find(|p| p.name == name)
        .ok_or_else(|| IpamError::UnknownPool {
            name: name.to_owned(),
            known: if pools.is_empty() {
                "there are none".to_owned()
            } else {
                pools
                    .iter()
                    .map(|p| p.name.clone())
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        })
}

/// The pool holding `ip` (pools never overlap).
pub(crate) fn pool_for_ip(pools: &[IpPool], ip: IpAddr) -> Option<&IpPool> {
    pools.iter().find(|p| p.cidr.contains(ip))
}
