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
    CtEntry, Nat4Entry, Nat4Key, SvcCt4Entry, SvcCt4Key,
    conntrack::{
        Ct4Key, Ct6Key, FLAG_TCP_FIN_DST, FLAG_TCP_FIN_SRC, FLAG_TCP_RST, FLAG_TCP_SYN_ACK,
    },
    nat::DIR_EGRESS,
    service_ct::SVC_CT4,
};
use serde::{Deserialize, Serialize};

use super::{
    batch,
    kernel::{CtIo, KernelError, ServiceFlows4},
    service_flows,
};
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
    /// (created4, created6, entries4, entries6) after the last sweep; `None` before the first.
    #[serde(skip)]
    pub baseline: Option<[u64; 4]>,
    /// Entries flushed (IPv4, IPv6) since the last sweep: removed by the agent, not evicted.
    #[serde(skip)]
    pub flushed_since_sweep: [u64; 2],
    /// Translated flows' entries (`svc_ct4`) at the last sweep.
    #[serde(default)]
    pub service_flows4: u64,
    /// Capacity of `svc_ct4`.
    #[serde(default)]
    pub service_flows_max4: u64,
    /// `svc_ct4` entries removed because their flow left conntrack (and `nat4`).
    #[serde(default)]
    pub service_flows_expired4: u64,
}

/// One conntrack entry as operators read it (the API contract's).
pub use weir_api::CtView;

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

/// The pin names of the conntrack maps of layout `layout` (`ct4_v3`, `ct6_v3`).
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
    super::ct_layout::read::<K>(map, layout).map_err(|e| io_err(name, "read", e))
}

/// The real [`CtIo`]: the pinned conntrack maps of one layout, opened per operation (a migration
/// may replace the pins), read and deleted with batch syscalls.
pub struct PinnedCt {
    paths: Paths,
    layout: u32,
}

impl PinnedCt {
    /// The conntrack maps of layout `layout` under `paths`.
    #[must_use]
    pub fn new(paths: &Paths, layout: u32) -> Self {
        Self {
            paths: paths.clone(),
            layout,
        }
    }

    fn names(&self) -> (String, String) {
        map_names(self.layout)
    }

    fn read<K: Pod>(&self, name: &str) -> Result<Vec<(K, CtEntry)>, KernelError> {
        entries::<K>(name, &open(name, &self.paths.map_pin(name))?)
    }

    fn delete<K: Pod>(&self, name: &str, keys: &[K]) -> Result<u64, KernelError> {
        if keys.is_empty() {
            return Ok(0);
        }
        let map = open(name, &self.paths.map_pin(name))?;
        let n = batch::delete(map.fd().as_fd(), keys).map_err(|e| io_err(name, "delete", e))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// Every entry of the map pinned as `name` and its capacity; `None` without the pin.
    fn read_if_pinned<K: Pod, V: Pod>(
        &self,
        name: &str,
    ) -> Result<Option<Pinned<K, V>>, KernelError> {
        let Some(map) = open_if_pinned(name, &self.paths.map_pin(name))? else {
            return Ok(None);
        };
        let fd = map.fd().as_fd();
        let entries = batch::lookup_all::<K, V>(fd).map_err(|e| io_err(name, "read", e))?;
        let max = batch::max_entries(fd).map_err(|e| io_err(name, "read", e))?;
        Ok(Some((entries, max)))
    }

    fn max(&self, name: &str) -> Result<u64, KernelError> {
        let map = open(name, &self.paths.map_pin(name))?;
        let info = map.info().map_err(|source| KernelError::MapOp {
            map: name.to_owned(),
            op: "read the capacity of",
            source: Box::new(source),
        })?;
        Ok(u64::from(info.max_entries()))
    }
}

impl CtIo for PinnedCt {
    fn entries4(&self) -> Result<Vec<(Ct4Key, CtEntry)>, KernelError> {
        self.read(&self.names().0)
    }

    fn entries6(&self) -> Result<Vec<(Ct6Key, CtEntry)>, KernelError> {
        self.read(&self.names().1)
    }

    fn delete4(&mut self, keys: &[Ct4Key]) -> Result<u64, KernelError> {
        self.delete(&self.names().0, keys)
    }

    fn delete6(&mut self, keys: &[Ct6Key]) -> Result<u64, KernelError> {
        self.delete(&self.names().1, keys)
    }

