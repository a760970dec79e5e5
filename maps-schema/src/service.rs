//! ClusterIP service maps (layout v1, IPv4): frontend → service, (service, slot) → backend id,
//! backend id → address and port, service id → frontend (reverse NAT). Written by the agent from
//! desired state; the programs only read them. Addresses in network byte order, ports in host
//! byte order (as conntrack).
//! `from_endpoint` looks every IPv4 TCP/UDP packet's destination up in [`SVC4`]; the flows it
//! translated are in [`crate::service_ct`].

use crate::{assert_size, user_pod};

/// [`Svc4Key`] → [`Svc4Value`]: frontends. Written by the agent.
pub const SVC4: &str = "svc4_v1";
/// [`SlotKey`] → [`SlotValue`]: each service's backends in slot order. Written by the agent.
pub const SVC_SLOTS: &str = "svc_slots_v1";
/// [`MemberKey`] → [`MemberValue`]: the slot each backend holds in each service (the inverse of
/// [`SVC_SLOTS`]), so that a `ClientIP` affinity entry follows its backend to another slot.
/// Written by the agent.
pub const SVC_MEMBERS: &str = "svc_members_v1";
/// backend id (`u32`) → [`Backend4`]. Written by the agent.
pub const SVC_BACKENDS4: &str = "svc_backend4_v1";
/// service id (`u32`) → [`RevNat4`]: what a reply's source is rewritten back to. Written by the
/// agent.
pub const SVC_REVNAT4: &str = "svc_revnat4_v1";
/// [`Affinity4Key`] → [`Affinity4`], LRU: `sessionAffinity: ClientIP`'s memory of each client's
/// backend per frontend. Written by the programs.
pub const SVC_AFFINITY4: &str = "svc_affin4_v1";
/// Default size of [`SVC_AFFINITY4`].
pub const SVC_AFFINITY_MAX: u32 = 65_536;
/// Default size of [`SVC4`] and [`SVC_REVNAT4`].
pub const SVC_MAX: u32 = 65_536;
/// Default size of [`SVC_SLOTS`], [`SVC_MEMBERS`] and [`SVC_BACKENDS4`].
pub const SVC_BACKENDS_MAX: u32 = 262_144;
/// Most backends one frontend spreads over (a slot index is a `u16`).
pub const MAX_SLOTS: u32 = 65_535;

/// [`Svc4Value::flags`]: `sessionAffinity: ClientIP`. A client's new flow goes to the backend its
/// last new flow to the frontend went to ([`SVC_AFFINITY4`]) while that was at most
/// [`Svc4Value::affinity_timeout_secs`] ago and the backend still holds a slot of the frontend
/// (the one it had, or the one [`SVC_MEMBERS`] names); otherwise it is placed by a hash of the
/// client address only.
pub const SVC_FLAG_AFFINITY: u16 = 1;
/// [`Svc4Value::flags`]: a NodePort frontend with `externalTrafficPolicy: Local` (its slots hold
/// this node's backends only, and the client's address is kept).
pub const SVC_FLAG_EXTERNAL_LOCAL: u16 = 2;
/// [`Svc4Value::flags`]: a cluster IP frontend with `internalTrafficPolicy: Local` (its slots
/// hold this node's backends only). For operators: the programs do not read it.
pub const SVC_FLAG_INTERNAL_LOCAL: u16 = 4;
/// [`Backend4::flags`]: the backend is a pod on this node (a NodePort packet to it is only
/// translated to it; one to another node's backend also gets this node's address as its source,
/// so the reply comes back through this node).
pub const BACKEND_FLAG_LOCAL: u8 = 1;
/// [`Backend4::flags`]: the backend's endpoint is terminating but still serving
/// (`serving: true, ready: false`): it has no slot, so no new flow goes to it, and a new TCP
/// connection on a tuple it had is placed again; every other packet of a flow it has (a UDP
/// flow's datagrams too) stays with it, as under kube-proxy. Not part of a backend's identity:
/// a ready backend that starts terminating keeps its id (and so its flows).
pub const BACKEND_FLAG_TERMINATING: u8 = 2;
/// [`Svc4Key::addr`] of a NodePort frontend: any address of a host interface serving NodePorts
/// (`masq_if` with `IF_NODEPORT`), and for a pod on this node any of the node's addresses
/// ([`pod_nodeport`]).
pub const NODEPORT_ANY: [u8; 4] = [0; 4];

