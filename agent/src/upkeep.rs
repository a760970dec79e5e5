//! Periodic work beside the dataplane loop, each on a named task or thread: the conntrack sweep
//! (which a flush waits for, and which waits for a flush), IPAM's allocation expiry with the state
//! files' fault probe, and the pool poll that feeds the masquerade its CIDRs. Kernel I/O goes
//! through the seam types they are handed.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use crate::{
    calc::ipam_service::IpamService,
    dataplane::conntrack::{CtTimeouts, CtUpkeep},
    kernel::CtIo,
};

/// How often the sweep thread looks at its clock and the stop flag.
const SWEEP_TICK: Duration = Duration::from_millis(100);
/// How often IPAM expires allocations (and faulted state files are probed).
const IPAM_TICK: Duration = Duration::from_secs(1);
/// How often the pools are read for the masquerade.
const POOL_POLL: Duration = Duration::from_secs(5);

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

/// Reads the pools every [`POOL_POLL`] and sends the masquerade their IPv4 CIDRs when they
/// change (`last`: what it has); returns when the masquerade is gone.
pub async fn poll_pools(
    ipam: Arc<IpamService>,
    mut last: Vec<ipnetwork::Ipv4Network>,
    tx: mpsc::Sender<Vec<ipnetwork::Ipv4Network>>,
) {
    loop {
        tokio::time::sleep(POOL_POLL).await;
        match ipam.pools().await {
            Ok(now) => {
                let now = crate::daemon::masquerade_pools(&now);
                if now != last {
                    last.clone_from(&now);
                    if tx.send(now).is_err() {
                        return;
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the pools for the masquerade; keeping the last set");
            }
        }
    }
}
