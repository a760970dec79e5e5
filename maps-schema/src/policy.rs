//! The policy map: (endpoint, direction, peer identity, protocol, port) → verdict and rule id.
//!
//! The programs look up, most specific first, and the first entry found decides:
//! 1. `(peer, proto, port)` exact;
//! 2. `(peer, proto, ANY_PORT)` — all ports ([`FLAG_ALL_PORTS`]) or one of its port ranges;
//! 3. `(ANY peer, proto, port)`; 4. `(ANY peer, proto, ANY_PORT)` (as 2.);
//! 5. `(peer, ANY_PROTO, ANY_PORT)`; 6. `(ANY peer, ANY_PROTO, ANY_PORT)`.
//!
//! An entry of step 2 or 4 whose ranges do not cover the port does not decide: the lookup goes on.
//! Lookups are only made for a direction the endpoint is isolated in; no match means deny.
//! For ICMP and ICMPv6 the "port" is the message type (so echo requests are port 8 / 128).

use crate::{assert_size, user_pod};

/// Direction in a policy key: traffic leaving the endpoint (its egress).
pub const EGRESS: u8 = 0;
/// Direction in a policy key: traffic entering the endpoint (its ingress).
pub const INGRESS: u8 = 1;
/// Wildcard protocol.
pub const ANY_PROTO: u8 = 0;
/// Wildcard port.
pub const ANY_PORT: u16 = 0;
/// Port ranges an `ANY_PORT` entry can carry (more ranges: the agent expands them into exact ports).
pub const MAX_PORT_RANGES: usize = 4;

/// Verdict: allow.
pub const VERDICT_ALLOW: u8 = 1;
/// Verdict: deny (an explicit deny entry decides like an allow does, by specificity).
pub const VERDICT_DENY: u8 = 2;
/// Flag of an `ANY_PORT` entry: every port matches (otherwise only `ranges`).
pub const FLAG_ALL_PORTS: u8 = 1;

/// Policy map key.
#[repr(C)]
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    bytemuck::Pod,
    bytemuck::Zeroable,
)]
pub struct PolicyKey {
    /// The endpoint the policy applies to ([`crate::EndpointInfo::endpoint_id`]).
    pub endpoint_id: u32,
    /// The peer's identity, or [`crate::identity::ANY`].
    pub peer_identity: u32,
    /// Destination port (host byte order; ICMP type for ICMP), or [`ANY_PORT`].
    pub port: u16,
    /// IP protocol number, or [`ANY_PROTO`].
    pub protocol: u8,
    /// [`EGRESS`] or [`INGRESS`].
    pub direction: u8,
}
assert_size!(PolicyKey, 12);
user_pod!(PolicyKey);

/// An inclusive port range (host byte order).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct PortRange {
    /// First port.
    pub first: u16,
    /// Last port (inclusive). A range with `last < first` is unused.
    pub last: u16,
}
assert_size!(PortRange, 4);

/// Policy map value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct PolicyValue {
    /// The rule that produced this entry (for traces and drop events).
    pub rule_id: u32,
    /// [`VERDICT_ALLOW`] or [`VERDICT_DENY`].
    pub verdict: u8,
    /// `FLAG_*` bits.
    pub flags: u8,
    /// Explicit padding; always zero.
    pub _pad: [u8; 2],
    /// Port ranges of an `ANY_PORT` entry (unused slots: `first = 1, last = 0`).
    pub ranges: [PortRange; MAX_PORT_RANGES],
}
assert_size!(PolicyValue, 24);
user_pod!(PolicyValue);

/// An unused range slot.
pub const NO_RANGE: PortRange = PortRange { first: 1, last: 0 };

impl PolicyValue {
    /// An exact-port (or all-ports) entry.
    #[must_use]
    pub const fn new(verdict: u8, rule_id: u32) -> Self {
        Self {
            rule_id,
            verdict,
            flags: FLAG_ALL_PORTS,
            _pad: [0; 2],
            ranges: [NO_RANGE; MAX_PORT_RANGES],
        }
    }

    /// True when this entry decides for `port`.
    #[inline(always)]
    #[must_use]
    pub fn covers(&self, port: u16) -> bool {
        if self.flags & FLAG_ALL_PORTS != 0 {
            return true;
        }
        let r = &self.ranges;
        (r[0].first <= port && port <= r[0].last)
            || (r[1].first <= port && port <= r[1].last)
            || (r[2].first <= port && port <= r[2].last)
            || (r[3].first <= port && port <= r[3].last)
    }
}

/// The entry that decides for `(endpoint_id, direction, peer, protocol, port)`, in the lookup
/// order above; `get` reads one key of the policy map. The programs call this on the kernel map,
/// `weir policy trace` on the agent's desired state, so both follow one order. `None`: no entry
/// decides (deny, for an isolated direction).
#[inline(always)]
pub fn decide<'a>(
    endpoint_id: u32,
    direction: u8,
    peer: u32,
    protocol: u8,
    port: u16,
    mut get: impl FnMut(&PolicyKey) -> Option<&'a PolicyValue>,
) -> Option<&'a PolicyValue> {
    let mut key = PolicyKey {
        endpoint_id,
        peer_identity: peer,
        port,
        protocol,
        direction,
    };
    for peer_identity in [peer, crate::identity::ANY] {
        key.peer_identity = peer_identity;
        if port != ANY_PORT {
            key.port = port;
            if let Some(v) = get(&key) {
                return Some(v);
            }
        }
        key.port = ANY_PORT;
        if let Some(v) = get(&key)
            && v.covers(port)
        {
            return Some(v);
        }
    }
    key.protocol = ANY_PROTO;
    key.port = ANY_PORT;
    for peer_identity in [peer, crate::identity::ANY] {
        key.peer_identity = peer_identity;
        if let Some(v) = get(&key) {
            return Some(v);
        }
    }
    None
}
