//! weir-cni attaches the programs of the agent it talks to. Against an agent with a pin root of
//! its own (every test agent has one): a conflist without `bpfRoot` takes the agent's, and the pod
//! carries traffic; a `bpfRoot` that disagrees makes ADD fail (code 101) naming both roots, leaving nothing
//! behind (no endpoint, no address, no veth) — never an ADD that succeeds into a pod that reaches
//! nothing.

use std::{
    net::{SocketAddr, TcpListener, TcpStream},
    time::Duration,
};

use serde_json::{Value, json};
use tests::{
    cni::{CniNode, Pod},
    privileged::require_root,
};

/// The conf without `bpfRoot` (the harness sets it by default).
fn conf_without_root(node: &CniNode) -> Value {
    let mut conf = node.conf(&json!({}));
    conf.as_object_mut().expect("object").remove("bpfRoot");
    conf
}

fn weir_links(node: &CniNode) -> usize {
    let out = node.ns.exec(&["ip", "-o", "link", "show"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.split(": ").nth(1).is_some_and(|n| n.starts_with("weir")))
        .count()
}

#[test]
fn weir_cni_takes_the_agents_pin_root_and_refuses_a_disagreeing_one() {
    if !require_root("weir_cni_takes_the_agents_pin_root_and_refuses_a_disagreeing_one") {
        return;
    }
    let node = CniNode::start(&[]);
    assert_ne!(
        node.root.path(),
        std::path::Path::new("/sys/fs/bpf/weir"),
        "the agent's pin root is not the default one"
    );

    // No bpfRoot: the agent's programs, and the pods talk.
    let conf = conf_without_root(&node);
    let server = Pod::new();
    let client = Pod::new();
    let server_result = node.add(&server, &conf);
    let client_result = node.add(&client, &conf);
    let server_ip = Pod::ipv4(&server_result);
    // Both pods' veths run the programs pinned under the agent's pin root (read from outside:
    // the filters, or tcx link pins).
    let pinned: Vec<Option<u64>> = tests::hooks::PROGRAMS
        .iter()
        .map(|p| {
            let pin = node.root.path().join("progs").join(p);
            tests::bpf::bpftool(&["prog", "show", "pinned", &pin.display().to_string()])["id"]
                .as_u64()
        })
        .collect();
    let running = tests::hooks::hook_programs(&node.ns, &node.root)
        .values()
        .filter(|h| h.to_vec() == pinned)
        .count();
    assert!(
        running >= 2,
        "both pods run the programs under the agent's pin root ({running} veths do)"
    );
    let addr: SocketAddr = format!("{server_ip}:8080").parse().expect("addr");
    let listener = server
        .ns
        .run(move || TcpListener::bind(addr))
        .expect("listen in the server pod");
    listener.set_nonblocking(true).expect("nonblocking");
    let connected = client
        .ns
        .run(move || TcpStream::connect_timeout(&addr, Duration::from_secs(3)).is_ok());
    assert!(connected, "the client pod reaches the server pod");
    node.del(&client, &conf, Some(&client_result));
    node.del(&server, &conf, Some(&server_result));

    // A bpfRoot that disagrees: refused after nothing was left behind.
    let mut wrong = node.conf(&json!({}));
    wrong["bpfRoot"] = json!("/sys/fs/bpf/wt-not-the-agents");
    let pod = Pod::new();
    let msg = node
        .exec(&pod.call("ADD"), &wrong)
        .err(101, "ADD with a wrong bpfRoot");
    assert!(
        msg.contains("bpfRoot")
            && msg.contains("/sys/fs/bpf/wt-not-the-agents")
            && msg.contains(&node.root.path().display().to_string()),
        "the error names both roots: {msg}"
    );
    assert_eq!(node.addresses_in_use(), 0, "the allocation was rolled back");
    assert!(
        node.api_get("/v1/endpoints")
            .as_array()
            .is_some_and(Vec::is_empty),
        "no endpoint was registered"
    );
    assert_eq!(weir_links(&node), 0, "no veth is left");
}
