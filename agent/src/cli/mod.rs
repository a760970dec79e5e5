//! The `weir` command line: `weir agent` (the daemon) and the operator subcommands.

pub mod agent_client;
pub mod ipam;
pub mod monitor;

use clap::{Parser, Subcommand};

/// weir: an eBPF-first Kubernetes dataplane.
#[derive(Debug, Parser)]
#[command(name = "weir", version, about)]
pub struct Cli {
    /// Log filter (tracing `EnvFilter` syntax), e.g. `info` or `agent=debug`.
    #[arg(long, env = "WEIR_LOG", default_value = "info", global = true)]
    pub log: String,
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the node agent.
    Agent(Box<agent::config::AgentArgs>),
    /// The agent's state: readiness, endpoints, pools, apply progress.
    Status(agent_client::StatusArgs),
    /// Endpoints registered with the agent.
    Endpoint(agent_client::EndpointArgs),
    /// Policy tools: `weir policy trace` says why a packet would pass or drop.
    Policy(agent_client::PolicyArgs),
    /// The agent's BPF maps and conntrack.
    Bpf(agent_client::BpfArgs),
    /// Dropped packets as they happen (sampled), with their reason.
    Monitor(monitor::MonitorArgs),
    /// Work on an IPAM datastore directly, as `calicoctl ipam` does (no agent needed).
    Ipam(ipam::IpamArgs),
}
