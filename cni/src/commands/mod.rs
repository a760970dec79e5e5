//! The CNI commands. Each returns the JSON to print (ADD) or nothing, or a [`CommandError`] that
//! `main` prints as a CNI error object.

mod add;
mod check;
mod del;
mod gc;
mod status;

use serde_json::Value;

use crate::{
    agent::{AgentClient, AgentError},
    attach::AttachError,
    config::{Config, ConfigError},
    env::{Command, Env, EnvError},
    error::{CniCode, Code},
    netlink::NetlinkError,
    netns::NetnsError,
    plumb::PlumbError,
};

/// Everything a command can fail with.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// The environment.
    #[error(transparent)]
    Env(#[from] EnvError),
    /// The configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The agent.
    #[error(transparent)]
    Agent(#[from] AgentError),
    /// The network namespace.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// Netlink.
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    /// Building the pod's network.
    #[error(transparent)]
    Plumb(#[from] PlumbError),
    /// The endpoint programs.
    #[error(transparent)]
    Attach(#[from] AttachError),
    /// No netlink socket.
    #[error("cannot open a netlink socket: {0}")]
    NetlinkSocket(#[source] std::io::Error),
    /// The agent handed out fewer addresses than asked for.
    #[error(
        "the agent allocated {got} but the pod needs {wanted}; add a pool of the missing family or change ipam.families"
    )]
    ShortAllocation {
        /// What was asked for.
        wanted: String,
        /// What came back.
        got: String,
    },
    /// ADD failed and undoing it failed too.
    #[error("{primary}; undoing the ADD also failed: {rollback}")]
    RolledBack {
        /// The first failure.
        primary: Box<CommandError>,
        /// What could not be undone.
        rollback: String,
    },
    /// CHECK and DEL-time reads need a prevResult that is a CNI result.
    #[error("prevResult is not a CNI result: {0}; pass the ADD result unchanged")]
    BadPrevResult(#[source] serde_json::Error),
    /// `args.cni.labels` is set: labels come from the source now.
    #[error(
        "args.cni.labels is no longer a label source: a pod's labels come from its Pod object \
         (a `kind: Pod` document in the agent's --policy-dir, or the Kubernetes API); remove \
         args.cni.labels from the network configuration"
    )]
    LabelsInConfig,
    /// CHECK needs a prevResult.
    #[error("CHECK needs prevResult (the ADD result); the runtime must pass it")]
    NoPrevResult,
    /// GC needs the list of attachments to keep.
    #[error(
        "GC needs cni.dev/valid-attachments (the attachments to keep); the runtime must pass it, [] for none"
    )]
    NoValidAttachments,
    /// CHECK found differences.
    #[error("the pod differs from its ADD result: {}", .0.join("; "))]
    Drift(Vec<String>),
    /// GC could not release everything.
    #[error("GC could not release every stale attachment: {}", .failures.join("; "))]
    Gc {
        /// The code of the first failure.
        code: Code,
        /// What failed.
        failures: Vec<String>,
    },
    /// STATUS: the agent cannot be asked.
    #[error("weir-cni cannot serve ADD: {0}")]
    AgentUnavailable(#[source] AgentError),
    /// STATUS: the agent is not ready.
    #[error(
        "the weir agent is not ready yet (no first in-sync, or its dataplane is failing); see its log and `weir status`"
    )]
    AgentNotReady,
    /// STATUS: a pool the conflist names does not exist.
    #[error(
        "pool {name} named in ipam.pools does not exist; create it (weir ipam pool add) or fix the conflist"
    )]
    NoSuchPool {
        /// The pool.
        name: String,
    },
    /// STATUS: no pool of a family the pod needs has free addresses.
    #[error("no {family} pool has free addresses (pools: {pools:?}); add a pool or free addresses")]
    NoFreeAddresses {
        /// `IPv4` or `IPv6`.
        family: &'static str,
        /// The pools of that family the conflist allows.
        pools: Vec<String>,
    },
    /// GC and STATUS exist from CNI 1.1.0 on.
    #[error(
        "{verb} is a CNI 1.1.0 command but the network configuration says cniVersion {version}; runtimes send {verb} only with a 1.1.0 conflist (weir agent --cni-version 1.1.0)"
    )]
    NeedsNewerVersion {
        /// The command.
        verb: &'static str,
        /// The configuration's version.
        version: String,
    },
}

impl CniCode for CommandError {
    fn code(&self) -> Code {
        match self {
            Self::Env(e) => e.code(),
            Self::Config(e) => e.code(),
            Self::Agent(e) => e.code(),
            Self::Netns(e) => e.code(),
            Self::Netlink(e) => e.code(),
            Self::Plumb(e) => e.code(),
            Self::Attach(e) => e.code(),
            Self::NetlinkSocket(_) => Code::Netlink,
            Self::ShortAllocation { .. } => Code::Ipam,
            Self::RolledBack { primary, .. } => primary.code(),
            Self::BadPrevResult(_) => Code::Decode,
            Self::NoPrevResult | Self::NoValidAttachments | Self::LabelsInConfig => {
                Code::InvalidConfig
            }
            Self::Drift(_) => Code::Drift,
            Self::Gc { code, .. } => *code,
            Self::AgentUnavailable(_)
            | Self::AgentNotReady
            | Self::NoSuchPool { .. }
            | Self::NoFreeAddresses { .. } => Code::NotAvailable,
            Self::NeedsNewerVersion { .. } => Code::IncompatibleVersion,
        }
    }
}

/// Runs `env.command` (not VERSION, which `main` answers without a config).
pub async fn run(env: &Env, config: &Config) -> Result<Option<Value>, CommandError> {
    let client = AgentClient::new(&config.agent_socket, config.agent_timeout);
    // The request is answered in the version it was made in: 1.1.0's verbs only at 1.1.0.
    let verb = match env.command {
        Command::Gc => Some("GC"),
        Command::Status => Some("STATUS"),
        _ => None,
    };
    if let Some(verb) = verb
        && config.cni_version == "1.0.0"
    {
        return Err(CommandError::NeedsNewerVersion {
            verb,
            version: config.cni_version.clone(),
        });
    }
    match env.command {
        Command::Add => add::add(env, config, &client).await.map(Some),
        Command::Del => del::del(env, config, &client).await.map(|()| None),
        Command::Check => check::check(env, config, &client).await.map(|()| None),
        Command::Gc => gc::gc(config, &client).await.map(|()| None),
        Command::Status => status::status(config, &client).await.map(|()| None),
        Command::Version => Ok(Some(version_json(&config.cni_version))),
    }
}

/// `config` with the pin root of the agent `client` talks to, for CHECK and GC (ADD and DEL learn
/// it from their own agent calls).
async fn with_agent_pin_root(
    config: &Config,
    client: &AgentClient,
) -> Result<Config, CommandError> {
    let status = client.status().await?;
    let mut config = config.clone();
    config.adopt_agent_pin_root(status.agent_pin_root())?;
    Ok(config)
}

/// The VERSION answer.
#[must_use]
pub fn version_json(cni_version: &str) -> Value {
    serde_json::json!({
        "cniVersion": cni_version,
        "supportedVersions": crate::config::SUPPORTED_VERSIONS,
    })
}

/// A netlink connection in weir-cni's own (the node's) namespace.
fn host_netlink() -> Result<crate::netlink::Netlink, CommandError> {
    crate::netlink::Netlink::here().map_err(CommandError::NetlinkSocket)
}
