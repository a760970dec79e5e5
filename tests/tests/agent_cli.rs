//! The operator CLI against a running agent (black-box, the built `weir` binary): `weir status`,
//! `weir endpoint`, `weir bpf maps` (checked against bpftool), `weir bpf ct list|flush`, and the
//! conntrack sweep expiring an idle flow with the timeouts given as flags.

use std::{
    net::UdpSocket,
    process::Command,
    time::{Duration, Instant},
};

use hyper::Method;
use serde_json::{Value, json};
use tests::{
    agent_proc::{AgentDirs, AgentProcess, metrics_get},
    bin,
    bpf::{PinRoot, bpftool},
    netns::{NetNs, VethPair},
    pod::{GATEWAY, plumb, workload_name},
    privileged::require_root,
};

fn weir(agent: &AgentProcess, args: &[&str]) -> Value {
    tests::agent_proc::weir_json(&agent.socket, args)
}

fn has_flow(list: &Value, ip: &str) -> bool {
    list.as_array().is_some_and(|l| {
        l.iter().any(|e| {
            e["protocol"] == 17
                && (e["a"].as_str().is_some_and(|a| a.starts_with(ip))
                    || e["b"].as_str().is_some_and(|b| b.starts_with(ip)))
        })
    })
}

#[test]
fn cli_shows_status_endpoints_maps_and_conntrack() {
    if !require_root("cli_shows_status_endpoints_maps_and_conntrack") {
        return;
    }
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    let node = NetNs::new();
    let pod = NetNs::new();
    let agent = AgentProcess::start(
        &root,
        &dirs,
        Some(&node),
        &["--ct-sweep-interval", "1", "--ct-timeout-other", "2"],
    );
    let host = workload_name();
    let veth = VethPair::named(&node, &host, &pod, "eth0");
    let alloc: Value = agent
        .api(
            Method::POST,
            "/v1/ipam/allocate",
            Some(&json!({"handle": "wt-net.cli", "ipv4": 1})),
        )
        .expect("allocate");
    let ip = alloc["ips"][0].as_str().expect("address").to_owned();
    plumb(&node, &pod, &veth, &ip);
    let body = json!({"container_id": "cli", "ifname": "eth0", "host_ifname": host, "namespace": "default", "pod": "cli", "handle": "wt-net.cli", "ips": [ip]});
    let _: Value = agent
        .api(Method::PUT, "/v1/endpoints/cli:eth0", Some(&body))
        .expect("register");

    let status = weir(&agent, &["status"]);
    assert_eq!(status["ready"], true);
    assert_eq!(status["endpoints"], 1);
    let endpoints = weir(&agent, &["endpoint", "list"]);
    assert_eq!(endpoints[0]["host_ifname"], host.as_str());
    let one = weir(&agent, &["endpoint", "get", "cli:eth0"]);
    assert_eq!(one["ips"][0], ip.as_str());

    // weir bpf maps names every map with the id bpftool sees at its pin.
    let maps = weir(&agent, &["bpf", "maps"]);
    assert_eq!(
        maps.as_array().map(Vec::len),
        Some(maps_schema::maps::ALL.len())
    );
    for m in maps.as_array().expect("maps") {
        let shown = bpftool(&["map", "show", "pinned", m["pin"].as_str().expect("pin")]);
        assert_eq!(shown["id"], m["id"], "{}", m["name"]);
    }

    // A UDP flow from the pod shows up in conntrack, and the sweep removes it once idle.
    let rx = node.run(|| UdpSocket::bind(("0.0.0.0", 7100)).expect("bind"));
    let tx = pod.run(|| UdpSocket::bind((ip.as_str(), 0)).expect("bind"));
    rx.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut buf = [0u8; 8];
    loop {
        let _ = tx.send_to(b"ct", (GATEWAY, 7100));
        if rx.recv_from(&mut buf).is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "the pod's datagram arrives");
    }
    assert!(
        has_flow(&weir(&agent, &["bpf", "ct", "list"]), &ip),
        "the flow is in conntrack"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while has_flow(&weir(&agent, &["bpf", "ct", "list"]), &ip) {
        assert!(
            Instant::now() < deadline,
            "the idle flow is swept after its 2 s timeout"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let status = weir(&agent, &["status"]);
    assert!(
        status["conntrack"]["expired4"].as_u64() > Some(0),
        "{}",
        status["conntrack"]
    );

    // Flush: a fresh flow, listed (the flush has something to remove), then nothing.
    let _ = tx.send_to(b"ct", (GATEWAY, 7100));
    let _ = rx.recv_from(&mut buf);
    assert!(
        has_flow(&weir(&agent, &["bpf", "ct", "list"]), &ip),
        "the fresh flow is in conntrack before the flush"
    );
    let flushed = weir(&agent, &["bpf", "ct", "flush"]);
    assert!(
        flushed["flushed"].as_u64().is_some_and(|n| n >= 1),
        "the flush removed the flow: {flushed}"
    );
    assert!(
        !has_flow(&weir(&agent, &["bpf", "ct", "list"]), &ip),
        "flush empties conntrack"
    );

    // Metrics and health on 127.0.0.1:9972 (in the agent's namespace).
    let (metrics, readyz) = node.run(|| (metrics_get("/metrics"), metrics_get("/readyz")));
    assert!(readyz.starts_with("HTTP/1.1 200"), "{readyz}");
    for name in [
        "weir_driver_writes_total",
        "weir_conntrack_entries",
        "weir_program_loads_total",
        "weir_ready 1",
    ] {
        assert!(metrics.contains(name), "/metrics lacks {name}:\n{metrics}");
    }

    // Without an agent the CLI says what is wrong.
    let out = Command::new(bin::weir())
        .args(["status", "--api-socket"])
        .arg(dirs.path("nope.sock"))
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is `weir agent` running"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(agent.terminate().success());
}
