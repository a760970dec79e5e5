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
        self.load::<2>(12).map(u16::from_be_bytes)
    }
}

/// Address-family-independent view of a flow's tuple (ports in host byte order).
#[derive(Clone, Copy)]
pub(crate) struct Tuple<A: Copy> {
    pub(crate) src: A,
    pub(crate) dst: A,
    pub(crate) sport: u16,
    pub(crate) dport: u16,
    pub(crate) proto: u8,
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
pub(crate) enum Class<A: Copy> {
    /// A flow packet: conntrack and policy.
    Flow,
    /// An ICMP error about the flow whose packet was `inner`.
    Related(Tuple<A>),
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
    pub(crate) class: Class<A>,
    /// A note counter to bump beside the verdict (IPv4 options, IPv6 extension headers).
    pub(crate) note: Option<Reason>,
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

/// Ports of a TCP or UDP header at `off` (the first four bytes), or `None` when truncated.
#[inline(always)]
pub(crate) fn ports(pkt: &Packet, off: usize) -> Option<(u16, u16)> {
    let p = pkt.load::<4>(off)?;
    Some((
        u16::from_be_bytes([p[0], p[1]]),
        u16::from_be_bytes([p[2], p[3]]),
    ))
}

/// Conntrack "ports" of an ICMP echo: a request is `(id, 0)`, a reply `(0, id)`, so a reply
/// matches its request's flow reversed, and a request the other way is a flow of its own.
#[inline(always)]
pub(crate) fn echo_ports(request: bool, id: [u8; 2]) -> (u16, u16) {
    let id = u16::from_be_bytes(id);
    if request { (id, 0) } else { (0, id) }
}
