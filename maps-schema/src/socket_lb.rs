//! Socket load balancing (Cilium's socket LB): a `cgroup/connect4` program gives a TCP socket that
//! connects to a frontend one of its backends before any packet exists, so the socket's packets
//! leave already addressed to the backend and `from_endpoint` judges and forwards them as a plain
//! flow (no per-packet translation, no `svc_ct4` entry). The frontend is remembered in the
//! socket's own storage ([`SOCK_RNAT4`]) so `getpeername` shows it instead of the backend. What it
//! leaves to `from_endpoint` is in [`places`].

use crate::{assert_size, service::SVC_FLAG_AFFINITY, service::SVC_FLAG_EXTERNAL_LOCAL, user_pod};

/// Socket-local storage (`BPF_MAP_TYPE_SK_STORAGE`) → [`SockRevNat4`]: the frontend a socket
/// connected to, written by `sock_connect4`/`sock_connect6`, read by
/// `sock_getpeer4`/`sock_getpeer6`. It lives and goes with its socket: nothing to evict or sweep.
/// (Layout 1 was an LRU hash by socket cookie; the agent removes its pin.)
pub const SOCK_RNAT4: &str = "sock_rnat4_v2";

/// What a socket connected to a frontend was given.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
pub struct SockRevNat4 {
    /// The frontend's address (network byte order).
    pub frontend: [u8; 4],
    /// The backend's address (network byte order).
    pub backend: [u8; 4],
    /// The frontend's port (host byte order).
    pub frontend_port: u16,
    /// The backend's port (host byte order).
    pub backend_port: u16,
    /// The frontend's service id.
    pub service_id: u32,
}
assert_size!(SockRevNat4, 16);

user_pod!(SockRevNat4);

/// Whether `sock_connect4`/`sock_connect6` place a socket of IP `protocol` connecting to a frontend with these
/// `flags` and `backend_count`. Only TCP: a connected UDP socket would keep its backend after the
/// backend is removed (kube-proxy and `from_endpoint` move a UDP flow's next datagram to another
/// backend; Cilium destroys such sockets, which weir does not), so UDP stays translated per
/// packet. A frontend with `ClientIP` affinity is placed by the client's network namespace
/// ([`SOCK_AFFIN4`]). Not: a frontend without a ready backend (`from_endpoint` rejects the first
/// packet, as kube-proxy does, with a TCP RST the socket reports as refused), and the entry of an
/// external frontend with
/// `externalTrafficPolicy: Local` that the host interfaces use (`sock_connect4` places over the
/// frontend's pods' scope instead, whose entry carries no such flag; so it does for a `Local`
/// NodePort dialled on one of the node's own or loopback addresses).
#[inline(always)]
#[must_use]
pub const fn places(protocol: u32, flags: u16, backend_count: u16) -> bool {
    protocol == IPPROTO_TCP && backend_count > 0 && flags & SVC_FLAG_EXTERNAL_LOCAL == 0
}

/// Array of one [`SockLbConfig`] (slot 0), written by the agent whenever it attaches socket LB:
/// which sockets the `connect` and `sendmsg` programs place.
pub const SOCK_CFG: &str = "sock_cfg_v1";

/// Socket LB's settings for the programs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
pub struct SockLbConfig {
    /// The network namespace cookie whose sockets alone are placed: the node's own
    /// (`--socket-lb-host-only`, as Cilium's `socketLB.hostNamespaceOnly`: pods' flows are then
    /// translated per packet, so a service mesh's sidecar still sees the ClusterIP). 0: every
    /// socket in the cgroup.
    pub netns_cookie: u64,
}
assert_size!(SockLbConfig, 8);

user_pod!(SockLbConfig);

/// Whether a socket of network namespace `netns_cookie` is placed under `config`.
#[inline(always)]
#[must_use]
pub const fn in_scope(config: &SockLbConfig, netns_cookie: u64) -> bool {
    config.netns_cookie == 0 || config.netns_cookie == netns_cookie
}

/// LRU hash [`SockAffinity4Key`] → [`crate::service::Affinity4`]: `sessionAffinity: ClientIP` for
/// the connections socket LB places, written by `sock_connect4`/`sock_connect6`: each network
/// namespace's last backend per frontend. A socket has no address before it connects; a pod's
/// network namespace stands for its address (kube-proxy's client IP), the node's own for the node.
pub const SOCK_AFFIN4: &str = "sock_affin4_v1";

/// Key of [`SOCK_AFFIN4`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
pub struct SockAffinity4Key {
    /// The client's network namespace cookie (`bpf_get_netns_cookie`).
    pub netns_cookie: u64,
    /// The frontend's service id.
    pub service_id: u32,
    /// Explicit padding (zero).
    pub _pad: u32,
}
assert_size!(SockAffinity4Key, 16);

user_pod!(SockAffinity4Key);

/// IP protocol number of TCP (as `bpf_sock_addr::protocol` holds it).
pub const IPPROTO_TCP: u32 = 6;
/// IP protocol number of UDP.
pub const IPPROTO_UDP: u32 = 17;

/// LRU hash [`SockDgram4Key`] → [`SockRevNat4`]: for each unconnected UDP socket (by its cookie)
/// and each backend `sock_sendmsg4`/`sock_sendmsg6` sent one of its datagrams to, the frontend
/// the application addressed; `sock_recvmsg4`/`sock_recvmsg6` show a datagram from that backend
/// as from the frontend. A closed socket's entries stay until the LRU evicts them (a cookie is
/// never reused while the kernel runs).
pub const SOCK_DGRAM4: &str = "sock_dgram4_v1";
/// Entries of [`SOCK_DGRAM4`].
pub const SOCK_DGRAM_MAX: u32 = 65_536;

