//! `cargo xtask bench multinode [--smoke]`: builds `weir` and runs the `multinode-bench` example of the
//! `tests` crate with it: IPAM at scale on a real etcd (1,000 hosts × 100 allocations), route convergence
//! on 50 simulated peers, and one TCP stream pod → pod across two node namespaces (native and vxlan, one
//! `weir agent` per node) against the bare underlay. Prints a table and writes
//! `target/weir-bench/multinode.json`. Release build; `--smoke` uses the dev build and small sizes.

use std::path::Path;

use anyhow::Result;

pub(crate) fn run(workspace: &Path, smoke: bool) -> Result<()> {
    super::agent::run_example_with_weir(workspace, smoke, "multinode-bench", "multinode")
}
