//! `cargo xtask bench k8s [--smoke]`: builds `weir` and runs the `k8s-bench` example of the
//! `tests` crate with it (the real `weir agent --source kubernetes` against the test API server in
//! a `wt*` node namespace: 5,000 pods, 100 namespaces, 1,000 policies), which prints a table and
//! writes `target/weir-bench/k8s.json`. Release build; `--smoke` uses the dev build and small sizes.

use std::path::Path;

use anyhow::Result;

pub(crate) fn run(workspace: &Path, smoke: bool) -> Result<()> {
    super::agent::run_example_with_weir(workspace, smoke, "k8s-bench", "k8s")
}
