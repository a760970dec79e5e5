//! Socket LB (`maps_schema::socket_lb`): a TCP socket in the attached cgroup that connects to a
//! frontend is given a backend at `connect`, so its packets leave addressed to the backend and
//! `from_endpoint` handles them as a plain flow; `getpeername` shows the frontend again. The backend is chosen as `from_endpoint` chooses one for a
//! new flow (a slot of the frontend's, here by a random number: the socket has no source port
//! yet). Anything it does not place (no frontend, [`places`] false, a full map) is left as it is,
//! for `from_endpoint` to translate per packet as before. Every program returns 1 (go on): socket
//! LB never refuses a call.

use aya_ebpf::{
    EbpfContext as _,
    helpers::{bpf_get_prandom_u32, bpf_get_socket_cookie},
    programs::SockAddrContext,
};
use maps_schema::{
    SlotKey, Svc4Key,
    service::{SCOPE_ALL, backend_slot},
    socket_lb::{IPPROTO_TCP, SockRevNat4, places, shows_frontend},
};

use crate::{
    maps::{SOCK_RNAT4, SVC_BACKENDS4, SVC_SLOTS, SVC4},
    parse::Aligned,
};

/// `AF_INET`.
const AF_INET: u32 = 2;
/// What a `cgroup/sock_addr` program returns to let the call go on.
pub(crate) const PROCEED: i32 = 1;

/// `connect` (and the implicit connect of a TCP fast open `sendmsg`) of an IPv4 socket: a
/// frontend becomes one of its backends.
#[inline(always)]
pub(crate) fn try_connect4(ctx: &SockAddrContext) -> i32 {
    let sa = ctx.sock_addr;
    // SAFETY: the kernel's context for this run; these fields are readable in every
    // `cgroup/connect4` program.
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
    // `user_port` holds the port in network byte order in its low 16 bits.
    let port = u16::from_be(port as u16);
    let fk = Aligned(Svc4Key {
        addr: addr.to_ne_bytes(),
        port,
        protocol: protocol as u8,
        scope: SCOPE_ALL,
    });
    // SAFETY: read-only to programs; the agent replaces entries whole.
    let Some(svc) = (unsafe { SVC4.get(&fk.0) }) else {
        return PROCEED;
    };
    let (service_id, count) = (svc.service_id, svc.backend_count);
    if !places(protocol, svc.flags, count) {
        return PROCEED;
    }
    // SAFETY: a helper without side effects.
    let Some(slot) = backend_slot(unsafe { bpf_get_prandom_u32() }, count) else {
        return PROCEED;
    };
    let sk = Aligned(SlotKey {
        service_id,
        slot,
        pad: 0,
    });
    // SAFETY: as for `SVC4`.
    let Some(v) = (unsafe { SVC_SLOTS.get(&sk.0) }) else {
        return PROCEED;
    };
    // SAFETY: as for `SVC4`.
    let Some(b) = (unsafe { SVC_BACKENDS4.get(&v.backend_id) }) else {
        return PROCEED;
    };
    let (backend, backend_port) = (b.addr, b.port);
    // SAFETY: the helper reads the socket of this program's context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let entry = SockRevNat4 {
        frontend: fk.0.addr,
        backend,
        frontend_port: port,
        backend_port,
        service_id,
    };
    // Without the entry the socket would see the backend as its peer: leave it to `from_endpoint`.
    if SOCK_RNAT4.insert(&cookie, &entry, 0).is_err() {
        return PROCEED;
    }
    // SAFETY: as above; both fields are writable in `cgroup/connect4`.
    unsafe {
        (*sa).user_ip4 = u32::from_ne_bytes(backend);
        (*sa).user_port = u32::from(backend_port.to_be());
    }
    PROCEED
}

/// `getpeername` of a socket: the backend it was given reads as the frontend it connected to.
#[inline(always)]
pub(crate) fn try_show_frontend4(ctx: &SockAddrContext) -> i32 {
    let sa = ctx.sock_addr;
    // SAFETY: the helper reads the socket of this program's context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let Some(e) = SOCK_RNAT4.get_ptr(&cookie) else {
        return PROCEED;
    };
    // SAFETY: a valid map value pointer for this program run; the context's fields are readable
    // and `user_ip4`/`user_port` writable in `cgroup/getpeername4`.
    unsafe {
        let (addr, port) = ((*sa).user_ip4, u16::from_be((*sa).user_port as u16));
        if shows_frontend(&*e, addr.to_ne_bytes(), port) {
            (*sa).user_ip4 = u32::from_ne_bytes((*e).frontend);
            (*sa).user_port = u32::from((*e).frontend_port.to_be());
        }
    }
    PROCEED
}
