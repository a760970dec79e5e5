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
/// packet. Not: a frontend without a ready backend (`from_endpoint` rejects the first packet, as
/// kube-proxy does, with a TCP RST the socket reports as refused), one with `ClientIP` affinity
/// (its memory is per client address, which a socket does not have before it connects;
/// `from_endpoint` keeps it), and the entry of an external frontend with
/// `externalTrafficPolicy: Local` that the host interfaces use (`sock_connect4` places over the
/// frontend's pods' scope instead, whose entry carries no such flag).
#[inline(always)]
#[must_use]
pub const fn places(protocol: u32, flags: u16, backend_count: u16) -> bool {
    protocol == IPPROTO_TCP
        && backend_count > 0
        && flags & (SVC_FLAG_AFFINITY | SVC_FLAG_EXTERNAL_LOCAL) == 0
}

/// IP protocol number of TCP (as `bpf_sock_addr::protocol` holds it).
pub const IPPROTO_TCP: u32 = 6;

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
    fn only_plain_tcp_frontends_with_backends_are_placed_at_connect() {
        let (tcp, udp, sctp) = (IPPROTO_TCP, 17, 132);
        assert!(places(tcp, 0, 3));
        assert!(places(tcp, SVC_FLAG_INTERNAL_LOCAL, 1));
        assert!(!places(udp, 0, 3));
        assert!(!places(sctp, 0, 3));
        assert!(!places(tcp, 0, 0));
        assert!(!places(tcp, SVC_FLAG_AFFINITY, 3));
        assert!(!places(tcp, SVC_FLAG_EXTERNAL_LOCAL, 3));
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
