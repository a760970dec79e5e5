//! weir writes no iptables or nftables rule (issue 13: no kube-proxy, no iptables), checked from
//! outside with `iptables-save`, `ip6tables-save` (and the legacy variants where installed) and
//! `nft list ruleset` (`tests::netfilter`): in the test's own namespace (the host's: read, never
//! written), the node namespace the agent runs in, the "outside" namespace and every pod's, a
//! snapshot before the agent starts equals one after it ran with pods through weir-cni (`ipMasq`),
//! a NetworkPolicy, a Service with its EndpointSlice in `--policy-dir` and masquerade on a `wt…`
//! interface — and after a restart and the pods' DEL. Traffic shows each feature at work: the
//! policy admits one pod and refuses another, the outside sees the node's address, the agent lists
//! the Service with its ready backend.
//!
//! Positive control, first: in a namespace of its own the test adds an iptables, an ip6tables
//! and an nftables rule; each shows in its part of the snapshot, and once removed the snapshot is
//! the empty one again.

use std::{
    io::{Read as _, Write as _},
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    time::Duration,
};

use serde_json::{Value, json};
use tests::{
    cni::{CniNode, Pod},
    netfilter::{Snapshot, snapshot},
    netns::{NetNs, VethPair},
    pod_doc::{write_atomically, write_pod},
    privileged::require_root,
};

const NODE: Ipv4Addr = Ipv4Addr::new(192, 168, 79, 2);
const OUTSIDE: Ipv4Addr = Ipv4Addr::new(192, 168, 79, 1);
const POOL: &str = "10.246.0.0/16";
const PORT: u16 = 8080;

/// The tools whose part of `a` and `b` differ.
fn differing(a: &Snapshot, b: &Snapshot) -> Vec<&'static str> {
    a.keys()
        .chain(b.keys())
        .filter(|k| a.get(*k) != b.get(*k))
        .copied()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// The positive control: rules the test adds in its own namespace show, and go.
fn control() {
    let ns = NetNs::new();
    let empty = snapshot(Some(&ns));
    ns.exec(&[
        "iptables",
        "-A",
        "INPUT",
        "-s",
        "192.0.2.99/32",
        "-j",
        "DROP",
    ]);
    let v4 = snapshot(Some(&ns));
    assert!(
        differing(&empty, &v4).contains(&"iptables-save"),
        "an iptables rule shows in iptables-save: {v4:?}"
    );
    ns.exec(&[
        "ip6tables",
        "-A",
        "INPUT",
        "-s",
        "2001:db8::99/128",
        "-j",
        "DROP",
    ]);
    let v6 = snapshot(Some(&ns));
    assert!(
        differing(&v4, &v6).contains(&"ip6tables-save"),
        "an ip6tables rule shows in ip6tables-save: {v6:?}"
    );
    ns.exec(&["nft", "add", "table", "inet", "wtctl"]);
    ns.exec(&[
        "nft",
        "add",
        "chain",
        "inet",
        "wtctl",
        "c",
        "{ type filter hook input priority 0 ; }",
    ]);
    ns.exec(&[
        "nft",
        "add",
        "rule",
        "inet",
        "wtctl",
        "c",
        "ip",
        "saddr",
        "192.0.2.98",
        "counter",
        "drop",
    ]);
    let nft = snapshot(Some(&ns));
    assert_eq!(
        differing(&v6, &nft),
        ["nft"],
        "an nftables table shows in nft list ruleset only"
    );
    ns.exec(&[
        "iptables",
        "-D",
        "INPUT",
        "-s",
        "192.0.2.99/32",
        "-j",
        "DROP",
    ]);
    ns.exec(&[
        "ip6tables",
        "-D",
        "INPUT",
        "-s",
        "2001:db8::99/128",
        "-j",
        "DROP",
    ]);
    ns.exec(&["nft", "delete", "table", "inet", "wtctl"]);
    // iptables over nf_tables leaves its tables and base chains behind; flushed, the namespace
    // is as it was.
    let backend = tests::netns::run(&["iptables", "-V"]);
    if String::from_utf8_lossy(&backend.stdout).contains("nf_tables") {
        ns.exec(&["nft", "flush", "ruleset"]);
        assert_eq!(
            snapshot(Some(&ns)),
            empty,
            "with the rules removed the snapshot is the empty one again"
        );
    }
}

/// One byte there and back from `ns` to `to`, bounded.
fn round_trip(ns: &NetNs, to: SocketAddr) -> bool {
    ns.run(move || {
        let Ok(mut s) = TcpStream::connect_timeout(&to, Duration::from_millis(700)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let mut b = [0u8; 1];
        s.write_all(b"w").is_ok() && s.read_exact(&mut b).is_ok()
    })
}

fn wait_for(what: &str, ok: impl FnMut() -> bool) {
    tests::wait::until(what, Duration::from_secs(20), ok);
}

const POLICY: &str = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: web, namespace: default}\nspec:\n  podSelector: {matchLabels: {app: web}}\n  ingress:\n  - from: [{podSelector: {matchLabels: {app: client}}}]\n    ports: [{protocol: TCP, port: 8080}]\n";

