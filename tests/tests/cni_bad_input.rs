//! Bad input: every case returns the right CNI code and a message naming what to fix, and nothing
//! is left behind. VERSION is the positive control.

use serde_json::{Value, json};
use tests::{
    cni::{Call, CniNode, Pod, exec_in, exec_raw},
    netns::NetNs,
    privileged::require_root,
};

fn base() -> Value {
    json!({"cniVersion": "1.1.0", "name": "wt-net", "type": "weir-cni",
           "agentSocket": "/nonexistent/wt-weir.sock", "logFile": "/dev/null",
           "bpfRoot": "/sys/fs/bpf/wt-no-such-root"})
}

fn with(key: &str, value: Value) -> Value {
    let mut v = base();
    v[key] = value;
    v
}

#[test]
fn version_lists_1_0_0_and_1_1_0() {
    let call = Call {
        command: "VERSION",
        container_id: None,
        netns: None,
        ifname: None,
        args: None,
    };
    let out = exec_in(None, &call, &json!({"cniVersion": "1.0.0"}));
    let v = out.ok("VERSION");
    assert_eq!(v["cniVersion"], "1.0.0");
    assert_eq!(v["supportedVersions"], json!(["1.0.0", "1.1.0"]));
}

#[test]
fn bad_input_returns_the_right_code_and_a_useful_message() {
    if !require_root("bad_input_returns_the_right_code_and_a_useful_message") {
        return;
    }
    let pod = NetNs::new();
    // The plugin runs in a node namespace of its own, so nothing it does can reach the host's.
    let node = NetNs::new();
    let netns = format!("/run/netns/{}", pod.name());
    let file = tempfile::NamedTempFile::new().expect("temp file");
    let file_path = file.path().display().to_string();
    let add = |container_id, netns: Option<&str>, ifname, args| Call {
        command: "ADD",
        container_id,
        netns: netns.map(str::to_owned),
        ifname,
        args,
    };
    let ok_add = add(Some("wt-c1"), Some(&netns), Some("eth0"), None);
    let b = |v: Value| v.to_string().into_bytes();

    // (call, stdin, code, a word the message must contain)
    let cases: Vec<(Call<'_>, Vec<u8>, u64, &str)> = vec![
        (
            Call {
                command: "",
                ..ok_add.clone()
            },
            b(base()),
            4,
            "CNI_COMMAND",
        ),
        (
            Call {
                command: "BOGUS",
                ..ok_add.clone()
            },
            b(base()),
            4,
            "CNI_COMMAND",
        ),
        (
            add(None, Some(&netns), Some("eth0"), None),
            b(base()),
            4,
            "CNI_CONTAINERID",
        ),
        (
            add(Some("wt-c1"), None, Some("eth0"), None),
            b(base()),
            4,
            "CNI_NETNS",
        ),
        (
            add(Some("wt-c1"), Some(&netns), None, None),
            b(base()),
            4,
            "CNI_IFNAME",
        ),
        (
            add(Some("wt-c1"), Some(&netns), Some("eth0-far-too-long"), None),
            b(base()),
            4,
            "CNI_IFNAME",
        ),
        (
            add(Some("wt-c1"), Some(&netns), Some("eth/0"), None),
            b(base()),
            4,
            "CNI_IFNAME",
        ),
        (
            add(Some("-wt/c1"), Some(&netns), Some("eth0"), None),
            b(base()),
            4,
            "CNI_CONTAINERID",
        ),
        (
            add(Some("wt-c1"), Some("run/netns/x"), Some("eth0"), None),
            b(base()),
            4,
            "CNI_NETNS",
        ),
        (
            add(
                Some("wt-c1"),
                Some("/run/netns/wt-missing-ns"),
                Some("eth0"),
                None,
            ),
            b(base()),
            4,
            "does not exist",
        ),
        (
            add(Some("wt-c1"), Some(&file_path), Some("eth0"), None),
            b(base()),
            4,
            "not a network namespace",
        ),
        (
            add(Some("wt-c1"), Some(&netns), Some("eth0"), Some("novalue")),
            b(base()),
            4,
            "CNI_ARGS",
        ),
        (
            add(
                Some("wt-c1"),
                Some(&netns),
                Some("eth0"),
                Some("IP=not-an-ip"),
            ),
            b(base()),
            4,
            "IP=",
        ),
        (ok_add.clone(), b"{not json".to_vec(), 6, "JSON"),
        (ok_add.clone(), Vec::new(), 6, "JSON"),
        (
            ok_add.clone(),
            b(with("cniVersion", json!("0.4.0"))),
            1,
            "cniVersion",
        ),
        (
            ok_add.clone(),
            b(json!({"cniVersion": "1.1.0", "type": "weir-cni"})),
            7,
            "name",
        ),
        (
            ok_add.clone(),
            b(with("name", json!("bad name!"))),
            7,
            "name",
        ),
        (ok_add.clone(), b(with("mtu", json!(40))), 7, "mtu"),
        (
            ok_add.clone(),
            b(with("mtu", json!("big"))),
            7,
            "invalid type",
        ),
        (
            ok_add.clone(),
            b(with(
                "ipam",
                json!({"type": "host-local", "subnet": "10.1.0.0/24"}),
            )),
            2,
            "ipam.type",
        ),
        (
            ok_add.clone(),
            b(with("ipam", json!({"families": ["ipv5"]}))),
            7,
            "ipam.families",
        ),
        (
            ok_add.clone(),
            b(with("runtimeConfig", json!({"ips": ["10.0.0.300"]}))),
            7,
            "runtimeConfig.ips",
        ),
        (
            ok_add.clone(),
            b(with("prevResult", json!({"interfaces": "eth0"}))),
            6,
            "prevResult",
        ),
        (
            Call {
                command: "CHECK",
                ..ok_add.clone()
            },
            b(base()),
            7,
            "prevResult",
        ),
        (
            Call {
                command: "GC",
                ..ok_add.clone()
            },
            b(base()),
            7,
            "cni.dev/valid-attachments",
        ),
        (ok_add.clone(), b(base()), 11, "unreachable"),
        (
            Call {
                command: "DEL",
                ..ok_add.clone()
            },
            b(base()),
            11,
            "unreachable",
        ),
        (
            Call {
                command: "STATUS",
                ..ok_add.clone()
            },
            b(base()),
            50,
            "unreachable",
        ),
    ];
    assert!(cases.len() >= 20);
    for (call, stdin, code, needle) in &cases {
        let out = exec_raw(Some(&node), call, stdin);
        let what = format!("{} {:?}", call.command, String::from_utf8_lossy(stdin));
        let msg = out.err(*code, &what);
        assert!(
            msg.contains(needle),
            "{what}: message {msg:?} does not name {needle:?}"
        );
        assert_eq!(
            out.json["cniVersion"].as_str().map(|v| v.starts_with("1.")),
            Some(true)
        );
    }
    // Nothing was created in the pod namespace.
    let links = pod.exec(&["ip", "-o", "link", "show"]);
    assert_eq!(
        String::from_utf8_lossy(&links.stdout).lines().count(),
        1,
        "only lo"
    );
}

