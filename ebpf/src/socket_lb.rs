//! Socket LB (`maps_schema::socket_lb`): a TCP socket in the attached cgroup that connects to a
//! frontend is given a backend at `connect`, so its packets leave addressed to the backend and
//! `from_endpoint` handles them as a plain flow; `getpeername` shows the frontend again. An IPv6
//! socket connecting to an IPv4-mapped address (`::ffff:a.b.c.d`, what a dual-stack socket uses
//! for an IPv4 peer) goes through the `connect6`/`getpeername6` hooks and is placed the same way.
//! The backend is chosen as `from_endpoint` chooses one for a new flow (a slot of the
//! frontend's, here by a random number: the socket has no source port yet). Anything it does not
//! place (no frontend, [`places`] false, no socket storage to be had) is left as it is, for `from_endpoint` to
//! translate per packet as before. A `Local` external frontend (an external or load-balancer
//! address with `externalTrafficPolicy: Local`) is placed over its pods' scope, every ready
//! backend, as `from_endpoint` places a pod's flow. A NodePort on one of this node's own addresses
//! (the `host` identity in `ident4`) or on a loopback address is placed as a pod's flow to it is
//! (the node's own processes reach it as kube-proxy lets them). Every program returns 1 (go on):
//! socket LB never refuses a call.

use aya_ebpf::{
    EbpfContext as _,
    helpers::{bpf_get_netns_cookie, bpf_get_prandom_u32, bpf_get_socket_cookie},
    programs::SockAddrContext,
};
use maps_schema::{
    SlotKey, Svc4Key,
    identity::HOST,
    service::{
        Affinity4, NODEPORT_ANY, SCOPE_ALL, SCOPE_PODS, SVC_FLAG_AFFINITY, SVC_FLAG_EXTERNAL_LOCAL,
        backend_slot, pod_nodeport,
    },
    socket_lb::{
        IPPROTO_TCP, IPPROTO_UDP, SockAffinity4Key, SockDgram4Key, SockRevNat4, datagram_hash,
        in_scope, places, places_datagram, shows_frontend,
    },
};

use crate::{
    flow::now_ns,
    maps::{
        IDENT4, SOCK_AFFIN4, SOCK_CFG, SOCK_DGRAM4, SOCK_RNAT4, SVC_BACKENDS4, SVC_SLOTS, SVC4,
    },
    parse::Aligned,
    service::still_held,
};

/// `AF_INET`.
const AF_INET: u32 = 2;
/// `AF_INET6`.
const AF_INET6: u32 = 10;
/// The third word of an IPv4-mapped IPv6 address (`::ffff:0:0/96`), as loaded.
const V4_MAPPED: u32 = u32::from_ne_bytes([0, 0, 0xff, 0xff]);
/// What a `cgroup/sock_addr` program returns to let the call go on.
pub(crate) const PROCEED: i32 = 1;

