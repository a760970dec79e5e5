//! weir's node agent, as a library so the `weir` binary and the integration tests share its parts.
//!
//! Where things live: `paths` (every path and name), `config` (the validated configuration),
//! `bpf/` (bpffs, loading and pinning the object, programs, conntrack migration), `sources/`
//! (registry, link watcher, policy directory), `attach` (the tc/XDP
//! attachment helper, the crate `agent/attach` shared with weir-cni), `daemon` (the `weir agent` wiring), `applier` (the one
//! dataplane loop that owns the node), `snapshot` (what it publishes for every reader).

pub mod api;
pub use attach;
pub mod calc;
pub mod cluster;
pub mod config;
pub mod control;
pub mod daemon;
pub mod dataplane;
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

#[cfg(test)]
mod inprocess;

/// The eBPF object the agent loads (built by `build.rs` through the same builder as
/// `cargo xtask build-ebpf`).
pub static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/weir-ebpf.o"));
