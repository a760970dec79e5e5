//! ClusterIP services (IPv4 TCP and UDP, `maps_schema::service`): `from_endpoint` translates a
//! packet to a frontend into one to a backend **before** conntrack and policy, so egress policy
//! judges the backend's identity; the client's `to_endpoint` rewrites a reply's source back to the
//! frontend its conntrack entry names (`rev_nat`, conntrack layout 3; the test-only `ct-v2` build
//! of the previous release finds it in `svc_ct4`'s reply entry). A flow keeps the backend it was
//! given (`svc_ct4`, `maps_schema::service_ct`) while
//! the service's slots change; only a new flow (or a new TCP connection on a tuple whose backend
//! is gone) is placed by `backend_slot(flow_hash(..))`, or with `ClientIP` affinity on the
//! backend the client's last new flow went to (`svc_affin4`) while that holds.
//!
//! ICMP errors about translated flows are translated back in `service_related`.
//!
//! Cost for packets that are not to a service: one `svc4` lookup in `from_endpoint`; nothing in
//! `to_endpoint` (a reply's frontend comes with the conntrack lookup `decide` makes anyway).

use aya_ebpf::{bindings::TC_ACT_REDIRECT, helpers::bpf_redirect, programs::TcContext};
#[cfg(not(feature = "ct-v2"))]
use maps_schema::conntrack::FLAG_OPENER_IS_B;
// The taken-tuple check (left out of the layout-2 and `debug-log` test builds).
#[cfg(not(any(feature = "ct-v2", feature = "debug-log")))]
use maps_schema::service::tuple_taken;
// Affinity's memory and the pods' scope lookup (left out of the `debug-log` test build).
#[cfg(not(feature = "debug-log"))]
use maps_schema::service::{SCOPE_PODS, SVC_FLAG_EXTERNAL_LOCAL};
use maps_schema::{
    EndpointInfo, SlotKey, Svc4Key, SvcCt4Entry, SvcCt4Key,
    identity::HOST,
    reason::{
        DIR_FROM_ENDPOINT, DROP_CT_INSERT_FAILED, DROP_MALFORMED, DROP_SERVICE_NO_BACKEND, is_pass,
    },
    service::{Affinity4, Affinity4Key, MemberKey, affinity_holds},
    service::{
        BACKEND_FLAG_TERMINATING, HAIRPIN4, NODEPORT_ANY, SCOPE_ALL, SVC_FLAG_AFFINITY,
        backend_slot, flow_hash, pod_nodeport,
    },
    service_ct::{DIR_ORIGINAL, DIR_REPLY},
};

use crate::{
    counters::Seen,
    flow::{Family as _, decide, now_ns},
    ipv4::V4,
    maps::{
        IDENT4, SVC_AFFINITY4, SVC_BACKENDS4, SVC_CT4, SVC_MEMBERS, SVC_REVNAT4, SVC_SLOTS, SVC4,
    },
    masq,
    parse::{
        Aligned, Class, IPPROTO_TCP, IPPROTO_UDP, Packet, Parsed, Reason, TCP_ACK, TCP_SYN, Tuple,
    },
    service_related,
};

/// ICMP echo request (what `masq::parse` translates; irrelevant for TCP and UDP).
const ICMP_ECHO: u8 = 8;

/// Where a packet to a frontend goes. 8-aligned: the compiler moves it on the stack in wide
/// words, and the verifier refuses a misaligned stack access.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
pub(crate) struct Translation {
    /// The backend's address (as loaded).
    pub(crate) addr: u32,
    pub(crate) service_id: u32,
    pub(crate) backend_id: u32,
    /// The backend's port (host byte order).
    pub(crate) port: u32,
    /// Non-zero for a new flow ([`NEW`], with [`NEW_AFFINITY`] when its frontend has
    /// `ClientIP` affinity): its entries are written once policy allowed it.
    pub(crate) new: u32,
    /// The slot the backend holds (what an affinity entry remembers).
    pub(crate) slot: u32,
}

