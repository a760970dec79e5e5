//! Hostile and unusual packets, both families: truncation at every byte inside every header, odd
//! TCP flag combinations and bad TCP data offsets. Each gets a defined verdict and its counter, and
//! each has a positive control (the whole packet passes).

use maps_schema::reason::{DROP_INVALID_HEADER, DROP_INVALID_TCP_FLAGS, DROP_MALFORMED, PASS};
use tests::{
    datapath::{Fam, Lab, Peer, expect},
    packet::{self, ACK, EXT_DEST, EXT_HOP, Ext, FIN, PSH, RST, SYN, TCP, URG},
};

/// Every prefix of `frame` from the end of the IP base header (`l3`) to `header_end` drops as
/// malformed; the whole frame passes.
///
/// Shorter cuts cannot be tested here: `BPF_PROG_TEST_RUN` refuses an IPv4/IPv6 frame without a
/// whole base IP header (EINVAL). The programs bounds-check those reads like every other.
fn truncations(lab: &mut Lab, what: &str, frame: &[u8], l3: usize, header_end: usize) {
    assert!(header_end <= frame.len());
    for len in l3..header_end {
        expect(
            &format!("{what} cut at {len}"),
            lab.from(0, &frame[..len]),
            DROP_MALFORMED,
        );
        expect(
            &format!("{what} cut at {len} (to)"),
            lab.to(0, &frame[..len]),
            DROP_MALFORMED,
        );
    }
    let whole = lab.from(0, frame);
    assert!(
        whole.passed,
        "{what}: the whole packet passes (control), got {whole}"
    );
}

fn truncated_everywhere(fam: Fam) {
    let Some(mut lab) = Lab::new("truncated_everywhere", fam) else {
        return;
    };
    lab.register(0, 0);
    let l3 = match fam {
        Fam::V4 => 14 + 20,
        Fam::V6 => 14 + 40,
    };
    let (a, w) = (Peer::Pod(0), Peer::World);
    let tcp = lab.tcp(a, 40000, w, 80, SYN);
    truncations(&mut lab, "tcp", &tcp, l3, l3 + 20);
    let udp = lab.udp(a, 40000, w, 53);
    truncations(&mut lab, "udp", &udp, l3, l3 + 8);
    let sctp = lab.sctp(a, 40000, w, 80, packet::SCTP_INIT);
    truncations(&mut lab, "sctp", &sctp, l3, l3 + 12);
    let echo = lab.echo(a, w, true, 9);
    truncations(&mut lab, "echo", &echo, l3, l3 + 8);
    // An ICMP error must quote the offending packet's IP header and its ports.
    let quoted = lab.udp(w, 53, a, 40001);
    let err = lab.unreachable(a, w, &quoted);
    truncations(&mut lab, "icmp error", &err, l3, l3 + 8 + (l3 - 14) + 4);
    if fam == Fam::V4 {
        let options = [1, 1, 1, 1, 1, 1, 1, 0];
        let p = packet::eth(
            packet::ETH_P_IP,
            &packet::ipv4_with(
                [10, 244, 0, 10],
                [192, 0, 2, 7],
                TCP,
                &options,
                0,
                &packet::tcp(40003, 80, SYN),
            ),
        );
        truncations(&mut lab, "ipv4 options", &p, l3, l3 + 8 + 20);
    }
    if fam == Fam::V6 {
        let (src, dst) = match (lab.addr(a), lab.addr(w)) {
            (std::net::IpAddr::V6(s), std::net::IpAddr::V6(d)) => (s.octets(), d.octets()),
            _ => unreachable!("v6 lab"),
        };
        let exts = [Ext::options(EXT_HOP), Ext::options(EXT_DEST)];
        let p = packet::eth(
            packet::ETH_P_IPV6,
            &packet::ipv6_ext(src, dst, &exts, TCP, &packet::tcp(40002, 80, SYN)),
        );
        truncations(&mut lab, "extension headers", &p, l3, l3 + 16 + 20);
    }
}

fn odd_tcp_flags(fam: Fam) {
    let Some(mut lab) = Lab::new("odd_tcp_flags", fam) else {
        return;
    };
    lab.register(0, 0);
    let (a, w) = (Peer::Pod(0), Peer::World);
    for (what, flags) in [
        ("SYN+FIN", SYN | FIN),
        ("SYN+RST", SYN | RST),
        ("SYN+FIN+RST+ACK", SYN | FIN | RST | ACK),
        ("no flags (null scan)", 0),
        ("PSH+URG only", PSH | URG),
        ("FIN without ACK", FIN),
        ("xmas (FIN+PSH+URG)", FIN | PSH | URG),
    ] {
        let p = lab.tcp(a, 40000, w, 80, flags);
        expect(what, lab.from(0, &p), DROP_INVALID_TCP_FLAGS);
        expect(
            what,
            lab.to(0, &lab.tcp(w, 80, a, 40000, flags)),
            DROP_INVALID_TCP_FLAGS,
        );
    }
    assert_eq!(lab.ct_len(), 0, "odd flags never create a flow");
    for (what, flags, sport) in [
        ("SYN (control)", SYN, 40001),
        ("RST alone (control)", RST, 40002),
        ("FIN+ACK (control)", FIN | ACK, 40003),
        ("ACK+PSH (control)", ACK | PSH, 40004),
    ] {
        let p = lab.tcp(a, sport, w, 80, flags);
        expect(what, lab.from(0, &p), PASS);
    }
    // Data offset below 5, and one that claims options the packet does not carry.
    let mut p = lab.tcp(a, 40005, w, 80, SYN);
    let doff = p.len() - 24 + 12;
    p[doff] = 4 << 4;
    expect("data offset 4", lab.from(0, &p), DROP_INVALID_HEADER);
    p[doff] = 15 << 4;
    expect(
        "data offset 15 without options",
        lab.from(0, &p),
        DROP_MALFORMED,
    );
}

#[test]
fn truncated_everywhere_v4() {
    truncated_everywhere(Fam::V4);
}

#[test]
fn truncated_everywhere_v6() {
    truncated_everywhere(Fam::V6);
}

#[test]
fn odd_tcp_flags_v4() {
    odd_tcp_flags(Fam::V4);
}

#[test]
fn odd_tcp_flags_v6() {
    odd_tcp_flags(Fam::V6);
}
