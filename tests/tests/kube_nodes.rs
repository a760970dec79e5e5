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
//! - deleting B's Node object sweeps A's routes to B within a bound, and `weir ipam check --node-objects`
//!   (on the etcd datastore, the test server's kubeconfig) reports B's blocks as a decommissioned node's,
//!   which it did not while B's Node existed (nor would `weir ipam release-node --node-objects` free them
//!   then, while it releases a node that has no Node); re-adding it restores the routes;
//! - B not Ready for a moment keeps its routes; not Ready for longer than `--node-expiry` it is silent
//!   (`health: silent` in `GET /v1/nodes` and `weir node list`, `weir_nodes{health="silent"}` in `/metrics`)
//!   and still keeps them, its pod still reached (fail static: routes follow the Node object, not its
//!   readiness); Ready again, it is alive.
//!
//! And the same cluster with `--routing vxlan` (a second test, leaner): each node has the VXLAN device with
//! a permanent forwarding and neighbour entry for the other Node's InternalIP and routes its blocks through
//! the device; a pod on A reaches a pod on B through it (the device's `tx_packets` move), B's policy judges
//! A's pods by their Pod objects; B's Node deleted, A sweeps its routes and its entries for B.

use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr, TcpStream},
    path::PathBuf,
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

/// The routes the other node must have to `to`'s blocks.
fn expected_routes(to: &Node) -> BTreeSet<String> {
    to.own_blocks()
        .into_iter()
        .map(|b| format!("{b} via {}", to.address))
        .collect()
}

use tests::wait::until_ok as wait_until;

/// `weir ipam --datastore <the cluster's etcd> -o json <args…>`, the Node objects from `kubeconfig`.
fn ipam_with_node_objects(
    cluster: &Cluster,
    kubeconfig: &std::path::Path,
    args: &[&str],
) -> std::process::Output {
    let weir = tests::bin::weir();
    let kubeconfig = format!("KUBECONFIG={}", kubeconfig.display());
    let datastore = Cluster::datastore();
    let mut argv = vec![
        "env",
        &kubeconfig,
        weir.to_str().expect("utf-8 path"),
        "ipam",
        "--datastore",
        &datastore,
        "-o",
        "json",
    ];
    argv.extend_from_slice(args);
    cluster.infra.try_exec(&argv).expect("run weir ipam")
}

/// `weir ipam check --node-objects -o json`: its leak lines.
fn leaks_with_node_objects(cluster: &Cluster, kubeconfig: &std::path::Path) -> Vec<String> {
    let out = ipam_with_node_objects(cluster, kubeconfig, &["check", "--node-objects"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "weir ipam check printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    report["leaks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l.as_str().map(str::to_owned))
        .collect()
}

fn connects(from: &NetNs, to: &str) -> bool {
    let addr: SocketAddr = format!("{to}:{PORT_TCP}").parse().expect("addr");
    from.run(|| TcpStream::connect_timeout(&addr, Duration::from_millis(1500)).is_ok())
}

/// The cluster of both tests: agents with `--source kubernetes` (and `extra`) on the test API server in
/// the infra namespace, whose kubeconfig (at the returned path, in the returned directory) every agent
/// reads; the `default` namespace applied. No nodes yet.
fn start(extra: &[&str]) -> (tempfile::TempDir, PathBuf, Cluster, KubeApi) {
    let dir = tempfile::Builder::new()
        .prefix("wt-kn")
        .tempdir()
        .expect("temp dir");
    let kubeconfig = dir.path().join("kubeconfig");
    let kubeconfig_flag = kubeconfig.display().to_string();
    let mut flags = vec!["--source", "kubernetes", "--kubeconfig", &kubeconfig_flag];
    flags.extend_from_slice(extra);
    let cluster = Cluster::new(&flags);
    let api_ip: IpAddr = ETCD_IP.parse().expect("ip");
    let api = KubeApi::start_at(Some(&cluster.infra), api_ip);
    std::fs::copy(api.kubeconfig(), &kubeconfig).expect("copy the kubeconfig");
    api.apply(json!({"apiVersion": "v1", "kind": "Namespace",
                     "metadata": {"name": "default", "labels": {"team": "default"}}}));
    (dir, kubeconfig, cluster, api)
}

/// B (node 1): a web pod serving TCP under a policy letting in `client` only; A (node 0): a client and
/// another pod. Returns the web pod's address and its servers.
fn web_and_its_clients(cluster: &mut Cluster, api: &KubeApi) -> (String, Servers) {
    let web = add_pod(cluster, api, 1, "web", "web");
    add_pod(cluster, api, 0, "client", "client");
    add_pod(cluster, api, 0, "other", "other");
    api.apply(
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"name": "web-from-client", "namespace": "default"},
           "spec": {"podSelector": {"matchLabels": {"app": "web"}},
                    "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}],
                                 "ports": [{"protocol": "TCP", "port": PORT_TCP}]}]}}),
    );
    let servers = Servers::start(&cluster.node(1).pods[0].0.ns, &[PORT_TCP], &[]);
    (web, servers)
}

