//! Services and EndpointSlices from the real `weir agent --source kubernetes` against the test API
//! server (`tests::kube_api`), read back through `weir service list` (the agent's
//! `GET /v1/services`): a Service listed before the agent starts is in its first set; a slice's
//! endpoint turning not ready, then terminating, is shown as such; a bad Service is named in the
//! status with its field and left out while the others apply, and applies once fixed; a deleted
//! slice leaves its Service without backends, a deleted Service goes; a 410 relist keeps them.

use std::{process::Command, time::Duration};

use hyper::Method;
use serde_json::{Value, json};
use tests::{
    agent_proc::{AgentDirs, AgentProcess},
    bin,
    bpf::PinRoot,
    kube_api::KubeApi,
    netns::NetNs,
    privileged::require_root,
};

fn service(name: &str, cluster_ip: &str, port: u32) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": name, "namespace": "default"},
           "spec": {"clusterIP": cluster_ip,
                    "ports": [{"name": "http", "port": port, "targetPort": "http"}]}})
}

/// `web`'s slice: 10.244.0.1 ready, 10.244.0.2 with `conditions`.
fn slice(conditions: &Value) -> Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": "web-1", "namespace": "default",
                        "labels": {"kubernetes.io/service-name": "web"}},
           "addressType": "IPv4",
           "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
           "endpoints": [
               {"addresses": ["10.244.0.1"], "conditions": {"ready": true}, "nodeName": "wt-node"},
               {"addresses": ["10.244.0.2"], "conditions": conditions, "nodeName": "wt-node"}]})
}

