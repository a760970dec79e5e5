//! `weir ipam …`: work on an IPAM datastore, as `calicoctl ipam` does (no agent needed). When the datastore is an
//! embedded file and an agent answers on `--api-socket` holding that file, the command runs inside the agent
//! (`via_agent`); otherwise it opens the datastore itself.

mod render;
mod via_agent;

use std::{net::IpAddr, path::PathBuf, time::Duration};

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand, ValueEnum};
use ipam::{
    Ipam,
    allocator::parse_pool_cidr,
    cidr::Family,
    model::{IpPool, IpUse},
    ops::{Operation, Outcome},
    store::{Datastore, any::DEFAULT_DATASTORE},
};

/// How long a command waits for an embedded file another process holds exclusively.
const OPEN_WAIT: Duration = Duration::from_secs(10);

/// `weir ipam` arguments.
#[derive(Debug, Args)]
pub struct IpamArgs {
    /// The datastore: `embedded:PATH` (a redb file), `etcd:URL[,URL…]`, or `kubernetes` (the `ipam.weir.dev`
    /// custom resources of the in-cluster config or the kubeconfig).
    #[arg(long, env = "WEIR_DATASTORE", default_value = DEFAULT_DATASTORE, global = true)]
    pub datastore: String,
    /// The agent's API socket. When an agent answers there and holds the embedded file named by --datastore,
    /// the command runs inside it (the file is the agent's alone); when none answers, the file is opened here.
    #[arg(long, env = "WEIR_API_SOCKET", default_value = weir_api::DEFAULT_SOCKET, global = true)]
    pub api_socket: PathBuf,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Text, global = true)]
    pub output: Output,
    /// What to do.
    #[command(subcommand)]
    pub command: IpamCommand,
}

/// Output formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Tables for people.
    Text,
    /// JSON for programs.
    Json,
}

/// `weir ipam` subcommands.
#[derive(Debug, Subcommand)]
pub enum IpamCommand {
    /// Manage pools.
    #[command(subcommand)]
    Pool(PoolCommand),
    /// Manage the IPAM config.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Allocate addresses for a handle on a host.
    Allocate(AllocateArgs),
    /// Release addresses, by address or by handle.
    Release(ReleaseArgs),
    /// Show blocks, or what is known about one address.
    Show(ShowArgs),
    /// Capacity, use and reservations per pool.
    #[command(alias = "utilisation")]
    Utilization {
        /// Also list every block.
        #[arg(long)]
        show_blocks: bool,
    },
    /// Check every invariant and look for leaks; exits non-zero if an invariant is broken.
    Check {
        /// First rebuild handle counts that differ from their blocks (what a crash between the two writes of an
        /// allocation on Kubernetes leaves), then check.
        #[arg(long)]
        repair: bool,
        /// Also take the cluster's Node objects (the in-cluster config or the kubeconfig) as live nodes: a
        /// block whose node has neither a node record nor a Node is reported as a decommissioned node's. For
        /// agents run with `--source kubernetes`, whose node records are their Nodes; on by default with
        /// `--datastore kubernetes`.
        #[arg(long)]
        node_objects: bool,
    },
    /// Free a decommissioned node's blocks: every address in them, its block affinities and its node record
    /// (as `calicoctl ipam release` for a node that is gone). Refused while the node's heartbeat is live, and,
    /// with `--node-objects`, while the cluster still has a Node object of that name.
    ReleaseNode {
        /// The node (its IPAM host name).
        name: String,
        /// Release even though the node is live (its pods lose their addresses' ownership).
        #[arg(long)]
        force: bool,
        /// Also refuse while the cluster has a Node object of that name (the in-cluster config or the
        /// kubeconfig): the node records of agents run with `--source kubernetes` are their Nodes. On by
        /// default with `--datastore kubernetes`.
        #[arg(long)]
        node_objects: bool,
    },
}

/// `weir ipam pool …`.
#[derive(Debug, Subcommand)]
pub enum PoolCommand {
    /// Add a pool.
    Add(PoolAddArgs),
    /// List pools.
    List,
    /// Delete a pool.
    Delete {
        /// The pool's name.
        name: String,
        /// Delete it even though addresses are allocated from it (they stay valid until released).
        #[arg(long)]
        force: bool,
    },
}

