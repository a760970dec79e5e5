//! `cargo xtask demo`: a real agent, three pods, a sample policy, an allowed and a denied flow (shown
//! live by `weir monitor`),
//! then what an operator reads: per-rule hits, verdict counters, `/metrics` and `weir policy
//! trace` through the loaded programs. Every step checks its outcome (it panics otherwise), so
//! the demo is also a test (`tests/tests/observe_demo.rs`). Needs root.

use std::{
    net::{SocketAddr, TcpListener, TcpStream},
    time::{Duration, Instant},
};

use crate::observe::{Pod, node_and_agent, pod, start_agent, weir};

/// The sample policy: `web` admits `client` on TCP 8080; everyone else is denied.
pub const SAMPLE_POLICY: &str = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: web, namespace: default}\nspec:\n  podSelector: {matchLabels: {app: web}}\n  ingress:\n  - from: [{podSelector: {matchLabels: {app: client}}}]\n    ports: [{protocol: TCP, port: 8080}]\n";

fn connects(from: &Pod<'_>, to: &Pod<'_>) -> bool {
    let addr = SocketAddr::new(to.ip, 8080);
    from.ns
        .run(|| TcpStream::connect_timeout(&addr, Duration::from_millis(700)).is_ok())
}

/// Runs the demo, handing each line of its transcript to `say`.
pub fn run(say: &mut dyn FnMut(&str)) {
    let (root, dirs, node) = node_and_agent();
    let agent = start_agent(&root, &dirs, &node);
    say(&format!(
        "agent running in namespace {} (pins {})",
        node.name(),
        root.path().display()
    ));
    let web = pod(&node, &agent, "web", "web");
    let client = pod(&node, &agent, "client", "client");
    let other = pod(&node, &agent, "other", "other");
    for p in [&web, &client, &other] {
        say(&format!("pod {:<7} {} {}", p.name, p.ip, p.ip6));
    }
    let _listener = web
        .ns
        .run(|| TcpListener::bind("[::]:8080").expect("listen in web"));
    // `weir monitor` from before the policy: the first denial of each CPU is sampled.
    say("$ weir monitor -o json --reason policy-denied --count 1   (in the background)");
    let mut monitor = std::process::Command::new(crate::bin::weir())
        .args([
            "monitor",
            "-o",
            "json",
            "--reason",
            "policy-denied",
            "--count",
            "1",
        ])
        .arg("--api-socket")
        .arg(&agent.socket)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start weir monitor");
    let (tx, events) = std::sync::mpsc::channel();
    let stdout = monitor.stdout.take().expect("monitor stdout");
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // Give the stream a moment to open before anything is denied (bounded; no assertion on it).
    std::thread::sleep(Duration::from_millis(500));
    std::fs::write(dirs.path("policies").join("web.yaml"), SAMPLE_POLICY).expect("policy");
    say("policy default/web: web admits client on TCP 8080");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (c, o) = (connects(&client, &web), connects(&other, &web));
        if c && !o {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "policy not in force: client {c}, other {o}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    say("client -> web:8080 connects (allowed); other -> web:8080 times out (denied)");
    let event = events
        .recv_timeout(Duration::from_secs(15))
        .expect("weir monitor shows the denied flow within 15 s");
    let parsed: serde_json::Value = serde_json::from_str(&event).expect("monitor json");
    assert_eq!(parsed["reason"], "policy-denied", "{event}");
    assert_eq!(parsed["dst"], web.ip.to_string(), "{event}");
    assert_eq!(parsed["src"], other.ip.to_string(), "{event}");
    say(&format!("weir monitor: {event}"));
    let _ = monitor.wait();
    let text = |args: &[&str]| String::from_utf8_lossy(&weir(&agent, args).stdout).into_owned();
    say("$ weir policy get default/web");
    let rules = text(&["policy", "get", "default/web"]);
    say(&rules);
    say("$ weir bpf counters");
    let counters = text(&["bpf", "counters"]);
    assert!(counters.contains("policy-denied"), "{counters}");
    say(&counters);
    say("$ curl 127.0.0.1:9972/metrics | grep -E 'drop_count|policy_rule_packets'");
    let metrics = node.run(|| crate::agent_proc::metrics_get("/metrics"));
    let lines: Vec<&str> = metrics
        .lines()
        .filter(|l| {
            l.starts_with("weir_drop_count_total")
                || l.starts_with("weir_policy_rule_packets_total")
        })
        .collect();
    assert!(
        lines.iter().any(|l| l.contains("reason=\"policy-denied\"")),
        "{metrics}"
    );
    say(&lines.join("\n"));
    let (o, w) = (other.ip.to_string(), web.ip.to_string());
    say(&format!(
        "$ weir policy trace --src {o} --dst {w} --protocol tcp --port 8080"
    ));
    let trace = text(&[
        "policy",
        "trace",
        "--src",
        &o,
        "--dst",
        &w,
        "--protocol",
        "tcp",
        "--port",
        "8080",
    ]);
    assert!(
        trace.contains("kernel (the loaded programs") && trace.contains("policy-denied"),
        "{trace}"
    );
    say(&trace);
    let c = client.ip.to_string();
    say(&format!(
        "$ weir policy trace --src {c} --dst {w} --protocol tcp --port 8080"
    ));
    let trace = text(&[
        "policy",
        "trace",
        "--src",
        &c,
        "--dst",
        &w,
        "--protocol",
        "tcp",
        "--port",
        "8080",
    ]);
    assert!(trace.contains("rule default/web ingress[0]"), "{trace}");
    say(&trace);
    assert!(agent.terminate().success(), "the agent stops cleanly");
    say("agent stopped; namespaces and pins are removed");
}