/// [`Translation::new`]: a new flow.
const NEW: u32 = 1;
/// [`Translation::new`]: the frontend has `ClientIP` affinity (the client's choice is remembered).
const NEW_AFFINITY: u32 = 2;

impl Translation {
    /// Nothing chosen yet.
    #[inline(always)]
    pub(crate) fn empty() -> Self {
        Self {
            addr: 0,
            service_id: 0,
            backend_id: 0,
            port: 0,
            new: 0,
            slot: 0,
        }
    }

    #[inline(always)]
    pub(crate) fn port(&self) -> u16 {
        self.port as u16
    }
}

#[inline(always)]
pub(crate) fn key(t: &Tuple<u32>, direction: u8) -> Aligned<SvcCt4Key> {
    Aligned(SvcCt4Key {
        saddr: t.src.to_ne_bytes(),
        daddr: t.dst.to_ne_bytes(),
        sport: t.sport,
        dport: t.dport,
        protocol: t.proto,
        direction,
        _pad: [0; 2],
    })
}

/// An IPv4 packet's verdict with services: the translation on the way out of a client, the
/// reverse translation on the way into it, and the plain decision for everything else. `p` is
/// rewritten in place (no copy: the programs' stack is tight). A passed packet that must go back
/// into the pod it came from (`send_back`) has [`HAIRPIN_TO_SELF`] or [`HAIRPIN_REPLY`] or-ed
/// into its reason (bits no reason code uses; a flag in a register, where an out parameter would
/// take a stack slot the programs do not have): [`hairpin`] takes them off.
#[inline(always)]
pub(crate) fn decide_v4(
    ctx: &TcContext,
    ep: &EndpointInfo,
    seen: &Seen,
    pkt: &Packet,
    mut p: Parsed<u32>,
    rule: &mut u32,
) -> Reason {
    let proto = p.tuple.proto;
    let served = matches!(p.class, Class::Flow) && (proto == IPPROTO_TCP || proto == IPPROTO_UDP);
    if !served {
        let reason = decide::<V4>(ep, seen, &mut p, rule);
        // An ICMP error entering a client about a translated flow gets the frontend back.
        if matches!(p.class, Class::Related)
            && seen.direction != DIR_FROM_ENDPOINT
            && is_pass(reason)
        {
            return service_related::translate_back(ctx, &p, reason);
        }
        return reason;
    }
    if seen.direction != DIR_FROM_ENDPOINT {
        // `decide` leaves a reply's frontend (its conntrack entry's `rev_nat`) in `p.rev_nat`.
        let reason = decide::<V4>(ep, seen, &mut p, rule);
        if !is_pass(reason) {
            return reason;
        }
        return reply(ctx, pkt, &p.tuple, p.rev_nat, reason);
    }
    // A forged source is dropped by `decide` before anything is looked up for it.
    if !V4::owns(ep, &p.tuple.src) {
        return decide::<V4>(ep, seen, &mut p, rule);
    }
    // A pod's packet to the hairpin address is its reply to a flow it sent itself through its
    // Service: judged as sent (the flow's `to_endpoint` approved it), then sent back in to the
    // pod from its own address (`send_back`), where `to_endpoint` finds the flow's reply entry
    // and gives it the frontend as its source. Nothing else answers at that address.
    let mut tr = Translation::empty();
    if p.tuple.dst == u32::from_ne_bytes(HAIRPIN4) {
        let reason = decide::<V4>(ep, seen, &mut p, rule);
        return if is_pass(reason) && !seen.trace {
            reason | HAIRPIN_REPLY
        } else {
            reason
        };
    }
    // A NodePort on one of this node's own addresses is served here as the host interfaces
    // serve it from outside; else the address itself may be a frontend (an external address
    // that is the node's).
    let node_port = own_node_port(&p.tuple);
    let fe = if node_port {
        u32::from_ne_bytes(NODEPORT_ANY)
    } else {
        p.tuple.dst
    };
    match frontend(&p.tuple, (fe, true), p.tcp_flags, &mut tr) {
        Ok(false) => return decide::<V4>(ep, seen, &mut p, rule),
        Ok(true) => {}
        Err(reason) => return reason,
    }
    let (vip, vport) = (p.tuple.dst, p.tuple.dport);
    p.tuple.dst = tr.addr;
    p.tuple.dport = tr.port();
    p.policy_port = tr.port();
    // A conntrack entry this packet creates keeps the frontend for the replies.
    p.rev_nat = tr.service_id;
    let reason = decide::<V4>(ep, seen, &mut p, rule);
    if !is_pass(reason) {
        return reason;
    }
    if !seen.trace && record_flow(&p.tuple, vip, vport, &tr).is_err() {
        return DROP_CT_INSERT_FAILED;
    }
    if node_port && !seen.trace && record_node_port(&p.tuple, vip, vport, &tr).is_err() {
        return DROP_CT_INSERT_FAILED;
    }
    let Some(f) = masq::parse(pkt, ICMP_ECHO) else {
        return DROP_MALFORMED;
    };
    if masq::rewrite(ctx, &f, false, (vip, tr.addr), (vport, tr.port())).is_err() {
        return DROP_MALFORMED;
    }
    // The pod reached itself through its Service: it goes back in from the hairpin address.
    if tr.addr == p.tuple.src && !seen.trace {
        return reason | HAIRPIN_TO_SELF;
    }
    reason
}

