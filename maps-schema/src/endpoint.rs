//! The endpoints map value: what the programs know about a workload interface.

use crate::{assert_size, user_pod};

/// Addresses kept per family for anti-spoofing.
pub const MAX_ADDRS_PER_FAMILY: usize = 2;

/// Policy flag: the endpoint is selected by a policy for ingress (default deny on ingress).
pub const FLAG_ISOLATED_INGRESS: u32 = 1;
/// Policy flag: the endpoint is selected by a policy for egress (default deny on egress).
pub const FLAG_ISOLATED_EGRESS: u32 = 1 << 1;

/// ifindex → endpoint. Unused address slots are all zero.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct EndpointInfo {
    /// The agent's endpoint id (stable across restarts).
    pub endpoint_id: u32,
    /// The endpoint's numeric security identity.
    pub identity: u32,
    /// `FLAG_*` bits.
    pub flags: u32,
    /// Explicit padding; always zero.
    pub _pad: u32,
    /// IPv4 addresses in network byte order.
    pub ipv4: [[u8; 4]; MAX_ADDRS_PER_FAMILY],
    /// IPv6 addresses in network byte order.
    pub ipv6: [[u8; 16]; MAX_ADDRS_PER_FAMILY],
}
assert_size!(EndpointInfo, 56);
user_pod!(EndpointInfo);
