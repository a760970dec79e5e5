//! `BPF_PROG_TEST_RUN` suite, IPv6: the shared scenarios plus neighbour discovery, extension
//! headers and fragments.

mod datapath_common;

use datapath_common::expect;
use maps_schema::reason::{
    DIR_FROM_ENDPOINT, DROP_EXT_HEADER_LIMIT, DROP_FRAGMENT, DROP_IPV6_ROUTING_HEADER,
    DROP_SPOOFED_SOURCE, NOTE_IPV6_EXT_HEADERS, PASS, PASS_NEIGHBOUR,
};
use tests::{
    datapath::{Fam, Lab, Peer},
    packet::{self, EXT_DEST, EXT_HOP, Ext, ICMPV6, SYN, TCP},
};

#[test]
fn unknown_endpoint_drops() {
    datapath_common::unknown_endpoint_drops(Fam::V6);
}

#[test]
fn spoofed_source_drops() {
    datapath_common::spoofed_source_drops(Fam::V6);
}

#[test]
fn non_isolated_endpoint_allows() {
    datapath_common::non_isolated_endpoint_allows(Fam::V6);
}

#[test]
fn tcp_handshake_replies_and_close() {
    datapath_common::tcp_handshake_replies_and_close(Fam::V6);
}

#[test]
fn tcp_denied() {
    datapath_common::tcp_denied(Fam::V6);
}

#[test]
fn udp_port_ranges_and_replies() {
    datapath_common::udp_port_ranges_and_replies(Fam::V6);
}

#[test]
fn any_peer_and_any_port_rules() {
    datapath_common::any_peer_and_any_port_rules(Fam::V6);
}

#[test]
fn cidr_rule_with_except() {
    datapath_common::cidr_rule_with_except(Fam::V6);
}

#[test]
fn local_flow_needs_both_sides() {
    datapath_common::local_flow_needs_both_sides(Fam::V6);
}

#[test]
fn sctp_ports_allowed_and_denied() {
    datapath_common::sctp_ports_allowed_and_denied(Fam::V6);
}

#[test]
fn icmp_echo_and_related_errors() {
    datapath_common::icmp_echo_and_related_errors(Fam::V6);
}

#[test]
fn host_reaches_isolated_pod() {
    datapath_common::host_reaches_isolated_pod(Fam::V6);
}

const UNSPECIFIED: [u8; 16] = [0; 16];
const LINK_LOCAL: [u8; 16] = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x0a];
const ALL_ROUTERS: [u8; 16] = [0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
const SOLICITED: [u8; 16] = [0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0, 0, 0x0a];
const MLDV2: [u8; 16] = [0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x16];

#[test]
fn neighbour_discovery_passes() {
    let Some(mut lab) = Lab::new("neighbour_discovery_passes", Fam::V6) else {
        return;
    };
    lab.register(0, 0);
    let nd = |src, dst, ty: u8| {
        packet::eth(
            packet::ETH_P_IPV6,
            &packet::ipv6(src, dst, ICMPV6, &packet::icmp(ty, 0, [0; 4], &[0; 16])),
        )
    };
    // DAD (from ::), router solicitation, neighbour solicitation/advertisement from link-local.
    expect(
        "DAD neighbour solicitation",
        lab.from(0, &nd(UNSPECIFIED, SOLICITED, 135)),
        PASS_NEIGHBOUR,
    );
    expect(
        "router solicitation",
        lab.from(0, &nd(LINK_LOCAL, ALL_ROUTERS, 133)),
        PASS_NEIGHBOUR,
    );
    expect(
        "neighbour advertisement",
        lab.from(0, &nd(LINK_LOCAL, SOLICITED, 136)),
        PASS_NEIGHBOUR,
    );
    expect(
        "router advertisement into the pod",
        lab.to(0, &nd(LINK_LOCAL, ALL_ROUTERS, 134)),
        PASS_NEIGHBOUR,
    );
    // MLDv2 report behind a hop-by-hop header (router alert).
    let mld = packet::eth(
        packet::ETH_P_IPV6,
        &packet::ipv6_ext(
            LINK_LOCAL,
            MLDV2,
            &[Ext::options(EXT_HOP)],
            ICMPV6,
            &packet::icmp(143, 0, [0; 4], &[0; 20]),
        ),
    );
    expect("MLDv2 report", lab.from(0, &mld), PASS_NEIGHBOUR);
    // Control: other ICMPv6 from a link-local source is anti-spoofed.
    let echo = packet::eth(
        packet::ETH_P_IPV6,
        &packet::ipv6(LINK_LOCAL, ALL_ROUTERS, ICMPV6, &packet::echo(128, 1)),
    );
    expect(
        "echo from link-local",
        lab.from(0, &echo),
        DROP_SPOOFED_SOURCE,
    );
    assert_eq!(lab.ct_len(), 0);
}

#[test]
fn extension_headers_and_fragments() {
    let Some(mut lab) = Lab::new("extension_headers_and_fragments", Fam::V6) else {
        return;
    };
    lab.register(0, 0);
    let (src, dst) = match (lab.addr(Peer::Pod(0)), lab.addr(Peer::World)) {
        (std::net::IpAddr::V6(s), std::net::IpAddr::V6(d)) => (s.octets(), d.octets()),
        _ => unreachable!("v6 lab"),
    };
    let frame = |exts: &[Ext], sport: u16| {
        packet::eth(
            packet::ETH_P_IPV6,
            &packet::ipv6_ext(src, dst, exts, TCP, &packet::tcp(sport, 80, SYN)),
        )
    };
    let p = frame(
        &[
            Ext::options(EXT_HOP),
            Ext::routing(0),
            Ext::options(EXT_DEST),
        ],
        40000,
    );
    expect(
        "hop-by-hop, routing (done), destination options",
        lab.from(0, &p),
        PASS,
    );
    assert_eq!(lab.counter(NOTE_IPV6_EXT_HEADERS, DIR_FROM_ENDPOINT), 1);
    assert!(
        lab.ct(Peer::Pod(0), 40000, Peer::World, 80, TCP).is_some(),
        "ports read after the chain"
    );
    let p = frame(&[Ext::routing(2)], 40001);
    expect(
        "routing header with segments left",
        lab.from(0, &p),
        DROP_IPV6_ROUTING_HEADER,
    );
    for (what, ext) in [
        ("first fragment", Ext::fragment(0, true)),
        ("later fragment", Ext::fragment(8, false)),
    ] {
        expect(
            what,
            lab.from(0, &frame(&[Ext::options(EXT_HOP), ext], 40002)),
            DROP_FRAGMENT,
        );
    }
    let five = [
        Ext::options(EXT_HOP),
        Ext::options(EXT_DEST),
        Ext::options(EXT_DEST),
        Ext::options(EXT_DEST),
        Ext::options(EXT_DEST),
    ];
    expect(
        "five extension headers",
        lab.from(0, &frame(&five, 40003)),
        DROP_EXT_HEADER_LIMIT,
    );
    expect(
        "four extension headers (control)",
        lab.from(0, &frame(&five[..4], 40004)),
        PASS,
    );
    for sport in 40001..=40003 {
        assert!(lab.ct(Peer::Pod(0), sport, Peer::World, 80, TCP).is_none());
    }
}