/// The NodePorts a pod reaches on an address of its own node (`from_endpoint` translates a packet
/// to a host address on such a port as the host-interface programs translate one arriving from
/// outside): Kubernetes' default `--service-node-port-range`. A constant, so that a pod's packet
/// to any other port costs a comparison, not a lookup; a NodePort outside it is served only on the
/// host interfaces (the agent warns about such Services).
pub const POD_NODEPORT_RANGE: core::ops::RangeInclusive<u16> = 30000..=32767;

/// Whether a pod's packet to a host address on `port` may be to a NodePort (see
/// [`POD_NODEPORT_RANGE`]).
#[inline(always)]
#[must_use]
pub const fn pod_nodeport(port: u16) -> bool {
    port >= *POD_NODEPORT_RANGE.start() && port <= *POD_NODEPORT_RANGE.end()
}

/// The source a pod's packet gets when its Service sends it to the pod itself (hairpin): a
/// link-local address no pod or node has, as Cilium's `169.254.42.1`. The pod cannot take a
/// packet from its own address arriving from outside (the kernel drops it as martian), so
/// `from_endpoint` sends it back in from this address, and the pod's reply to this address back
/// to the pod from its own address, where `to_endpoint` translates it back to the frontend as it
/// does every reply. Policy judges it as the pod's own traffic (the pod's identity).
pub const HAIRPIN4: [u8; 4] = [169, 254, 42, 1];

/// A frontend: cluster IP, port, IP protocol.
#[repr(C)]
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    bytemuck::Pod,
    bytemuck::Zeroable,
)]
pub struct Svc4Key {
    /// The cluster IP.
    pub addr: [u8; 4],
    /// The Service port.
    pub port: u16,
    /// IP protocol number (TCP 6, UDP 17, SCTP 132).
    pub protocol: u8,
    /// [`SCOPE_ALL`], or [`SCOPE_PODS`] for the pods' variant of a `Local` external frontend.
    pub scope: u8,
}
assert_size!(Svc4Key, 8);

/// [`Svc4Key::scope`]: the frontend as every program sees it (the only scope before scopes
/// existed: the byte was padding, always zero).
pub const SCOPE_ALL: u8 = 0;
/// [`Svc4Key::scope`]: the variant this node's pods get of a frontend with
/// `externalTrafficPolicy: Local` (a NodePort or an external address; its [`SCOPE_ALL`] entry,
/// which the host interfaces use, has [`SVC_FLAG_EXTERNAL_LOCAL`] and only this node's
/// backends): every ready backend, as kube-proxy gives pods. `from_endpoint` looks it up only
/// after finding that flag.
pub const SCOPE_PODS: u8 = 1;

/// A frontend's service.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Svc4Value {
    /// The service id (one per frontend; the key of [`SVC_REVNAT4`] and of its [`SlotKey`]s).
    pub service_id: u32,
    /// How many backend slots it has; 0: no ready backend (the packet is rejected).
    pub backend_count: u16,
    /// [`SVC_FLAG_AFFINITY`], …
    pub flags: u16,
    /// `ClientIP` affinity timeout in seconds (0 without affinity).
    pub affinity_timeout_secs: u32,
    /// Explicit padding (zero).
    pub pad: u32,
}
assert_size!(Svc4Value, 16);

/// One backend slot of a service.
#[repr(C)]
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    bytemuck::Pod,
    bytemuck::Zeroable,
)]
pub struct SlotKey {
    /// The service id.
    pub service_id: u32,
    /// The slot, `0..backend_count`.
    pub slot: u16,
    /// Explicit padding (zero).
    pub pad: u16,
}
assert_size!(SlotKey, 8);

/// The backend in a slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
pub struct SlotValue {
    /// The backend id (key of [`SVC_BACKENDS4`]).
    pub backend_id: u32,
}
assert_size!(SlotValue, 4);

/// A backend of a service ([`SVC_MEMBERS`]).
#[repr(C)]
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    bytemuck::Pod,
    bytemuck::Zeroable,
)]
pub struct MemberKey {
    /// The service id.
    pub service_id: u32,
    /// The backend id.
    pub backend_id: u32,
}
assert_size!(MemberKey, 8);