/// [`decide_v4`]: the packet was translated to its own sender (its source becomes the hairpin
/// address).
pub(crate) const HAIRPIN_TO_SELF: Reason = 1 << 16;
/// [`decide_v4`]: the packet is a pod's reply to the hairpin address (its destination becomes
/// the pod itself: the reply of a flow it sent itself through its Service, which `to_endpoint`
/// then finds and gives the frontend as its source; nothing else answers at that address).
pub(crate) const HAIRPIN_REPLY: Reason = 1 << 17;

/// Splits [`decide_v4`]'s answer into the reason and, for a hairpin packet, whether it was
/// translated to its own sender (`Some(true)`) or is a reply to the hairpin address.
#[inline(always)]
pub(crate) fn hairpin(answer: Reason) -> (Reason, Option<bool>) {
    let reason = answer & !(HAIRPIN_TO_SELF | HAIRPIN_REPLY);
    let kind = if answer & HAIRPIN_TO_SELF != 0 {
        Some(true)
    } else if answer & HAIRPIN_REPLY != 0 {
        Some(false)
    } else {
        None
    };
    (reason, kind)
}

/// Sends a hairpin packet back into the pod behind `ifindex`: one translated to the pod itself
/// (`to_self`) gets the hairpin address as its source, one to the hairpin address the pod as its
/// destination (the pod's reply to a flow it sent itself: `to_endpoint` finds the flow's reply
/// entry there and gives it the frontend as its source); the Ethernet addresses swapped (to the
/// pod from its gateway), out of the host end of its veth, so its `to_endpoint` judges it. In
/// its own stack frame (the decision's is nearly full). False when the packet cannot be
/// rewritten or the kernel refused the redirect.
#[inline(always)]
pub(crate) fn send_back(ctx: &TcContext, ifindex: u32, to_self: bool) -> bool {
    let pkt = Packet {
        data: ctx.data(),
        end: ctx.data_end(),
    };
    let Some(f) = masq::parse(&pkt, ICMP_ECHO) else {
        return false;
    };
    let hairpin = u32::from_ne_bytes(HAIRPIN4);
    let rewritten = if to_self {
        masq::rewrite(ctx, &f, true, (f.src, hairpin), (f.sport, f.sport))
    } else {
        masq::rewrite(ctx, &f, false, (f.dst, f.src), (f.dport, f.dport))
    };
    if rewritten.is_err() {
        return false;
    }
    let (Ok(dst), Ok(src)) = (ctx.load::<[u8; 6]>(0), ctx.load::<[u8; 6]>(6)) else {
        return false;
    };
    if ctx.store(0, &src, 0).is_err() || ctx.store(6, &dst, 0).is_err() {
        return false;
    }
    // SAFETY: a helper call on this program's context; it only records the target.
    let action = unsafe { bpf_redirect(ifindex, 0) };
    action == i64::from(TC_ACT_REDIRECT)
}

