//! The real `weir agent --source kubernetes` against the test API server (`tests::kube_api`),
//! through kube's real client stack and a kubeconfig, with real traffic between pods:
//! - nothing is written to the kernel until every watcher delivered its initial list (a restart
//!   while one kind's list is held back keeps the old maps, byte for byte, and the old verdicts);
//! - a 410 Gone on every watch relists and converges with no write for unchanged objects;
//! - the API server down for a while changes no verdict and readiness says the source is stale;
//!   a NetworkPolicy created meanwhile applies when it returns; so do 503s and dropped
//!   connections.

use std::{
    net::TcpListener,
    time::{Duration, Instant},
};

use hyper::Method;
use serde_json::{Value, json};
use tests::{
    agent_pod::{Pod, connects, pod},
    agent_proc::{AgentDirs, AgentProcess, metrics_get},
    bpf::{PinRoot, bpftool},
    kube_api::{Fault, KubeApi},
    netns::NetNs,
    privileged::require_root,
};

fn namespace(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {"team": name}}})
}

fn node_object() -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "wt-node"},
           "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.1"}]}})
}

/// A NetworkPolicy on `web` in `default` letting `allowed` in on TCP 8080.
fn web_policy(name: &str, allowed: &str) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"name": name, "namespace": "default"},
           "spec": {"podSelector": {"matchLabels": {"app": "web"}},
                    "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": allowed}}}],
                                 "ports": [{"protocol": "TCP", "port": 8080}]}]}})
}

fn start_agent(root: &PinRoot, dirs: &AgentDirs, node: &NetNs, api: &KubeApi) -> AgentProcess {
    let kubeconfig = api.kubeconfig().display().to_string();
    AgentProcess::start(
        root,
        dirs,
        Some(node),
        &["--source", "kubernetes", "--kubeconfig", &kubeconfig],
    )
}

/// Waits (bounded) until `client` and `other` reach `web` as expected.
fn expect(web: &Pod<'_>, client: &Pod<'_>, other: &Pod<'_>, want: (bool, bool), what: &str) {
    tests::wait::until_eq(
        &format!("{what}: (client, other) reaching web"),
        Duration::from_secs(20),
        &want,
        || (connects(client, web), connects(other, web)),
    );
}

