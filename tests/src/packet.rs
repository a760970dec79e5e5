//! Hand-written packet builders for the datapath tests: Ethernet, ARP, IPv4 (options, fragments),
//! IPv6 (extension headers), TCP, UDP, SCTP, ICMP, ICMPv6. Checksums are left zero: the programs never
//! check them and `BPF_PROG_TEST_RUN` does not either.

/// Ethertypes.
pub const ETH_P_IP: u16 = 0x0800;
/// IPv6.
pub const ETH_P_IPV6: u16 = 0x86DD;
/// ARP.
pub const ETH_P_ARP: u16 = 0x0806;

/// IP protocol numbers.
pub const TCP: u8 = 6;
/// UDP.
pub const UDP: u8 = 17;
/// SCTP.
pub const SCTP: u8 = 132;
/// ICMP.
pub const ICMP: u8 = 1;
/// ICMPv6.
pub const ICMPV6: u8 = 58;

/// TCP flags.
pub const FIN: u8 = 0x01;
/// SYN.
pub const SYN: u8 = 0x02;
/// RST.
pub const RST: u8 = 0x04;
/// PSH.
pub const PSH: u8 = 0x08;
/// ACK.
pub const ACK: u8 = 0x10;
/// URG.
pub const URG: u8 = 0x20;

/// IPv6 extension header types.
pub const EXT_HOP: u8 = 0;
/// Routing header.
pub const EXT_ROUTING: u8 = 43;
/// Fragment header.
pub const EXT_FRAGMENT: u8 = 44;
/// Destination options.
pub const EXT_DEST: u8 = 60;

/// An Ethernet frame carrying `payload`.
#[must_use]
pub fn eth(ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(14 + payload.len());
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x02]);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An IPv4 packet; `options` (a multiple of 4 bytes) and the flags/fragment-offset field are raw.
#[must_use]
pub fn ipv4_with(
    src: [u8; 4],
    dst: [u8; 4],
    proto: u8,
    options: &[u8],
    frag: u16,
    payload: &[u8],
) -> Vec<u8> {
    assert!(options.len().is_multiple_of(4) && options.len() <= 40);
    let hlen = 20 + options.len();
    let total = u16::try_from(hlen + payload.len()).expect("packet fits");
    let mut p = vec![0u8; 20];
    p[0] = 0x40 | u8::try_from(hlen / 4).expect("ihl fits");
    p[2..4].copy_from_slice(&total.to_be_bytes());
    p[6..8].copy_from_slice(&frag.to_be_bytes());
    p[8] = 64;
    p[9] = proto;
    p[12..16].copy_from_slice(&src);
    p[16..20].copy_from_slice(&dst);
    p.extend_from_slice(options);
    p.extend_from_slice(payload);
    p
}

/// A plain IPv4 packet.
#[must_use]
pub fn ipv4(src: [u8; 4], dst: [u8; 4], proto: u8, payload: &[u8]) -> Vec<u8> {
    ipv4_with(src, dst, proto, &[], 0, payload)
}

/// An IPv6 extension header to put before the upper-layer header.
#[derive(Clone, Debug)]
pub struct Ext {
    /// The header's type (`EXT_*`).
    pub kind: u8,
    /// Its bytes after the next-header and length bytes (padded to a multiple of 8 with them).
    pub body: Vec<u8>,
}

impl Ext {
    /// A hop-by-hop or destination-options header with padding only.
    #[must_use]
    pub fn options(kind: u8) -> Self {
        Self {
            kind,
            body: vec![1, 4, 0, 0, 0, 0],
        }
    }

    /// A routing header (type 4, segment routing) with `segments_left`.
    #[must_use]
    pub fn routing(segments_left: u8) -> Self {
        Self {
            kind: EXT_ROUTING,
            body: vec![4, segments_left, 0, 0, 0, 0],
        }
    }

    /// A fragment header (`offset` in 8-byte units, `more` fragments).
    #[must_use]
    pub fn fragment(offset: u16, more: bool) -> Self {
        let field = (offset << 3) | u16::from(more);
        let mut body = field.to_be_bytes().to_vec();
        body.extend_from_slice(&[0, 0, 0, 1]);
        Self {
            kind: EXT_FRAGMENT,
            body,
        }
    }
}

/// An IPv6 packet with extension headers before `payload` (whose protocol is `proto`).
#[must_use]
pub fn ipv6_ext(src: [u8; 16], dst: [u8; 16], exts: &[Ext], proto: u8, payload: &[u8]) -> Vec<u8> {
    let mut chain = Vec::new();
    for (i, ext) in exts.iter().enumerate() {
        let next = exts.get(i + 1).map_or(proto, |e| e.kind);
        let len = 2 + ext.body.len();
        assert!(
            len % 8 == 0,
            "extension header length must be a multiple of 8"
        );
        chain.push(next);
        chain.push(if ext.kind == EXT_FRAGMENT {
            0
        } else {
            u8::try_from(len / 8 - 1).expect("fits")
        });
        chain.extend_from_slice(&ext.body);
    }
    let first = exts.first().map_or(proto, |e| e.kind);
    let plen = u16::try_from(chain.len() + payload.len()).expect("fits");
    let mut p = vec![0u8; 40];
    p[0] = 0x60;
    p[4..6].copy_from_slice(&plen.to_be_bytes());
    p[6] = first;
    p[7] = 64;
    p[8..24].copy_from_slice(&src);
    p[24..40].copy_from_slice(&dst);
    p.extend_from_slice(&chain);
    p.extend_from_slice(payload);
    p
}

