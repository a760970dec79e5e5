//! Read-only views: utilisation (reservation-aware), blocks, one address.

use std::{collections::BTreeMap, net::IpAddr};

use ipnetwork::IpNetwork;
use serde::{Deserialize, Serialize};

use super::{Ipam, claim::block_key, pools::pool_for_ip};
use crate::{
    IpamError, cidr,
    model::{
        Block,
        reservation::{is_reserved, reserved_count},
    },
    store::{Kind, Store},
};

/// Capacity, use and reservations of a pool or block. `in_use` and `reserved` may overlap, so
/// `available = capacity − |in use ∪ reserved ∪ cooling|`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Utilization {
    /// Pool name (or the block's pool).
    pub pool: String,
    /// The pool or block CIDR.
    pub cidr: IpNetwork,
    /// Addresses in the range.
    #[serde(serialize_with = "big", deserialize_with = "big_de")]
    pub capacity: u128,
    /// Addresses allocated.
    #[serde(serialize_with = "big", deserialize_with = "big_de")]
    pub in_use: u128,
    /// Addresses reserved.
    #[serde(serialize_with = "big", deserialize_with = "big_de")]
    pub reserved: u128,
    /// Addresses that could be handed out now or after their cooldown.
    #[serde(serialize_with = "big", deserialize_with = "big_de")]
    pub available: u128,
    /// Per block (filled when asked for).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocks: Vec<Utilization>,
}

/// A count as a JSON number while it fits in 64 bits, as a decimal string beyond (IPv6 pools).
fn big<S: serde::Serializer>(v: &u128, s: S) -> Result<S::Ok, S::Error> {
    match u64::try_from(*v) {
        Ok(n) => s.serialize_u64(n),
        Err(_) => s.serialize_str(&v.to_string()),
    }
}

/// Reads what [`big`] wrote: a number, or a decimal string.
fn big_de<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u128, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Big {
        Number(u64),
        Text(String),
    }
    match Big::deserialize(d)? {
        Big::Number(n) => Ok(u128::from(n)),
        Big::Text(t) => t.parse().map_err(serde::de::Error::custom),
    }
}

/// One block as `show --show-blocks` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockSummary {
    /// The block.
    pub cidr: IpNetwork,
    /// `host:<name>` or none (borrowable).
    pub affinity: Option<String>,
    /// Live allocations.
    pub in_use: u32,
    /// Free addresses (reservations not subtracted).
    pub free: u32,
    /// Sequence number.
    pub sequence_number: u64,
}

/// What the IPAM knows about one address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddressInfo {
    /// The address.
    pub ip: IpAddr,
    /// Its pool, if any.
    pub pool: Option<String>,
    /// Its block, if the block exists.
    pub block: Option<IpNetwork>,
    /// The block's affinity.
    pub block_affinity: Option<String>,
    /// `allocated`, `cooling`, `free`, `reserved`, `no-block`, `not-in-pool`.
    pub state: String,
    /// The handle holding it.
    pub handle: Option<String>,
    /// Owner attributes.
    pub attrs: BTreeMap<String, String>,
    /// The ordinal's sequence number (pass it to a release to guard against reuse).
    pub sequence_number: Option<u64>,
}

impl<S: Store + Clone> Ipam<S> {
    /// Every block (soft-deleted ones skipped).
    pub async fn blocks(&self) -> Result<Vec<Block>, IpamError> {
        Ok(self
            .list_objs::<Block>(Kind::Block, "")
            .await?
            .into_iter()
            .map(|(b, _)| b)
            .filter(|b| !b.deleted)
            .collect())
    }

    /// Block summaries.
    pub async fn block_summaries(&self) -> Result<Vec<BlockSummary>, IpamError> {
        Ok(self
            .blocks()
            .await?
            .into_iter()
            .map(|b| BlockSummary {
                cidr: b.cidr,
                affinity: b.affinity.clone(),
                in_use: b.in_use(),
                free: b.free_count(&[]),
                sequence_number: b.sequence_number,
            })
            .collect())
    }

    /// Utilisation per pool, and per block with `per_block`.
    pub async fn utilization(&self, per_block: bool) -> Result<Vec<Utilization>, IpamError> {
        let pools = self.pools().await?;
        let reservations = self.reservations().await?;
        let blocks = self.blocks().await?;
        let mut out = Vec::new();
        for p in &pools {
            let mut u = Utilization {
                pool: p.name.clone(),
                cidr: p.cidr,
                capacity: cidr::size(&p.cidr),
                in_use: 0,
                reserved: reserved_count(&reservations, &p.cidr),
                available: 0,
                blocks: Vec::new(),
            };
            let mut busy_unreserved = 0u128;
            for b in blocks
                .iter()
                .filter(|b| cidr::contains_net(&p.cidr, &b.cidr))
            {
                let busy: Vec<u32> = (0..b.len())
                    .filter(|&o| b.allocations[o as usize].is_some())
                    .collect();
                let busy_unres = busy
                    .iter()
                    .filter(|&&o| !is_reserved(&reservations, b.ip(o)))
                    .count() as u128;
                let in_use = u128::from(b.in_use());
                let reserved = reserved_count(&reservations, &b.cidr);
                u.in_use += in_use;
                busy_unreserved += busy_unres;
                if per_block {
                    let cap = cidr::size(&b.cidr);
                    u.blocks.push(Utilization {
                        pool: p.name.clone(),
                        cidr: b.cidr,
                        capacity: cap,
                        in_use,
                        reserved,
                        available: cap - reserved - busy_unres,
                        blocks: Vec::new(),
                    });
                }
            }
            u.available = u.capacity - u.reserved - busy_unreserved;
            out.push(u);
        }
        Ok(out)
    }

    /// What the IPAM knows about `ip`.
    pub async fn address_info(&self, ip: IpAddr) -> Result<AddressInfo, IpamError> {
        let pools = self.pools().await?;
        let reservations = self.reservations().await?;
        let pool = pool_for_ip(&pools, ip);
        let mut info = AddressInfo {
            ip,
            pool: pool.map(|p| p.name.clone()),
            block: None,
            block_affinity: None,
            state: "not-in-pool".into(),
            handle: None,
            attrs: BTreeMap::new(),
            sequence_number: None,
        };
        let block = match pool.and_then(|p| cidr::block_containing(&p.cidr, p.block_size, ip)) {
            Some(c) => self.get_obj::<Block>(&block_key(&c)).await?.map(|(b, _)| b),
            None => self
                .blocks()
                .await?
                .into_iter()
                .find(|b| b.cidr.contains(ip)),
        };
        let Some(b) = block else {
            if pool.is_some() {
                info.state = if is_reserved(&reservations, ip) {
                    "reserved"
                } else {
                    "no-block"
                }
                .into();
            }
            return Ok(info);
        };
        info.block = Some(b.cidr);
        info.block_affinity = b.affinity.clone();
        let Some(o) = cidr::ordinal(&b.cidr, ip) else {
            return Ok(info);
        };
        info.sequence_number = b.sequence_number_for_allocation.get(&o).copied();
        info.state = match (
            b.allocations.get(o as usize).copied().flatten(),
            b.attr_of(o),
        ) {
            (_, Some(a)) => {
                info.handle = a.handle.clone();
                info.attrs = a.attrs.clone();
                "allocated"
            }
            (Some(_), None) => "cooling",
            (None, None) if is_reserved(&reservations, ip) => "reserved",
            (None, None) => "free",
        }
        .into();
        Ok(info)
    }
}
