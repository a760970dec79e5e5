//! BPF host routing (`--host-routing`, `ebpf/src/host_fwd.rs`), checked from outside on two node namespaces
//! (`tests::multinode`, native routing, real etcd) with one pod each:
//!
//! - `bpf` (the default): the pinned `host_fwd_v1` holds the pinned `host_fwd` and `host_fwd_in` programs
//!   (`bpftool`), and a stream of UDP datagrams from node 0's pod to node 1's pod arrives while neither node's
//!   kernel forwards more than a few of them (`Ip: ForwDatagrams` in each node's `/proc/net/snmp`: node 0's
//!   would count them leaving, node 1's arriving; the first packets, sent before a neighbour entry exists,
//!   go through the kernel);
//!   Node 1 hands them to its pod's side of the veth after `to_endpoint` judged them (`bpf_redirect_peer`):
//!   the pod's host-side veth transmits almost none of them (its `tx_packets`);
//! - `kernel` (the positive control, same traffic, both agents restarted with it): the slots are empty and
//!   both nodes' kernels forward every datagram that arrives;
//! - restarts with the other mode switch the slots, both ways.

use std::{
    net::{Ipv4Addr, UdpSocket},
    time::{Duration, Instant},
};

use tests::{bpf::bpftool, multinode::Cluster, netns::NetNs, privileged::require_root};

/// Datagrams per stream.
const DATAGRAMS: u64 = 3_000;
/// How long routes may take to appear (node records through etcd).
const ROUTES_BOUND: Duration = Duration::from_secs(45);
/// The receiver's port.
const PORT: u16 = 9_310;

