//! The agent with real workload veths (`weir*`, inside a test node namespace): the link watcher
//! attaches both programs to every workload link; an endpoint registered through the API passes
//! traffic while an unregistered veth beside it passes none (positive control); stopping the
//! agent changes neither; a restart over unchanged state writes nothing (same map, program and
//! link ids, zero driver writes); deleting the endpoint closes it again and releases its address;
//! an allocation no endpoint confirms is released when it expires.

use std::{
    net::UdpSocket,
    time::{Duration, Instant},
};

use hyper::Method;
use serde_json::{Value, json};
use tests::{
    agent_proc::{AgentDirs, AgentProcess},
    bpf::{PinRoot, bpftool},
    netns::{NetNs, VethPair},
    pod::{GATEWAY, plumb, workload_name},
    privileged::require_root,
};

/// Datagrams from `pod` (bound to `ip`) that reach a socket in the node namespace within `within`.
fn delivered(node: &NetNs, pod: &NetNs, ip: &str, port: u16, within: Duration) -> usize {
    let rx = node.run(|| UdpSocket::bind(("0.0.0.0", port)).expect("bind in node"));
    rx.set_read_timeout(Some(Duration::from_millis(100)))
        .expect("timeout");
    let tx = pod.run(|| UdpSocket::bind((ip, 0)).expect("bind in pod"));
    let deadline = Instant::now() + within;
    let (mut got, mut buf) = (0, [0u8; 16]);
    while Instant::now() < deadline && got < 3 {
        let _ = tx.send_to(b"weir", (GATEWAY, port));
        if rx.recv_from(&mut buf).is_ok() {
            got += 1;
        }
    }
    got
}

/// The programs on both hooks of `ifname` (whichever mechanism), read from outside.
fn link_ids(node: &NetNs, root: &PinRoot, ifname: &str) -> [Option<u64>; 2] {
    let ids = tests::hooks::programs_on(node, root, ifname);
    assert!(ids.iter().all(Option::is_some), "{ifname}: {ids:?}");
    ids
}

fn wait_for(what: &str, f: impl FnMut() -> bool) {
    tests::wait::until(what, Duration::from_secs(20), f);
}

