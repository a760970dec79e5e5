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
    netpol::{Model, ModelPod, Proto, Source, labels, match_labels},
    netpol_policies::{from_both, from_namespaces, from_pods, policy, port},
    netpol_probe::Servers,
    pod_doc::{write_atomically, write_pod},
    privileged::require_root,
};

/// Pods per node (the full size is 30; this keeps the run short).
const PODS: usize = 10;
const PORT_TCP: u16 = 8080;
/// How long a node's change may take to reach every other node's routes (listing every second; etcd on
/// this shared disk sometimes takes seconds to answer, and a request gives up after 10 s).
const CONVERGE: Duration = Duration::from_secs(45);

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
            let (namespace, name) = pod_name(i, p);
            // Its labels reach its own node only: the others learn them from its endpoint record.
            write_pod(
                &node.cni.dirs.path("policies"),
                &namespace,
                &name,
                &[("app", APPS[(i + p) % APPS.len()])],
                &[],
            );
            node.add_pod(&namespace, &name);
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

    // The policy matrix: pods of other nodes are judged by their identities (from their endpoint records).
    let mut pod_labels: Vec<Vec<&str>> = (0..3)
        .map(|i| (0..PODS).map(|p| APPS[(i + p) % APPS.len()]).collect())
        .collect();
    write_policies(&cluster);
    let model = model();
    assert!(
        matrix_holds(&cluster, &model, &pod_labels),
        "the policy matrix does not hold across nodes"
    );
    // A label change on node 0's pod changes what the other nodes' pods may reach.
    let (namespace, name) = pod_name(0, 0);
    let relabelled = if pod_labels[0][0] == "db" {
        "api"
    } else {
        "db"
    };
    write_pod(
        &cluster.node(0).cni.dirs.path("policies"),
        &namespace,
        &name,
        &[("app", relabelled)],
        &[],
    );
    pod_labels[0][0] = relabelled;
    assert!(
        matrix_holds(&cluster, &model, &pod_labels),
        "the policy matrix does not follow a label change on node 0"
    );
    // Identity agreement: node 1 knows node 0's pods by the identities node 0 gives them
    // (`weir status --all-addresses`, the operator's view).
    identities_agree(&cluster);
    // The rest runs without policies.
    for node in cluster.live() {
        write_atomically(&node.cni.dirs.path("policies"), "policies.yaml", "");
    }
    wait_until("every pair connects again", CONVERGE, || {
        if matrix_holds_once(&cluster, &Model::default(), &pod_labels).is_empty() {
            Ok(())
        } else {
            Err("some pairs are still denied".into())
        }
    });

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

