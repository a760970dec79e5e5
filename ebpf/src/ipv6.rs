//! IPv6: header and extension-header walk, ICMPv6 classification and the family's maps.

use aya_ebpf::maps::lpm_trie::Key;
use maps_schema::{
    Ct6Key, EndpointInfo,
    identity::WORLD,
    reason::{
        DROP_EXT_HEADER_LIMIT, DROP_FRAGMENT, DROP_INVALID_HEADER, DROP_IPV6_ROUTING_HEADER,
        DROP_MALFORMED, MAX_IPV6_EXT_HEADERS, NOTE_IPV6_EXT_HEADERS,
    },
};

use crate::{
    flow::Family,
    l4::transport,
    maps::{CT6, Ct, IDENT6, IPCACHE6},
    parse::{
        Class, ETH_HLEN, IPPROTO_ICMPV6, IPPROTO_TCP, IPPROTO_UDP, Packet, Parsed, Reason, Tuple,
        echo_ports, ports,
    },
};

pub(crate) type Addr = [u8; 16];

const IPV6_HLEN: usize = 40;
/// Extension headers.
const NEXTHDR_HOP: u8 = 0;
const NEXTHDR_ROUTING: u8 = 43;
const NEXTHDR_FRAGMENT: u8 = 44;
const NEXTHDR_AUTH: u8 = 51;
const NEXTHDR_DEST: u8 = 60;

/// ICMPv6 types.
const ICMPV6_DEST_UNREACH: u8 = 1;
const ICMPV6_PARAM_PROB: u8 = 4;
const ICMPV6_ECHO_REQUEST: u8 = 128;
const ICMPV6_ECHO_REPLY: u8 = 129;
const ICMPV6_MLD_QUERY: u8 = 130;
const ICMPV6_MLD_DONE: u8 = 132;
const ICMPV6_ROUTER_SOLICIT: u8 = 133;
const ICMPV6_REDIRECT: u8 = 137;
const ICMPV6_MLD2_REPORT: u8 = 143;

/// The IPv6 base header at `off`: (next header, source, destination).
#[inline(always)]
fn header(pkt: &Packet, off: usize) -> Result<(u8, Addr, Addr), Reason> {
    let h: *const [u8; IPV6_HLEN] = pkt.ptr(off).ok_or(DROP_MALFORMED)?;
    // SAFETY: bounds checked by `ptr`.
    let h = unsafe { &*h };
    if h[0] >> 4 != 6 {
        return Err(DROP_INVALID_HEADER);
    }
    let mut src = [0u8; 16];
    let mut dst = [0u8; 16];
    src.copy_from_slice(&h[8..24]);
    dst.copy_from_slice(&h[24..40]);
    Ok((h[6], src, dst))
}

/// Walks up to `MAX_IPV6_EXT_HEADERS` extension headers: (upper-layer protocol, its offset, any seen).
#[inline(always)]
fn walk(pkt: &Packet, mut nexthdr: u8, mut off: usize) -> Result<(u8, usize, bool), Reason> {
    let mut seen = false;
    for _ in 0..MAX_IPV6_EXT_HEADERS {
        let len = match nexthdr {
            NEXTHDR_HOP | NEXTHDR_DEST => {
                let h = pkt.load::<2>(off).ok_or(DROP_MALFORMED)?;
                nexthdr = h[0];
                (usize::from(h[1]) + 1) * 8
            }
            NEXTHDR_ROUTING => {
                let h = pkt.load::<4>(off).ok_or(DROP_MALFORMED)?;
                // Segments left: the packet is not at its final destination yet.
                if h[3] != 0 {
                    return Err(DROP_IPV6_ROUTING_HEADER);
                }
                nexthdr = h[0];
                (usize::from(h[1]) + 1) * 8
            }
            NEXTHDR_AUTH => {
                let h = pkt.load::<2>(off).ok_or(DROP_MALFORMED)?;
                nexthdr = h[0];
                (usize::from(h[1]) + 2) * 4
            }
            NEXTHDR_FRAGMENT => return Err(DROP_FRAGMENT),
            _ => return Ok((nexthdr, off, seen)),
        };
        seen = true;
        off += len;
    }
    match nexthdr {
        NEXTHDR_HOP | NEXTHDR_DEST | NEXTHDR_ROUTING | NEXTHDR_AUTH => Err(DROP_EXT_HEADER_LIMIT),
        NEXTHDR_FRAGMENT => Err(DROP_FRAGMENT),
        _ => Ok((nexthdr, off, seen)),
    }
}