/// The backend of a packet to a frontend, into `out`: `Ok(false)` when `(frontend, t.dport,
/// t.proto)` is no frontend (`frontend` is the packet's destination, or `NODEPORT_ANY` for a
/// packet to a node address, whose destination is then looked up only when that is no NodePort:
/// an external address that is the node's); the flow's backend when it has one, else a newly
/// chosen one; no ready backend drops.
/// (An out parameter, not an `Option`: the verifier refuses the misaligned stack reads the
/// compiler makes of a niche-packed enum around it.)
#[inline(always)]
pub(crate) fn frontend(
    t: &Tuple<u32>,
    (frontend, pod): (u32, bool),
    tcp_flags: u8,
    out: &mut Translation,
) -> Result<bool, Reason> {
    let mut fk = Aligned(Svc4Key {
        addr: frontend.to_ne_bytes(),
        port: t.dport,
        protocol: t.proto,
        scope: SCOPE_ALL,
    });
    // SAFETY: read-only to programs; the agent replaces entries whole.
    let mut found = unsafe { SVC4.get(&fk.0) };
    if found.is_none() && frontend == u32::from_ne_bytes(NODEPORT_ANY) {
        fk.0.addr = t.dst.to_ne_bytes();
        // SAFETY: as above.
        found = unsafe { SVC4.get(&fk.0) };
    }
    #[cfg_attr(
        feature = "debug-log",
        expect(unused_mut, reason = "the pods' scope lookup is left out")
    )]
    let Some(mut svc) = found else {
        return Ok(false);
    };
    // A pod gets every backend of a `Local` external frontend (kube-proxy's short cut for pods).
    // Not in the `debug-log` test build (with its logging the programs would exceed the
    // verifier's complexity limit): there a pod gets the `Local` frontend's backends.
    #[cfg(feature = "debug-log")]
    let _ = pod;
    #[cfg(not(feature = "debug-log"))]
    if pod && svc.flags & SVC_FLAG_EXTERNAL_LOCAL != 0 {
        fk.0.scope = SCOPE_PODS;
        // SAFETY: as above.
        if let Some(all) = unsafe { SVC4.get(&fk.0) } {
            svc = all;
        }
    }
    let (service_id, count, flags, timeout) = (
        svc.service_id,
        svc.backend_count,
        svc.flags,
        svc.affinity_timeout_secs,
    );
    let syn = t.proto == IPPROTO_TCP && tcp_flags & TCP_SYN != 0 && tcp_flags & TCP_ACK == 0;
    if let Some(e) = SVC_CT4.get_ptr_mut(&key(t, DIR_ORIGINAL).0) {
        // SAFETY: a valid map value pointer for this program run.
        let (addr, port, backend_id) = unsafe { ((*e).addr, (*e).port, (*e).backend_id) };
        // A new connection on a tuple whose backend takes no new flows (terminating, or removed:
        // not in `svc_backend4`) is placed again, and so is a UDP flow's next datagram once its
        // backend is removed (UDP has no connection to finish; a terminating backend that still
        // serves keeps it); every other packet stays with the flow's backend.
        // SAFETY: as for `SVC4`.
        let gone = (syn || t.proto == IPPROTO_UDP)
            && unsafe { SVC_BACKENDS4.get(&backend_id) }.is_none_or(|b| {
                b.addr != addr || b.port != port || (syn && b.flags & BACKEND_FLAG_TERMINATING != 0)
            });
        if !gone {
            // The entry is not stamped: the LRU keeps what lookups touch, and the flow's age is
            // its conntrack entry's.
            *out = Translation {
                addr: u32::from_ne_bytes(addr),
                service_id,
                backend_id,
                port: u32::from(port),
                new: 0,
                slot: 0,
            };
            return Ok(true);
        }
    }
    let affinity = flags & SVC_FLAG_AFFINITY != 0;
    // The `debug-log` test build leaves affinity's memory out: with its logging calls the
    // programs would exceed the verifier's complexity limit (it places by the client's hash).
    #[cfg(not(feature = "debug-log"))]
    let remembered = if affinity {
        remembered(service_id, t.src, count, timeout)
    } else {
        None
    };
    #[cfg(feature = "debug-log")]
    let remembered: Option<(u32, u16)> = {
        let _ = timeout;
        None
    };
    let (backend_id, slot) = match remembered {
        Some(chosen) => chosen,
        None => {
            let hash = flow_hash(
                t.src.to_ne_bytes(),
                t.sport,
                t.dst.to_ne_bytes(),
                t.dport,
                t.proto,
                affinity,
            );
            let slot = backend_slot(hash, count).ok_or(DROP_SERVICE_NO_BACKEND)?;
            let sk = Aligned(SlotKey {
                service_id,
                slot,
                pad: 0,
            });
            // SAFETY: as for `SVC4`.
            let backend_id = unsafe { SVC_SLOTS.get(&sk.0) }
                .ok_or(DROP_SERVICE_NO_BACKEND)?
                .backend_id;
            (backend_id, slot)
        }
    };
    // SAFETY: as for `SVC4`.
    #[cfg_attr(
        any(feature = "ct-v2", feature = "debug-log"),
        expect(unused_mut, reason = "the taken-tuple check is left out")
    )]
    let mut b = unsafe { SVC_BACKENDS4.get(&backend_id) }.ok_or(DROP_SERVICE_NO_BACKEND)?;
    #[cfg_attr(
        any(feature = "ct-v2", feature = "debug-log"),
        expect(unused_mut, reason = "the taken-tuple check is left out")
    )]
    let (mut backend_id, mut slot) = (backend_id, slot);
    // A placed flow whose translated tuple another live flow holds takes the next slot's backend
    // (`maps_schema::service::tuple_taken`): one conntrack lookup per new flow. Not in the
    // layout-2 build (its entries have no frontend) nor the `debug-log` test build (the
    // verifier's complexity limit).
    #[cfg(not(any(feature = "ct-v2", feature = "debug-log")))]
    if remembered.is_none() && count > 1 && taken(t, b.addr, b.port, service_id) {
        let next = if slot + 1 >= count { 0 } else { slot + 1 };
        let sk = Aligned(SlotKey {
            service_id,
            slot: next,
            pad: 0,
        });
        // SAFETY: as for `SVC4`.
        if let Some(v) = unsafe { SVC_SLOTS.get(&sk.0) }
            && let Some(other) = unsafe { SVC_BACKENDS4.get(&v.backend_id) }
        {
            (backend_id, slot, b) = (v.backend_id, next, other);
        }
    }
    *out = Translation {
        addr: u32::from_ne_bytes(b.addr),
        service_id,
        backend_id,
        port: u32::from(b.port),
        new: if affinity { NEW | NEW_AFFINITY } else { NEW },
        slot: u32::from(slot),
    };
    Ok(true)
}

