//! Drift repair and tampering, from outside, with live pods and a probe running throughout: a policy
//! admits `client` into `web` and keeps `other` out. Each tampering an operator's stray command could do
//! (policy entries deleted, an identity entry altered, an endpoint entry deleted, a map's pin removed; a
//! workload's tc filter deleted, its clsact qdisc deleted) is repaired — within `--refresh-interval`, or at
//! once from the kernel's netlink event (shown by an agent whose periodic refresh is off) — checked with
//! `bpftool`, `tc` and real traffic, and counted by driver in `weir status` and `/metrics`. The probe from
//! `other` to `web` runs through every map tampering and never connects; `client` connecting after each
//! repair is the positive control.

use std::{
    net::{SocketAddr, TcpListener, TcpStream},
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use tests::{
    agent_pod::{Pod, connects, pod},
    agent_proc::{AgentDirs, AgentProcess, metrics_get},
    bpf::{PinRoot, bpftool},
    netns::NetNs,
    privileged::require_root,
    wait,
};

const POLICY: &str = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: web, namespace: default}\nspec:\n  podSelector: {matchLabels: {app: web}}\n  ingress:\n  - from: [{podSelector: {matchLabels: {app: client}}}]\n    ports: [{protocol: TCP, port: 8080}]\n";

/// Bounded waits: a few refresh intervals (2 s) and then some.
const REPAIRED: Duration = Duration::from_secs(20);

