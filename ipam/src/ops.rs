//! `weir ipam`'s operations as data: what the command asks for and what comes back. The same operation runs
//! on a datastore the command opened itself, or inside the agent that holds the datastore (the agent's
//! `POST /v1/ipam/ops`), with the same outcome either way.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::{
    AssignArgs, AssignResult, Ipam, IpamError,
    allocator::{AddressInfo, BlockSummary, CheckReport, NodeRelease, ReleaseReport, Utilization},
    model::{IpPool, IpamConfig, ReleaseCheck},
    store::Store,
};

/// One `weir ipam` operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Operation {
    /// `pool add` (the pool is validated by the caller).
    PoolAdd {
        /// The pool.
        pool: IpPool,
    },
    /// `pool list`.
    PoolList,
    /// `pool delete`.
    PoolDelete {
        /// The pool's name.
        name: String,
        /// Delete it even though addresses are allocated from it.
        force: bool,
    },
    /// `config show`.
    ConfigShow,
    /// `config set`: the settings given change, the others keep their values.
    ConfigSet {
        /// Strict affinity.
        strict_affinity: Option<bool>,
        /// Blocks one host may claim.
        max_blocks_per_host: Option<u32>,
        /// Cooldown seconds.
        cooldown: Option<u64>,
        /// Whether hosts claim new blocks.
        auto_allocate_blocks: Option<bool>,
    },
    /// `allocate` by count.
    Allocate {
        /// The host.
        host: String,
        /// The handle.
        handle: String,
        /// IPv4 addresses wanted.
        ipv4: u32,
        /// IPv6 addresses wanted.
        ipv6: u32,
        /// Only from these pools.
        pools: Vec<String>,
    },
    /// `allocate --ip`.
    AssignIp {
        /// The host.
        host: String,
        /// The handle.
        handle: String,
        /// The address.
        ip: IpAddr,
    },
    /// `release --handle`.
    ReleaseHandle {
        /// The handle.
        handle: String,
    },
    /// `release --ip …`.
    ReleaseIps {
        /// The addresses.
        ips: Vec<IpAddr>,
        /// Only while still at this sequence number.
        sequence_number: Option<u64>,
    },
    /// `show --ip`.
    ShowAddress {
        /// The address.
        ip: IpAddr,
    },
    /// `show`.
    Show {
        /// Also list every block.
        show_blocks: bool,
    },
    /// `utilization`.
    Utilization {
        /// Also per block.
        show_blocks: bool,
    },
    /// `check`.
    Check {
        /// First rebuild handle counts that differ from their blocks.
        repair: bool,
        /// The cluster's live nodes as Kubernetes lists them (Node objects), when node records are Nodes.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        nodes: Option<std::collections::BTreeSet<String>>,
    },
    /// `release-node`: free a decommissioned node's blocks; refused for a live node unless forced.
    ReleaseNode {
        /// The node.
        name: String,
        /// Release even though its heartbeat is live.
        force: bool,
    },
}

/// What an operation did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum Outcome {
    /// Pools (listed or added).
    Pools {
        /// The pools.
        pools: Vec<IpPool>,
    },
    /// A pool was deleted.
    PoolDeleted {
        /// The pool.
        pool: IpPool,
    },
    /// The config (shown or as set).
    Config {
        /// The config.
        config: IpamConfig,
    },
    /// Addresses were assigned.
    Assigned {
        /// The handle.
        handle: String,
        /// What was assigned.
        result: AssignResult,
        /// Why fewer than asked for (the command then fails, leaving what it got under the handle).
        short: Option<String>,
    },
    /// A handle was released.
    ReleasedHandle {
        /// The handle.
        handle: String,
        /// Its addresses.
        ips: Vec<IpAddr>,
    },
    /// Addresses were released.
    Released {
        /// What happened to each.
        report: ReleaseReport,
    },
    /// One address.
    Address {
        /// What is known about it.
        info: AddressInfo,
    },
    /// `show`.
    Show {
        /// Per pool.
        utilization: Vec<Utilization>,
        /// Every block, when asked for.
        blocks: Option<Vec<BlockSummary>>,
    },
    /// `utilization`.
    Utilization {
        /// Per pool (and block when asked for).
        utilization: Vec<Utilization>,
    },
    /// `check`.
    Checked {
        /// Handles whose counts were rebuilt first.
        repaired: Vec<String>,
        /// What the check found.
        report: CheckReport,
    },
    /// What `release-node` freed.
    NodeReleased {
        /// The report.
        report: NodeRelease,
    },
}

