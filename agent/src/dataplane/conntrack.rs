//! Conntrack upkeep: the programs write `ct4`/`ct6`; the agent sweeps expired entries (batch
//! lookups and deletes) with the timeouts of its flags, so LRU eviction stays a last resort, and
//! reports map pressure. Also lists and flushes for `weir bpf ct`.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::AsFd as _,
    path::Path,
    time::Duration,
};

use aya::{Pod, maps::MapData};
use maps_schema::{
    CtEntry,
    conntrack::{
        Ct4Key, Ct6Key, FLAG_TCP_FIN_DST, FLAG_TCP_FIN_SRC, FLAG_TCP_RST, FLAG_TCP_SYN_ACK,
    },
};
use serde::{Deserialize, Serialize};

use super::{batch, kernel::KernelError};
use crate::paths::Paths;

/// Sweep timeouts (agent flags).
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub struct CtTimeouts {
    /// TCP before the handshake completes.
    pub tcp_syn: Duration,
    /// TCP after the handshake.
    pub tcp_established: Duration,
    /// TCP after both FINs or an RST.
    pub tcp_closed: Duration,
    /// ICMP and ICMPv6.
    pub icmp: Duration,
    /// UDP and everything else.
    pub other: Duration,
}

impl Default for CtTimeouts {
    fn default() -> Self {
        use maps_schema::conntrack as c;
        Self {
            tcp_syn: Duration::from_secs(c::TIMEOUT_TCP_SYN_SECS),
            tcp_established: Duration::from_secs(c::TIMEOUT_TCP_ESTABLISHED_SECS),
            tcp_closed: Duration::from_secs(c::TIMEOUT_TCP_CLOSED_SECS),
            icmp: Duration::from_secs(c::TIMEOUT_ICMP_SECS),
            other: Duration::from_secs(c::TIMEOUT_OTHER_SECS),
        }
    }
}

impl CtTimeouts {
    /// The timeout of an entry of `protocol`.
    #[must_use]
    pub fn of(&self, protocol: u8, entry: &CtEntry) -> Duration {
        let f = entry.flags;
        match protocol {
            6 if f & FLAG_TCP_RST != 0
                || (f & FLAG_TCP_FIN_SRC != 0 && f & FLAG_TCP_FIN_DST != 0) =>
            {
                self.tcp_closed
            }
            6 if f & FLAG_TCP_SYN_ACK != 0 => self.tcp_established,
            6 => self.tcp_syn,
            1 | 58 => self.icmp,
            _ => self.other,
        }
    }
}

/// Counters of the sweeps, per family.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CtStats {
    /// Sweeps done.
    pub sweeps: u64,
    /// Expired entries removed, IPv4.
    pub expired4: u64,
    /// Expired entries removed, IPv6.
    pub expired6: u64,
    /// Entries at the last sweep, IPv4.
    pub entries4: u64,
    /// Entries at the last sweep, IPv6.
    pub entries6: u64,
    /// Capacity of `ct4`.
    pub max4: u64,
    /// Capacity of `ct6`.
    pub max6: u64,
}

/// One conntrack entry as operators read it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct CtView {
    /// Protocol number.
    pub protocol: u8,
    /// One end.
    pub a: String,
    /// The other end.
    pub b: String,
    /// State flags (see `maps_schema::conntrack`).
    pub flags: u32,
    /// Seconds since the last packet.
    pub idle_secs: u64,
}

/// `CLOCK_MONOTONIC_COARSE` now, in nanoseconds (the programs' clock).
#[must_use]
pub fn now_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC_COARSE).map_or(0, |t| {
        u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000
            + u64::try_from(t.tv_nsec()).unwrap_or(0)
    })
}

fn open(name: &str, path: &Path) -> Result<MapData, KernelError> {
    MapData::from_pin(path).map_err(|source| KernelError::OpenMap {
        path: format!("{name} at {}", path.display()),
        source: Box::new(source),
    })
}

fn io_err(map: &str, op: &'static str, e: std::io::Error) -> KernelError {
    KernelError::Attach {
        op,
        what: map.to_owned(),
        source: Box::new(e),
    }
}

fn entries<K: Pod>(name: &str, map: &MapData) -> Result<Vec<(K, CtEntry)>, KernelError> {
    batch::lookup_all::<K, CtEntry>(map.fd().as_fd()).map_err(|e| io_err(name, "read", e))
}

