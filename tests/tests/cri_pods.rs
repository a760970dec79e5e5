//! The kubelet path, for real: pod sandboxes created through containerd's CRI API as kubelet
//! creates them, on the conflist the agent wrote, unedited. containerd's libcni runs weir-cni with
//! the `K8S_POD_*` arguments, parses its result, and calls DEL twice (stop, then remove) as it does
//! for kubelet. Harness: `tests::cri` (containerd in its own mount namespace, a locally built pause
//! image) and `tests::podnet` (TCP inside pods through their pause process).

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::networking::v1::{
        NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicySpec,
    },
    apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta},
};
use serde_json::Value;
use tests::{
    bin, bpf,
    cni::CniNode,
    cri::{Cri, CriSetup, PodSpec},
    netpol::{Labels, Model, ModelPod, Source, labels, match_labels},
    pod_doc::write_pod,
    podnet::{PodListener, PodNet},
    privileged::require_root,
};

const PORT: u16 = 8080;
/// The node's own address (on its `lo`), the source of the node's connections to pods.
const NODE_IP: &str = "10.99.0.1";
/// Bound of one TCP connection attempt (a denied SYN is dropped, so this is what it costs).
const CONNECT: Duration = Duration::from_millis(800);
/// Bound of every wait for the dataplane to match what is expected.
const WAIT: Duration = Duration::from_secs(45);

/// A running pod sandbox and what the test knows of it.
struct Sandbox {
    spec: PodSpec,
    /// The labels its Pod document in the agent's directory gives it (none without one): what
    /// policy sees, whatever kubelet put on the sandbox.
    source_labels: Labels,
    id: String,
    ip: String,
    net: PodNet,
    _listener: PodListener,
}

impl Sandbox {
    fn addr(&self) -> SocketAddr {
        SocketAddr::new(self.ip.parse().expect("pod address"), PORT)
    }

    fn model(&self) -> ModelPod {
        ModelPod {
            namespace: self.spec.namespace.clone(),
            labels: self.source_labels.clone(),
        }
    }
}

/// The node, its agent, and containerd on the agent's own conflist.
fn node_and_cri(agent_flags: &[&str]) -> (CniNode, Cri) {
    let mut flags = vec!["--pool", "10.244.0.0/16"];
    flags.extend_from_slice(agent_flags);
    let node = CniNode::start(&flags);
    node.ns
        .exec(&["ip", "addr", "add", &format!("{NODE_IP}/32"), "dev", "lo"]);
    let cri = Cri::start(
        &node.ns,
        &CriSetup {
            conf_dir: node.dirs.path("net.d"),
            plugins: vec![("weir-cni".into(), bin::weir_cni())],
        },
    );
    (node, cri)
}

