//! `weir monitor`: the agent's sampled drop events as they happen (`GET /v1/monitor`), filtered
//! by reason, endpoint and addresses.

use std::{collections::BTreeMap, net::IpAddr, ops::ControlFlow, time::Duration};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use weir_api::{Client, DropEventView};

use super::agent_client::{Common, Output};

/// How long the agent may take to start the stream.
const ANSWER_WITHIN: Duration = Duration::from_secs(30);

/// `weir monitor`.
#[derive(Debug, Args)]
pub struct MonitorArgs {
    #[command(flatten)]
    common: Common,
    /// Only drops of this reason (`policy-denied`, `spoofed-source`, … as `weir bpf counters`
    /// names them).
    #[arg(long)]
    reason: Option<String>,
    /// Only drops on this endpoint's host link (`<container_id>:<ifname>`).
    #[arg(long)]
    endpoint: Option<String>,
    /// Only packets from this address.
    #[arg(long)]
    from: Option<IpAddr>,
    /// Only packets to this address.
    #[arg(long)]
    to: Option<IpAddr>,
    /// Stop after this many events (default: until interrupted).
    #[arg(long)]
    count: Option<u64>,
}

/// Runs `weir monitor`.
pub fn monitor(args: MonitorArgs) -> Result<()> {
    if let Some(reason) = &args.reason
        && !maps_schema::reason::ALL
            .iter()
            .any(|&c| maps_schema::reason::name(c) == reason)
    {
        let names: Vec<&str> = maps_schema::reason::ALL
            .iter()
            .map(|&c| maps_schema::reason::name(c))
            .collect();
        bail!(
            "--reason {reason:?} is no drop reason; use one of {}",
            names.join(", ")
        );
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start a tokio runtime")?;
    let client = Client::new(&args.common.api_socket, ANSWER_WITHIN);
    runtime.block_on(async {
        // Endpoint names by host link, to filter and to print.
        let links: BTreeMap<u32, String> = client
            .list_endpoints()
            .await?
            .into_iter()
            .filter_map(|v| Some((v.ifindex?, v.endpoint.key())))
            .collect();
        let ifindex = match &args.endpoint {
            Some(key) => Some(
                links
                    .iter()
                    .find(|(_, k)| *k == key)
                    .map(|(i, _)| *i)
                    .with_context(|| {
                        format!("the agent has no endpoint {key} with a host link")
                    })?,
            ),
            None => None,
        };
        let mut shown = 0;
        let wanted = |e: &DropEventView| {
            args.reason.as_ref().is_none_or(|r| *r == e.reason)
                && ifindex.is_none_or(|i| i == e.ifindex)
                && args.from.is_none_or(|a| e.src == Some(a))
                && args.to.is_none_or(|a| e.dst == Some(a))
        };
        if matches!(args.common.output, Output::Table) {
            println!(
                "{:<26} {:<14} {:<28} {:<6} {:<46} DESTINATION",
                "REASON", "DIRECTION", "ENDPOINT", "PROTO", "SOURCE"
            );
        }
        client
            .stream_lines(
                "/v1/monitor",
                "the drop event stream",
                || {
                    eprintln!(
                        "monitoring drop events on {} (sampled: the first and every {}th drop of a reason on each CPU)",
                        args.common.api_socket.display(),
                        maps_schema::events::SAMPLE_EVERY
                    );
                },
                |event: DropEventView| {
                    if !wanted(&event) {
                        return ControlFlow::Continue(());
                    }
                    print(&event, &links, args.common.output);
                    shown += 1;
                    if args.count.is_some_and(|n| shown >= n) {
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(())
                    }
                },
            )
            .await?;
        Ok(())
    })
}

fn print(event: &DropEventView, links: &BTreeMap<u32, String>, output: Output) {
    if matches!(output, Output::Json) {
        match serde_json::to_string(event) {
            Ok(line) => println!("{line}"),
            Err(e) => eprintln!("cannot encode a drop event: {e}"),
        }
        return;
    }
    let end = |ip: Option<IpAddr>, port: Option<u16>| match (ip, port) {
        (Some(IpAddr::V6(ip)), Some(port)) => format!("[{ip}]:{port}"),
        (Some(ip), Some(port)) => format!("{ip}:{port}"),
        (Some(ip), None) => ip.to_string(),
        (None, _) => "-".to_owned(),
    };
    let endpoint = links
        .get(&event.ifindex)
        .cloned()
        .unwrap_or_else(|| format!("ifindex {}", event.ifindex));
    println!(
        "{:<26} {:<14} {:<28} {:<6} {:<46} {}",
        event.reason,
        event.direction,
        endpoint,
        event
            .protocol
            .map_or_else(|| "-".to_owned(), |p| p.to_string()),
        end(event.src, event.src_port),
        end(event.dst, event.dst_port)
    );
}
