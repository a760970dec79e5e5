//! IPv4 checksums of test frames (Ethernet + a 20-byte IPv4 header + TCP or UDP, or ICMP): filled in, so a
//! program's incremental rewrite can be checked against a full recomputation.

/// The ones' complement sum of `data` (plus `sum`) folded to 16 bits; 0 over a header that
/// includes its valid checksum field.
fn fold(mut sum: u32, data: &[u8]) -> u16 {
    for c in data.chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The L4 checksum over the pseudo header and the segment (TCP, UDP) or over the message (ICMP),
/// 0 when the frame's is valid.
fn l4_sum(frame: &[u8]) -> u16 {
    let ip = &frame[14..];
    let l4 = &ip[20..];
    if ip[9] == crate::packet::ICMP {
        return fold(0, l4);
    }
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&ip[12..20]);
    pseudo.extend_from_slice(&[0, ip[9]]);
    pseudo.extend_from_slice(&u16::try_from(l4.len()).expect("fits").to_be_bytes());
    let mut sum = 0u32;
    for c in pseudo.chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    fold(sum, l4)
}

/// Offset of the L4 checksum field.
fn csum_offset(frame: &[u8]) -> usize {
    14 + 20
        + match frame[14 + 9] {
            crate::packet::TCP => 16,
            crate::packet::ICMP => 2,
            _ => 6,
        }
}

/// `frame` with a valid IPv4 header checksum (the payload left as it is).
#[must_use]
pub fn with_ip_checksum(mut frame: Vec<u8>) -> Vec<u8> {
    frame[24..26].copy_from_slice(&[0, 0]);
    let ip = fold(0, &frame[14..34]);
    frame[24..26].copy_from_slice(&ip.to_be_bytes());
    frame
}

/// `frame` with valid IPv4 header and TCP, UDP or ICMP checksums.
#[must_use]
pub fn with_checksums(mut frame: Vec<u8>) -> Vec<u8> {
    frame[24..26].copy_from_slice(&[0, 0]);
    let ip = fold(0, &frame[14..34]);
    frame[24..26].copy_from_slice(&ip.to_be_bytes());
    let off = csum_offset(&frame);
    frame[off..off + 2].copy_from_slice(&[0, 0]);
    let sum = l4_sum(&frame);
    frame[off..off + 2].copy_from_slice(&sum.to_be_bytes());
    frame
}

/// Asserts the IPv4 header and ICMP checksums of an ICMP `frame` verify, naming `what`.
#[track_caller]
pub fn assert_valid_icmp(what: &str, frame: &[u8]) {
    assert_eq!(fold(0, &frame[14..34]), 0, "{what}: IPv4 header checksum");
    assert_eq!(fold(0, &frame[34..]), 0, "{what}: ICMP checksum");
}

/// Asserts both checksums of `frame` verify, naming `what`.
#[track_caller]
pub fn assert_valid(what: &str, frame: &[u8]) {
    assert_eq!(fold(0, &frame[14..34]), 0, "{what}: IPv4 header checksum");
    assert_eq!(l4_sum(frame), 0, "{what}: L4 checksum");
}