fn service_docs(backend: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: default}}\nspec: {{clusterIP: 10.96.0.10, ports: [{{name: http, port: 80, targetPort: {PORT}}}]}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: web-1, namespace: default, labels: {{kubernetes.io/service-name: web}}}}\naddressType: IPv4\nports: [{{name: http, port: {PORT}, protocol: TCP}}]\nendpoints:\n- {{addresses: [{backend}], conditions: {{ready: true}}}}\n"
    )
}

#[test]
fn weir_writes_no_iptables_or_nftables_rule() {
    if !require_root("weir_writes_no_iptables_or_nftables_rule") {
        return;
    }
    control();

    let host_before = snapshot(None);
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
    let pods: Vec<(&str, Pod)> = ["web", "client", "other"]
        .into_iter()
        .map(|app| (app, Pod::k8s("default", app)))
        .collect();
    let before: Vec<(String, Snapshot)> = [&outside, &node_ns]
        .into_iter()
        .chain(pods.iter().map(|(_, p)| &p.ns))
        .map(|ns| (ns.name().to_owned(), snapshot(Some(ns))))
        .collect();

    let mut node = CniNode::start_in(
        node_ns,
        &["--pool", POOL, "--masquerade-interfaces", &wire.b],
    );
    let policies = node.dirs.path("policies");
    for (app, _) in &pods {
        write_pod(&policies, "default", app, &[("app", app)], &[]);
    }
    write_atomically(&policies, "web-policy.yaml", POLICY);
    let conf = node.conf(&json!({"ipMasq": true}));
    let results: Vec<Value> = pods.iter().map(|(_, p)| node.add(p, &conf)).collect();
    let ip = |i: usize| -> IpAddr { Pod::ipv4(&results[i]).parse().expect("pod address") };
    write_atomically(
        &policies,
        "web-service.yaml",
        &service_docs(&ip(0).to_string()),
    );

    // Each feature at work: the policy, the masquerade, the Service taken by the agent.
    let web = SocketAddr::new(ip(0), PORT);
    let _web_accepted = tests::echo::serve(
        pods[0]
            .1
            .ns
            .run(move || TcpListener::bind(web).expect("bind")),
    );
    wait_for("the policy admits client and refuses other", || {
        round_trip(&pods[1].1.ns, web) && !round_trip(&pods[2].1.ns, web)
    });
    let server = outside.run(|| TcpListener::bind((OUTSIDE, 0)).expect("bind"));
    let server_addr = server.local_addr().expect("addr");
    let accepted = tests::echo::serve(server);
    assert!(
        round_trip(&pods[1].1.ns, server_addr),
        "client reaches the outside"
    );
    assert_eq!(
        tests::echo::peers(&accepted, 1),
        vec![IpAddr::V4(NODE)],
        "masqueraded: the outside sees the node's address"
    );
    let want_backend = SocketAddr::new(ip(0), PORT).to_string();
    wait_for("the agent lists the Service with its ready backend", || {
        let listed = node.api_get("/v1/services");
        listed[0]["backends"][0]["address"] == want_backend.as_str()
            && listed[0]["backends"][0]["state"] == "ready"
    });

    let all = |node: &CniNode| -> Vec<Snapshot> {
        namespaces(&outside, node, &pods)
            .into_iter()
            .map(|ns| snapshot(Some(ns)))
            .collect()
    };
    let compare = |when: &str, now: Vec<Snapshot>| {
        assert_eq!(
            snapshot(None),
            host_before,
            "{when}: the test's own (host) namespace's rules changed"
        );
        for ((name, was), now) in before.iter().zip(&now) {
            assert_eq!(
                now,
                was,
                "{when}: netfilter rules changed in namespace {name}: {:?}",
                differing(was, now)
            );
        }
    };
    compare("with the agent running", all(&node));
    node.restart_agent();
    wait_for("the restarted agent lists the Service", || {
        node.api_get("/v1/services")[0]["service"] == "default/web"
    });
    assert!(
        round_trip(&pods[1].1.ns, web) && round_trip(&pods[1].1.ns, server_addr),
        "traffic after the restart"
    );
    compare("after a restart", all(&node));
    for ((_, pod), result) in pods.iter().zip(&results) {
        node.del(pod, &conf, Some(result));
    }
    compare("after the pods' DEL", all(&node));
}

/// The namespaces `before` was taken of, in its order: outside, node, pods.
fn namespaces<'a>(
    outside: &'a NetNs,
    node: &'a CniNode,
    pods: &'a [(&str, Pod)],
) -> Vec<&'a NetNs> {
    [outside, &node.ns]
        .into_iter()
        .chain(pods.iter().map(|(_, p)| &p.ns))
        .collect()
}
