//! NetworkPolicy files drive real traffic through the agent, hot-reloaded: a policy on `web` lets
//! `client` in and keeps `other` out (each denial beside a passing positive control); editing the
//! file swaps them with no restart; a broken file is refused with file and line while the last
//! good policy stays in force; removing the file opens `web` again.

use std::{
    net::TcpListener,
    time::{Duration, Instant},
};

use hyper::Method;
use serde_json::Value;
use tests::{
    agent_pod::{Pod, connects, pod},
    agent_proc::{AgentDirs, AgentProcess},
    bpf::PinRoot,
    netns::NetNs,
    privileged::require_root,
};

/// Waits (bounded) until `client` and `other` reach `web` as expected.
fn expect(
    web: &Pod<'_>,
    client: &Pod<'_>,
    other: &Pod<'_>,
    client_ok: bool,
    other_ok: bool,
    what: &str,
) {
    tests::wait::until_eq(
        &format!("{what}: (client, other) reaching web"),
        Duration::from_secs(15),
        &(client_ok, other_ok),
        || (connects(client, web), connects(other, web)),
    );
}

/// Replaces `file` as an operator's tooling (or a ConfigMap update) does: a temporary file renamed
/// over it, so the agent's reloader never reads a half-written (or truncated, empty) file.
fn write_atomically(file: &std::path::Path, text: &str) {
    let tmp = file.with_extension("yaml.tmp");
    std::fs::write(&tmp, text).expect("write the policy file");
    std::fs::rename(&tmp, file).expect("rename the policy file into place");
}

fn policy(allowed_app: &str) -> String {
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: web, namespace: default}}\nspec:\n  podSelector: {{matchLabels: {{app: web}}}}\n  ingress:\n  - from: [{{podSelector: {{matchLabels: {{app: {allowed_app}}}}}}}]\n    ports: [{{protocol: TCP, port: 8080}}]\n"
    )
}

#[test]
fn policy_files_change_what_passes_without_a_restart() {
    if !require_root("policy_files_change_what_passes_without_a_restart") {
        return;
    }
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    let policy_dir = dirs.path("policies");
    std::fs::create_dir_all(&policy_dir).expect("policy dir");
    let node = NetNs::new();
    node.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    let agent = AgentProcess::start(&root, &dirs, Some(&node), &[]);
    let web = pod(&node, &agent, "web", "web");
    let client = pod(&node, &agent, "client", "client");
    let other = pod(&node, &agent, "other", "other");
    let _listener = web
        .ns
        .run(|| TcpListener::bind("0.0.0.0:8080").expect("listen in web"));

    expect(
        &web,
        &client,
        &other,
        true,
        true,
        "no policy: web is open to all",
    );

    let file = policy_dir.join("web.yaml");
    write_atomically(&file, &policy("client"));
    expect(&web, &client, &other, true, false, "web admits client only");

    // The operator's view: why does other drop and client pass? Which reason counted the drops?
    let trace = |from: &Pod<'_>| -> Value {
        let out = std::process::Command::new(tests::bin::weir())
            .args([
                "policy",
                "trace",
                "--src",
                &from.ip,
                "--dst",
                &web.ip,
                "--protocol",
                "tcp",
                "--port",
                "8080",
                "-o",
                "json",
                "--api-socket",
            ])
            .arg(&agent.socket)
            .output()
            .expect("weir policy trace");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("json")
    };
    let denied = trace(&other);
    assert_eq!(denied["verdict"], "deny", "{denied}");
    assert!(
        denied["steps"][1]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("no rule admits")),
        "{denied}"
    );
    let allowed = trace(&client);
    assert_eq!(allowed["verdict"], "allow", "{allowed}");
    assert!(
        allowed["steps"][1]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("default/web ingress[0]")),
        "{allowed}"
    );
    let counters = std::process::Command::new(tests::bin::weir())
        .args(["bpf", "counters", "-o", "json", "--api-socket"])
        .arg(&agent.socket)
        .output()
        .expect("weir bpf counters");
    let counters: Value = serde_json::from_slice(&counters.stdout).expect("json");
    assert!(
        counters
            .as_array()
            .expect("list")
            .iter()
            .any(|c| c["reason"] == "policy-denied" && c["packets"].as_u64() > Some(0)),
        "the denied connection attempts are counted: {counters}"
    );

    write_atomically(&file, &policy("other"));
    expect(
        &web,
        &client,
        &other,
        false,
        true,
        "the edit swaps them, no restart",
    );

    write_atomically(
        &file,
        "kind: NetworkPolicy\nmetadata: {name: web}\nspec: {podSelector: {}, ingress: [{ports: [{port: 0}]}]}\n",
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    let errors = loop {
        let status: Value = agent.api(Method::GET, "/v1/status", None).expect("status");
        let errors = status["state"]["policy_errors"].clone();
        if errors.as_array().is_some_and(|e| !e.is_empty()) {
            break errors;
        }
        assert!(Instant::now() < deadline, "the broken file is reported");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        errors[0]
            .as_str()
            .is_some_and(|e| e.contains("web.yaml:1:") && e.contains("port 0")),
        "{errors}"
    );
    expect(
        &web,
        &client,
        &other,
        false,
        true,
        "the last good policy stays in force",
    );

    std::fs::remove_file(&file).expect("remove policy");
    expect(
        &web,
        &client,
        &other,
        true,
        true,
        "without policy web is open again",
    );
    assert!(agent.terminate().success());
}
