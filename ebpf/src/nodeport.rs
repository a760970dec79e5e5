//! NodePorts on the host interfaces named by `--nodeport-interfaces` (`masq_if` entries with
//! `IF_NODEPORT`), inside `masq_ingress` / `masq_egress`:
//!
//! - a TCP or UDP packet arriving for the interface's address on a port with a NodePort frontend
//!   (`svc4` key `NODEPORT_ANY`) gets a backend as ClusterIP flows do (`service::frontend`: the
//!   flow keeps its backend in `svc_ct4`). A backend on this node (`BACKEND_FLAG_LOCAL`) is only
//!   the new destination: the packet goes on through the stack to the pod, whose `to_endpoint`
//!   judges it by the client's address, which the pod sees (`externalTrafficPolicy: Local` slots
//!   hold only such backends). Another node's backend also gets this node's address as the
//!   source, with a NAT port (`masq::egress_port`, the masquerade's pairs in `nat4`), so the reply
//!   comes back here; the packet is then forwarded by a FIB lookup and a redirect (a packet with
//!   a local source address is a martian to the stack's forwarding);
//! - a reply of such a remote flow arriving (its `nat4` ingress entry leads to a `svc_ct4` reply
//!   entry of a NodePort) gets the client as destination and the node's address and NodePort as
//!   source, and is forwarded the same way;
//! - a local backend's reply leaving an interface gets the interface's address and the NodePort
//!   as source.
//!
//! Nothing is judged by policy here: the backend's `to_endpoint` (on whichever node) does that.

use aya_ebpf::{
    bindings::TC_ACT_REDIRECT,
    helpers::{bpf_redirect, bpf_redirect_neigh},
    programs::TcContext,
};
use maps_schema::{
    nat::DIR_INGRESS,
    reason::{
        DIR_MASQUERADE, DROP_CT_INSERT_FAILED, DROP_MALFORMED, DROP_NODEPORT_NO_ROUTE,
        PASS_NODEPORT, PASS_NODEPORT_REPLY,
    },
    service::{BACKEND_FLAG_LOCAL, NODEPORT_ANY},
    service_ct::DIR_REPLY,
};

use crate::{
    counters::{Seen, Verdict, account, count},
    fib::{self, FIB_NO_NEIGH, FIB_SUCCESS, Fib},
    maps::{MASQ_IF, NAT4, SVC_BACKENDS4, SVC_CT4, SVC_REVNAT4},
    masq::{Flow, egress_port, nat_key, rewrite},
    parse::{IPPROTO_TCP, IPPROTO_UDP, Packet, Reason, Tuple},
    service::{Translation, frontend, key, record},
};

/// The frontend a `svc_ct4` reply entry's service has (`NODEPORT_ANY` for a NodePort): what a
/// reply's source becomes. `None` when the service is gone.
#[inline(always)]
fn frontend_of(service_id: u32) -> Option<([u8; 4], u16)> {
    // SAFETY: read-only to programs; the agent replaces entries whole.
    let rev = unsafe { SVC_REVNAT4.get(&service_id) }?;
    Some((rev.addr, rev.port))
}

/// A frontend's address for a reply leaving through an interface with address `node`: a
/// NodePort's is `node`, an external address's (or a cluster IP's, reached from outside) its own.
#[inline(always)]
fn source_of(frontend: [u8; 4], node: u32) -> u32 {
    if frontend == NODEPORT_ANY {
        node
    } else {
        u32::from_ne_bytes(frontend)
    }
}

#[inline(always)]
fn tuple(f: &Flow) -> Tuple<u32> {
    Tuple {
        src: f.src,
        dst: f.dst,
        sport: f.sport,
        dport: f.dport,
        proto: f.proto,
    }
}

/// A drop after the packet was rewritten: counted only (its pointers are stale, so no drop
/// event quotes it).
#[inline(always)]
fn dropped(reason: Reason, seen: &Seen) -> Verdict {
    count(reason, DIR_MASQUERADE, seen.len);
    Verdict::Drop
}

