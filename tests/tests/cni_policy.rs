//! TCP between pods that weir-cni attached follows NetworkPolicy files: weir-cni passes the pods'
//! namespace and name (`K8S_POD_NAMESPACE`/`K8S_POD_NAME`), their labels come from `kind: Pod`
//! documents in `--policy-dir`, and a policy on `web` lets `client` in and keeps `other` out
//! (each denial beside a passing positive control); swapping the two pods' labels in their Pod
//! documents swaps them, editing the policy swaps them back, and removing it opens `web` again,
//! all without a restart.

use std::{
    net::{IpAddr, SocketAddr, TcpListener, TcpStream},
    time::Duration,
};

use serde_json::{Value, json};
use tests::{
    cni::{CniNode, Pod},
    pod_doc::write_pod,
    privileged::require_root,
};

const PORT: u16 = 8080;

/// A pod added by weir-cni with `app=<app>`, and its ADD result.
struct Labelled {
    pod: Pod,
    conf: Value,
    result: Value,
    ip: IpAddr,
}

fn add(node: &CniNode, app: &str) -> Labelled {
    // Policies live in a namespace; pods without one (no K8S_POD_NAMESPACE) match none of them.
    // The pod `default/<app>` is labelled app=<app> by its Pod document.
    write_pod(
        &node.dirs.path("policies"),
        "default",
        app,
        &[("app", app)],
        &[],
    );
    let pod = Pod::k8s("default", app);
    let conf = node.conf(&json!({}));
    let result = node.add(&pod, &conf);
    let ip = Pod::ipv4(&result).parse().expect("an IPv4 address");
    Labelled {
        pod,
        conf,
        result,
        ip,
    }
}

fn connects(from: &Labelled, to: &Labelled) -> bool {
    let addr = SocketAddr::new(to.ip, PORT);
    from.pod
        .ns
        .run(move || TcpStream::connect_timeout(&addr, Duration::from_millis(700)).is_ok())
}

/// Waits (bounded) until `client` and `other` reach `web` as expected.
fn expect(
    node: &CniNode,
    web: &Labelled,
    client: &Labelled,
    other: &Labelled,
    want: (bool, bool),
    what: &str,
) {
    tests::wait::until_eq_or_show(
        &format!("{what}: (client, other) reaching web"),
        Duration::from_secs(20),
        &want,
        || (connects(client, web), connects(other, web)),
        || agent_state(node),
    );
}

/// The agent's endpoints and status, for a failure's message.
fn agent_state(node: &CniNode) -> String {
    format!(
        "endpoints: {}\nstatus: {}",
        node.api_get("/v1/endpoints"),
        node.api_get("/v1/status")
    )
}

fn policy(allowed_app: &str) -> String {
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: web, namespace: default}}\nspec:\n  podSelector: {{matchLabels: {{app: web}}}}\n  ingress:\n  - from: [{{podSelector: {{matchLabels: {{app: {allowed_app}}}}}}}]\n    ports: [{{protocol: TCP, port: {PORT}}}]\n"
    )
}

#[test]
fn tcp_between_cni_pods_follows_policy_files() {
    if !require_root("tcp_between_cni_pods_follows_policy_files") {
        return;
    }
    let node = CniNode::start(&["--pool", "10.244.0.0/16"]);
    let policy_dir = node.dirs.path("policies");
    std::fs::create_dir_all(&policy_dir).expect("policy dir");
    let web = add(&node, "web");
    let client = add(&node, "client");
    let other = add(&node, "other");
    let listen = SocketAddr::new(web.ip, PORT);
    let _listener = web
        .pod
        .ns
        .run(move || TcpListener::bind(listen).expect("listen in web"));

    expect(
        &node,
        &web,
        &client,
        &other,
        (true, true),
        "no policy: web is open to all",
    );

    let file = policy_dir.join("web.yaml");
    std::fs::write(&file, policy("client")).expect("write policy");
    expect(
        &node,
        &web,
        &client,
        &other,
        (true, false),
        "web admits client only",
    );

    // A label change on the Pod objects alone flips the traffic: `client` becomes app=other and
    // `other` app=client.
    write_pod(&policy_dir, "default", "client", &[("app", "other")], &[]);
    write_pod(&policy_dir, "default", "other", &[("app", "client")], &[]);
    expect(
        &node,
        &web,
        &client,
        &other,
        (false, true),
        "the pods' new labels swap them",
    );

    std::fs::write(&file, policy("other")).expect("edit policy");
    expect(
        &node,
        &web,
        &client,
        &other,
        (true, false),
        "the edit swaps them back",
    );

    std::fs::remove_file(&file).expect("remove policy");
    expect(
        &node,
        &web,
        &client,
        &other,
        (true, true),
        "without the file web is open again",
    );

    for pod in [&web, &client, &other] {
        node.del(&pod.pod, &pod.conf, Some(&pod.result));
    }
}

