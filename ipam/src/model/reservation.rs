//! Reserved ranges: addresses inside pools that are never handed out.

use std::net::IpAddr;

use ipnetwork::IpNetwork;
use serde::{Deserialize, Serialize};

/// A named set of reserved CIDRs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Reservation {
    /// The reservation's name.
    pub name: String,
    /// The reserved networks.
    #[schemars(with = "Vec<String>")]
    pub reserved_cidrs: Vec<IpNetwork>,
}

/// Whether any reservation covers `ip`.
pub fn is_reserved(reservations: &[Reservation], ip: IpAddr) -> bool {
    reservations
        .iter()
        .flat_map(|r| &r.reserved_cidrs)
        .any(|c| c.contains(ip))
}

/// How many addresses of `net` the reservations cover (overlapping reservations counted once).
pub fn reserved_count(reservations: &[Reservation], net: &IpNetwork) -> u128 {
    let (lo, hi) = (
        crate::cidr::base(net),
        crate::cidr::base(net) + (crate::cidr::size(net) - 1),
    );
    let mut ranges: Vec<(u128, u128)> = reservations
        .iter()
        .flat_map(|r| &r.reserved_cidrs)
        .filter(|c| c.is_ipv4() == net.is_ipv4())
        .filter_map(|c| {
            let (a, b) = (
                crate::cidr::base(c),
                crate::cidr::base(c) + (crate::cidr::size(c) - 1),
            );
            (a <= hi && b >= lo).then_some((a.max(lo), b.min(hi)))
        })
        .collect();
    ranges.sort_unstable();
    let mut total = 0u128;
    let mut cur: Option<(u128, u128)> = None;
    for (a, b) in ranges {
        cur = match cur {
            Some((ca, cb)) if a <= cb.saturating_add(1) => Some((ca, cb.max(b))),
            Some((ca, cb)) => {
                total += cb - ca + 1;
                Some((a, b))
            }
            None => Some((a, b)),
        };
    }
    if let Some((a, b)) = cur {
        total += b - a + 1;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_reservations_count_once() {
        let r = vec![Reservation {
            name: "r".into(),
            reserved_cidrs: ["10.0.0.0/25", "10.0.0.5/32", "10.0.0.64/26", "11.0.0.0/30"]
                .iter()
                .map(|c| c.parse().expect("cidr"))
                .collect(),
        }];
        assert_eq!(
            reserved_count(&r, &"10.0.0.0/24".parse().expect("net")),
            128
        );
        assert_eq!(
            reserved_count(&r, &"10.0.0.64/26".parse().expect("net")),
            64
        );
        assert_eq!(
            reserved_count(&r, &"10.0.0.128/26".parse().expect("net")),
            0
        );
    }
}