/// The verdicts stay `want` for `hold` (checked repeatedly).
fn holds(
    web: &Pod<'_>,
    client: &Pod<'_>,
    other: &Pod<'_>,
    want: (bool, bool),
    hold: Duration,
    what: &str,
) {
    let until = Instant::now() + hold;
    while Instant::now() < until {
        let got = (connects(client, web), connects(other, web));
        assert_eq!(got, want, "{what}: (client, other) reached web");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Every map's (key, value) pairs, read from the pins with bpftool.
fn map_contents(root: &PinRoot) -> Vec<(String, Value)> {
    let paths = root.paths();
    let mut out = Vec::new();
    for name in [
        maps_schema::maps::ENDPOINTS,
        maps_schema::maps::POLICY,
        maps_schema::maps::IPCACHE4,
        maps_schema::maps::IDENT4,
    ] {
        let pin = paths.map_pin(name);
        let dump = bpftool(&["map", "dump", "pinned", &pin.display().to_string()]);
        out.push((name.to_owned(), dump));
    }
    out
}

fn map_writes(agent: &AgentProcess) -> (u64, u64) {
    let status: Value = agent.api(Method::GET, "/v1/status", None).expect("status");
    let mut writes = (0, 0);
    for m in status["dataplane"]["maps"].as_array().expect("maps") {
        writes.0 += m[1]["writes"].as_u64().expect("writes");
        writes.1 += m[1]["deletes"].as_u64().expect("deletes");
    }
    writes
}

/// `GET /readyz` inside the node namespace; "" while nothing listens (before the agent serves).
fn readyz(node: &NetNs) -> String {
    node.run(|| {
        if std::net::TcpStream::connect("127.0.0.1:9972").is_err() {
            return String::new();
        }
        metrics_get("/readyz")
    })
}

use tests::wait::until as wait_for;

#[test]
fn nothing_is_written_before_every_initial_list_and_a_410_relist_writes_nothing() {
    if !require_root("nothing_is_written_before_every_initial_list_and_a_410_relist_writes_nothing")
    {
        return;
    }
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    let node = NetNs::new();
    node.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    let api = KubeApi::start(Some(&node));
    api.apply(namespace("default"));
    api.apply(node_object());
    api.apply(web_policy("web", "client"));
    let agent = start_agent(&root, &dirs, &node, &api);
    let web = served_pod(&api, &node, &agent, "web", "web");
    let client = served_pod(&api, &node, &agent, "client", "client");
    let other = served_pod(&api, &node, &agent, "other", "other");
    let _listener = web
        .ns
        .run(|| TcpListener::bind("0.0.0.0:8080").expect("listen in web"));
    expect(
        &web,
        &client,
        &other,
        (true, false),
        "the API server's policy admits client only",
    );
    assert_eq!(agent.terminate().code(), Some(0));

    // While the agent is away the policy changes; on its restart one kind's list is held back.
    let before = map_contents(&root);
    api.apply(web_policy("web", "other"));
    api.hold_lists("Node");
    let (node_lists, _) = api.requests("Node");
    let starting = std::thread::scope(|scope| {
        let agent = scope.spawn(|| start_agent(&root, &dirs, &node, &api));
        wait_for(
            "the restarted agent asks for the Node list",
            Duration::from_secs(30),
            || api.requests("Pod").0 > 1 && api.requests("NetworkPolicy").0 > 1,
        );
        // The held list is the one the agent waits for: nothing is written meanwhile.
        holds(
            &web,
            &client,
            &other,
            (true, false),
            Duration::from_secs(3),
            "before in-sync the old verdicts stay",
        );
        assert_eq!(
            map_contents(&root),
            before,
            "no map is written while the Node list is held back"
        );
        assert!(
            !readyz(&node).starts_with("HTTP/1.1 200"),
            "not ready before in-sync"
        );
        assert_eq!(
            api.requests("Node").0,
            node_lists,
            "the Node list is still held"
        );
        api.release_lists("Node");
        agent.join().expect("the agent starts")
    });
    let agent = starting;
    expect(
        &web,
        &client,
        &other,
        (false, true),
        "once in sync the new policy is in force",
    );
    assert_ne!(
        map_contents(&root),
        before,
        "the positive control: the policy map changed"
    );

    // A 410 on every watch: each kind relists, and nothing unchanged is written again.
    let writes = map_writes(&agent);
    let lists: Vec<usize> = ["Pod", "Namespace", "NetworkPolicy", "Node"]
        .iter()
        .map(|k| api.requests(k).0)
        .collect();
    api.expire_watches();
    wait_for(
        "every kind relists after the 410",
        Duration::from_secs(30),
        || {
            ["Pod", "Namespace", "NetworkPolicy", "Node"]
                .iter()
                .zip(&lists)
                .all(|(k, n)| api.requests(k).0 > *n)
        },
    );
    holds(
        &web,
        &client,
        &other,
        (false, true),
        Duration::from_secs(2),
        "after the relist",
    );
    assert_eq!(
        map_writes(&agent),
        writes,
        "the relist of unchanged objects writes nothing"
    );
    // The positive control of the counters: a real change after the relist is written.
    api.apply(web_policy("web", "client"));
    expect(
        &web,
        &client,
        &other,
        (true, false),
        "a change after the relist applies",
    );
    assert_ne!(map_writes(&agent), writes, "and is counted");
}

#[test]
fn the_api_server_down_changes_no_verdict_reports_stale_and_changes_made_meanwhile_apply() {
    if !require_root(
        "the_api_server_down_changes_no_verdict_reports_stale_and_changes_made_meanwhile_apply",
    ) {
        return;
    }
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    let node = NetNs::new();
    node.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    let mut api = KubeApi::start(Some(&node));
    api.apply(namespace("default"));
    api.apply(node_object());
    api.apply(web_policy("web", "client"));
    let agent = start_agent(&root, &dirs, &node, &api);
    let web = served_pod(&api, &node, &agent, "web", "web");
    let client = served_pod(&api, &node, &agent, "client", "client");
    let other = served_pod(&api, &node, &agent, "other", "other");
    let _listener = web
        .ns
        .run(|| TcpListener::bind("0.0.0.0:8080").expect("listen in web"));
    expect(&web, &client, &other, (true, false), "client only");
    assert!(
        readyz(&node).starts_with("HTTP/1.1 200"),
        "ready while connected"
    );

    // Down: connection refused. No verdict changes; readiness names the stale source.
    api.stop();
    wait_for(
        "readiness reports the stale source",
        Duration::from_secs(30),
        || {
            let r = readyz(&node);
            r.starts_with("HTTP/1.1 503") && r.contains("API server is unreachable")
        },
    );
    let status = std::process::Command::new(tests::bin::weir())
        .args(["status", "--api-socket"])
        .arg(&agent.socket)
        .output()
        .expect("weir status");
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(status.contains("ready:      false"), "{status}");
    assert!(status.contains("API server is unreachable"), "{status}");
    // A policy made while the agent cannot see it.
    api.apply(web_policy("web-other", "other"));
    holds(
        &web,
        &client,
        &other,
        (true, false),
        Duration::from_secs(3),
        "while the API server is down",
    );

    // Back: the policy made meanwhile applies, and the agent is ready again.
    api.start_again();
    expect(
        &web,
        &client,
        &other,
        (true, true),
        "the policy made while down applies",
    );
    wait_for("ready again", Duration::from_secs(30), || {
        readyz(&node).starts_with("HTTP/1.1 200")
    });

    // 503s, then dropped connections: stale again, nothing changes, and it recovers.
    for fault in [Fault::Unavailable, Fault::Drop] {
        api.set_fault(fault);
        api.expire_watches();
        wait_for("stale under the fault", Duration::from_secs(30), || {
            readyz(&node).starts_with("HTTP/1.1 503")
        });
        assert!(api.delete("NetworkPolicy", "default", "web-other"));
        holds(
            &web,
            &client,
            &other,
            (true, true),
            Duration::from_secs(2),
            "under the fault",
        );
        api.set_fault(Fault::None);
        expect(
            &web,
            &client,
            &other,
            (true, false),
            "the deletion made under the fault applies",
        );
        wait_for("ready after the fault", Duration::from_secs(30), || {
            readyz(&node).starts_with("HTTP/1.1 200")
        });
        api.apply(web_policy("web-other", "other"));
        expect(&web, &client, &other, (true, true), "connected again");
    }
}

/// Pod `name` as kubelet meets it: its Pod object on the API server first (scheduled, no address
/// yet), then its sandbox registered through the agent (which waits for the watch to deliver the
/// Pod: labels come only from the Pod object), then its address in the Pod's status.
fn served_pod<'a>(
    api: &KubeApi,
    node: &'a NetNs,
    agent: &AgentProcess,
    name: &str,
    app: &str,
) -> Pod<'a> {
    api.apply(json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "default", "labels": {"app": app}},
           "spec": {"nodeName": "wt-node", "containers": [{"name": "c", "image": "pause"}]}}));
    let pod = pod(node, agent, name, app);
    api.apply(pod_object(name, &pod.ip, app));
    pod
}

