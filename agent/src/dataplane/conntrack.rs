//! Conntrack upkeep: the programs write `ct4`/`ct6`; the agent sweeps expired entries (batch
//! lookups and deletes) with the timeouts of its flags, so LRU eviction stays a last resort, and
//! reports map pressure. Also lists and flushes for `weir bpf ct`.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::AsFd as _,
    path::Path,
    time::Duration,
};

use aya::maps::MapData;
use bytemuck::Pod;
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
    #[serde(serialize_with = "crate::config::seconds")]
    pub tcp_syn: Duration,
    /// TCP after the handshake.
    #[serde(serialize_with = "crate::config::seconds")]
    pub tcp_established: Duration,
    /// TCP after both FINs or an RST.
    #[serde(serialize_with = "crate::config::seconds")]
    pub tcp_closed: Duration,
    /// ICMP and ICMPv6.
    #[serde(serialize_with = "crate::config::seconds")]
    pub icmp: Duration,
    /// UDP and everything else.
    #[serde(serialize_with = "crate::config::seconds")]
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
    /// Entries the programs created, IPv4 (from `ct_events`, since the pin was created).
    pub created4: u64,
    /// Entries the programs created, IPv6.
    pub created6: u64,
    /// LRU evictions, IPv4: entries created since the last sweep that neither remain nor were
    /// removed by the agent (within the few created while a sweep reads the map).
    pub evicted4: u64,
    /// LRU evictions, IPv6.
    pub evicted6: u64,
    /// (created4, created6, entries4, entries6) after the last sweep; `None` after a flush.
    #[serde(skip)]
    pub baseline: Option<[u64; 4]>,
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
    /// Seconds since the first packet (since the last packet for entries converted from
    /// conntrack layout 1, which did not record it).
    #[serde(default)]
    pub age_secs: u64,
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

/// The pin names of the conntrack maps of layout `layout` (`ct4_v2`, `ct6_v2`).
#[must_use]
pub fn map_names(layout: u32) -> (String, String) {
    use maps_schema::maps::{CT4_STEM, CT6_STEM};
    (
        format!("{CT4_STEM}_v{layout}"),
        format!("{CT6_STEM}_v{layout}"),
    )
}

fn entries<K: Pod>(name: &str, map: &MapData) -> Result<Vec<(K, CtEntry)>, KernelError> {
    let layout = maps_schema::maps::layout_version(name).unwrap_or(maps_schema::conntrack::LAYOUT);
    super::ct_layout::read::<K>(map.fd().as_fd(), layout).map_err(|e| io_err(name, "read", e))
}

/// Entries the programs created (IPv4, IPv6), summed over CPUs; `None` without the pin.
fn read_created(paths: &Paths) -> Option<[u64; 2]> {
    use maps_schema::conntrack::{EVENT_CREATED4, EVENT_CREATED6};
    let data = MapData::from_pin(paths.map_pin(maps_schema::maps::CT_EVENTS)).ok()?;
    let array =
        aya::maps::PerCpuArray::<_, u64>::try_from(aya::maps::Map::PerCpuArray(data)).ok()?;
    let sum = |i: u32| array.get(&i, 0).ok().map(|v| v.iter().sum::<u64>());
    Some([sum(EVENT_CREATED4)?, sum(EVENT_CREATED6)?])
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

/// Sweeps both families (conntrack layout `layout`) once.
pub fn sweep(
    paths: &Paths,
    layout: u32,
    timeouts: &CtTimeouts,
    stats: &mut CtStats,
) -> Result<(), KernelError> {
    let (ct4, ct6) = map_names(layout);
    // Read before the maps: an entry created meanwhile is then counted as present, not evicted.
    let created = read_created(paths);
    let (e4, n4, m4) = sweep_map::<Ct4Key>(&ct4, &paths.map_pin(&ct4), timeouts, |k| k.protocol)?;
    let (e6, n6, m6) = sweep_map::<Ct6Key>(&ct6, &paths.map_pin(&ct6), timeouts, |k| k.protocol)?;
    if let Some([c4, c6]) = created {
        if let Some([p4, p6, q4, q6]) = stats.baseline {
            // created = Δentries + removed by the agent + evicted.
            let evicted = |c: u64, p: u64, n: u64, q: u64, e: u64| {
                (i128::from(c) - i128::from(p) - (i128::from(n) - i128::from(q)) - i128::from(e))
                    .clamp(0, i128::from(u64::MAX))
            };
            stats.evicted4 += u64::try_from(evicted(c4, p4, n4, q4, e4)).unwrap_or(0);
            stats.evicted6 += u64::try_from(evicted(c6, p6, n6, q6, e6)).unwrap_or(0);
        }
        (stats.created4, stats.created6) = (c4, c6);
        stats.baseline = Some([c4, c6, n4, n6]);
    }
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

/// Every entry of both families (conntrack layout `layout`), for `weir bpf ct list`.
pub fn list(paths: &Paths, layout: u32) -> Result<Vec<CtView>, KernelError> {
    let (ct4, ct6) = map_names(layout);
    let now = now_ns();
    let idle = |e: &CtEntry| now.saturating_sub(e.last_seen_ns) / 1_000_000_000;
    let age = |e: &CtEntry| now.saturating_sub(e.created_ns) / 1_000_000_000;
    let mut out = Vec::new();
    for (k, v) in entries::<Ct4Key>(&ct4, &open(&ct4, &paths.map_pin(&ct4))?)? {
        out.push(CtView {
            protocol: k.protocol,
            a: endpoint(IpAddr::V4(Ipv4Addr::from(k.addr_a)), k.port_a, k.protocol),
            b: endpoint(IpAddr::V4(Ipv4Addr::from(k.addr_b)), k.port_b, k.protocol),
            flags: v.flags,
            idle_secs: idle(&v),
            age_secs: age(&v),
        });
    }
    for (k, v) in entries::<Ct6Key>(&ct6, &open(&ct6, &paths.map_pin(&ct6))?)? {
        out.push(CtView {
            protocol: k.protocol,
            a: endpoint(IpAddr::V6(Ipv6Addr::from(k.addr_a)), k.port_a, k.protocol),
            b: endpoint(IpAddr::V6(Ipv6Addr::from(k.addr_b)), k.port_b, k.protocol),
            flags: v.flags,
            idle_secs: idle(&v),
            age_secs: age(&v),
        });
    }
    Ok(out)
}

/// Deletes every entry (conntrack layout `layout`, `weir bpf ct flush`); returns how many.
pub fn flush(paths: &Paths, layout: u32) -> Result<u64, KernelError> {
    let (ct4, ct6) = map_names(layout);
    let (ct4, ct6) = (ct4.as_str(), ct6.as_str());
    let m4 = open(ct4, &paths.map_pin(ct4))?;
    let k4: Vec<Ct4Key> = entries::<Ct4Key>(ct4, &m4)?
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    let m6 = open(ct6, &paths.map_pin(ct6))?;
    let k6: Vec<Ct6Key> = entries::<Ct6Key>(ct6, &m6)?
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    let n = batch::delete(m4.fd().as_fd(), &k4).map_err(|e| io_err(ct4, "delete", e))?
        + batch::delete(m6.fd().as_fd(), &k6).map_err(|e| io_err(ct6, "delete", e))?;
    Ok(u64::try_from(n).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_follow_tcp_state() {
        let t = CtTimeouts::default();
        let e = |flags| CtEntry::new(0, flags);
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