fn diagnostics(node: &CniNode, cri: &Cri) -> String {
    format!(
        "weir-cni log:\n{}\ncontainerd log (tail):\n{}\nendpoints: {}",
        tail(&cri.read_inside("/var/log/weir/cni.log"), 20),
        tail(&cri.log(), 15),
        node.api_get("/v1/endpoints")
    )
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Runs `pod` through the CRI and waits for it to be READY with an address.
fn run_ready(node: &CniNode, cri: &Cri, spec: PodSpec) -> Sandbox {
    let id = cri.run_pod(&spec).unwrap_or_else(|e| {
        panic!(
            "RunPodSandbox {}: {e}\n{}",
            spec.name,
            diagnostics(node, cri)
        )
    });
    let status = cri.status(&id).expect("PodSandboxStatus");
    assert!(status.ready, "sandbox {} is not READY", spec.name);
    assert!(
        !status.ip.is_empty(),
        "sandbox {} has no address",
        spec.name
    );
    assert!(
        status.pid > 0,
        "sandbox {} reports no pause process",
        spec.name
    );
    let net = PodNet::of_process(status.pid);
    let listener = PodListener::start(&net, PORT);
    Sandbox {
        spec,
        source_labels: Labels::new(),
        id,
        ip: status.ip,
        net,
        _listener: listener,
    }
}

/// What is reachable now: `[src][dst]` for every pod pair, then the node to every pod.
fn probe(node: &CniNode, pods: &[Sandbox]) -> (Vec<Vec<bool>>, Vec<bool>) {
    let targets: Vec<SocketAddr> = pods.iter().map(Sandbox::addr).collect();
    let matrix = std::thread::scope(|scope| {
        let handles: Vec<_> = pods
            .iter()
            .map(|src| {
                let targets = &targets;
                scope.spawn(move || src.net.connects(targets, CONNECT))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("probe thread"))
            .collect()
    });
    let from_node = node.ns.run(|| {
        targets
            .iter()
            .map(|a| std::net::TcpStream::connect_timeout(a, CONNECT).is_ok())
            .collect()
    });
    (matrix, from_node)
}

/// The connectivity `model` computes for `pods`.
fn expected(model: &Model, pods: &[Sandbox]) -> (Vec<Vec<bool>>, Vec<bool>) {
    let models: Vec<ModelPod> = pods.iter().map(Sandbox::model).collect();
    // A pod reaching its own address never leaves it (loopback), so no policy applies: as the
    // upstream suite's `AllowLoopback`.
    let matrix = models
        .iter()
        .enumerate()
        .map(|(i, src)| {
            models
                .iter()
                .enumerate()
                .map(|(j, dst)| i == j || model.allows(Source::Pod(src), dst, PORT))
                .collect()
        })
        .collect();
    let from_node = models
        .iter()
        .map(|dst| model.allows(Source::Node, dst, PORT))
        .collect();
    (matrix, from_node)
}

/// Waits (bounded) until what is reachable equals what the model computes.
fn expect_connectivity(node: &CniNode, cri: &Cri, pods: &[Sandbox], model: &Model, what: &str) {
    let want = expected(model, pods);
    let deadline = Instant::now() + WAIT;
    loop {
        let got = probe(node, pods);
        if got == want {
            return;
        }
        if Instant::now() > deadline {
            let mut wrong = Vec::new();
            for (i, src) in pods.iter().enumerate() {
                for (j, dst) in pods.iter().enumerate() {
                    if got.0[i][j] != want.0[i][j] {
                        wrong.push(format!(
                            "{}/{} -> {}/{}: got {}, want {}",
                            src.spec.namespace,
                            src.spec.name,
                            dst.spec.namespace,
                            dst.spec.name,
                            got.0[i][j],
                            want.0[i][j]
                        ));
                    }
                }
                if got.1[i] != want.1[i] {
                    wrong.push(format!(
                        "node -> {}: got {}, want {}",
                        src.spec.name, got.1[i], want.1[i]
                    ));
                }
            }
            panic!(
                "{what}: connectivity differs from the model within {WAIT:?}:\n{}\n{}",
                wrong.join("\n"),
                diagnostics(node, cri)
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn write_policies(node: &CniNode, model: &Model) {
    let dir = node.dirs.path("policies");
    std::fs::create_dir_all(&dir).expect("policy dir");
    let tmp = dir.join(".cri.yaml.tmp");
    std::fs::write(&tmp, model.manifest()).expect("write policies");
    std::fs::rename(&tmp, dir.join("cri.yaml")).expect("move policies in place");
}

/// The handle weir-cni allocates under: `<network>.<sandbox id>` (the network is the conflist's).
fn handle_ips(node: &CniNode, sandbox_id: &str) -> Vec<String> {
    let answer = node.api_get(&format!("/v1/ipam/handles/weir.{sandbox_id}"));
    answer["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip.as_str().map(str::to_owned))
        .collect()
}

fn endpoint_ids(node: &CniNode) -> Vec<String> {
    node.api_get("/v1/endpoints")
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["container_id"].as_str().map(str::to_owned))
        .collect()
}

fn weir_links(node: &CniNode) -> Vec<String> {
    let out = node.ns.exec(&["ip", "-o", "link", "show"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap_or(n).to_owned())
        .filter(|n| n.starts_with("weir"))
        .collect()
}

/// The kernel ids of this node's pinned `from_endpoint` and `to_endpoint` (bpftool).
fn endpoint_program_ids(node: &CniNode) -> [u64; 2] {
    ["from_endpoint", "to_endpoint"]
        .map(|p| bpf::pinned_prog_id(&node.root.path().join("progs").join(p)))
}

/// What of the node's endpoint programs is attached where the agent's mechanism puts it: with
/// filters (the default), the node's tc filters running them (`bpftool net`); with tcx, the link
/// pins under the pin root and the kernel links running them (`bpftool link`).
fn endpoint_attachments(node: &CniNode, tcx: bool) -> Vec<String> {
    let programs = endpoint_program_ids(node);
    if !tcx {
        return bpf::tc_attachments(&node.ns)
            .into_iter()
            .filter(|a| programs.contains(&a.prog_id))
            .map(|a| format!("{} {} prog {}", a.dev, a.kind, a.prog_id))
            .collect();
    }
    let mut found: Vec<String> = std::fs::read_dir(node.root.path().join("links"))
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| format!("pin {}", e.file_name().to_string_lossy()))
                .collect()
        })
        .unwrap_or_default();
    let links = bpf::bpftool(&["link", "show"]);
    found.extend(
        links
            .as_array()
            .into_iter()
            .flatten()
            .filter(|l| {
                l["prog_id"]
                    .as_u64()
                    .is_some_and(|id| programs.contains(&id))
            })
            .map(|l| format!("link {l}")),
    );
    found
}

/// Precondition of the leak check: each of the node's workload veths runs `from_endpoint` at
/// ingress and `to_endpoint` at egress, as the mechanism attaches them.
fn attached_to_every_veth(node: &CniNode, tcx: bool, veths: &[String]) {
    let found = endpoint_attachments(node, tcx);
    let [from, to] = endpoint_program_ids(node);
    for veth in veths {
        let want: Vec<String> = if tcx {
            vec![
                format!("pin {veth}:from_endpoint"),
                format!("pin {veth}:to_endpoint"),
            ]
        } else {
            vec![
                format!("{veth} clsact/ingress prog {from}"),
                format!("{veth} clsact/egress prog {to}"),
            ]
        };
        for w in want {
            assert!(found.contains(&w), "{w} is not attached: {found:?}");
        }
    }
    assert_eq!(
        found.len(),
        if tcx { 4 } else { 2 } * veths.len(),
        "two attachments (and with tcx two kernel links) per veth: {found:?}"
    );
}

fn namespace_only_from(ns: &str, team: &str) -> NetworkPolicy {
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(format!("{ns}-only-from-{team}")),
            namespace: Some(ns.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector::default()),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(vec![NetworkPolicyPeer {
                    namespace_selector: Some(match_labels(&[("team", team)])),
                    ..NetworkPolicyPeer::default()
                }]),
                ports: None,
            }]),
            ..NetworkPolicySpec::default()
        }),
    }
}

