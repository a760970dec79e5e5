//! Conntrack upkeep: the programs write `ct4`/`ct6`; the agent sweeps expired entries (batch
//! lookups and deletes) with the timeouts of its flags, so LRU eviction stays a last resort, and
//! reports map pressure. Also lists and flushes for `weir bpf ct`.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use maps_schema::{
    CtEntry,
    conntrack::{
        Ct4Key, Ct6Key, FLAG_TCP_FIN_DST, FLAG_TCP_FIN_SRC, FLAG_TCP_RST, FLAG_TCP_SYN_ACK,
    },
};
use serde::{Deserialize, Serialize};

use super::service_flows;
use crate::kernel::{
    CtIo, KernelError,
    real::ct::{PinnedCt, now_ns},
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
    use crate::kernel::fake::FakeKernel;

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