/// The VXLAN device (the agent's default name).
const DEVICE: &str = agent::paths::DEFAULT_VXLAN_DEVICE;

/// `bridge fdb` entries with a destination and `ip neigh` entries on the VXLAN device of `node`.
fn vxlan_entries(node: &Node) -> (Vec<String>, Vec<String>) {
    let lines = |out: std::process::Output| -> Vec<String> {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .filter(|l| !l.is_empty())
            .collect()
    };
    let fdb = lines(node.cni.ns.exec(&["bridge", "fdb", "show", "dev", DEVICE]))
        .into_iter()
        .filter(|l| l.contains(" dst "))
        .collect();
    (
        fdb,
        lines(node.cni.ns.exec(&["ip", "neigh", "show", "dev", DEVICE])),
    )
}

fn tx_packets(node: &Node) -> u64 {
    let path = format!("/sys/class/net/{DEVICE}/statistics/tx_packets");
    let out = node.cni.ns.exec(&["cat", &path]);
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{path} on {}: {e}", node.name))
}

#[test]
fn node_objects_route_through_vxlan_and_their_deletion_sweeps_the_entries() {
    if !require_root("node_objects_route_through_vxlan_and_their_deletion_sweeps_the_entries") {
        return;
    }
    let (_dir, _kubeconfig, mut cluster, api) = start(&["--routing", "vxlan"]);
    let (a_name, b_name) = ("wt-node-0", "wt-node-1");
    api.apply(node_object(a_name, &[("InternalIP", "10.99.0.11")]));
    api.apply(node_object(b_name, &[("InternalIP", "10.99.0.12")]));
    cluster.add_node();
    cluster.add_node();
    let (web, _servers) = web_and_its_clients(&mut cluster, &api);

    // Each node: the other's blocks routed through the device, one permanent forwarding entry to and one
    // neighbour entry for the other Node's InternalIP.
    let through_device = |cluster: &Cluster| {
        let (a, b) = (cluster.node(0), cluster.node(1));
        for (from, to) in [(a, b), (b, a)] {
            if to.own_blocks().is_empty() {
                return Err(format!("{} does not list its own blocks yet", to.name));
            }
            let (want, have) = (expected_routes(to), from.routes());
            if want != have {
                return Err(format!("{}: want {want:?}, have {have:?}", from.name));
            }
            if let Some(r) = from.weir_routes().iter().find(|r| !r.contains(DEVICE)) {
                return Err(format!("{}: a route not through {DEVICE}: {r}", from.name));
            }
            let (fdb, neigh) = vxlan_entries(from);
            let dst = format!("dst {}", to.address);
            if fdb.len() != 1 || !fdb[0].contains(&dst) || !fdb[0].contains("permanent") {
                return Err(format!("{}: forwarding entries {fdb:?}", from.name));
            }
            if neigh.len() != 1 || !neigh[0].contains("PERMANENT") {
                return Err(format!("{}: neighbour entries {neigh:?}", from.name));
            }
        }
        Ok(())
    };
    wait_until(
        "each node routes the other's blocks through its VXLAN device",
        CONVERGE,
        || through_device(&cluster),
    );

    // Real traffic through the tunnel, judged by B's policy by A's Pod objects.
    let tx_before = tx_packets(cluster.node(0));
    let (client, other) = (&cluster.node(0).pods[0].0.ns, &cluster.node(0).pods[1].0.ns);
    wait_until(
        "B's policy admits A's client and not A's other pod, through the tunnel",
        CONVERGE,
        || match (connects(client, &web), connects(other, &web)) {
            (true, false) => Ok(()),
            got => Err(format!("(client, other) reached web: {got:?}")),
        },
    );
    assert!(
        tx_packets(cluster.node(0)) > tx_before,
        "A's traffic to B's pod left through {DEVICE}"
    );

    // B's Node deleted: A sweeps its routes and its entries for B.
    assert!(api.delete("Node", "", b_name), "B's Node existed");
    wait_until(
        "A sweeps its routes and VXLAN entries for B",
        NODE_CHANGE,
        || {
            let (routes, (fdb, neigh)) = (cluster.node(0).routes(), vxlan_entries(cluster.node(0)));
            if routes.is_empty() && fdb.is_empty() && neigh.is_empty() {
                Ok(())
            } else {
                Err(format!("A still has {routes:?} {fdb:?} {neigh:?}"))
            }
        },
    );
    assert!(!connects(client, &web), "no route, no connection");
}

