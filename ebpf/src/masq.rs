//! `masq_egress` / `masq_ingress`: the host-interface programs. BPF masquerade on the host
//! interfaces the operator names (`maps_schema::nat` has the model), and NodePorts on those named
//! for them (`nodeport`). Only IPv4 TCP, UDP and ICMP echo are translated; anything else, and any
//! packet of an interface without a `masq_if` entry, passes untouched: these programs never drop
//! what they do not own.

use aya_ebpf::{
    EbpfContext as _,
    bindings::{__sk_buff, BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR, BPF_NOEXIST},
    maps::lpm_trie::Key,
    programs::TcContext,
};
use maps_schema::{
    MasqInterface, Nat4Entry, Nat4Key, checksum,
    nat::{
        DIR_EGRESS, DIR_INGRESS, EVENT_COLLISION, EVENT_CREATED, EVENT_EXHAUSTED,
        EVENT_INSERT_FAILED, FLAG_TCP_CLOSING, IF_NO_MASQUERADE, IF_NODEPORT, PORT_RETRIES,
        port_candidate,
    },
    reason::{
        DIR_MASQUERADE, DROP_MALFORMED, DROP_NAT_INSERT_FAILED, DROP_NAT_PORT_EXHAUSTED,
        NOTE_NAT_PORT_COLLISION, PASS, PASS_MASQUERADED, PASS_REVERSE_NAT,
    },
};

use crate::{
    counters::{Seen, Verdict, account, count},
    flow::now_ns,
    maps::{MASQ_CIDR4, MASQ_IF, NAT_EVENTS, NAT4},
    nodeport,
    parse::{
        Aligned, ETH_HLEN, ETH_P_IP, IPPROTO_ICMP, IPPROTO_TCP, IPPROTO_UDP, Packet, Reason,
        TCP_FIN, TCP_RST, echo_ports, icmp_header, split_ports, word,
    },
};

/// ICMP echo types.
const ICMP_ECHO_REPLY: u8 = 0;
const ICMP_ECHO: u8 = 8;
/// `EEXIST`: a `BPF_NOEXIST` insert found the key taken.
const EEXIST: i32 = 17;
/// Offsets of the IPv4 header's checksum, source and destination.
const IP_CHECK: usize = ETH_HLEN + 10;
const IP_SRC: usize = ETH_HLEN + 12;
const IP_DST: usize = ETH_HLEN + 16;

/// The tuple of a packet these programs may translate, and where its fields are.
#[derive(Clone, Copy)]
pub(crate) struct Flow {
    /// Addresses as loaded (network-order bytes in a native word).
    pub(crate) src: u32,
    pub(crate) dst: u32,
    /// Ports in host byte order (ICMP echo: `(id, 0)` for a request, `(0, id)` for a reply).
    pub(crate) sport: u16,
    pub(crate) dport: u16,
    pub(crate) proto: u8,
    /// TCP flags (zero for anything else).
    pub(crate) tcp_flags: u8,
    /// Offset of the upper-layer header.
    pub(crate) l4: usize,
    /// A TCP FIN or RST.
    pub(crate) closing: bool,
}

impl Flow {
    /// The offsets of the port (or echo identifier) a translation rewrites, of the upper-layer
    /// checksum, and the checksum helper's flags for an address and a port change.
    #[inline(always)]
    fn port_and_csum(&self, egress: bool) -> (usize, usize, u64, u64) {
        let pseudo = u64::from(BPF_F_PSEUDO_HDR);
        match self.proto {
            IPPROTO_TCP => (
                self.l4 + if egress { 0 } else { 2 },
                self.l4 + 16,
                pseudo,
                0,
            ),
            IPPROTO_UDP => {
                let mangled = u64::from(BPF_F_MARK_MANGLED_0);
                (
                    self.l4 + if egress { 0 } else { 2 },
                    self.l4 + 6,
                    pseudo | mangled,
                    mangled,
                )
            }
            // ICMP: the identifier; the ICMP checksum covers no pseudo header.
            _ => (self.l4 + 4, self.l4 + 2, 0, 0),
        }
    }
}

