//! `weir policy trace` through the kernel: a synthetic packet runs through the loaded program with
//! `BPF_PROG_TEST_RUN`, which passes an `__sk_buff` context in and copies it back out.
//!
//! A run is a *trace run* when the context's `cb[0]` is [`CB_MAGIC`] and `cb[1]`/`cb[2]` hold
//! the nonce the agent keeps in [`crate::maps::TRACE`] (low word first). The nonce is random,
//! non-zero, and readable only by root (pins are mode 0700), so a packet from the network can
//! never carry it; a zero nonce (the map as created) disables trace runs. A trace run reads the
//! live maps but writes nothing: no conntrack entry is created or refreshed, no counter, rule
//! hit or drop event moves. It answers in the context's `cb[]`: `cb[0]` = [`CB_DONE`],
//! `cb[1]` = the reason code, `cb[2]` = the deciding rule id (0: no rule decided).

use crate::{assert_size, user_pod};

/// `cb[0]` of a trace run's context ("weir").
pub const CB_MAGIC: u32 = 0x7765_6972;
/// `cb[0]` after a trace run answered ("WEIR").
pub const CB_DONE: u32 = 0x5745_4952;

/// The trace map's one value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceConfig {
    /// The nonce a trace run's context carries in `cb[1]` (low 32 bits) and `cb[2]` (high).
    /// Zero: trace runs disabled.
    pub nonce: u64,
}
assert_size!(TraceConfig, 8);
user_pod!(TraceConfig);
