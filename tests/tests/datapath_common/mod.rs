//! Scenarios both families run (`datapath_testrun_v4.rs`, `datapath_testrun_v6.rs`), in packet-flow
//! order. Each step checks the verdict, the reason counter that moved and the conntrack entry.

use maps_schema::{
    PolicyValue,
    conntrack::{
        FLAG_DST_INGRESS_APPROVED as DST_OK, FLAG_SEEN_REPLY, FLAG_SRC_EGRESS_APPROVED as SRC_OK,
        FLAG_TCP_FIN_DST, FLAG_TCP_FIN_SRC, FLAG_TCP_RST, FLAG_TCP_SYN, FLAG_TCP_SYN_ACK,
        TIMEOUT_TCP_CLOSED_SECS, TIMEOUT_TCP_ESTABLISHED_SECS,
    },
    endpoint::{FLAG_ISOLATED_EGRESS, FLAG_ISOLATED_INGRESS},
    identity::ANY,
    policy::{ANY_PORT, ANY_PROTO, EGRESS, INGRESS, VERDICT_ALLOW},
    reason::{
        DROP_POLICY_DENIED, DROP_SPOOFED_SOURCE, DROP_UNKNOWN_ENDPOINT, PASS, PASS_ESTABLISHED,
        PASS_POLICY, PASS_RELATED,
    },
};
use tests::{
    datapath::{Fam, IDENTITIES, Lab, Peer},
    packet::{ACK, FIN, PSH, RST, SCTP, SCTP_INIT, SCTP_INIT_ACK, SYN, TCP, UDP},
};

const BOTH: u32 = FLAG_ISOLATED_INGRESS | FLAG_ISOLATED_EGRESS;
const ALLOW: PolicyValue = PolicyValue::new(VERDICT_ALLOW, 7);

pub use tests::datapath::expect;

/// The conntrack flags of a flow (panics when there is no entry).
#[track_caller]
fn ct_flags(lab: &Lab, src: Peer, sport: u16, dst: Peer, dport: u16, proto: u8) -> u32 {
    lab.ct(src, sport, dst, dport, proto)
        .unwrap_or_else(|| panic!("no conntrack entry for {src:?}:{sport} -> {dst:?}:{dport}"))
        .flags
}

pub fn unknown_endpoint_drops(fam: Fam) {
    let Some(mut lab) = Lab::new("unknown_endpoint_drops", fam) else {
        return;
    };
    let p = lab.tcp(Peer::Pod(0), 40000, Peer::Pod(1), 80, SYN);
    expect(
        "from an unregistered interface",
        lab.from(0, &p),
        DROP_UNKNOWN_ENDPOINT,
    );
    expect(
        "to an unregistered interface",
        lab.to(1, &p),
        DROP_UNKNOWN_ENDPOINT,
    );
    assert_eq!(lab.ct_len(), 0, "no conntrack entry for dropped packets");
    // Positive control: once registered, the same packets pass.
    lab.register(0, 0);
    lab.register(1, 0);
    expect("from a registered endpoint", lab.from(0, &p), PASS);
    expect("to a registered endpoint", lab.to(1, &p), PASS);
}

pub fn spoofed_source_drops(fam: Fam) {
    let Some(mut lab) = Lab::new("spoofed_source_drops", fam) else {
        return;
    };
    lab.register(0, 0);
    lab.register(1, 0);
    let spoofed = lab.udp(Peer::Pod(1), 5000, Peer::World, 53);
    expect(
        "pod 0 sending as pod 1",
        lab.from(0, &spoofed),
        DROP_SPOOFED_SOURCE,
    );
    assert!(lab.ct(Peer::Pod(1), 5000, Peer::World, 53, UDP).is_none());
    let own = lab.udp(Peer::Pod(0), 5000, Peer::World, 53);
    expect("pod 0 as itself (control)", lab.from(0, &own), PASS);
    assert_eq!(
        ct_flags(&lab, Peer::Pod(0), 5000, Peer::World, 53, UDP) & SRC_OK,
        SRC_OK
    );
}