/// `weir ipam pool add`.
#[derive(Debug, Args)]
pub struct PoolAddArgs {
    /// The pool's name (lowercase letters, digits, '-', '.').
    pub name: String,
    /// The pool's CIDR, e.g. 10.244.0.0/16 or fd00:10::/64.
    #[arg(long)]
    pub cidr: String,
    /// Block prefix length (default /26 for IPv4, /122 for IPv6); fixed once blocks exist.
    #[arg(long)]
    pub block_size: Option<u8>,
    /// Which nodes may use the pool, e.g. `zone == "a" && has(gpu)` (default: all).
    #[arg(long, default_value = "")]
    pub node_selector: String,
    /// Which namespaces' pods may use the pool (default: all).
    #[arg(long, default_value = "")]
    pub namespace_selector: String,
    /// Comma-separated uses: workload, tunnel, loadbalancer (default: workload,tunnel).
    #[arg(long, default_value = "workload,tunnel")]
    pub allowed_uses: String,
    /// Add the pool disabled (no new addresses are handed out from it).
    #[arg(long)]
    pub disabled: bool,
}

/// `weir ipam config …`.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Show the config (defaults when none is stored).
    Show,
    /// Change settings; the others keep their values.
    Set {
        /// Hosts only allocate from their own blocks (no borrowing).
        #[arg(long)]
        strict_affinity: Option<bool>,
        /// How many blocks one host may claim (0 = the default of 20; needs strict affinity).
        #[arg(long)]
        max_blocks_per_host: Option<u32>,
        /// Seconds a released address waits before it is handed out again (at most 1200).
        #[arg(long)]
        cooldown: Option<u64>,
        /// Whether hosts claim new blocks when theirs are full.
        #[arg(long)]
        auto_allocate_blocks: Option<bool>,
    },
}

/// `weir ipam allocate`.
#[derive(Debug, Args)]
pub struct AllocateArgs {
    /// The host (node) the addresses are for.
    #[arg(long)]
    pub host: String,
    /// The handle to allocate under (release it with `release --handle`).
    #[arg(long)]
    pub handle: String,
    /// IPv4 addresses wanted (default 1 when neither --ipv4, --ipv6 nor --ip is given).
    #[arg(long)]
    pub ipv4: Option<u32>,
    /// IPv6 addresses wanted.
    #[arg(long)]
    pub ipv6: Option<u32>,
    /// Allocate only from these pools (repeatable).
    #[arg(long = "pool")]
    pub pools: Vec<String>,
    /// Allocate this exact address instead.
    #[arg(long, conflicts_with_all = ["ipv4", "ipv6", "pools"])]
    pub ip: Option<IpAddr>,
}

/// `weir ipam release`.
#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("what").required(true).args(["ips", "handle"]))]
pub struct ReleaseArgs {
    /// Addresses to release (repeatable).
    #[arg(long = "ip")]
    pub ips: Vec<IpAddr>,
    /// Release every address of this handle.
    #[arg(long)]
    pub handle: Option<String>,
    /// Only release an address still at this sequence number (from `show --ip`); guards against reuse.
    #[arg(long, requires = "ips")]
    pub sequence_number: Option<u64>,
}

/// `weir ipam show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// List every block.
    #[arg(long)]
    pub show_blocks: bool,
    /// Show what is known about this address.
    #[arg(long)]
    pub ip: Option<IpAddr>,
}

/// Runs `weir ipam`.
pub fn run(args: IpamArgs) -> anyhow::Result<()> {
    let datastore: Datastore = args.datastore.parse()?;
    let node_objects = match &args.command {
        IpamCommand::Check { node_objects, .. }
        | IpamCommand::ReleaseNode {
            node_objects,
            force: false,
            ..
        } => *node_objects || matches!(datastore, Datastore::Kubernetes),
        _ => false,
    };
    // Validate what needs no datastore before reaching one.
    let mut op = operation(args.command)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    let outcome = runtime.block_on(async move {
        if node_objects {
            let names = node_names().await?;
            match &mut op {
                Operation::Check { nodes, .. } => *nodes = Some(names),
                Operation::ReleaseNode { name, .. } if names.contains(name.as_str()) => bail!(
                    "node {name:?} still has a Node object in the cluster, so it is live: delete the \
                     Node (kubectl delete node {name}) once the machine is gone, or pass --force"
                ),
                _ => {}
            }
        }
        if let Datastore::Embedded(path) = &datastore
            && let Some(outcome) = via_agent::execute(&args.api_socket, path, &op).await?
        {
            return anyhow::Ok(outcome);
        }
        let store = datastore.open(OPEN_WAIT).await?;
        Ok(ipam::ops::execute(&Ipam::new(store), op).await?)
    })?;
    show(&outcome, args.output)
}

/// The names of the cluster's Node objects (the in-cluster config or the kubeconfig).
async fn node_names() -> anyhow::Result<std::collections::BTreeSet<String>> {
    let client = kube::Client::try_default().await.context(
        "cannot reach the Kubernetes API server for its Node objects: set KUBECONFIG (or run in a pod), or drop --node-objects",
    )?;
    let nodes = kube::Api::<k8s_openapi::api::core::v1::Node>::all(client)
        .list(&kube::api::ListParams::default())
        .await
        .context("cannot list the Node objects: the check needs `list` on nodes")?;
    Ok(nodes
        .items
        .iter()
        .map(kube::ResourceExt::name_any)
        .collect())
}