/// The backend a socket reaching `addr` (as loaded) and `user_port` over `protocol` gets, as
/// the entry that remembers it (the frontend as dialled); None when it is left to
/// `from_endpoint`. A TCP connection's slot is chosen at random (the socket has no source port
/// yet); an unconnected UDP socket's datagram by `datagram_hash` of the socket's `cookie` and the
/// frontend, so the socket keeps its backend while the slots stay.
///
/// A TCP frontend with `ClientIP` affinity is placed on the backend the socket's network
/// namespace's last connection to it went to, while that holds (`sock_affin4_v1`), and the choice
/// is remembered; without room for the memory the socket is left to `from_endpoint`.
#[inline(always)]
fn choose(
    ctx: &SockAddrContext,
    addr: u32,
    user_port: u32,
    protocol: u32,
    cookie: u64,
) -> Option<SockRevNat4> {
    // `user_port` holds the port in network byte order in its low 16 bits.
    let port = u16::from_be(user_port as u16);
    // A NodePort on one of this node's own addresses (or loopback) is looked up as a NodePort
    // first, then as the address itself (an external address that is the node's), as
    // `from_endpoint` looks up a pod's packet.
    let node_port = own_node_port(addr, port);
    let mut fk = Aligned(Svc4Key {
        addr: if node_port {
            NODEPORT_ANY
        } else {
            addr.to_ne_bytes()
        },
        port,
        protocol: protocol as u8,
        scope: SCOPE_ALL,
    });
    // SAFETY: read-only to programs; the agent replaces entries whole.
    let mut found = unsafe { SVC4.get(&fk.0) };
    if found.is_none() && node_port {
        fk.0.addr = addr.to_ne_bytes();
        // SAFETY: as above.
        found = unsafe { SVC4.get(&fk.0) };
    }
    let mut svc = found?;
    // A `Local` external frontend: a socket of the node (a pod's or its own) gets every backend,
    // its pods' scope, as `from_endpoint` gives a pod and kube-proxy gives pods and the node.
    if svc.flags & SVC_FLAG_EXTERNAL_LOCAL != 0 {
        fk.0.scope = SCOPE_PODS;
        // SAFETY: as above.
        svc = unsafe { SVC4.get(&fk.0) }?;
    }
    let (service_id, count) = (svc.service_id, svc.backend_count);
    let hash = if protocol == IPPROTO_TCP {
        if !places(IPPROTO_TCP, svc.flags, count) {
            return None;
        }
        // SAFETY: a helper without side effects.
        unsafe { bpf_get_prandom_u32() }
    } else {
        if !places_datagram(svc.flags, count) {
            return None;
        }
        datagram_hash(cookie, addr.to_ne_bytes(), port)
    };
    // Only TCP gets here with affinity (`places_datagram` leaves such frontends alone).
    let affinity = svc.flags & SVC_FLAG_AFFINITY != 0;
    let ak = Aligned(SockAffinity4Key {
        netns_cookie: if affinity {
            // SAFETY: a helper reading the context's socket's namespace.
            unsafe { bpf_get_netns_cookie(ctx.as_ptr()) }
        } else {
            0
        },
        service_id,
        _pad: 0,
    });
    let remembered = if affinity {
        SOCK_AFFIN4
            .get_ptr(&ak.0)
            .and_then(|a| still_held(service_id, a, count, svc.affinity_timeout_secs))
    } else {
        None
    };
    let (backend_id, slot) = match remembered {
        Some(chosen) => chosen,
        None => {
            let slot = backend_slot(hash, count)?;
            let sk = Aligned(SlotKey {
                service_id,
                slot,
                pad: 0,
            });
            // SAFETY: as for `SVC4`.
            (unsafe { SVC_SLOTS.get(&sk.0) }?.backend_id, slot)
        }
    };
    // SAFETY: as for `SVC4`.
    let b = unsafe { SVC_BACKENDS4.get(&backend_id) }?;
    if affinity {
        // kube-proxy's `recent --set`: every new connection renews the client's memory.
        let used = Affinity4 {
            backend_id,
            slot,
            _pad: 0,
            last_used_ns: now_ns(),
        };
        SOCK_AFFIN4.insert(&ak.0, &used, 0).ok()?;
    }
    Some(SockRevNat4 {
        // The address dialled (a NodePort's key names none).
        frontend: addr.to_ne_bytes(),
        backend: b.addr,
        frontend_port: port,
        backend_port: b.port,
        service_id,
    })
}

/// The backend's address (as loaded) and `user_port` value of `entry`.
#[inline(always)]
fn backend_of(entry: &SockRevNat4) -> (u32, u32) {
    (
        u32::from_ne_bytes(entry.backend),
        u32::from(entry.backend_port.to_be()),
    )
}

/// The backend (address as loaded, `user_port` value) a TCP socket connecting to `addr` (as
/// loaded) and `user_port` gets, remembered in the socket's storage; None when it is left to
/// `from_endpoint`.
#[inline(always)]
fn place(ctx: &SockAddrContext, addr: u32, user_port: u32) -> Option<(u32, u32)> {
    let mut entry = choose(ctx, addr, user_port, IPPROTO_TCP, 0)?;
    // Without the entry the socket would see the backend as its peer: leave it to `from_endpoint`.
    let stored = SOCK_RNAT4.get_or_insert_ptr_mut(ctx, Some(&mut entry));
    if stored.is_null() {
        return None;
    }
    // SAFETY: a valid storage pointer for this program run. A socket that connects again (after
    // a failed attempt) already has storage, which `get_or_insert` left as it was.
    unsafe { *stored = entry };
    Some(backend_of(&entry))
}

/// The backend (address as loaded, `user_port` value) a datagram an unconnected UDP socket sends
/// to `addr` (as loaded) and `user_port` goes to, remembered by socket and backend in
/// `sock_dgram4_v1` (written only when it is not there already); None when it is left to
/// `from_endpoint`.
#[inline(always)]
fn place_datagram(ctx: &SockAddrContext, addr: u32, user_port: u32) -> Option<(u32, u32)> {
    // SAFETY: a helper reading the context's socket.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let entry = choose(ctx, addr, user_port, IPPROTO_UDP, cookie)?;
    let key = Aligned(SockDgram4Key {
        cookie,
        backend: entry.backend,
        backend_port: entry.backend_port,
        _pad: 0,
    });
    // SAFETY: a valid map value pointer for this program run.
    let known = SOCK_DGRAM4
        .get_ptr(&key.0)
        .is_some_and(|e| unsafe { *e } == entry);
    // Without the entry the answers would read as from the backend: leave it to `from_endpoint`.
    if !known && SOCK_DGRAM4.insert(&key.0, &entry, 0).is_err() {
        return None;
    }
    Some(backend_of(&entry))
}