pub fn non_isolated_endpoint_allows(fam: Fam) {
    let Some(mut lab) = Lab::new("non_isolated_endpoint_allows", fam) else {
        return;
    };
    lab.register(0, 0);
    lab.register(1, 0);
    let syn = lab.tcp(Peer::Pod(0), 40000, Peer::Pod(1), 9999, SYN);
    expect("SYN leaves pod 0", lab.from(0, &syn), PASS);
    assert_eq!(
        ct_flags(&lab, Peer::Pod(0), 40000, Peer::Pod(1), 9999, TCP) & (SRC_OK | DST_OK),
        SRC_OK
    );
    expect("SYN enters pod 1", lab.to(1, &syn), PASS);
    let synack = lab.tcp(Peer::Pod(1), 9999, Peer::Pod(0), 40000, SYN | ACK);
    expect(
        "SYN-ACK leaves pod 1",
        lab.from(1, &synack),
        PASS_ESTABLISHED,
    );
    expect("SYN-ACK enters pod 0", lab.to(0, &synack), PASS_ESTABLISHED);
    let flags = ct_flags(&lab, Peer::Pod(0), 40000, Peer::Pod(1), 9999, TCP);
    assert_eq!(
        flags & (SRC_OK | DST_OK | FLAG_TCP_SYN | FLAG_TCP_SYN_ACK | FLAG_SEEN_REPLY),
        SRC_OK | DST_OK | FLAG_TCP_SYN | FLAG_TCP_SYN_ACK | FLAG_SEEN_REPLY
    );
}

/// Pod 0 may open TCP 80 to pod 1 (its egress, pod 1's ingress); both isolated both ways.
fn web_policy(lab: &mut Lab) {
    lab.register(0, BOTH);
    lab.register(1, BOTH);
    lab.policy(0, EGRESS, IDENTITIES[1], TCP, 80, ALLOW);
    lab.policy(1, INGRESS, IDENTITIES[0], TCP, 80, ALLOW);
}

pub fn tcp_handshake_replies_and_close(fam: Fam) {
    let Some(mut lab) = Lab::new("tcp_handshake_replies_and_close", fam) else {
        return;
    };
    web_policy(&mut lab);
    let (a, b) = (Peer::Pod(0), Peer::Pod(1));
    let syn = lab.tcp(a, 40000, b, 80, SYN);
    expect(
        "SYN leaves pod 0 (egress allows)",
        lab.from(0, &syn),
        PASS_POLICY,
    );
    expect(
        "SYN enters pod 1 (ingress allows)",
        lab.to(1, &syn),
        PASS_POLICY,
    );
    assert_eq!(
        ct_flags(&lab, a, 40000, b, 80, TCP) & (SRC_OK | DST_OK),
        SRC_OK | DST_OK
    );
    let synack = lab.tcp(b, 80, a, 40000, SYN | ACK);
    expect(
        "SYN-ACK leaves pod 1 (reply)",
        lab.from(1, &synack),
        PASS_ESTABLISHED,
    );
    expect(
        "SYN-ACK enters pod 0 (reply)",
        lab.to(0, &synack),
        PASS_ESTABLISHED,
    );
    let ack = lab.tcp(a, 40000, b, 80, ACK | PSH);
    expect("data leaves pod 0", lab.from(0, &ack), PASS_ESTABLISHED);
    expect("data enters pod 1", lab.to(1, &ack), PASS_ESTABLISHED);
    let entry = lab.ct(a, 40000, b, 80, TCP).expect("entry");
    assert_eq!(entry.timeout_secs(TCP), TIMEOUT_TCP_ESTABLISHED_SECS);
    assert!(entry.last_seen_ns > 0, "the entry carries a timestamp");
    // FIN from both sides: closed, short timeout.
    let fin_a = lab.tcp(a, 40000, b, 80, FIN | ACK);
    expect("FIN from pod 0", lab.from(0, &fin_a), PASS_ESTABLISHED);
    let fin_b = lab.tcp(b, 80, a, 40000, FIN | ACK);
    expect("FIN from pod 1", lab.from(1, &fin_b), PASS_ESTABLISHED);
    let entry = lab.ct(a, 40000, b, 80, TCP).expect("entry");
    assert_eq!(
        entry.flags & (FLAG_TCP_FIN_SRC | FLAG_TCP_FIN_DST),
        FLAG_TCP_FIN_SRC | FLAG_TCP_FIN_DST
    );
    assert_eq!(entry.timeout_secs(TCP), TIMEOUT_TCP_CLOSED_SECS);
    // RST closes another flow at once.
    let syn2 = lab.tcp(a, 40001, b, 80, SYN);
    expect("second SYN", lab.from(0, &syn2), PASS_POLICY);
    let rst = lab.tcp(b, 80, a, 40001, RST);
    expect(
        "RST enters pod 0 (reply)",
        lab.to(0, &rst),
        PASS_ESTABLISHED,
    );
    let entry = lab.ct(a, 40001, b, 80, TCP).expect("entry");
    assert_eq!(entry.flags & FLAG_TCP_RST, FLAG_TCP_RST);
    assert_eq!(entry.timeout_secs(TCP), TIMEOUT_TCP_CLOSED_SECS);
}

