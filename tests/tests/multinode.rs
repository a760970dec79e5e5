//! Three nodes on one kernel (DESIGN.md → "Nodes and routing"; `tests::multinode`): node namespaces on an
//! underlay bridge, a real etcd, one agent each, pods through `weir-cni`, native routing.
//!
//! - every node routes every other node's blocks (`ip route show proto 87`, computed from the blocks the
//!   agents report) and pods reach pods on every other node on TCP (every cross-node pair);
//! - `kill -9` of one agent: an established cross-node connection keeps carrying data while it is down; it
//!   restarts writing nothing (no route event under weir's protocol in `ip monitor`, map and program ids
//!   unchanged);
//! - a node removed (agent stopped, record deleted) has its routes swept on the others and its blocks
//!   reported by `weir ipam check`; `weir ipam release-node` frees them; a node added gets routes everywhere.

use std::{
    collections::BTreeSet,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use hyper::Method;
use ipam::{Ipam, store::etcd::EtcdStore};
use serde_json::Value;
use tests::{
    bin,
    etcd_netns::PORT,
    multinode::{Cluster, Node},
    netns::NetNs,
    netpol_probe::Servers,
    privileged::require_root,
};

/// Pods per node (the full size is 30; this keeps the run short).
const PODS: usize = 3;
const PORT_TCP: u16 = 8080;
/// How long a node's change may take to reach every other node's routes (listing every second).
const CONVERGE: Duration = Duration::from_secs(15);

/// The blocks node `node` reports for itself (`GET /v1/nodes`).
fn own_blocks(node: &Node) -> BTreeSet<String> {
    let nodes: Value = node
        .cni
        .agent
        .as_ref()
        .expect("running")
        .api(Method::GET, "/v1/nodes", None)
        .expect("nodes");
    nodes
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| n["name"] == node.name.as_str())
        .flat_map(|n| n["blocks"].as_array().cloned().unwrap_or_default())
        .filter_map(|b| b.as_str().map(str::to_owned))
        .collect()
}

/// The routes `node` must have: every other live node's blocks via that node's address.
fn expected_routes(cluster: &Cluster, node: &Node) -> BTreeSet<String> {
    cluster
        .live()
        .filter(|other| other.name != node.name)
        .flat_map(|other| {
            own_blocks(other)
                .into_iter()
                .map(move |b| format!("{b} via {}", other.address))
        })
        .collect()
}

/// `dest via next-hop` of weir's routes on `node`.
fn routes_of(node: &Node) -> BTreeSet<String> {
    node.weir_routes()
        .iter()
        .map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            format!("{} via {}", words[0], words.get(2).copied().unwrap_or("?"))
        })
        .collect()
}

fn wait_until(what: &str, bound: Duration, mut done: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + bound;
    loop {
        match done() {
            Ok(()) => return,
            Err(why) if Instant::now() >= deadline => {
                panic!("{what} within {} s: {why}", bound.as_secs())
            }
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

fn routes_converge(cluster: &Cluster) {
    wait_until(
        "every node routes every other node's blocks",
        CONVERGE,
        || {
            for node in cluster.live() {
                // A node with pods has a block, and knows it (its listing follows its claim within a second).
                if !node.pods.is_empty() && own_blocks(node).is_empty() {
                    return Err(format!("{} does not list its own blocks yet", node.name));
                }
            }
            for node in cluster.live() {
                let (want, have) = (expected_routes(cluster, node), routes_of(node));
                if want.is_empty() || want != have {
                    return Err(format!("{}: want {want:?}, have {have:?}", node.name));
                }
            }
            Ok(())
        },
    );
}

fn connects(from: &NetNs, to: &str) -> bool {
    let addr: SocketAddr = format!("{to}:{PORT_TCP}").parse().expect("addr");
    from.run(|| TcpStream::connect_timeout(&addr, Duration::from_millis(1500)).is_ok())
}

/// Every pod reaches every pod on every other node.
fn all_cross_node_pairs_connect(cluster: &Cluster) -> usize {
    let mut pairs = 0;
    for a in cluster.live() {
        for b in cluster.live().filter(|b| b.name != a.name) {
            for (from, _) in &a.pods {
                for (_, result) in &b.pods {
                    let to = tests::cni::Pod::ipv4(result);
                    assert!(
                        connects(&from.ns, &to),
                        "a pod on {} cannot reach {to} on {}\n{}: {}\n{}: {}",
                        a.name,
                        b.name,
                        a.name,
                        a.ip(&["route"]),
                        b.name,
                        b.ip(&["route"]),
                    );
                    pairs += 1;
                }
            }
        }
    }
    pairs
}

/// `weir ipam check -o json` on the cluster's etcd, run inside `ns` (a node).
fn ipam_check(ns: &NetNs) -> Value {
    let out = ns.exec(&[
        bin::weir().to_str().expect("utf-8 path"),
        "ipam",
        "--datastore",
        &Cluster::datastore(),
        "-o",
        "json",
        "check",
    ]);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "weir ipam check: {e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn weir_ipam(ns: &NetNs, args: &[&str]) -> std::process::Output {
    let weir = bin::weir();
    let datastore = Cluster::datastore();
    let mut all = vec![
        weir.to_str().expect("utf-8 path"),
        "ipam",
        "--datastore",
        &datastore,
    ];
    all.extend_from_slice(args);
    ns.try_exec(&all).expect("run weir ipam")
}

fn delete_record(infra: &NetNs, name: &str) {
    infra.run(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let store = EtcdStore::connect(&[format!("http://127.0.0.1:{PORT}")])
                .await
                .expect("connect to etcd");
            assert!(
                Ipam::new(store).delete_node(name).await.expect("delete"),
                "{name} had a record"
            );
        });
    });
}