fn build_pool(a: &PoolAddArgs) -> anyhow::Result<IpPool> {
    let cidr = parse_pool_cidr(&a.name, &a.cidr)?;
    let mut uses = Vec::new();
    for u in a
        .allowed_uses
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
    {
        match IpUse::parse(u) {
            Some(u) => uses.push(u),
            None => bail!(
                "unknown use {u:?} in --allowed-uses: list workload, tunnel and/or loadbalancer"
            ),
        }
    }
    Ok(IpPool {
        name: a.name.clone(),
        cidr,
        block_size: a
            .block_size
            .unwrap_or_else(|| Family::of(&cidr).default_block_size()),
        node_selector: a.node_selector.clone(),
        namespace_selector: a.namespace_selector.clone(),
        allowed_uses: uses,
        disabled: a.disabled,
    })
}

/// The operation a command names.
fn operation(command: IpamCommand) -> anyhow::Result<Operation> {
    Ok(match command {
        IpamCommand::Pool(PoolCommand::Add(a)) => Operation::PoolAdd {
            pool: build_pool(&a)?,
        },
        IpamCommand::Pool(PoolCommand::List) => Operation::PoolList,
        IpamCommand::Pool(PoolCommand::Delete { name, force }) => {
            Operation::PoolDelete { name, force }
        }
        IpamCommand::Config(ConfigCommand::Show) => Operation::ConfigShow,
        IpamCommand::Config(ConfigCommand::Set {
            strict_affinity,
            max_blocks_per_host,
            cooldown,
            auto_allocate_blocks,
        }) => Operation::ConfigSet {
            strict_affinity,
            max_blocks_per_host,
            cooldown,
            auto_allocate_blocks,
        },
        IpamCommand::Allocate(a) => match a.ip {
            Some(ip) => Operation::AssignIp {
                host: a.host,
                handle: a.handle,
                ip,
            },
            None => {
                let (ipv4, ipv6) = match (a.ipv4, a.ipv6) {
                    (None, None) => (1, 0),
                    (v4, v6) => (v4.unwrap_or(0), v6.unwrap_or(0)),
                };
                Operation::Allocate {
                    host: a.host,
                    handle: a.handle,
                    ipv4,
                    ipv6,
                    pools: a.pools,
                }
            }
        },
        IpamCommand::Release(r) => match r.handle {
            Some(handle) => Operation::ReleaseHandle { handle },
            None => Operation::ReleaseIps {
                ips: r.ips,
                sequence_number: r.sequence_number,
            },
        },
        IpamCommand::Show(s) => match s.ip {
            Some(ip) => Operation::ShowAddress { ip },
            None => Operation::Show {
                show_blocks: s.show_blocks,
            },
        },
        IpamCommand::Utilization { show_blocks } => Operation::Utilization { show_blocks },
        IpamCommand::Check { repair, .. } => Operation::Check {
            repair,
            nodes: None,
        },
        IpamCommand::ReleaseNode { name, force, .. } => Operation::ReleaseNode { name, force },
    })
}

/// Prints an outcome; fails the command where the outcome says it failed.
fn show(outcome: &Outcome, out: Output) -> anyhow::Result<()> {
    match outcome {
        Outcome::Pools { pools } => render::pools(out, pools),
        Outcome::PoolDeleted { pool } => {
            render::message(out, &format!("deleted pool {} ({})", pool.name, pool.cidr))
        }
        Outcome::Config { config } => render::config(out, config),
        Outcome::Assigned {
            handle,
            result,
            short,
        } => {
            render::assigned(out, handle, result)?;
            if let Some(short) = short {
                bail!(
                    "{short}: add a pool or free addresses; what was assigned stays under handle {handle:?}"
                );
            }
            Ok(())
        }
        Outcome::ReleasedHandle { handle, ips } => render::released_handle(out, handle, ips),
        Outcome::Released { report } => render::released(out, report),
        Outcome::Address { info } => render::address(out, info),
        Outcome::Show {
            utilization,
            blocks,
        } => render::show(out, utilization, blocks.as_deref()),
        Outcome::Utilization { utilization } => render::utilization(out, utilization),
        Outcome::Checked { repaired, report } => {
            for handle in repaired {
                eprintln!("repaired handle {handle:?}: its counts now match its blocks");
            }
            render::check(out, report)?;
            if !report.ok() {
                bail!(
                    "{} broken invariant(s) found: see the problems above",
                    report.problems.len()
                );
            }
            Ok(())
        }
        Outcome::NodeReleased { report } => render::node_released(out, report),
    }
}
