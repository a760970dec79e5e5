//! Operator commands that talk to the running agent over its socket: `weir status`,
//! `weir endpoint list|get`.

use std::{path::PathBuf, time::Duration};

use anyhow::{Context as _, Result};
use clap::{Args, Subcommand, ValueEnum};
use weir_api::{
    AddressView, Client, CounterView, CtFlushResponse, CtView, EndpointView, MapView, NatView,
    SocketLbScope, Status, TraceRequest, TraceResult,
};

/// How long an operator command waits for the agent's answer (a conntrack listing of a full
/// map takes seconds).
const ANSWER_WITHIN: Duration = Duration::from_secs(120);

/// Output format.
#[derive(Clone, Copy, Debug, Default, ValueEnum)]
pub enum Output {
    /// A table for people.
    #[default]
    Table,
    /// JSON for programs.
    Json,
}

/// Where the agent is and how to print.
#[derive(Debug, Args)]
pub struct Common {
    /// The agent's API socket.
    #[arg(long, env = "WEIR_API_SOCKET", default_value = weir_api::DEFAULT_SOCKET, global = true)]
    pub api_socket: PathBuf,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table, global = true)]
    pub output: Output,
}

/// `weir status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    common: Common,
    /// List every pod address known cluster-wide (this node's endpoints and other nodes' pods from
    /// their endpoint records) with the identity this node gives it and its node.
    #[arg(long)]
    all_addresses: bool,
}

/// `weir endpoint …`.
#[derive(Debug, Args)]
pub struct EndpointArgs {
    #[command(flatten)]
    common: Common,
    #[command(subcommand)]
    command: EndpointCommand,
}

#[derive(Debug, Subcommand)]
enum EndpointCommand {
    /// Every endpoint on this node.
    List,
    /// One endpoint, by `<container_id>:<ifname>`.
    Get {
        /// `<container_id>:<ifname>`.
        key: String,
    },
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start a tokio runtime")
}

pub(crate) fn client(common: &Common) -> Client {
    Client::new(&common.api_socket, ANSWER_WITHIN)
}

pub(crate) fn print_json(value: &impl serde::Serialize) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Runs `weir status`.
pub fn status(args: StatusArgs) -> Result<()> {
    if args.all_addresses {
        return all_addresses(&args.common);
    }
    let status: Status = runtime()?.block_on(client(&args.common).status())?;
    match args.common.output {
        Output::Json => print_json(&status),
        Output::Table => {
            println!("node:       {}", status.node);
            println!("ready:      {}", status.ready);
            println!("endpoints:  {}", status.endpoints);
            let detail = &status.detail;
            println!("links:      {} workload links", detail.state.workload_links);
            println!(
                "applied:    generation {} of {}",
                detail.applied.generation, detail.state.generation
            );
            if let Some(error) = &detail.applied.error {
                println!("last error: {error}");
            }
            if let Some(error) = &detail.applied.source_error {
                println!("source:     {error}");
            }
            if let Some(error) = &detail.applied.routes_error {
                println!("routes:     {error}");
            }
            if detail.storage.degraded {
                for f in &detail.storage.faults {
                    println!(
                        "storage:    DEGRADED: {} {}: {} ({} attempts)",
                        f.store,
                        f.path.display(),
                        f.cause,
                        f.attempts
                    );
                }
            } else {
                println!(
                    "storage:    ok ({} faults cleared since start)",
                    detail.storage.recoveries
                );
            }
            match &detail.socket_lb {
                Some(cgroup) => match detail.socket_lb_scope {
                    Some(SocketLbScope::Host) => println!(
                        "socket LB:  on, cgroup {}, the node's own network namespace only (pods translated per packet)",
                        cgroup.display()
                    ),
                    _ => println!("socket LB:  on, cgroup {}", cgroup.display()),
                },
                None => println!("socket LB:  off (Services translated per packet)"),
            }
            let ct = &detail.conntrack;
            println!(
                "conntrack:  ipv4 {}/{} entries, {} created, {} evicted; ipv6 {}/{} entries, {} created, {} evicted",
                ct.entries4,
                ct.max4,
                ct.created4,
                ct.evicted4,
                ct.entries6,
                ct.max6,
                ct.created6,
                ct.evicted6
            );
            println!(
                "services:   {}/{} translated flows' entries, {} swept",
                ct.service_flows4, ct.service_flows_max4, ct.service_flows_expired4
            );
            let nat = &detail.nat;
            println!(
                "nat:        {}/{} entries, {} pairs created, {} swept, {} port collisions, {} refused for want of a port, {} insert failures",
                nat.entries,
                nat.capacity,
                nat.created,
                nat.swept,
                nat.collisions,
                nat.exhausted,
                nat.insert_failed
            );
            for pool in &status.pools {
                println!(
                    "pool:       {} {} free {}{}",
                    pool.name,
                    pool.cidr,
                    pool.free,
                    if pool.disabled { " (disabled)" } else { "" }
                );
            }
            print!("{}", super::node::table(&detail.nodes));
            Ok(())
        }
    }
}

