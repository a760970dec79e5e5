//! Pool and address annotations through `weir-cni`, as kubelet's runtime calls it (only
//! `K8S_POD_NAMESPACE`/`K8S_POD_NAME`): the agent reads `weir.dev/ipv4pools` on the Pod and on
//! its Namespace and `weir.dev/ipAddrs` on the Pod from its standalone directory, pod over
//! namespace over the CNI config's `ipam.pools`. A bad annotation (unknown pool, an address outside
//! every pool, an address in use, a value that is not a JSON list) fails ADD with a message naming
//! it, and leaves nothing behind.

use std::{net::IpAddr, process::Command, time::Duration};

use ipnetwork::IpNetwork;
use serde_json::{Value, json};
use tests::{
    bin,
    cni::{CniNode, Pod},
    pod_doc::{annotated_pod_yaml, namespace_yaml, write_atomically},
    privileged::require_root,
};

const DEFAULT_POOL: &str = "default-ipv4";
const BLUE: &str = "10.77.0.0/24";

fn weir_ipam(node: &CniNode, args: &[&str]) -> Value {
    let out = Command::new(bin::weir())
        .arg("ipam")
        .args(args)
        .args(["-o", "json", "--datastore"])
        .arg(format!(
            "embedded:{}",
            node.dirs.path("state/ipam.redb").display()
        ))
        .arg("--api-socket")
        .arg(node.socket())
        .output()
        .expect("run weir ipam");
    assert!(
        out.status.success(),
        "weir ipam {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

/// The CIDR of every pool, by name.
fn pool_cidrs(node: &CniNode) -> Vec<(String, IpNetwork)> {
    weir_ipam(node, &["pool", "list"])
        .as_array()
        .expect("pools")
        .iter()
        .map(|p| {
            (
                p["name"].as_str().expect("name").to_owned(),
                p["cidr"].as_str().expect("cidr").parse().expect("a CIDR"),
            )
        })
        .collect()
}

fn pool_of(pools: &[(String, IpNetwork)], ip: IpAddr) -> Option<&str> {
    pools
        .iter()
        .find(|(_, cidr)| cidr.contains(ip))
        .map(|(name, _)| name.as_str())
}

fn endpoints(node: &CniNode) -> usize {
    node.api_get("/v1/endpoints").as_array().map_or(0, Vec::len)
}

fn weir_links(node: &CniNode) -> usize {
    let out = node.ns.exec(&["ip", "-j", "link", "show"]);
    let links: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    links
        .as_array()
        .into_iter()
        .flatten()
        .filter(|l| l["ifname"].as_str().is_some_and(|n| n.starts_with("weir")))
        .count()
}

/// Waits until the agent has read the directory with `marker` (a NetworkPolicy written after
/// every other document: a read that has it has them too).
fn wait_for_documents(node: &CniNode) {
    write_atomically(
        &node.dirs.path("policies"),
        "zz-marker.yaml",
        "kind: NetworkPolicy\nmetadata: {name: marker, namespace: default}\nspec: {podSelector: {matchLabels: {none: none}}}\n",
    );
    tests::wait::until_ok(
        "the agent reads the documents",
        Duration::from_secs(15),
        || {
            let status = node.api_get("/v1/status");
            if status["state"]["policies"].as_u64() == Some(1) {
                Ok(())
            } else {
                Err(format!("status: {status}"))
            }
        },
    );
}

/// A Pod document: namespace, name, annotations.
type PodDoc<'a> = (&'a str, &'a str, Vec<(&'a str, String)>);

