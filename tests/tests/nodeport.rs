//! NodePorts with real traffic (DESIGN.md → "Services and NAT"): two node namespaces on the
//! underlay bridge and a real etcd (`tests::multinode`, native routing), and an "outside"
//! namespace joined to node 0 by a veth. Node 0's agent serves NodePorts on that veth and on its
//! underlay link (`--nodeport-interfaces`); a backend pod runs on each node and answers every TCP
//! connection with its name and the peer address it sees. From outside, to node 0's address:
//!
//! - a NodePort whose only backend is on node 1 (`externalTrafficPolicy: Cluster`): the connection
//!   completes from node 0's address and NodePort (the client's socket is connected there), carries
//!   data, and the backend sees node 0's underlay address (masqueraded so the reply returns
//!   through node 0);
//! - `externalTrafficPolicy: Local` with backends on both nodes: every connection lands on node 0's
//!   backend, which sees the client's own address;
//! - `Cluster` with both: connections reach both backends; node 0's sees the client, node 1's node
//!   0's address;
//! - the positive control for "nothing answers without the translation": a port no Service has is
//!   refused by node 0's own stack, and node 1 (no NodePort interface named) does not serve the
//!   NodePorts (its address is not even routed from outside);
//! - a pod on node 0 reaches the NodePorts on node 0's own addresses (both of them): backends on
//!   either node, each seeing the pod's address, its socket connected to the address and NodePort
//!   it dialled; `Local` too (every backend for a pod, as kube-proxy); a port no Service has is
//!   refused by node 0; node 0's backend reaching itself that way (hairpin) sees the hairpin
//!   address;
//! - addresses routed to node 0 from outside: an `externalIPs` address (both backends), a
//!   `LoadBalancer`'s `status.loadBalancer.ingress` address with `Local` (node 0's backend, the
//!   client's address kept), external addresses that are node 0's own (on a port outside the
//!   NodePort range and on one inside it that is no NodePort); an address routed there that no
//!   Service has is not answered; from the pod, the external and the `Local` load balancer's
//!   addresses reach both backends, and node 0's own external addresses (both ports) reach their
//!   backend; a cluster IP with `internalTrafficPolicy: Local` serves the pod only node 0's
//!   backend;
//! - `weir service list -o json` lists the NodePort and external frontends with their policy.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    process::Command,
    time::Duration,
};

use serde_json::Value;
use tests::{
    bin, multinode::Cluster, names, netns::NetNs, node_lab::eventually, pod_doc::write_atomically,
    privileged::require_root,
};

/// The backends' TCP port.
const PORT: u16 = 8080;
/// Node 0's address on the outside link, and the outside client's.
const NODE0_OUTSIDE: &str = "192.168.79.2";
const CLIENT: &str = "192.168.79.1";
/// Node 0's underlay address (`tests::multinode`: node i at 10.99.0.<11 + i>).
const NODE0_UNDERLAY: &str = "10.99.0.11";
/// NodePorts: backend on node 1 only (Cluster), both (Local), both (Cluster).
const NP_REMOTE: u16 = 30_001;
const NP_LOCAL: u16 = 30_002;
const NP_CLUSTER: u16 = 30_003;
/// An external address (`externalIPs`) and a load balancer's (`status.loadBalancer.ingress`),
/// both routed to node 0 by the outside namespace; an address routed there that no Service has.
const EXTERNAL: &str = "192.0.2.80";
const LOAD_BALANCER: &str = "198.51.100.80";
const NO_SERVICE: &str = "192.0.2.99";
/// The port of the Service whose external address is node 0's own.
const ON_NODE_PORT: u16 = 81;
/// The port of another such Service, in the NodePort range but no NodePort (a pod's packet to
/// its node's address on such a port is looked up as a NodePort first).
const ON_NODE_HIGH_PORT: u16 = 30_100;

/// The source a pod's packet has when its Service sends it to the pod itself
/// (`maps_schema::service::HAIRPIN4`).
const HAIRPIN: &str = "169.254.42.1";
/// The NodePort of the load balancer's Service.
const NP_LB: u16 = 30_004;
/// A port no Service has.
const NP_NONE: u16 = 30_009;
/// Connections per NodePort.
const CONNECTIONS: usize = 30;

/// A NodePort Service `name` with `policy` and its EndpointSlice (backends: address and node).
fn service(
    name: &str,
    cluster_ip: &str,
    node_port: u16,
    policy: &str,
    backends: &[(&str, &str)],
) -> String {
    let spec =
        format!("  type: NodePort\n  externalTrafficPolicy: {policy}\n  clusterIP: {cluster_ip}");
    service_doc(name, 80, Some(node_port), &spec, "{}", backends)
}