pub fn tcp_denied(fam: Fam) {
    let Some(mut lab) = Lab::new("tcp_denied", fam) else {
        return;
    };
    web_policy(&mut lab);
    let (a, b) = (Peer::Pod(0), Peer::Pod(1));
    let syn = lab.tcp(a, 40000, b, 81, SYN);
    expect(
        "SYN to an unallowed port leaves pod 0",
        lab.from(0, &syn),
        DROP_POLICY_DENIED,
    );
    expect(
        "and cannot enter pod 1",
        lab.to(1, &syn),
        DROP_POLICY_DENIED,
    );
    assert!(
        lab.ct(a, 40000, b, 81, TCP).is_none(),
        "a denied flow leaves no entry"
    );
    let back = lab.tcp(b, 40000, a, 80, SYN);
    expect(
        "pod 1 may not open pod 0's port 80",
        lab.from(1, &back),
        DROP_POLICY_DENIED,
    );
    // A reply-looking packet for a flow that does not exist is judged as a new flow.
    let fake_reply = lab.tcp(b, 80, a, 40000, SYN | ACK);
    expect(
        "unsolicited SYN-ACK into pod 0",
        lab.to(0, &fake_reply),
        DROP_POLICY_DENIED,
    );
    // Positive control.
    let ok = lab.tcp(a, 40000, b, 80, SYN);
    expect("port 80 (control)", lab.from(0, &ok), PASS_POLICY);
    expect("port 80 enters (control)", lab.to(1, &ok), PASS_POLICY);
}

pub fn udp_port_ranges_and_replies(fam: Fam) {
    let Some(mut lab) = Lab::new("udp_port_ranges_and_replies", fam) else {
        return;
    };
    lab.register(0, 0);
    lab.register(1, BOTH);
    lab.policy(
        1,
        INGRESS,
        IDENTITIES[0],
        UDP,
        ANY_PORT,
        Lab::ranges(VERDICT_ALLOW, 8, &[(5000, 5010), (6000, 6000)]),
    );
    let (a, b) = (Peer::Pod(0), Peer::Pod(1));
    for (port, want) in [
        (4999, DROP_POLICY_DENIED),
        (5000, PASS_POLICY),
        (5005, PASS_POLICY),
        (5010, PASS_POLICY),
        (5011, DROP_POLICY_DENIED),
        (6000, PASS_POLICY),
        (6001, DROP_POLICY_DENIED),
    ] {
        let p = lab.udp(a, 33000, b, port);
        expect(&format!("udp to port {port}"), lab.to(1, &p), want);
        assert_eq!(
            lab.ct(a, 33000, b, port, UDP).is_some(),
            want == PASS_POLICY,
            "entry for port {port}"
        );
    }
    let reply = lab.udp(b, 5005, a, 33000);
    expect(
        "reply leaves pod 1 (egress isolated, via conntrack)",
        lab.from(1, &reply),
        PASS_ESTABLISHED,
    );
    let own = lab.udp(b, 5005, a, 33001);
    expect(
        "a new flow from pod 1 (egress isolated)",
        lab.from(1, &own),
        DROP_POLICY_DENIED,
    );
}

pub fn any_peer_and_any_port_rules(fam: Fam) {
    let Some(mut lab) = Lab::new("any_peer_and_any_port_rules", fam) else {
        return;
    };
    lab.register(0, 0);
    lab.register(1, BOTH);
    lab.policy(1, INGRESS, ANY, TCP, 443, ALLOW);
    lab.policy(1, INGRESS, IDENTITIES[0], TCP, ANY_PORT, ALLOW);
    lab.policy(1, INGRESS, IDENTITIES[2], ANY_PROTO, ANY_PORT, ALLOW);
    let b = Peer::Pod(1);
    let p = lab.tcp(Peer::World, 1234, b, 443, SYN);
    expect("any peer, port 443", lab.to(1, &p), PASS_POLICY);
    let p = lab.tcp(Peer::World, 1234, b, 444, SYN);
    expect("any peer, port 444", lab.to(1, &p), DROP_POLICY_DENIED);
    let p = lab.tcp(Peer::Pod(0), 1234, b, 12345, SYN);
    expect("pod 0, any port", lab.to(1, &p), PASS_POLICY);
    let p = lab.udp(Peer::Pod(0), 1234, b, 12345);
    expect(
        "pod 0, UDP is another protocol",
        lab.to(1, &p),
        DROP_POLICY_DENIED,
    );
    lab.register(2, 0);
    let p = lab.udp(Peer::Pod(2), 1234, b, 53);
    expect("pod 2, any protocol", lab.to(1, &p), PASS_POLICY);
}