/// A connection probe from `from` to `to` on a thread of its own, counting every attempt and every
/// connection that got through, until dropped.
struct Probe {
    stop: Arc<AtomicBool>,
    attempts: Arc<AtomicU64>,
    through: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Probe {
    fn start(from: &NetNs, to: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let attempts = Arc::new(AtomicU64::new(0));
        let through = Arc::new(AtomicU64::new(0));
        let addr: SocketAddr = format!("{to}:8080").parse().expect("addr");
        let netns = format!("/run/netns/{}", from.name());
        let (s, a, t) = (stop.clone(), attempts.clone(), through.clone());
        let thread = std::thread::spawn(move || {
            let file = std::fs::File::open(&netns).expect("the pod's netns");
            nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            // Bounded by the test: it stops the probe before it ends.
            while !s.load(Ordering::Relaxed) {
                a.fetch_add(1, Ordering::Relaxed);
                if TcpStream::connect_timeout(&addr, Duration::from_millis(50)).is_ok() {
                    t.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        Self {
            stop,
            attempts,
            through,
            thread: Some(thread),
        }
    }

    /// (attempts, connections that got through) so far.
    fn counts(&self) -> (u64, u64) {
        (
            self.attempts.load(Ordering::Relaxed),
            self.through.load(Ordering::Relaxed),
        )
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _joined = t.join();
        }
    }
}

/// Accepts and closes connections in `ns` on port 8080 (so the backlog never fills), until the
/// namespace's listener is dropped with the test.
fn serve(ns: &NetNs) {
    let listener = ns.run(|| TcpListener::bind("0.0.0.0:8080").expect("listen in web"));
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            drop(conn);
        }
    });
}

fn pin(root: &PinRoot, map: &str) -> String {
    root.paths().map_pin(map).display().to_string()
}

/// An address or index as bpftool's `key`/`value` hex bytes.
fn hex(bytes: &[u8]) -> Vec<String> {
    bytes.iter().map(|b| format!("{b:#04x}")).collect()
}

fn ipv4(ip: &str) -> Vec<String> {
    hex(&ip.parse::<std::net::Ipv4Addr>().expect("ip").octets())
}

/// The value of `key` in the map pinned at `pin`, as bpftool prints it; `None` without the entry.
fn lookup(pin: &str, key: &[String]) -> Option<Vec<String>> {
    let dump = bpftool(&["map", "dump", "pinned", pin]);
    dump.as_array()
        .into_iter()
        .flatten()
        .find(|e| {
            e["key"].as_array().is_some_and(|k| {
                k.iter()
                    .map(|b| b.as_str().unwrap_or(""))
                    .eq(key.iter().map(String::as_str))
            })
        })
        .map(|e| {
            e["value"]
                .as_array()
                .expect("value bytes")
                .iter()
                .map(|b| b.as_str().expect("hex").to_owned())
                .collect()
        })
}

fn bpftool_map(op: &str, pin: &str, key: &[String], value: Option<&[String]>) {
    let mut cmd = std::process::Command::new("bpftool");
    cmd.args(["map", op, "pinned", pin, "key"]).args(key);
    if let Some(v) = value {
        cmd.arg("value").args(v);
    }
    let out = cmd.output().expect("bpftool");
    assert!(
        out.status.success(),
        "bpftool map {op}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The clsact filters on `dev` in `node`, as `tc filter show` prints them (one hook).
fn filters(node: &NetNs, dev: &str, hook: &str) -> String {
    String::from_utf8_lossy(
        &node
            .exec(&["tc", "filter", "show", "dev", dev, hook])
            .stdout,
    )
    .into_owned()
}

fn both_programs(node: &NetNs, dev: &str) -> bool {
    filters(node, dev, "ingress").contains("from_endpoint")
        && filters(node, dev, "egress").contains("to_endpoint")
}

fn expect(web: &Pod<'_>, client: &Pod<'_>, other: &Pod<'_>, client_ok: bool, what: &str) {
    wait::until_eq(
        &format!("{what}: (client, other) reaching web"),
        REPAIRED,
        &(client_ok, false),
        || (connects(client, web), connects(other, web)),
    );
}

#[test]
fn drift_is_repaired_and_tampering_never_admits_the_denied_peer() {
    if !require_root("drift_is_repaired_and_tampering_never_admits_the_denied_peer") {
        return;
    }
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    std::fs::create_dir_all(dirs.path("policies")).expect("policy dir");
    std::fs::write(dirs.path("policies").join("web.yaml"), POLICY).expect("policy");
    let node = NetNs::new();
    node.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    let agent = AgentProcess::start(&root, &dirs, Some(&node), &["--refresh-interval", "2"]);
    let web = pod(&node, &agent, "web", "web");
    let client = pod(&node, &agent, "client", "client");
    let other = pod(&node, &agent, "other", "other");
    serve(&web.ns);
    expect(&web, &client, &other, true, "the policy admits client only");
    assert!(
        both_programs(&node, &web.host),
        "web's filters are in place"
    );

    let probe = Probe::start(&other.ns, &web.ip);

    // Every policy_v1 entry deleted: client is denied meanwhile (fail closed), then let in again.
    let policy = pin(&root, "policy_v1");
    let entries = bpftool(&["map", "dump", "pinned", &policy]);
    let keys: Vec<Vec<String>> = entries
        .as_array()
        .expect("policy entries")
        .iter()
        .map(|e| {
            e["key"]
                .as_array()
                .expect("key")
                .iter()
                .map(|b| b.as_str().expect("hex").to_owned())
                .collect()
        })
        .collect();
    assert!(!keys.is_empty(), "policy_v1 holds entries: {entries}");
    for key in &keys {
        bpftool_map("delete", &policy, key, None);
    }
    wait::until("policy_v1 is refilled", REPAIRED, || {
        bpftool(&["map", "dump", "pinned", &policy])
            .as_array()
            .is_some_and(|a| a.len() == keys.len())
    });
    expect(&web, &client, &other, true, "policy entries repaired");
    assert!(agent.repairs("policy_v1") >= 1);

    // client's identity entry altered to other's: client is denied meanwhile, then repaired.
    let ident = pin(&root, "ident4_v1");
    let client_value = lookup(&ident, &ipv4(&client.ip)).expect("client's identity entry");
    let other_value = lookup(&ident, &ipv4(&other.ip)).expect("other's identity entry");
    assert_ne!(client_value, other_value);
    bpftool_map("update", &ident, &ipv4(&client.ip), Some(&other_value));
    wait::until_eq(
        "client's identity entry is repaired",
        REPAIRED,
        &Some(client_value.clone()),
        || lookup(&ident, &ipv4(&client.ip)),
    );
    expect(&web, &client, &other, true, "identity entry repaired");
    assert!(agent.repairs("ident4_v1") >= 1);

    // web's endpoint entry deleted: web drops everything meanwhile (unknown endpoint), then repaired.
    let endpoints = pin(&root, "endpoints_v1");
    let web_key = hex(&node.ifindex(&web.host).to_le_bytes());
    let web_entry = lookup(&endpoints, &web_key).expect("web's endpoint entry");
    bpftool_map("delete", &endpoints, &web_key, None);
    wait::until_eq(
        "web's endpoint entry is repaired",
        REPAIRED,
        &Some(web_entry),
        || lookup(&endpoints, &web_key),
    );
    expect(&web, &client, &other, true, "endpoint entry repaired");
    assert!(agent.repairs("endpoints_v1") >= 1);

    // The policy map's pin removed: the agent pins the map it holds open again (the same map).
    let id = bpftool(&["map", "show", "pinned", &policy])["id"]
        .as_u64()
        .expect("id");
    std::fs::remove_file(&policy).expect("rm the pin");
    wait::until("policy_v1 is pinned again", REPAIRED, || {
        Path::new(&policy).exists()
    });
    assert_eq!(
        bpftool(&["map", "show", "pinned", &policy])["id"].as_u64(),
        Some(id),
        "the same map is pinned again"
    );
    expect(&web, &client, &other, true, "pin repaired");

    let (attempts, through) = probe.counts();
    drop(probe);
    assert!(
        attempts > 20,
        "the probe ran throughout: {attempts} attempts"
    );
    assert_eq!(
        through, 0,
        "a denied connection got through during a map's repair ({attempts} attempts)"
    );

    // The operator's view.
    let metrics = node.run(|| metrics_get("/metrics"));
    for driver in ["policy_v1", "ident4_v1", "endpoints_v1"] {
        assert!(
            metrics.lines().any(|l| l.starts_with(&format!(
                "weir_dataplane_repairs_total{{driver=\"{driver}\"}}"
            )) && !l.ends_with(" 0")),
            "{driver}'s repairs in /metrics:\n{metrics}"
        );
    }
    assert!(agent.terminate().success());

    // The kernel's events alone: with the periodic refresh off, a deleted filter and a deleted
    // qdisc are re-attached (only the netlink event can have told the agent).
    let agent = AgentProcess::start(&root, &dirs, Some(&node), &["--refresh-interval", "0"]);
    expect(&web, &client, &other, true, "after the restart");
    node.exec(&["tc", "filter", "del", "dev", &web.host, "egress"]);
    wait::until("web's egress filter is re-attached", REPAIRED, || {
        filters(&node, &web.host, "egress").contains("to_endpoint")
    });
    expect(&web, &client, &other, true, "filter repaired");
    assert_eq!(agent.repairs("tc-attachments"), 1);
    node.exec(&["tc", "qdisc", "del", "dev", &web.host, "clsact"]);
    wait::until("web's qdisc and both filters are back", REPAIRED, || {
        both_programs(&node, &web.host)
    });
    expect(&web, &client, &other, true, "qdisc repaired");
    assert_eq!(agent.repairs("tc-attachments"), 3);
    assert!(agent.terminate().success());
}