/// The slot a backend holds in a service: [`SlotKey`] `{ service_id, slot }` → that backend.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MemberValue {
    /// The slot, `0..backend_count`.
    pub slot: u16,
    /// Explicit padding (zero).
    pub pad: u16,
}
assert_size!(MemberValue, 4);

/// A backend: where the frontend's traffic goes.
#[repr(C)]
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    bytemuck::Pod,
    bytemuck::Zeroable,
)]
pub struct Backend4 {
    /// The backend's address.
    pub addr: [u8; 4],
    /// The backend's port.
    pub port: u16,
    /// IP protocol number.
    pub protocol: u8,
    /// [`BACKEND_FLAG_LOCAL`], [`BACKEND_FLAG_TERMINATING`] (zero in entries written before
    /// flags existed).
    pub flags: u8,
}
assert_size!(Backend4, 8);

/// Reverse NAT: the frontend a reply's source is rewritten back to. A NodePort frontend's
/// address is [`NODEPORT_ANY`]: its replies get the address of the host interface translating
/// them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
pub struct RevNat4 {
    /// The cluster IP.
    pub addr: [u8; 4],
    /// The Service port.
    pub port: u16,
    /// Explicit padding (zero).
    pub pad: u16,
}
assert_size!(RevNat4, 8);

/// A client of a frontend with `sessionAffinity: ClientIP`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Affinity4Key {
    /// The frontend's service id.
    pub service_id: u32,
    /// The client's address.
    pub client: [u8; 4],
}
assert_size!(Affinity4Key, 8);

/// Where a client's last new flow to a frontend went. The slot is kept so that the programs can
/// check that the backend still serves the frontend ([`SlotKey`] → the same backend id) without
/// the agent clearing entries; a backend that moved to another slot is found there through
/// [`SVC_MEMBERS`] (and that slot checked the same way), one that left the frontend is chosen
/// again by hash.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Affinity4 {
    /// The backend id.
    pub backend_id: u32,
    /// Its slot when the flow was placed.
    pub slot: u16,
    /// Explicit padding (zero).
    pub _pad: u16,
    /// The conntrack clock when the client's last new flow to the frontend was placed.
    pub last_used_ns: u64,
}
assert_size!(Affinity4, 16);

/// Whether an affinity entry used at `last_used_ns` still holds at `now_ns` for a frontend with
/// `timeout_secs` (kube-proxy's `recent --rcheck --seconds`: the age of the client's last new
/// flow, not of its last packet).
#[inline(always)]
#[must_use]
pub const fn affinity_holds(last_used_ns: u64, now_ns: u64, timeout_secs: u32) -> bool {
    now_ns.saturating_sub(last_used_ns) <= timeout_secs as u64 * 1_000_000_000
}

user_pod!(
    Svc4Key,
    Svc4Value,
    SlotKey,
    SlotValue,
    MemberKey,
    MemberValue,
    Backend4,
    RevNat4,
    Affinity4Key,
    Affinity4
);

/// Whether a new flow of frontend `service_id` must not take a backend because its translated
/// tuple already belongs to another live flow: the conntrack entry of that tuple (its `rev_nat`
/// and `flags`, protocol `protocol`) is of another frontend or of none (a pod's flow to the
/// backend itself, or through a frontend with another id), and not a TCP connection that is over.
/// Two flows sharing one tuple would take each other's replies (the kernel reuses a source port
/// for different destinations, so one pod's flows to two frontends onto one backend port can meet
/// on it); kube-proxy's conntrack moves the second to another source port, weir to another backend
/// when the frontend has one.
#[inline(always)]
#[must_use]
pub const fn tuple_taken(rev_nat: u32, flags: u32, protocol: u8, service_id: u32) -> bool {
    rev_nat != service_id && !(protocol == 6 && crate::conntrack::tcp_closed(flags))
}