/// Key of [`SOCK_DGRAM4`]: a socket and a backend it sent to.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
pub struct SockDgram4Key {
    /// The socket's cookie (`bpf_get_socket_cookie`).
    pub cookie: u64,
    /// The backend's address (network byte order).
    pub backend: [u8; 4],
    /// The backend's port (host byte order).
    pub backend_port: u16,
    /// Explicit padding (zero).
    pub _pad: u16,
}
assert_size!(SockDgram4Key, 16);

user_pod!(SockDgram4Key);

/// Whether `sock_sendmsg4`/`sock_sendmsg6` place a datagram of an unconnected UDP socket sent to a
/// frontend with these `flags` and `backend_count`: not a frontend without a ready backend, not
/// one with `ClientIP` affinity (a pod's connected UDP sockets to it go per packet, whose memory
/// is by address: the two would not agree), not the host interfaces' entry of a `Local` external
/// frontend. A connected UDP socket is never placed (it would keep a removed backend;
/// its datagrams are translated per packet, which moves them); an unconnected one is placed
/// again for every datagram, so it moves with the frontend's slots.
#[inline(always)]
#[must_use]
pub const fn places_datagram(flags: u16, backend_count: u16) -> bool {
    backend_count > 0 && flags & (SVC_FLAG_AFFINITY | SVC_FLAG_EXTERNAL_LOCAL) == 0
}

/// The hash an unconnected UDP socket's datagram to a frontend is placed by: the socket's
/// `cookie` and the frontend (address in network byte order, port), so all of one socket's
/// datagrams to one frontend go to one backend while the frontend's slots stay (as the datagrams
/// of one source port make one flow for kube-proxy's conntrack), and different sockets spread.
#[inline(always)]
#[must_use]
pub const fn datagram_hash(cookie: u64, frontend: [u8; 4], frontend_port: u16) -> u32 {
    let mut h =
        cookie ^ ((u32::from_be_bytes(frontend) as u64) << 16) ^ ((frontend_port as u64) << 48);
    // splitmix64's finaliser.
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^= h >> 31;
    (h ^ (h >> 32)) as u32
}

/// Whether `sock_getpeer4`/`sock_getpeer6` show `entry`'s frontend for a peer address
/// `(addr, port)` (port in host byte order): only when the peer is the backend the socket was
/// given.
#[inline(always)]
#[must_use]
pub fn shows_frontend(entry: &SockRevNat4, addr: [u8; 4], port: u16) -> bool {
    entry.backend == addr && entry.backend_port == port
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::SVC_FLAG_INTERNAL_LOCAL;

    #[test]
    fn only_tcp_frontends_with_backends_are_placed_at_connect() {
        let (tcp, udp, sctp) = (IPPROTO_TCP, 17, 132);
        assert!(places(tcp, 0, 3));
        assert!(places(tcp, SVC_FLAG_INTERNAL_LOCAL, 1));
        assert!(!places(udp, 0, 3));
        assert!(!places(sctp, 0, 3));
        assert!(!places(tcp, 0, 0));
        assert!(places(tcp, SVC_FLAG_AFFINITY, 3));
        assert!(!places(udp, SVC_FLAG_AFFINITY, 3));
        assert!(!places(tcp, SVC_FLAG_EXTERNAL_LOCAL, 3));
    }

    #[test]
    fn host_only_places_the_node_s_own_namespace_alone() {
        let all = SockLbConfig::default();
        assert!(in_scope(&all, 4096));
        assert!(in_scope(&all, 1));
        let host_only = SockLbConfig { netns_cookie: 1 };
        assert!(in_scope(&host_only, 1));
        assert!(!in_scope(&host_only, 4096));
    }

    #[test]
    fn datagrams_are_placed_like_connections_but_for_udp() {
        assert!(places_datagram(0, 3));
        assert!(!places_datagram(0, 0));
        assert!(!places_datagram(SVC_FLAG_AFFINITY, 3));
        assert!(!places_datagram(SVC_FLAG_EXTERNAL_LOCAL, 3));
    }

    #[test]
    fn a_socket_s_datagrams_to_a_frontend_share_a_hash_and_sockets_spread() {
        use crate::service::backend_slot;
        let fe = [10, 96, 0, 10];
        assert_eq!(datagram_hash(42, fe, 53), datagram_hash(42, fe, 53));
        assert_ne!(datagram_hash(42, fe, 53), datagram_hash(42, fe, 54));
        assert_ne!(
            datagram_hash(42, fe, 53),
            datagram_hash(42, [10, 96, 0, 11], 53)
        );
        // Consecutive cookies (as the kernel hands them out) spread over three slots.
        let mut counts = [0u32; 3];
        for cookie in 1..=3_000u64 {
            let slot = backend_slot(datagram_hash(cookie, fe, 53), 3).expect("a slot");
            counts[usize::from(slot)] += 1;
        }
        assert!(counts.iter().all(|&c| c > 800), "{counts:?}");
    }

    #[test]
    fn the_frontend_is_shown_only_for_the_backend_given() {
        let e = SockRevNat4 {
            frontend: [10, 96, 0, 10],
            backend: [10, 1, 0, 5],
            frontend_port: 80,
            backend_port: 8080,
            service_id: 7,
        };
        assert!(shows_frontend(&e, [10, 1, 0, 5], 8080));
        assert!(!shows_frontend(&e, [10, 1, 0, 5], 8081));
        assert!(!shows_frontend(&e, [10, 1, 0, 6], 8080));
    }
}