/// The translatable tuple of an IPv4 packet: TCP, UDP, or an ICMP echo of type `echo_type`
/// (egress translates requests, ingress replies). Fragments and everything else: `None`.
#[inline(always)]
pub(crate) fn parse(pkt: &Packet, echo_type: u8) -> Option<Flow> {
    if pkt.ethertype()? != ETH_P_IP {
        return None;
    }
    let h: *const [u8; 20] = pkt.ptr(ETH_HLEN)?;
    // SAFETY: bounds checked by `ptr` (20 bytes).
    let (version_ihl, frag, proto, addrs) = unsafe {
        (
            word::<_, u8>(h, 0),
            word::<_, u16>(h, 6),
            word::<_, u8>(h, 9),
            word::<_, u64>(h, 12),
        )
    };
    let ihl = usize::from(version_ihl & 0x0f);
    // A fragment (more-fragments or an offset) cannot be translated port by port.
    if version_ihl >> 4 != 4 || ihl < 5 || u16::from_be(frag) & 0x3fff != 0 {
        return None;
    }
    let l4 = ETH_HLEN + ihl * 4;
    let (sport, dport, tcp_flags) = match proto {
        IPPROTO_TCP => {
            let t: *const [u8; 20] = pkt.ptr(l4)?;
            // SAFETY: bounds checked by `ptr` (20 bytes).
            let (ports, flags) = unsafe { (word::<_, u32>(t, 0), word::<_, u8>(t, 13)) };
            let (s, d) = split_ports(ports);
            (s, d, flags)
        }
        IPPROTO_UDP => {
            let u: *const [u8; 8] = pkt.ptr(l4)?;
            // SAFETY: bounds checked by `ptr` (8 bytes).
            let (s, d) = split_ports(unsafe { word(u, 0) });
            (s, d, 0)
        }
        IPPROTO_ICMP => {
            let (ty, id) = icmp_header(pkt, l4)?;
            if ty != echo_type {
                return None;
            }
            let (s, d) = echo_ports(ty == ICMP_ECHO, id);
            (s, d, 0)
        }
        _ => return None,
    };
    Some(Flow {
        src: addrs as u32,
        dst: (addrs >> 32) as u32,
        sport,
        dport,
        proto,
        tcp_flags,
        l4,
        closing: proto == IPPROTO_TCP && tcp_flags & (TCP_FIN | TCP_RST) != 0,
    })
}

/// True when `addr` is in one of the pools' CIDRs.
#[inline(always)]
fn in_pools(addr: u32) -> bool {
    let key = Aligned(Key::new(32, addr.to_ne_bytes()));
    MASQ_CIDR4.get(&key.0).is_some()
}

#[inline(always)]
fn event(slot: u32) {
    if let Some(c) = NAT_EVENTS.get_ptr_mut(slot) {
        // SAFETY: per-CPU slot, only this CPU touches it while the program runs.
        unsafe { *c += 1 };
    }
}

#[inline(always)]
pub(crate) fn nat_key(
    src: u32,
    dst: u32,
    sport: u16,
    dport: u16,
    proto: u8,
    direction: u8,
) -> Aligned<Nat4Key> {
    Aligned(Nat4Key {
        saddr: src.to_ne_bytes(),
        daddr: dst.to_ne_bytes(),
        sport,
        dport,
        protocol: proto,
        direction,
        _pad: [0; 2],
    })
}

/// The interface's `masq_if` entry, the packet, and where it was seen.
#[inline(always)]
fn context(ctx: &TcContext) -> (Option<MasqInterface>, Packet, Seen) {
    let skb = ctx.as_ptr().cast::<__sk_buff>();
    // SAFETY: the context pointer is the kernel's `__sk_buff` for this program run.
    let ifindex = unsafe { (*skb).ifindex };
    let seen = Seen {
        direction: DIR_MASQUERADE,
        ifindex,
        len: ctx.len(),
        trace: false,
    };
    let pkt = Packet {
        data: ctx.data(),
        end: ctx.data_end(),
    };
    // SAFETY: read-only to programs; the agent replaces entries whole.
    let iface = unsafe { MASQ_IF.get(&ifindex) }.copied();
    (iface, pkt, seen)
}