/// Whether the tuple of `t` translated to backend `addr:port` belongs to another live flow than
/// one of frontend `service_id` (its conntrack entry, `maps_schema::service::tuple_taken`).
#[cfg(not(any(feature = "ct-v2", feature = "debug-log")))]
#[inline(always)]
fn taken(t: &Tuple<u32>, addr: [u8; 4], port: u16, service_id: u32) -> bool {
    let translated = Tuple {
        dst: u32::from_ne_bytes(addr),
        dport: port,
        ..*t
    };
    let (key, _) = V4::ct_key(&translated);
    V4::ct_get(&key).is_some_and(|e| {
        // SAFETY: a valid map value pointer for this program run.
        let (rev_nat, flags) = unsafe { ((*e).rev_nat, (*e).flags) };
        tuple_taken(rev_nat, flags, t.proto, service_id)
    })
}

#[cfg(not(feature = "debug-log"))]
/// The backend (id, slot) `client`'s last new flow to frontend `service_id` went to, while that
/// was at most `timeout_secs` ago and the backend still holds that slot of the frontend's `count`
/// (so it still serves it: the agent never clears these entries).
#[inline(always)]
fn remembered(service_id: u32, client: u32, count: u16, timeout_secs: u32) -> Option<(u32, u16)> {
    let key = Aligned(Affinity4Key {
        service_id,
        client: client.to_ne_bytes(),
    });
    still_held(
        service_id,
        SVC_AFFINITY4.get_ptr(&key.0)?,
        count,
        timeout_secs,
    )
}

