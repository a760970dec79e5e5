//! `weir service list [-o json]`: the Services the agent's source describes, each frontend
//! (cluster IP, port, protocol) with its endpoints and their state (`GET /v1/services`).
//! `weir service flows [-o json]`: the flows translated per packet, each client's flow to a
//! frontend with the backend it was given (`GET /v1/services/flows`).

use anyhow::Result;
use clap::{Args, Subcommand};
use weir_api::{FlowView, ServiceView};

use super::agent_client::{Common, Output, client, print_json, runtime};

/// `weir service …`.
#[derive(Debug, Args)]
pub struct ServiceArgs {
    #[command(flatten)]
    common: Common,
    #[command(subcommand)]
    command: ServiceCommand,
}

#[derive(Debug, Subcommand)]
enum ServiceCommand {
    /// Every Service: frontends → backends, each `ready` (takes new flows), `terminating` (no new
    /// flows; its established ones finish) or `not-ready`.
    List,
    /// Every flow translated per packet (`svc_ct4_v1`): the client, the frontend it sent to, the
    /// backend it was given, the Service, and its conntrack entry's idle time (`-`: not in
    /// conntrack, swept soon).
    Flows,
}

/// Runs `weir service …`.
pub fn run(args: &ServiceArgs) -> Result<()> {
    match args.command {
        ServiceCommand::List => list(&args.common),
        ServiceCommand::Flows => flows(&args.common),
    }
}

fn list(common: &Common) -> Result<()> {
    let services: Vec<ServiceView> =
        runtime()?.block_on(client(common).get("/v1/services", "the service list"))?;
    match common.output {
        Output::Json => print_json(&services),
        Output::Table => {
            print!("{}", table(&services));
            Ok(())
        }
    }
}

fn flows(common: &Common) -> Result<()> {
    let flows: Vec<FlowView> =
        runtime()?.block_on(client(common).get("/v1/services/flows", "the translated flows"))?;
    match common.output {
        Output::Json => print_json(&flows),
        Output::Table => {
            println!(
                "{:<6} {:<22} {:<22} {:<22} {:<32} {:<8} AGE",
                "PROTO", "CLIENT", "FRONTEND", "BACKEND", "SERVICE", "IDLE"
            );
            for f in &flows {
                println!(
                    "{:<6} {:<22} {:<22} {:<22} {:<32} {:<8} {}s",
                    f.protocol,
                    f.client,
                    f.frontend,
                    f.backend,
                    f.service.as_deref().unwrap_or("-"),
                    f.idle_secs
                        .map_or_else(|| "-".to_owned(), |s| format!("{s}s")),
                    f.age_secs
                );
            }
            Ok(())
        }
    }
}

/// One line per (frontend, backend); a frontend with no endpoint gets one line with `-`.
fn table(services: &[ServiceView]) -> String {
    let mut out = format!(
        "{:<32} {:<28} {:<28} {:<12} SLICE\n",
        "SERVICE", "FRONTEND", "BACKEND", "STATE"
    );
    for f in services {
        if f.backends.is_empty() {
            out.push_str(&format!(
                "{:<32} {:<28} {:<28} {:<12} -\n",
                f.service, f.frontend, "-", "-"
            ));
        }
        for b in &f.backends {
            out.push_str(&format!(
                "{:<32} {:<28} {:<28} {:<12} {}\n",
                f.service,
                f.frontend,
                b.address,
                b.state.name(),
                b.slice
            ));
        }
    }
    out
}
