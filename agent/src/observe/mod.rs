//! Datapath observability: per-rule hit counters, verdict counters as metrics, and
//! `weir policy trace` through the loaded programs (`BPF_PROG_TEST_RUN`).

pub mod api;
pub mod ebpf_log;
pub mod ktrace;
pub mod metrics;
pub mod packet;
pub mod rule_hits;
