//! `cargo xtask bench services [--smoke] [--only testrun|traffic|update|socket|sweep]`: builds the
//! `bench` variant of the eBPF object, `weir` and the tests' `wt-sockclient`, runs the `services-bench` example of the tests crate
//! with them (root: it loads programs, builds namespaces and runs an agent), prints a table and
//! writes `target/weir-bench/services.json`. Release build; `--smoke` uses the dev build and tiny
//! sizes.

use std::path::Path;

use anyhow::{Context as _, Result};
use serde_json::Value;

use crate::ebpf_build::EbpfBuild;

use super::judge::{Cmp, Target};

/// The targets (issue 13; BENCHMARKS.md, Services).
pub(crate) const TARGETS: &[Target] = &[
    Target::full(
        "established_ratio",
        Cmp::Le,
        1.3,
        "an established translated flow costs at most 1.3x a plain one",
        "issue 13",
    ),
    Target::full(
        "new_ratio",
        Cmp::Le,
        1.5,
        "a new translated flow costs at most 1.5x a plain one",
        "issue 13",
    ),
    Target::full(
        "flatness_ratio",
        Cmp::Le,
        1.15,
        "flat from the fewest to the most Services",
        "issue 13",
    ),
    Target::full(
        "iptables_over_weir_per_run_10k",
        Cmp::Ge,
        100.0,
        "kube-proxy's iptables mode adds at least 100x weir's cost at 10,000 Services (median of the runs' ratios)",
        "issue 13",
    )
    .any_sign(),
    Target::full(
        "nft_over_weir_per_run_10k",
        Cmp::Gt,
        1.0,
        "weir adds less than kube-proxy's nftables mode at 10,000 Services (median of the runs' ratios)",
        "issue 13",
    )
    .any_sign(),
    Target::full(
        "service_update_ms",
        Cmp::Le,
        10.0,
        "one Service added at 10,000 Services reaches the kernel within 10 ms",
        "issue 13",
    ),
];

/// Figures printed, with the target each one is measured against.
const ROWS: &[(&str, &str)] = &[
    (
        "established_ns",
        "established plain flow, ns/packet (single runs)",
    ),
    (
        "translated_established_ns",
        "established translated flow, ns/packet",
    ),
    (
        "established_ratio",
        "  translated over plain (target <= 1.3)",
    ),
    ("new_ns", "new plain flow (SYN), ns"),
    (
        "translated_new_ns",
        "new translated flow (SYN to a ClusterIP), ns",
    ),
    ("new_ratio", "  translated over plain (target <= 1.5)"),
    (
        "flatness_ratio",
        "flatness: most Services over fewest (target <= 1.15)",
    ),
    ("traffic_services_1k", "traffic, smaller Service count"),
    (
        "weir_added_raw_ns_1k",
        "  weir added, ns/packet, as measured",
    ),
    (
        "weir_added_ns_1k",
        "  weir added (at least its test-run cost)",
    ),
    ("iptables_added_ns_1k", "  kube-proxy iptables mode added"),
    ("nft_added_ns_1k", "  kube-proxy nftables mode added"),
    ("traffic_services_10k", "traffic, larger Service count"),
    ("traffic_none_ns_10k", "  no translation, ns/packet"),
    (
        "weir_added_raw_ns_10k",
        "  weir added, ns/packet, as measured",
    ),
    (
        "weir_added_ns_10k",
        "  weir added (at least its test-run cost)",
    ),
    ("iptables_added_ns_10k", "  kube-proxy iptables mode added"),
    ("nft_added_ns_10k", "  kube-proxy nftables mode added"),
    ("iptables_over_weir_10k", "  iptables over weir (medians)"),
    ("nft_over_weir_10k", "  nftables over weir (medians)"),
    (
        "iptables_over_weir_per_run_10k",
        "  iptables over weir, median of runs (target >= 100)",
    ),
    ("iptables_over_weir_per_run_min_10k", "    its lowest run"),
    ("iptables_over_weir_per_run_max_10k", "    its highest run"),
    (
        "nft_over_weir_per_run_10k",
        "  nftables over weir, median of runs (target > 1)",
    ),
    ("nft_over_weir_per_run_min_10k", "    its lowest run"),
    ("nft_over_weir_per_run_max_10k", "    its highest run"),
    (
        "weir_direct_added_ns_10k",
        "  weir straight to the backend added (its datapath, no Service)",
    ),
    (
        "weir_service_added_raw_ns_10k",
        "  weir's Service alone (ClusterIP over straight), as measured",
    ),
    (
        "weir_service_added_ns_10k",
        "  weir's Service alone (at least its test-run difference)",
    ),
    (
        "iptables_over_weir_service_10k",
        "  iptables over weir's Service alone",
    ),
    (
        "nft_over_weir_service_10k",
        "  nftables over weir's Service alone",
    ),
    ("update_services", "update: Services in the agent's source"),
    (
        "service_update_ms",
        "  one Service added, watch event to svc4_v1, ms (target <= 10)",
    ),
    ("service_update_max_ms", "  the same, slowest round, ms"),
    (
        "service_full_sync_ms",
        "  all Services from the API server, agent spawned to svc4_v1, ms",
    ),
    (
        "dir_service_update_ms",
        "  directory source: one Service added, file to svc4_v1, ms",
    ),
    (
        "dir_service_full_sync_ms",
        "  directory source: all Services, agent spawned to svc4_v1, ms",
    ),
    (
        "iptables_restore_ms_10k",
        "  iptables-nft-restore of the full table, ms",
    ),
    ("conn_services", "socket LB: Services in the agent's source"),
    (
        "conn_direct_ns",
        "  TCP connection to the backend, ns (wall)",
    ),
    ("conn_socket_ns", "  to the ClusterIP, socket LB, ns (wall)"),
    (
        "conn_packet_ns",
        "  to the ClusterIP, per packet, ns (wall)",
    ),
    (
        "run_from_endpoint_direct_ns",
        "  from_endpoint ns/run: straight to the backend",
    ),
    (
        "run_from_endpoint_socket_ns",
        "  from_endpoint ns/run: socket LB",
    ),
    (
        "run_from_endpoint_packet_ns",
        "  from_endpoint ns/run: per packet",
    ),
    (
        "run_to_endpoint_direct_ns",
        "  to_endpoint ns/run: straight to the backend",
    ),
    (
        "run_to_endpoint_socket_ns",
        "  to_endpoint ns/run: socket LB",
    ),
    (
        "run_to_endpoint_packet_ns",
        "  to_endpoint ns/run: per packet",
    ),
    (
        "run_sock_connect4_socket_ns",
        "  sock_connect4 ns/run (one per connect)",
    ),
    (
        "conn_udp_direct_ns",
        "  UDP exchange (new socket) with the backend, ns (wall)",
    ),
    (
        "conn_udp_socket_ns",
        "  with the ClusterIP, socket LB, ns (wall)",
    ),
    (
        "conn_udp_packet_ns",
        "  with the ClusterIP, per packet, ns (wall)",
    ),
    (
        "run_from_endpoint_udp_direct_ns",
        "  from_endpoint ns/run, UDP: to the backend",
    ),
    (
        "run_from_endpoint_udp_socket_ns",
        "  from_endpoint ns/run, UDP: socket LB",
    ),
    (
        "run_from_endpoint_udp_packet_ns",
        "  from_endpoint ns/run, UDP: per packet",
    ),
    (
        "run_to_endpoint_udp_direct_ns",
        "  to_endpoint ns/run, UDP: to the backend",
    ),
    (
        "run_to_endpoint_udp_socket_ns",
        "  to_endpoint ns/run, UDP: socket LB",
    ),
    (
        "run_to_endpoint_udp_packet_ns",
        "  to_endpoint ns/run, UDP: per packet",
    ),
    (
        "run_sock_sendmsg4_udp_socket_ns",
        "  sock_sendmsg4 ns/run (one per sendto)",
    ),
    (
        "run_sock_recvmsg4_udp_socket_ns",
        "  sock_recvmsg4 ns/run (one per recvfrom)",
    ),
    ("sweep_flows", "sweep: translated flows in ct4"),
    ("sweep_ct_only_ms", "  conntrack sweep, svc_ct4 empty, ms"),
    (
        "sweep_with_service_flows_ms",
        "  the same with their svc_ct4 entries, ms",
    ),
    (
        "sweep_removing_stale_ms",
        "  the sweep that removes as many stale svc_ct4 entries, ms",
    ),
];

