//! IPv4: header parsing (options, fragments), ICMP classification and the family's maps.

use aya_ebpf::maps::lpm_trie::Key;
use maps_schema::{
    Ct4Key, EndpointInfo,
    identity::WORLD,
    reason::{DROP_FRAGMENT, DROP_INVALID_HEADER, DROP_MALFORMED, NOTE_IPV4_OPTIONS},
    service::HAIRPIN4,
};

use crate::{
    flow::Family,
    l4::transport,
    maps::{CT4, Ct, IDENT4, IPCACHE4},
    parse::{
        Aligned, Class, ETH_HLEN, IPPROTO_ICMP, Packet, Parsed, Reason, Tuple, echo_ports,
        has_ports, icmp_header, ports, word,
    },
};

/// An address as loaded: its network-order bytes in a native integer (compared as a word).
pub(crate) type Addr = u32;

/// ICMP types.
const ICMP_ECHO_REPLY: u8 = 0;
const ICMP_DEST_UNREACH: u8 = 3;
const ICMP_ECHO: u8 = 8;
const ICMP_TIME_EXCEEDED: u8 = 11;
const ICMP_PARAMETER_PROBLEM: u8 = 12;

/// The IPv4 base header at `off`: (protocol, source, destination, header length, fragment
/// field in host byte order). Fields come from four wide loads of the bounds-checked header.
#[inline(always)]
fn header(pkt: &Packet, off: usize) -> Result<(u8, Addr, Addr, usize, u16), Reason> {
    let h: *const [u8; 20] = pkt.ptr(off).ok_or(DROP_MALFORMED)?;
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
    if version_ihl >> 4 != 4 || ihl < 5 {
        return Err(DROP_INVALID_HEADER);
    }
    let hlen = ihl * 4;
    // Options: the rest of the header must be there too.
    if ihl > 5 {
        pkt.ptr::<u8>(off + hlen - 1).ok_or(DROP_MALFORMED)?;
    }
    Ok((
        proto,
        addrs as u32,
        (addrs >> 32) as u32,
        hlen,
        u16::from_be(frag),
    ))
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
        inner: Tuple::zero(),
        note,
        rev_nat: 0,
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
    let (ty, id) = icmp_header(pkt, off).ok_or(DROP_MALFORMED)?;
    parsed.policy_port = u16::from(ty);
    match ty {
        ICMP_ECHO | ICMP_ECHO_REPLY => {
            let (sport, dport) = echo_ports(ty == ICMP_ECHO, id);
            parsed.tuple.sport = sport;
            parsed.tuple.dport = dport;
        }
        ICMP_DEST_UNREACH | ICMP_TIME_EXCEEDED | ICMP_PARAMETER_PROBLEM => {
            parsed.inner = inner(pkt, off + 8)?;
            parsed.class = Class::Related;
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
        p if has_ports(p) => ports(pkt, l4).ok_or(DROP_MALFORMED)?,
        IPPROTO_ICMP => {
            let (ty, id) = icmp_header(pkt, l4).ok_or(DROP_MALFORMED)?;
            echo_ports(ty == ICMP_ECHO, id)
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

/// A [`Ct4Key`] as the two little-endian words it is made of.
#[repr(C, align(8))]
pub(crate) struct Key4([u64; 2]);
const _: () = assert!(core::mem::size_of::<Key4>() == core::mem::size_of::<Ct4Key>());

impl Key4 {
    #[inline(always)]
    fn as_key(&self) -> &Ct4Key {
        // SAFETY: same size, stricter alignment, and `Ct4Key` (integers and padding bytes, all
        // zero here) is valid for any bit pattern.
        unsafe { &*core::ptr::from_ref(self).cast::<Ct4Key>() }
    }
}

/// IPv4's maps.
pub(crate) struct V4;

impl Family for V4 {
    type Addr = Addr;
    type Key = Key4;

    #[inline(always)]
    fn owns(ep: &EndpointInfo, addr: &Addr) -> bool {
        let own = |i: usize| u32::from_ne_bytes(ep.ipv4[i]);
        *addr != 0 && (own(0) == *addr || own(1) == *addr)
    }

    /// Built as two words in registers (`Ct4Key`'s layout on a little-endian target): no
    /// byte stores, no zeroing call for the padding.
    #[inline(always)]
    fn ct_key(t: &Tuple<Addr>) -> (Key4, bool) {
        let (src, dst) = (t.src, t.dst);
        let rank = |addr: u32, port: u16| (u64::from(u32::from_be(addr)) << 16) | u64::from(port);
        let src_is_b = rank(src, t.sport) > rank(dst, t.dport);
        let (a, pa, b, pb) = if src_is_b {
            (dst, t.dport, src, t.sport)
        } else {
            (src, t.sport, dst, t.dport)
        };
        let key = Key4([
            u64::from(a) | (u64::from(b) << 32),
            u64::from(pa) | (u64::from(pb) << 16) | (u64::from(t.proto) << 32),
        ]);
        (key, src_is_b)
    }

    #[inline(always)]
    fn ct_get(key: &Key4) -> Option<*mut Ct> {
        CT4.get_ptr_mut(key.as_key())
    }

    #[inline(always)]
    fn ct_insert(key: &Key4, entry: &Ct) -> Result<(), i32> {
        CT4.insert(key.as_key(), entry, 0)
    }

    const CREATED: u32 = maps_schema::conntrack::EVENT_CREATED4;

    #[inline(always)]
    fn identity(addr: &Addr) -> u32 {
        let exact = Aligned(addr.to_ne_bytes());
        // SAFETY: read-only to programs; the agent replaces entries whole.
        if let Some(info) = unsafe { IDENT4.get(&exact.0) } {
            return info.identity;
        }
        let key = Aligned(Key::new(32, exact.0));
        IPCACHE4.get(&key.0).map_or(WORLD, |info| info.identity)
    }

    #[inline(always)]
    fn peer_identity(ep: &EndpointInfo, addr: &Addr) -> u32 {
        if *addr == u32::from_ne_bytes(HAIRPIN4) {
            return ep.identity;
        }
        Self::identity(addr)
    }
}