/// Parses an IPv6 packet (after the Ethernet header).
#[inline(always)]
pub(crate) fn parse(pkt: &Packet) -> Result<Parsed<Addr>, Reason> {
    let (first, src, dst) = header(pkt, ETH_HLEN)?;
    let (proto, off, seen) = walk(pkt, first, ETH_HLEN + IPV6_HLEN)?;
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
        note: if seen {
            Some(NOTE_IPV6_EXT_HEADERS)
        } else {
            None
        },
    };
    if proto == IPPROTO_ICMPV6 {
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

/// ICMPv6: neighbour/router discovery and MLD pass, echo is a flow, errors are related.
#[inline(always)]
fn icmp(pkt: &Packet, off: usize, parsed: &mut Parsed<Addr>) -> Result<(), Reason> {
    let h = pkt.load::<8>(off).ok_or(DROP_MALFORMED)?;
    let ty = h[0];
    parsed.policy_port = u16::from(ty);
    match ty {
        ICMPV6_ECHO_REQUEST | ICMPV6_ECHO_REPLY => {
            let (sport, dport) = echo_ports(ty == ICMPV6_ECHO_REQUEST, [h[4], h[5]]);
            parsed.tuple.sport = sport;
            parsed.tuple.dport = dport;
        }
        ICMPV6_DEST_UNREACH..=ICMPV6_PARAM_PROB => {
            parsed.class = Class::Related(inner(pkt, off + 8)?);
        }
        ICMPV6_MLD_QUERY..=ICMPV6_MLD_DONE
        | ICMPV6_ROUTER_SOLICIT..=ICMPV6_REDIRECT
        | ICMPV6_MLD2_REPORT => parsed.class = Class::Neighbour,
        _ => parsed.class = Class::Stateless,
    }
    Ok(())
}

/// The tuple of the packet an ICMPv6 error quotes (no extension-header walk: a quoted packet with
/// extension headers yields protocol-only tuple that matches no flow, so policy decides).
#[inline(always)]
fn inner(pkt: &Packet, off: usize) -> Result<Tuple<Addr>, Reason> {
    let (proto, src, dst) = header(pkt, off)?;
    let l4 = off + IPV6_HLEN;
    let (sport, dport) = match proto {
        IPPROTO_TCP | IPPROTO_UDP => ports(pkt, l4).ok_or(DROP_MALFORMED)?,
        IPPROTO_ICMPV6 => {
            let h = pkt.load::<8>(l4).ok_or(DROP_MALFORMED)?;
            echo_ports(h[0] == ICMPV6_ECHO_REQUEST, [h[4], h[5]])
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

/// An order on (address, port) for key normalisation (any total order will do).
#[inline(always)]
fn rank(addr: &Addr, port: u16) -> (u64, u64, u16) {
    let mut hi = [0u8; 8];
    let mut lo = [0u8; 8];
    hi.copy_from_slice(&addr[..8]);
    lo.copy_from_slice(&addr[8..]);
    (u64::from_ne_bytes(hi), u64::from_ne_bytes(lo), port)
}

/// IPv6's maps.
pub(crate) struct V6;

impl Family for V6 {
    type Addr = Addr;
    type Key = Ct6Key;

    #[inline(always)]
    fn owns(ep: &EndpointInfo, addr: &Addr) -> bool {
        ep.owns_v6(addr)
    }

    #[inline(always)]
    fn ct_key(t: &Tuple<Addr>) -> (Ct6Key, bool) {
        let src_is_b = rank(&t.src, t.sport) > rank(&t.dst, t.dport);
        let (a, pa, b, pb) = if src_is_b {
            (t.dst, t.dport, t.src, t.sport)
        } else {
            (t.src, t.sport, t.dst, t.dport)
        };
        let key = Ct6Key {
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
    fn ct_get(key: &Ct6Key) -> Option<*mut Ct> {
        CT6.get_ptr_mut(key)
    }

    #[inline(always)]
    fn ct_insert(key: &Ct6Key, entry: &Ct) -> Result<(), i32> {
        CT6.insert(key, entry, 0)
    }

    const CREATED: u32 = maps_schema::conntrack::EVENT_CREATED6;

    #[inline(always)]
    fn identity(addr: &Addr) -> u32 {
        // SAFETY: read-only to programs; the agent replaces entries whole.
        if let Some(info) = unsafe { IDENT6.get(addr) } {
            return info.identity;
        }
        let key = Key::new(128, *addr);
        IPCACHE6.get(&key).map_or(WORLD, |info| info.identity)
    }
}
