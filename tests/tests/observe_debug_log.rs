//! The opt-in debug build of the programs (`cargo xtask build-ebpf --debug-log`, feature
//! `debug-log`): an agent loading it with `--ebpf-object` drains every decision into its log
//! (`tracing`, target `datapath`); the default object carries no log at all.

use std::{
    net::{SocketAddr, UdpSocket},
    path::Path,
    time::Duration,
};

use hyper::Method;
use serde_json::{Value, json};
use tests::{
    agent_proc::{AgentDirs, AgentLog, AgentProcess, call_api},
    bpf::PinRoot,
    netns::{NetNs, VethPair},
    pod::{GATEWAY, workload_name},
    privileged::require_root,
};

/// A `weir agent` whose stderr (its log) the test reads.
struct LoggingAgent {
    _agent: AgentProcess,
    log: AgentLog,
}

impl LoggingAgent {
    fn start(root: &PinRoot, dirs: &AgentDirs, node: &NetNs, object: &Path) -> Self {
        let object = object.to_str().expect("a UTF-8 object path");
        let (agent, log) = AgentProcess::start_logged(
            root,
            dirs,
            Some(node),
            &["--log", "info", "--ebpf-object", object],
        );
        Self { _agent: agent, log }
    }

    /// Waits (bounded) for a log line containing every one of `parts`.
    fn wait_for(&self, parts: &[&str]) -> String {
        tests::wait::until_ok(
            &format!("a log line with {parts:?}"),
            Duration::from_secs(15),
            || {
                let log = self.log.lock().expect("log");
                log.iter()
                    .find(|l| parts.iter().all(|p| l.contains(p)))
                    .cloned()
                    .ok_or_else(|| format!("log: {log:?}"))
            },
        )
    }
}

#[test]
fn the_debug_build_logs_each_decision_and_the_default_build_never_does() {
    if !require_root("the_debug_build_logs_each_decision_and_the_default_build_never_does") {
        return;
    }
    // The default object has no aya-log map or level symbol at all.
    let has = |object: &[u8], what: &[u8]| object.windows(what.len()).any(|w| w == what);
    assert!(
        !has(agent::EBPF_OBJECT, b"AYA_LOGS"),
        "the default build carries aya-log"
    );
    let debug = Path::new(env!("WEIR_TEST_OBJECT_DEBUG_LOG"));
    let debug_bytes = std::fs::read(debug).expect("the debug-log object");
    assert!(
        has(&debug_bytes, b"AYA_LOGS"),
        "the debug build carries aya-log (control)"
    );

    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    std::fs::create_dir_all(dirs.path("policies")).expect("policy dir");
    let node = NetNs::new();
    let agent = LoggingAgent::start(&root, &dirs, &node, debug);
    agent.wait_for(&["datapath debug logging is on"]);
    let socket = dirs.path("weir.sock");

    let pod = NetNs::new();
    let host = workload_name();
    let _veth = VethPair::named(&node, &host, &pod, "eth0");
    let alloc: Value = call_api(
        &socket,
        Method::POST,
        "/v1/ipam/allocate",
        Some(&json!({"handle": "wt-net.dbg", "ipv4": 1})),
    )
    .expect("allocate");
    let ip = alloc["ips"][0].as_str().expect("address").to_owned();
    node.exec(&["ip", "addr", "add", &format!("{GATEWAY}/32"), "dev", &host]);
    node.exec(&["ip", "route", "add", &format!("{ip}/32"), "dev", &host]);
    pod.exec(&["ip", "addr", "add", &format!("{ip}/32"), "dev", "eth0"]);
    pod.exec(&["ip", "addr", "add", "10.99.0.5/32", "dev", "eth0"]);
    pod.exec(&["ip", "route", "add", GATEWAY, "dev", "eth0"]);
    let body = json!({
        "container_id": "dbg", "ifname": "eth0", "host_ifname": host, "namespace": "default",
        "pod": "dbg", "labels": {"app": "dbg"}, "handle": "wt-net.dbg", "ips": [ip],
    });
    let _: Value =
        call_api(&socket, Method::PUT, "/v1/endpoints/dbg:eth0", Some(&body)).expect("register");
    let ifindex = node.ifindex(&host).to_string();
    let to: SocketAddr = format!("{GATEWAY}:9").parse().expect("addr");
    let send = |from: &str| {
        let from: SocketAddr = format!("{from}:0").parse().expect("addr");
        pod.run(|| {
            let s = UdpSocket::bind(from).expect("udp");
            s.send_to(b"wt-debug-log", to).expect("send");
        });
    };
    // A passing packet (not isolated: reason 0) and a spoofed one (reason 4), each logged with
    // the interface it was seen on.
    send(&ip);
    let line = agent.wait_for(&[
        "weir decision: direction=0",
        &format!("ifindex={ifindex}"),
        "reason=0 ",
    ]);
    assert!(
        line.contains("datapath"),
        "drained under the datapath target: {line}"
    );
    send("10.99.0.5");
    agent.wait_for(&[
        "weir decision: direction=0",
        &format!("ifindex={ifindex}"),
        "reason=4 ",
    ]);
}