#[test]
fn node_objects_route_each_nodes_blocks_and_their_deletion_sweeps_them() {
    if !require_root("node_objects_route_each_nodes_blocks_and_their_deletion_sweeps_them") {
        return;
    }
    let (_dir, kubeconfig, mut cluster, api) = start(&[]);
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
    let (web, _servers) = web_and_its_clients(&mut cluster, &api);

    let converged = |cluster: &Cluster| {
        let (a, b) = (cluster.node(0), cluster.node(1));
        for node in [a, b] {
            if node.own_blocks().is_empty() {
                return Err(format!("{} does not list its own blocks yet", node.name));
            }
        }
        for (from, to) in [(a, b), (b, a)] {
            let (want, have) = (expected_routes(to), from.routes());
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
    let listed = cluster.node(0).nodes();
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

    // With B's Node there, `weir ipam check --node-objects` reports none of its blocks.
    let b_blocks = cluster.node(1).own_blocks();
    let about_b = |leaks: &[String]| -> Vec<String> {
        leaks
            .iter()
            .filter(|l| b_blocks.iter().any(|b| l.contains(&format!("block {b} "))))
            .cloned()
            .collect()
    };
    let leaks = leaks_with_node_objects(&cluster, &kubeconfig);
    assert!(about_b(&leaks).is_empty(), "B is live: {leaks:?}");
    // Nor does `weir ipam release-node --node-objects` free them (its agent keeps no etcd node record
    // under `--source kubernetes`: the Node is what says it is live) …
    let refused = ipam_with_node_objects(
        &cluster,
        &kubeconfig,
        &["release-node", b_name, "--node-objects"],
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("still has a Node object"),
        "release-node of live B: {:?}, {stderr}",
        refused.status
    );
    // … while a node without a Node object is released (the same command; it has nothing to free).
    let gone = ipam_with_node_objects(
        &cluster,
        &kubeconfig,
        &["release-node", "wt-gone", "--node-objects"],
    );
    assert!(
        gone.status.success(),
        "release-node of a node with no Node object: {}",
        String::from_utf8_lossy(&gone.stderr)
    );

    // B's Node deleted: A sweeps its routes to B (and B's pod is unreachable from A), B keeps its own.
    assert!(api.delete("Node", "", b_name), "B's Node existed");
    let swept_from = Instant::now();
    wait_until("A sweeps its routes to B", NODE_CHANGE, || {
        let have = cluster.node(0).routes();
        if have.is_empty() {
            Ok(())
        } else {
            Err(format!("A still has {have:?}"))
        }
    });
    let swept_in = swept_from.elapsed();
    assert!(!connects(client, &web), "no route, no connection");
    assert_eq!(
        cluster.node(1).routes(),
        expected_routes(cluster.node(0)),
        "B still routes A's blocks (A's Node is there)"
    );
    let names: BTreeSet<String> = cluster
        .node(0)
        .nodes()
        .iter()
        .filter_map(|n| n["name"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(names, BTreeSet::from([a_name.to_owned()]));
    // Its blocks are now a decommissioned node's to `weir ipam check --node-objects`.
    let leaks = about_b(&leaks_with_node_objects(&cluster, &kubeconfig));
    assert_eq!(
        leaks.len(),
        b_blocks.len(),
        "each of B's blocks {b_blocks:?} is reported: {leaks:?}"
    );
    assert!(
        leaks
            .iter()
            .all(|l| l.contains("no Node object") && l.contains(b_name)),
        "{leaks:?}"
    );

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
    // it is silent and keeps them still (fail static); Ready again, it is alive.
    let b_ready = |status: &str, ago: i64| {
        let now = Timestamp::now().as_second();
        let since = Timestamp::from_second(now - ago).expect("a time");
        let mut node = node_b("10.99.0.12");
        node["status"]["conditions"] = json!([{"type": "Ready", "status": status,
                                               "lastTransitionTime": since.to_string()}]);
        node
    };
    let b_health = || {
        cluster
            .node(0)
            .nodes()
            .into_iter()
            .find(|n| n["name"] == b_name)
            .expect("B is listed while it exists")
    };
    api.apply(b_ready("Unknown", 0));
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        assert_eq!(
            cluster.node(0).routes(),
            expected_routes(cluster.node(1)),
            "B not Ready for a moment keeps its routes"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    api.apply(b_ready("False", 60));
    wait_until(
        "A shows B, not Ready for 60 s, as silent",
        NODE_CHANGE,
        || {
            let b = b_health();
            if b["health"] == "silent" && b["last_seen_secs"].as_u64() >= Some(60) {
                Ok(())
            } else {
                Err(format!("{b}"))
            }
        },
    );
    assert_eq!(
        cluster.node(0).routes(),
        expected_routes(cluster.node(1)),
        "a silent Node keeps its routes while it exists"
    );
    // And the operator sees it: `weir node list` and `/metrics` on A.
    cluster.node(0).shows_silent(b_name);
    assert!(
        connects(client, &web),
        "A's client reaches the silent B's web"
    );
    api.apply(b_ready("True", 0));
    wait_until("A shows B alive once B is Ready", NODE_CHANGE, || {
        let b = b_health();
        if b["health"] == "alive" {
            Ok(())
        } else {
            Err(format!("{b}"))
        }
    });
    converged(&cluster).expect("A routes B's blocks");
    eprintln!(
        "Node deleted → routes swept in {} ms; re-added → restored in {} ms",
        swept_in.as_millis(),
        restored_in.as_millis()
    );
}
