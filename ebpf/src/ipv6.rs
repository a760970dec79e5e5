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
        Aligned, Class, ETH_HLEN, IPPROTO_ICMPV6, Packet, Parsed, Reason, Tuple, echo_ports,
        has_ports, icmp_header, ports, word,
    },
};

/// An address as loaded: its network-order bytes in two native words (compared as words).
pub(crate) type Addr = [u64; 2];

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

/// The IPv6 base header at `off`: (next header, source, destination), from wide loads of the
/// bounds-checked header.
#[inline(always)]
fn header(pkt: &Packet, off: usize) -> Result<(u8, Addr, Addr), Reason> {
    let h: *const [u8; IPV6_HLEN] = pkt.ptr(off).ok_or(DROP_MALFORMED)?;
    // SAFETY: bounds checked by `ptr` (40 bytes).
    let (version, nexthdr, src, dst) = unsafe {
        (
            word::<_, u8>(h, 0),
            word::<_, u8>(h, 6),
            word::<_, Addr>(h, 8),
            word::<_, Addr>(h, 24),
        )
    };
    if version >> 4 != 6 {
        return Err(DROP_INVALID_HEADER);
    }
    Ok((nexthdr, src, dst))
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
        inner: Tuple::zero(),
        note: if seen {
            Some(NOTE_IPV6_EXT_HEADERS)
        } else {
            None
        },
        rev_nat: 0,
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
    let (ty, id) = icmp_header(pkt, off).ok_or(DROP_MALFORMED)?;
    parsed.policy_port = u16::from(ty);
    match ty {
        ICMPV6_ECHO_REQUEST | ICMPV6_ECHO_REPLY => {
            let (sport, dport) = echo_ports(ty == ICMPV6_ECHO_REQUEST, id);
            parsed.tuple.sport = sport;
            parsed.tuple.dport = dport;
        }
        ICMPV6_DEST_UNREACH..=ICMPV6_PARAM_PROB => {
            parsed.inner = inner(pkt, off + 8)?;
            parsed.class = Class::Related;
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
        p if has_ports(p) => ports(pkt, l4).ok_or(DROP_MALFORMED)?,
        IPPROTO_ICMPV6 => {
            let (ty, id) = icmp_header(pkt, l4).ok_or(DROP_MALFORMED)?;
            echo_ports(ty == ICMPV6_ECHO_REQUEST, id)
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

/// A full-length IPv6 trie key on the stack. The key is packed (a `u32` prefix length, then the
/// address): placed 4 bytes into an 8-aligned slot, its address bytes are 8-aligned, so wide
/// stores into them are aligned (the verifier refuses misaligned stack access).
#[repr(C, align(8))]
pub(crate) struct TrieKey {
    _skip: u32,
    pub(crate) key: Key<[u8; 16]>,
}

impl TrieKey {
    #[inline(always)]
    pub(crate) fn new(addr: [u8; 16]) -> Self {
        Self {
            _skip: 0,
            key: Key::new(128, addr),
        }
    }
}

/// The address's bytes (network order), as map keys hold them.
#[inline(always)]
fn bytes(addr: &Addr) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&addr[0].to_ne_bytes());
    out[8..].copy_from_slice(&addr[1].to_ne_bytes());
    out
}

/// A [`Ct6Key`] as the five little-endian words it is made of.
#[repr(C, align(8))]
pub(crate) struct Key6([u64; 5]);
const _: () = assert!(core::mem::size_of::<Key6>() == core::mem::size_of::<Ct6Key>());

impl Key6 {
    #[inline(always)]
    fn as_key(&self) -> &Ct6Key {
        // SAFETY: same size, stricter alignment, and `Ct6Key` (integers and padding bytes, all
        // zero here) is valid for any bit pattern.
        unsafe { &*core::ptr::from_ref(self).cast::<Ct6Key>() }
    }
}

/// IPv6's maps.
pub(crate) struct V6;

impl Family for V6 {
    type Addr = Addr;
    type Key = Key6;

    #[inline(always)]
    fn owns(ep: &EndpointInfo, addr: &Addr) -> bool {
        let own = |i: usize| {
            let p = core::ptr::from_ref(&ep.ipv6[i]);
            // SAFETY: 16 readable bytes of the entry; any bit pattern is a valid `u64`.
            let w: Addr = unsafe { [word(p, 0), word(p, 8)] };
            w == *addr
        };
        *addr != [0; 2] && (own(0) || own(1))
    }

    /// Normalised by an order on (address words, port) — any total order will do, but it is the
    /// one every release used, so entries written before an upgrade keep matching. Built as
    /// words, with no zeroing call for the padding.
    #[inline(always)]
    fn ct_key(t: &Tuple<Addr>) -> (Key6, bool) {
        let (src, dst) = (t.src, t.dst);
        let src_is_b = (src[0], src[1], t.sport) > (dst[0], dst[1], t.dport);
        let (a, pa, b, pb) = if src_is_b {
            (dst, t.dport, src, t.sport)
        } else {
            (src, t.sport, dst, t.dport)
        };
        let key = Key6([
            a[0],
            a[1],
            b[0],
            b[1],
            u64::from(pa) | (u64::from(pb) << 16) | (u64::from(t.proto) << 32),
        ]);
        (key, src_is_b)
    }

    #[inline(always)]
    fn ct_get(key: &Key6) -> Option<*mut Ct> {
        CT6.get_ptr_mut(key.as_key())
    }

    #[inline(always)]
    fn ct_insert(key: &Key6, entry: &Ct) -> Result<(), i32> {
        CT6.insert(key.as_key(), entry, 0)
    }

    const CREATED: u32 = maps_schema::conntrack::EVENT_CREATED6;

    #[inline(always)]
    fn identity(addr: &Addr) -> u32 {
        let exact = Aligned(bytes(addr));
        // SAFETY: read-only to programs; the agent replaces entries whole.
        if let Some(info) = unsafe { IDENT6.get(&exact.0) } {
            return info.identity;
        }
        let key = TrieKey::new(exact.0);
        IPCACHE6.get(&key.key).map_or(WORLD, |info| info.identity)
    }
}
