//! `weir monitor` shows the programs' sampled drop events: a connection attempt a policy denies
//! shows up with reason `policy-denied` and the right addresses and port within a bounded wait
//! (its filters by reason, endpoint and addresses match it), while a monitor filtering for another
//! reason shows nothing over the same time (the positive control is the first monitor).

use std::{
    io::{BufRead as _, BufReader},
    net::TcpListener,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use serde_json::Value;
use tests::{
    agent_pod::{connects, pod},
    agent_proc::{AgentDirs, AgentProcess},
    bpf::PinRoot,
    netns::NetNs,
    privileged::require_root,
};

/// A `weir monitor` process, killed when dropped; its output lines arrive on channels.
struct Monitor {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Monitor {
    /// Starts `weir monitor -o json ARGS` and waits (bounded) until it is subscribed.
    fn start(agent: &AgentProcess, args: &[&str]) -> Self {
        let mut child = Command::new(tests::bin::weir())
            .args(["monitor", "-o", "json", "--api-socket"])
            .arg(&agent.socket)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("weir monitor");
        let (out, lines) = mpsc::channel();
        let stdout = child.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if out.send(line).is_err() {
                    break;
                }
            }
        });
        let (err_tx, err_rx) = mpsc::channel();
        let stderr = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if err_tx.send(line).is_err() {
                    break;
                }
            }
        });
        let said = err_rx
            .recv_timeout(Duration::from_secs(20))
            .expect("weir monitor says it is monitoring");
        assert!(said.starts_with("monitoring drop events"), "{said}");
        Self { child, lines }
    }

    /// The next event within `wait`.
    fn next(&self, wait: Duration) -> Option<Value> {
        let line = self.lines.recv_timeout(wait).ok()?;
        Some(serde_json::from_str(&line).expect("one JSON object per line"))
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        if let Err(e) = self.child.kill() {
            eprintln!("weir monitor already gone: {e}");
        }
        if let Err(e) = self.child.wait() {
            eprintln!("cannot reap weir monitor: {e}");
        }
    }
}

fn policy() -> &'static str {
    "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: web, namespace: default}\nspec:\n  podSelector: {matchLabels: {app: web}}\n  ingress:\n  - from: [{podSelector: {matchLabels: {app: client}}}]\n    ports: [{protocol: TCP, port: 8080}]\n"
}

#[test]
fn a_denied_connection_shows_up_in_weir_monitor_and_another_reason_shows_nothing() {
    if !require_root(
        "a_denied_connection_shows_up_in_weir_monitor_and_another_reason_shows_nothing",
    ) {
        return;
    }
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    let policy_dir = dirs.path("policies");
    std::fs::create_dir_all(&policy_dir).expect("policy dir");
    std::fs::write(policy_dir.join("web.yaml"), policy()).expect("write policy");
    let node = NetNs::new();
    node.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    let agent = AgentProcess::start(&root, &dirs, Some(&node), &[]);
    let web = pod(&node, &agent, "web", "web");
    let client = pod(&node, &agent, "client", "client");
    let other = pod(&node, &agent, "other", "other");
    let _listener = web
        .ns
        .run(|| TcpListener::bind("0.0.0.0:8080").expect("listen in web"));
    // The policy is in force: client passes (no drop on the way).
    let deadline = Instant::now() + Duration::from_secs(15);
    while !connects(&client, &web) {
        assert!(Instant::now() < deadline, "client never reached web");
        std::thread::sleep(Duration::from_millis(100));
    }

    let denied = Monitor::start(&agent, &["--reason", "policy-denied", "--count", "1"]);
    let filtered = Monitor::start(
        &agent,
        &[
            "--endpoint",
            "web:eth0",
            "--from",
            &other.ip,
            "--to",
            &web.ip,
            "--count",
            "1",
        ],
    );
    let elsewhere = Monitor::start(&agent, &["--reason", "spoofed-source"]);

    assert!(!connects(&other, &web), "the policy keeps other out");
    for (name, monitor) in [("--reason", &denied), ("--endpoint/--from/--to", &filtered)] {
        let event = monitor
            .next(Duration::from_secs(10))
            .unwrap_or_else(|| panic!("{name}: no drop event within 10 s"));
        assert_eq!(event["reason"], "policy-denied", "{name}: {event}");
        assert_eq!(event["direction"], "to-endpoint", "{name}: {event}");
        assert_eq!(event["src"], other.ip.as_str(), "{name}: {event}");
        assert_eq!(event["dst"], web.ip.as_str(), "{name}: {event}");
        assert_eq!(event["protocol"], 6, "{name}: {event}");
        assert_eq!(event["dst_port"], 8080, "{name}: {event}");
    }
    // The monitor for another reason saw the same stream and showed nothing of it.
    assert!(
        elsewhere.next(Duration::from_secs(2)).is_none(),
        "a monitor for spoofed-source shows no policy drop"
    );
    drop((denied, filtered, elsewhere));
    assert!(agent.terminate().success());
}
