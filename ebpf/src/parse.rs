//! Bounds-checked packet access shared by every program.

/// Ethernet header length.
pub(crate) const ETH_HLEN: usize = 14;
/// Ethertypes (host byte order).
pub(crate) const ETH_P_IP: u16 = 0x0800;
pub(crate) const ETH_P_IPV6: u16 = 0x86DD;
pub(crate) const ETH_P_ARP: u16 = 0x0806;

/// IP protocol numbers.
pub(crate) const IPPROTO_ICMP: u8 = 1;
pub(crate) const IPPROTO_TCP: u8 = 6;
pub(crate) const IPPROTO_UDP: u8 = 17;
pub(crate) const IPPROTO_SCTP: u8 = 132;
pub(crate) const IPPROTO_ICMPV6: u8 = 58;

/// A verdict reason code (`maps_schema::reason`).
pub(crate) type Reason = u32;

/// The linear packet data of a tc or XDP context.
#[derive(Clone, Copy)]
pub(crate) struct Packet {
    pub(crate) data: usize,
    pub(crate) end: usize,
}

impl Packet {
    /// A pointer to `T` at `offset`, or `None` when the packet is too short.
    #[inline(always)]
    pub(crate) fn ptr<T>(&self, offset: usize) -> Option<*const T> {
        let start = self.data.checked_add(offset)?;
        if start + core::mem::size_of::<T>() > self.end {
            return None;
        }
        Some(start as *const T)
    }

    /// A copy of the bytes at `offset`, or `None` when the packet is too short.
    #[inline(always)]
    pub(crate) fn load<const N: usize>(&self, offset: usize) -> Option<[u8; N]> {
        let p: *const [u8; N] = self.ptr(offset)?;
        // SAFETY: bounds checked by `ptr`; `[u8; N]` has alignment 1.
        Some(unsafe { *p })
    }

    /// The ethertype (host byte order), or `None` when shorter than an Ethernet header.
    #[inline(always)]
    pub(crate) fn ethertype(&self) -> Option<u16> {
        let p: *const [u8; ETH_HLEN] = self.ptr(0)?;
        // SAFETY: bounds checked by `ptr`.
        Some(u16::from_be(unsafe { word(p, 12) }))
    }
}

/// A value kept 8-aligned on the stack (map keys built from wide words): the verifier refuses a
/// misaligned stack access, and the build allows the compiler to emit them for byte arrays.
#[repr(C, align(8))]
pub(crate) struct Aligned<T>(pub(crate) T);

/// The plain integer `T` at byte `offset` of the bounds-checked region `base` points at, as the
/// packet holds it (network byte order): one wide load. The eBPF build allows misaligned access
/// (`allows-misaligned-mem-access`; the verifier does on x86-64 and arm64), so a `u32` or `u64`
/// is one load instruction at any offset, not four or eight byte loads.
///
/// # Safety
/// `base` points at a region of at least `offset + size_of::<T>()` readable bytes (a pointer
/// from [`Packet::ptr`] for a type that large), and `T` is valid for any bit pattern.
#[inline(always)]
pub(crate) unsafe fn word<R, T: Copy>(base: *const R, offset: usize) -> T {
    // SAFETY: as the caller promises; `read_unaligned` has no alignment requirement.
    unsafe { base.cast::<u8>().add(offset).cast::<T>().read_unaligned() }
}

/// Address-family-independent view of a flow's tuple (ports in host byte order). Laid out and
/// aligned so that the wide stores the compiler may merge its fields into, when it keeps a tuple
/// on the stack, are aligned (the verifier refuses misaligned stack access).
#[derive(Clone, Copy)]
#[repr(C, align(8))]
pub(crate) struct Tuple<A: Copy> {
    pub(crate) src: A,
    pub(crate) dst: A,
    pub(crate) sport: u16,
    pub(crate) dport: u16,
    pub(crate) proto: u8,
}

impl<A: Copy + Default> Tuple<A> {
    /// The all-zero tuple.
    #[inline(always)]
    pub(crate) fn zero() -> Self {
        Self {
            src: A::default(),
            dst: A::default(),
            sport: 0,
            dport: 0,
            proto: 0,
        }
    }
}

impl<A: Copy> Tuple<A> {
    /// The tuple of a packet going the other way.
    #[inline(always)]
    pub(crate) fn reversed(&self) -> Self {
        Self {
            src: self.dst,
            dst: self.src,
            sport: self.dport,
            dport: self.sport,
            proto: self.proto,
        }
    }
}