/// `Ip: ForwDatagrams` of the namespace.
fn forwarded(ns: &NetNs) -> u64 {
    let out = ns.exec(&["cat", "/proc/net/snmp"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let mut ip = text.lines().filter(|l| l.starts_with("Ip:"));
    let (names, values) = (
        ip.next().expect("an Ip: header line"),
        ip.next().expect("an Ip: values line"),
    );
    let at = names
        .split_whitespace()
        .position(|n| n == "ForwDatagrams")
        .expect("ForwDatagrams in /proc/net/snmp");
    values
        .split_whitespace()
        .nth(at)
        .and_then(|v| v.parse().ok())
        .expect("a ForwDatagrams count")
}

/// The program id in slot `at` of the pinned `host_fwd_v1` under the node's pin root (`None`: empty).
fn slot(cluster: &Cluster, node: usize, at: u32) -> Option<u64> {
    let pin = cluster
        .node(node)
        .cni
        .root
        .paths()
        .map_pin(maps_schema::maps::HOST_FWD);
    let dump = bpftool(&["map", "dump", "pinned", &pin.display().to_string()]);
    dump.as_array()
        .into_iter()
        .flatten()
        .find(|e| e["formatted"]["key"] == at)
        .and_then(|e| e["formatted"]["value"].as_u64())
}

/// `tx_packets` of the node's first workload veth (`weir…`, host side).
fn workload_tx(ns: &NetNs) -> u64 {
    let out = ns.exec(&["ip", "-j", "-s", "link", "show"]);
    let links: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ip -j link");
    links
        .as_array()
        .into_iter()
        .flatten()
        .find(|l| {
            l["ifname"]
                .as_str()
                .is_some_and(|n| n.starts_with(maps_schema::programs::WORKLOAD_LINK_PREFIX))
        })
        .and_then(|l| l["stats64"]["tx"]["packets"].as_u64())
        .expect("the node's workload veth with its counters")
}

/// The id of the node's pinned program `name`.
fn program_id(cluster: &Cluster, node: usize, name: &str) -> u64 {
    let pin = cluster.node(node).cni.root.paths().prog_pin(name);
    bpftool(&["prog", "show", "pinned", &pin.display().to_string()])["id"]
        .as_u64()
        .unwrap_or_else(|| panic!("the pinned {name} has an id"))
}

/// What a stream did: datagrams arrived, forwarded by each node's kernel, sent by node 1's pod's host veth.
struct Stream {
    arrived: u64,
    kernel_forwarded: [u64; 2],
    veth_sent: u64,
}

/// Sends `DATAGRAMS` datagrams from node 0's pod to node 1's pod.
fn stream(cluster: &Cluster, to: Ipv4Addr) -> Stream {
    let receiver = cluster.node(1).pods[0]
        .0
        .ns
        .run(|| UdpSocket::bind((to, PORT)))
        .expect("bind the receiver");
    receiver
        .set_read_timeout(Some(Duration::from_millis(500)))
        .expect("timeout");
    let before = [0, 1].map(|i| forwarded(&cluster.node(i).cni.ns));
    let tx_before = workload_tx(&cluster.node(1).cni.ns);
    let counter = std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        let mut n = 0u64;
        // Until the stream ends (a quiet half second), bounded.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut started = false;
        while Instant::now() < deadline {
            match receiver.recv(&mut buf) {
                Ok(_) => {
                    n += 1;
                    started = true;
                }
                Err(_) if started => break,
                Err(_) => {}
            }
        }
        n
    });
    cluster.node(0).pods[0].0.ns.run(|| {
        let sender = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).expect("bind the sender");
        for i in 0..DATAGRAMS {
            sender
                .send_to(&i.to_be_bytes(), (to, PORT))
                .expect("send a datagram");
            // Paced a little: the receiver's socket buffer must not be what loses datagrams.
            if i % 100 == 99 {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    });
    let arrived = counter.join().expect("the receiver");
    let after = [0, 1].map(|i| forwarded(&cluster.node(i).cni.ns));
    Stream {
        arrived,
        kernel_forwarded: [after[0] - before[0], after[1] - before[1]],
        veth_sent: workload_tx(&cluster.node(1).cni.ns) - tx_before,
    }
}

fn wait_for_routes(cluster: &Cluster) {
    for (me, other) in [(0, 1), (1, 0)] {
        let via = format!("via {}", cluster.node(other).address);
        tests::wait::until_ok(
            &format!("node {me} has a weir route {via}"),
            ROUTES_BOUND,
            || {
                let routes = cluster.node(me).weir_routes();
                if routes.iter().any(|r| r.contains(&via)) {
                    Ok(())
                } else {
                    Err(format!("its routes: {routes:?}"))
                }
            },
        );
    }
}

/// Checks the slots and the traffic under `mode` ("bpf" or "kernel") on both nodes.
fn holds(cluster: &Cluster, to: Ipv4Addr, mode: &str) {
    use maps_schema::{
        maps::{HOST_FWD_IN_SLOT, HOST_FWD_SLOT},
        programs::{HOST_FWD, HOST_FWD_IN},
    };
    let Stream {
        arrived,
        kernel_forwarded,
        veth_sent,
    } = stream(cluster, to);
    eprintln!(
        "--host-routing {mode}: {arrived} of {DATAGRAMS} arrived, the nodes' kernels forwarded {kernel_forwarded:?}, node 1's veth sent {veth_sent}"
    );
    if mode == "bpf" {
        assert!(
            veth_sent <= DATAGRAMS / 20,
            "--host-routing bpf: node 1's pod veth transmitted {veth_sent} of {DATAGRAMS} datagrams"
        );
    } else {
        assert!(
            veth_sent >= arrived,
            "--host-routing kernel: node 1's pod veth transmitted {veth_sent}, fewer than the {arrived} that arrived"
        );
    }
    assert!(
        arrived >= DATAGRAMS * 9 / 10,
        "--host-routing {mode}: only {arrived} of {DATAGRAMS} datagrams arrived"
    );
    for (node, forwarded) in kernel_forwarded.into_iter().enumerate() {
        let slots = [HOST_FWD_SLOT, HOST_FWD_IN_SLOT].map(|at| slot(cluster, node, at));
        if mode == "bpf" {
            assert_eq!(
                slots,
                [HOST_FWD, HOST_FWD_IN].map(|name| Some(program_id(cluster, node, name))),
                "node {node}: host_fwd_v1's slots hold the pinned host_fwd and host_fwd_in"
            );
            assert!(
                forwarded <= DATAGRAMS / 20,
                "--host-routing bpf: node {node}'s kernel forwarded {forwarded} of {DATAGRAMS} datagrams"
            );
        } else {
            assert_eq!(
                slots,
                [None, None],
                "node {node}: host_fwd_v1's slots are empty"
            );
            assert!(
                forwarded >= arrived,
                "--host-routing kernel: node {node}'s kernel forwarded {forwarded}, fewer than the {arrived} that arrived"
            );
        }
    }
}

/// Restarts every agent with its flags and `more`.
fn restart_all(cluster: &mut Cluster, flags: &[Vec<String>], more: &[&str]) {
    for (node, flags) in flags.iter().enumerate() {
        let mut all: Vec<&str> = flags.iter().map(String::as_str).collect();
        all.extend_from_slice(more);
        cluster.node_mut(node).cni.restart_agent_with(&all);
    }
}

#[test]
fn bpf_host_routing_forwards_pod_traffic_past_the_kernel_and_kernel_mode_does_not() {
    if !require_root(
        "bpf_host_routing_forwards_pod_traffic_past_the_kernel_and_kernel_mode_does_not",
    ) {
        return;
    }
    let mut cluster = Cluster::new(&[]);
    cluster.add_node().add_pod("default", "hr-a");
    let to: Ipv4Addr = cluster
        .add_node()
        .add_pod("default", "hr-b")
        .parse()
        .expect("an IPv4 pod");
    wait_for_routes(&cluster);
    holds(&cluster, to, "bpf");
    let flags: Vec<Vec<String>> = (0..2)
        .map(|i| cluster.node(i).cni.flags().to_vec())
        .collect();
    restart_all(&mut cluster, &flags, &["--host-routing", "kernel"]);
    holds(&cluster, to, "kernel");
    restart_all(&mut cluster, &flags, &[]);
    holds(&cluster, to, "bpf");
}