#[test]
fn three_nodes_route_pods_to_each_other_survive_an_agent_kill_and_follow_nodes_leaving_and_joining()
{
    if !require_root(
        "three_nodes_route_pods_to_each_other_survive_an_agent_kill_and_follow_nodes_leaving_and_joining",
    ) {
        return;
    }
    let mut cluster = Cluster::new(&["--node-expiry", "30"]);
    let mut servers = Vec::new();
    for i in 0..3 {
        let node = cluster.add_node();
        for p in 0..PODS {
            node.add_pod(&format!("wt-ns{}", p % 2), &format!("pod-{i}-{p}"));
        }
        for (pod, _) in &node.pods {
            servers.push(Servers::start(&pod.ns, &[PORT_TCP], &[]));
        }
    }
    routes_converge(&cluster);
    let pairs = all_cross_node_pairs_connect(&cluster);
    assert_eq!(
        pairs,
        3 * 2 * PODS * PODS,
        "every cross-node pair was tried"
    );

    // An established connection from a pod on node 1 to a pod on node 0, across node 0's agent's kill -9.
    let target = tests::cni::Pod::ipv4(&cluster.node(0).pods[0].1);
    let echo_ns = &cluster.node(0).pods[0].0.ns;
    let _echo = EchoServer::start(echo_ns, 9090);
    let addr: SocketAddr = format!("{target}:9090").parse().expect("addr");
    let mut conn = cluster.node(1).pods[0]
        .0
        .ns
        .run(|| TcpStream::connect_timeout(&addr, Duration::from_secs(2)))
        .expect("connect to the echo server");
    conn.set_read_timeout(Some(Duration::from_secs(3)))
        .expect("timeout");
    let echo = |conn: &mut TcpStream, what: &str| {
        conn.write_all(what.as_bytes()).expect("send");
        let mut buf = vec![0u8; what.len()];
        conn.read_exact(&mut buf).expect("the echo comes back");
        assert_eq!(buf, what.as_bytes());
    };
    echo(&mut conn, "before");
    let (maps_before, programs_before) = ids(cluster.node(0));
    let routes_before = cluster.node(0).weir_routes();
    // Every route event in node 0 while its agent is away and back.
    let monitor = RouteMonitor::start(&cluster.node(0).cni.ns);
    cluster.node_mut(0).cni.kill_agent();
    echo(&mut conn, "while the agent is down");
    assert!(
        connects(&cluster.node(2).pods[0].0.ns, &target),
        "a new connection while the agent is down"
    );
    cluster.node_mut(0).cni.restart_agent();
    // Let the restarted agent list the nodes and reconcile.
    std::thread::sleep(Duration::from_secs(3));
    echo(&mut conn, "after");
    let events = monitor.stop();
    assert!(
        events.iter().all(|e| !e.contains("proto 87")),
        "the restart wrote routes: {events:?}"
    );
    assert_eq!(cluster.node(0).weir_routes(), routes_before);
    assert_eq!(ids(cluster.node(0)), (maps_before, programs_before));
    drop(conn);

    // Node 2 leaves: its agent stops, its record is deleted; the others sweep its routes.
    let gone = cluster.node(2).name.clone();
    let gone_blocks = own_blocks(cluster.node(2));
    assert!(!gone_blocks.is_empty());
    cluster.node_mut(2).cni.stop_agent();
    delete_record(&cluster.infra, &gone);
    let node2 = cluster.nodes[2].take().expect("node 2");
    routes_converge(&cluster);
    for node in cluster.live() {
        let have = routes_of(node);
        assert!(
            gone_blocks
                .iter()
                .all(|b| !have.iter().any(|r| r.starts_with(&format!("{b} ")))),
            "{} still routes {gone}'s blocks: {have:?}",
            node.name
        );
    }
    let check = ipam_check(&cluster.node(0).cni.ns);
    let leaks: Vec<String> = check["leaks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l.as_str().map(str::to_owned))
        .collect();
    for block in &gone_blocks {
        assert!(
            leaks
                .iter()
                .any(|l| l.contains(block.as_str()) && l.contains(&gone)),
            "weir ipam check does not report {gone}'s block {block}: {leaks:?}"
        );
    }
    assert!(
        leaks
            .iter()
            .all(|l| !l.contains("wt-node-0") && !l.contains("wt-node-1")),
        "a live node's block reported: {leaks:?}"
    );
    let released = weir_ipam(
        &cluster.node(0).cni.ns,
        &["-o", "json", "release-node", &gone],
    );
    assert!(
        released.status.success(),
        "release-node: {}",
        String::from_utf8_lossy(&released.stderr)
    );
    let report: Value = serde_json::from_slice(&released.stdout).expect("json");
    assert_eq!(
        report["blocks"].as_array().map(Vec::len),
        Some(gone_blocks.len())
    );
    // A live node is refused without --force (positive control: it has blocks to release).
    let live = weir_ipam(&cluster.node(0).cni.ns, &["release-node", "wt-node-1"]);
    assert!(!live.status.success(), "a live node's blocks were released");
    assert!(String::from_utf8_lossy(&live.stderr).contains("is live"));
    drop(node2);

    // A node joins: every node routes its blocks, and its pod reaches the others' and is reached.
    let node3 = cluster.add_node();
    node3.add_pod("wt-ns0", "pod-3-0");
    servers.push(Servers::start(&node3.pods[0].0.ns, &[PORT_TCP], &[]));
    routes_converge(&cluster);
    all_cross_node_pairs_connect(&cluster);
}

/// Map ids and program ids of a node's agent, from its pins (bpftool).
fn ids(node: &Node) -> (Vec<(String, u64)>, Vec<(String, u64)>) {
    let agent = node.cni.agent.as_ref().expect("running");
    let mut maps = agent.map_ids();
    maps.sort();
    let mut programs: Vec<(String, u64)> = agent.started["programs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            (
                p[0].as_str().unwrap_or_default().to_owned(),
                p[1].as_u64().unwrap_or_default(),
            )
        })
        .collect();
    programs.sort();
    (maps, programs)
}

