//! `weir agent`: load and pin the programs, attach what the operator asked for, serve until
//! SIGTERM, then exit leaving pins and attachments in place (so traffic keeps its verdicts).

use aya::programs::Xdp;
use serde::Serialize;

use crate::{
    EBPF_OBJECT,
    attach::{self, AttachError, AttachMode},
    config::Config,
    loader::{self, LoadError, LoadReport},
};

/// Errors that stop the agent.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// Loading failed.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// Attaching the prefilter failed.
    #[error(transparent)]
    Attach(#[from] AttachError),
    /// The object lacks the prefilter program.
    #[error("the eBPF object has no usable {0} program; rebuild the agent")]
    MissingProgram(&'static str),
    /// Signal handling failed.
    #[error("cannot install signal handlers: {0}")]
    Signals(#[source] std::io::Error),
}

/// What the agent prints once it has loaded (one JSON line on stdout).
#[derive(Debug, Serialize)]
pub struct Started<'a> {
    /// Always `"started"`.
    pub event: &'static str,
    /// The node.
    pub node: &'a str,
    /// Programs and maps.
    pub loaded: LoadReport,
    /// Prefilter attachments.
    pub prefilter: Vec<(String, AttachMode)>,
}

/// Runs the agent until SIGTERM or SIGINT.
pub async fn run(config: Config) -> Result<(), DaemonError> {
    let mut loaded = loader::load_pinned(&config.paths, EBPF_OBJECT)?;
    let mut prefilter = Vec::new();
    if !config.prefilter_interfaces.is_empty() {
        let name = maps_schema::programs::XDP_PREFILTER;
        let program: &mut Xdp = loaded
            .ebpf
            .program_mut(name)
            .and_then(|p| p.try_into().ok())
            .ok_or(DaemonError::MissingProgram(name))?;
        for ifname in &config.prefilter_interfaces {
            let mode =
                attach::attach_xdp(program, name, ifname, &config.paths.link_pin(ifname, name))?;
            tracing::info!(ifname, ?mode, "attached xdp_prefilter");
            prefilter.push((ifname.clone(), mode));
        }
    }
    let report = loaded.report(&config.paths);
    for p in &report.programs {
        tracing::info!(program = %p.name, id = p.id, pin = %p.pin.display(), "program loaded");
    }
    for m in &report.maps {
        tracing::info!(map = %m.name, id = m.id, max_entries = m.max_entries, pin = %m.pin.display(), "map pinned");
    }
    let started = Started {
        event: "started",
        node: &config.node,
        loaded: report,
        prefilter,
    };
    match serde_json::to_string(&started) {
        Ok(line) => println!("{line}"),
        Err(e) => tracing::warn!(error = %e, "cannot serialise the start report"),
    }

    wait_for_shutdown().await?;
    tracing::info!("shutting down; programs, maps and attachments stay pinned");
    Ok(())
}

async fn wait_for_shutdown() -> Result<(), DaemonError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(DaemonError::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(DaemonError::Signals)?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM"),
        _ = int.recv() => tracing::info!("SIGINT"),
    }
    Ok(())
}
