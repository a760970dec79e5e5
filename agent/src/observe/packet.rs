//! Synthetic packets for `weir policy trace`: Ethernet + IPv4/IPv6 + TCP, UDP, ICMP echo (the
//! "port" is the ICMP type) or a bare protocol header. Checksums are left zero: the programs never
//! check them, and a trace run never leaves the kernel's test-run context.

use std::net::IpAddr;

/// IP protocol numbers the builder writes an L4 header for.
const TCP: u8 = 6;
const UDP: u8 = 17;
const ICMP: u8 = 1;
const ICMPV6: u8 = 58;

/// TCP flag bits.
pub const TCP_FIN: u8 = 0x01;
/// TCP SYN.
pub const TCP_SYN: u8 = 0x02;
/// TCP RST.
pub const TCP_RST: u8 = 0x04;
/// TCP ACK.
pub const TCP_ACK: u8 = 0x10;

/// What to build.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    /// Source address.
    pub src: IpAddr,
    /// Destination address (the same family as `src`).
    pub dst: IpAddr,
    /// IP protocol.
    pub proto: u8,
    /// Source port (ICMP: the echo identifier).
    pub src_port: u16,
    /// Destination port (ICMP: the message type).
    pub port: u16,
    /// TCP flags.
    pub tcp_flags: u8,
}

/// Parses `syn`, `ack`, `syn-ack`, `fin-ack`, `rst` (or a number) into TCP flag bits.
pub fn tcp_flags(name: &str) -> Option<u8> {
    match name.to_ascii_lowercase().as_str() {
        "syn" => Some(TCP_SYN),
        "ack" => Some(TCP_ACK),
        "syn-ack" | "synack" => Some(TCP_SYN | TCP_ACK),
        "fin-ack" | "finack" => Some(TCP_FIN | TCP_ACK),
        "rst" => Some(TCP_RST),
        other => other.parse().ok(),
    }
}

fn l4(spec: &Spec) -> Vec<u8> {
    let sp = spec.src_port.to_be_bytes();
    let dp = spec.port.to_be_bytes();
    match spec.proto {
        TCP => {
            let mut h = vec![0u8; 20];
            h[0..2].copy_from_slice(&sp);
            h[2..4].copy_from_slice(&dp);
            h[4..8].copy_from_slice(&1u32.to_be_bytes());
            h[12] = 5 << 4;
            h[13] = spec.tcp_flags;
            h[14..16].copy_from_slice(&64_240u16.to_be_bytes());
            h
        }
        UDP => {
            let mut h = vec![0u8; 8];
            h[0..2].copy_from_slice(&sp);
            h[2..4].copy_from_slice(&dp);
            h[4..6].copy_from_slice(&8u16.to_be_bytes());
            h
        }
        ICMP | ICMPV6 => {
            // Type, code 0, checksum, identifier, sequence 1.
            let mut h = vec![0u8; 8];
            h[0] = u8::try_from(spec.port).unwrap_or(u8::MAX);
            h[4..6].copy_from_slice(&sp);
            h[6..8].copy_from_slice(&1u16.to_be_bytes());
            h
        }
        // Other protocols: 12 bytes of ports-shaped payload (an SCTP common header, whose ports
        // the programs read).
        _ => {
            let mut h = vec![0u8; 12];
            h[0..2].copy_from_slice(&sp);
            h[2..4].copy_from_slice(&dp);
            h
        }
    }
}

/// The Ethernet frame for `spec`; `None` when the two addresses are of different families.
pub fn frame(spec: &Spec) -> Option<Vec<u8>> {
    let payload = l4(spec);
    let mut f = Vec::with_capacity(14 + 40 + payload.len());
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01]);
    match (spec.src, spec.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            f.extend_from_slice(&0x0800u16.to_be_bytes());
            let total = u16::try_from(20 + payload.len()).ok()?;
            f.extend_from_slice(&[0x45, 0]);
            f.extend_from_slice(&total.to_be_bytes());
            f.extend_from_slice(&[0, 1, 0x40, 0, 64, spec.proto, 0, 0]);
            f.extend_from_slice(&s.octets());
            f.extend_from_slice(&d.octets());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            f.extend_from_slice(&0x86DDu16.to_be_bytes());
            let len = u16::try_from(payload.len()).ok()?;
            f.extend_from_slice(&[0x60, 0, 0, 0]);
            f.extend_from_slice(&len.to_be_bytes());
            f.extend_from_slice(&[spec.proto, 64]);
            f.extend_from_slice(&s.octets());
            f.extend_from_slice(&d.octets());
        }
        _ => return None,
    }
    f.extend_from_slice(&payload);
    Some(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_have_the_headers_the_programs_parse() {
        let spec = Spec {
            src: "10.0.0.1".parse().unwrap(),
            dst: "10.0.0.2".parse().unwrap(),
            proto: 6,
            src_port: 40_000,
            port: 80,
            tcp_flags: TCP_SYN,
        };
        let f = frame(&spec).unwrap();
        assert_eq!(f.len(), 14 + 20 + 20);
        assert_eq!(&f[12..14], &[0x08, 0x00]);
        assert_eq!(f[14 + 9], 6);
        assert_eq!(&f[34..36], &40_000u16.to_be_bytes());
        assert_eq!(&f[36..38], &80u16.to_be_bytes());
        assert_eq!(f[34 + 13], TCP_SYN);
        let v6 = Spec {
            src: "fd00::1".parse().unwrap(),
            dst: "fd00::2".parse().unwrap(),
            proto: 58,
            port: 128,
            ..spec
        };
        let f = frame(&v6).unwrap();
        assert_eq!(f.len(), 14 + 40 + 8);
        assert_eq!(f[14 + 6], 58);
        assert_eq!(f[54], 128);
        let mixed = Spec {
            dst: "fd00::2".parse().unwrap(),
            ..spec
        };
        assert!(frame(&mixed).is_none());
        assert_eq!(tcp_flags("syn-ack"), Some(TCP_SYN | TCP_ACK));
        assert_eq!(tcp_flags("nope"), None);
    }
}
