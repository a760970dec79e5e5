//! Node identities with real packets (docs/node-identities.md; `tests::multinode`): two node
//! namespaces, a real etcd, one agent each, native routing.
//!
//! - node A's agent gives node B's underlay address the `remote-node` identity (`GET /v1/addresses`,
//!   what `weir status --all-addresses` prints), learnt from B's node record;
//! - a pod on A under an ingress policy allowing only an `ipBlock` covering B's address: B's host
//!   namespace connects, B's pod (outside the block) does not, A's own host namespace (kubelet-style
//!   probe) does — expected from the block and the host rule, with every source connecting before
//!   the policy (the positive control).

use std::{
    net::{IpAddr, SocketAddr, TcpStream},
    time::Duration,
};

use ipnetwork::IpNetwork;
use maps_schema::identity::{FIRST_ALLOCATED, REMOTE_NODE};
use tests::{
    multinode::{Cluster, Node},
    netns::NetNs,
    netpol_probe::Servers,
    node_lab::eventually,
    pod_doc::{write_atomically, write_pod},
    privileged::require_root,
};

const PORT_TCP: u16 = 8080;
const BOUND: Duration = Duration::from_secs(45);

fn connects(from: &NetNs, to: &str) -> bool {
    let addr: SocketAddr = format!("{to}:{PORT_TCP}").parse().expect("addr");
    from.run(|| TcpStream::connect_timeout(&addr, Duration::from_millis(1500)).is_ok())
}

/// The identity node `on` gives `ip` (its address list), if listed.
fn identity_on(on: &Node, ip: &str) -> Option<u64> {
    on.cni
        .api_get("/v1/addresses")
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["ip"] == ip)
        .and_then(|a| a["identity"].as_u64())
}

#[test]
fn an_ipblock_selects_another_nodes_address_and_the_local_host_may_probe() {
    if !require_root("an_ipblock_selects_another_nodes_address_and_the_local_host_may_probe") {
        return;
    }
    let mut cluster = Cluster::new(&["--node-expiry", "30"]);
    for (i, app) in ["web", "client"].iter().enumerate() {
        let node = cluster.add_node();
        let name = format!("p{i}");
        write_pod(
            &node.cni.dirs.path("policies"),
            "default",
            &name,
            &[("app", app)],
            &[],
        );
        node.add_pod("default", &name);
    }
    let (a, b) = (cluster.node(0), cluster.node(1));
    let web = tests::cni::Pod::ipv4(&a.pods[0].1);
    let _servers = Servers::start(&a.pods[0].0.ns, &[PORT_TCP], &[]);

    assert!(
        eventually(BOUND, || identity_on(a, &b.address)
            == Some(u64::from(REMOTE_NODE))),
        "node A never gave node B's address {} the remote-node identity: {}",
        b.address,
        a.cni.api_get("/v1/addresses")
    );

    // The sources, with their addresses as the pod on A sees them.
    let sources: [(&str, &NetNs, String); 3] = [
        ("node B's host", &b.cni.ns, b.address.clone()),
        (
            "node B's pod",
            &b.pods[0].0.ns,
            tests::cni::Pod::ipv4(&b.pods[0].1),
        ),
        ("node A's host", &a.cni.ns, a.address.clone()),
    ];
    for (what, ns, _) in &sources {
        assert!(
            eventually(BOUND, || connects(ns, &web)),
            "{what} cannot reach {web} before any policy (routes or the control are broken)"
        );
    }

    let block: IpNetwork = format!("{}/32", b.address).parse().expect("block");
    write_atomically(
        &a.cni.dirs.path("policies"),
        "policies.yaml",
        &format!(
            "kind: NetworkPolicy\nmetadata: {{name: nodes, namespace: default}}\nspec:\n  \
             podSelector: {{matchLabels: {{app: web}}}}\n  ingress:\n  - from: [{{ipBlock: {{cidr: {block}}}}}]\n"
        ),
    );
    let expected = |src: &str| {
        let ip: IpAddr = src.parse().expect("ip");
        block.contains(ip) || src == a.address
    };
    // In force once the pod outside the block is denied (then the others must hold at once).
    assert!(
        eventually(BOUND, || !connects(sources[1].1, &web)),
        "node B's pod still reaches {web} under a policy allowing only {block}"
    );
    for (what, ns, src) in &sources {
        assert_eq!(
            connects(ns, &web),
            expected(src),
            "{what} ({src}) → {web} under ingress from {block} only"
        );
    }
    // Under the block, B's address takes the CIDR's identity (an allocated one), not remote-node.
    let cidr_identity = identity_on(a, &b.address).expect("node B's address listed");
    assert!(
        cidr_identity >= u64::from(FIRST_ALLOCATED),
        "node B's address under the block has identity {cidr_identity}"
    );
}
