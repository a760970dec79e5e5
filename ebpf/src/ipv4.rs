//! IPv4: header parsing (options, fragments), ICMP classification and the family's maps.

use aya_ebpf::maps::lpm_trie::Key;
use maps_schema::{
    Ct4Key, EndpointInfo,
    identity::WORLD,
    reason::{DROP_FRAGMENT, DROP_INVALID_HEADER, DROP_MALFORMED, NOTE_IPV4_OPTIONS},
};

use crate::{
    flow::Family,
    l4::transport,
    maps::{CT4, Ct, IDENT4, IPCACHE4},
    parse::{
        Class, ETH_HLEN, IPPROTO_ICMP, IPPROTO_TCP, IPPROTO_UDP, Packet, Parsed, Reason, Tuple,
        echo_ports, ports,
    },
};

pub(crate) type Addr = [u8; 4];

/// ICMP types.
const ICMP_ECHO_REPLY: u8 = 0;
const ICMP_DEST_UNREACH: u8 = 3;
const ICMP_ECHO: u8 = 8;
const ICMP_TIME_EXCEEDED: u8 = 11;
const ICMP_PARAMETER_PROBLEM: u8 = 12;

/// The IPv4 base header at `off`: (protocol, source, destination, header length).
#[inline(always)]
fn header(pkt: &Packet, off: usize) -> Result<(u8, Addr, Addr, usize, u16), Reason> {
    let h = pkt.load::<20>(off).ok_or(DROP_MALFORMED)?;
    let ihl = usize::from(h[0] & 0x0f);
    if h[0] >> 4 != 4 || ihl < 5 {
        return Err(DROP_INVALID_HEADER);
    }
    let hlen = ihl * 4;
    pkt.ptr::<u8>(off + hlen - 1).ok_or(DROP_MALFORMED)?;
    let frag = u16::from_be_bytes([h[6], h[7]]);
    let src = [h[12], h[13], h[14], h[15]];
    let dst = [h[16], h[17], h[18], h[19]];
    Ok((h[9], src, dst, hlen, frag))
}

/// Parses an IPv4 packet (after the Ethernet header).
#[inline(always)]
pub(crate) fn parse(pkt: &Packet) -> Result<Parsed<Addr>, Reason> {
    let (proto, src, dst, hlen, frag) = header(pkt, ETH_HLEN)?;
    // More-fragments set or a non-zero offset: weir does not track fragments.
    if frag & 0x3fff != 0 {
        return Err(DROP_FRAGMENT);
    }
    let note = if hlen > 20 {
        Some(NOTE_IPV4_OPTIONS)
    } else {
        None
    };
    let off = ETH_HLEN + hlen;
    let mut parsed = Parsed {
        tuple: Tuple {
            src,
            dst,
            sport: 0,
            dport: 0,
            proto,
        },
        policy_port: 0,
        tcp_flags: 0,
        class: Class::Flow,
        note,
    };
    if proto == IPPROTO_ICMP {
        icmp(pkt, off, &mut parsed)?;
        return Ok(parsed);
    }
    let t = transport(pkt, off, proto)?;
    parsed.tuple.sport = t.sport;
    parsed.tuple.dport = t.dport;
    parsed.policy_port = t.dport;
    parsed.tcp_flags = t.tcp_flags;
    Ok(parsed)
}

/// ICMP: echo is a flow keyed by its identifier, errors are related to the flow they quote.
#[inline(always)]
fn icmp(pkt: &Packet, off: usize, parsed: &mut Parsed<Addr>) -> Result<(), Reason> {
    let h = pkt.load::<8>(off).ok_or(DROP_MALFORMED)?;
    let ty = h[0];
    parsed.policy_port = u16::from(ty);
    match ty {
        ICMP_ECHO | ICMP_ECHO_REPLY => {
            let (sport, dport) = echo_ports(ty == ICMP_ECHO, [h[4], h[5]]);
            parsed.tuple.sport = sport;
            parsed.tuple.dport = dport;
        }
        ICMP_DEST_UNREACH | ICMP_TIME_EXCEEDED | ICMP_PARAMETER_PROBLEM => {
            parsed.class = Class::Related(inner(pkt, off + 8)?);
        }
        _ => parsed.class = Class::Stateless,
    }
    Ok(())
}

/// The tuple of the packet an ICMP error quotes (its IP header and first eight bytes).
#[inline(always)]
fn inner(pkt: &Packet, off: usize) -> Result<Tuple<Addr>, Reason> {
    let (proto, src, dst, hlen, _) = header(pkt, off)?;
    let l4 = off + hlen;
    let (sport, dport) = match proto {
        IPPROTO_TCP | IPPROTO_UDP => ports(pkt, l4).ok_or(DROP_MALFORMED)?,
        IPPROTO_ICMP => {
            let h = pkt.load::<8>(l4).ok_or(DROP_MALFORMED)?;
            echo_ports(h[0] == ICMP_ECHO, [h[4], h[5]])
        }
        _ => (0, 0),
    };
    Ok(Tuple {
        src,
        dst,
        sport,
        dport,
        proto,
    })
}

/// IPv4's maps.
pub(crate) struct V4;

impl Family for V4 {
    type Addr = Addr;
    type Key = Ct4Key;

    #[inline(always)]
    fn owns(ep: &EndpointInfo, addr: &Addr) -> bool {
        ep.owns_v4(*addr)
    }

    #[inline(always)]
    fn ct_key(t: &Tuple<Addr>) -> (Ct4Key, bool) {
        let src_is_b = (u32::from_be_bytes(t.src), t.sport) > (u32::from_be_bytes(t.dst), t.dport);
        let (a, pa, b, pb) = if src_is_b {
            (t.dst, t.dport, t.src, t.sport)
        } else {
            (t.src, t.sport, t.dst, t.dport)
        };
        let key = Ct4Key {
            addr_a: a,
            addr_b: b,
            port_a: pa,
            port_b: pb,
            protocol: t.proto,
            _pad: [0; 3],
        };
        (key, src_is_b)
    }

    #[inline(always)]
    fn ct_get(key: &Ct4Key) -> Option<*mut Ct> {
        CT4.get_ptr_mut(key)
    }

    #[inline(always)]
    fn ct_insert(key: &Ct4Key, entry: &Ct) -> Result<(), i32> {
        CT4.insert(key, entry, 0)
    }

    const CREATED: u32 = maps_schema::conntrack::EVENT_CREATED4;

    #[inline(always)]
    fn identity(addr: &Addr) -> u32 {
        // SAFETY: read-only to programs; the agent replaces entries whole.
        if let Some(info) = unsafe { IDENT4.get(addr) } {
            return info.identity;
        }
        let key = Key::new(32, *addr);
        IPCACHE4.get(&key).map_or(WORLD, |info| info.identity)
    }
}
