//! `BPF_PROG_TEST_RUN` suite, IPv4: the shared scenarios plus ARP, IPv4 options and fragments.

mod datapath_common;

use datapath_common::expect;
use maps_schema::reason::{
    DIR_FROM_ENDPOINT, DROP_FRAGMENT, DROP_INVALID_HEADER, DROP_UNSUPPORTED_ETHERTYPE,
    NOTE_IPV4_OPTIONS, PASS, PASS_NEIGHBOUR,
};
use tests::{
    datapath::{Fam, Lab, Peer},
    packet::{self, SYN, TCP},
};

#[test]
fn unknown_endpoint_drops() {
    datapath_common::unknown_endpoint_drops(Fam::V4);
}

#[test]
fn spoofed_source_drops() {
    datapath_common::spoofed_source_drops(Fam::V4);
}

#[test]
fn non_isolated_endpoint_allows() {
    datapath_common::non_isolated_endpoint_allows(Fam::V4);
}

#[test]
fn tcp_handshake_replies_and_close() {
    datapath_common::tcp_handshake_replies_and_close(Fam::V4);
}

#[test]
fn tcp_denied() {
    datapath_common::tcp_denied(Fam::V4);
}

#[test]
fn udp_port_ranges_and_replies() {
    datapath_common::udp_port_ranges_and_replies(Fam::V4);
}

#[test]
fn any_peer_and_any_port_rules() {
    datapath_common::any_peer_and_any_port_rules(Fam::V4);
}

#[test]
fn cidr_rule_with_except() {
    datapath_common::cidr_rule_with_except(Fam::V4);
}

#[test]
fn local_flow_needs_both_sides() {
    datapath_common::local_flow_needs_both_sides(Fam::V4);
}

#[test]
fn sctp_ports_allowed_and_denied() {
    datapath_common::sctp_ports_allowed_and_denied(Fam::V4);
}

#[test]
fn icmp_echo_and_related_errors() {
    datapath_common::icmp_echo_and_related_errors(Fam::V4);
}

#[test]
fn host_reaches_isolated_pod() {
    datapath_common::host_reaches_isolated_pod(Fam::V4);
}

#[test]
fn arp_passes_and_other_ethertypes_drop() {
    let Some(mut lab) = Lab::new("arp_passes_and_other_ethertypes_drop", Fam::V4) else {
        return;
    };
    lab.register(0, 0);
    let arp = packet::arp([10, 244, 0, 10], [169, 254, 1, 1]);
    expect(
        "ARP request from the pod",
        lab.from(0, &arp),
        PASS_NEIGHBOUR,
    );
    expect("ARP into the pod", lab.to(0, &arp), PASS_NEIGHBOUR);
    let lldp = packet::eth(0x88cc, &[0; 46]);
    expect("LLDP", lab.from(0, &lldp), DROP_UNSUPPORTED_ETHERTYPE);
    let vlan = packet::eth(0x8100, &[0; 46]);
    expect("a VLAN tag", lab.to(0, &vlan), DROP_UNSUPPORTED_ETHERTYPE);
    assert_eq!(lab.ct_len(), 0);
}

#[test]
fn ipv4_options_fragments_and_bad_headers() {
    let Some(mut lab) = Lab::new("ipv4_options_fragments_and_bad_headers", Fam::V4) else {
        return;
    };
    lab.register(0, 0);
    let (src, dst) = ([10, 244, 0, 10], [192, 0, 2, 7]);
    let tcp = packet::tcp(40000, 80, SYN);
    // Options (record route + padding): the packet gets its normal verdict, and a note is counted.
    let options = [7, 7, 4, 0, 0, 0, 0, 1];
    let p = packet::eth(
        packet::ETH_P_IP,
        &packet::ipv4_with(src, dst, TCP, &options, 0, &tcp),
    );
    expect("options, allowed flow", lab.from(0, &p), PASS);
    assert_eq!(lab.counter(NOTE_IPV4_OPTIONS, DIR_FROM_ENDPOINT), 1);
    assert!(
        lab.ct(Peer::Pod(0), 40000, Peer::World, 80, TCP).is_some(),
        "ports read after the options"
    );
    // Fragments: first (more fragments), middle and last all drop with their own reason.
    for (what, frag) in [
        ("first fragment", 0x2000),
        ("middle fragment", 0x2000 | 10),
        ("last fragment", 20),
    ] {
        let p = packet::eth(
            packet::ETH_P_IP,
            &packet::ipv4_with(src, dst, TCP, &[], frag, &packet::tcp(40001, 80, SYN)),
        );
        expect(what, lab.from(0, &p), DROP_FRAGMENT);
    }
    assert!(lab.ct(Peer::Pod(0), 40001, Peer::World, 80, TCP).is_none());
    // "Don't fragment" alone is not a fragment.
    let p = packet::eth(
        packet::ETH_P_IP,
        &packet::ipv4_with(src, dst, TCP, &[], 0x4000, &packet::tcp(40002, 80, SYN)),
    );
    expect("DF set (control)", lab.from(0, &p), PASS);
    // IHL below 5 and a wrong version.
    let mut p = packet::eth(packet::ETH_P_IP, &packet::ipv4(src, dst, TCP, &tcp));
    p[14] = 0x44;
    expect("IHL 4", lab.from(0, &p), DROP_INVALID_HEADER);
    p[14] = 0x65;
    expect(
        "version 6 in an IPv4 frame",
        lab.from(0, &p),
        DROP_INVALID_HEADER,
    );
}