/// `weir service SUBCOMMAND -o json` against the agent behind `socket`.
fn service_json(socket: &std::path::Path, subcommand: &str) -> Value {
    let out = Command::new(bin::weir())
        .args(["service", subcommand, "-o", "json", "--api-socket"])
        .arg(socket)
        .output()
        .expect("run weir");
    assert!(
        out.status.success(),
        "weir service {subcommand}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// A Service `name` with `spec` lines (type, externalIPs, …) and `status`, port `port` (with its
/// `node_port`), and its EndpointSlice (backends: address and node).
fn service_doc(
    name: &str,
    port: u16,
    node_port: Option<u16>,
    spec: &str,
    status: &str,
    backends: &[(&str, &str)],
) -> String {
    let endpoints: String = backends
        .iter()
        .map(|(ip, node)| format!("- {{addresses: [{ip}], nodeName: {node}}}\n"))
        .collect();
    let node_port = node_port.map_or_else(String::new, |n| format!(", nodePort: {n}"));
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\n\
         spec:\n{spec}\n\x20 ports: [{{name: tcp, port: {port}, protocol: TCP, targetPort: {PORT}{node_port}}}]\n\
         status: {status}\n\
         ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata: {{name: {name}-1, namespace: default, labels: {{kubernetes.io/service-name: {name}}}}}\n\
         addressType: IPv4\nports: [{{name: tcp, port: {PORT}, protocol: TCP}}]\nendpoints:\n{endpoints}---\n"
    )
}

/// Serves in `ns`: each connection gets `<name> <peer address>` as its first line, then every line
/// echoed. The threads live as long as the test process.
fn serve(ns: &NetNs, name: &str) {
    let listener = ns.run(|| TcpListener::bind(("0.0.0.0", PORT)).expect("listen"));
    let name = name.to_owned();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let name = name.clone();
            std::thread::spawn(move || {
                let peer = conn
                    .peer_addr()
                    .map(|p| p.ip().to_string())
                    .unwrap_or_default();
                if writeln!(conn, "{name} {peer}").is_err() {
                    return;
                }
                let mut reader = BufReader::new(conn.try_clone().expect("clone"));
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                    if conn.write_all(line.as_bytes()).is_err() {
                        return;
                    }
                    line.clear();
                }
            });
        }
    });
}

/// One connection from `outside` to `to`: the backend's name and the peer it saw, after a line
/// went through and came back. `Err` says what failed.
fn visit(outside: &NetNs, to: SocketAddr) -> Result<(String, String), String> {
    let stream = outside
        .run(|| TcpStream::connect_timeout(&to, Duration::from_secs(3)))
        .map_err(|e| format!("connect to {to}: {e}"))?;
    let peer = stream.peer_addr().map_err(|e| e.to_string())?;
    if peer != to {
        return Err(format!("connected to {to} but the peer is {peer}"));
    }
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    let mut reader = BufReader::new(stream);
    let mut first = String::new();
    reader
        .read_line(&mut first)
        .map_err(|e| format!("read the greeting from {to}: {e}"))?;
    reader
        .get_mut()
        .write_all(b"ping\n")
        .map_err(|e| format!("send to {to}: {e}"))?;
    let mut echo = String::new();
    reader
        .read_line(&mut echo)
        .map_err(|e| format!("read the echo from {to}: {e}"))?;
    if echo.trim_end() != "ping" {
        return Err(format!("echo from {to} was {echo:?}"));
    }
    let mut parts = first.split_whitespace();
    match (parts.next(), parts.next()) {
        (Some(name), Some(seen)) => Ok((name.to_owned(), seen.to_owned())),
        _ => Err(format!("greeting from {to} was {first:?}")),
    }
}

/// `CONNECTIONS` visits: how many times each (backend, peer it saw) came up.
fn visits(outside: &NetNs, to: SocketAddr) -> BTreeMap<(String, String), usize> {
    let mut seen = BTreeMap::new();
    for _ in 0..CONNECTIONS {
        let visit = visit(outside, to).unwrap_or_else(|e| panic!("NodePort {to}: {e}"));
        *seen.entry(visit).or_insert(0) += 1;
    }
    seen
}

fn pair(name: &str, peer: &str) -> (String, String) {
    (name.to_owned(), peer.to_owned())
}

