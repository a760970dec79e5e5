//! The agent as the DaemonSet runs it, for real: the image `cargo xtask image` builds is imported
//! into a containerd of the test's own (`tests::cri`), and the DaemonSet's containers from
//! `deploy/weir.yaml` run under it with their command, environment, hostPath mounts (and
//! propagation) and security context as written (`tests::image` turns each into `ctr run`): the
//! privileged `mount-bpffs` step, `install-cni` (which puts weir-cni where containerd's CNI looks),
//! then the agent with host networking and its three named capabilities. Pods created through the
//! CRI get their addresses and their policy from that containerised agent; stopping the agent
//! container leaves traffic and policy in force (the pins live on the host's bpffs), and a new
//! agent container reuses the pinned programs. Socket LB is turned on as docs/install.md says (a
//! read-only hostPath of a cgroup v2 directory, `WEIR_SOCKET_LB_CGROUP`), and its programs are
//! found attached to that directory from outside.
//!
//! What differs from a cluster, and why: the hostPaths resolve inside containerd's private mount
//! namespace, where `/run`, `/var`, `/etc` and `/opt` are overlays and `/sys/fs/bpf` is a bpffs of
//! the test's own (so the DaemonSet's default paths — `/sys/fs/bpf/weir`, `/run/weir/weir.sock`,
//! `/etc/cni/net.d`, … — are used as written without touching the host's); `/etc/cni/net.d` and
//! `/opt/cni/bin` there are containerd's own CNI directories; the node name comes from the test
//! (`fieldRef: spec.nodeName`); and the datastore is the embedded one, since no API server can
//! run here (the ConfigMap's `WEIR_DATASTORE=kubernetes` and `WEIR_SOURCE=kubernetes` are dropped;
//! `ipam/tests/kubernetes.rs` covers that store, `kube_source.rs` that source).

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    time::{Duration, Instant},
};

use serde_json::Value;
use tests::{
    agent_proc::call_api,
    cri::{Cri, CriSetup, PodSpec},
    image::{self, Mode},
    manifests,
    netns::NetNs,
    podnet::{PodListener, PodNet},
    privileged::require_root,
};

const PORT: u16 = 8080;
const CONNECT: Duration = Duration::from_millis(800);
const WAIT: Duration = Duration::from_secs(90);
const NODE: &str = "wt-node";

/// Standalone-mode policy (pods' labels come from their namespaces here): the server's namespace
/// admits TCP 8080 only from namespaces labelled `team: wt-allowed`.
const POLICY: &str = r"apiVersion: v1
kind: Namespace
metadata:
  name: wt-srv
---
apiVersion: v1
kind: Namespace
metadata:
  name: wt-cli
  labels:
    team: wt-allowed
---
apiVersion: v1
kind: Namespace
metadata:
  name: wt-oth
  labels:
    team: wt-denied
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: wt-server-ingress
  namespace: wt-srv
spec:
  podSelector: {}
  policyTypes: [Ingress]
  ingress:
    - from:
        - namespaceSelector:
            matchLabels:
              team: wt-allowed
      ports:
        - protocol: TCP
          port: 8080
";

struct Pod {
    id: String,
    ip: String,
    net: PodNet,
}

