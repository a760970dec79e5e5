//! `masq_egress`/`masq_ingress` on a real interface: a node namespace between ten pod namespaces
//! and an "outside" one. A TCP server outside sees the node's address for pod traffic (and the
//! pod's own address while the outside is listed as a pool: the positive control on the
//! program's decision); pod-to-pod traffic is not masqueraded; 1,000 concurrent flows from 10
//! pods get distinct NAT ports (read from `nat4_v1`) and all complete.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, TcpListener},
};

use aya::{
    maps::{HashMap, LpmTrie, lpm_trie::Key},
    programs::TcAttachType,
};
use maps_schema::{
    MasqCidr, MasqInterface, Nat4Entry, Nat4Key, maps,
    nat::{DIR_EGRESS, PORT_MAX, PORT_MIN},
    programs::{MASQ_EGRESS, MASQ_INGRESS},
};
use tests::{
    bpf::{PinRoot, load_weir, tc},
    echo::{connect, connect_from_each, peers, round_trip, serve},
    netns::{NetNs, VethPair},
    privileged::require_root,
};

const NODE: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 2);
const OUTSIDE: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 1);
const GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 246, 0, 1);
const PODS: usize = 10;
const FLOWS_PER_POD: usize = 100;

fn pod_addr(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 246, 0, 10 + u8::try_from(i).expect("few pods"))
}

#[test]
fn pod_traffic_leaves_with_the_node_address_and_replies_come_back() {
    if !require_root("pod_traffic_leaves_with_the_node_address_and_replies_come_back") {
        return;
    }
    let root = PinRoot::new();
    let node = NetNs::new();
    let outside = NetNs::new();
    node.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    let wire = VethPair::addressed(
        &node,
        "m",
        &format!("{NODE}/24"),
        &outside,
        "x",
        &format!("{OUTSIDE}/24"),
    );
    // The outside could reach the pools through the node, so an untranslated flow would work too.
    outside.exec(&[
        "ip",
        "route",
        "add",
        "10.246.0.0/16",
        "via",
        &NODE.to_string(),
    ]);
    let pods: Vec<NetNs> = (0..PODS).map(|_| NetNs::new()).collect();
    let mut veths = Vec::new();
    for (i, pod) in pods.iter().enumerate() {
        let v = VethPair::new(&node, "h", pod, "p");
        node.exec(&["ip", "addr", "add", &format!("{GATEWAY}/32"), "dev", &v.a]);
        node.exec(&[
            "ip",
            "route",
            "add",
            &format!("{}/32", pod_addr(i)),
            "dev",
            &v.a,
        ]);
        pod.exec(&[
            "ip",
            "addr",
            "add",
            &format!("{}/32", pod_addr(i)),
            "dev",
            &v.b,
        ]);
        pod.exec(&["ip", "route", "add", &format!("{GATEWAY}/32"), "dev", &v.b]);
        pod.exec(&[
            "ip",
            "route",
            "add",
            "default",
            "via",
            &GATEWAY.to_string(),
            "dev",
            &v.b,
        ]);
        veths.push(v);
    }

    let mut ebpf = load_weir(&root);
    let ifindex = node.ifindex(&wire.a);
    HashMap::<_, u32, MasqInterface>::try_from(ebpf.map_mut(maps::MASQ_IF).expect("masq_if"))
        .expect("hash")
        .insert(
            &ifindex,
            &MasqInterface {
                addr: NODE.octets(),
                flags: 0,
            },
            0,
        )
        .expect("insert masq_if");
    let outside_as_pool = Key::new(24, [192, 168, 77, 0]);
    {
        let mut cidrs: LpmTrie<_, [u8; 4], MasqCidr> =
            LpmTrie::try_from(ebpf.map_mut(maps::MASQ_CIDR4).expect("masq_cidr4")).expect("lpm");
        cidrs
            .insert(&Key::new(16, [10, 246, 0, 0]), &MasqCidr::default(), 0)
            .expect("pool");
        cidrs
            .insert(&outside_as_pool, &MasqCidr::default(), 0)
            .expect("control");
    }
    for (name, hook) in [
        (MASQ_EGRESS, TcAttachType::Egress),
        (MASQ_INGRESS, TcAttachType::Ingress),
    ] {
        let prog = tc(&mut ebpf, name);
        let pin = root.path().join(format!("link_{name}"));
        node.run(|| agent::attach::attach_tc(prog, name, &wire.a, hook, &pin))
            .unwrap_or_else(|e| panic!("attach {name}: {e}"));
    }

    let listener = outside.run(|| TcpListener::bind((OUTSIDE, 0)).expect("bind"));
    let server = listener.local_addr().expect("addr");
    let accepted = serve(listener);

    // Control: the outside listed as a pool is never masqueraded to: the server sees the pod.
    let mut control = connect(&pods[0], server, 1);
    assert_eq!(peers(&accepted, 1), vec![IpAddr::V4(pod_addr(0))]);
    round_trip(&mut control);
    // Its later packets (a delayed ACK, its close) leave after the control CIDR goes, and are
    // translated then: it is left out of the count below.
    let control_port = control[0].local_addr().expect("addr").port();
    LpmTrie::<_, [u8; 4], MasqCidr>::try_from(ebpf.map_mut(maps::MASQ_CIDR4).expect("map"))
        .expect("lpm")
        .remove(&outside_as_pool)
        .expect("remove the control CIDR");

    // Now the outside is outside: the server sees the node's address.
    let mut one = connect(&pods[0], server, 1);
    assert_eq!(peers(&accepted, 1), vec![IpAddr::V4(NODE)]);
    round_trip(&mut one);

    // Pod to pod is not masqueraded: the server pod sees the client pod's address.
    let pod_listener = pods[0].run(|| TcpListener::bind((pod_addr(0), 0)).expect("bind"));
    let pod_server = pod_listener.local_addr().expect("addr");
    let pod_accepted = serve(pod_listener);
    let mut p2p = connect(&pods[1], pod_server, 1);
    assert_eq!(peers(&pod_accepted, 1), vec![IpAddr::V4(pod_addr(1))]);
    round_trip(&mut p2p);

    // 1,000 concurrent flows from 10 pods: all open at once, all from the node's address.
    let mut streams = connect_from_each(&pods, server, FLOWS_PER_POD);
    let total = PODS * FLOWS_PER_POD;
    assert_eq!(streams.len(), total);
    let seen = peers(&accepted, total);
    assert!(
        seen.iter().all(|p| *p == IpAddr::V4(NODE)),
        "every flow arrives from the node"
    );
    let nat: HashMap<_, Nat4Key, Nat4Entry> =
        HashMap::try_from(ebpf.map(maps::NAT4).expect("nat4")).expect("hash");
    let mut ports = BTreeSet::new();
    let mut flows = 0;
    for entry in nat.iter() {
        let (k, v) = entry.expect("read nat4");
        let is_control = k.saddr == pod_addr(0).octets() && k.sport == control_port;
        if k.direction == DIR_EGRESS
            && k.daddr == OUTSIDE.octets()
            && k.dport == server.port()
            && !is_control
        {
            flows += 1;
            assert_eq!(v.addr, NODE.octets());
            assert!((PORT_MIN..=PORT_MAX).contains(&v.port));
            ports.insert(v.port);
        }
    }
    // The 1,000 flows and the one before them.
    assert_eq!(flows, total + 1, "one egress entry per masqueraded flow");
    assert_eq!(ports.len(), flows, "every flow has its own NAT port");
    round_trip(&mut streams);
    drop(veths);
}
