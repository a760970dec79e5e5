//! weir-cni as a runtime runs it: ADD, CHECK, DEL against real namespaces and a real agent.

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use tests::{
    cni::{CniNode, Pod, with_prev},
    pod_doc::write_pod,
    privileged::require_root,
};

fn link_names(ns: &tests::netns::NetNs) -> Vec<String> {
    let out = ns.exec(&["ip", "-j", "link", "show"]);
    let links: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    links
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l["ifname"].as_str().map(str::to_owned))
        .collect()
}

fn weir_links(node: &CniNode) -> Vec<String> {
    link_names(&node.ns)
        .into_iter()
        .filter(|n| n.starts_with("weir"))
        .collect()
}

fn endpoints(node: &CniNode) -> Vec<Value> {
    node.api_get("/v1/endpoints")
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[test]
fn add_builds_the_pod_network_and_del_removes_it() {
    if !require_root("add_builds_the_pod_network_and_del_removes_it") {
        return;
    }
    let node = CniNode::start(&[]);
    let pod = Pod::k8s("default", "web-0");
    // args.cni.labels is no longer a label source: ADD refuses it, saying where labels come from.
    let labelled = node
        .conf(&json!({"mtu": 1400, "args": {"cni": {"labels": [{"key": "app", "value": "web"}]}}}));
    let refused = node
        .exec(&pod.call("ADD"), &labelled)
        .err(7, "ADD with args.cni.labels");
    assert!(
        refused.contains("args.cni.labels is no longer a label source")
            && refused.contains("kind: Pod"),
        "{refused}"
    );
    assert!(
        endpoints(&node).is_empty(),
        "the refused ADD registered nothing"
    );
    // The labels come from the pod's Pod document in the policy directory.
    write_pod(
        &node.dirs.path("policies"),
        "default",
        "web-0",
        &[("app", "web")],
        &[],
    );
    let conf = node.conf(&json!({"mtu": 1400}));
    let result = node.add(&pod, &conf);

    // The result: host veth without sandbox, pod interface with it, /32 on interface 1, routes.
    assert_eq!(result["cniVersion"], "1.1.0");
    let host = result["interfaces"][0]["name"].as_str().expect("host name");
    assert!(host.starts_with("weir") && host.len() == 15, "{result}");
    assert!(result["interfaces"][0].get("sandbox").is_none(), "{result}");
    assert_eq!(result["interfaces"][1]["name"], "eth0");
    assert_eq!(
        result["interfaces"][1]["sandbox"],
        pod.netns_path().as_str()
    );
    assert_eq!(result["interfaces"][1]["mtu"], 1400);
    assert_eq!(result["ips"][0]["interface"], 1);
    assert!(
        result["ips"][0]["address"]
            .as_str()
            .expect("address")
            .ends_with("/32"),
        "{result}"
    );
    assert_eq!(result["ips"][0]["gateway"], "169.254.1.1");
    assert_eq!(
        result["routes"][0],
        json!({"dst": "0.0.0.0/0", "gw": "169.254.1.1"})
    );
    let ip = Pod::ipv4(&result);

    // The kernel agrees, seen from outside.
    let addr = pod
        .ns
        .exec(&["ip", "-4", "-o", "addr", "show", "dev", "eth0"]);
    assert!(String::from_utf8_lossy(&addr.stdout).contains(&format!("{ip}/32")));
    let routes = String::from_utf8_lossy(&pod.ns.exec(&["ip", "-4", "route"]).stdout).into_owned();
    assert!(
        routes.contains("default via 169.254.1.1 dev eth0"),
        "{routes}"
    );
    let mtu =
        String::from_utf8_lossy(&pod.ns.exec(&["ip", "link", "show", "eth0"]).stdout).into_owned();
    assert!(mtu.contains("mtu 1400") && mtu.contains("UP"), "{mtu}");
    let host_routes =
        String::from_utf8_lossy(&node.ns.exec(&["ip", "-4", "route"]).stdout).into_owned();
    assert!(
        host_routes.contains(&format!("{ip} dev {host}")),
        "{host_routes}"
    );
    // Each program runs at its hook of the host veth, checked from outside with bpftool (the
    // filter, or the tcx link pin): it is the program the agent pinned.
    let hooks = tests::hooks::programs_on(&node.ns, &node.root, host);
    for (program, on_hook) in tests::hooks::PROGRAMS.iter().zip(hooks) {
        let prog_pin = node.root.path().join("progs").join(program);
        let prog =
            tests::bpf::bpftool(&["prog", "show", "pinned", &prog_pin.display().to_string()]);
        assert!(on_hook.is_some(), "{program}: nothing attached to {host}");
        assert_eq!(
            on_hook,
            prog["id"].as_u64(),
            "{program}: {host} runs another program"
        );
    }

    // The agent has the endpoint with the pod's labels (from its Pod document, read within a
    // poll of the directory).
    let deadline = Instant::now() + Duration::from_secs(10);
    let eps = loop {
        let eps = endpoints(&node);
        if eps.first().is_some_and(|e| e["labels"]["app"] == "web") || Instant::now() > deadline {
            break eps;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(eps.len(), 1, "{eps:?}");
    assert_eq!(eps[0]["host_ifname"], host);
    assert_eq!(eps[0]["labels"]["app"], "web");
    assert_eq!(eps[0]["handle"], format!("wt-net.{}", pod.id));

    // CHECK passes on an untouched pod (the positive control for the drift test).
    node.exec(&pod.call("CHECK"), &with_prev(&conf, Some(&result)))
        .ok("CHECK");

    node.del(&pod, &conf, Some(&result));
    assert!(endpoints(&node).is_empty());
    assert!(weir_links(&node).is_empty(), "{:?}", weir_links(&node));
    assert!(!link_names(&pod.ns).contains(&"eth0".to_owned()));
    assert!(
        !node
            .root
            .path()
            .join("links")
            .join(format!("{host}:from_endpoint"))
            .exists()
    );
}

#[test]
fn del_is_idempotent_without_netns_prev_result_or_namespace() {
    if !require_root("del_is_idempotent_without_netns_prev_result_or_namespace") {
        return;
    }
    let node = CniNode::start(&[]);
    let conf = node.conf(&json!({}));

    // A second DEL, and a DEL without prevResult.
    let pod = Pod::new();
    let result = node.add(&pod, &conf);
    node.del(&pod, &conf, Some(&result));
    node.del(&pod, &conf, None);

    // A DEL without CNI_NETNS.
    let pod = Pod::new();
    node.add(&pod, &conf);
    let mut call = pod.call("DEL");
    call.netns = None;
    node.exec(&call, &conf).ok("DEL without CNI_NETNS");
    assert!(weir_links(&node).is_empty());

    // A DEL after the namespace is gone.
    let pod = Pod::new();
    let result = node.add(&pod, &conf);
    let id = pod.id.clone();
    let netns = pod.netns_path();
    drop(pod);
    let call = tests::cni::Call {
        command: "DEL",
        container_id: Some(&id),
        netns: Some(netns),
        ifname: Some("eth0"),
        args: None,
    };
    node.exec(&call, &with_prev(&conf, Some(&result)))
        .ok("DEL after the netns is gone");
    assert!(
        endpoints(&node)
            .iter()
            .all(|e| e["container_id"] != id.as_str())
    );
    assert!(weir_links(&node).is_empty());
    assert!(endpoints(&node).is_empty());
}

#[test]
fn check_catches_a_removed_route() {
    if !require_root("check_catches_a_removed_route") {
        return;
    }
    let node = CniNode::start(&[]);
    let conf = node.conf(&json!({}));
    let pod = Pod::new();
    let result = node.add(&pod, &conf);
    let check = with_prev(&conf, Some(&result));
    node.exec(&pod.call("CHECK"), &check).ok("CHECK before");
    pod.ns.exec(&["ip", "route", "del", "default"]);
    let msg = node
        .exec(&pod.call("CHECK"), &check)
        .err(105, "CHECK after");
    assert!(msg.contains("default route via 169.254.1.1"), "{msg}");
    node.del(&pod, &conf, Some(&result));
}

#[test]
fn check_catches_a_released_allocation() {
    if !require_root("check_catches_a_released_allocation") {
        return;
    }
    let node = CniNode::start(&[]);
    let conf = node.conf(&json!({}));
    let pod = Pod::new();
    let result = node.add(&pod, &conf);
    let check = with_prev(&conf, Some(&result));
    node.exec(&pod.call("CHECK"), &check).ok("CHECK before");
    let handle = format!("{}.{}", tests::cni::NETWORK, pod.id);
    let held = node.api_get(&format!("/v1/ipam/handles/{handle}"));
    assert_eq!(held["confirmed"], json!(true), "{held}");
    let agent = node.agent.as_ref().expect("agent running");
    let _: Value = agent
        .api(
            hyper::Method::POST,
            "/v1/ipam/release",
            Some(&json!({"handle": handle})),
        )
        .expect("release");
    let msg = node
        .exec(&pod.call("CHECK"), &check)
        .err(105, "CHECK after the release");
    assert!(
        msg.contains(&format!("no addresses under handle {handle}")),
        "{msg}"
    );
    node.del(&pod, &conf, Some(&result));
}

#[test]
fn fifty_pods_get_distinct_addresses_and_del_frees_them_all() {
    if !require_root("fifty_pods_get_distinct_addresses_and_del_frees_them_all") {
        return;
    }
    let node = CniNode::start(&[]);
    let conf = node.conf(&json!({}));
    let free_before = pool_free(&node);
    let pods: Vec<Pod> = (0..50).map(|_| Pod::new()).collect();
    let results: Vec<Value> = pods.iter().map(|p| node.add(p, &conf)).collect();
    let ips: BTreeSet<String> = results.iter().map(Pod::ipv4).collect();
    assert_eq!(ips.len(), 50, "addresses are not distinct: {ips:?}");
    assert_eq!(endpoints(&node).len(), 50);
    assert_eq!(weir_links(&node).len(), 50);
    assert_eq!(pool_free(&node), free_before - 50);
    for (pod, result) in pods.iter().zip(&results) {
        node.del(pod, &conf, Some(result));
    }
    assert!(endpoints(&node).is_empty());
    assert!(weir_links(&node).is_empty());
    assert_eq!(
        pool_free(&node),
        free_before,
        "DEL did not free every address"
    );
}

#[test]
fn sixteen_parallel_adds_succeed_with_distinct_addresses() {
    if !require_root("sixteen_parallel_adds_succeed_with_distinct_addresses") {
        return;
    }
    let node = CniNode::start(&[]);
    let conf = node.conf(&json!({}));
    let pods: Vec<Pod> = (0..16).map(|_| Pod::new()).collect();
    let results: Vec<Value> = std::thread::scope(|s| {
        let handles: Vec<_> = pods
            .iter()
            .map(|p| {
                let (node, conf) = (&node, &conf);
                s.spawn(move || node.add(p, conf))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("ADD thread"))
            .collect()
    });
    let ips: BTreeSet<String> = results.iter().map(Pod::ipv4).collect();
    assert_eq!(ips.len(), 16, "{ips:?}");
    assert_eq!(endpoints(&node).len(), 16);
    for (pod, result) in pods.iter().zip(&results) {
        node.del(pod, &conf, Some(result));
    }
    assert!(weir_links(&node).is_empty());
}

#[test]
fn gc_releases_what_is_not_listed() {
    if !require_root("gc_releases_what_is_not_listed") {
        return;
    }
    let node = CniNode::start(&[]);
    let conf = node.conf(&json!({}));
    let pods: Vec<Pod> = (0..3).map(|_| Pod::new()).collect();
    let results: Vec<Value> = pods.iter().map(|p| node.add(p, &conf)).collect();
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": pods[0].id, "ifname": "eth0"}]);
    let call = tests::cni::Call {
        command: "GC",
        container_id: None,
        netns: None,
        ifname: None,
        args: None,
    };
    node.exec(&call, &gc).ok("GC");
    let eps = endpoints(&node);
    assert_eq!(eps.len(), 1, "{eps:?}");
    assert_eq!(
        eps[0]["container_id"],
        pods[0].id.as_str(),
        "the listed pod must stay"
    );
    assert_eq!(weir_links(&node).len(), 1);
    // The kept pod is intact; the others' addresses are free for reuse.
    node.exec(&pods[0].call("CHECK"), &with_prev(&conf, Some(&results[0])))
        .ok("CHECK of the kept pod");
    node.del(&pods[0], &conf, Some(&results[0]));
    // The legacy key works too.
    let pod = Pod::new();
    node.add(&pod, &conf);
    let mut legacy = conf.clone();
    legacy["cni.dev/attachments"] = json!([]);
    node.exec(&call, &legacy).ok("GC with cni.dev/attachments");
    assert!(endpoints(&node).is_empty());
}

#[test]
fn status_reports_50_with_the_agent_stopped_and_add_del_say_try_again() {
    if !require_root("status_reports_50_with_the_agent_stopped_and_add_del_say_try_again") {
        return;
    }
    let mut node = CniNode::start(&[]);
    let conf = node.conf(&json!({}));
    let status_call = tests::cni::Call {
        command: "STATUS",
        container_id: None,
        netns: None,
        ifname: None,
        args: None,
    };
    wait_ready(&node, &conf);
    let pod = Pod::new();
    let result = node.add(&pod, &conf);
    node.stop_agent();
    let msg = node
        .exec(&status_call, &conf)
        .err(50, "STATUS with the agent stopped");
    assert!(msg.contains("unreachable"), "{msg}");
    let other = Pod::new();
    node.exec(&other.call("ADD"), &conf)
        .err(11, "ADD with the agent stopped");
    assert_eq!(
        weir_links(&node).len(),
        1,
        "a failed ADD must leave nothing"
    );
    node.exec(&pod.call("DEL"), &with_prev(&conf, Some(&result)))
        .err(11, "DEL with the agent stopped");
    node.restart_agent();
    wait_ready(&node, &conf);
    node.del(&pod, &conf, Some(&result));
    assert!(endpoints(&node).is_empty());
}

/// STATUS succeeds within a bounded wait (the agent turns ready after its first in-sync).
fn wait_ready(node: &CniNode, conf: &Value) {
    let call = tests::cni::Call {
        command: "STATUS",
        container_id: None,
        netns: None,
        ifname: None,
        args: None,
    };
    tests::wait::until_ok("STATUS turns ready", Duration::from_secs(30), || {
        let out = node.exec(&call, conf);
        if out.status.success() {
            Ok(())
        } else {
            Err(format!("STATUS says {}", out.stdout))
        }
    });
}

fn pool_free(node: &CniNode) -> u64 {
    node.api_get("/v1/status")["pools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| !p["cidr"].as_str().unwrap_or_default().contains(':'))
        .filter_map(|p| p["free"].as_u64())
        .sum()
}