/// Rewrites one address and one port (or echo identifier) with the checksums that cover them:
/// the source's with `egress`, else the destination's (also the service translation's, `service`).
/// The address, the port and the IPv4 header checksum are written directly into the packet (the
/// header checksum is always a full one, updated incrementally here). The upper-layer checksum
/// takes the address's change through the kernel's helper, which knows the skb's checksum state
/// (a pod's `CHECKSUM_PARTIAL` packet holds the pseudo header's sum there, not the segment's);
/// what the helper did to the field tells that state (`maps_schema::checksum::state`), so the
/// port's change is applied here, not by a second helper call (only when the state cannot be
/// told does the helper apply it). A port left as it is costs nothing. Packet pointers are stale
/// afterwards; callers only count and return (or parse again).
#[inline(always)]
pub(crate) fn rewrite(
    ctx: &TcContext,
    f: &Flow,
    egress: bool,
    (old_addr, new_addr): (u32, u32),
    (old_port, new_port): (u16, u16),
) -> Result<(), i64> {
    let (port_off, csum_off, addr_flags, port_flags) = f.port_and_csum(egress);
    let pkt = Packet {
        data: ctx.data(),
        end: ctx.data_end(),
    };
    let ip: *const [u8; 20] = pkt.ptr(ETH_HLEN).ok_or(-1i64)?;
    let port: *const [u8; 2] = pkt.ptr(port_off).ok_or(-1i64)?;
    let ip = ip.cast_mut().cast::<u8>();
    // The address's change, once for the IPv4 header's checksum and the upper layer's state.
    let change = checksum::change4(old_addr, new_addr);
    // SAFETY: both regions are bounds checked by `ptr`; tc programs may write packet data (the
    // verifier makes a cloned skb's header private first), and misaligned access is allowed
    // (`word`).
    unsafe {
        let check = ip.add(IP_CHECK - ETH_HLEN).cast::<u16>();
        check.write_unaligned(checksum::apply(check.read_unaligned(), change));
        let addr = ip.add(if egress { IP_SRC } else { IP_DST } - ETH_HLEN);
        addr.cast::<u32>().write_unaligned(new_addr);
        if old_port != new_port {
            port.cast_mut()
                .cast::<u16>()
                .write_unaligned(new_port.to_be());
        }
    }
    let (old_port, new_port) = (old_port.to_be(), new_port.to_be());
    // The port's change through the kernel's helper (ICMP's identifier, or a state not told).
    let port_by_helper = || {
        ctx.l4_csum_replace(
            csum_off,
            u64::from(old_port),
            u64::from(new_port),
            port_flags | 2,
        )
    };
    if f.proto == IPPROTO_ICMP {
        if old_port != new_port {
            port_by_helper()?;
        }
        return Ok(());
    }
    // SAFETY: `l4_check` bounds checks the field.
    let before = unsafe { l4_check(ctx, csum_off)?.read_unaligned() };
    ctx.l4_csum_replace(
        csum_off,
        u64::from(old_addr),
        u64::from(new_addr),
        addr_flags | 4,
    )?;
    if old_port == new_port || (f.proto == IPPROTO_UDP && before == 0) {
        // A UDP datagram without a checksum keeps none.
        return Ok(());
    }
    // SAFETY: as above (the helper moved the packet's pointers: taken again).
    let after = unsafe { l4_check(ctx, csum_off)?.read_unaligned() };
    match checksum::state(before, after, change) {
        checksum::State::Partial => Ok(()),
        checksum::State::Full => {
            let mut check = checksum::replace2(after, old_port, new_port);
            if f.proto == IPPROTO_UDP && check == 0 {
                // UDP's zero means "no checksum": a computed zero is sent as all ones.
                check = 0xffff;
            }
            // SAFETY: `l4_check` bounds checks the field; written as the addresses above are.
            unsafe { l4_check(ctx, csum_off)?.write_unaligned(check) };
            Ok(())
        }
        checksum::State::Unknown => port_by_helper(),
    }
}

/// The upper-layer checksum field at `off` (a value as loaded), bounds checked against the
/// packet's current pointers.
#[inline(always)]
fn l4_check(ctx: &TcContext, off: usize) -> Result<*mut u16, i64> {
    let pkt = Packet {
        data: ctx.data(),
        end: ctx.data_end(),
    };
    let field: *const [u8; 2] = pkt.ptr(off).ok_or(-1i64)?;
    Ok(field.cast_mut().cast::<u16>())
}

