//! `cargo xtask bench multinode [--smoke]`: builds `weir` and runs the `multinode-bench` example of
//! the `tests` crate with it: IPAM at scale on a real etcd (1,000 hosts × 100 allocations, a client
//! per host; again through one shared client for comparison, `ipam_shared_client_*`), route
//! convergence on 50 simulated peers, and one TCP stream pod → pod across two node namespaces
//! against the bare underlay (native: two `weir agent`s on etcd with node records, pods through
//! `weir-cni`; vxlan: one `weir agent` per node, routes by the driver in process). Builds
//! `weir-cni` too. Prints a table and writes `target/weir-bench/multinode.json`. Release build;
//! `--smoke` uses the dev build and small sizes.

use std::path::Path;

use anyhow::Result;

use super::judge::{Cmp, Target, Threshold};

/// The targets (BENCHMARKS.md, Multi-node): IPAM at scale on etcd, route convergence, pod-to-pod
/// throughput against the bare underlay.
pub(crate) const TARGETS: &[Target] = &[
    Target::full(
        "ipam_duplicates",
        Cmp::Le,
        0.0,
        "no address is ever handed out twice",
        "BENCHMARKS.md: Multi-node",
    )
    .always()
    .may_be_zero(),
    Target::new(
        "ipam_p99_ms",
        Cmp::Le,
        Threshold::ValueOrFigure {
            value: 20.0,
            key: "etcd_wal_fsync_p99_ms",
            factor: 3.0,
        },
        "IPAM p99 (a client per host) <= 20 ms, or <= 3x etcd's own WAL fsync p99 on a slower disk",
        "BENCHMARKS.md: Multi-node",
    ),
    Target::full(
        "ipam_outside_blocks",
        Cmp::Le,
        0.0,
        "every address in its host's own blocks (the pool is far larger than needed)",
        "BENCHMARKS.md: Multi-node",
    )
    .always()
    .may_be_zero(),
    Target::full(
        "route_converge_s",
        Cmp::Le,
        1.0,
        "routes to new peers' blocks converge within 1 s",
        "BENCHMARKS.md: Multi-node",
    )
    .may_be_zero(),
    Target::full(
        "native_throughput_ratio",
        Cmp::Ge,
        0.9,
        "native routing keeps 90% of the bare underlay's stream",
        "BENCHMARKS.md: Multi-node",
    ),
    Target::full(
        "vxlan_throughput_ratio",
        Cmp::Ge,
        0.7,
        "vxlan keeps 70% of the bare underlay's stream",
        "BENCHMARKS.md: Multi-node",
    ),
];

pub(crate) fn run(workspace: &Path, smoke: bool) -> Result<()> {
    // The native figure's pods come through `weir-cni`, found beside the example's profile directory.
    let mut build = vec!["build", "-p", "cni", "--bin", "weir-cni"];
    if !smoke {
        build.push("--release");
    }
    crate::util::run(workspace, "cargo", &build)?;
    // `ipam_p99_ms` is judged on per-host clients (the example's default), as agents allocate; the
    // shared client's figures are reported beside it as `ipam_shared_client_*`.
    super::agent::run_example_with_weir_args(
        workspace,
        smoke,
        "multinode-bench",
        "multinode",
        &["--ipam-shared-extra"],
    )
}
