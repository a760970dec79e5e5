//! Address arithmetic: blocks inside pools, ordinals inside blocks, datastore names for CIDRs.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnetwork::IpNetwork;

/// The family of an address or network.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl Family {
    /// The family of `net`.
    pub fn of(net: &IpNetwork) -> Self {
        if net.is_ipv4() { Self::V4 } else { Self::V6 }
    }

    /// The family of `ip`.
    pub fn of_ip(ip: IpAddr) -> Self {
        if ip.is_ipv4() { Self::V4 } else { Self::V6 }
    }

    /// Bits in an address of this family.
    pub fn bits(self) -> u8 {
        match self {
            Self::V4 => 32,
            Self::V6 => 128,
        }
    }

    /// The default block size (Calico's /26 and /122).
    pub fn default_block_size(self) -> u8 {
        match self {
            Self::V4 => 26,
            Self::V6 => 122,
        }
    }

    /// The smallest prefix length a block may have (4096 addresses at most per block).
    pub fn min_block_size(self) -> u8 {
        self.bits() - 12
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::V4 => "ipv4",
            Self::V6 => "ipv6",
        })
    }
}

/// The address as an integer.
pub fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// The address of `family` with integer value `v` (truncated to the family's width).
pub fn from_u128(family: Family, v: u128) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::from((v & 0xffff_ffff) as u32)),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(v)),
    }
}

/// The network address of `net` as an integer.
pub fn base(net: &IpNetwork) -> u128 {
    to_u128(net.network())
}

/// How many addresses `net` holds (saturating at `u128::MAX` for a /0 IPv6 network).
pub fn size(net: &IpNetwork) -> u128 {
    let host_bits = u32::from(Family::of(net).bits() - net.prefix());
    1u128.checked_shl(host_bits).unwrap_or(u128::MAX)
}

/// `net` with its host bits cleared.
pub fn normalize(net: &IpNetwork) -> IpNetwork {
    IpNetwork::new(net.network(), net.prefix()).unwrap_or(*net)
}

/// Whether `inner` lies wholly inside `outer`.
pub fn contains_net(outer: &IpNetwork, inner: &IpNetwork) -> bool {
    Family::of(outer) == Family::of(inner)
        && inner.prefix() >= outer.prefix()
        && outer.contains(inner.network())
}

/// Whether two networks share any address.
pub fn overlaps(a: &IpNetwork, b: &IpNetwork) -> bool {
    contains_net(a, b) || contains_net(b, a)
}

/// The block of size `block_size` inside `pool` that holds `ip`, or `None` when `ip` is outside the pool.
pub fn block_containing(pool: &IpNetwork, block_size: u8, ip: IpAddr) -> Option<IpNetwork> {
    if !pool.contains(ip) || block_size < pool.prefix() {
        return None;
    }
    IpNetwork::new(ip, block_size).ok().map(|n| normalize(&n))
}

/// How many blocks of `block_size` the pool holds.
pub fn block_count(pool: &IpNetwork, block_size: u8) -> u128 {
    1u128
        .checked_shl(u32::from(block_size.saturating_sub(pool.prefix())))
        .unwrap_or(u128::MAX)
}

/// The `index`-th block of `block_size` inside `pool`; `None` when there is none (a block size longer
/// than the family's addresses comes only from a corrupt stored pool).
pub fn nth_block(pool: &IpNetwork, block_size: u8, index: u128) -> Option<IpNetwork> {
    let family = Family::of(pool);
    let shift = u32::from(family.bits().checked_sub(block_size)?);
    let offset = index.checked_shl(shift)?;
    let start = base(pool).checked_add(offset)?;
    IpNetwork::new(from_u128(family, start), block_size).ok()
}

/// The ordinal of `ip` inside `block`.
pub fn ordinal(block: &IpNetwork, ip: IpAddr) -> Option<u32> {
    if !block.contains(ip) {
        return None;
    }
    u32::try_from(to_u128(ip) - base(block)).ok()
}

/// The address at `ordinal` inside `block`.
pub fn ip_at(block: &IpNetwork, ordinal: u32) -> IpAddr {
    from_u128(Family::of(block), base(block) + u128::from(ordinal))
}

/// The datastore name of a CIDR: `10.0.0.0-26`, `fd00::-122`.
pub fn cidr_name(net: &IpNetwork) -> String {
    format!("{}-{}", net.network(), net.prefix())
}

/// FNV-1a of a string: a stable per-host seed for the block search order.
pub fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNetwork {
        s.parse().expect("test network")
    }

    /// A fuzz finding (`fuzz/`, target `ipam_records`): a stored IPv4 pool with `blockSize` 52 made the
    /// block search subtract past zero and panic.
    #[test]
    fn a_block_size_longer_than_the_family_has_no_blocks() {
        assert_eq!(nth_block(&net("10.0.0.0/16"), 33, 0), None);
        assert_eq!(nth_block(&net("10.0.0.0/16"), 200, 1), None);
        assert_eq!(nth_block(&net("fd80::/64"), 129, 0), None);
        assert_eq!(
            nth_block(&net("10.0.0.0/16"), 32, 1),
            Some(net("10.0.0.1/32"))
        );
    }

    #[test]
    fn blocks_inside_pools_are_distinct_and_contained() {
        for (pool, bs) in [
            ("10.10.0.0/24", 26u8),
            ("10.10.0.0/24", 32),
            ("10.0.0.0/16", 20),
            ("fd80::/120", 122),
            ("fd80::/120", 128),
            ("fd80::/114", 116),
        ] {
            let pool = net(pool);
            let n = block_count(&pool, bs);
            assert_eq!(n, 1u128 << (bs - pool.prefix()));
            let blocks: std::collections::BTreeSet<_> = (0..n)
                .map(|i| nth_block(&pool, bs, i).expect("block"))
                .collect();
            assert_eq!(blocks.len() as u128, n);
            assert!(
                blocks
                    .iter()
                    .all(|b| contains_net(&pool, b) && b.prefix() == bs)
            );
        }
    }

    #[test]
    fn ordinals_round_trip() {
        let b = net("192.168.1.64/26");
        let ip: IpAddr = "192.168.1.70".parse().expect("ip");
        assert_eq!(ordinal(&b, ip), Some(6));
        assert_eq!(ip_at(&b, 6), ip);
        assert_eq!(ordinal(&b, "192.168.1.1".parse().expect("ip")), None);
        let pool = net("192.168.0.0/16");
        assert_eq!(block_containing(&pool, 26, ip), Some(b));
        assert_eq!(cidr_name(&b), "192.168.1.64-26");
    }

    #[test]
    fn overlap_checks() {
        assert!(overlaps(&net("10.0.0.0/20"), &net("10.0.1.0/24")));
        assert!(!overlaps(&net("10.0.0.0/24"), &net("fd00::/64")));
        assert!(!overlaps(&net("10.0.0.0/25"), &net("10.0.0.128/25")));
    }
}