/// `weir status --all-addresses`.
fn all_addresses(common: &Common) -> Result<()> {
    let addresses: Vec<AddressView> =
        runtime()?.block_on(client(common).get("/v1/addresses", "the address list"))?;
    match common.output {
        Output::Json => print_json(&addresses),
        Output::Table => {
            println!("{:<40} {:<18} {:<24} POD", "ADDRESS", "IDENTITY", "NODE");
            for a in &addresses {
                println!(
                    "{:<40} {:<18} {:<24} {}",
                    a.ip,
                    a.identity.map_or_else(
                        || "-".into(),
                        |i| maps_schema::identity::reserved_name(i)
                            .map_or_else(|| i.to_string(), |r| format!("{i} ({r})"))
                    ),
                    a.node,
                    a.pod
                );
            }
            Ok(())
        }
    }
}

/// Runs `weir endpoint …`.
pub fn endpoint(args: EndpointArgs) -> Result<()> {
    let rt = runtime()?;
    let client = client(&args.common);
    let endpoints: Vec<EndpointView> = match &args.command {
        EndpointCommand::List => rt.block_on(client.list_endpoints())?,
        EndpointCommand::Get { key } => vec![
            rt.block_on(client.get_endpoint_by_key(key))?
                .with_context(|| format!("the agent has no endpoint {key}"))?,
        ],
    };
    match args.common.output {
        Output::Json if matches!(args.command, EndpointCommand::Get { .. }) => {
            print_json(&endpoints[0])
        }
        Output::Json => print_json(&endpoints),
        Output::Table => {
            println!(
                "{:<6} {:<30} {:<16} {:<10} {:<24} IPS",
                "ID", "ENDPOINT", "HOST LINK", "IDENTITY", "POD"
            );
            for e in &endpoints {
                let ips: Vec<String> = e.endpoint.ips.iter().map(ToString::to_string).collect();
                println!(
                    "{:<6} {:<30} {:<16} {:<10} {:<24} {}",
                    e.endpoint.id,
                    e.endpoint.key(),
                    e.endpoint.host_ifname,
                    e.identity.map_or_else(|| "-".into(), |i| i.to_string()),
                    format!("{}/{}", e.endpoint.namespace, e.endpoint.pod),
                    ips.join(",")
                );
            }
            Ok(())
        }
    }
}

/// `weir bpf …`.
#[derive(Debug, Args)]
pub struct BpfArgs {
    #[command(flatten)]
    common: Common,
    #[command(subcommand)]
    command: BpfCommand,
}