/// The backend (id, slot) affinity entry `a` of frontend `service_id` remembers, while it was used
/// at most `timeout_secs` ago and the backend still holds a slot of the frontend's `count` (so it
/// still serves it: nothing clears these entries): the slot it had, or, when the slots changed
/// under it, the one `SVC_MEMBERS` names now (checked the same way, so an entry the agent has not
/// updated yet is never believed). Shared with socket LB's memory by network namespace.
#[inline(always)]
pub(crate) fn still_held(
    service_id: u32,
    a: *const Affinity4,
    count: u16,
    timeout_secs: u32,
) -> Option<(u32, u16)> {
    // SAFETY: a valid map value pointer for this program run.
    let (backend_id, slot, last) = unsafe { ((*a).backend_id, (*a).slot, (*a).last_used_ns) };
    if !affinity_holds(last, now_ns(), timeout_secs) {
        return None;
    }
    if holds_slot(service_id, backend_id, slot, count) {
        return Some((backend_id, slot));
    }
    let mk = Aligned(MemberKey {
        service_id,
        backend_id,
    });
    // SAFETY: as for `SVC4`.
    let moved = unsafe { SVC_MEMBERS.get(&mk.0) }?.slot;
    holds_slot(service_id, backend_id, moved, count).then_some((backend_id, moved))
}

/// Whether `backend_id` holds slot `slot` of frontend `service_id`, which has `count` slots.
#[inline(always)]
fn holds_slot(service_id: u32, backend_id: u32, slot: u16, count: u16) -> bool {
    if slot >= count {
        return false;
    }
    let sk = Aligned(SlotKey {
        service_id,
        slot,
        pad: 0,
    });
    // SAFETY: as for `SVC4`.
    unsafe { SVC_SLOTS.get(&sk.0) }.is_some_and(|v| v.backend_id == backend_id)
}

/// A new flow of a frontend with `ClientIP` affinity: its client's entry names its backend, used
/// now (kube-proxy's `recent --set` on every new connection through the endpoint).
#[inline(always)]
fn remember(t: &Tuple<u32>, tr: &Translation) -> Result<(), i32> {
    // Nothing to remember in the `debug-log` test build (see `remembered`'s absence there).
    if cfg!(feature = "debug-log") || tr.new & NEW_AFFINITY == 0 {
        return Ok(());
    }
    let key = Aligned(Affinity4Key {
        service_id: tr.service_id,
        client: t.src.to_ne_bytes(),
    });
    let value = Affinity4 {
        backend_id: tr.backend_id,
        slot: tr.slot as u16,
        _pad: 0,
        last_used_ns: now_ns(),
    };
    SVC_AFFINITY4.insert(&key.0, &value, 0)
}