pub fn cidr_rule_with_except(fam: Fam) {
    let Some(mut lab) = Lab::new("cidr_rule_with_except", fam) else {
        return;
    };
    lab.register(0, FLAG_ISOLATED_EGRESS);
    let ((block, block_len), (except, except_len)) = lab.cidr_block();
    // The agent gives the block and its except part CIDR identities; policy selects the block's.
    lab.set_cidr_identity(block, block_len, 5000);
    lab.set_cidr_identity(except, except_len, 5001);
    lab.policy(0, EGRESS, 5000, TCP, ANY_PORT, ALLOW);
    let a = Peer::Pod(0);
    let p = lab.tcp(a, 40000, Peer::InCidr, 80, SYN);
    expect("to the CIDR block", lab.from(0, &p), PASS_POLICY);
    assert_eq!(
        ct_flags(&lab, a, 40000, Peer::InCidr, 80, TCP) & SRC_OK,
        SRC_OK
    );
    let p = lab.tcp(a, 40000, Peer::InExcept, 80, SYN);
    expect("to the except part", lab.from(0, &p), DROP_POLICY_DENIED);
    assert!(lab.ct(a, 40000, Peer::InExcept, 80, TCP).is_none());
    let p = lab.tcp(a, 40000, Peer::World, 80, SYN);
    expect("to the world", lab.from(0, &p), DROP_POLICY_DENIED);
}

pub fn local_flow_needs_both_sides(fam: Fam) {
    let Some(mut lab) = Lab::new("local_flow_needs_both_sides", fam) else {
        return;
    };
    lab.register(0, FLAG_ISOLATED_EGRESS);
    lab.register(1, FLAG_ISOLATED_INGRESS);
    lab.register(2, FLAG_ISOLATED_EGRESS);
    // Pod 0's egress allows pod 1; pod 1's ingress allows only pod 2.
    lab.policy(0, EGRESS, IDENTITIES[1], TCP, 80, ALLOW);
    lab.policy(1, INGRESS, IDENTITIES[2], TCP, 80, ALLOW);
    lab.policy(2, EGRESS, IDENTITIES[1], TCP, 80, ALLOW);
    let (a, b) = (Peer::Pod(0), Peer::Pod(1));
    // Order 1: source first.
    let syn = lab.tcp(a, 40000, b, 80, SYN);
    expect("order 1: leaves pod 0", lab.from(0, &syn), PASS_POLICY);
    expect(
        "order 1: pod 1's ingress denies",
        lab.to(1, &syn),
        DROP_POLICY_DENIED,
    );
    assert_eq!(
        ct_flags(&lab, a, 40000, b, 80, TCP) & (SRC_OK | DST_OK),
        SRC_OK,
        "only the source approved"
    );
    expect(
        "order 1: retransmission still denied",
        lab.to(1, &syn),
        DROP_POLICY_DENIED,
    );
    // Order 2: destination first.
    let syn = lab.tcp(a, 40001, b, 80, SYN);
    expect(
        "order 2: pod 1's ingress denies",
        lab.to(1, &syn),
        DROP_POLICY_DENIED,
    );
    assert!(lab.ct(a, 40001, b, 80, TCP).is_none());
    expect("order 2: leaves pod 0", lab.from(0, &syn), PASS_POLICY);
    expect("order 2: still denied", lab.to(1, &syn), DROP_POLICY_DENIED);
    // The other way round: destination allows, source denies — in both orders.
    let syn = lab.tcp(Peer::Pod(2), 40002, Peer::Pod(0), 80, SYN);
    lab.register(0, FLAG_ISOLATED_EGRESS | FLAG_ISOLATED_INGRESS);
    lab.policy(0, INGRESS, IDENTITIES[2], TCP, 80, ALLOW);
    lab.register(2, FLAG_ISOLATED_EGRESS);
    lab.policy(2, EGRESS, IDENTITIES[1], TCP, 80, ALLOW); // not pod 0
    expect(
        "pod 2's egress denies",
        lab.from(2, &syn),
        DROP_POLICY_DENIED,
    );
    expect("pod 0's ingress allows", lab.to(0, &syn), PASS_POLICY);
    expect(
        "pod 2's egress still denies",
        lab.from(2, &syn),
        DROP_POLICY_DENIED,
    );
    // Positive control: pod 2 -> pod 1 is allowed by both sides.
    let ok = lab.tcp(Peer::Pod(2), 40003, b, 80, SYN);
    expect("control: leaves pod 2", lab.from(2, &ok), PASS_POLICY);
    expect("control: enters pod 1", lab.to(1, &ok), PASS_POLICY);
    assert_eq!(
        ct_flags(&lab, Peer::Pod(2), 40003, b, 80, TCP) & (SRC_OK | DST_OK),
        SRC_OK | DST_OK
    );
}