/// The egress port (host byte order) a flow leaves with: its entry's, or a newly claimed one.
#[inline(always)]
pub(crate) fn egress_port(f: &Flow, node: u32, seen: &Seen) -> Result<u16, Reason> {
    let now = now_ns();
    let closing = if f.closing { FLAG_TCP_CLOSING } else { 0 };
    let key = nat_key(f.src, f.dst, f.sport, f.dport, f.proto, DIR_EGRESS);
    if let Some(e) = NAT4.get_ptr_mut(&key.0) {
        // SAFETY: a pointer into the map's value; concurrent updates of the stamp are benign.
        unsafe {
            (*e).last_seen_ns = now;
            (*e).flags |= closing;
            return Ok((*e).port);
        }
    }
    let original = Nat4Entry {
        addr: f.src.to_ne_bytes(),
        port: f.sport,
        flags: 0,
        created_ns: now,
        last_seen_ns: now,
    };
    let (src, dst) = (f.src.to_ne_bytes(), f.dst.to_ne_bytes());
    let mut claimed = None;
    let mut attempt = 0;
    while attempt < PORT_RETRIES {
        let port = port_candidate(src, dst, f.sport, f.dport, f.proto, attempt);
        // The reply of the translated flow: remote → node, to the NAT port.
        let reverse = nat_key(f.dst, node, f.dport, port, f.proto, DIR_INGRESS);
        match NAT4.insert(&reverse.0, &original, u64::from(BPF_NOEXIST)) {
            Ok(()) => {
                claimed = Some((port, reverse));
                break;
            }
            Err(e) if e == -EEXIST => event(EVENT_COLLISION),
            Err(_) => {
                event(EVENT_INSERT_FAILED);
                return Err(DROP_NAT_INSERT_FAILED);
            }
        }
        attempt += 1;
    }
    let Some((port, reverse)) = claimed else {
        event(EVENT_EXHAUSTED);
        return Err(DROP_NAT_PORT_EXHAUSTED);
    };
    let translated = Nat4Entry {
        addr: node.to_ne_bytes(),
        port,
        flags: closing,
        created_ns: now,
        last_seen_ns: now,
    };
    if NAT4.insert(&key.0, &translated, 0).is_err() {
        let _ = NAT4.remove(&reverse.0);
        event(EVENT_INSERT_FAILED);
        return Err(DROP_NAT_INSERT_FAILED);
    }
    event(EVENT_CREATED);
    if attempt > 0 {
        count(NOTE_NAT_PORT_COLLISION, DIR_MASQUERADE, seen.len);
    }
    Ok(port)
}

/// Packets leaving through a masquerade interface.
#[inline(always)]
pub(crate) fn try_masq_egress(ctx: &TcContext) -> Verdict {
    let (iface, pkt, seen) = context(ctx);
    let Some(iface) = iface else {
        return Verdict::Pass;
    };
    let node = u32::from_ne_bytes(iface.addr);
    let Some(f) = parse(&pkt, ICMP_ECHO) else {
        count(PASS, DIR_MASQUERADE, seen.len);
        return Verdict::Pass;
    };
    if iface.flags & IF_NODEPORT != 0
        && let Some(verdict) = nodeport::reply_out(ctx, &f, node, &seen)
    {
        return verdict;
    }
    if iface.flags & IF_NO_MASQUERADE != 0 || f.src == node || !in_pools(f.src) || in_pools(f.dst) {
        count(PASS, DIR_MASQUERADE, seen.len);
        return Verdict::Pass;
    }
    let port = match egress_port(&f, node, &seen) {
        Ok(port) => port,
        Err(reason) => return account(reason, &seen, &pkt),
    };
    let reason = match rewrite(ctx, &f, true, (f.src, node), (f.sport, port)) {
        Ok(()) => PASS_MASQUERADED,
        Err(_) => DROP_MALFORMED,
    };
    count(reason, DIR_MASQUERADE, seen.len);
    if reason == PASS_MASQUERADED {
        Verdict::Pass
    } else {
        Verdict::Drop
    }
}

/// Packets arriving through a masquerade interface.
#[inline(always)]
pub(crate) fn try_masq_ingress(ctx: &TcContext) -> Verdict {
    let (iface, pkt, seen) = context(ctx);
    let Some(iface) = iface else {
        return Verdict::Pass;
    };
    let node = u32::from_ne_bytes(iface.addr);
    let Some(f) = parse(&pkt, ICMP_ECHO_REPLY) else {
        count(PASS, DIR_MASQUERADE, seen.len);
        return Verdict::Pass;
    };
    if iface.flags & IF_NODEPORT != 0
        && let Some(verdict) = nodeport::arriving(ctx, &pkt, &f, node, &seen)
    {
        return verdict;
    }
    if f.dst != node {
        count(PASS, DIR_MASQUERADE, seen.len);
        return Verdict::Pass;
    }
    let key = nat_key(f.src, f.dst, f.sport, f.dport, f.proto, DIR_INGRESS);
    let Some(e) = NAT4.get_ptr_mut(&key.0) else {
        // The node's own traffic (or a flow whose entries the sweep removed).
        count(PASS, DIR_MASQUERADE, seen.len);
        return Verdict::Pass;
    };
    // SAFETY: a pointer into the map's value; concurrent updates of the stamp are benign.
    let (addr, port) = unsafe {
        (*e).last_seen_ns = now_ns();
        if f.closing {
            (*e).flags |= FLAG_TCP_CLOSING;
        }
        (u32::from_ne_bytes((*e).addr), (*e).port)
    };
    let reason = match rewrite(ctx, &f, false, (node, addr), (f.dport, port)) {
        Ok(()) => PASS_REVERSE_NAT,
        Err(_) => DROP_MALFORMED,
    };
    count(reason, DIR_MASQUERADE, seen.len);
    if reason == PASS_REVERSE_NAT {
        Verdict::Pass
    } else {
        Verdict::Drop
    }
}