#[test]
fn twenty_cri_sandboxes_reach_each_other_follow_policy_and_leave_nothing() {
    if !require_root("twenty_cri_sandboxes_reach_each_other_follow_policy_and_leave_nothing") {
        return;
    }
    twenty_sandboxes(&[], false);
}

/// The same with tcx links, whose pins outlive their device: the leak check reads pins and links.
#[test]
fn twenty_cri_sandboxes_on_tcx_leave_no_link_pin_and_no_link() {
    if !require_root("twenty_cri_sandboxes_on_tcx_leave_no_link_pin_and_no_link") {
        return;
    }
    twenty_sandboxes(&["--tc-attach", "tcx"], true);
}

fn twenty_sandboxes(agent_flags: &[&str], tcx: bool) {
    let (node, cri) = node_and_cri(agent_flags);
    let conflist: Value = serde_json::from_str(
        &std::fs::read_to_string(node.dirs.path("net.d/04-weir.conflist"))
            .expect("the agent wrote its conflist"),
    )
    .expect("conflist JSON");
    assert_eq!(
        conflist["cniVersion"], "1.0.0",
        "the agent's default conflist is one containerd 1.6 reads"
    );
    assert_eq!(
        conflist["plugins"][0]["tcAttach"],
        if tcx { "tcx" } else { "filter" },
        "the conflist tells weir-cni the agent's mechanism"
    );

    // 20 pods over 3 namespaces, created in parallel as kubelet would on a busy node.
    let namespaces = ["alpha", "beta", "gamma"];
    let specs: Vec<PodSpec> = (0..20)
        .map(|i| PodSpec::new(namespaces[i % 3], &format!("pod-{i}")))
        .collect();
    let pods: Vec<Sandbox> = std::thread::scope(|scope| {
        let handles: Vec<_> = specs
            .into_iter()
            .map(|spec| {
                let (node, cri) = (&node, &cri);
                scope.spawn(move || run_ready(node, cri, spec))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let mut ips: Vec<&str> = pods.iter().map(|p| p.ip.as_str()).collect();
    ips.sort_unstable();
    ips.dedup();
    assert_eq!(ips.len(), 20, "every sandbox has its own address");
    for pod in &pods {
        assert_eq!(
            handle_ips(&node, &pod.id),
            vec![pod.ip.clone()],
            "the agent holds {}'s CRI address under weir.<sandbox id>",
            pod.spec.name
        );
    }
    assert_eq!(
        node.addresses_in_use(),
        20,
        "the datastore holds the 20 pods' addresses (weir ipam utilization)"
    );
    let endpoints = node.api_get("/v1/endpoints");
    for pod in &pods {
        let ep = endpoints
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["container_id"] == pod.id.as_str())
            .unwrap_or_else(|| panic!("no endpoint for {}: {endpoints}", pod.spec.name));
        assert_eq!(
            ep["namespace"],
            pod.spec.namespace.as_str(),
            "K8S_POD_NAMESPACE reached the endpoint: {ep}"
        );
    }

    // No policy: everything reaches everything (this is also the positive control).
    let mut model = Model {
        namespaces: namespaces
            .iter()
            .map(|ns| ((*ns).to_owned(), labels(&[("team", ns)])))
            .collect::<BTreeMap<_, _>>(),
        policies: Vec::new(),
        ..Model::default()
    };
    write_policies(&node, &model);
    expect_connectivity(&node, &cri, &pods, &model, "no policy");

    // A policy selecting every pod of one namespace: only another namespace may enter it.
    model.policies = vec![namespace_only_from("beta", "alpha")];
    write_policies(&node, &model);
    let (want, _) = expected(&model, &pods);
    let denied = want.iter().flatten().filter(|allowed| !**allowed).count();
    let allowed = want.iter().flatten().filter(|allowed| **allowed).count();
    assert!(
        denied > 0 && allowed > denied,
        "the policy denies some pairs and leaves most open"
    );
    expect_connectivity(&node, &cri, &pods, &model, "beta admits only alpha");

    // What the leak checks below look for is there while the pods run.
    let veths = weir_links(&node);
    assert_eq!(veths.len(), 20, "one weir veth per sandbox: {veths:?}");
    attached_to_every_veth(&node, tcx, &veths);

    // Stop and remove every sandbox, as kubelet does when pods are deleted.
    std::thread::scope(|scope| {
        for pod in &pods {
            let cri = &cri;
            scope.spawn(move || {
                cri.stop(&pod.id)
                    .unwrap_or_else(|e| panic!("StopPodSandbox {}: {e}", pod.spec.name));
                cri.remove(&pod.id)
                    .unwrap_or_else(|e| panic!("RemovePodSandbox {}: {e}", pod.spec.name));
            });
        }
    });
    let ids: Vec<String> = pods.iter().map(|p| p.id.clone()).collect();
    drop(pods);
    let left = endpoint_attachments(&node, tcx);
    assert!(
        left.is_empty(),
        "nothing runs the node's endpoint programs any more (tcx: {tcx}): {left:?}"
    );
    assert!(
        endpoint_ids(&node).is_empty(),
        "no endpoint is left: {}",
        node.api_get("/v1/endpoints")
    );
    for id in &ids {
        assert!(
            handle_ips(&node, id).is_empty(),
            "sandbox {id}'s address is released"
        );
    }
    assert!(
        weir_links(&node).is_empty(),
        "no weir veth is left: {:?}",
        weir_links(&node)
    );
    assert_eq!(
        node.addresses_in_use(),
        0,
        "the datastore holds no address of the CRI pods"
    );
}

/// Waits (bounded) until `pod` reaches every one of `targets` and the node reaches `pod`.
fn expect_reach(node: &CniNode, cri: &Cri, pod: &Sandbox, targets: &[&Sandbox], what: &str) {
    let addrs: Vec<SocketAddr> = targets.iter().map(|t| t.addr()).collect();
    let own = pod.addr();
    let deadline = Instant::now() + WAIT;
    loop {
        let out = pod.net.connects(&addrs, CONNECT);
        let from_node = node
            .ns
            .run(move || std::net::TcpStream::connect_timeout(&own, CONNECT).is_ok());
        if out.iter().all(|ok| *ok) && from_node {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {} reaches {out:?} of {addrs:?}, the node reaches it: {from_node}\n{}",
            pod.spec.name,
            diagnostics(node, cri)
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn cri_pods_survive_containerd_and_agent_restarts_and_the_second_del_releases_nothing() {
    if !require_root(
        "cri_pods_survive_containerd_and_agent_restarts_and_the_second_del_releases_nothing",
    ) {
        return;
    }
    let (mut node, mut cri) = node_and_cri(&[]);
    let a = run_ready(&node, &cri, PodSpec::new("default", "a"));
    let b = run_ready(&node, &cri, PodSpec::new("default", "b"));
    expect_reach(&node, &cri, &a, &[&b], "two fresh pods");

    // containerd restarted while pods run: they keep their network, and new sandboxes work.
    cri.stop_containerd();
    expect_reach(&node, &cri, &a, &[&b], "while containerd is down");
    cri.start_containerd();
    for pod in [&a, &b] {
        let status = cri
            .status(&pod.id)
            .expect("PodSandboxStatus after the restart");
        assert!(
            status.ready,
            "{} is READY after containerd restarted",
            pod.spec.name
        );
        assert_eq!(status.ip, pod.ip, "{} keeps its address", pod.spec.name);
    }
    let c = run_ready(&node, &cri, PodSpec::new("default", "c"));
    expect_reach(
        &node,
        &cri,
        &c,
        &[&a, &b],
        "a pod made after containerd restarted",
    );

    // The agent stopped: a new sandbox fails with weir-cni's "try again later" (code 11), and
    // nothing is left of it; running pods keep carrying traffic.
    node.stop_agent();
    let refused = cri
        .run_pod(&PodSpec::new("default", "refused"))
        .expect_err("RunPodSandbox cannot succeed while the agent is down");
    let message = refused.message().to_owned();
    assert!(
        message.contains("weir-cni") && message.contains("agent"),
        "containerd's error names weir-cni and the agent: {message}"
    );
    let cni_log = cri.read_inside("/var/log/weir/cni.log");
    assert!(
        cni_log.lines().any(|l| l.contains("code=11")),
        "weir-cni logged code 11 (try again later):\n{}",
        tail(&cni_log, 20)
    );
    assert!(
        cri.log().contains("weir-cni"),
        "containerd's log carries the plugin's failure"
    );
    expect_reach(&node, &cri, &a, &[&b, &c], "while the agent is down");
    node.restart_agent();
    let d = run_ready(&node, &cri, PodSpec::new("default", "d"));
    expect_reach(
        &node,
        &cri,
        &d,
        &[&a, &b, &c],
        "a pod made after the agent came back",
    );
    assert_eq!(
        endpoint_ids(&node).len(),
        4,
        "only the four running pods have endpoints (the refused sandbox left none)"
    );

    // DEL as the CRI calls it: StopPodSandbox (netns and prevResult) releases c; a new pod
    // runs; RemovePodSandbox's second DEL (no netns, no prevResult) succeeds and takes nothing
    // from anyone else.
    let (c_id, c_ip) = (c.id.clone(), c.ip.clone());
    drop(c);
    cri.stop(&c_id).expect("StopPodSandbox");
    assert!(handle_ips(&node, &c_id).is_empty(), "stop released {c_ip}");
    assert!(
        !endpoint_ids(&node).contains(&c_id),
        "stop removed c's endpoint"
    );
    let e = run_ready(&node, &cri, PodSpec::new("default", "e"));
    let held_before: Vec<(String, Vec<String>)> = [&a, &b, &d, &e]
        .iter()
        .map(|p| (p.id.clone(), handle_ips(&node, &p.id)))
        .collect();
    cri.remove(&c_id)
        .expect("RemovePodSandbox (the second DEL)");
    let held_after: Vec<(String, Vec<String>)> = [&a, &b, &d, &e]
        .iter()
        .map(|p| (p.id.clone(), handle_ips(&node, &p.id)))
        .collect();
    assert_eq!(
        held_before, held_after,
        "the second DEL released nobody's address"
    );
    assert!(
        held_after.iter().all(|(_, ips)| ips.len() == 1),
        "every running pod holds one address: {held_after:?}"
    );
    expect_reach(&node, &cri, &e, &[&a, &b, &d], "after c's second DEL");
}

#[test]
fn a_conflist_newer_than_containerd_reads_fails_every_sandbox_so_the_agent_writes_1_0_0() {
    if !require_root(
        "a_conflist_newer_than_containerd_reads_fails_every_sandbox_so_the_agent_writes_1_0_0",
    ) {
        return;
    }
    // The control for the default: raised to 1.1.0, containerd 1.6's libcni refuses weir-cni's
    // (correct, 1.1.0) result, and the failed sandbox is rolled back.
    let (node, cri) = node_and_cri(&["--cni-version", "1.1.0"]);
    let conflist: Value = serde_json::from_str(
        &std::fs::read_to_string(node.dirs.path("net.d/04-weir.conflist")).expect("conflist"),
    )
    .expect("conflist JSON");
    assert_eq!(conflist["cniVersion"], "1.1.0", "--cni-version raises it");
    let version = cri.server_version();
    assert!(!version.is_empty(), "containerd reports its version");
    if version.starts_with("1.6") || version.starts_with("1.7") {
        let err = cri
            .run_pod(&PodSpec::new("default", "too-new"))
            .expect_err("containerd 1.6/1.7 read CNI results up to 1.0.0");
        assert!(
            err.message().contains("1.1.0"),
            "containerd names the result version it cannot read: {}",
            err.message()
        );
        assert!(
            endpoint_ids(&node).is_empty(),
            "the failed sandbox left no endpoint"
        );
    } else {
        // A containerd that reads 1.1.0 runs the pod.
        let pod = run_ready(&node, &cri, PodSpec::new("default", "new-enough"));
        assert!(!pod.ip.is_empty());
    }
}

/// A policy of `ns` selecting `app=web` that admits only `app=client` pods of its namespace.
fn web_from_client(ns: &str) -> NetworkPolicy {
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some("web-from-client".to_owned()),
            namespace: Some(ns.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(match_labels(&[("app", "web")])),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(vec![NetworkPolicyPeer {
                    pod_selector: Some(match_labels(&[("app", "client")])),
                    ..NetworkPolicyPeer::default()
                }]),
                ports: None,
            }]),
            ..NetworkPolicySpec::default()
        }),
    }
}

#[test]
fn cri_pods_take_their_labels_from_pod_documents_and_a_pod_selector_decides_their_traffic() {
    if !require_root("cri_pods_take_their_labels_from_pod_documents") {
        return;
    }
    let (node, cri) = node_and_cri(&[]);
    let policy_dir = node.dirs.path("policies");
    // (namespace, name, the Pod document's app label). `impostor` has no Pod document: the
    // `app=web` kubelet puts on its sandbox is no label source, so it has its namespace's only.
    let pods_wanted: [(&str, &str, Option<&str>); 6] = [
        ("alpha", "web-0", Some("web")),
        ("alpha", "web-1", Some("web")),
        ("alpha", "client", Some("client")),
        ("alpha", "other", Some("other")),
        ("beta", "client", Some("client")),
        ("alpha", "impostor", None),
    ];
    for (ns, name, app) in pods_wanted {
        if let Some(app) = app {
            write_pod(&policy_dir, ns, name, &[("app", app)], &[]);
        }
    }
    let pods: Vec<Sandbox> = std::thread::scope(|scope| {
        let handles: Vec<_> = pods_wanted
            .iter()
            .map(|(ns, name, app)| {
                let (node, cri) = (&node, &cri);
                let mut spec = PodSpec::new(ns, name);
                // kubelet copies the pod's labels onto the sandbox; the impostor claims app=web.
                spec.labels
                    .insert("app".into(), (*app).unwrap_or("web").to_owned());
                scope.spawn(move || {
                    let mut sandbox = run_ready(node, cri, spec);
                    sandbox.source_labels = app.map(|a| labels(&[("app", a)])).unwrap_or_default();
                    sandbox
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    // The endpoints carry the Pod documents' labels (the identity follows them).
    let deadline = Instant::now() + WAIT;
    loop {
        let endpoints = node.api_get("/v1/endpoints");
        let labelled = pods.iter().all(|pod| {
            endpoints.as_array().into_iter().flatten().any(|e| {
                e["container_id"] == pod.id.as_str()
                    && e["labels"].get("app").and_then(Value::as_str)
                        == pod.source_labels.get("app").map(String::as_str)
            })
        });
        if labelled {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the endpoints do not carry their Pod documents' labels: {endpoints}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // Positive control: no policy, everything reaches everything.
    let mut model = Model {
        namespaces: ["alpha", "beta"]
            .iter()
            .map(|ns| ((*ns).to_owned(), labels(&[("team", ns)])))
            .collect::<BTreeMap<_, _>>(),
        ..Model::default()
    };
    write_policies(&node, &model);
    expect_connectivity(&node, &cri, &pods, &model, "no policy");

    // app=web of alpha admits only alpha's app=client: as the model computes it.
    model.policies = vec![web_from_client("alpha")];
    write_policies(&node, &model);
    let (want, _) = expected(&model, &pods);
    let denied = want.iter().flatten().filter(|allowed| !**allowed).count();
    assert!(denied > 0, "the policy denies some pairs");
    let impostor = pods.len() - 1;
    assert!(
        want.iter().all(|row| row[impostor]),
        "the sandbox-labelled impostor is not selected, so open to all"
    );
    expect_connectivity(
        &node,
        &cri,
        &pods,
        &model,
        "web admits only alpha's clients",
    );

    // The label comes from the source, live: `other` becomes a client and reaches web.
    write_pod(&policy_dir, "alpha", "other", &[("app", "client")], &[]);
    let mut pods = pods;
    let other = pods
        .iter_mut()
        .find(|p| p.spec.namespace == "alpha" && p.spec.name == "other")
        .expect("alpha/other");
    other.source_labels = labels(&[("app", "client")]);
    let (relabelled, _) = expected(&model, &pods);
    assert_ne!(
        want, relabelled,
        "the relabel changes what the model allows"
    );
    expect_connectivity(
        &node,
        &cri,
        &pods,
        &model,
        "alpha/other relabelled a client",
    );

    // StopPodSandbox and RemovePodSandbox, as kubelet: every address is released.
    for pod in &pods {
        cri.stop(&pod.id)
            .unwrap_or_else(|e| panic!("StopPodSandbox {}: {e}", pod.spec.name));
        cri.remove(&pod.id)
            .unwrap_or_else(|e| panic!("RemovePodSandbox {}: {e}", pod.spec.name));
    }
    let ids: Vec<String> = pods.iter().map(|p| p.id.clone()).collect();
    drop(pods);
    for id in &ids {
        assert!(
            handle_ips(&node, id).is_empty(),
            "sandbox {id}'s address is released"
        );
    }
    assert!(
        endpoint_ids(&node).is_empty(),
        "no endpoint is left: {}",
        node.api_get("/v1/endpoints")
    );
    assert_eq!(node.addresses_in_use(), 0, "the datastore holds no address");
}
