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

use crate::{assert_size, conntrack::Ct4Key, user_pod};

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

/// The conntrack key of the translated flow (client ↔ backend) an entry belongs to: an original
/// entry's key holds the client and its value the backend; a reply entry's key is the translated
/// flow's reply tuple itself. What the agent's sweep keeps an entry for while it is in `ct4` (or,
/// for a NodePort flow sent to another node's backend, in `nat4`).
#[must_use]
pub fn flow_key(key: &SvcCt4Key, entry: &SvcCt4Entry) -> Ct4Key {
    if key.direction == DIR_ORIGINAL {
        Ct4Key::of(
            key.protocol,
            (key.saddr, key.sport),
            (entry.addr, entry.port),
        )
    } else {
        Ct4Key::of(key.protocol, (key.saddr, key.sport), (key.daddr, key.dport))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(addr: [u8; 4], port: u16) -> SvcCt4Entry {
        SvcCt4Entry {
            addr,
            port,
            service_id: 3,
            ..SvcCt4Entry::default()
        }
    }

    #[test]
    fn both_entries_of_a_flow_name_its_conntrack_key_whichever_end_is_lower() {
        for (client, backend) in [
            ([10, 0, 0, 1], [10, 0, 0, 9]),
            ([10, 0, 0, 9], [10, 0, 0, 1]),
        ] {
            let original = SvcCt4Key {
                saddr: client,
                daddr: [10, 96, 0, 10],
                sport: 40_000,
                dport: 80,
                protocol: 6,
                direction: DIR_ORIGINAL,
                _pad: [0; 2],
            };
            let reply = SvcCt4Key {
                saddr: backend,
                daddr: client,
                sport: 8080,
                dport: 40_000,
                protocol: 6,
                direction: DIR_REPLY,
                _pad: [0; 2],
            };
            let want = Ct4Key::of(6, (client, 40_000), (backend, 8080));
            assert_eq!(flow_key(&original, &entry(backend, 8080)), want);
            // A reply entry's value holds the client (or a node address): the key decides.
            assert_eq!(flow_key(&reply, &entry([192, 0, 2, 1], 31_000)), want);
            let lower = client.min(backend);
            assert_eq!(want.addr_a, lower, "the lower address is a");
        }
    }

    #[test]
    fn equal_addresses_are_ordered_by_port() {
        let k = Ct4Key::of(17, ([10, 0, 0, 5], 9000), ([10, 0, 0, 5], 53));
        assert_eq!((k.port_a, k.port_b), (53, 9000));
    }
}