/// Runs `op` on `ipam`.
pub async fn execute<S: Store + Clone>(
    ipam: &Ipam<S>,
    op: Operation,
) -> Result<Outcome, IpamError> {
    Ok(match op {
        Operation::PoolAdd { pool } => Outcome::Pools {
            pools: vec![ipam.add_pool(pool).await?],
        },
        Operation::PoolList => Outcome::Pools {
            pools: ipam.pools().await?,
        },
        Operation::PoolDelete { name, force } => Outcome::PoolDeleted {
            pool: ipam.delete_pool(&name, force).await?,
        },
        Operation::ConfigShow => Outcome::Config {
            config: ipam.config().await?,
        },
        Operation::ConfigSet {
            strict_affinity,
            max_blocks_per_host,
            cooldown,
            auto_allocate_blocks,
        } => {
            let mut c = ipam.config().await?;
            c.strict_affinity = strict_affinity.unwrap_or(c.strict_affinity);
            c.max_blocks_per_host = max_blocks_per_host.unwrap_or(c.max_blocks_per_host);
            c.ip_cooldown_seconds = cooldown.unwrap_or(c.ip_cooldown_seconds);
            c.auto_allocate_blocks = auto_allocate_blocks.unwrap_or(c.auto_allocate_blocks);
            ipam.set_config(c.clone()).await?;
            Outcome::Config { config: c }
        }
        Operation::Allocate {
            host,
            handle,
            ipv4,
            ipv6,
            pools,
        } => {
            let mut args = AssignArgs::new(&host, &handle, ipv4, ipv6);
            args.pools = pools;
            let result = ipam.auto_assign(&args).await?;
            let short = result.partial_fulfilment(&args);
            Outcome::Assigned {
                handle,
                result,
                short,
            }
        }
        Operation::AssignIp { host, handle, ip } => {
            let net = ipam
                .assign_ip(ip, &handle, Default::default(), &host, None)
                .await?;
            let result = AssignResult {
                ipv4: if net.is_ipv4() { vec![net] } else { Vec::new() },
                ipv6: if net.is_ipv6() { vec![net] } else { Vec::new() },
                messages: Vec::new(),
            };
            Outcome::Assigned {
                handle,
                result,
                short: None,
            }
        }
        Operation::ReleaseHandle { handle } => {
            let ips = match ipam.release_by_handle(&handle).await {
                Ok(ips) => ips,
                Err(IpamError::HandleNotFound { .. }) => Vec::new(),
                Err(e) => return Err(e),
            };
            Outcome::ReleasedHandle { handle, ips }
        }
        Operation::ReleaseIps {
            ips,
            sequence_number,
        } => {
            let check = ReleaseCheck {
                sequence_number,
                handle: None,
            };
            let ips: Vec<_> = ips.iter().map(|ip| (*ip, check.clone())).collect();
            Outcome::Released {
                report: ipam.release_ips(&ips).await?,
            }
        }
        Operation::ShowAddress { ip } => Outcome::Address {
            info: ipam.address_info(ip).await?,
        },
        Operation::Show { show_blocks } => Outcome::Show {
            utilization: ipam.utilization(false).await?,
            blocks: if show_blocks {
                Some(ipam.block_summaries().await?)
            } else {
                None
            },
        },
        Operation::Utilization { show_blocks } => Outcome::Utilization {
            utilization: ipam.utilization(show_blocks).await?,
        },
        Operation::Check { repair, nodes } => {
            let repaired = if repair {
                ipam.repair_handles().await?
            } else {
                Vec::new()
            };
            Outcome::Checked {
                repaired,
                report: ipam.check_with_nodes(nodes.as_ref()).await?,
            }
        }
        Operation::ReleaseNode { name, force } => Outcome::NodeReleased {
            report: ipam.release_node(&name, force, ipam.clock().now()).await?,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{model::IpUse, store::memory::MemoryStore};

    #[tokio::test]
    async fn operations_and_outcomes_survive_a_json_round_trip() {
        let ipam = Ipam::new(MemoryStore::new());
        let pool = IpPool {
            name: "p".into(),
            cidr: "10.9.0.0/24".parse().expect("cidr"),
            block_size: 28,
            node_selector: String::new(),
            namespace_selector: String::new(),
            allowed_uses: vec![IpUse::Workload],
            disabled: false,
        };
        let ops = [
            Operation::PoolAdd { pool },
            Operation::Allocate {
                host: "n1".into(),
                handle: "h".into(),
                ipv4: 2,
                ipv6: 0,
                pools: Vec::new(),
            },
            Operation::Utilization { show_blocks: true },
            Operation::Show { show_blocks: true },
            Operation::ShowAddress {
                ip: "10.9.0.1".parse().expect("ip"),
            },
            Operation::ReleaseIps {
                ips: vec!["10.9.0.1".parse().expect("ip")],
                sequence_number: None,
            },
            Operation::Check {
                repair: true,
                nodes: Some(["n1".to_owned()].into()),
            },
        ];
        for op in ops {
            let wire: Operation =
                serde_json::from_str(&serde_json::to_string(&op).expect("op")).expect("op back");
            assert_eq!(wire, op);
            let outcome = execute(&ipam, wire).await.expect("execute");
            let back: Outcome =
                serde_json::from_str(&serde_json::to_string(&outcome).expect("outcome"))
                    .expect("outcome back");
            assert_eq!(back, outcome);
        }
    }
}