#[test]
fn registered_endpoints_pass_unregistered_drop_and_restarts_write_nothing() {
    if !require_root("registered_endpoints_pass_unregistered_drop_and_restarts_write_nothing") {
        return;
    }
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    let paths = root.paths();
    let node = NetNs::new();
    let (pod1, pod2) = (NetNs::new(), NetNs::new());
    let agent = AgentProcess::start(&root, &dirs, Some(&node), &[]);

    // Two workload veths appear after the agent started: both get both programs.
    let (w1, w2) = (workload_name(), workload_name());
    let veth1 = VethPair::named(&node, &w1, &pod1, "eth0");
    let veth2 = VethPair::named(&node, &w2, &pod2, "eth0");
    tests::hooks::wait_attached(&node, &root, &[&w1, &w2], Duration::from_secs(20));

    // Allocate and register pod1 only.
    let alloc: Value = agent
        .api(
            Method::POST,
            "/v1/ipam/allocate",
            Some(&json!({"handle": "wt-net.c1", "ipv4": 1})),
        )
        .expect("allocate");
    let ip1 = alloc["ips"][0].as_str().expect("an address").to_owned();
    plumb(&node, &pod1, &veth1, &ip1);
    plumb(&node, &pod2, &veth2, "10.244.255.250");
    let endpoint = json!({
        "container_id": "c1", "ifname": "eth0", "host_ifname": w1, "namespace": "default",
        "pod": "p1", "labels": {"app": "web"}, "handle": "wt-net.c1", "ips": [ip1],
    });
    let view: Value = agent
        .api(Method::PUT, "/v1/endpoints/c1:eth0", Some(&endpoint))
        .expect("register");
    let ifindex1 = view["ifindex"].as_u64().expect("ifindex");
    // From outside: the endpoint map holds the entry the moment the API answered.
    let dump = bpftool(&[
        "map",
        "dump",
        "pinned",
        &paths.map_pin("endpoints_v1").display().to_string(),
    ]);
    let keys: Vec<u64> = dump
        .as_array()
        .expect("entries")
        .iter()
        .filter_map(|e| e["formatted"]["key"].as_u64())
        .collect();
    assert_eq!(
        keys,
        vec![ifindex1],
        "exactly the registered endpoint is in endpoints_v1"
    );

    assert!(
        delivered(&node, &pod1, &ip1, 7001, Duration::from_secs(10)) > 0,
        "a registered endpoint passes"
    );
    assert_eq!(
        delivered(&node, &pod2, "10.244.255.250", 7002, Duration::from_secs(2)),
        0,
        "an unregistered veth passes nothing"
    );

    // Stopping the agent changes neither.
    let ids_before = (
        tests::bpf::pinned_ids(&root.paths()),
        link_ids(&node, &root, &w1),
        link_ids(&node, &root, &w2),
    );
    assert!(agent.terminate().success());
    assert!(
        delivered(&node, &pod1, &ip1, 7003, Duration::from_secs(10)) > 0,
        "still passes with the agent stopped"
    );
    assert_eq!(
        delivered(&node, &pod2, "10.244.255.250", 7004, Duration::from_secs(2)),
        0,
        "still closed with the agent stopped"
    );

    // Restart over unchanged state: nothing is written; ids stay.
    let agent = AgentProcess::start(&root, &dirs, Some(&node), &[]);
    assert_eq!(
        agent.started["endpoints"], 1,
        "the endpoint is restored from the registry"
    );
    let ids_after = (
        tests::bpf::pinned_ids(&root.paths()),
        link_ids(&node, &root, &w1),
        link_ids(&node, &root, &w2),
    );
    assert_eq!(
        ids_before, ids_after,
        "map ids and the programs on both links are unchanged by a restart"
    );
    let status: Value = agent.api(Method::GET, "/v1/status", None).expect("status");
    assert_eq!(
        status["dataplane"]["attachments"]["attaches"], 0,
        "{status}"
    );
    assert_eq!(status["dataplane"]["attachments"]["updates"], 0, "{status}");
    assert_eq!(status["dataplane"]["attachments"]["unpins"], 0, "{status}");
    for (map, stats) in status["dataplane"]["maps"]
        .as_array()
        .expect("maps")
        .iter()
        .map(|m| (&m[0], &m[1]))
    {
        assert_eq!(
            stats["writes"], 0,
            "{map}: a restart over unchanged state writes nothing"
        );
        assert_eq!(stats["deletes"], 0, "{map}");
    }
    assert!(delivered(&node, &pod1, &ip1, 7005, Duration::from_secs(10)) > 0);

    // Delete with release: closed again, and the address is free.
    let deleted: Value = agent
        .api(Method::DELETE, "/v1/endpoints/c1:eth0?release=true", None)
        .expect("delete");
    assert_eq!(deleted["deleted"], true);
    assert_eq!(deleted["released"][0], ip1.as_str());
    assert_eq!(
        delivered(&node, &pod1, &ip1, 7006, Duration::from_secs(2)),
        0,
        "a deleted endpoint is closed"
    );
    let again: Value = agent
        .api(Method::DELETE, "/v1/endpoints/c1:eth0?release=true", None)
        .expect("delete again");
    assert_eq!(again["deleted"], false, "DELETE is idempotent");

    // An allocation nobody confirms is released at expiry.
    let alloc: Value = agent
        .api(
            Method::POST,
            "/v1/ipam/allocate",
            Some(&json!({"handle": "wt-net.c2", "ipv4": 1, "expires_in_secs": 1})),
        )
        .expect("allocate");
    let ip2 = alloc["ips"][0].as_str().expect("an address").to_owned();
    wait_for("the unconfirmed allocation to expire", || {
        let r: Value = agent
            .api(
                Method::POST,
                "/v1/ipam/release",
                Some(&json!({"ips": [ip2]})),
            )
            .expect("release");
        r["not_allocated"].as_array().is_some_and(|a| !a.is_empty())
    });

    // Bad input gets a clear error and changes nothing.
    let err = agent
        .api::<Value>(Method::PUT, "/v1/endpoints/c9:eth0", Some(&json!({"container_id": "c9", "ifname": "eth0", "host_ifname": "eth0", "handle": "h", "ips": []})))
        .expect_err("a non-workload host link is refused")
        .to_string();
    assert!(err.contains("invalid-request"), "{err}");
    let list: Vec<Value> = agent.api(Method::GET, "/v1/endpoints", None).expect("list");
    assert!(list.is_empty());
    assert!(agent.terminate().success());
    drop((veth1, veth2));
}