/// A plain IPv6 packet.
#[must_use]
pub fn ipv6(src: [u8; 16], dst: [u8; 16], proto: u8, payload: &[u8]) -> Vec<u8> {
    ipv6_ext(src, dst, &[], proto, payload)
}

/// A 20-byte TCP header (plus four payload bytes).
#[must_use]
pub fn tcp(sport: u16, dport: u16, flags: u8) -> Vec<u8> {
    let mut h = vec![0u8; 24];
    h[0..2].copy_from_slice(&sport.to_be_bytes());
    h[2..4].copy_from_slice(&dport.to_be_bytes());
    h[4..8].copy_from_slice(&1u32.to_be_bytes());
    h[12] = 5 << 4;
    h[13] = flags;
    h[14..16].copy_from_slice(&65535u16.to_be_bytes());
    h
}

/// A UDP header with four payload bytes.
#[must_use]
pub fn udp(sport: u16, dport: u16) -> Vec<u8> {
    let mut h = vec![0u8; 12];
    h[0..2].copy_from_slice(&sport.to_be_bytes());
    h[2..4].copy_from_slice(&dport.to_be_bytes());
    h[4..6].copy_from_slice(&12u16.to_be_bytes());
    h
}

/// SCTP chunk types.
pub const SCTP_INIT: u8 = 1;
/// INIT ACK.
pub const SCTP_INIT_ACK: u8 = 2;

/// An SCTP packet: the 12-byte common header (ports, verification tag, checksum left zero) and one
/// 20-byte chunk of type `chunk` shaped as an INIT (tag, window, streams, initial TSN).
#[must_use]
pub fn sctp(sport: u16, dport: u16, chunk: u8) -> Vec<u8> {
    let mut h = vec![0u8; 32];
    h[0..2].copy_from_slice(&sport.to_be_bytes());
    h[2..4].copy_from_slice(&dport.to_be_bytes());
    if chunk != SCTP_INIT {
        h[4..8].copy_from_slice(&0x5eed_0001u32.to_be_bytes());
    }
    h[12] = chunk;
    h[14..16].copy_from_slice(&20u16.to_be_bytes());
    h[16..20].copy_from_slice(&0x5eed_0002u32.to_be_bytes());
    h[20..24].copy_from_slice(&65_536u32.to_be_bytes());
    h[24..26].copy_from_slice(&10u16.to_be_bytes());
    h[26..28].copy_from_slice(&10u16.to_be_bytes());
    h[28..32].copy_from_slice(&1u32.to_be_bytes());
    h
}

/// An ICMP or ICMPv6 message: type, code, the four "rest of header" bytes, then `payload`.
#[must_use]
pub fn icmp(ty: u8, code: u8, rest: [u8; 4], payload: &[u8]) -> Vec<u8> {
    let mut h = vec![ty, code, 0, 0];
    h.extend_from_slice(&rest);
    h.extend_from_slice(payload);
    h
}

/// An ICMP/ICMPv6 echo with identifier `id`.
#[must_use]
pub fn echo(ty: u8, id: u16) -> Vec<u8> {
    let [a, b] = id.to_be_bytes();
    icmp(ty, 0, [a, b, 0, 1], &[0xab; 8])
}

/// The IPv4 source address and L4 source port of an Ethernet + 20-byte IPv4 `frame`.
#[must_use]
pub fn src_of(frame: &[u8]) -> (std::net::Ipv4Addr, u16) {
    let a: [u8; 4] = frame[26..30].try_into().expect("4 bytes");
    (a.into(), u16::from_be_bytes([frame[34], frame[35]]))
}

/// The IPv4 destination address and L4 destination port of an Ethernet + 20-byte IPv4 `frame`.
#[must_use]
pub fn dst_of(frame: &[u8]) -> (std::net::Ipv4Addr, u16) {
    let a: [u8; 4] = frame[30..34].try_into().expect("4 bytes");
    (a.into(), u16::from_be_bytes([frame[36], frame[37]]))
}

/// An ARP request frame.
#[must_use]
pub fn arp(sender: [u8; 4], target: [u8; 4]) -> Vec<u8> {
    let mut a = vec![0, 1, 0x08, 0, 6, 4, 0, 1];
    a.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
    a.extend_from_slice(&sender);
    a.extend_from_slice(&[0; 6]);
    a.extend_from_slice(&target);
    eth(ETH_P_ARP, &a)
}

/// The offsets at which a frame's headers end, for truncation tests: every prefix shorter than
/// one of these ends inside a header.
#[must_use]
pub fn boundaries(frame: &[u8]) -> Vec<usize> {
    let mut b = vec![14];
    let ethertype = u16::from_be_bytes([frame[12], frame[13]]);
    let (l4, proto) = match ethertype {
        ETH_P_IP => (14 + usize::from(frame[14] & 0x0f) * 4, frame[23]),
        ETH_P_IPV6 => (14 + 40, frame[20]),
        _ => return b,
    };
    b.push(l4);
    b.push(
        l4 + match proto {
            TCP => 20,
            SCTP => 12,
            UDP | ICMP | ICMPV6 => 8,
            _ => 0,
        },
    );
    b
}