/// `ip -o monitor route` inside a namespace, collected until stopped.
struct RouteMonitor {
    child: std::process::Child,
}

impl RouteMonitor {
    fn start(ns: &NetNs) -> Self {
        let child = Command::new("ip")
            .args(["netns", "exec", ns.name(), "ip", "-o", "monitor", "route"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("ip monitor");
        // It must be listening before anything happens.
        std::thread::sleep(Duration::from_millis(300));
        Self { child }
    }

    fn stop(mut self) -> Vec<String> {
        let _ = self.child.kill();
        let mut out = String::new();
        if let Some(mut stdout) = self.child.stdout.take() {
            let _ = stdout.read_to_string(&mut out);
        }
        let _ = self.child.wait();
        out.lines().map(str::to_owned).collect()
    }
}

impl Drop for RouteMonitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TCP echo server in a namespace (one connection at a time), stopped with the test.
struct EchoServer;

impl EchoServer {
    fn start(ns: &NetNs, port: u16) -> Self {
        let listener = ns.run(|| std::net::TcpListener::bind(("0.0.0.0", port)).expect("listen"));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { break };
                std::thread::spawn(move || {
                    let mut buf = [0u8; 256];
                    while let Ok(n) = conn.read(&mut buf) {
                        if n == 0 || conn.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        Self
    }
}
