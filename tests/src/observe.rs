//! Pods with IPv4 and IPv6 on a real agent, and the operator's view of them (`weir …` output,
//! `/metrics` lines): shared by the observability tests and `cargo xtask demo`.

use std::{net::IpAddr, process::Command};

use hyper::Method;
use serde_json::{Value, json};

use crate::{
    agent_proc::{AgentDirs, AgentProcess, metrics_get},
    bpf::PinRoot,
    netns::{NetNs, VethPair},
    pod::{GATEWAY, workload_name},
};

/// The IPv6 gateway pods route through (link-local, on each host-side veth).
pub const GATEWAY6: &str = "fe80::1";

/// A pod: its namespace, addresses and veth.
pub struct Pod<'a> {
    /// Pod (and container id) name.
    pub name: String,
    /// Its network namespace.
    pub ns: NetNs,
    /// Its IPv4 address.
    pub ip: IpAddr,
    /// Its IPv6 address.
    pub ip6: IpAddr,
    _veth: VethPair<'a>,
}

/// Plumbs a pod in `node` (both families), allocated and registered with `agent`, labels `app`.
#[must_use]
pub fn pod<'a>(node: &'a NetNs, agent: &AgentProcess, name: &str, app: &str) -> Pod<'a> {
    let ns = NetNs::new();
    let host = workload_name();
    let veth = VethPair::named(node, &host, &ns, "eth0");
    let handle = format!("wt-net.{name}");
    let alloc: Value = agent
        .api(
            Method::POST,
            "/v1/ipam/allocate",
            Some(&json!({"handle": handle, "ipv4": 1, "ipv6": 1})),
        )
        .expect("allocate");
    let ips: Vec<IpAddr> = alloc["ips"]
        .as_array()
        .expect("ips")
        .iter()
        .map(|v| v.as_str().expect("address").parse().expect("ip"))
        .collect();
    let ip = *ips.iter().find(|i| i.is_ipv4()).expect("an IPv4 address");
    let ip6 = *ips.iter().find(|i| i.is_ipv6()).expect("an IPv6 address");
    node.exec(&["ip", "addr", "add", &format!("{GATEWAY}/32"), "dev", &host]);
    node.exec(&[
        "ip",
        "-6",
        "addr",
        "add",
        &format!("{GATEWAY6}/64"),
        "dev",
        &host,
        "nodad",
    ]);
    node.exec(&["ip", "route", "add", &format!("{ip}/32"), "dev", &host]);
    node.exec(&[
        "ip",
        "-6",
        "route",
        "add",
        &format!("{ip6}/128"),
        "dev",
        &host,
    ]);
    ns.exec(&["ip", "addr", "add", &format!("{ip}/32"), "dev", "eth0"]);
    ns.exec(&[
        "ip",
        "-6",
        "addr",
        "add",
        &format!("{ip6}/128"),
        "dev",
        "eth0",
        "nodad",
    ]);
    ns.exec(&["ip", "route", "add", GATEWAY, "dev", "eth0"]);
    ns.exec(&[
        "ip", "route", "add", "default", "via", GATEWAY, "dev", "eth0",
    ]);
    ns.exec(&[
        "ip", "-6", "route", "add", "default", "via", GATEWAY6, "dev", "eth0",
    ]);
    let body = json!({
        "container_id": name, "ifname": "eth0", "host_ifname": host, "namespace": "default",
        "pod": name, "labels": {"app": app}, "handle": handle, "ips": [ip, ip6],
    });
    let _: Value = agent
        .api(
            Method::PUT,
            &format!("/v1/endpoints/{name}:eth0"),
            Some(&body),
        )
        .expect("register");
    Pod {
        name: name.to_owned(),
        ns,
        ip,
        ip6,
        _veth: veth,
    }
}

/// A pin root, agent directories (with a policy dir) and a forwarding node namespace.
#[must_use]
pub fn node_and_agent() -> (PinRoot, AgentDirs, NetNs) {
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    std::fs::create_dir_all(dirs.path("policies")).expect("policy dir");
    let node = NetNs::new();
    node.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    node.exec(&["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"]);
    (root, dirs, node)
}

/// Starts an agent in `node` with an IPv4 and an IPv6 pool.
#[must_use]
pub fn start_agent(root: &PinRoot, dirs: &AgentDirs, node: &NetNs) -> AgentProcess {
    AgentProcess::start(
        root,
        dirs,
        Some(node),
        &["--pool", "10.244.0.0/16", "--pool", "fd00:77::/64"],
    )
}

/// Runs `weir ARGS --api-socket …` and asserts it succeeded.
#[must_use]
pub fn weir(agent: &AgentProcess, args: &[&str]) -> std::process::Output {
    let out = Command::new(crate::bin::weir())
        .args(args)
        .arg("--api-socket")
        .arg(&agent.socket)
        .output()
        .expect("run weir");
    assert!(
        out.status.success(),
        "weir {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `weir ARGS -o json`, decoded.
#[must_use]
pub fn weir_json(agent: &AgentProcess, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_slice(&weir(agent, &all).stdout).expect("json")
}

/// The value of the metric line starting with `prefix` (0 when absent).
#[must_use]
pub fn metric(node: &NetNs, prefix: &str) -> u64 {
    let text = node.run(|| metrics_get("/metrics"));
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .map_or(0, |v| v.parse().expect("metric value"))
}
