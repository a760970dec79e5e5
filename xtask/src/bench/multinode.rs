//! `cargo xtask bench multinode [--smoke]`: builds `weir` and runs the `multinode-bench` example of the
//! `tests` crate with it: IPAM at scale on a real etcd (1,000 hosts × 100 allocations), route convergence
//! on 50 simulated peers, and one TCP stream pod → pod across two node namespaces against the bare underlay
//! (native: two `weir agent`s on etcd with node records, pods through `weir-cni`; vxlan: one `weir agent` per
//! node, routes by the driver in process). Builds `weir-cni` too. Prints a table and writes
//! `target/weir-bench/multinode.json`. Release build; `--smoke` uses the dev build and small sizes.

use std::path::Path;

use anyhow::Result;

pub(crate) fn run(workspace: &Path, smoke: bool) -> Result<()> {
    // The native figure's pods come through `weir-cni`, found beside the example's profile directory.
    let mut build = vec!["build", "-p", "cni", "--bin", "weir-cni"];
    if !smoke {
        build.push("--release");
    }
    crate::util::run(workspace, "cargo", &build)?;
    super::agent::run_example_with_weir(workspace, smoke, "multinode-bench", "multinode")
}