/// `weir service list` with `args` (`-o json` or none) against the agent.
fn service_list(agent: &AgentProcess, args: &[&str]) -> String {
    let out = Command::new(bin::weir())
        .args(["service", "list", "--api-socket"])
        .arg(&agent.socket)
        .args(args)
        .output()
        .expect("run weir service list");
    assert!(
        out.status.success(),
        "weir service list failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// Every (service, frontend, backend, state) `weir service list -o json` prints, sorted.
fn rows(agent: &AgentProcess) -> Vec<String> {
    let listed: Value = serde_json::from_str(&service_list(agent, &["-o", "json"])).expect("JSON");
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let mut rows = Vec::new();
    for f in listed.as_array().expect("a list of frontends") {
        let (service, frontend) = (text(&f["service"]), text(&f["frontend"]));
        let backends = f["backends"].as_array().expect("backends");
        if backends.is_empty() {
            rows.push(format!("{service} {frontend} -"));
        }
        for b in backends {
            rows.push(format!(
                "{service} {frontend} {} {}",
                text(&b["address"]),
                text(&b["state"])
            ));
        }
    }
    rows.sort();
    rows
}

/// Waits (bounded) until the agent lists `want`.
fn expect_rows(agent: &AgentProcess, want: &[&str], what: &str) {
    tests::wait::until_eq(
        &format!("{what}: the agent's listing"),
        Duration::from_secs(20),
        want,
        || rows(agent),
    );
}

fn policy_errors(agent: &AgentProcess) -> Vec<String> {
    let status: Value = agent.api(Method::GET, "/v1/status", None).expect("status");
    status["state"]["policy_errors"]
        .as_array()
        .expect("policy_errors")
        .iter()
        .map(|e| e.as_str().unwrap_or_default().to_owned())
        .collect()
}

fn wait_for(what: &str, ok: impl FnMut() -> bool) {
    tests::wait::until(what, Duration::from_secs(20), ok);
}

const READY_1: &str = "default/web 10.96.0.10:80/tcp 10.244.0.1:8080 ready";

#[test]
fn services_and_slices_follow_the_api_server_with_endpoint_states_and_bad_objects_named() {
    if !require_root(
        "services_and_slices_follow_the_api_server_with_endpoint_states_and_bad_objects_named",
    ) {
        return;
    }
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    let node = NetNs::new();
    let api = KubeApi::start(Some(&node));
    api.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}}));
    api.apply(
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "wt-node"},
                     "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.1"}]}}),
    );
    // Before the agent starts: its initial lists carry them.
    api.apply(service("web", "10.96.0.10", 80));
    api.apply(slice(&json!({"ready": true})));
    let kubeconfig = api.kubeconfig().display().to_string();
    let agent = AgentProcess::start(
        &root,
        &dirs,
        Some(&node),
        &["--source", "kubernetes", "--kubeconfig", &kubeconfig],
    );
    expect_rows(
        &agent,
        &[
            READY_1,
            "default/web 10.96.0.10:80/tcp 10.244.0.2:8080 ready",
        ],
        "the first set",
    );

    // An endpoint turns not ready, then terminating (one watch event each).
    api.apply(slice(&json!({"ready": false})));
    expect_rows(
        &agent,
        &[
            READY_1,
            "default/web 10.96.0.10:80/tcp 10.244.0.2:8080 not-ready",
        ],
        "10.244.0.2 not ready",
    );
    api.apply(slice(
        &json!({"ready": false, "serving": true, "terminating": true}),
    ));
    expect_rows(
        &agent,
        &[
            READY_1,
            "default/web 10.96.0.10:80/tcp 10.244.0.2:8080 terminating",
        ],
        "10.244.0.2 terminating",
    );
    let table = service_list(&agent, &[]);
    assert!(
        table.lines().any(|l| l.contains("10.96.0.10:80/tcp")
            && l.contains("10.244.0.2:8080")
            && l.contains("terminating")
            && l.contains("web-1")),
        "the table names the frontend, backend, state and slice:\n{table}"
    );

    // A bad Service (a second cluster IP of the same family): named with its field, left out;
    // the good one stays.
    let mut bad = service("db", "10.96.0.20", 5432);
    bad["spec"]["clusterIPs"] = json!(["10.96.0.20", "10.96.0.21"]);
    api.apply(bad);
    wait_for("the bad Service named in the status", || {
        policy_errors(&agent)
            .iter()
            .any(|e| e.starts_with("Service default/db") && e.contains("spec.clusterIPs[1]"))
    });
    let with_terminating = [
        READY_1,
        "default/web 10.96.0.10:80/tcp 10.244.0.2:8080 terminating",
    ];
    assert_eq!(
        rows(&agent),
        with_terminating,
        "the bad Service is left out"
    );
    // Fixed: it applies (without a slice: no backends) and its report goes.
    api.apply(service("db", "10.96.0.20", 5432));
    expect_rows(
        &agent,
        &[
            "default/db 10.96.0.20:5432/tcp -",
            with_terminating[0],
            with_terminating[1],
        ],
        "the fixed Service",
    );
    wait_for("the fixed Service's report to go", || {
        !policy_errors(&agent)
            .iter()
            .any(|e| e.starts_with("Service default/db"))
    });

    // A 410 on every watch: the relist keeps every object.
    let lists = api.requests("EndpointSlice").0;
    api.expire_watches();
    wait_for("the slices relist", || {
        api.requests("EndpointSlice").0 > lists
    });
    assert_eq!(
        rows(&agent),
        [
            "default/db 10.96.0.20:5432/tcp -",
            with_terminating[0],
            with_terminating[1],
        ],
        "after the relist"
    );

    // Deletes remove: the slice (web keeps its frontend with no backend), then the Services.
    assert!(api.delete("EndpointSlice", "default", "web-1"));
    expect_rows(
        &agent,
        &[
            "default/db 10.96.0.20:5432/tcp -",
            "default/web 10.96.0.10:80/tcp -",
        ],
        "the slice deleted",
    );
    assert!(api.delete("Service", "default", "web"));
    assert!(api.delete("Service", "default", "db"));
    expect_rows(&agent, &[], "the Services deleted");
}