/// Removes expired entries from one map; returns (expired, remaining, capacity).
fn sweep_map<K: Pod>(
    name: &str,
    path: &Path,
    timeouts: &CtTimeouts,
    protocol: impl Fn(&K) -> u8,
) -> Result<(u64, u64, u64), KernelError> {
    let map = open(name, path)?;
    let max = map
        .info()
        .map(|i| u64::from(i.max_entries()))
        .unwrap_or_default();
    let all = entries::<K>(name, &map)?;
    let now = now_ns();
    let expired: Vec<K> = all
        .iter()
        .filter(|(k, v)| {
            now.saturating_sub(v.last_seen_ns)
                > u64::try_from(timeouts.of(protocol(k), v).as_nanos()).unwrap_or(u64::MAX)
        })
        .map(|(k, _)| *k)
        .collect();
    let deleted =
        batch::delete(map.fd().as_fd(), &expired).map_err(|e| io_err(name, "delete", e))?;
    let deleted = u64::try_from(deleted).unwrap_or(0);
    Ok((
        deleted,
        u64::try_from(all.len())
            .unwrap_or(0)
            .saturating_sub(deleted),
        max,
    ))
}

/// Sweeps both families once.
pub fn sweep(paths: &Paths, timeouts: &CtTimeouts, stats: &mut CtStats) -> Result<(), KernelError> {
    use maps_schema::maps::{CT4, CT6};
    let (e4, n4, m4) = sweep_map::<Ct4Key>(CT4, &paths.map_pin(CT4), timeouts, |k| k.protocol)?;
    let (e6, n6, m6) = sweep_map::<Ct6Key>(CT6, &paths.map_pin(CT6), timeouts, |k| k.protocol)?;
    stats.sweeps += 1;
    stats.expired4 += e4;
    stats.expired6 += e6;
    (stats.entries4, stats.entries6, stats.max4, stats.max6) = (n4, n6, m4, m6);
    Ok(())
}

fn endpoint(addr: IpAddr, port: u16, protocol: u8) -> String {
    match (addr, protocol) {
        (_, 1 | 58) => addr.to_string(),
        (IpAddr::V6(a), _) => format!("[{a}]:{port}"),
        (IpAddr::V4(a), _) => format!("{a}:{port}"),
    }
}

/// Every entry of both families, for `weir bpf ct list`.
pub fn list(paths: &Paths) -> Result<Vec<CtView>, KernelError> {
    use maps_schema::maps::{CT4, CT6};
    let now = now_ns();
    let idle = |e: &CtEntry| now.saturating_sub(e.last_seen_ns) / 1_000_000_000;
    let mut out = Vec::new();
    for (k, v) in entries::<Ct4Key>(CT4, &open(CT4, &paths.map_pin(CT4))?)? {
        out.push(CtView {
            protocol: k.protocol,
            a: endpoint(IpAddr::V4(Ipv4Addr::from(k.addr_a)), k.port_a, k.protocol),
            b: endpoint(IpAddr::V4(Ipv4Addr::from(k.addr_b)), k.port_b, k.protocol),
            flags: v.flags,
            idle_secs: idle(&v),
        });
    }
    for (k, v) in entries::<Ct6Key>(CT6, &open(CT6, &paths.map_pin(CT6))?)? {
        out.push(CtView {
            protocol: k.protocol,
            a: endpoint(IpAddr::V6(Ipv6Addr::from(k.addr_a)), k.port_a, k.protocol),
            b: endpoint(IpAddr::V6(Ipv6Addr::from(k.addr_b)), k.port_b, k.protocol),
            flags: v.flags,
            idle_secs: idle(&v),
        });
    }
    Ok(out)
}

/// Deletes every entry (`weir bpf ct flush`); returns how many.
pub fn flush(paths: &Paths) -> Result<u64, KernelError> {
    use maps_schema::maps::{CT4, CT6};
    let m4 = open(CT4, &paths.map_pin(CT4))?;
    let k4: Vec<Ct4Key> = entries::<Ct4Key>(CT4, &m4)?
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    let m6 = open(CT6, &paths.map_pin(CT6))?;
    let k6: Vec<Ct6Key> = entries::<Ct6Key>(CT6, &m6)?
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    let n = batch::delete(m4.fd().as_fd(), &k4).map_err(|e| io_err(CT4, "delete", e))?
        + batch::delete(m6.fd().as_fd(), &k6).map_err(|e| io_err(CT6, "delete", e))?;
    Ok(u64::try_from(n).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_follow_tcp_state() {
        let t = CtTimeouts::default();
        let e = |flags| CtEntry {
            last_seen_ns: 0,
            flags,
            _reserved: 0,
        };
        assert_eq!(t.of(6, &e(0)), t.tcp_syn);
        assert_eq!(t.of(6, &e(FLAG_TCP_SYN_ACK)), t.tcp_established);
        assert_eq!(
            t.of(
                6,
                &e(FLAG_TCP_SYN_ACK | FLAG_TCP_FIN_SRC | FLAG_TCP_FIN_DST)
            ),
            t.tcp_closed
        );
        assert_eq!(t.of(6, &e(FLAG_TCP_RST)), t.tcp_closed);
        assert_eq!(t.of(17, &e(0)), t.other);
        assert_eq!(t.of(58, &e(0)), t.icmp);
    }
}
