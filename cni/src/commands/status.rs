//! STATUS (CNI 1.1): ready when the agent answers, says it is ready, and every family the pod
//! needs has a usable pool with free addresses; code 50 otherwise.

use super::CommandError;
use crate::{
    agent::{AgentClient, PoolStatus},
    config::Config,
};

pub(super) async fn status(config: &Config, client: &AgentClient) -> Result<(), CommandError> {
    let status = client
        .status()
        .await
        .map_err(CommandError::AgentUnavailable)?;
    if !status.ready {
        return Err(CommandError::AgentNotReady);
    }
    for name in &config.pools {
        if !status.pools.iter().any(|p| &p.name == name) {
            return Err(CommandError::NoSuchPool { name: name.clone() });
        }
    }
    let wanted = |p: &&PoolStatus| config.pools.is_empty() || config.pools.contains(&p.name);
    for (needed, ipv6, family) in [
        (config.families.ipv4, false, "IPv4"),
        (config.families.ipv6, true, "IPv6"),
    ] {
        if !needed {
            continue;
        }
        let candidates: Vec<&PoolStatus> = status
            .pools
            .iter()
            .filter(wanted)
            .filter(|p| p.cidr.contains(':') == ipv6)
            .collect();
        if !candidates.iter().any(|p| !p.disabled && p.free > 0) {
            return Err(CommandError::NoFreeAddresses {
                family,
                pools: candidates.iter().map(|p| p.name.clone()).collect(),
            });
        }
    }
    Ok(())
}
