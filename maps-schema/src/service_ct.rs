//! Service flows (`svc_ct4_v1`): what `from_endpoint` chose for a translated flow and what the
//! reply needs, kept beside conntrack rather than in it (conntrack layout 2 is unchanged).
//!
//! A new flow to a frontend writes two entries: the original tuple (client → frontend,
//! [`DIR_ORIGINAL`]) holding the backend the flow was sent to, so every later packet of the flow
//! goes to the same backend whatever happens to the service's slots; and the reply tuple
//! (backend → client, [`DIR_REPLY`]) holding the service id, whose reverse NAT entry
//! (`svc_revnat4_v1`) gives the frontend a reply's source is rewritten back to (for a pod's flow
//! to a NodePort on its own node's address, the entry itself holds that address and the NodePort:
//! the reverse NAT entry of a NodePort names no address). Written by the programs (LRU; an
//! entry's flow is in `ct4` too).

use crate::{assert_size, user_pod};

/// [`SvcCt4Key`] → [`SvcCt4Entry`], LRU. Written by the programs.
pub const SVC_CT4: &str = "svc_ct4_v1";
/// Default size of [`SVC_CT4`] (two entries per translated flow).
pub const SVC_CT_MAX: u32 = 262_144;

/// [`SvcCt4Key::direction`]: the client's tuple to the frontend, as `from_endpoint` sees it.
pub const DIR_ORIGINAL: u8 = 0;
/// [`SvcCt4Key::direction`]: the backend's reply to the client, as the client's `to_endpoint`
/// sees it.
pub const DIR_REPLY: u8 = 1;

/// A packet's tuple (addresses in network byte order, ports in host byte order).
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
pub struct SvcCt4Key {
    /// Source address.
    pub saddr: [u8; 4],
    /// Destination address.
    pub daddr: [u8; 4],
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
    /// IP protocol.
    pub protocol: u8,
    /// [`DIR_ORIGINAL`] or [`DIR_REPLY`].
    pub direction: u8,
    /// Explicit padding; always zero.
    pub _pad: [u8; 2],
}
assert_size!(SvcCt4Key, 16);

/// A service flow entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct SvcCt4Entry {
    /// [`DIR_ORIGINAL`]: the backend's address (network byte order); [`DIR_REPLY`]: the client's,
    /// except for a pod's flow to a NodePort on its own node's address (its frontend service's
    /// reverse NAT address is `NODEPORT_ANY`): the node address the pod sent to, which its
    /// replies come from.
    pub addr: [u8; 4],
    /// [`DIR_ORIGINAL`]: the backend's port; [`DIR_REPLY`]: the client's, or for a pod's flow
    /// to a NodePort on its own node's address the NodePort (host byte order).
    pub port: u16,
    /// Explicit padding; always zero.
    pub _pad: u16,
    /// The service id (key of `svc_revnat4_v1`).
    pub service_id: u32,
    /// The backend id the flow was given (key of `svc_backend4_v1` when it was chosen).
    pub backend_id: u32,
    /// When the entry was written (the conntrack clock; later packets do not stamp it: the LRU
    /// keeps the entries lookups touch, and the flow's age is its conntrack entry's).
    pub last_seen_ns: u64,
}
assert_size!(SvcCt4Entry, 24);

user_pod!(SvcCt4Key, SvcCt4Entry);