/// The Pod object of an API-registered pod (`agent_pod::pod` registers `default/NAME`).
fn pod_object(name: &str, ip: &str, app: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "default", "labels": {"app": app}},
           "spec": {"nodeName": "wt-node", "containers": [{"name": "c", "image": "pause"}]},
           "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}})
}

#[test]
fn a_pod_label_change_through_the_api_server_flips_real_traffic() {
    if !require_root("a_pod_label_change_through_the_api_server_flips_real_traffic") {
        return;
    }
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    let node = NetNs::new();
    node.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    let api = KubeApi::start(Some(&node));
    api.apply(namespace("default"));
    api.apply(node_object());
    api.apply(web_policy("web", "client"));
    let agent = start_agent(&root, &dirs, &node, &api);
    let web = served_pod(&api, &node, &agent, "web", "web");
    let client = served_pod(&api, &node, &agent, "client", "client");
    let other = served_pod(&api, &node, &agent, "other", "other");
    api.apply(pod_object("web", &web.ip, "web"));
    api.apply(pod_object("client", &client.ip, "client"));
    api.apply(pod_object("other", &other.ip, "other"));
    let _listener = web
        .ns
        .run(|| TcpListener::bind("0.0.0.0:8080").expect("listen in web"));
    expect(&web, &client, &other, (true, false), "client only");
    // `other` was registered as app=other; its Pod object now says app=client: admitted.
    api.apply(pod_object("other", &other.ip, "client"));
    expect(
        &web,
        &client,
        &other,
        (true, true),
        "other's Pod relabelled app=client",
    );
    // And client's Pod relabelled away from app=client: denied, with no restart.
    api.apply(pod_object("client", &client.ip, "nobody"));
    expect(
        &web,
        &client,
        &other,
        (false, true),
        "client's Pod relabelled app=nobody",
    );
    api.apply(pod_object("other", &other.ip, "other"));
    expect(
        &web,
        &client,
        &other,
        (false, false),
        "other's Pod back to app=other",
    );
}

