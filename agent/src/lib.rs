//! weir's node agent, as a library so the `weir` binary and the integration tests share its parts.
//!
//! The layers, each a folder, from what the node should be down to the kernel:
//! - `sources/`: what tells the loop what the node should be (registry, policy directory, Kubernetes, the
//!   nodes source, the link source); no kernel I/O.
//! - `calc/`: desired state, calculated: identities, the policy model and compile (`policy/`), Services
//!   (`services/`), pod IPAM, the reference compile, the incremental calculation.
//! - `control/`: the node's desired state (`node`), per-object deltas, the one dataplane loop that owns the
//!   node (`applier`) and what it publishes for every reader (`snapshot`).
//! - `cluster/`: the cluster's nodes (records, their store, routes to other nodes' blocks).
//! - `dataplane/`: managers (desired map contents) and drivers (reconcile one kind of kernel state).
//! - `kernel/`: the one seam to the kernel (its traits), `kernel/real/` (aya, netlink, bpffs, loading the
//!   object), `kernel/fake/` (the fake for tests), `kernel/migrate/` (conntrack layout migration). Only here
//!   does code call aya's map/program APIs, libc/nix or netlink directly (`cargo xtask lint` checks; the
//!   exceptions are listed, with reasons, in `xtask/src/kernel_calls.rs`).
//! - `api/`: the agent API on its unix socket. `observe/`: trace, drop monitor, `/metrics`, counters.
//! - `setup/`: the host outside BPF (sysctls, CNI conflist, install-cni, uninstall).
//!
//! Beside them: `paths` (every path and name), `config/` (the validated configuration), `daemon` (the
//! `weir agent` wiring), `attach` (the tc/XDP attachment helper, the crate `agent/attach` shared with
//! weir-cni), `logging`, `memory`, `fsutil`, `fasthash` (the integer-keyed tables' hasher), `synthetic`
//! (generated nodes for tests and benches), and `testing` (an in-process agent, feature `testing`). The
//! `weir` binary's CLI is `cli/` (in `main.rs`).
//!
//! A layer imports only itself and the layers below it: the helpers < `kernel` < `setup` < `dataplane` <
//! `config` < `calc` < `cluster` < `control` < `sources` < `observe` < `api` < the wiring (`daemon`,
//! `upkeep`, the test tiers). `cargo xtask lint` checks it (`xtask/src/layers.rs`, with its few allowed
//! exceptions and their reasons).

pub mod api;
pub use attach;
pub mod calc;
pub mod cluster;
pub mod config;
pub mod control;
pub mod daemon;
pub mod dataplane;
pub(crate) mod fasthash;
pub mod fsutil;
pub mod kernel;
pub mod logging;
pub mod memory;
pub mod observe;
pub mod paths;
pub mod setup;
pub mod sources;
pub mod synthetic;
#[cfg(feature = "testing")]
pub mod testing;
pub mod upkeep;

#[cfg(test)]
mod inprocess;

/// The eBPF object the agent loads (built by `build.rs` through the same builder as
/// `cargo xtask build-ebpf`).
pub static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/weir-ebpf.o"));
