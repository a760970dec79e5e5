//! weir-cni's result consumed by Debian's `tuning`, `portmap` and `bandwidth` chained after it,
//! at cniVersion 1.0.0 (what they speak), driven the way libcni drives a conflist: ADD in order
//! with each result as the next prevResult, CHECK with the final result, DEL in reverse order
//! with the final result.

use std::path::Path;

use serde_json::{Value, json};
use tests::{
    cni::{CniNode, Pod, exec_plugin, with_prev},
    privileged::require_root,
};

const DEBIAN_CNI: &str = "/usr/lib/cni";

#[test]
fn tuning_portmap_and_bandwidth_chain_after_weir() {
    if !require_root("tuning_portmap_and_bandwidth_chain_after_weir") {
        return;
    }
    if !Path::new(DEBIAN_CNI).join("portmap").is_file() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{DEBIAN_CNI} is missing under CI: install containernetworking-plugins"
        );
        eprintln!("skipping test - {DEBIAN_CNI} is missing");
        return;
    }
    let node = CniNode::start(&[]);
    let weir = node.conf(&json!({"cniVersion": "1.0.0"}));
    let chained: Vec<(&str, Value)> = vec![
        (
            "tuning",
            json!({"cniVersion": "1.0.0", "name": "wt-net", "type": "tuning",
                   "sysctl": {"net.ipv4.conf.eth0.accept_local": "1"}}),
        ),
        (
            "portmap",
            json!({"cniVersion": "1.0.0", "name": "wt-net", "type": "portmap",
                   "runtimeConfig": {"portMappings": [{"hostPort": 18080, "containerPort": 80, "protocol": "tcp"}]}}),
        ),
        (
            "bandwidth",
            json!({"cniVersion": "1.0.0", "name": "wt-net", "type": "bandwidth",
                   "runtimeConfig": {"bandwidth": {"ingressRate": 100_000_000, "ingressBurst": 1_000_000}}}),
        ),
    ];
    let pod = Pod::new();

    // ADD in order.
    let mut result = node.add(&pod, &weir);
    assert_eq!(result["cniVersion"], "1.0.0");
    assert!(
        result["interfaces"][0].get("mtu").is_none(),
        "1.0.0 has no interface mtu"
    );
    for (name, conf) in &chained {
        let out = exec_plugin(
            Some(&node.ns),
            &Path::new(DEBIAN_CNI).join(name),
            &pod.call("ADD"),
            with_prev(conf, Some(&result)).to_string().as_bytes(),
        );
        result = out.ok(&format!("{name} ADD")).clone();
    }
    // The chain kept weir's interfaces and addresses, and the plugins did their work.
    assert_eq!(result["interfaces"][1]["name"], "eth0");
    assert_eq!(result["ips"][0]["interface"], 1);
    let sysctl = pod
        .ns
        .exec(&["sysctl", "-n", "net.ipv4.conf.eth0.accept_local"]);
    assert_eq!(String::from_utf8_lossy(&sysctl.stdout).trim(), "1");
    let host = result["interfaces"][0]["name"]
        .as_str()
        .expect("host veth")
        .to_owned();
    let qdisc = node.ns.exec(&["tc", "qdisc", "show", "dev", &host]);
    assert!(
        String::from_utf8_lossy(&qdisc.stdout).contains("tbf"),
        "bandwidth installed no tbf on {host}"
    );
    let nat = node.ns.exec(&["iptables-save", "-t", "nat"]);
    assert!(String::from_utf8_lossy(&nat.stdout).contains("18080"));

    // CHECK of every plugin with the final result.
    node.exec(&pod.call("CHECK"), &with_prev(&weir, Some(&result)))
        .ok("weir CHECK after the chain");
    // portmap 1.1.1's CHECK looks for an IPv6 DNAT chain even for an IPv4-only pod and fails on
    // its own ADD's state, so it is left out.
    for (name, conf) in chained.iter().filter(|(n, _)| *n != "portmap") {
        exec_plugin(
            Some(&node.ns),
            &Path::new(DEBIAN_CNI).join(name),
            &pod.call("CHECK"),
            with_prev(conf, Some(&result)).to_string().as_bytes(),
        )
        .ok(&format!("{name} CHECK"));
    }

    // DEL in reverse order with the final result.
    for (name, conf) in chained.iter().rev() {
        exec_plugin(
            Some(&node.ns),
            &Path::new(DEBIAN_CNI).join(name),
            &pod.call("DEL"),
            with_prev(conf, Some(&result)).to_string().as_bytes(),
        )
        .ok(&format!("{name} DEL"));
    }
    node.del(&pod, &weir, Some(&result));
    let eps = node.api_get("/v1/endpoints");
    assert_eq!(eps.as_array().map(Vec::len), Some(0), "{eps}");
}