/// The FIB's way to `dst` for a packet that arrived on `ifindex`, with the address of the
/// interface it names (its `masq_if` entry): `None` when there is none.
#[inline(always)]
fn route(ctx: &TcContext, ifindex: u32, proto: u8, src: u32, dst: u32) -> Option<(Fib, i64, u32)> {
    let (fib, rc) = fib::lookup(ctx, ifindex, proto, src, dst);
    if rc != FIB_SUCCESS && rc != FIB_NO_NEIGH {
        return None;
    }
    // SAFETY: read-only to programs; the agent replaces entries whole.
    let out = unsafe { MASQ_IF.get(&fib.ifindex) }.map(|i| u32::from_ne_bytes(i.addr))?;
    Some((fib, rc, out))
}

/// A packet arriving through the interface with address `node`: for `node`, a NodePort flow's
/// packet (or one to an external address that is `node`) or a reply of one translated to another
/// node's backend; for another address, a packet to a frontend (an external or load-balancer
/// address routed to this node, or a cluster IP); `None` for anything else (the masquerade's,
/// the node's own, or traffic through the node).
#[inline(always)]
pub(crate) fn arriving(
    ctx: &TcContext,
    pkt: &Packet,
    f: &Flow,
    node: u32,
    seen: &Seen,
) -> Option<Verdict> {
    if f.proto != IPPROTO_TCP && f.proto != IPPROTO_UDP {
        return None;
    }
    // A reply of a flow sent to another node's backend: backend → node:NAT port.
    let nk = nat_key(f.src, node, f.sport, f.dport, f.proto, DIR_INGRESS);
    if f.dst == node
        && let Some(e) = NAT4.get_ptr(&nk.0)
    {
        // SAFETY: a pointer into the map's value for this program run.
        let (client, cport) = unsafe { (u32::from_ne_bytes((*e).addr), (*e).port) };
        let reply = Tuple {
            src: f.src,
            dst: client,
            sport: f.sport,
            dport: cport,
            proto: f.proto,
        };
        let se = SVC_CT4.get_ptr(&key(&reply, DIR_REPLY).0)?;
        // SAFETY: as above.
        let frontend = frontend_of(unsafe { (*se).service_id })?;
        return Some(remote_reply(ctx, f, (client, cport), frontend, seen));
    }
    let t = tuple(f);
    let mut tr = Translation::empty();
    // For the node's address: its NodePorts, else an external address that is the node's
    // (`frontend` looks the address up when the port is no NodePort).
    let fe = if f.dst == node {
        u32::from_ne_bytes(NODEPORT_ANY)
    } else {
        f.dst
    };
    match frontend(&t, (fe, false), f.tcp_flags, &mut tr) {
        Ok(false) => None,
        Ok(true) => Some(to_backend(ctx, pkt, f, &t, &tr, seen)),
        Err(reason) => Some(account(reason, seen, pkt)),
    }
}

/// A packet to a NodePort with its backend chosen (`tr`).
#[inline(always)]
fn to_backend(
    ctx: &TcContext,
    pkt: &Packet,
    f: &Flow,
    t: &Tuple<u32>,
    tr: &Translation,
    seen: &Seen,
) -> Verdict {
    let translated = Tuple {
        dst: tr.addr,
        dport: tr.port(),
        ..*t
    };
    if record(&translated, t.dst, t.dport, tr).is_err() {
        return account(DROP_CT_INSERT_FAILED, seen, pkt);
    }
    // SAFETY: read-only to programs; the agent replaces entries whole.
    let local = unsafe { SVC_BACKENDS4.get(&tr.backend_id) }.is_some_and(|b| {
        u32::from_ne_bytes(b.addr) == tr.addr && b.flags & BACKEND_FLAG_LOCAL != 0
    });
    if rewrite(ctx, f, false, (t.dst, tr.addr), (t.dport, tr.port())).is_err() {
        return dropped(DROP_MALFORMED, seen);
    }
    if local {
        count(PASS_NODEPORT, DIR_MASQUERADE, seen.len);
        return Verdict::Pass;
    }
    // Another node's backend: out through the interface the FIB names, from its address.
    let Some((fib, rc, out)) = route(ctx, seen.ifindex, f.proto, t.src, tr.addr) else {
        return dropped(DROP_NODEPORT_NO_ROUTE, seen);
    };
    let sent = Flow {
        dst: tr.addr,
        dport: tr.port(),
        ..*f
    };
    let port = match egress_port(&sent, out, seen) {
        Ok(port) => port,
        Err(reason) => return dropped(reason, seen),
    };
    if rewrite(ctx, &sent, true, (t.src, out), (t.sport, port)).is_err() {
        return dropped(DROP_MALFORMED, seen);
    }
    forward(ctx, &fib, rc, PASS_NODEPORT, seen)
}

