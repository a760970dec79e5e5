//! Sampled drop events on the `drop_events` ring buffer (off the fast path: drops only, sampled).

use crate::{assert_size, user_pod};

/// Bytes of the packet's head copied into an event.
pub const CAPTURE_BYTES: usize = 128;
/// One event per `SAMPLE_EVERY` drops of a (reason, direction) on a CPU (the first one always).
pub const SAMPLE_EVERY: u64 = 64;

/// A dropped packet's reason, where it was dropped and its first bytes (from the Ethernet header).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct DropEvent {
    /// The reason code ([`crate::reason`]).
    pub reason: u32,
    /// The direction ([`crate::reason::DIR_FROM_ENDPOINT`], …).
    pub direction: u32,
    /// The interface.
    pub ifindex: u32,
    /// The packet's length.
    pub packet_len: u32,
    /// Valid bytes in `head`.
    pub captured: u32,
    /// Explicit padding; always zero.
    pub _pad: u32,
    /// The packet's first bytes.
    pub head: [u8; CAPTURE_BYTES],
}
assert_size!(DropEvent, 24 + CAPTURE_BYTES);
user_pod!(DropEvent);