pub(crate) fn run(workspace: &Path, smoke: bool) -> Result<()> {
    run_part(workspace, smoke, None)
}

/// The benchmark, or only one of its parts (the other parts' rows print `-`).
pub(crate) fn run_part(workspace: &Path, smoke: bool, only: Option<&str>) -> Result<()> {
    let object = EbpfBuild {
        workspace,
        release: true,
        features: &["bench"],
    }
    .run()
    .map_err(|e| anyhow::anyhow!("building the bench eBPF variant: {e}"))?;
    let object = object.to_string_lossy().into_owned();
    // The socket part's client (found beside the example, in the same profile's directory).
    let mut client = vec!["build", "-p", "tests", "--bin", "wt-sockclient"];
    if !smoke {
        client.push("--release");
    }
    crate::util::run(workspace, "cargo", &client)?;
    let mut extra = vec!["--object", object.as_str()];
    if let Some(part) = only {
        extra.extend(["--only", part]);
    }
    super::agent::run_example_with_weir_args(
        workspace,
        smoke,
        "services-bench",
        "services",
        &extra,
    )?;
    let path = workspace.join("target/weir-bench/services.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let mut figures: Value = serde_json::from_str(&text).context("malformed services.json")?;
    // The no-translation baseline at the larger size under its issue-style name.
    if let (Some(n), Some(map)) = (
        figures.get("traffic_services_10k").and_then(Value::as_u64),
        figures.as_object_mut(),
    ) && let Some(v) = map.get(&format!("traffic_none_ns_s{n}")).cloned()
    {
        map.insert("traffic_none_ns_10k".into(), v);
        std::fs::write(&path, serde_json::to_string_pretty(&figures)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    println!(
        "{:<56} {:>12}",
        "services benchmark",
        if smoke { "smoke" } else { "value" }
    );
    for (key, label) in ROWS {
        let v = figures
            .get(key)
            .and_then(Value::as_f64)
            .map_or_else(|| "-".to_owned(), |f| format!("{f:.2}"));
        println!("{label:<56} {v:>12}");
    }
    Ok(())
}
