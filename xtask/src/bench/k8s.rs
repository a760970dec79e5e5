//! `cargo xtask bench k8s [--smoke]`: builds `weir` and runs the `k8s-bench` example of the
//! `tests` crate with it (the real `weir agent --source kubernetes` against the test API server in
//! a `wt*` node namespace: 5,000 pods, 100 namespaces, 1,000 policies), which prints a table and
//! writes `target/weir-bench/k8s.json`. Release build; `--smoke` uses the dev build and small sizes.

use std::path::Path;

use anyhow::Result;

use super::judge::{Cmp, Target};

/// The targets (BENCHMARKS.md, Kubernetes source): 5,000 pods, 100 namespaces, 1,000 policies.
pub(crate) const TARGETS: &[Target] = &[
    Target::full(
        "sync_programmed_s",
        Cmp::Le,
        5.0,
        "from the first list to the kernel programmed within 5 s",
        "BENCHMARKS.md: Kubernetes source",
    ),
    Target::full(
        "label_event_p99_ms",
        Cmp::Le,
        20.0,
        "a pod label event reaches the kernel within 20 ms (p99)",
        "BENCHMARKS.md: Kubernetes source",
    ),
    Target::full(
        "policy_event_p99_ms",
        Cmp::Le,
        20.0,
        "a policy event reaches the kernel within 20 ms (p99)",
        "BENCHMARKS.md: Kubernetes source",
    ),
    Target::full(
        "rss_mib",
        Cmp::Lt,
        250.0,
        "RSS under 250 MiB at that scale",
        "BENCHMARKS.md: Kubernetes source",
    ),
];

pub(crate) fn run(workspace: &Path, smoke: bool) -> Result<()> {
    super::agent::run_example_with_weir(workspace, smoke, "k8s-bench", "k8s")
}
