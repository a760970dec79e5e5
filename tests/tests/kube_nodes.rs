//! Kubernetes Node objects as node records (`--source kubernetes`; DESIGN.md → "Nodes and routing"): two
//! node namespaces on an underlay bridge (`tests::multinode`), a real etcd as the shared IPAM datastore, one
//! test API server (`tests::kube_api`, on the infra namespace's bridge address) serving Node, Pod, Namespace
//! and NetworkPolicy objects, an agent per node with `--source kubernetes`, pods through `weir-cni`:
//!
//! - each node routes the other's blocks (`ip route show proto 87`, computed from the blocks each agent
//!   reports for itself) via the address of its Node object, and `GET /v1/nodes` says they come from
//!   Kubernetes; Nodes without an address or with an unparsable one are left out, and nothing panics;
//! - a pod on A reaches a pod on B over TCP, and B's NetworkPolicy judges A's pods by the identities of
//!   their Pod objects (one allowed, one not); A lists B's pod in `GET /v1/addresses` with B's identity
//!   for it;
//! - deleting B's Node object sweeps A's routes to B within a bound; re-adding it restores them;
//! - B not Ready for a moment keeps its routes, not Ready for longer than `--node-expiry` is expired (swept,
//!   `health: expired`), Ready again is routed again.

use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr, TcpStream},
    time::{Duration, Instant},
};

use hyper::Method;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};
use tests::{
    kube_api::KubeApi,
    multinode::{Cluster, ETCD_IP, Node},
    netns::NetNs,
    netpol_probe::Servers,
    privileged::require_root,
};

const PORT_TCP: u16 = 8080;
/// How long a change may take to reach the other node's routes (block listing every second; etcd on this
/// shared disk sometimes takes seconds to answer).
const CONVERGE: Duration = Duration::from_secs(30);
/// How long a Node deletion (or re-creation) may take to reach the routes (it is watched, not polled).
const NODE_CHANGE: Duration = Duration::from_secs(10);

fn node_object(name: &str, addresses: &[(&str, &str)]) -> Value {
    let addresses: Vec<Value> = addresses
        .iter()
        .map(|(kind, address)| json!({"type": kind, "address": address}))
        .collect();
    json!({"apiVersion": "v1", "kind": "Node",
           "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
           "status": {"addresses": addresses}})
}

fn pod_object(name: &str, node: &str, app: &str, ip: Option<&str>) -> Value {
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "default", "labels": {"app": app}},
           "spec": {"nodeName": node, "containers": [{"name": "c", "image": "none"}]}});
    if let Some(ip) = ip {
        pod["status"] = json!({"podIP": ip, "podIPs": [{"ip": ip}]});
    }
    pod
}

/// Adds pod `name` on node `i`: its Pod object first (the agent waits for it), then `weir-cni`, then the
/// Pod's address in its status (as kubelet reports it).
fn add_pod(cluster: &mut Cluster, api: &KubeApi, i: usize, name: &str, app: &str) -> String {
    let node = cluster.node(i).name.clone();
    api.apply(pod_object(name, &node, app, None));
    let ip = cluster.node_mut(i).add_pod("default", name);
    api.apply(pod_object(name, &node, app, Some(&ip)));
    ip
}

fn nodes_of(node: &Node) -> Vec<Value> {
    let nodes: Value = node
        .cni
        .agent
        .as_ref()
        .expect("running")
        .api(Method::GET, "/v1/nodes", None)
        .expect("nodes");
    nodes.as_array().cloned().unwrap_or_default()
}