fn identities_agree(cluster: &Cluster) {
    let (a, b) = (cluster.node(0), cluster.node(1));
    let own: Vec<Value> = a
        .cni
        .agent
        .as_ref()
        .expect("running")
        .api(Method::GET, "/v1/endpoints", None)
        .expect("endpoints");
    let own: std::collections::BTreeMap<String, u64> = own
        .iter()
        .flat_map(|e| {
            let id = e["identity"].as_u64().expect("an identity");
            e["ips"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter_map(move |ip| ip.as_str().map(|ip| (ip.to_owned(), id)))
        })
        .collect();
    assert_eq!(own.len(), PODS, "node 0's own endpoints");
    let socket = b.cni.socket();
    let out = b.cni.ns.exec(&[
        bin::weir().to_str().expect("utf-8 path"),
        "status",
        "--all-addresses",
        "-o",
        "json",
        "--api-socket",
        socket.to_str().expect("utf-8 path"),
    ]);
    let listed: Vec<Value> = serde_json::from_slice(&out.stdout).expect("json");
    let seen: std::collections::BTreeMap<String, u64> = listed
        .iter()
        .filter(|x| x["node"] == a.name.as_str())
        .filter_map(|a| Some((a["ip"].as_str()?.to_owned(), a["identity"].as_u64()?)))
        .collect();
    assert_eq!(seen, own, "node 1's view of node 0's pods: {listed:?}");
    assert!(
        listed.iter().any(|x| x["node"] == b.name.as_str()),
        "node 1 lists its own pods too"
    );
}

const APPS: [&str; 3] = ["web", "db", "api"];

fn pod_name(node: usize, pod: usize) -> (String, String) {
    (format!("wt-ns{}", pod % 2), format!("pod-{node}-{pod}"))
}

fn namespaces() -> Vec<(&'static str, Vec<(&'static str, &'static str)>)> {
    vec![
        ("wt-ns0", vec![("team", "a")]),
        ("wt-ns1", vec![("team", "b")]),
    ]
}

/// Five policies with selectors across namespaces (and so across nodes: every namespace has pods on
/// every node).
fn policies() -> Vec<k8s_openapi::api::networking::v1::NetworkPolicy> {
    let app = |a: &str| match_labels(&[("app", a)]);
    let team = |t: &str| match_labels(&[("team", t)]);
    vec![
        // db in wt-ns0 takes api of its own namespace only.
        policy("wt-ns0", "db-from-api", app("db"))
            .ingress(vec![from_pods(app("api"))], vec![port(Proto::Tcp, 8080)])
            .build(),
        // web in wt-ns1 takes anything from team a's namespaces.
        policy("wt-ns1", "web-from-team-a", app("web"))
            .ingress(vec![from_namespaces(team("a"))], vec![])
            .build(),
        // db in wt-ns1 takes api of team a only.
        policy("wt-ns1", "db-from-a-api", app("db"))
            .ingress(vec![from_both(team("a"), app("api"))], vec![])
            .build(),
        // api in wt-ns0 may only reach db and web pods (any namespace of team b, or its own).
        policy("wt-ns0", "api-egress", app("api"))
            .types(&["Egress"])
            .egress(vec![from_pods(app("db"))], vec![])
            .egress(vec![from_both(team("b"), app("web"))], vec![])
            .build(),
        // web in wt-ns0 takes web pods of any namespace.
        policy("wt-ns0", "web-from-web", app("web"))
            .ingress(vec![from_both(match_labels(&[]), app("web"))], vec![])
            .build(),
    ]
}

fn model() -> Model {
    Model {
        namespaces: namespaces()
            .into_iter()
            .map(|(n, l)| (n.to_owned(), labels(&l)))
            .collect(),
        policies: policies(),
        named_ports: Default::default(),
    }
}

/// The same namespaces and policies on every node (each node's own directory).
fn write_policies(cluster: &Cluster) {
    let text = model().manifest();
    for node in cluster.live() {
        write_atomically(&node.cni.dirs.path("policies"), "policies.yaml", &text);
    }
}

/// Every ordered pair of pods whose TCP result differs from the model: (from, to, expected).
fn matrix_holds_once(
    cluster: &Cluster,
    model: &Model,
    pod_labels: &[Vec<&str>],
) -> Vec<(String, String, bool)> {
    let pods: Vec<(String, ModelPod, &NetNs, String)> = cluster
        .live()
        .enumerate()
        .flat_map(|(i, node)| {
            node.pods.iter().enumerate().map(move |(p, (pod, result))| {
                let (namespace, name) = pod_name(i, p);
                let app = pod_labels
                    .get(i)
                    .and_then(|l| l.get(p))
                    .copied()
                    .unwrap_or("none");
                (
                    name,
                    ModelPod {
                        namespace,
                        labels: labels(&[("app", app)]),
                    },
                    &pod.ns,
                    tests::cni::Pod::ipv4(result),
                )
            })
        })
        .collect();
    std::thread::scope(|scope| {
        let threads: Vec<_> = pods
            .iter()
            .map(|(from, from_model, ns, _)| {
                let pods = &pods;
                scope.spawn(move || {
                    let mut wrong = Vec::new();
                    for (to, to_model, _, ip) in pods.iter().filter(|(to, ..)| to != from) {
                        let want = model.allows(Source::Pod(from_model), to_model, PORT_TCP);
                        let addr: SocketAddr = format!("{ip}:{PORT_TCP}").parse().expect("addr");
                        let got = ns.run(|| {
                            TcpStream::connect_timeout(&addr, Duration::from_millis(400)).is_ok()
                        });
                        if got != want {
                            wrong.push((from.clone(), to.clone(), want));
                        }
                    }
                    wrong
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().expect("probe thread"))
            .collect()
    })
}

/// The matrix holds within the convergence bound (policies hot-reload, endpoint records every second).
fn matrix_holds(cluster: &Cluster, model: &Model, pod_labels: &[Vec<&str>]) -> bool {
    let deadline = Instant::now() + CONVERGE;
    let mut allowed_and_denied = (false, false);
    loop {
        let wrong = matrix_holds_once(cluster, model, pod_labels);
        if wrong.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            eprintln!("pairs that differ from the model (from, to, expected): {wrong:?}");
            return false;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    // The matrix must have both outcomes, or it proves nothing.
    let pods: Vec<ModelPod> = (0..3)
        .flat_map(|i| {
            (0..PODS).map(move |p| ModelPod {
                namespace: pod_name(i, p).0,
                labels: labels(&[("app", pod_labels[i][p])]),
            })
        })
        .collect();
    for a in &pods {
        for b in &pods {
            if model.allows(Source::Pod(a), b, PORT_TCP) {
                allowed_and_denied.0 = true;
            } else {
                allowed_and_denied.1 = true;
            }
        }
    }
    assert!(
        allowed_and_denied == (true, true),
        "the model allows or denies everything"
    );
    true
}

/// Map ids and program ids of a node's agent, from its pins (bpftool).
type Ids = Vec<(String, u64)>;

fn ids(node: &Node) -> (Ids, Ids) {
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