/// The frontend (address as loaded, `user_port` value) to show as the source of a datagram an
/// unconnected UDP socket receives from `addr` (as loaded) and `user_port`, when the socket sent
/// to that backend through a frontend.
#[inline(always)]
fn datagram_frontend(ctx: &SockAddrContext, addr: u32, user_port: u32) -> Option<(u32, u32)> {
    // SAFETY: a helper reading the context's socket.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let key = Aligned(SockDgram4Key {
        cookie,
        backend: addr.to_ne_bytes(),
        backend_port: u16::from_be(user_port as u16),
        _pad: 0,
    });
    let e = SOCK_DGRAM4.get_ptr(&key.0)?;
    // SAFETY: a valid map value pointer for this program run.
    let (frontend, port) = unsafe { ((*e).frontend, (*e).frontend_port) };
    Some((u32::from_ne_bytes(frontend), u32::from(port.to_be())))
}

/// Whether a connect to `addr` (as loaded) and `port` may be to a NodePort on this node: a port in
/// `POD_NODEPORT_RANGE` (a comparison for every other connect) to a loopback address or one with
/// the `host` identity (one lookup), as kube-proxy serves NodePorts on the node's own and
/// loopback addresses to the node's processes.
#[inline(always)]
fn own_node_port(addr: u32, port: u16) -> bool {
    if !pod_nodeport(port) {
        return false;
    }
    let octets = addr.to_ne_bytes();
    if octets[0] == LOOPBACK_NET {
        return true;
    }
    let key = Aligned(octets);
    // SAFETY: read-only to programs; the agent replaces entries whole.
    unsafe { IDENT4.get(&key.0) }.is_some_and(|i| i.identity == HOST)
}

/// The first octet of IPv4 loopback addresses (`127.0.0.0/8`).
const LOOPBACK_NET: u8 = 127;

/// The frontend (address as loaded, `user_port` value) to show for a socket's peer `addr` (as
/// loaded) and `user_port`, when the socket was given that peer as its backend.
#[inline(always)]
fn frontend_of(ctx: &SockAddrContext, addr: u32, user_port: u32) -> Option<(u32, u32)> {
    let e = SOCK_RNAT4.get_ptr_mut(ctx);
    if e.is_null() {
        return None;
    }
    // SAFETY: a valid storage pointer for this program run.
    let e = unsafe { &*e };
    shows_frontend(e, addr.to_ne_bytes(), u16::from_be(user_port as u16)).then(|| {
        (
            u32::from_ne_bytes(e.frontend),
            u32::from(e.frontend_port.to_be()),
        )
    })
}

/// A hook's address for the calls of IP `protocol` (any: [`ANY`]) rewritten to what `to` maps
/// it to (address as loaded, `user_port` value), for an IPv4 socket.
#[inline(always)]
fn rewrite4(ctx: &SockAddrContext, protocol: u32, to: Hook) -> i32 {
    let sa = ctx.sock_addr;
    // SAFETY: the kernel's context for this run; these fields are readable in every hook these
    // programs attach to.
    let (family, proto, addr, port) = unsafe {
        (
            (*sa).user_family,
            (*sa).protocol,
            (*sa).user_ip4,
            (*sa).user_port,
        )
    };
    if family != AF_INET || (protocol != ANY && proto != protocol) || !to.in_scope(ctx) {
        return PROCEED;
    }
    if let Some((addr, port)) = to.apply(ctx, addr, port) {
        // SAFETY: as above; both fields are writable there.
        unsafe {
            (*sa).user_ip4 = addr;
            (*sa).user_port = port;
        }
    }
    PROCEED
}

/// As [`rewrite4`], for an IPv6 socket whose address is IPv4-mapped (`::ffff:a.b.c.d`, how a
/// dual-stack socket names an IPv4 peer); the address stays mapped.
#[inline(always)]
fn rewrite6(ctx: &SockAddrContext, protocol: u32, to: Hook) -> i32 {
    let sa = ctx.sock_addr;
    // SAFETY: the kernel's context for this run; these fields are readable in every hook these
    // programs attach to.
    let (family, proto, w0, w1, w2, addr, port) = unsafe {
        (
            (*sa).user_family,
            (*sa).protocol,
            (*sa).user_ip6[0],
            (*sa).user_ip6[1],
            (*sa).user_ip6[2],
            (*sa).user_ip6[3],
            (*sa).user_port,
        )
    };
    let mapped = w0 == 0 && w1 == 0 && w2 == V4_MAPPED;
    if family != AF_INET6 || !mapped || (protocol != ANY && proto != protocol) || !to.in_scope(ctx)
    {
        return PROCEED;
    }
    if let Some((addr, port)) = to.apply(ctx, addr, port) {
        // SAFETY: as above; both fields are writable there.
        unsafe {
            (*sa).user_ip6[3] = addr;
            (*sa).user_port = port;
        }
    }
    PROCEED
}