    fn capacity(&self) -> Result<(u64, u64), KernelError> {
        let (ct4, ct6) = self.names();
        Ok((self.max(&ct4)?, self.max(&ct6)?))
    }

    fn created(&self) -> Result<Option<[u64; 2]>, KernelError> {
        read_created(&self.paths)
    }

    fn service_flows4(&self) -> Result<Option<ServiceFlows4>, KernelError> {
        Ok(self
            .read_if_pinned::<SvcCt4Key, SvcCt4Entry>(SVC_CT4)?
            .map(|(entries, max)| (entries, u64::from(max))))
    }

    fn delete_service_flows4(&mut self, keys: &[SvcCt4Key]) -> Result<u64, KernelError> {
        self.delete(SVC_CT4, keys)
    }

    fn nat_flows4(&self) -> Result<Vec<Nat4Key>, KernelError> {
        let entries = self
            .read_if_pinned::<Nat4Key, Nat4Entry>(maps_schema::maps::NAT4)?
            .map_or_else(Vec::new, |(entries, _)| entries);
        Ok(entries
            .into_iter()
            .filter(|(k, _)| k.direction == DIR_EGRESS)
            .map(|(k, _)| k)
            .collect())
    }
}

/// A pinned map's entries and capacity.
type Pinned<K, V> = (Vec<(K, V)>, u32);

/// The map pinned at `path`; `None` when there is no such pin.
fn open_if_pinned(name: &str, path: &Path) -> Result<Option<MapData>, KernelError> {
    match MapData::from_pin(path) {
        Ok(map) => Ok(Some(map)),
        Err(e) if is_missing_pin(&e) => Ok(None),
        Err(e) => Err(KernelError::OpenMap {
            path: format!("{name} at {}", path.display()),
            source: Box::new(e),
        }),
    }
}

/// Entries the programs created (IPv4, IPv6), summed over CPUs; `None` without the pin.
fn read_created(paths: &Paths) -> Result<Option<[u64; 2]>, KernelError> {
    use maps_schema::conntrack::{EVENT_CREATED4, EVENT_CREATED6};
    let sums = read_event_sums(
        paths,
        maps_schema::maps::CT_EVENTS,
        &[EVENT_CREATED4, EVENT_CREATED6],
    )?;
    Ok(sums.map(|s| [s[0], s[1]]))
}

/// Slots `slots` of the per-CPU `u64` array pinned as `name` (an events counter the programs
/// bump), each summed over CPUs, in order; `None` without the pin.
pub fn read_event_sums(
    paths: &Paths,
    name: &str,
    slots: &[u32],
) -> Result<Option<Vec<u64>>, KernelError> {
    let pin = paths.map_pin(name);
    let open_err = |source| KernelError::OpenMap {
        path: format!("{name} at {}", pin.display()),
        source: Box::new(source),
    };
    let Some(data) = open_if_pinned(name, &pin)? else {
        return Ok(None);
    };
    let array = aya::maps::PerCpuArray::<_, u64>::try_from(aya::maps::Map::PerCpuArray(data))
        .map_err(open_err)?;
    let sum = |i: u32| {
        array
            .get(&i, 0)
            .map(|v| v.iter().sum::<u64>())
            .map_err(|source| KernelError::MapOp {
                map: name.to_owned(),
                op: "read",
                source: Box::new(source),
            })
    };
    slots
        .iter()
        .map(|&i| sum(i))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// True when `e` says the pin does not exist.
fn is_missing_pin(e: &aya::maps::MapError) -> bool {
    matches!(e, aya::maps::MapError::SyscallError(s) if s.io_error.kind() == std::io::ErrorKind::NotFound)
}

fn expired<K: Copy>(
    all: &[(K, CtEntry)],
    now: u64,
    timeouts: &CtTimeouts,
    protocol: impl Fn(&K) -> u8,
) -> Vec<K> {
    all.iter()
        .filter(|(k, v)| {
            now.saturating_sub(v.last_seen_ns)
                > u64::try_from(timeouts.of(protocol(k), v).as_nanos()).unwrap_or(u64::MAX)
        })
        .map(|(k, _)| *k)
        .collect()
}

/// Sweeps both families once over `io`: removes expired entries and counts LRU evictions.
pub fn sweep_with(
    io: &mut dyn CtIo,
    timeouts: &CtTimeouts,
    stats: &mut CtStats,
) -> Result<(), KernelError> {
    // Read before the maps: an entry created meanwhile is then counted as present, not evicted.
    let created = io.created()?;
    let now = now_ns();
    let all4 = io.entries4()?;
    let gone4 = expired(&all4, now, timeouts, |k| k.protocol);
    let e4 = io.delete4(&gone4)?;
    sweep_service_flows(io, &all4, &gone4, now, stats)?;
    let all6 = io.entries6()?;
    let e6 = io.delete6(&expired(&all6, now, timeouts, |k| k.protocol))?;
    let len = |n: usize| u64::try_from(n).unwrap_or(0);
    let (n4, n6) = (
        len(all4.len()).saturating_sub(e4),
        len(all6.len()).saturating_sub(e6),
    );
    let (m4, m6) = io.capacity()?;
    let [f4, f6] = std::mem::take(&mut stats.flushed_since_sweep);
    if let Some([c4, c6]) = created {
        if let Some([p4, p6, q4, q6]) = stats.baseline {
            // created = Δentries + removed by the agent (expired or flushed) + evicted.
            let evicted = |c: u64, p: u64, n: u64, q: u64, e: u64| {
                (i128::from(c) - i128::from(p) - (i128::from(n) - i128::from(q)) - i128::from(e))
                    .clamp(0, i128::from(u64::MAX))
            };
            stats.evicted4 += u64::try_from(evicted(c4, p4, n4, q4, e4 + f4)).unwrap_or(0);
            stats.evicted6 += u64::try_from(evicted(c6, p6, n6, q6, e6 + f6)).unwrap_or(0);
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

/// Removes the translated flows' entries whose flow left conntrack (`all4` as read, less
/// `gone4`, which this sweep removed) and `nat4` ([`service_flows`]).
fn sweep_service_flows(
    io: &mut dyn CtIo,
    all4: &[(Ct4Key, CtEntry)],
    gone4: &[Ct4Key],
    now: u64,
    stats: &mut CtStats,
) -> Result<(), KernelError> {
    let Some((entries, max)) = io.service_flows4()? else {
        return Ok(());
    };
    let gone: std::collections::HashSet<&Ct4Key> = gone4.iter().collect();
    let kept = all4.iter().map(|(k, _)| *k).filter(|k| !gone.contains(k));
    let live = service_flows::live(kept, &io.nat_flows4()?);
    let removed = io.delete_service_flows4(&service_flows::stale(&entries, &live, now))?;
    stats.service_flows4 = u64::try_from(entries.len())
        .unwrap_or(u64::MAX)
        .saturating_sub(removed);
    stats.service_flows_max4 = max;
    stats.service_flows_expired4 += removed;
    Ok(())
}

/// Sweeps both families (conntrack layout `layout`) once.
pub fn sweep(
    paths: &Paths,
    layout: u32,
    timeouts: &CtTimeouts,
    stats: &mut CtStats,
) -> Result<(), KernelError> {
    sweep_with(&mut PinnedCt::new(paths, layout), timeouts, stats)
}

/// Deletes every entry over `io`; the deleted entries are the agent's removals, not evictions,
/// in the next sweep's count. Returns how many.
pub fn flush_with(io: &mut dyn CtIo, stats: &mut CtStats) -> Result<u64, KernelError> {
    let k4: Vec<Ct4Key> = io.entries4()?.into_iter().map(|(k, _)| k).collect();
    let k6: Vec<Ct6Key> = io.entries6()?.into_iter().map(|(k, _)| k).collect();
    let n4 = io.delete4(&k4)?;
    stats.flushed_since_sweep[0] += n4;
    let n6 = io.delete6(&k6)?;
    stats.flushed_since_sweep[1] += n6;
    Ok(n4 + n6)
}

/// Conntrack upkeep as one serialized task: a sweep and a flush never overlap (each holds
/// `lock` for its whole run), and both update the one set of counters.
#[derive(Clone)]
pub struct CtUpkeep {
    /// Held by each sweep and flush for its whole run (`Api::ct_ops`).
    pub lock: std::sync::Arc<std::sync::Mutex<()>>,
    /// The counters, shared with metrics and the API.
    pub stats: std::sync::Arc<std::sync::Mutex<CtStats>>,
}

impl CtUpkeep {
    /// Over shared counters and lock.
    #[must_use]
    pub fn new(
        lock: std::sync::Arc<std::sync::Mutex<()>>,
        stats: std::sync::Arc<std::sync::Mutex<CtStats>>,
    ) -> Self {
        Self { lock, stats }
    }

    fn stats(&self) -> std::sync::MutexGuard<'_, CtStats> {
        self.stats
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// One sweep; a flush waits for it (and it for a flush).
    pub fn sweep(&self, io: &mut dyn CtIo, timeouts: &CtTimeouts) -> Result<(), KernelError> {
        let _op = self
            .lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut local = *self.stats();
        let result = sweep_with(io, timeouts, &mut local);
        if result.is_ok() {
            *self.stats() = local;
        }
        result
    }

    /// One flush; never inside a sweep. Returns how many entries went.
    pub fn flush(&self, io: &mut dyn CtIo) -> Result<u64, KernelError> {
        let _op = self
            .lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut local = *self.stats();
        let result = flush_with(io, &mut local);
        // What was deleted is recorded even when the flush stopped half way.
        *self.stats() = local;
        result
    }
}

fn endpoint(addr: IpAddr, port: u16, protocol: u8) -> String {
    match (addr, protocol) {
        (_, 1 | 58) => addr.to_string(),
        (IpAddr::V6(a), _) => format!("[{a}]:{port}"),
        (IpAddr::V4(a), _) => format!("{a}:{port}"),
    }
}

/// Every entry of both families over `io`, for `weir bpf ct list`.
pub fn list_with(io: &dyn CtIo) -> Result<Vec<CtView>, KernelError> {
    let now = now_ns();
    let idle = |e: &CtEntry| now.saturating_sub(e.last_seen_ns) / 1_000_000_000;
    let age = |e: &CtEntry| now.saturating_sub(e.created_ns) / 1_000_000_000;
    let mut out = Vec::new();
    for (k, v) in io.entries4()? {
        out.push(CtView {
            protocol: k.protocol,
            a: endpoint(IpAddr::V4(Ipv4Addr::from(k.addr_a)), k.port_a, k.protocol),
            b: endpoint(IpAddr::V4(Ipv4Addr::from(k.addr_b)), k.port_b, k.protocol),
            flags: v.flags,
            idle_secs: idle(&v),
            age_secs: age(&v),
        });
    }
    for (k, v) in io.entries6()? {
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

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
        mpsc,
    };

    use super::*;
    use crate::dataplane::fake::FakeKernel;

    fn flow(port: u16) -> Ct4Key {
        Ct4Key {
            addr_a: [10, 0, 0, 1],
            addr_b: [10, 0, 0, 2],
            port_a: port,
            port_b: 80,
            protocol: 6,
            ..Ct4Key::default()
        }
    }

    #[test]
    fn a_flush_during_a_sweep_waits_for_it_and_is_not_counted_as_evictions() {
        let kernel = FakeKernel::default();
        kernel.ct().capacity = 100;
        for port in 1..=3 {
            kernel
                .ct()
                .create4(flow(port), CtEntry::new(now_ns(), FLAG_TCP_SYN_ACK));
        }
        let upkeep = CtUpkeep::new(Arc::default(), Arc::new(Mutex::new(CtStats::default())));
        let timeouts = CtTimeouts::default();
        upkeep
            .sweep(&mut kernel.clone(), &timeouts)
            .expect("first sweep");

        // A sweep that has read the entries pauses; a flush starts meanwhile.
        let (read_tx, read_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel();
        kernel.ct().pause = Some((read_tx, go_rx));
        let sweeping = {
            let (upkeep, mut io) = (upkeep.clone(), kernel.clone());
            std::thread::spawn(move || upkeep.sweep(&mut io, &timeouts))
        };
        read_rx.recv().expect("the sweep read the map");
        let flushed = Arc::new(AtomicBool::new(false));
        let flushing = {
            let (upkeep, mut io, flushed) = (upkeep.clone(), kernel.clone(), Arc::clone(&flushed));
            std::thread::spawn(move || {
                let n = upkeep.flush(&mut io);
                flushed.store(true, Ordering::SeqCst);
                n
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(
            !flushed.load(Ordering::SeqCst),
            "the flush waits for the sweep in progress"
        );
        assert_eq!(kernel.ct().ct4.len(), 3, "nothing flushed mid-sweep");
        go_tx.send(()).expect("let the sweep go on");
        sweeping.join().expect("sweep thread").expect("sweep");
        let n = flushing.join().expect("flush thread").expect("flush");
        assert_eq!(n, 3, "the flush removed every entry");
        assert!(kernel.ct().ct4.is_empty());

        upkeep.sweep(&mut kernel.clone(), &timeouts).expect("sweep");
        let stats = *upkeep.stats();
        assert_eq!(stats.evicted4, 0, "flushed entries are not evictions");
        assert_eq!(stats.entries4, 0);

        // Positive control: an entry the kernel dropped (LRU) is counted.
        kernel
            .ct()
            .create4(flow(7), CtEntry::new(now_ns(), FLAG_TCP_SYN_ACK));
        kernel
            .ct()
            .create4(flow(8), CtEntry::new(now_ns(), FLAG_TCP_SYN_ACK));
        kernel.ct().ct4.remove(&flow(7));
        upkeep.sweep(&mut kernel.clone(), &timeouts).expect("sweep");
        let stats = *upkeep.stats();
        assert_eq!(
            stats.evicted4, 1,
            "an entry evicted by the kernel is counted"
        );
        assert_eq!(stats.entries4, 1);
        assert_eq!(stats.sweeps, 4);
    }

    #[test]
    fn a_sweep_removes_only_expired_entries() {
        let kernel = FakeKernel::default();
        let timeouts = CtTimeouts::default();
        let old = now_ns().saturating_sub(
            u64::try_from(timeouts.tcp_syn.as_nanos()).unwrap_or(u64::MAX) + 1_000_000_000,
        );
        kernel.ct().create4(flow(1), CtEntry::new(old, 0));
        kernel
            .ct()
            .create4(flow(2), CtEntry::new(now_ns(), FLAG_TCP_SYN_ACK));
        let mut stats = CtStats::default();
        sweep_with(&mut kernel.clone(), &timeouts, &mut stats).expect("sweep");
        assert_eq!(stats.expired4, 1);
        assert_eq!(stats.entries4, 1);
        assert!(kernel.ct().ct4.contains_key(&flow(2)));
        assert_eq!(list_with(&kernel).expect("list").len(), 1);
    }

    #[test]
    fn a_translated_flow_s_entry_goes_in_the_sweep_that_expires_its_flow() {
        use maps_schema::{SvcCt4Entry, SvcCt4Key, service_ct::DIR_ORIGINAL};
        let kernel = FakeKernel::default();
        kernel.ct().capacity = 100;
        let timeouts = CtTimeouts::default();
        let now = now_ns();
        let old = now.saturating_sub(
            u64::try_from(timeouts.tcp_syn.as_nanos()).unwrap_or(u64::MAX) + 1_000_000_000,
        );
        // Two flows of 10.0.0.1 to a frontend, given backend 10.0.0.2:80 (`flow`'s other end).
        let original = |port: u16| {
            (
                SvcCt4Key {
                    saddr: [10, 0, 0, 1],
                    daddr: [10, 96, 0, 10],
                    sport: port,
                    dport: 8080,
                    protocol: 6,
                    direction: DIR_ORIGINAL,
                    _pad: [0; 2],
                },
                SvcCt4Entry {
                    addr: [10, 0, 0, 2],
                    port: 80,
                    service_id: 1,
                    last_seen_ns: old,
                    ..SvcCt4Entry::default()
                },
            )
        };
        kernel.ct().create4(flow(1), CtEntry::new(old, 0)); // expires now
        kernel
            .ct()
            .create4(flow(2), CtEntry::new(now, FLAG_TCP_SYN_ACK));
        for port in [1, 2] {
            let (k, v) = original(port);
            kernel.ct().services4.insert(k, v);
        }
        let mut stats = CtStats::default();
        sweep_with(&mut kernel.clone(), &timeouts, &mut stats).expect("sweep");
        assert_eq!(stats.expired4, 1);
        let left: Vec<SvcCt4Key> = kernel.ct().services4.keys().copied().collect();
        assert_eq!(left, vec![original(2).0], "the live flow keeps its entry");
        assert_eq!(
            (
                stats.service_flows4,
                stats.service_flows_max4,
                stats.service_flows_expired4
            ),
            (1, 100, 1)
        );
    }

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
