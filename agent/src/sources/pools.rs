//! The IPAM pools as a source for the masquerade: read every [`POLL`] (they change through `weir
//! ipam pool`), and their IPv4 CIDRs sent to the loop ([`Command::MasqueradePools`]) when they
//! change. No kernel I/O.

use std::{sync::Arc, time::Duration};

use ipnetwork::Ipv4Network;

use crate::{
    calc::ipam_service::{IpamService, PoolStatus},
    control::applier::{Command, LoopHandle},
};

/// How often the pools are read.
pub const POLL: Duration = Duration::from_secs(5);

/// The IPv4 pool CIDRs the masquerade keeps its hands off (disabled pools too: their pods remain).
#[must_use]
pub fn masquerade_pools(pools: &[PoolStatus]) -> Vec<Ipv4Network> {
    pools
        .iter()
        .filter_map(|p| p.cidr.parse::<Ipv4Network>().ok())
        .collect()
}

/// Reads the pools every [`POLL`] and sends their IPv4 CIDRs to the loop when they differ from
/// `last` (what the node has); returns when the loop is gone.
pub async fn run(ipam: Arc<IpamService>, mut last: Vec<Ipv4Network>, dataplane: LoopHandle) {
    loop {
        tokio::time::sleep(POLL).await;
        match ipam.pools().await {
            Ok(now) => {
                let now = masquerade_pools(&now);
                if now != last {
                    last.clone_from(&now);
                    if dataplane.send(Command::MasqueradePools(now)).is_err() {
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
