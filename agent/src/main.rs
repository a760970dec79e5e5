//! The `weir` binary.

mod cli;

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser as _;

use crate::cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(&cli.command, Command::Agent(args) if !args.dump_config) {
        // A CLI command whose reader went away (`weir … | head`) ends quietly, as other tools
        // do, instead of panicking on the write. The agent keeps SIGPIPE ignored: a peer that
        // closes its socket must not kill it.
        // SAFETY: restoring a default disposition at start-up, before any thread exists.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    if let Err(e) = agent::logging::init(cli.log_format, &cli.log) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Agent(args) => {
            let config = args.validate()?;
            if args.dump_config {
                println!("{}", serde_json::to_string_pretty(&config)?);
                return Ok(());
            }
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .context("cannot start the tokio runtime")?;
            runtime.block_on(agent::daemon::run(config))?;
            Ok(())
        }
        Command::Ipam(args) => cli::ipam::run(args),
        Command::Status(args) => cli::agent_client::status(args),
        Command::Endpoint(args) => cli::agent_client::endpoint(args),
        Command::Node(args) => cli::node::run(&args),
        Command::Bpf(args) => cli::agent_client::bpf(args),
        Command::Service(args) => cli::service::run(&args),
        Command::Policy(args) => cli::agent_client::policy(args),
        Command::Monitor(args) => cli::monitor::monitor(args),
        Command::LogLevel(args) => cli::log_level::run(&args),
        Command::InstallCni(args) => cli::install::install_cni(&args),
        Command::MountBpffs => cli::install::mount_bpffs(),
        Command::Uninstall(args) => cli::install::uninstall(&args),
    }
}
