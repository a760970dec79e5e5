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
//! backend, as `from_endpoint` places a pod's flow. Every program returns 1 (go on): socket LB never refuses a
//! call.

use aya_ebpf::{helpers::bpf_get_prandom_u32, programs::SockAddrContext};
use maps_schema::{
    SlotKey, Svc4Key,
    service::{SCOPE_ALL, SCOPE_PODS, SVC_FLAG_EXTERNAL_LOCAL, backend_slot},
    socket_lb::{IPPROTO_TCP, SockRevNat4, places, shows_frontend},
};

use crate::{
    maps::{SOCK_RNAT4, SVC_BACKENDS4, SVC_SLOTS, SVC4},
    parse::Aligned,
};

/// `AF_INET`.
const AF_INET: u32 = 2;
/// `AF_INET6`.
const AF_INET6: u32 = 10;
/// The third word of an IPv4-mapped IPv6 address (`::ffff:0:0/96`), as loaded.
const V4_MAPPED: u32 = u32::from_ne_bytes([0, 0, 0xff, 0xff]);
/// What a `cgroup/sock_addr` program returns to let the call go on.
pub(crate) const PROCEED: i32 = 1;

/// The backend (address as loaded, `user_port` value) a TCP socket connecting to `addr` (as
/// loaded) and `user_port` gets, remembered in the socket's storage; None when it is left to
/// `from_endpoint`.
#[inline(always)]
fn place(ctx: &SockAddrContext, addr: u32, user_port: u32) -> Option<(u32, u32)> {
    // `user_port` holds the port in network byte order in its low 16 bits.
    let port = u16::from_be(user_port as u16);
    let mut fk = Aligned(Svc4Key {
        addr: addr.to_ne_bytes(),
        port,
        protocol: IPPROTO_TCP as u8,
        scope: SCOPE_ALL,
    });
    // SAFETY: read-only to programs; the agent replaces entries whole.
    let mut svc = unsafe { SVC4.get(&fk.0) }?;
    // A `Local` external frontend: a socket of the node (a pod's or its own) gets every backend,
    // its pods' scope, as `from_endpoint` gives a pod and kube-proxy gives pods and the node.
    if svc.flags & SVC_FLAG_EXTERNAL_LOCAL != 0 {
        fk.0.scope = SCOPE_PODS;
        // SAFETY: as above.
        svc = unsafe { SVC4.get(&fk.0) }?;
    }
    let (service_id, count) = (svc.service_id, svc.backend_count);
    if !places(IPPROTO_TCP, svc.flags, count) {
        return None;
    }
    // SAFETY: a helper without side effects.
    let slot = backend_slot(unsafe { bpf_get_prandom_u32() }, count)?;
    let sk = Aligned(SlotKey {
        service_id,
        slot,
        pad: 0,
    });
    // SAFETY: as for `SVC4`.
    let v = unsafe { SVC_SLOTS.get(&sk.0) }?;
    // SAFETY: as for `SVC4`.
    let b = unsafe { SVC_BACKENDS4.get(&v.backend_id) }?;
    let (backend, backend_port) = (b.addr, b.port);
    let mut entry = SockRevNat4 {
        frontend: fk.0.addr,
        backend,
        frontend_port: port,
        backend_port,
        service_id,
    };
    // Without the entry the socket would see the backend as its peer: leave it to `from_endpoint`.
    let stored = SOCK_RNAT4.get_or_insert_ptr_mut(ctx, Some(&mut entry));
    if stored.is_null() {
        return None;
    }
    // SAFETY: a valid storage pointer for this program run. A socket that connects again (after
    // a failed attempt) already has storage, which `get_or_insert` left as it was.
    unsafe { *stored = entry };
    Some((u32::from_ne_bytes(backend), u32::from(backend_port.to_be())))
}

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

/// `connect` of an IPv4 socket: a frontend becomes one of its backends.
#[inline(always)]
pub(crate) fn try_connect4(ctx: &SockAddrContext) -> i32 {
    let sa = ctx.sock_addr;
    // SAFETY: the kernel's context for this run; these fields are readable in `cgroup/connect4`.
    let (family, protocol, addr, port) = unsafe {
        (
            (*sa).user_family,
            (*sa).protocol,
            (*sa).user_ip4,
            (*sa).user_port,
        )
    };
    if family != AF_INET || protocol != IPPROTO_TCP {
        return PROCEED;
    }
    if let Some((addr, port)) = place(ctx, addr, port) {
        // SAFETY: as above; both fields are writable in `cgroup/connect4`.
        unsafe {
            (*sa).user_ip4 = addr;
            (*sa).user_port = port;
        }
    }
    PROCEED
}

/// `connect` of an IPv6 socket to an IPv4-mapped address: a frontend becomes one of its backends
/// (the address stays mapped).
#[inline(always)]
pub(crate) fn try_connect6(ctx: &SockAddrContext) -> i32 {
    let sa = ctx.sock_addr;
    // SAFETY: the kernel's context for this run; these fields are readable in `cgroup/connect6`.
    let (family, protocol, w0, w1, w2, addr, port) = unsafe {
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
    if family != AF_INET6 || protocol != IPPROTO_TCP || w0 != 0 || w1 != 0 || w2 != V4_MAPPED {
        return PROCEED;
    }
    if let Some((addr, port)) = place(ctx, addr, port) {
        // SAFETY: as above; both fields are writable in `cgroup/connect6`.
        unsafe {
            (*sa).user_ip6[3] = addr;
            (*sa).user_port = port;
        }
    }
    PROCEED
}

/// `getpeername` of an IPv4 socket: the backend it was given reads as the frontend it connected
/// to.
#[inline(always)]
pub(crate) fn try_show_frontend4(ctx: &SockAddrContext) -> i32 {
    let sa = ctx.sock_addr;
    // SAFETY: the kernel's context; `user_ip4`/`user_port` are readable and writable in
    // `cgroup/getpeername4`.
    unsafe {
        if let Some((addr, port)) = frontend_of(ctx, (*sa).user_ip4, (*sa).user_port) {
            (*sa).user_ip4 = addr;
            (*sa).user_port = port;
        }
    }
    PROCEED
}

/// `getpeername` of an IPv6 socket whose peer is IPv4-mapped: as [`try_show_frontend4`].
#[inline(always)]
pub(crate) fn try_show_frontend6(ctx: &SockAddrContext) -> i32 {
    let sa = ctx.sock_addr;
    // SAFETY: the kernel's context; `user_ip6`/`user_port` are readable and writable in
    // `cgroup/getpeername6`.
    unsafe {
        let mapped =
            (*sa).user_ip6[0] == 0 && (*sa).user_ip6[1] == 0 && (*sa).user_ip6[2] == V4_MAPPED;
        if mapped && let Some((addr, port)) = frontend_of(ctx, (*sa).user_ip6[3], (*sa).user_port) {
            (*sa).user_ip6[3] = addr;
            (*sa).user_port = port;
        }
    }
    PROCEED
}