/// The reply of a flow from outside sent to another node's backend: to the client, from the
/// frontend (a NodePort's: this node's address on the way out and the NodePort).
#[inline(always)]
fn remote_reply(
    ctx: &TcContext,
    f: &Flow,
    (client, cport): (u32, u16),
    (frontend, from_port): ([u8; 4], u16),
    seen: &Seen,
) -> Verdict {
    let Some((fib, rc, out)) = route(ctx, seen.ifindex, f.proto, f.src, client) else {
        return dropped(DROP_NODEPORT_NO_ROUTE, seen);
    };
    let from = source_of(frontend, out);
    if rewrite(ctx, f, false, (f.dst, client), (f.dport, cport)).is_err() {
        return dropped(DROP_MALFORMED, seen);
    }
    let back = Flow { dst: client, ..*f };
    if rewrite(ctx, &back, true, (f.src, from), (f.sport, from_port)).is_err() {
        return dropped(DROP_MALFORMED, seen);
    }
    forward(ctx, &fib, rc, PASS_NODEPORT_REPLY, seen)
}

/// A packet leaving through the interface with address `node`: a local backend's reply to a
/// client from outside gets the frontend as its source (a NodePort's: `node` and the NodePort);
/// `None` for anything else.
#[inline(always)]
pub(crate) fn reply_out(ctx: &TcContext, f: &Flow, node: u32, seen: &Seen) -> Option<Verdict> {
    if f.proto != IPPROTO_TCP && f.proto != IPPROTO_UDP {
        return None;
    }
    let e = SVC_CT4.get_ptr(&key(&tuple(f), DIR_REPLY).0)?;
    // SAFETY: a pointer into the map's value for this program run.
    let (frontend, from_port) = frontend_of(unsafe { (*e).service_id })?;
    let from = source_of(frontend, node);
    let reason = match rewrite(ctx, f, true, (f.src, from), (f.sport, from_port)) {
        Ok(()) => PASS_NODEPORT_REPLY,
        Err(_) => DROP_MALFORMED,
    };
    count(reason, DIR_MASQUERADE, seen.len);
    Some(if reason == PASS_NODEPORT_REPLY {
        Verdict::Pass
    } else {
        Verdict::Drop
    })
}

/// Sends the translated packet out of the interface the FIB lookup named: with the neighbour's
/// address when it knew it, else through the neighbour subsystem.
#[inline(always)]
fn forward(ctx: &TcContext, fib: &Fib, rc: i64, reason: Reason, seen: &Seen) -> Verdict {
    let action = if rc == FIB_SUCCESS {
        if ctx.store(0, fib.mac(10), 0).is_err() || ctx.store(6, fib.mac(4), 0).is_err() {
            return dropped(DROP_MALFORMED, seen);
        }
        // SAFETY: a plain helper call.
        unsafe { bpf_redirect(fib.ifindex, 0) }
    } else {
        // SAFETY: no parameters: the helper looks the next hop up itself.
        unsafe { bpf_redirect_neigh(fib.ifindex, core::ptr::null_mut(), 0, 0) }
    };
    if action != i64::from(TC_ACT_REDIRECT) {
        return dropped(DROP_NODEPORT_NO_ROUTE, seen);
    }
    count(reason, DIR_MASQUERADE, seen.len);
    Verdict::Redirect
}
