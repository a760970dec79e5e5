//! `weir log-level FILTER`: replaces the running agent's log filter (`POST /v1/log-level`).

use anyhow::{Context as _, Result};
use clap::Args;
use weir_api::LogLevel;

use super::agent_client::{Common, Output, client};

/// `weir log-level`.
#[derive(Debug, Args)]
pub struct LogLevelArgs {
    /// A level (`error`, `warn`, `info`, `debug`, `trace`) or an `EnvFilter` directive
    /// (`agent=debug,info`).
    pub level: String,
    #[command(flatten)]
    common: Common,
}

/// Sends the filter to the agent and prints the one now in force.
pub fn run(args: &LogLevelArgs) -> Result<()> {
    let request = LogLevel {
        level: args.level.clone(),
    };
    let answer: LogLevel = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start a tokio runtime")?
        .block_on(client(&args.common).post("/v1/log-level", &request, "the log level"))?;
    match args.common.output {
        Output::Json => println!("{}", serde_json::to_string(&answer)?),
        Output::Table => println!("log level: {}", answer.level),
    }
    Ok(())
}