/// Whether a pod's packet (tuple `t`) is to a NodePort on an address of this node: a port in
/// `POD_NODEPORT_RANGE` (a comparison for every other packet) to an address with the `host`
/// identity (one lookup).
#[inline(always)]
fn own_node_port(t: &Tuple<u32>) -> bool {
    if !pod_nodeport(t.dport) {
        return false;
    }
    let addr = Aligned(t.dst.to_ne_bytes());
    // SAFETY: read-only to programs; the agent replaces entries whole.
    unsafe { IDENT4.get(&addr.0) }.is_some_and(|i| i.identity == HOST)
}

/// A pod's new flow to a NodePort on this node's address `vip`: the reply entry holds that
/// address and the NodePort, which the replies' source becomes (the NodePort's reverse NAT entry
/// names no address).
#[inline(always)]
fn record_node_port(t: &Tuple<u32>, vip: u32, vport: u16, tr: &Translation) -> Result<(), i32> {
    if tr.new == 0 {
        return Ok(());
    }
    let entry = SvcCt4Entry {
        addr: vip.to_ne_bytes(),
        port: vport,
        ..client_entry(t, tr)
    };
    SVC_CT4.insert(&key(&t.reversed(), DIR_REPLY).0, &entry, 0)
}

/// The frontend (address as loaded, port) a packet of reply tuple `reply` (backend → client) of
/// a flow of `service_id` comes from: the service's reverse NAT entry, or for a NodePort (whose
/// entry names no address) the node address and NodePort the flow's reply entry holds (a pod's
/// flow to its own node's address). `None` when the service or the entry is gone.
#[inline(always)]
pub(crate) fn reply_frontend(reply: &Tuple<u32>, service_id: u32) -> Option<(u32, u16)> {
    // SAFETY: read-only to programs; the agent replaces entries whole.
    let rev = unsafe { SVC_REVNAT4.get(&service_id) }?;
    if rev.addr != NODEPORT_ANY {
        return Some((u32::from_ne_bytes(rev.addr), rev.port));
    }
    let e = SVC_CT4.get_ptr(&key(reply, DIR_REPLY).0)?;
    // SAFETY: a valid map value pointer for this program run.
    let (addr, port) = unsafe { ((*e).addr, (*e).port) };
    Some((u32::from_ne_bytes(addr), port))
}

/// Writes a new translated flow's two `svc_ct4` entries (nothing for a flow that has them): `t`
/// is the translated tuple (client → backend), `vip:vport` the frontend the client sent to. The
/// reply entry is what NodePort flows (and the layout-2 build's every flow) find their frontend
/// by; a pod's flow under conntrack layout 3 keeps it in its conntrack entry instead
/// ([`record_flow`]).
#[inline(always)]
pub(crate) fn record(t: &Tuple<u32>, vip: u32, vport: u16, tr: &Translation) -> Result<(), i32> {
    if tr.new == 0 {
        return Ok(());
    }
    let reply = client_entry(t, tr);
    SVC_CT4.insert(&key(&t.reversed(), DIR_REPLY).0, &reply, 0)?;
    record_original(t, vip, vport, &reply)?;
    remember(t, tr)
}

/// A new flow's `svc_ct4` entry holding its client end (the reply entry as is; the original entry
/// with the backend in its place).
#[inline(always)]
fn client_entry(t: &Tuple<u32>, tr: &Translation) -> SvcCt4Entry {
    SvcCt4Entry {
        addr: t.src.to_ne_bytes(),
        port: t.sport,
        _pad: 0,
        service_id: tr.service_id,
        backend_id: tr.backend_id,
        last_seen_ns: now_ns(),
    }
}