#[test]
fn pool_and_address_annotations_of_pod_and_namespace_choose_the_addresses() {
    if !require_root("pool_and_address_annotations_of_pod_and_namespace_choose_the_addresses") {
        return;
    }
    let node = CniNode::start(&[]);
    weir_ipam(&node, &["pool", "add", "blue", "--cidr", BLUE]);
    let pools = pool_cidrs(&node);
    let blue: ipnetwork::Ipv4Network = BLUE.parse().expect("cidr");
    assert!(
        pools.iter().any(|(n, _)| n == DEFAULT_POOL) && pools.iter().any(|(n, _)| n == "blue"),
        "{pools:?}"
    );
    // An address of blue the test picks: its 50th.
    let wanted = IpAddr::V4(blue.nth(50).expect("blue has 50 addresses"));

    let dir = node.dirs.path("policies");
    let blue_pools = r#"["blue"]"#;
    write_atomically(
        &dir,
        "ns-tenant.yaml",
        &namespace_yaml("tenant", &[], &[("weir.dev/ipv4pools", blue_pools)]),
    );
    let pods: [PodDoc<'_>; 7] = [
        ("default", "plain", vec![]),
        ("tenant", "from-ns", vec![]),
        (
            "tenant",
            "from-pod",
            vec![("weir.dev/ipv4pools", format!(r#"["{DEFAULT_POOL}"]"#))],
        ),
        (
            "tenant",
            "exact",
            vec![("weir.dev/ipAddrs", format!(r#"["{wanted}"]"#))],
        ),
        (
            "tenant",
            "taken",
            vec![("weir.dev/ipAddrs", format!(r#"["{wanted}"]"#))],
        ),
        (
            "tenant",
            "nosuch",
            vec![("weir.dev/ipv4pools", r#"["nosuch"]"#.to_owned())],
        ),
        (
            "tenant",
            "outside",
            vec![("weir.dev/ipAddrs", r#"["192.0.2.9"]"#.to_owned())],
        ),
    ];
    for (ns, name, annotations) in &pods {
        let annotations: Vec<(&str, &str)> =
            annotations.iter().map(|(k, v)| (*k, v.as_str())).collect();
        write_atomically(
            &dir,
            &format!("pod-{ns}-{name}.yaml"),
            &annotated_pod_yaml(ns, name, &[("app", name)], &annotations),
        );
    }
    write_atomically(
        &dir,
        "pod-tenant-garbled.yaml",
        &annotated_pod_yaml("tenant", "garbled", &[], &[("weir.dev/ipv4pools", "blue")]),
    );
    wait_for_documents(&node);

    // The CNI config names the default pool: what a pod without annotations gets.
    let conf = node.conf(&json!({"ipam": {"pools": [DEFAULT_POOL]}}));
    let add = |ns: &str, name: &str| {
        let pod = Pod::k8s(ns, name);
        let result = node.add(&pod, &conf);
        let ip: IpAddr = Pod::ipv4(&result).parse().expect("an address");
        (pod, result, ip)
    };
    let mut added = Vec::new();
    for (ns, name, expect_pool) in [
        ("default", "plain", DEFAULT_POOL),
        ("tenant", "from-ns", "blue"),
        ("tenant", "from-pod", DEFAULT_POOL),
    ] {
        let (pod, result, ip) = add(ns, name);
        assert_eq!(
            pool_of(&pools, ip),
            Some(expect_pool),
            "{ns}/{name} got {ip}"
        );
        added.push((pod, result));
    }
    let (pod, result, ip) = add("tenant", "exact");
    assert_eq!(ip, wanted, "weir.dev/ipAddrs is the address");
    added.push((pod, result));
    let in_use = node.addresses_in_use();
    assert_eq!(in_use, added.len() as u64);

    for (name, code, needles) in [
        (
            "taken",
            102,
            vec!["weir.dev/ipAddrs", "pod tenant/taken", "already allocated"],
        ),
        (
            "nosuch",
            7,
            vec![
                "weir.dev/ipv4pools",
                "pod tenant/nosuch",
                "\"nosuch\"",
                "does not exist",
            ],
        ),
        (
            "outside",
            102,
            vec![
                "weir.dev/ipAddrs",
                "pod tenant/outside",
                "192.0.2.9",
                "not in any pool",
            ],
        ),
        (
            "garbled",
            103,
            vec!["weir.dev/ipv4pools", "pod tenant/garbled", "JSON list"],
        ),
    ] {
        let pod = Pod::k8s("tenant", name);
        let message = node.exec(&pod.call("ADD"), &conf).err(code, name);
        for needle in needles {
            assert!(
                message.contains(needle),
                "{name}: {message:?} does not mention {needle:?}"
            );
        }
    }
    // The refused ADDs left nothing: no address, endpoint or veth more than the four pods'.
    assert_eq!(node.addresses_in_use(), in_use);
    assert_eq!(endpoints(&node), added.len());
    assert_eq!(weir_links(&node), added.len());

    for (pod, result) in &added {
        node.del(pod, &conf, Some(result));
    }
    assert_eq!(node.addresses_in_use(), 0);
    assert_eq!(endpoints(&node), 0);
}