pub fn icmp_echo_and_related_errors(fam: Fam) {
    let Some(mut lab) = Lab::new("icmp_echo_and_related_errors", fam) else {
        return;
    };
    lab.register(0, BOTH);
    lab.register(1, BOTH);
    let icmp = lab.icmp_proto();
    let (echo_req, _) = lab.echo_types();
    lab.policy(0, EGRESS, IDENTITIES[1], icmp, u16::from(echo_req), ALLOW);
    lab.policy(1, INGRESS, IDENTITIES[0], icmp, u16::from(echo_req), ALLOW);
    lab.policy(0, EGRESS, IDENTITIES[1], UDP, 53, ALLOW);
    lab.policy(1, INGRESS, IDENTITIES[0], UDP, 53, ALLOW);
    lab.policy(0, EGRESS, ANY, UDP, 9000, ALLOW);
    let (a, b) = (Peer::Pod(0), Peer::Pod(1));
    let req = lab.echo(a, b, true, 77);
    expect("echo request leaves pod 0", lab.from(0, &req), PASS_POLICY);
    expect("echo request enters pod 1", lab.to(1, &req), PASS_POLICY);
    assert_eq!(
        ct_flags(&lab, a, 77, b, 0, icmp) & (SRC_OK | DST_OK),
        SRC_OK | DST_OK
    );
    let rep = lab.echo(b, a, false, 77);
    expect(
        "echo reply leaves pod 1",
        lab.from(1, &rep),
        PASS_ESTABLISHED,
    );
    expect("echo reply enters pod 0", lab.to(0, &rep), PASS_ESTABLISHED);
    let other = lab.echo(b, a, true, 78);
    expect(
        "pod 1 may not ping pod 0",
        lab.from(1, &other),
        DROP_POLICY_DENIED,
    );
    // Related: pod 1 answers pod 0's UDP with port unreachable.
    let dns = lab.udp(a, 33000, b, 53);
    expect("udp leaves pod 0", lab.from(0, &dns), PASS_POLICY);
    expect("udp enters pod 1", lab.to(1, &dns), PASS_POLICY);
    let err = lab.unreachable(b, a, &dns);
    expect("the error leaves pod 1", lab.from(1, &err), PASS_RELATED);
    expect("the error enters pod 0", lab.to(0, &err), PASS_RELATED);
    // The node (a router on the path) reports about pod 0's flow to the world.
    let out = lab.udp(a, 33001, Peer::World, 9000);
    expect("udp to the world", lab.from(0, &out), PASS_POLICY);
    let err = lab.unreachable(Peer::Host, a, &out);
    expect(
        "the node's error enters pod 0",
        lab.to(0, &err),
        PASS_RELATED,
    );
    // An error about a flow that does not exist is not related: pod 0's ingress denies it.
    let none = lab.udp(a, 33002, b, 53);
    let err = lab.unreachable(Peer::World, a, &none);
    expect("an unrelated error", lab.to(0, &err), DROP_POLICY_DENIED);
    // An error about a flow pod 1 never approved is not related on pod 1's side.
    let denied = lab.udp(a, 33003, b, 54);
    let err = lab.unreachable(b, a, &denied);
    expect(
        "an error pod 1 has no flow for",
        lab.from(1, &err),
        DROP_POLICY_DENIED,
    );
}