/// How the programs treat a parsed packet.
#[derive(Clone, Copy)]
pub(crate) enum Class {
    /// A flow packet: conntrack and policy.
    Flow,
    /// An ICMP error about the flow whose packet is [`Parsed::inner`].
    Related,
    /// ARP-like control traffic (IPv6 neighbour discovery, router discovery, MLD): passes.
    Neighbour,
    /// Policy only, no conntrack (ICMP messages that are neither echo nor errors).
    Stateless,
}

/// A parsed IP packet.
#[derive(Clone, Copy)]
pub(crate) struct Parsed<A: Copy> {
    pub(crate) tuple: Tuple<A>,
    /// The port policy matches on: the destination port, or the ICMP type.
    pub(crate) policy_port: u16,
    /// TCP flags (zero for other protocols).
    pub(crate) tcp_flags: u8,
    pub(crate) class: Class,
    /// The tuple of the packet an ICMP error quotes ([`Class::Related`]; all zero otherwise). A
    /// plain field rather than the variant's payload, so copies of a parsed packet never carry
    /// undefined bytes (the verifier refuses a stack copy that splits a spilled pointer).
    pub(crate) inner: Tuple<A>,
    /// A note counter to bump beside the verdict (IPv4 options, IPv6 extension headers).
    pub(crate) note: Option<Reason>,
    /// The service id of the frontend this packet was sent to before its translation, or 0: a
    /// conntrack entry the packet creates records it, for the replies (`service`).
    pub(crate) rev_nat: u32,
}

/// TCP flag bits.
pub(crate) const TCP_FIN: u8 = 0x01;
pub(crate) const TCP_SYN: u8 = 0x02;
pub(crate) const TCP_RST: u8 = 0x04;
pub(crate) const TCP_ACK: u8 = 0x10;

/// True for a TCP flag combination no real stack sends.
#[inline(always)]
pub(crate) fn tcp_flags_invalid(flags: u8) -> bool {
    let syn = flags & TCP_SYN != 0;
    (syn && flags & (TCP_FIN | TCP_RST) != 0)
        || flags & (TCP_SYN | TCP_ACK | TCP_RST | TCP_FIN) == 0
        || (flags & TCP_FIN != 0 && flags & TCP_ACK == 0)
}

/// True for the protocols whose header starts with (source port, destination port) and whose
/// flows conntrack keys by them: TCP, UDP and SCTP.
#[inline(always)]
pub(crate) fn has_ports(proto: u8) -> bool {
    proto == IPPROTO_TCP || proto == IPPROTO_UDP || proto == IPPROTO_SCTP
}

/// Ports of a TCP, UDP or SCTP header at `off` (the first four bytes), or `None` when truncated.
#[inline(always)]
pub(crate) fn ports(pkt: &Packet, off: usize) -> Option<(u16, u16)> {
    let p: *const [u8; 4] = pkt.ptr(off)?;
    // SAFETY: bounds checked by `ptr`.
    Some(split_ports(unsafe { word(p, 0) }))
}

/// The (source, destination) ports, host byte order, of a TCP, UDP or SCTP header's first word as
/// loaded (little-endian load of the network-order bytes).
#[inline(always)]
pub(crate) fn split_ports(w: u32) -> (u16, u16) {
    (u16::from_be(w as u16), u16::from_be((w >> 16) as u16))
}

/// Conntrack "ports" of an ICMP echo: a request is `(id, 0)`, a reply `(0, id)`, so a reply
/// matches its request's flow reversed, and a request the other way is a flow of its own.
#[inline(always)]
pub(crate) fn echo_ports(request: bool, id: u16) -> (u16, u16) {
    if request { (id, 0) } else { (0, id) }
}

/// The type and the echo identifier (host byte order) of the ICMP or ICMPv6 header at `off`.
#[inline(always)]
pub(crate) fn icmp_header(pkt: &Packet, off: usize) -> Option<(u8, u16)> {
    let h: *const [u8; 8] = pkt.ptr(off)?;
    // SAFETY: bounds checked by `ptr` (8 bytes).
    let (ty, id) = unsafe { (word::<_, u8>(h, 0), word::<_, u16>(h, 4)) };
    Some((ty, u16::from_be(id)))
}
