//! `weir uninstall` removes weir from a node, as `cilium-dbg cleanup` does: with two pods (one on
//! tcx links, one on `cls_bpf` filters) and the XDP prefilter on a host interface, the uninstall
//! leaves no weir program attached (read from the kernel: `bpftool net` for filters and XDP,
//! `BPF_PROG_QUERY` for tcx — not from the pins it removes), no pin and no conflist. It refuses
//! while the agent runs, and removes nothing then (the positive control of every check).

use std::{path::Path, process::Command};

use serde_json::{Value, json};
use tests::{
    bin,
    cni::{CniNode, Pod},
    names,
    netns::NetNs,
    privileged::require_root,
};

/// The `weir*` workload links in `ns`.
fn workload_links(ns: &NetNs) -> Vec<(String, u32)> {
    let out = ns.exec(&["ip", "-j", "link", "show"]);
    let links: Value = serde_json::from_slice(&out.stdout).expect("ip -j link");
    links
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| {
            let name = l["ifname"].as_str()?;
            let index = u32::try_from(l["ifindex"].as_u64()?).ok()?;
            name.starts_with("weir").then(|| (name.to_owned(), index))
        })
        .collect()
}

/// Everything weir has attached in `ns`, read from the kernel: `(interface, what, program id)`.
fn attached(ns: &NetNs) -> Vec<(String, String, u64)> {
    let mut found = Vec::new();
    let shown = ns.exec(&["bpftool", "-j", "net", "show"]);
    let json: Value = serde_json::from_slice(&shown.stdout).expect("bpftool net show");
    for dev in json.as_array().into_iter().flatten() {
        for f in dev["tc"].as_array().into_iter().flatten() {
            found.push((
                f["devname"].as_str().unwrap_or_default().to_owned(),
                format!("filter {}", f["name"].as_str().unwrap_or_default()),
                f["prog_id"]
                    .as_u64()
                    .or_else(|| f["id"].as_u64())
                    .unwrap_or(0),
            ));
        }
        for x in dev["xdp"].as_array().into_iter().flatten() {
            found.push((
                x["devname"].as_str().unwrap_or_default().to_owned(),
                "xdp".into(),
                x["id"].as_u64().unwrap_or(0),
            ));
        }
    }
    for (name, index) in workload_links(ns) {
        for (hook, label) in [
            (aya::programs::TcAttachType::Ingress, "tcx ingress"),
            (aya::programs::TcAttachType::Egress, "tcx egress"),
        ] {
            for id in ns.run(move || agent::attach::tcx::tcx_programs(index, hook)) {
                found.push((name.clone(), label.into(), u64::from(id)));
            }
        }
    }
    found.sort();
    found
}

fn uninstall(node: &CniNode) -> std::process::Output {
    Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", node.ns.name()))
        .arg("--")
        .arg(bin::weir())
        .arg("uninstall")
        .arg("--bpf-root")
        .arg(node.root.path())
        .arg("--cni-conf-dir")
        .arg(node.dirs.path("net.d"))
        .arg("--api-socket")
        .arg(node.socket())
        .arg("--json")
        .output()
        .expect("run weir uninstall")
}

#[test]
fn uninstall_detaches_every_program_and_removes_pins_and_conflist() {
    if !require_root("uninstall_detaches_every_program_and_removes_pins_and_conflist") {
        return;
    }
    let mut node = CniNode::start(&["--pool", "10.244.0.0/16", "--tc-attach", "tcx"]);
    let tcx_pod = Pod::new();
    node.add(&tcx_pod, &node.conf(&json!({})));
    // A "host interface" of the node: one end of a veth pair inside the node namespace.
    let host_if = names::unique("pf");
    let peer = names::unique("pq");
    node.ns.exec(&[
        "ip", "link", "add", &host_if, "type", "veth", "peer", "name", &peer,
    ]);
    node.ns.exec(&["ip", "link", "set", &host_if, "up"]);
    node.restart_agent_with(&[
        "--pool",
        "10.244.0.0/16",
        "--prefilter-interfaces",
        &host_if,
    ]);
    let filter_pod = Pod::new();
    node.add(&filter_pod, &node.conf(&json!({})));

    let conflist = node.dirs.path("net.d/04-weir.conflist");
    let before = attached(&node.ns);
    let kinds: Vec<&str> = before.iter().map(|(_, k, _)| k.as_str()).collect();
    for want in [
        "xdp",
        "filter from_endpoint",
        "filter to_endpoint",
        "tcx ingress",
        "tcx egress",
    ] {
        assert!(
            kinds.contains(&want),
            "{want} is attached before the uninstall: {before:?}"
        );
    }
    assert!(before.iter().any(|(i, k, _)| i == &host_if && k == "xdp"));
    assert!(conflist.exists() && node.root.path().exists());

    // Refused while the agent answers; nothing removed.
    let refused = uninstall(&node);
    assert!(
        !refused.status.success(),
        "uninstall with the agent running"
    );
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("stop it first"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert_eq!(
        attached(&node.ns),
        before,
        "a refused uninstall changes nothing"
    );
    assert!(conflist.exists() && node.root.path().exists());

    node.stop_agent();
    let out = uninstall(&node);
    assert!(
        out.status.success(),
        "weir uninstall: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("uninstall --json");
    assert_eq!(
        report["filters"].as_array().map(Vec::len),
        Some(2),
        "{report}"
    );
    assert_eq!(
        report["links"].as_array().map(Vec::len),
        Some(3),
        "{report}"
    );

    let after = attached(&node.ns);
    assert!(
        after.is_empty(),
        "still attached after the uninstall: {after:?}"
    );
    assert!(!conflist.exists(), "the conflist is removed");
    assert!(!node.root.path().exists(), "the pin root is removed");
    assert!(
        !Path::new(&node.socket()).exists(),
        "no stale socket is left"
    );
    // Only weir's own files went: the CNI directory and the state stay.
    assert!(node.dirs.path("net.d").is_dir());
    // A second run finds nothing to do and still succeeds.
    let again = uninstall(&node);
    assert!(again.status.success());
    let report: Value = serde_json::from_slice(&again.stdout).expect("json");
    assert_eq!(report["conflist"], Value::Null);
    assert_eq!(report["pin_root"], Value::Null);
}