#[derive(Debug, Subcommand)]
enum BpfCommand {
    /// The pinned maps: name, id, sizes.
    Maps,
    /// Verdict counters by reason and direction (why packets passed or dropped).
    Counters,
    /// Conntrack.
    Ct {
        #[command(subcommand)]
        command: CtCommand,
    },
    /// The masquerade's NAT entries (`--masquerade-interfaces`).
    Nat {
        #[command(subcommand)]
        command: NatCommand,
    },
    /// Convert the pinned conntrack maps back to an older layout before an older weir starts
    /// (a rollback keeps every flow). Run it as root with no agent running; it works on the pins
    /// directly.
    Migrate {
        /// The conntrack layout the older weir uses (its agent names it when it refuses to start).
        #[arg(long)]
        to_version: u32,
        /// bpffs pin root.
        #[arg(long, env = "WEIR_BPF_ROOT", default_value = agent::paths::DEFAULT_BPF_ROOT)]
        bpf_root: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
enum CtCommand {
    /// Every conntrack entry.
    List,
    /// Delete every conntrack entry (established flows re-evaluate policy on their next packet).
    Flush,
}

#[derive(Debug, Subcommand)]
enum NatCommand {
    /// Every masqueraded flow: the pod's end, the remote end, what the pod's end became.
    List,
}

/// Runs `weir bpf …`.
pub fn bpf(args: BpfArgs) -> Result<()> {
    let rt = runtime()?;
    let client = client(&args.common);
    if let BpfCommand::Migrate {
        to_version,
        bpf_root,
    } = &args.command
    {
        return migrate(&rt, &client, bpf_root, *to_version, args.common.output);
    }
    match args.command {
        BpfCommand::Migrate { .. } => Ok(()),
        BpfCommand::Maps => {
            let maps: Vec<MapView> = rt.block_on(client.get("/v1/bpf/maps", "the map list"))?;
            if matches!(args.common.output, Output::Json) {
                return print_json(&maps);
            }
            println!(
                "{:<16} {:<8} {:<6} {:<6} {:<8} {:<10} PIN",
                "MAP", "ID", "TYPE", "KEY", "VALUE", "MAX"
            );
            for m in &maps {
                println!(
                    "{:<16} {:<8} {:<6} {:<6} {:<8} {:<10} {}",
                    m.name, m.id, m.map_type, m.key_size, m.value_size, m.max_entries, m.pin
                );
            }
            Ok(())
        }
        BpfCommand::Counters => {
            let counters: Vec<CounterView> =
                rt.block_on(client.get("/v1/bpf/counters", "the counters"))?;
            if matches!(args.common.output, Output::Json) {
                return print_json(&counters);
            }
            println!(
                "{:<5} {:<28} {:<14} {:>12} {:>14}",
                "CODE", "REASON", "DIRECTION", "PACKETS", "BYTES"
            );
            for c in &counters {
                println!(
                    "{:<5} {:<28} {:<14} {:>12} {:>14}",
                    c.code, c.reason, c.direction, c.packets, c.bytes
                );
            }
            Ok(())
        }
        BpfCommand::Ct {
            command: CtCommand::List,
        } => {
            let entries: Vec<CtView> =
                rt.block_on(client.get("/v1/bpf/ct", "the conntrack list"))?;
            if matches!(args.common.output, Output::Json) {
                return print_json(&entries);
            }
            println!(
                "{:<6} {:<46} {:<46} {:<8} {:<8} AGE",
                "PROTO", "A", "B", "FLAGS", "IDLE"
            );
            for e in &entries {
                println!(
                    "{:<6} {:<46} {:<46} {:<#8x} {:<8} {}s",
                    e.protocol,
                    e.a,
                    e.b,
                    e.flags,
                    format!("{}s", e.idle_secs),
                    e.age_secs
                );
            }
            Ok(())
        }
        BpfCommand::Nat {
            command: NatCommand::List,
        } => {
            let flows: Vec<NatView> = rt.block_on(client.get("/v1/bpf/nat", "the NAT list"))?;
            if matches!(args.common.output, Output::Json) {
                return print_json(&flows);
            }
            println!(
                "{:<6} {:<22} {:<22} {:<22} {:<8} {:<8} AGE",
                "PROTO", "POD", "REMOTE", "TRANSLATED", "REVERSE", "IDLE"
            );
            for f in &flows {
                println!(
                    "{:<6} {:<22} {:<22} {:<22} {:<8} {:<8} {}s",
                    f.protocol,
                    f.pod,
                    f.remote,
                    f.translated,
                    if f.reverse { "yes" } else { "missing" },
                    format!("{}s", f.idle_secs),
                    f.age_secs
                );
            }
            Ok(())
        }
        BpfCommand::Ct {
            command: CtCommand::Flush,
        } => {
            let result: CtFlushResponse =
                rt.block_on(client.delete("/v1/bpf/ct", "the conntrack flush"))?;
            match args.common.output {
                Output::Json => print_json(&result),
                Output::Table => {
                    println!("flushed {} conntrack entries", result.flushed);
                    Ok(())
                }
            }
        }
    }
}

/// `weir bpf migrate --to-version N`: refuses while an agent answers on the socket.
fn migrate(
    rt: &tokio::runtime::Runtime,
    client: &Client,
    bpf_root: &std::path::Path,
    to: u32,
    output: Output,
) -> Result<()> {
    let running = rt
        .block_on(client.get::<serde::de::IgnoredAny>("/v1/status", "the status request"))
        .is_ok();
    anyhow::ensure!(
        !running,
        "an agent is running (it answers on {}): stop it first; the older weir's agent must be the next to start",
        client.socket().display()
    );
    let paths = agent::paths::Paths::with_bpf_root(bpf_root);
    anyhow::ensure!(
        paths.maps_dir().is_dir(),
        "{} does not exist: pass the agent's --bpf-root",
        paths.maps_dir().display()
    );
    let report = agent::kernel::migrate::rollback(&paths.maps_dir(), to)
        .with_context(|| format!("converting conntrack to layout {to}"))?;
    match output {
        Output::Json => print_json(&report),
        Output::Table => {
            if report.steps.is_empty() {
                let any_ct = std::fs::read_dir(paths.maps_dir()).is_ok_and(|mut d| {
                    d.any(|e| {
                        e.ok().is_some_and(|e| {
                            let name = e.file_name();
                            let name = name.to_string_lossy();
                            name.starts_with("ct4_v") || name.starts_with("ct6_v")
                        })
                    })
                });
                if any_ct {
                    println!("conntrack is already at layout {to}; nothing to do");
                } else {
                    println!(
                        "no conntrack maps are pinned under {}; nothing to convert",
                        paths.maps_dir().display()
                    );
                }
            }
            for s in &report.steps {
                println!(
                    "{} -> {}: {} entries in {:.2}s; start the older agent next (it merges the last entries from {}:rollback)",
                    s.from, s.to, s.entries, s.seconds, s.from
                );
            }
            Ok(())
        }
    }
}

/// `weir policy …`.
#[derive(Debug, Args)]
pub struct PolicyArgs {
    #[command(flatten)]
    common: Common,
    #[command(subcommand)]
    command: PolicyCommand,
}

#[derive(Debug, Subcommand)]
enum PolicyCommand {
    /// Why would a packet from SRC to DST pass or drop? Evaluated on the agent's maps, and run
    /// through the loaded programs (BPF_PROG_TEST_RUN, conntrack untouched).
    Trace {
        /// Source address.
        #[arg(long)]
        src: std::net::IpAddr,
        /// Destination address.
        #[arg(long)]
        dst: std::net::IpAddr,
        /// tcp, udp, sctp, icmp, icmpv6 or a protocol number.
        #[arg(long, default_value = "tcp")]
        protocol: String,
        /// Destination port (ICMP: the message type).
        #[arg(long, default_value_t = 0)]
        port: u16,
        /// Source port of the kernel trace's packet (ICMP: echo identifier) [default: 40000].
        #[arg(long)]
        src_port: Option<u16>,
        /// TCP flags of the kernel trace's packet: syn (default), ack, syn-ack, fin-ack, rst.
        #[arg(long)]
        tcp_flags: Option<String>,
        /// The endpoint the packet leaves (container id, host interface or namespace/pod), for a
        /// source address it does not own; default: the endpoint that owns --src.
        #[arg(long)]
        from_endpoint: Option<String>,
    },
    /// Every compiled policy rule with the packets and bytes it decided.
    List,
    /// One policy's rules (NAMESPACE/NAME) with the packets and bytes each decided.
    Get {
        /// `namespace/name`.
        name: String,
    },
}

/// Runs `weir policy …`.
pub fn policy(args: PolicyArgs) -> Result<()> {
    let json = matches!(args.common.output, Output::Json);
    let (src, dst, protocol, port, src_port, tcp_flags, from_endpoint) = match args.command {
        PolicyCommand::Trace {
            src,
            dst,
            protocol,
            port,
            src_port,
            tcp_flags,
            from_endpoint,
        } => (src, dst, protocol, port, src_port, tcp_flags, from_endpoint),
        PolicyCommand::List => {
            return super::policy_view::rules(&args.common.api_socket, None, json);
        }
        PolicyCommand::Get { name } => {
            return super::policy_view::rules(&args.common.api_socket, Some(&name), json);
        }
    };
    let body = TraceRequest {
        src,
        dst,
        protocol,
        port,
        src_port,
        tcp_flags,
        from_endpoint,
    };
    let result: TraceResult = runtime()?.block_on(client(&args.common).post(
        "/v1/policy/trace",
        &body,
        "the policy trace",
    ))?;
    if json {
        return print_json(&result);
    }
    println!(
        "{src} (identity {}) -> {dst} (identity {})",
        result.src_identity, result.dst_identity
    );
    println!("user space (policy on the desired maps):");
    if let Some(svc) = &result.service {
        println!(
            "  service {} -> {}: {}",
            svc.frontend,
            svc.backend.as_deref().unwrap_or("no backend"),
            svc.reason
        );
    }
    for step in &result.steps {
        println!("  {:<5} {}: {}", step.verdict, step.stage, step.reason);
    }
    println!("verdict: {}", result.verdict);
    super::policy_view::print_kernel(&result);
    Ok(())
}