#[test]
fn node_ports_reach_backends_on_this_and_the_other_node_and_local_keeps_the_client() {
    if !require_root(
        "node_ports_reach_backends_on_this_and_the_other_node_and_local_keeps_the_client",
    ) {
        return;
    }
    let outside = NetNs::new();
    let mut cluster = Cluster::new(&["--routing", "native"]);
    let outside_name = outside.name().to_owned();
    let mut outside_end = String::new();
    cluster.add_node_with(|ns, underlay| {
        let node_end = names::unique("x");
        outside_end = names::unique("o");
        ns.exec(&[
            "ip",
            "link",
            "add",
            &node_end,
            "type",
            "veth",
            "peer",
            "name",
            &outside_end,
            "netns",
            &outside_name,
        ]);
        ns.exec(&[
            "ip",
            "addr",
            "add",
            &format!("{NODE0_OUTSIDE}/24"),
            "dev",
            &node_end,
        ]);
        ns.exec(&["ip", "link", "set", &node_end, "up"]);
        vec![
            "--nodeport-interfaces".to_owned(),
            format!("{node_end},{underlay}"),
        ]
    });
    outside.exec(&["ip", "link", "set", "lo", "up"]);
    outside.exec(&[
        "ip",
        "addr",
        "add",
        &format!("{CLIENT}/24"),
        "dev",
        &outside_end,
    ]);
    outside.exec(&["ip", "link", "set", &outside_end, "up"]);
    for routed in [EXTERNAL, LOAD_BALANCER, NO_SERVICE] {
        outside.exec(&["ip", "route", "add", routed, "via", NODE0_OUTSIDE]);
    }
    cluster.add_node();

    let web0 = cluster.node_mut(0).add_pod("default", "web-0");
    let web1 = cluster.node_mut(1).add_pod("default", "web-1");
    let client0 = cluster.node_mut(0).add_pod("default", "client-0");
    serve(&cluster.node(0).pods[0].0.ns, "web-0");
    serve(&cluster.node(1).pods[0].0.ns, "web-1");
    let docs = [
        service(
            "np-remote",
            "10.96.7.1",
            NP_REMOTE,
            "Cluster",
            &[(&web1, "wt-node-1")],
        ),
        service(
            "np-local",
            "10.96.7.2",
            NP_LOCAL,
            "Local",
            &[(&web0, "wt-node-0"), (&web1, "wt-node-1")],
        ),
        service(
            "np-cluster",
            "10.96.7.3",
            NP_CLUSTER,
            "Cluster",
            &[(&web0, "wt-node-0"), (&web1, "wt-node-1")],
        ),
        service_doc(
            "ext",
            80,
            None,
            &format!("  clusterIP: 10.96.7.4\n  externalIPs: [{EXTERNAL}]"),
            "{}",
            &[(&web0, "wt-node-0"), (&web1, "wt-node-1")],
        ),
        service_doc(
            "lb",
            80,
            Some(NP_LB),
            "  type: LoadBalancer\n  externalTrafficPolicy: Local\n  clusterIP: 10.96.7.5",
            &format!("{{loadBalancer: {{ingress: [{{ip: {LOAD_BALANCER}}}]}}}}"),
            &[(&web0, "wt-node-0"), (&web1, "wt-node-1")],
        ),
        service_doc(
            "internal",
            80,
            None,
            "  clusterIP: 10.96.7.7\n  internalTrafficPolicy: Local",
            "{}",
            &[(&web0, "wt-node-0"), (&web1, "wt-node-1")],
        ),
        service_doc(
            "on-node",
            ON_NODE_PORT,
            None,
            &format!("  clusterIP: 10.96.7.6\n  externalIPs: [{NODE0_OUTSIDE}]"),
            "{}",
            &[(&web1, "wt-node-1")],
        ),
        service_doc(
            "on-node-high",
            ON_NODE_HIGH_PORT,
            None,
            &format!("  clusterIP: 10.96.7.8\n  externalIPs: [{NODE0_OUTSIDE}]"),
            "{}",
            &[(&web1, "wt-node-1")],
        ),
    ]
    .concat();
    for node in cluster.live() {
        write_atomically(&node.cni.dirs.path("policies"), "services.yaml", &docs);
    }
    let at = |port: u16| SocketAddr::new(NODE0_OUTSIDE.parse().expect("address"), port);

    // Node 0 routes node 1's block and both agents read the Services: the remote NodePort answers.
    assert!(
        eventually(Duration::from_secs(60), || visit(&outside, at(NP_REMOTE))
            .is_ok()),
        "the NodePort onto node 1's backend never answered: {:?}",
        visit(&outside, at(NP_REMOTE))
    );
    let remote = visits(&outside, at(NP_REMOTE));
    assert_eq!(
        remote,
        BTreeMap::from([(pair("web-1", NODE0_UNDERLAY), CONNECTIONS)]),
        "Cluster, backend on the other node: every connection reaches it from node 0's address"
    );

    let local = visits(&outside, at(NP_LOCAL));
    assert_eq!(
        local,
        BTreeMap::from([(pair("web-0", CLIENT), CONNECTIONS)]),
        "Local: only node 0's backend, and it sees the client's address"
    );

    let cluster_visits = visits(&outside, at(NP_CLUSTER));
    let expected_keys = [pair("web-0", CLIENT), pair("web-1", NODE0_UNDERLAY)];
    assert_eq!(
        cluster_visits.keys().cloned().collect::<Vec<_>>(),
        expected_keys.to_vec(),
        "Cluster with both: both backends, node 0's seeing the client, node 1's node 0: {cluster_visits:?}"
    );

    // Controls: a port without a Service is node 0's own (refused by its stack); node 1's
    // address is not served (nothing routes it from outside, and it names no NodePort interface).
    match visit(&outside, at(NP_NONE)) {
        Err(e) => assert!(e.contains("refused"), "a port no Service has: {e}"),
        Ok(v) => panic!("a port no Service has answered: {v:?}"),
    }

    // External addresses routed to node 0: `externalIPs` (Cluster: both backends, node 1's
    // seeing node 0's address), a load balancer's (`Local`: node 0's backend, the client's
    // address kept), and an external address that is node 0's own; the client's socket is
    // connected to the address it dialled. Control: an address routed there that no Service
    // has is not answered.
    let addr = |ip: &str, port: u16| SocketAddr::new(ip.parse().expect("address"), port);
    let ext = visits(&outside, addr(EXTERNAL, 80));
    assert_eq!(
        ext.keys().cloned().collect::<Vec<_>>(),
        expected_keys.to_vec(),
        "externalIPs from outside: {ext:?}"
    );
    assert_eq!(
        visits(&outside, addr(LOAD_BALANCER, 80)),
        BTreeMap::from([(pair("web-0", CLIENT), CONNECTIONS)]),
        "a load balancer's address, Local"
    );
    assert_eq!(
        visits(&outside, addr(NODE0_OUTSIDE, ON_NODE_PORT)),
        BTreeMap::from([(pair("web-1", NODE0_UNDERLAY), CONNECTIONS)]),
        "an external address that is the node's own"
    );
    assert_eq!(
        visits(&outside, addr(NODE0_OUTSIDE, ON_NODE_HIGH_PORT)),
        BTreeMap::from([(pair("web-1", NODE0_UNDERLAY), CONNECTIONS)]),
        "an external address that is the node's own, on a port in the NodePort range"
    );
    assert!(
        visit(&outside, addr(NO_SERVICE, 80)).is_err(),
        "an address no Service has is not answered"
    );

    // A pod on node 0 reaches the NodePorts on its own node's addresses (translated by its
    // `from_endpoint`, no masquerade: every backend sees the pod's own address), and its socket
    // is connected to the address and NodePort it dialled (the replies come back from there).
    let pod = &cluster.node(0).pods[1].0.ns;
    for node_addr in [NODE0_OUTSIDE, NODE0_UNDERLAY] {
        let to = |port: u16| SocketAddr::new(node_addr.parse().expect("address"), port);
        assert_eq!(
            visits(pod, to(NP_REMOTE)),
            BTreeMap::from([(pair("web-1", &client0), CONNECTIONS)]),
            "a pod to its node's {node_addr}, backend on the other node"
        );
        let both = visits(pod, to(NP_CLUSTER));
        assert_eq!(
            both.keys().cloned().collect::<Vec<_>>(),
            vec![pair("web-0", &client0), pair("web-1", &client0)],
            "a pod to its node's {node_addr}, backends on both nodes: {both:?}"
        );
        // `Local` (only node 0's backend from outside): a pod gets every backend, as
        // kube-proxy gives pods.
        let local = visits(pod, to(NP_LOCAL));
        assert_eq!(
            local.keys().cloned().collect::<Vec<_>>(),
            vec![pair("web-0", &client0), pair("web-1", &client0)],
            "a pod to its node's {node_addr}, Local: {local:?}"
        );
        // Control: a port no Service has reaches node 0's own stack, which refuses it.
        match visit(pod, to(NP_NONE)) {
            Err(e) => assert!(e.contains("refused"), "a pod to a port no Service has: {e}"),
            Ok(v) => panic!("a port no Service has answered the pod: {v:?}"),
        }
    }

    // From the pod, the external addresses are frontends too (no masquerade).
    let from_pod = visits(pod, addr(EXTERNAL, 80));
    assert_eq!(
        from_pod.keys().cloned().collect::<Vec<_>>(),
        vec![pair("web-0", &client0), pair("web-1", &client0)],
        "externalIPs from a pod: {from_pod:?}"
    );
    let lb_from_pod = visits(pod, addr(LOAD_BALANCER, 80));
    assert_eq!(
        lb_from_pod.keys().cloned().collect::<Vec<_>>(),
        vec![pair("web-0", &client0), pair("web-1", &client0)],
        "a Local load balancer's address from a pod: every backend: {lb_from_pod:?}"
    );
    // An external address that is the node's own, from the pod: on a port outside the NodePort
    // range, and on one inside it that is no NodePort (looked up as a NodePort first).
    for port in [ON_NODE_PORT, ON_NODE_HIGH_PORT] {
        assert_eq!(
            visits(pod, addr(NODE0_OUTSIDE, port)),
            BTreeMap::from([(pair("web-1", &client0), CONNECTIONS)]),
            "an external address that is the node's own, port {port}, from a pod"
        );
    }

    // `internalTrafficPolicy: Local`: the pod's connections to the cluster IP stay on node 0's
    // backend (the NodePort above, `Cluster`, reached both: the positive control).
    assert_eq!(
        visits(pod, addr("10.96.7.7", 80)),
        BTreeMap::from([(pair("web-0", &client0), CONNECTIONS)]),
        "internalTrafficPolicy: Local from a pod"
    );

    // Hairpin: node 0's backend reaching itself through a NodePort on its node's address sees
    // the hairpin address as its peer (as through a cluster IP); node 1's sees it.
    let web0_ns = &cluster.node(0).pods[0].0.ns;
    let hairpin = visits(web0_ns, at(NP_CLUSTER));
    assert_eq!(
        hairpin.keys().cloned().collect::<Vec<_>>(),
        vec![pair("web-0", HAIRPIN), pair("web-1", &web0)],
        "a backend to its own node's NodePort: {hairpin:?}"
    );

    // The CLI lists the NodePort frontends.
    let list = service_json(&cluster.node(0).cni.socket(), "list");
    let frontends: Vec<(String, Option<String>)> = list
        .as_array()
        .expect("a list")
        .iter()
        .filter(|f| {
            f["frontend"].as_str().is_some_and(|s| {
                s.starts_with("*:") || s.starts_with(EXTERNAL) || s.starts_with(LOAD_BALANCER)
            })
        })
        .map(|f| {
            (
                f["frontend"].as_str().unwrap_or_default().to_owned(),
                f["external_traffic_policy"].as_str().map(str::to_owned),
            )
        })
        .collect();
    assert_eq!(
        frontends,
        vec![
            (format!("{EXTERNAL}:80/tcp"), None),
            (format!("{LOAD_BALANCER}:80/tcp"), Some("Local".to_owned())),
            (format!("*:{NP_LB}/tcp"), Some("Local".to_owned())),
            (format!("*:{NP_CLUSTER}/tcp"), None),
            (format!("*:{NP_LOCAL}/tcp"), Some("Local".to_owned())),
            (format!("*:{NP_REMOTE}/tcp"), None),
        ],
        "{list}"
    );

    // `weir service flows` names the NodePort flows from outside (besides the pod's earlier
    // ones): a fresh round onto node 1's backend, each flow from the client to node 0's address
    // and NodePort, given web-1.
    visits(&outside, at(NP_REMOTE));
    let flows = service_json(&cluster.node(0).cni.socket(), "flows");
    let frontend = format!("{NODE0_OUTSIDE}:{NP_REMOTE}");
    let remote: Vec<&Value> = flows
        .as_array()
        .expect("a list")
        .iter()
        .filter(|f| {
            f["frontend"] == frontend.as_str()
                && f["client"]
                    .as_str()
                    .is_some_and(|c| c.starts_with(&format!("{CLIENT}:")))
        })
        .collect();
    assert!(
        !remote.is_empty(),
        "the outside client's NodePort flows are listed: {flows}"
    );
    for f in remote {
        assert!(
            f["backend"]
                .as_str()
                .is_some_and(|b| b.starts_with(&format!("{web1}:"))),
            "{f}"
        );
        assert_eq!(f["service"], "default/np-remote", "{f}");
    }
}