/// `web_policy` letting `allowed` in on `port` (a port out of range is refused by the agent).
fn web_policy_on(name: &str, allowed: &str, port: u32) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"name": name, "namespace": "default"},
           "spec": {"podSelector": {"matchLabels": {"app": "web"}},
                    "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": allowed}}}],
                                 "ports": [{"protocol": "TCP", "port": port}]}]}})
}

/// The refused objects `GET /v1/status` lists.
fn policy_errors(agent: &AgentProcess) -> Vec<String> {
    let status: Value = agent.api(Method::GET, "/v1/status", None).expect("status");
    status["state"]["policy_errors"]
        .as_array()
        .expect("policy_errors")
        .iter()
        .map(|e| e.as_str().unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn an_invalid_policy_is_reported_by_name_and_the_rest_applies() {
    if !require_root("an_invalid_policy_is_reported_by_name_and_the_rest_applies") {
        return;
    }
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    let node = NetNs::new();
    node.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    let api = KubeApi::start(Some(&node));
    api.apply(namespace("default"));
    api.apply(node_object());
    api.apply(web_policy("web", "client"));
    // Would let `other` in, but its port is out of range: refused, named, left out.
    api.apply(web_policy_on("bad", "other", 70_000));
    let agent = start_agent(&root, &dirs, &node, &api);
    let web = served_pod(&api, &node, &agent, "web", "web");
    let client = served_pod(&api, &node, &agent, "client", "client");
    let other = served_pod(&api, &node, &agent, "other", "other");
    api.apply(pod_object("web", &web.ip, "web"));
    api.apply(pod_object("client", &client.ip, "client"));
    api.apply(pod_object("other", &other.ip, "other"));
    let _listener = web
        .ns
        .run(|| TcpListener::bind("0.0.0.0:8080").expect("listen in web"));
    expect(
        &web,
        &client,
        &other,
        (true, false),
        "the valid policy only",
    );
    let named = |errors: &[String]| {
        errors
            .iter()
            .any(|e| e.starts_with("NetworkPolicy default/bad") && e.contains("70000"))
    };
    let errors = policy_errors(&agent);
    assert!(named(&errors), "the refused policy is named: {errors:?}");
    // Fixed on the server (one watch event): it applies and its report goes (the positive
    // control: the same policy, valid, does let `other` in).
    api.apply(web_policy_on("bad", "other", 8080));
    expect(
        &web,
        &client,
        &other,
        (true, true),
        "the fixed policy applies",
    );
    wait_for(
        "the fixed policy's report to go",
        Duration::from_secs(10),
        || !named(&policy_errors(&agent)),
    );
    // Broken again by a watch event: left out again, named again, the rest still applies.
    api.apply(web_policy_on("bad", "other", 0));
    expect(
        &web,
        &client,
        &other,
        (true, false),
        "the broken policy is left out",
    );
    wait_for(
        "the broken policy's report",
        Duration::from_secs(10),
        || {
            policy_errors(&agent)
                .iter()
                .any(|e| e.starts_with("NetworkPolicy default/bad") && e.contains("port 0"))
        },
    );
}