/// A flow's hash for backend selection (FNV-1a over the tuple, then a final mix): the same for
/// every packet of the flow, so the conntrack entry and a re-selection agree. With affinity only
/// the client address counts, so a client's flows share a backend. Byte by byte through
/// registers, with no byte array: a stack array the BPF compiler fills with merged, misaligned
/// stores is refused by the verifier.
#[must_use]
pub const fn flow_hash(
    saddr: [u8; 4],
    sport: u16,
    daddr: [u8; 4],
    dport: u16,
    protocol: u8,
    affinity: bool,
) -> u32 {
    const fn step(h: u32, byte: u8) -> u32 {
        (h ^ byte as u32).wrapping_mul(0x0100_0193)
    }
    const fn word(mut h: u32, bytes: [u8; 4]) -> u32 {
        h = step(h, bytes[0]);
        h = step(h, bytes[1]);
        h = step(h, bytes[2]);
        step(h, bytes[3])
    }
    let mut h = word(0x811c_9dc5, saddr);
    if !affinity {
        let s = sport.to_be_bytes();
        let d = dport.to_be_bytes();
        h = step(h, s[0]);
        h = step(h, s[1]);
        h = word(h, daddr);
        h = step(h, d[0]);
        h = step(h, d[1]);
        h = step(h, protocol);
    }
    // murmur3's finaliser, so nearby ports land on different slots.
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    h
}

/// The slot a flow with `hash` takes among `backend_count` slots; None when there is no backend
/// (the packet is rejected).
#[must_use]
pub const fn backend_slot(hash: u32, backend_count: u16) -> Option<u16> {
    if backend_count == 0 {
        None
    } else {
        Some((hash % backend_count as u32) as u16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tuple_is_taken_by_a_live_flow_of_another_frontend_only() {
        use crate::conntrack::{FLAG_TCP_FIN_DST, FLAG_TCP_FIN_SRC, FLAG_TCP_RST, FLAG_TCP_SYN};
        let (tcp, udp) = (6, 17);
        // Another frontend's live flow, or a flow to the backend itself (no frontend).
        assert!(tuple_taken(7, FLAG_TCP_SYN, tcp, 9));
        assert!(tuple_taken(0, FLAG_TCP_SYN, tcp, 9));
        assert!(tuple_taken(7, 0, udp, 9));
        // The same frontend's flow (a retransmitted SYN, a reused tuple): not taken.
        assert!(!tuple_taken(9, FLAG_TCP_SYN, tcp, 9));
        // A TCP connection that is over may be reused; a UDP flow is live until it expires.
        assert!(!tuple_taken(7, FLAG_TCP_RST, tcp, 9));
        assert!(!tuple_taken(7, FLAG_TCP_FIN_SRC | FLAG_TCP_FIN_DST, tcp, 9));
        assert!(tuple_taken(7, FLAG_TCP_FIN_SRC, tcp, 9));
        assert!(tuple_taken(7, FLAG_TCP_RST, udp, 9));
    }

    #[test]
    fn a_flow_keeps_its_slot_and_flows_spread() {
        let client = [10, 0, 0, 5];
        let vip = [10, 96, 0, 10];
        let first = flow_hash(client, 40_000, vip, 80, 6, false);
        assert_eq!(
            first,
            flow_hash(client, 40_000, vip, 80, 6, false),
            "stable"
        );
        let mut per_slot = [0u32; 3];
        let flows = 3000u32;
        for port in 0..flows {
            let sport = 30_000 + port as u16;
            let slot = backend_slot(flow_hash(client, sport, vip, 80, 6, false), 3).expect("slot");
            per_slot[slot as usize] += 1;
        }
        // Each slot within 20% of a fair share.
        let fair = flows / 3;
        for n in per_slot {
            assert!(n > fair * 8 / 10 && n < fair * 12 / 10, "{per_slot:?}");
        }
    }

    #[test]
    fn affinity_ignores_ports_and_no_backend_has_no_slot() {
        let client = [10, 0, 0, 5];
        let vip = [10, 96, 0, 10];
        assert_eq!(
            flow_hash(client, 1, vip, 80, 6, true),
            flow_hash(client, 2, vip, 80, 6, true)
        );
        assert_ne!(
            flow_hash(client, 1, vip, 80, 6, false),
            flow_hash(client, 2, vip, 80, 6, false)
        );
        assert_eq!(backend_slot(7, 0), None);
        assert_eq!(backend_slot(7, 4), Some(3));
    }
}
