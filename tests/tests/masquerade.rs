//! The agent's BPF masquerade for real: a node namespace running `weir agent
//! --masquerade-interfaces` on its veth to an "outside" namespace, pods through weir-cni (with
//! `ipMasq: true`, accepted). A TCP server outside sees the node's address for pod traffic; the
//! outside can route to the pools, so an untranslated flow would work too and show the pod's
//! address. Pod-to-pod traffic is not masqueraded (the server pod sees the client pod's address:
//! the positive control). 1,000 concurrent flows from 10 pods get distinct NAT ports in `weir
//! bpf nat list -o json` and all complete; `weir status` counts their pairs and entries against
//! the map's capacity. A restart without the flag removes the programs.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, TcpListener},
};

use serde_json::{Value, json};
use tests::{
    cni::{CniNode, Pod},
    echo::{connect, connect_from_each, peers, round_trip, serve},
    netns::{NetNs, VethPair},
    privileged::require_root,
};

const NODE: Ipv4Addr = Ipv4Addr::new(192, 168, 78, 2);
const OUTSIDE: Ipv4Addr = Ipv4Addr::new(192, 168, 78, 1);
const POOL: &str = "10.247.0.0/16";
const PODS: usize = 10;
const FLOWS_PER_POD: usize = 100;

fn weir(node: &CniNode, args: &[&str]) -> Value {
    tests::agent_proc::weir_json(&node.socket(), args)
}

/// The masquerade programs of the node's agent that run on `ifname`'s tcx hooks (read from the
/// kernel: the hooks' program ids against the pinned programs').
fn masq_on(node: &CniNode, ifname: &str) -> Vec<&'static str> {
    use aya::programs::{ProgramInfo, TcAttachType};
    let ifindex = node.ns.ifindex(ifname);
    let paths = node.root.paths();
    [
        ("masq_egress", TcAttachType::Egress),
        ("masq_ingress", TcAttachType::Ingress),
    ]
    .into_iter()
    .filter(|(name, hook)| {
        let id = ProgramInfo::from_pin(paths.prog_pin(name))
            .expect("the agent pinned the program")
            .id();
        node.ns
            .run(|| agent::attach::tcx::tcx_programs(ifindex, *hook))
            .contains(&id)
    })
    .map(|(name, _)| name)
    .collect()
}

#[test]
fn pods_reach_the_outside_as_the_node_and_each_flow_gets_its_own_port() {
    if !require_root("pods_reach_the_outside_as_the_node_and_each_flow_gets_its_own_port") {
        return;
    }
    let outside = NetNs::new();
    let node_ns = NetNs::new();
    let wire = VethPair::addressed(
        &outside,
        "x",
        &format!("{OUTSIDE}/24"),
        &node_ns,
        "m",
        &format!("{NODE}/24"),
    );
    // The outside could reach the pools through the node: an untranslated flow would work.
    outside.exec(&["ip", "route", "add", POOL, "via", &NODE.to_string()]);
    let node = CniNode::start_in(
        node_ns,
        &["--pool", POOL, "--masquerade-interfaces", &wire.b],
    );
    assert_eq!(
        masq_on(&node, &wire.b),
        vec!["masq_egress", "masq_ingress"],
        "both masquerade programs on the named interface"
    );
    let conf = node.conf(&json!({"ipMasq": true}));
    let pods: Vec<(Pod, Value)> = (0..PODS)
        .map(|_| {
            let pod = Pod::new();
            let result = node.add(&pod, &conf);
            (pod, result)
        })
        .collect();
    let addr = |i: usize| -> IpAddr { Pod::ipv4(&pods[i].1).parse().expect("pod address") };

    let listener = outside.run(|| TcpListener::bind((OUTSIDE, 0)).expect("bind"));
    let server = listener.local_addr().expect("addr");
    let accepted = serve(listener);

    // One flow: the server sees the node's address; the reply comes back.
    let mut one = connect(&pods[0].0.ns, server, 1);
    assert_eq!(peers(&accepted, 1), vec![IpAddr::V4(NODE)]);
    round_trip(&mut one);

    // Pod to pod: not masqueraded, the server pod sees the client pod's address.
    let pod_listener = pods[0]
        .0
        .ns
        .run(|| TcpListener::bind((addr(0), 0)).expect("bind"));
    let pod_server = pod_listener.local_addr().expect("addr");
    let pod_accepted = serve(pod_listener);
    let mut p2p = connect(&pods[1].0.ns, pod_server, 1);
    assert_eq!(peers(&pod_accepted, 1), vec![addr(1)]);
    round_trip(&mut p2p);

    // 1,000 concurrent flows from 10 pods.
    let mut streams = connect_from_each(pods.iter().map(|(pod, _)| &pod.ns), server, FLOWS_PER_POD);
    let total = PODS * FLOWS_PER_POD;
    assert!(
        peers(&accepted, total)
            .iter()
            .all(|p| *p == IpAddr::V4(NODE)),
        "every flow arrives from the node"
    );
    let listed = weir(&node, &["bpf", "nat", "list"]);
    let remote = server.to_string();
    let mut ports = BTreeSet::new();
    let mut flows = 0;
    for f in listed.as_array().expect("a list") {
        if f["remote"] != remote.as_str() {
            continue;
        }
        flows += 1;
        assert_eq!(f["reverse"], true, "{f}");
        let translated = f["translated"].as_str().expect("translated");
        let (ip, port) = translated.rsplit_once(':').expect("ADDRESS:PORT");
        assert_eq!(ip, NODE.to_string());
        ports.insert(port.parse::<u16>().expect("port"));
    }
    assert_eq!(flows, total + 1, "the 1,000 flows and the one before them");
    assert_eq!(ports.len(), flows, "every flow has its own NAT port");
    round_trip(&mut streams);
    // The NAT map's pressure as the agent reports it after its next sweep (every 10 s): the
    // pairs the programs created and the entries left, out of the map's capacity.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(40);
    loop {
        let nat = weir(&node, &["status"])["nat"].clone();
        let at_least = |field: &str, n: u64| nat[field].as_u64().is_some_and(|v| v >= n);
        let flows = u64::try_from(total + 1).expect("flows");
        if at_least("created", flows)
            && at_least("entries", 2 * flows)
            && at_least("capacity", 2 * flows)
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "weir status counts the flows' NAT pairs within 40 s: {nat}"
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    drop((streams, one, p2p));

    // A restart that does not name the interface: weir's programs leave it.
    let mut node = node;
    node.restart_agent_with(&["--pool", POOL]);
    assert!(
        masq_on(&node, &wire.b).is_empty(),
        "no masquerade program on an interface no longer named"
    );
    for (pod, result) in &pods {
        node.del(pod, &conf, Some(result));
    }
}