/// [`rewrite4`]/[`rewrite6`]: any protocol (the hook's socket says what it is).
const ANY: u32 = 0;

/// What a hook does with its address (a constant per program, so each program inlines one arm:
/// the verifier takes no function pointers, and a closure would be called out of line).
#[derive(Clone, Copy)]
enum Hook {
    /// `connect`: [`place`].
    Connect,
    /// `getpeername`: [`frontend_of`].
    ShowPeer,
    /// `sendmsg`: [`place_datagram`].
    Send,
    /// `recvmsg`: [`datagram_frontend`].
    Receive,
}

impl Hook {
    /// Whether this hook acts for the socket of `ctx`: `connect` and `sendmsg` place only the
    /// sockets `sock_cfg_v1` names (all, or the node's own network namespace's); `getpeername`
    /// and `recvmsg` act on every socket, since only a placed one has an entry.
    #[inline(always)]
    fn in_scope(self, ctx: &SockAddrContext) -> bool {
        match self {
            Self::ShowPeer | Self::Receive => true,
            Self::Connect | Self::Send => match SOCK_CFG.get(0) {
                Some(cfg) if cfg.netns_cookie != 0 => {
                    // SAFETY: a helper reading the context's socket's namespace.
                    let netns = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
                    in_scope(cfg, netns)
                }
                _ => true,
            },
        }
    }

    #[inline(always)]
    fn apply(self, ctx: &SockAddrContext, addr: u32, user_port: u32) -> Option<(u32, u32)> {
        match self {
            Self::Connect => place(ctx, addr, user_port),
            Self::ShowPeer => frontend_of(ctx, addr, user_port),
            Self::Send => place_datagram(ctx, addr, user_port),
            Self::Receive => datagram_frontend(ctx, addr, user_port),
        }
    }
}

/// `connect` of an IPv4 TCP socket: a frontend becomes one of its backends.
#[inline(always)]
pub(crate) fn try_connect4(ctx: &SockAddrContext) -> i32 {
    rewrite4(ctx, IPPROTO_TCP, Hook::Connect)
}

/// `connect` of an IPv6 TCP socket to an IPv4-mapped frontend: as [`try_connect4`].
#[inline(always)]
pub(crate) fn try_connect6(ctx: &SockAddrContext) -> i32 {
    rewrite6(ctx, IPPROTO_TCP, Hook::Connect)
}

/// `getpeername` of an IPv4 socket: the backend it was given reads as the frontend it connected
/// to.
#[inline(always)]
pub(crate) fn try_show_frontend4(ctx: &SockAddrContext) -> i32 {
    rewrite4(ctx, ANY, Hook::ShowPeer)
}

/// `getpeername` of an IPv6 socket whose peer is IPv4-mapped: as [`try_show_frontend4`].
#[inline(always)]
pub(crate) fn try_show_frontend6(ctx: &SockAddrContext) -> i32 {
    rewrite6(ctx, ANY, Hook::ShowPeer)
}

/// `sendmsg` of an IPv4 UDP socket to an address (an unconnected socket, or `sendto` on a
/// connected one): a datagram to a frontend goes to one of its backends.
#[inline(always)]
pub(crate) fn try_sendmsg4(ctx: &SockAddrContext) -> i32 {
    rewrite4(ctx, IPPROTO_UDP, Hook::Send)
}

/// `sendmsg` of an IPv6 UDP socket to an IPv4-mapped frontend: as [`try_sendmsg4`].
#[inline(always)]
pub(crate) fn try_sendmsg6(ctx: &SockAddrContext) -> i32 {
    rewrite6(ctx, IPPROTO_UDP, Hook::Send)
}

/// `recvmsg` of an IPv4 UDP socket: a datagram from a backend it sent to through a frontend
/// reads as from the frontend.
#[inline(always)]
pub(crate) fn try_recvmsg4(ctx: &SockAddrContext) -> i32 {
    rewrite4(ctx, ANY, Hook::Receive)
}

/// `recvmsg` of an IPv6 UDP socket from an IPv4-mapped source: as [`try_recvmsg4`].
#[inline(always)]
pub(crate) fn try_recvmsg6(ctx: &SockAddrContext) -> i32 {
    rewrite6(ctx, ANY, Hook::Receive)
}
