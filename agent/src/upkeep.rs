//! Periodic work beside the dataplane loop, each on a named task or thread: the conntrack sweep
//! (which a flush waits for, and which waits for a flush), the NAT sweep of idle masquerade pairs,
//! and IPAM's allocation expiry with the state files' fault probe. Kernel I/O goes through the seam
//! types they are handed.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use maps_schema::{Nat4Entry, Nat4Key};

use crate::{
    calc::ipam_service::IpamService,
    dataplane::{
        conntrack::{CtTimeouts, CtUpkeep},
        masquerade::sweep_nat,
        nat_stats::NatPressure,
    },
    kernel::{CtIo, MapIo},
};

/// How often the sweep thread looks at its clock and the stop flag.
const SWEEP_TICK: Duration = Duration::from_millis(100);
/// How often IPAM expires allocations (and faulted state files are probed).
const IPAM_TICK: Duration = Duration::from_secs(1);
/// How often idle NAT pairs are swept.
const NAT_SWEEP: Duration = Duration::from_secs(10);

/// Starts the conntrack sweep on its own thread (`weir-ct-sweep`): every `interval` until `stop`.
///
/// # Errors
/// The thread could not be started.
pub fn spawn_ct_sweep<C: CtIo + Send + 'static>(
    upkeep: CtUpkeep,
    mut io: C,
    interval: Duration,
    timeouts: CtTimeouts,
    stop: Arc<AtomicBool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("weir-ct-sweep".into())
        .spawn(move || {
            let mut next = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                if Instant::now() >= next {
                    if let Err(e) = upkeep.sweep(&mut io, &timeouts) {
                        tracing::warn!(error = %e, "conntrack sweep failed; retrying next interval");
                    }
                    next = Instant::now() + interval;
                }
                std::thread::sleep(SWEEP_TICK);
            }
        })
}

/// IPAM's upkeep, forever: expires allocations, and probes faulted state files (the embedded
/// datastore probes itself).
pub async fn ipam(ipam: Arc<IpamService>) {
    loop {
        tokio::time::sleep(IPAM_TICK).await;
        if let Err(e) = ipam.expire().await {
            tracing::warn!(error = %e, "expiring allocations failed");
        }
        if !crate::fsutil::faults().is_empty() {
            let _ = tokio::task::spawn_blocking(crate::fsutil::probe).await;
        }
    }
}

/// Starts the NAT sweep on its own thread (`weir-nat-sweep`): every [`NAT_SWEEP`] until `stop`,
/// idle `nat4_v1` pairs are deleted and the map's pressure recorded for `weir status` and
/// `/metrics`.
///
/// # Errors
/// The thread could not be started.
pub fn spawn_nat_sweep(
    mut nat: Box<dyn MapIo<Nat4Key, Nat4Entry>>,
    pressure: NatPressure,
    stop: Arc<AtomicBool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("weir-nat-sweep".into())
        .spawn(move || {
            let mut next = Instant::now() + NAT_SWEEP;
            while !stop.load(Ordering::Relaxed) {
                if Instant::now() >= next {
                    match sweep_nat(&mut *nat, crate::kernel::real::ct::now_ns()) {
                        Ok(s) => {
                            if s.deleted > 0 {
                                tracing::debug!(entries = s.entries, deleted = s.deleted, "nat sweep");
                            }
                            if let Err(e) = pressure.record(&s) {
                                tracing::warn!(error = %e, "cannot read the nat map's capacity and events; retrying next interval");
                            }
                        }
                        Err(e) => tracing::warn!(error = %e, "nat sweep failed; retrying next interval"),
                    }
                    next = Instant::now() + NAT_SWEEP;
                }
                std::thread::sleep(SWEEP_TICK);
            }
        })
}