/// The original entry (client → frontend: the backend the flow was given).
#[inline(always)]
fn record_original(t: &Tuple<u32>, vip: u32, vport: u16, e: &SvcCt4Entry) -> Result<(), i32> {
    let original = SvcCt4Entry {
        addr: t.dst.to_ne_bytes(),
        port: t.dport,
        ..*e
    };
    let client = Tuple {
        dst: vip,
        dport: vport,
        ..*t
    };
    SVC_CT4.insert(&key(&client, DIR_ORIGINAL).0, &original, 0)
}

/// A pod's new translated flow: its original entry only; the reply finds the frontend through
/// the flow's conntrack entry, which `decide` created with `p.rev_nat` (conntrack layout 3). One
/// LRU insert per new flow instead of two.
#[cfg(not(feature = "ct-v2"))]
#[inline(always)]
fn record_flow(t: &Tuple<u32>, vip: u32, vport: u16, tr: &Translation) -> Result<(), i32> {
    if tr.new == 0 {
        return Ok(());
    }
    record_original(t, vip, vport, &client_entry(t, tr))?;
    remember(t, tr)
}

/// The layout-2 build (`ct-v2`): both entries, as that release wrote them.
#[cfg(feature = "ct-v2")]
#[inline(always)]
fn record_flow(t: &Tuple<u32>, vip: u32, vport: u16, tr: &Translation) -> Result<(), i32> {
    record(t, vip, vport, tr)
}

/// The service id whose frontend a packet of tuple `t` belongs to, from the flow's conntrack
/// entry (layout 3): `original` asks for a packet in the opener's direction (an ICMP error's
/// quote), else for one against it (a reply). 0 for anything else.
#[cfg(not(feature = "ct-v2"))]
#[inline(always)]
pub(crate) fn rev_nat_of(t: &Tuple<u32>, original: bool) -> u32 {
    let (ct_key, src_is_b) = V4::ct_key(t);
    let Some(e) = V4::ct_get(&ct_key) else {
        return 0;
    };
    // SAFETY: a valid map value pointer for this program run.
    let (flags, rev_nat) = unsafe { ((*e).flags, (*e).rev_nat) };
    let is_original = (flags & FLAG_OPENER_IS_B != 0) == src_is_b;
    if is_original == original { rev_nat } else { 0 }
}

/// The layout-2 build (`ct-v2`): from the flow's reply entry in `svc_ct4`.
#[cfg(feature = "ct-v2")]
#[inline(always)]
pub(crate) fn rev_nat_of(t: &Tuple<u32>, original: bool) -> u32 {
    let reply = if original { t.reversed() } else { *t };
    SVC_CT4
        .get_ptr(&key(&reply, DIR_REPLY).0)
        // SAFETY: a valid map value pointer for this program run.
        .map_or(0, |e| unsafe { (*e).service_id })
}

/// A packet entering a pod: a reply of a flow it sent to a frontend gets the frontend as its
/// source. `rev_nat` is what `decide` found in the flow's conntrack entry for a reply (layout 3:
/// no second lookup). Anything else keeps `reason` untouched.
#[inline(always)]
fn reply(ctx: &TcContext, pkt: &Packet, t: &Tuple<u32>, rev_nat: u32, reason: Reason) -> Reason {
    #[cfg(not(feature = "ct-v2"))]
    let service_id = rev_nat;
    #[cfg(feature = "ct-v2")]
    let service_id = {
        let _ = rev_nat;
        rev_nat_of(t, false)
    };
    if service_id == 0 {
        return reason;
    }
    let Some((addr, port)) = reply_frontend(t, service_id) else {
        // The service is gone: nothing to translate back to.
        return reason;
    };
    let Some(f) = masq::parse(pkt, ICMP_ECHO) else {
        return DROP_MALFORMED;
    };
    match masq::rewrite(ctx, &f, true, (t.src, addr), (t.sport, port)) {
        Ok(()) => reason,
        Err(_) => DROP_MALFORMED,
    }
}
