//! Observability: `weir policy trace` on the desired maps (`trace`) and through the loaded programs
//! (`ktrace`, `BPF_PROG_TEST_RUN`), drop events (`monitor`), the `/metrics` and health server
//! (`metrics_server`), per-rule hit counters and verdict counters as metrics (`rule_hits`, `metrics`),
//! and the debug object's datapath log (`ebpf_log`).

pub mod ebpf_log;
pub mod ktrace;
pub mod metrics;
pub mod metrics_server;
pub mod monitor;
pub mod packet;
pub mod rule_hits;
pub mod trace;
