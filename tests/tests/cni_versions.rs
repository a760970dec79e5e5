//! Each CNI version weir-cni claims, as a runtime would call it: the agent's own conflist
//! (1.0.0 by default) drives ADD, CHECK and DEL and every answer is a 1.0.0 result without
//! 1.1.0's keys; GC and STATUS, 1.1.0's verbs, work at 1.1.0 and are refused at 1.0.0 with a
//! message saying how to raise the version. containerd's own parsing of the 1.0.0 results is in
//! `cri_pods.rs`.

use serde_json::{Value, json};
use tests::{
    cni::{Call, CniNode, Pod, with_prev},
    privileged::require_root,
};

/// The agent's conflist, its single plugin as the runtime hands it over (version and name
/// copied from the list), logging into the test's directory.
fn agent_plugin_conf(node: &CniNode) -> Value {
    let list: Value = serde_json::from_str(
        &std::fs::read_to_string(node.dirs.path("net.d/04-weir.conflist"))
            .expect("the agent wrote its conflist"),
    )
    .expect("conflist JSON");
    let mut conf = list["plugins"][0].clone();
    conf["cniVersion"] = list["cniVersion"].clone();
    conf["name"] = list["name"].clone();
    conf["logFile"] = json!(node.log.path().join("weir-cni.log"));
    conf
}

fn verb(command: &'static str) -> Call<'static> {
    Call {
        command,
        container_id: None,
        netns: None,
        ifname: None,
        args: None,
    }
}

#[test]
fn the_default_conflist_speaks_1_0_0_for_add_check_and_del() {
    if !require_root("the_default_conflist_speaks_1_0_0_for_add_check_and_del") {
        return;
    }
    let node = CniNode::start(&[]);
    let conf = agent_plugin_conf(&node);
    assert_eq!(conf["cniVersion"], "1.0.0", "the agent's default");
    let pod = Pod::k8s("default", "v100");
    let add = node.exec(&pod.call("ADD"), &conf);
    let result = add.ok("ADD at 1.0.0").clone();
    // What the runtime records (stderr) and the log file are plain text: no terminal escapes.
    let log = std::fs::read_to_string(node.log.path().join("weir-cni.log")).expect("the log");
    assert!(
        add.stderr.contains("allocated") && log.contains("allocated"),
        "ADD logged its allocation to stderr and the file"
    );
    assert!(
        !add.stderr.contains('\u{1b}') && !log.contains('\u{1b}'),
        "no ANSI escapes:\nstderr: {:?}\nfile: {log:?}",
        add.stderr
    );
    assert_eq!(
        result["cniVersion"], "1.0.0",
        "answered in the request's version"
    );
    for interface in result["interfaces"].as_array().expect("interfaces") {
        for key in ["mtu", "socketPath", "pciID"] {
            assert!(
                interface.get(key).is_none(),
                "a 1.0.0 result has no interface {key}: {result}"
            );
        }
    }
    node.exec(&pod.call("CHECK"), &with_prev(&conf, Some(&result)))
        .ok("CHECK at 1.0.0");
    node.del(&pod, &conf, Some(&result));
    // And again without prevResult or netns, as containerd's RemovePodSandbox calls it.
    let again = Call {
        netns: None,
        ..pod.call("DEL")
    };
    node.exec(&again, &conf).ok("second DEL at 1.0.0");

    // 1.1.0's verbs are refused at 1.0.0, naming the fix.
    for command in ["GC", "STATUS"] {
        let mut stdin = conf.clone();
        stdin["cni.dev/valid-attachments"] = json!([]);
        let msg = node
            .exec(&verb(command), &stdin)
            .err(1, &format!("{command} at 1.0.0"));
        assert!(
            msg.contains("1.1.0") && msg.contains("--cni-version"),
            "{command}: {msg}"
        );
    }
    let version = node.exec(&verb("VERSION"), &conf);
    let answer = version.ok("VERSION");
    assert_eq!(answer["supportedVersions"], json!(["1.0.0", "1.1.0"]));
}

#[test]
fn a_raised_conflist_speaks_1_1_0_with_gc_and_status() {
    if !require_root("a_raised_conflist_speaks_1_1_0_with_gc_and_status") {
        return;
    }
    let node = CniNode::start(&["--cni-version", "1.1.0"]);
    let conf = agent_plugin_conf(&node);
    assert_eq!(conf["cniVersion"], "1.1.0", "--cni-version raised it");
    let pod = Pod::k8s("default", "v110");
    let result = node.add(&pod, &conf);
    assert_eq!(result["cniVersion"], "1.1.0");
    assert!(
        result["interfaces"][1].get("mtu").is_some(),
        "1.1.0 results carry the interface MTU: {result}"
    );
    node.exec(&pod.call("CHECK"), &with_prev(&conf, Some(&result)))
        .ok("CHECK at 1.1.0");
    node.exec(&verb("STATUS"), &conf).ok("STATUS at 1.1.0");
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([]);
    node.exec(&verb("GC"), &gc).ok("GC at 1.1.0");
    let endpoints = node.api_get("/v1/endpoints");
    assert!(
        endpoints.as_array().is_some_and(Vec::is_empty),
        "GC with no valid attachment removed the pod's endpoint: {endpoints}"
    );
    node.del(&pod, &conf, Some(&result));
}
