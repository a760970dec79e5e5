//! `weir node list [-o json]`: the cluster's nodes as this node's agent knows them (`GET /v1/nodes`), each
//! with its source, health, routes, addresses and blocks; without node records (a node-local datastore), one
//! line that says so. A `silent` node has not been heard from within
//! its expiry: its routes stay while its record exists (fail static), and the table says for how long.

use anyhow::Result;
use clap::{Args, Subcommand};
use weir_api::NodeStatus;

use super::agent_client::{Common, Output, client, print_json, runtime};

/// `weir node …`.
#[derive(Debug, Args)]
pub struct NodeArgs {
    #[command(flatten)]
    common: Common,
    #[command(subcommand)]
    command: NodeCommand,
}

#[derive(Debug, Subcommand)]
enum NodeCommand {
    /// Every node with a record: `local`, `alive`, or `silent` (no heartbeat within its expiry; still
    /// routed until its record is deleted, e.g. by `weir ipam release-node`).
    List,
}

/// Runs `weir node …`.
pub fn run(args: &NodeArgs) -> Result<()> {
    match args.command {
        NodeCommand::List => list(&args.common),
    }
}

fn list(common: &Common) -> Result<()> {
    let nodes: Vec<NodeStatus> =
        runtime()?.block_on(client(common).get("/v1/nodes", "the node list"))?;
    match common.output {
        Output::Json => print_json(&nodes),
        Output::Table => {
            print!("{}", list_text(&nodes));
            Ok(())
        }
    }
}

/// What `weir node list` prints without node records.
pub const NO_RECORDS: &str = "no node records: this agent keeps none with a node-local datastore (the default \
    embedded one; node records, routes to other nodes and their health come with a shared datastore: \
    `--datastore etcd:URL`, or `--datastore kubernetes` with `--source kubernetes`), or it has not read them yet";

/// `weir node list`'s table, or [`NO_RECORDS`] when there are no nodes.
#[must_use]
pub fn list_text(nodes: &[NodeStatus]) -> String {
    if nodes.is_empty() {
        format!("{NO_RECORDS}\n")
    } else {
        table(nodes)
    }
}

/// The nodes as a table (also `weir status`'s); empty without nodes.
#[must_use]
pub fn table(nodes: &[NodeStatus]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    if nodes.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "{:<24} {:<11} {:<8} {:<10} {:<7} {:<28} BLOCKS",
        "NODE", "SOURCE", "HEALTH", "LAST SEEN", "ROUTES", "ADDRESSES"
    );
    for n in nodes {
        let addresses: Vec<String> = n.addresses.iter().map(ToString::to_string).collect();
        let blocks: Vec<String> = n.blocks.iter().map(ToString::to_string).collect();
        let seen = n
            .last_seen_secs
            .map_or_else(|| "-".to_owned(), |s| format!("{s}s ago"));
        let _ = writeln!(
            out,
            "{:<24} {:<11} {:<8} {:<10} {:<7} {:<28} {}",
            n.name,
            n.source,
            n.health,
            seen,
            n.routes,
            addresses.join(","),
            blocks.join(",")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_shows_a_silent_node_and_how_long_ago_it_was_heard_from() {
        let node = |name: &str, health: &str, seen: Option<u64>| NodeStatus {
            name: name.into(),
            addresses: vec!["192.0.2.2".parse().expect("ip")],
            blocks: vec!["10.244.1.0/26".parse().expect("cidr")],
            routes: 1,
            health: health.into(),
            heartbeat: 1,
            last_seen_secs: seen,
            source: weir_api::NodeSource::Etcd,
        };
        let text = table(&[node("a", "local", None), node("b", "silent", Some(42))]);
        let lines: Vec<Vec<&str>> = text
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(lines[1][..3], ["a", "etcd", "local"]);
        assert_eq!(
            lines[2][..5],
            ["b", "etcd", "silent", "42s", "ago"],
            "{text}"
        );
        assert!(table(&[]).is_empty());
        assert_eq!(
            list_text(&[node("a", "local", None)]),
            table(&[node("a", "local", None)])
        );
    }

    #[test]
    fn the_list_without_node_records_says_so_and_why() {
        let text = list_text(&[]);
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.starts_with("no node records: "), "{text}");
        for why in [
            "node-local datastore",
            "--datastore etcd:URL",
            "--source kubernetes",
        ] {
            assert!(text.contains(why), "{why:?} not in {text}");
        }
    }
}