fn reaches(from: &Labelled, to: &Labelled, port: u16) -> bool {
    let addr = SocketAddr::new(to.ip, port);
    from.pod
        .ns
        .run(move || TcpStream::connect_timeout(&addr, Duration::from_millis(700)).is_ok())
}

/// Waits (bounded) until `client` reaches `web` on (8080, 8081) as `want` says.
fn expect_ports(node: &CniNode, web: &Labelled, client: &Labelled, want: (bool, bool), what: &str) {
    tests::wait::until_eq_or_show(
        &format!("{what}: client reaching web on ({PORT}, {})", PORT + 1),
        Duration::from_secs(20),
        &want,
        || (reaches(client, web, PORT), reaches(client, web, PORT + 1)),
        || agent_state(node),
    );
}

#[test]
fn named_ports_resolve_on_the_destination_pod_and_follow_its_pod_object() {
    if !require_root("named_ports_resolve_on_the_destination_pod_and_follow_its_pod_object") {
        return;
    }
    let node = CniNode::start(&["--pool", "10.244.0.0/16"]);
    let policy_dir = node.dirs.path("policies");
    let web = add(&node, "web");
    let client = add(&node, "client");
    let listeners: Vec<TcpListener> = [PORT, PORT + 1]
        .into_iter()
        .map(|port| {
            let listen = SocketAddr::new(web.ip, port);
            web.pod
                .ns
                .run(move || TcpListener::bind(listen).expect("listen in web"))
        })
        .collect();
    expect_ports(
        &node,
        &web,
        &client,
        (true, true),
        "no policy: both ports open",
    );

    // Ingress on web admits `port: http` only; egress on client allows `port: http` to web only.
    write_pod(
        &policy_dir,
        "default",
        "web",
        &[("app", "web")],
        &[("http", "TCP", PORT)],
    );
    std::fs::write(
        policy_dir.join("named.yaml"),
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: web-http, namespace: default}\nspec:\n  podSelector: {matchLabels: {app: web}}\n  ingress:\n  - ports: [{port: http}]\n---\napiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: client-out, namespace: default}\nspec:\n  podSelector: {matchLabels: {app: client}}\n  egress:\n  - to: [{podSelector: {matchLabels: {app: web}}}]\n    ports: [{port: http}]\n",
    )
    .expect("write policy");
    expect_ports(&node, &web, &client, (true, false), "http is 8080 on web");

    // The same name on another port: both directions re-resolve, with no restart.
    write_pod(
        &policy_dir,
        "default",
        "web",
        &[("app", "web")],
        &[("http", "TCP", PORT + 1)],
    );
    expect_ports(
        &node,
        &web,
        &client,
        (false, true),
        "http is 8081 on web now",
    );

    // A pod without the name: the clause matches nothing for it (not an error).
    write_pod(
        &policy_dir,
        "default",
        "web",
        &[("app", "web")],
        &[("metrics", "TCP", PORT)],
    );
    expect_ports(
        &node,
        &web,
        &client,
        (false, false),
        "web names no http port",
    );
    let status = node.api_get("/v1/status");
    assert!(
        status["state"]["policy_errors"]
            .as_array()
            .is_some_and(Vec::is_empty),
        "an unknown named port is no error: {status}"
    );

    // Positive control: without the policies both ports are open again.
    std::fs::remove_file(policy_dir.join("named.yaml")).expect("remove policy");
    expect_ports(&node, &web, &client, (true, true), "without the policies");
    drop(listeners);
    for pod in [&web, &client] {
        node.del(&pod.pod, &pod.conf, Some(&pod.result));
    }
}