/// The blocks `node` reports for itself.
fn own_blocks(node: &Node) -> BTreeSet<String> {
    nodes_of(node)
        .iter()
        .filter(|n| n["name"] == node.name.as_str())
        .flat_map(|n| n["blocks"].as_array().cloned().unwrap_or_default())
        .filter_map(|b| b.as_str().map(str::to_owned))
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

/// The routes the other node must have to `to`'s blocks.
fn expected_routes(to: &Node) -> BTreeSet<String> {
    own_blocks(to)
        .into_iter()
        .map(|b| format!("{b} via {}", to.address))
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

fn connects(from: &NetNs, to: &str) -> bool {
    let addr: SocketAddr = format!("{to}:{PORT_TCP}").parse().expect("addr");
    from.run(|| TcpStream::connect_timeout(&addr, Duration::from_millis(1500)).is_ok())
}

#[test]
fn node_objects_route_each_nodes_blocks_and_their_deletion_sweeps_them() {
    if !require_root("node_objects_route_each_nodes_blocks_and_their_deletion_sweeps_them") {
        return;
    }
    // The kubeconfig's path is every agent's flag; the server (in the infra namespace) writes it below.
    let dir = tempfile::Builder::new()
        .prefix("wt-kn")
        .tempdir()
        .expect("temp dir");
    let kubeconfig = dir.path().join("kubeconfig");
    let kubeconfig_flag = kubeconfig.display().to_string();
    let mut cluster = Cluster::new(&["--source", "kubernetes", "--kubeconfig", &kubeconfig_flag]);
    let api_ip: IpAddr = ETCD_IP.parse().expect("ip");
    let api = KubeApi::start_at(Some(&cluster.infra), api_ip);
    std::fs::copy(api.kubeconfig(), &kubeconfig).expect("copy the kubeconfig");

    api.apply(json!({"apiVersion": "v1", "kind": "Namespace",
                     "metadata": {"name": "default", "labels": {"team": "default"}}}));
    // The two nodes' own Node objects (kubelet's: InternalIP, and an ExternalIP listed first that must
    // not be the next hop), and two bad ones that must be left out without harm.
    let (a_name, b_name) = ("wt-node-0", "wt-node-1");
    let node_b = |addr: &str| {
        node_object(
            b_name,
            &[("ExternalIP", "198.51.100.2"), ("InternalIP", addr)],
        )
    };
    api.apply(node_object(
        a_name,
        &[("ExternalIP", "198.51.100.1"), ("InternalIP", "10.99.0.11")],
    ));
    api.apply(node_b("10.99.0.12"));
    api.apply(node_object("wt-bare", &[("Hostname", "wt-bare")]));
    api.apply(node_object("wt-badaddr", &[("InternalIP", "not-an-ip")]));

    cluster.add_node();
    cluster.add_node();
    assert_eq!(
        (cluster.node(0).name.as_str(), cluster.node(1).name.as_str()),
        (a_name, b_name)
    );
    assert_eq!(cluster.node(1).address, "10.99.0.12");

    // B: a web pod under a policy letting in `client` only; A: a client and another pod.
    let web = add_pod(&mut cluster, &api, 1, "web", "web");
    add_pod(&mut cluster, &api, 0, "client", "client");
    add_pod(&mut cluster, &api, 0, "other", "other");
    api.apply(
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"name": "web-from-client", "namespace": "default"},
           "spec": {"podSelector": {"matchLabels": {"app": "web"}},
                    "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}],
                                 "ports": [{"protocol": "TCP", "port": PORT_TCP}]}]}}),
    );
    let _servers = Servers::start(&cluster.node(1).pods[0].0.ns, &[PORT_TCP], &[]);

    let converged = |cluster: &Cluster| {
        let (a, b) = (cluster.node(0), cluster.node(1));
        for node in [a, b] {
            if own_blocks(node).is_empty() {
                return Err(format!("{} does not list its own blocks yet", node.name));
            }
        }
        for (from, to) in [(a, b), (b, a)] {
            let (want, have) = (expected_routes(to), routes_of(from));
            if want != have {
                return Err(format!("{}: want {want:?}, have {have:?}", from.name));
            }
        }
        Ok(())
    };
    wait_until("each node routes the other's blocks", CONVERGE, || {
        converged(&cluster)
    });

    // The node list: the two good Nodes, from Kubernetes, with their addresses InternalIP first.
    let listed = nodes_of(cluster.node(0));
    let names: BTreeSet<&str> = listed.iter().filter_map(|n| n["name"].as_str()).collect();
    assert_eq!(
        names,
        BTreeSet::from([a_name, b_name]),
        "the Nodes without a usable address are left out: {listed:?}"
    );
    for n in &listed {
        assert_eq!(n["source"], "kubernetes", "{n}");
    }
    let b_entry = listed.iter().find(|n| n["name"] == b_name).expect("b");
    assert_eq!(b_entry["addresses"], json!(["10.99.0.12", "198.51.100.2"]));
    assert_eq!(b_entry["health"], "alive");

    // Real traffic: A's client reaches B's web; A's other pod is refused by B's policy, judged by the
    // identity of its Pod object (B knows A's pods only from the API server).
    let (client, other) = (&cluster.node(0).pods[0].0.ns, &cluster.node(0).pods[1].0.ns);
    wait_until(
        "B's policy admits A's client and not A's other pod",
        CONVERGE,
        || match (connects(client, &web), connects(other, &web)) {
            (true, false) => Ok(()),
            got => Err(format!("(client, other) reached web: {got:?}")),
        },
    );

    // `GET /v1/addresses` (`weir status --all-addresses`): A lists B's pod from its Pod object, with B's
    // node and the identity B gives it itself (one cluster-wide identity per label set).
    let web_on = |node: &Node| {
        let addresses: Value = node
            .cni
            .agent
            .as_ref()
            .expect("running")
            .api(Method::GET, "/v1/addresses", None)
            .expect("addresses");
        addresses
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["pod"] == "default/web")
            .cloned()
            .unwrap_or_else(|| panic!("{} does not list default/web: {addresses}", node.name))
    };
    let (on_a, on_b) = (web_on(cluster.node(0)), web_on(cluster.node(1)));
    assert_eq!(
        (&on_a["ip"], &on_a["node"]),
        (&json!(web), &json!(b_name)),
        "{on_a}"
    );
    assert!(on_a["identity"].is_u64(), "{on_a}");
    assert_eq!(on_a["identity"], on_b["identity"], "A: {on_a}, B: {on_b}");

    // B's Node deleted: A sweeps its routes to B (and B's pod is unreachable from A), B keeps its own.
    assert!(api.delete("Node", "", b_name), "B's Node existed");
    let swept_from = Instant::now();
    wait_until("A sweeps its routes to B", NODE_CHANGE, || {
        let have = routes_of(cluster.node(0));
        if have.is_empty() {
            Ok(())
        } else {
            Err(format!("A still has {have:?}"))
        }
    });
    let swept_in = swept_from.elapsed();
    assert!(!connects(client, &web), "no route, no connection");
    assert_eq!(
        routes_of(cluster.node(1)),
        expected_routes(cluster.node(0)),
        "B still routes A's blocks (A's Node is there)"
    );
    let names: BTreeSet<String> = nodes_of(cluster.node(0))
        .iter()
        .filter_map(|n| n["name"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(names, BTreeSet::from([a_name.to_owned()]));

    // Re-added: the routes and the traffic come back.
    api.apply(node_b("10.99.0.12"));
    let restored_from = Instant::now();
    wait_until("A routes B's blocks again", NODE_CHANGE, || {
        converged(&cluster)
    });
    let restored_in = restored_from.elapsed();
    wait_until("A's client reaches B's web again", CONVERGE, || {
        if connects(client, &web) {
            Ok(())
        } else {
            Err("refused".into())
        }
    });

    // Readiness: B not Ready for less than --node-expiry (40 s by default) keeps its routes; for longer,
    // it is expired and swept; Ready again, its routes return.
    let b_ready = |status: &str, ago: i64| {
        let now = Timestamp::now().as_second();
        let since = Timestamp::from_second(now - ago).expect("a time");
        let mut node = node_b("10.99.0.12");
        node["status"]["conditions"] = json!([{"type": "Ready", "status": status,
                                               "lastTransitionTime": since.to_string()}]);
        node
    };
    api.apply(b_ready("Unknown", 0));
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        assert_eq!(
            routes_of(cluster.node(0)),
            expected_routes(cluster.node(1)),
            "B not Ready for a moment keeps its routes"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    api.apply(b_ready("False", 60));
    wait_until(
        "A sweeps the routes of B, not Ready for 60 s",
        NODE_CHANGE,
        || {
            let have = routes_of(cluster.node(0));
            if have.is_empty() {
                Ok(())
            } else {
                Err(format!("A still has {have:?}"))
            }
        },
    );
    let b_entry = nodes_of(cluster.node(0))
        .into_iter()
        .find(|n| n["name"] == b_name)
        .expect("B is listed while it exists");
    assert_eq!(b_entry["health"], "expired", "{b_entry}");
    api.apply(b_ready("True", 0));
    wait_until("A routes B's blocks once B is Ready", NODE_CHANGE, || {
        converged(&cluster)
    });
    eprintln!(
        "Node deleted → routes swept in {} ms; re-added → restored in {} ms",
        swept_in.as_millis(),
        restored_in.as_millis()
    );
}