fn run_pod(cri: &Cri, namespace: &str, name: &str) -> Pod {
    let spec = PodSpec::new(namespace, name);
    let id = cri
        .run_pod(&spec)
        .unwrap_or_else(|e| panic!("RunPodSandbox {name}: {e}\n{}", tail(&cri.log(), 20)));
    let status = cri.status(&id).expect("PodSandboxStatus");
    assert!(
        status.ready && !status.ip.is_empty(),
        "{name} is not ready with an address"
    );
    Pod {
        id,
        ip: status.ip,
        net: PodNet::of_process(status.pid),
    }
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Waits until `check` holds, bounded by [`WAIT`].
fn eventually(what: &str, mut check: impl FnMut() -> bool, diagnostics: impl Fn() -> String) {
    let deadline = Instant::now() + WAIT;
    while !check() {
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within {WAIT:?}:\n{}",
            diagnostics()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn get(node: &NetNs, path: &str) -> Option<u16> {
    let path = path.to_owned();
    node.run(move || {
        use std::io::{Read as _, Write as _};
        let mut s =
            std::net::TcpStream::connect_timeout(&"127.0.0.1:9972".parse().ok()?, CONNECT).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: weir\r\n\r\n").ok()?;
        let mut answer = String::new();
        s.read_to_string(&mut answer).ok()?;
        answer.split_whitespace().nth(1)?.parse().ok()
    })
}

/// Where the agent container sees the host's cgroup directory for socket LB (docs/install.md).
const SOCKET_LB_MOUNT: &str = "/host/sys/fs/cgroup";

/// The pod spec and agent container with socket LB turned on as docs/install.md says: `dir` as a
/// read-only hostPath volume at [`SOCKET_LB_MOUNT`], and `WEIR_SOCKET_LB_CGROUP` naming it.
fn with_socket_lb(
    mut pod: k8s_openapi::api::core::v1::PodSpec,
    agent: &k8s_openapi::api::core::v1::Container,
    dir: &std::path::Path,
    env: &mut BTreeMap<String, String>,
) -> (
    k8s_openapi::api::core::v1::PodSpec,
    k8s_openapi::api::core::v1::Container,
) {
    use k8s_openapi::api::core::v1::{HostPathVolumeSource, Volume, VolumeMount};
    pod.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: "wt-cgroup".into(),
        host_path: Some(HostPathVolumeSource {
            path: dir.display().to_string(),
            type_: Some("Directory".into()),
        }),
        ..Volume::default()
    });
    let mut agent = agent.clone();
    agent
        .volume_mounts
        .get_or_insert_with(Vec::new)
        .push(VolumeMount {
            name: "wt-cgroup".into(),
            mount_path: SOCKET_LB_MOUNT.into(),
            read_only: Some(true),
            ..VolumeMount::default()
        });
    env.insert("WEIR_SOCKET_LB_CGROUP".into(), SOCKET_LB_MOUNT.into());
    (pod, agent)
}

/// The agent's start report (the `"event": "started"` line of its log).
fn started(log: &str) -> Option<Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["event"] == "started")
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one story: install, run, pods, policy, restart"
)]
fn the_daemonset_runs_under_containerd_and_its_pods_keep_traffic_across_a_restart() {
    if !require_root(
        "the_daemonset_runs_under_containerd_and_its_pods_keep_traffic_across_a_restart",
    ) {
        return;
    }
    let (image_name, archive) = image::build();
    let docs = manifests::documents(
        &std::fs::read_to_string(manifests::path()).expect("deploy/weir.yaml"),
    );
    let mut problems = Vec::new();
    let manifest = manifests::parse(&docs, &mut problems);
    assert!(problems.is_empty(), "{problems:#?}");
    let (ds, agent) = manifests::agent(&manifest).expect("the DaemonSet's agent");
    let pod_spec = ds.spec.template.spec.clone().expect("pod spec");
    let mut env = manifests::agent_env(&manifest, agent, NODE);
    assert_eq!(
        env.get("WEIR_DATASTORE").map(String::as_str),
        Some("kubernetes")
    );
    env.remove("WEIR_DATASTORE");
    // No API server here either for the Kubernetes source: standalone (tests/tests/kube_source.rs
    // runs that source against a test API server).
    assert_eq!(
        env.get("WEIR_SOURCE").map(String::as_str),
        Some("kubernetes")
    );
    env.remove("WEIR_SOURCE");

    let node = NetNs::new();
    node.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=0"]);
    let conf = tempfile::Builder::new()
        .prefix("wt-netd")
        .tempdir()
        .expect("temp dir");
    let cri = Cri::start_with_overlays(
        &node,
        &CriSetup {
            conf_dir: conf.path().to_owned(),
            plugins: Vec::new(),
        },
        &["etc", "opt"],
    );
    // The "host" of the DaemonSet: a bpffs of the test's own at /sys/fs/bpf, and containerd's
    // CNI directories at the standard paths, all inside containerd's mount namespace.
    cri.run_inside(&format!(
        "mount -t bpf wt-bpffs /sys/fs/bpf && mkdir -p /etc/cni/net.d /opt/cni/bin && \
         mount --bind '{}' /etc/cni/net.d && mount --bind '{}' /opt/cni/bin",
        conf.path().display(),
        cri.path().join("bin").display()
    ));
    let import = cri.ctr(&[
        "-n",
        image::CTR_NAMESPACE,
        "images",
        "import",
        &archive.display().to_string(),
    ]);
    assert!(
        import.status.success(),
        "ctr images import: {}",
        String::from_utf8_lossy(&import.stderr)
    );

    // Init containers, in order; each must succeed.
    let no_env = BTreeMap::new();
    for init in pod_spec.init_containers.iter().flatten() {
        drop(image::run(
            &cri,
            &image_name,
            &pod_spec,
            init,
            &no_env,
            Mode::ToCompletion,
        ));
    }
    let installed = cri.path().join("bin/weir-cni");
    let version = std::process::Command::new(&installed)
        .env("CNI_COMMAND", "VERSION")
        .output()
        .expect("the installed weir-cni runs");
    assert!(
        String::from_utf8_lossy(&version.stdout).contains("1.0.0"),
        "install-cni put a working weir-cni in containerd's CNI bin directory"
    );
    assert!(
        cri.path().join("bin/loopback").exists(),
        "another plugin stays"
    );
    assert!(
        !conf.path().join("04-weir.conflist").exists(),
        "no conflist before the agent is ready"
    );

    let socket = cri.inside("/run/weir/weir.sock");
    let diagnostics = |agent: &image::CtrContainer<'_>| {
        format!(
            "agent log:\n{}\ncontainerd log:\n{}",
            tail(&agent.log(), 30),
            tail(&cri.log(), 10)
        )
    };
    // Socket LB as docs/install.md turns it on (the shipped manifest leaves it off): a read-only
    // hostPath of a cgroup v2 directory (here one of the test's own, not the hierarchy's root) and
    // `WEIR_SOCKET_LB_CGROUP` naming its mount.
    let cgroup = tests::cgroup::TestCgroup::new();
    let (pod_spec, agent) = with_socket_lb(pod_spec, agent, cgroup.path(), &mut env);
    let first = image::run(&cri, &image_name, &pod_spec, &agent, &env, Mode::Detached);
    eventually(
        "the agent container's /readyz answering 200",
        || get(&node, "/readyz") == Some(200),
        || diagnostics(&first),
    );
    assert_eq!(get(&node, "/healthz"), Some(200));
    // /readyz answers a moment before the start report is printed.
    eventually(
        "the start report",
        || started(&first.log()).is_some(),
        || diagnostics(&first),
    );
    let report = started(&first.log()).expect("the start report");
    assert_eq!(
        report["socket_lb"]["cgroup"], SOCKET_LB_MOUNT,
        "the containerised agent attached socket LB at the mount"
    );
    let mut want: Vec<&str> = maps_schema::programs::SOCKET_LB.to_vec();
    want.sort_unstable();
    assert_eq!(
        cgroup.attached(),
        want,
        "socket LB's programs on the host's cgroup, attached from the container"
    );
    // Named capabilities only, not privileged.
    let pid = first.pid().expect("the agent's process");
    let mut caps = image::effective_capabilities(pid);
    caps.sort();
    assert_eq!(
        caps,
        manifests::AGENT_CAPABILITIES,
        "the agent runs with exactly these"
    );
    // It set forwarding through the host's /proc/sys/net mounted at --proc-sys-net.
    let forwarding =
        String::from_utf8_lossy(&node.exec(&["sysctl", "-n", "net.ipv4.ip_forward"]).stdout)
            .trim()
            .to_owned();
    assert_eq!(forwarding, "1");
    assert!(
        conf.path().join("04-weir.conflist").exists(),
        "the ready agent wrote its conflist"
    );
    // JSON logs: every line of the container's output is a JSON object.
    for line in first.log().lines().filter(|l| !l.trim().is_empty()) {
        assert!(
            serde_json::from_str::<Value>(line).is_ok_and(|v| v.is_object()),
            "not a JSON log line: {line}"
        );
    }
    // The log level changes at run time, through the API, from inside the container.
    let out = first.exec(&["/weir", "log-level", "debug"]);
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("debug"),
        "weir log-level debug: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !first.log().contains(r#""level":"DEBUG""#),
        "no debug line before the change"
    );
    let bad = first.exec(&["/weir", "log-level", "info,=["]);
    assert!(
        !bad.status.success()
            && String::from_utf8_lossy(&bad.stderr).contains("invalid log filter"),
        "a filter that does not parse is refused: {}",
        String::from_utf8_lossy(&bad.stderr)
    );

    // Policy and pods.
    std::fs::write(cri.inside("/etc/weir/policies/wt-server.yaml"), POLICY).expect("policy file");
    eventually(
        "the policy loaded",
        || {
            call_api::<Value>(&socket, hyper::Method::GET, "/v1/status", None)
                .is_ok_and(|s| s["state"]["policies"] == 1)
        },
        || diagnostics(&first),
    );
    let server = run_pod(&cri, "wt-srv", "wt-server");
    let client = run_pod(&cri, "wt-cli", "wt-client");
    let other = run_pod(&cri, "wt-oth", "wt-other");
    // The allocations for the pods were logged at the level set at run time.
    eventually(
        "a debug line in the agent's log",
        || {
            first
                .log()
                .contains(r#""message":"allocation batch committed""#)
        },
        || diagnostics(&first),
    );
    let _listener = PodListener::start(&server.net, PORT);
    let target: SocketAddr = SocketAddr::new(server.ip.parse().expect("address"), PORT);
    let reach = |pod: &Pod| pod.net.connects(&[target], CONNECT)[0];
    eventually(
        "the client reaching the server",
        || reach(&client),
        || diagnostics(&first),
    );
    assert!(!reach(&other), "the policy denies a pod it does not allow");

    // Stop the agent container: traffic and policy stay.
    first.stop();
    drop(first);
    assert!(
        reach(&client),
        "with the agent stopped, allowed traffic flows"
    );
    assert!(!reach(&other), "with the agent stopped, the policy holds");

    // A new agent container reuses the pinned programs.
    let second = image::run(&cri, &image_name, &pod_spec, &agent, &env, Mode::Detached);
    eventually(
        "the new agent container's /readyz answering 200",
        || get(&node, "/readyz") == Some(200),
        || diagnostics(&second),
    );
    eventually(
        "the second start report",
        || started(&second.log()).is_some(),
        || diagnostics(&second),
    );
    let again = started(&second.log()).expect("the second start report");
    for (before, after) in report["programs"]
        .as_array()
        .expect("programs")
        .iter()
        .zip(again["programs"].as_array().expect("programs"))
    {
        assert_eq!(before[0], after[0]);
        assert_eq!(before[1], after[1], "program {} kept its id", before[0]);
        assert_eq!(after[2], true, "program {} reused from its pin", before[0]);
    }
    assert_eq!(again["endpoints"], 3, "the three endpoints restored");
    assert!(reach(&client), "after the restart, allowed traffic flows");
    assert!(!reach(&other), "after the restart, the policy holds");
    let late = run_pod(&cri, "wt-cli", "wt-late");
    eventually(
        "a pod created after the restart reaching the server",
        || reach(&late),
        || diagnostics(&second),
    );

    for pod in [&server, &client, &other, &late] {
        cri.stop(&pod.id).expect("StopPodSandbox");
        cri.remove(&pod.id).expect("RemovePodSandbox");
    }
    eventually(
        "no endpoint left",
        || {
            call_api::<Value>(&socket, hyper::Method::GET, "/v1/endpoints", None)
                .is_ok_and(|e| e.as_array().is_some_and(Vec::is_empty))
        },
        || diagnostics(&second),
    );
}
