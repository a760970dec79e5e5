//! Per-CPU verdict counters, indexed by (reason, direction).

use crate::{assert_size, reason, user_pod};

/// Index into the counters array: `reason * DIRECTIONS + direction`.
pub type CounterKey = u32;

/// The counters slot for a reason and direction.
#[inline(always)]
#[must_use]
pub const fn counter_index(reason: u32, direction: u32) -> CounterKey {
    reason * reason::DIRECTIONS + direction
}

/// Packets and bytes counted in one slot on one CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct CounterValue {
    /// Packets.
    pub packets: u64,
    /// Bytes (the skb length as the program saw it).
    pub bytes: u64,
}
assert_size!(CounterValue, 16);
user_pod!(CounterValue);