#[test]
fn bad_requests_the_agent_refuses_roll_back() {
    if !require_root("bad_requests_the_agent_refuses_roll_back") {
        return;
    }
    let node = CniNode::start(&[]);
    let conf = node.conf(&json!({}));

    // An address outside every pool.
    let pod = Pod::new();
    let mut call = pod.call("ADD");
    call.args = Some("IP=192.0.2.7");
    let msg = node
        .exec(&call, &conf)
        .err(102, "ADD of an address outside the pools");
    assert!(msg.contains("192.0.2.7") || msg.contains("pool"), "{msg}");

    // A pool that does not exist.
    let pod = Pod::new();
    let msg = node
        .exec(
            &pod.call("ADD"),
            &node.conf(&json!({"ipam": {"pools": ["wt-nopool"]}})),
        )
        .err(7, "ADD from an unknown pool");
    assert!(msg.contains("wt-nopool"), "{msg}");

    // The interface already exists in the pod.
    let pod = Pod::new();
    pod.ns.exec(&[
        "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "wtpeer0",
    ]);
    let msg = node
        .exec(&pod.call("ADD"), &conf)
        .err(104, "ADD over an existing eth0");
    assert!(msg.contains("eth0"), "{msg}");

    // The agent's programs are not where bpfRoot says: allocation is rolled back.
    let pod = Pod::new();
    let bad_root = node.conf(&json!({"bpfRoot": "/sys/fs/bpf/wt-no-such-root"}));
    let msg = node
        .exec(&pod.call("ADD"), &bad_root)
        .err(101, "ADD with a wrong bpfRoot");
    assert!(msg.contains("bpfRoot"), "{msg}");

    // Nothing is left: no endpoint, no workload veth, and every address is free again (a good
    // ADD gets the first address back is not assumed; the pool's free count is).
    let eps = node.api_get("/v1/endpoints");
    assert_eq!(eps.as_array().map(Vec::len), Some(0), "{eps}");
    let links = node.ns.exec(&["ip", "-o", "link", "show"]);
    assert!(!String::from_utf8_lossy(&links.stdout).contains("weir"));
    // Positive control: the same node serves a good ADD.
    let pod = Pod::new();
    let result = node.add(&pod, &conf);
    node.del(&pod, &conf, Some(&result));
}
