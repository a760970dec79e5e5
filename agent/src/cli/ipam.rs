//! `weir ipam …`: work on an IPAM datastore directly, as `calicoctl ipam` does (no agent needed).

mod render;

use std::{net::IpAddr, time::Duration};

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand, ValueEnum};
use ipam::{
    AssignArgs, Ipam,
    allocator::parse_pool_cidr,
    cidr::Family,
    model::{IpPool, IpUse, ReleaseCheck},
    store::{AnyStore, Datastore, any::DEFAULT_DATASTORE},
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
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    runtime.block_on(async move {
        // Validate what needs no datastore before opening it.
        if let IpamCommand::Pool(PoolCommand::Add(a)) = &args.command {
            build_pool(a)?;
        }
        let store = datastore.open(OPEN_WAIT).await?;
        dispatch(Ipam::new(store), args.command, args.output).await
    })
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

async fn dispatch(ipam: Ipam<AnyStore>, command: IpamCommand, out: Output) -> anyhow::Result<()> {
    match command {
        IpamCommand::Pool(PoolCommand::Add(a)) => {
            let pool = ipam.add_pool(build_pool(&a)?).await?;
            render::pools(out, &[pool])
        }
        IpamCommand::Pool(PoolCommand::List) => render::pools(out, &ipam.pools().await?),
        IpamCommand::Pool(PoolCommand::Delete { name, force }) => {
            let pool = ipam.delete_pool(&name, force).await?;
            render::message(out, &format!("deleted pool {} ({})", pool.name, pool.cidr))
        }
        IpamCommand::Config(ConfigCommand::Show) => render::config(out, &ipam.config().await?),
        IpamCommand::Config(ConfigCommand::Set {
            strict_affinity,
            max_blocks_per_host,
            cooldown,
            auto_allocate_blocks,
        }) => {
            let mut c = ipam.config().await?;
            c.strict_affinity = strict_affinity.unwrap_or(c.strict_affinity);
            c.max_blocks_per_host = max_blocks_per_host.unwrap_or(c.max_blocks_per_host);
            c.ip_cooldown_seconds = cooldown.unwrap_or(c.ip_cooldown_seconds);
            c.auto_allocate_blocks = auto_allocate_blocks.unwrap_or(c.auto_allocate_blocks);
            ipam.set_config(c.clone()).await?;
            render::config(out, &c)
        }
        IpamCommand::Allocate(a) => allocate(&ipam, a, out).await,
        IpamCommand::Release(r) => {
            if let Some(h) = r.handle {
                let ips = match ipam.release_by_handle(&h).await {
                    Ok(ips) => ips,
                    Err(ipam::IpamError::HandleNotFound { .. }) => Vec::new(),
                    Err(e) => return Err(e.into()),
                };
                return render::released_handle(out, &h, &ips);
            }
            let check = ReleaseCheck {
                sequence_number: r.sequence_number,
                handle: None,
            };
            let ips: Vec<_> = r.ips.iter().map(|ip| (*ip, check.clone())).collect();
            render::released(out, &ipam.release_ips(&ips).await?)
        }
        IpamCommand::Show(s) => match s.ip {
            Some(ip) => render::address(out, &ipam.address_info(ip).await?),
            None => {
                let util = ipam.utilization(false).await?;
                let blocks = if s.show_blocks {
                    Some(ipam.block_summaries().await?)
                } else {
                    None
                };
                render::show(out, &util, blocks.as_deref())
            }
        },
        IpamCommand::Utilization { show_blocks } => {
            render::utilization(out, &ipam.utilization(show_blocks).await?)
        }
        IpamCommand::Check { repair } => {
            if repair {
                for handle in ipam.repair_handles().await? {
                    eprintln!("repaired handle {handle:?}: its counts now match its blocks");
                }
            }
            let report = ipam.check().await?;
            render::check(out, &report)?;
            if !report.ok() {
                bail!(
                    "{} broken invariant(s) found: see the problems above",
                    report.problems.len()
                );
            }
            Ok(())
        }
    }
}

async fn allocate(ipam: &Ipam<AnyStore>, a: AllocateArgs, out: Output) -> anyhow::Result<()> {
    if let Some(ip) = a.ip {
        let net = ipam
            .assign_ip(ip, &a.handle, Default::default(), &a.host, None)
            .await?;
        let result = ipam::AssignResult {
            ipv4: if net.is_ipv4() { vec![net] } else { Vec::new() },
            ipv6: if net.is_ipv6() { vec![net] } else { Vec::new() },
            messages: Vec::new(),
        };
        return render::assigned(out, &a.handle, &result);
    }
    let (v4, v6) = match (a.ipv4, a.ipv6) {
        (None, None) => (1, 0),
        (v4, v6) => (v4.unwrap_or(0), v6.unwrap_or(0)),
    };
    let mut args = AssignArgs::new(&a.host, &a.handle, v4, v6);
    args.pools = a.pools;
    let result = ipam.auto_assign(&args).await?;
    render::assigned(out, &a.handle, &result)?;
    if let Some(short) = result.partial_fulfilment(&args) {
        bail!(
            "{short}: add a pool or free addresses; what was assigned stays under handle {:?}",
            a.handle
        );
    }
    Ok(())
}
