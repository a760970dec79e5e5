//! The `weir` command line: `weir agent` (the daemon) and the operator subcommands.

pub mod agent_client;
pub mod install;
pub mod ipam;
pub mod log_level;
pub mod monitor;
pub mod node;
pub mod policy_view;
pub mod service;

use clap::{Parser, Subcommand};

/// weir: an eBPF-first Kubernetes dataplane.
#[derive(Debug, Parser)]
#[command(name = "weir", version, about)]
pub struct Cli {
    /// Log filter (tracing `EnvFilter` syntax), e.g. `info` or `agent=debug`.
    #[arg(long, env = "WEIR_LOG", default_value = "info", global = true)]
    pub log: String,
    /// Log line format on stderr: `text` (colours only on a terminal) or `json` (one object per
    /// line, for log collectors).
    #[arg(long, env = "WEIR_LOG_FORMAT", value_enum, default_value_t = agent::logging::LogFormat::Text, global = true)]
    pub log_format: agent::logging::LogFormat,
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
    /// Policy tools: `weir policy trace` says why a packet would pass or drop (user space and the
    /// loaded programs); `weir policy list|get` show each rule's hits.
    Policy(agent_client::PolicyArgs),
    /// The agent's BPF maps and conntrack.
    Bpf(agent_client::BpfArgs),
    /// The cluster's nodes as this agent knows them: `weir node list` (health, last heartbeat, routes).
    Node(node::NodeArgs),
    /// Services from the agent's source: `weir service list` (frontends → backends, their state).
    Service(service::ServiceArgs),
    /// Dropped packets as they happen (sampled), with their reason.
    Monitor(monitor::MonitorArgs),
    /// Replace the running agent's log filter, e.g. `weir log-level debug`.
    LogLevel(log_level::LogLevelArgs),
    /// Copy weir-cni into the node's CNI bin directory atomically (the DaemonSet's init step).
    InstallCni(install::InstallCniArgs),
    /// Mount bpffs at /sys/fs/bpf if it is not mounted (the DaemonSet's privileged init step).
    MountBpffs,
    /// Remove weir from this node: the conflist, every attachment, the pin root (agent stopped).
    Uninstall(install::UninstallArgs),
    /// Work on an IPAM datastore directly, as `calicoctl ipam` does (no agent needed).
    Ipam(ipam::IpamArgs),
}
