//! Security identities and the address → identity maps (`ident4`/`ident6` exact, `ipcache4`/`ipcache6` LPM).
//!
//! An identity is a number the agent allocates per label set (never hashed, never derived from an
//! address a pod could forge). Numbers below [`FIRST_ALLOCATED`] are reserved.

use crate::{assert_size, user_pod};

/// Not an identity. In a policy key it means "any peer".
pub const ANY: u32 = 0;
/// The node itself: traffic from the host's own addresses (kubelet probes) carries this identity.
pub const HOST: u32 = 1;
/// Anything outside the cluster: the identity of an address no map knows.
pub const WORLD: u32 = 2;
/// Addresses inside a pod network that weir does not manage (host-network pods, other CNIs).
pub const UNMANAGED: u32 = 3;
/// Another node of the cluster: the addresses of every other node's record (as Cilium's
/// `remote-node`). An `ipBlock` covering such an address still selects it (the agent leaves the
/// address to the policy CIDR's `ipcache` entry).
pub const REMOTE_NODE: u32 = 4;
/// The first identity the agent allocates for a label set or a CIDR.
pub const FIRST_ALLOCATED: u32 = 256;

/// Operator-facing name of a reserved identity (`None` for an allocated one).
#[must_use]
pub const fn reserved_name(identity: u32) -> Option<&'static str> {
    match identity {
        ANY => Some("any"),
        HOST => Some("host"),
        WORLD => Some("world"),
        UNMANAGED => Some("unmanaged"),
        REMOTE_NODE => Some("remote-node"),
        _ => None,
    }
}

/// The value of `ident4`/`ident6` (exact address) and `ipcache4`/`ipcache6` (CIDR) entries.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct IdentityInfo {
    /// The security identity of the address or CIDR.
    pub identity: u32,
    /// Reserved for flags; always zero.
    pub flags: u32,
}
assert_size!(IdentityInfo, 8);
user_pod!(IdentityInfo);
