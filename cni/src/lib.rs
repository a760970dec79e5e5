//! `weir-cni`: weir's CNI plugin (CNI 1.0.0 and 1.1.0: ADD, DEL, CHECK, VERSION, GC, STATUS).
//!
//! The runtime runs it with the CNI environment and the network configuration on stdin. It
//! allocates addresses and registers endpoints through the weir agent's API socket, builds the
//! pod's veth with netlink, and attaches the agent's pinned programs. The result or a CNI error
//! object goes to stdout; logs go to stderr and the log file. See `docs/cni.md`.
//!
//! A library as well as the binary so that `fuzz/` reaches the parsers ([`config`], [`env`]).

mod agent;
mod attach;
mod commands;
pub mod config;
pub mod env;
pub mod error;
mod logging;
mod names;
mod netlink;
mod netns;
mod plumb;
mod result;

use std::io::{Read as _, Write as _};

use config::{Config, NEWEST_VERSION};
use env::{Command, Env};
use error::{CniCode, CniError, Code};

/// Reading stdin failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot read the network configuration from stdin: {0}")]
struct StdinError(#[source] std::io::Error);

impl CniCode for StdinError {
    fn code(&self) -> Code {
        Code::Io
    }
}

/// Runs one CNI command: reads stdin and the environment, prints the result or the error object;
/// the process exit code.
#[must_use]
pub fn run() -> i32 {
    let mut stdin = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut stdin) {
        return fail(&CniError::from_error(NEWEST_VERSION, &StdinError(e)));
    }
    // Errors echo the request's version when weir-cni speaks it.
    let version = config::peek_version(&stdin)
        .filter(|v| config::is_supported(v))
        .unwrap_or_else(|| NEWEST_VERSION.to_owned());
    let env = match Env::from_process() {
        Ok(env) => env,
        Err(e) => return fail(&CniError::from_error(&version, &e)),
    };
    if env.command == Command::Version {
        let asked = config::peek_version(&stdin).unwrap_or_else(|| NEWEST_VERSION.to_owned());
        return print(&commands::version_json(&asked));
    }
    let config = match Config::parse(&stdin) {
        Ok(c) => c,
        Err(e) => {
            logging::init("info", None);
            tracing::error!(command = ?env.command, error = %e, "bad network configuration");
            return fail(&CniError::from_error(&version, &e));
        }
    };
    logging::init(&config.log_level, Some(&config.log_file));
    let span = tracing::info_span!(
        "weir-cni",
        command = ?env.command,
        container_id = env.container_id.as_deref().unwrap_or("-"),
        ifname = env.ifname.as_deref().unwrap_or("-"),
    );
    let _entered = span.enter();
    if let Ok(raw) = serde_json::from_slice::<serde_json::Value>(&stdin) {
        tracing::debug!(config = %config::redacted(&raw), "request");
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&CniError::from_error(&version, &StdinError(e))),
    };
    match runtime.block_on(commands::run(&env, &config)) {
        Ok(Some(output)) => print(&output),
        Ok(None) => {
            tracing::info!("done");
            0
        }
        Err(e) => {
            tracing::error!(code = e.code().number(), error = %e, "failed");
            fail(&CniError::from_error(&config.cni_version, &e))
        }
    }
}

fn print(value: &serde_json::Value) -> i32 {
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{value}").and_then(|()| out.flush()) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("weir-cni: cannot write the result to stdout: {e}");
            1
        }
    }
}

fn fail(error: &CniError) -> i32 {
    let text = serde_json::to_string(error).unwrap_or_default();
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}");
    let _ = out.flush();
    1
}