pub fn host_reaches_isolated_pod(fam: Fam) {
    let Some(mut lab) = Lab::new("host_reaches_isolated_pod", fam) else {
        return;
    };
    lab.register(1, BOTH);
    let probe = lab.tcp(Peer::Host, 50000, Peer::Pod(1), 8080, SYN);
    expect(
        "kubelet probe from the node",
        lab.to(1, &probe),
        PASS_POLICY,
    );
    let reply = lab.tcp(Peer::Pod(1), 8080, Peer::Host, 50000, SYN | ACK);
    expect("the probe's reply", lab.from(1, &reply), PASS_ESTABLISHED);
    let world = lab.tcp(Peer::World, 50000, Peer::Pod(1), 8080, SYN);
    expect(
        "the same from the world",
        lab.to(1, &world),
        DROP_POLICY_DENIED,
    );
    let out = lab.tcp(Peer::Pod(1), 50001, Peer::Host, 10250, SYN);
    expect(
        "egress to the node follows egress policy",
        lab.from(1, &out),
        DROP_POLICY_DENIED,
    );
}

/// SCTP rules match on the destination port as TCP and UDP rules do: an exact port and a port
/// range allow their ports only, TCP to the same port stays denied, the association's replies pass
/// through conntrack (keyed by ports), and an ICMP error quoting an SCTP packet is related.
pub fn sctp_ports_allowed_and_denied(fam: Fam) {
    let Some(mut lab) = Lab::new("sctp_ports_allowed_and_denied", fam) else {
        return;
    };
    lab.register(0, 0);
    lab.register(1, BOTH);
    lab.policy(1, INGRESS, IDENTITIES[0], SCTP, 80, ALLOW);
    lab.policy(
        1,
        INGRESS,
        IDENTITIES[0],
        SCTP,
        ANY_PORT,
        Lab::ranges(VERDICT_ALLOW, 9, &[(5000, 5010)]),
    );
    let (a, b) = (Peer::Pod(0), Peer::Pod(1));
    let init = lab.sctp(a, 40000, b, 80, SCTP_INIT);
    expect("INIT to port 80 leaves pod 0", lab.from(0, &init), PASS);
    expect(
        "INIT to port 80 enters pod 1",
        lab.to(1, &init),
        PASS_POLICY,
    );
    assert_eq!(
        ct_flags(&lab, a, 40000, b, 80, SCTP) & (SRC_OK | DST_OK),
        SRC_OK | DST_OK,
        "the association is keyed by its ports"
    );
    let ack = lab.sctp(b, 80, a, 40000, SCTP_INIT_ACK);
    expect(
        "INIT ACK leaves pod 1 (egress isolated, via conntrack)",
        lab.from(1, &ack),
        PASS_ESTABLISHED,
    );
    expect("INIT ACK enters pod 0", lab.to(0, &ack), PASS_ESTABLISHED);
    let other = lab.sctp(a, 40001, b, 81, SCTP_INIT);
    expect("INIT to port 81", lab.to(1, &other), DROP_POLICY_DENIED);
    assert!(
        lab.ct(a, 40001, b, 81, SCTP).is_none(),
        "a denied association leaves no entry"
    );
    let tcp = lab.tcp(a, 40002, b, 80, SYN);
    expect(
        "TCP to port 80 (the rule is SCTP's)",
        lab.to(1, &tcp),
        DROP_POLICY_DENIED,
    );
    for (port, want) in [
        (4999, DROP_POLICY_DENIED),
        (5000, PASS_POLICY),
        (5010, PASS_POLICY),
        (5011, DROP_POLICY_DENIED),
    ] {
        let p = lab.sctp(a, 40003, b, port, SCTP_INIT);
        expect(&format!("INIT to port {port}"), lab.to(1, &p), want);
    }
    // The same association seen from the other side: each one's ports, not the reverse.
    let reversed = lab.sctp(b, 40000, a, 80, SCTP_INIT);
    expect(
        "pod 1 opening its own association (egress isolated)",
        lab.from(1, &reversed),
        DROP_POLICY_DENIED,
    );
    // An ICMP error about the allowed association is related (the quoted ports are read).
    let err = lab.unreachable(b, a, &init);
    expect("the error leaves pod 1", lab.from(1, &err), PASS_RELATED);
    let denied_err = lab.unreachable(b, a, &other);
    expect(
        "an error about the denied association",
        lab.from(1, &denied_err),
        DROP_POLICY_DENIED,
    );
}
