//! A restart at scale: 1,000 endpoints (1,000 real workload veths) and 100,000 policy entries.
//! bpftool shows the same map, program and link ids before and after; the agent's counters show
//! zero writes; and an established TCP flow to an ingress-isolated pod (whose replies pass only
//! through conntrack) keeps carrying data across the restart with no reset.

use std::{
    io::Write as _,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use hyper::Method;
use serde_json::{Value, json};
use tests::{
    agent_proc::{AgentDirs, AgentProcess},
    bpf::{PinRoot, bpftool},
    ct::{Flow, echo_server},
    netns::{NetNs, VethPair},
    pod::plumb,
    privileged::require_root,
};

const ENDPOINTS: usize = 1000;

fn host_name(i: usize) -> String {
    format!("weir{:05x}{i:06x}", std::process::id() & 0xf_ffff)
}

fn ip_of(i: usize) -> String {
    format!("10.244.{}.{}", 100 + i / 250, 1 + i % 250)
}

/// 1,000 workload veth pairs inside `node` (both ends there), in one `ip -batch`.
fn create_veths(node: &NetNs, skip: &[usize]) {
    let mut script = String::new();
    for i in (0..ENDPOINTS).filter(|i| !skip.contains(i)) {
        script.push_str(&format!(
            "link add {} type veth peer name wtp{i:05x}{:05x}\n",
            host_name(i),
            std::process::id() & 0xf_ffff
        ));
        // Up, as a pod's host veth is: the agent attaches only to links that are up.
        script.push_str(&format!("link set {} up\n", host_name(i)));
    }
    let mut child = Command::new("ip")
        .args(["netns", "exec", node.name(), "ip", "-batch", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("ip -batch");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(script.as_bytes())
        .expect("write batch");
    assert!(child.wait().expect("wait").success(), "ip -batch failed");
}

fn ids(node: &NetNs, root: &PinRoot, links: &[String]) -> (Vec<u64>, Vec<u64>, Vec<[u64; 2]>) {
    let paths = root.paths();
    let show = |kind: &str, pin: std::path::PathBuf| {
        bpftool(&[kind, "show", "pinned", &pin.display().to_string()])["id"]
            .as_u64()
            .expect("id")
    };
    let maps = maps_schema::maps::ALL
        .iter()
        .map(|m| show("map", paths.map_pin(m)))
        .collect();
    let progs = maps_schema::programs::ALL
        .iter()
        .map(|p| show("prog", paths.prog_pin(p)))
        .collect();
    // The programs on both hooks of each link, whichever mechanism attached them.
    let hooks = tests::hooks::hook_programs(node, root);
    let links = links
        .iter()
        .map(|l| {
            let h = hooks.get(l).copied().unwrap_or_default();
            [h[0], h[1]].map(|id| id.unwrap_or_else(|| panic!("{l}: not attached: {h:?}")))
        })
        .collect();
    (maps, progs, links)
}

#[test]
fn restart_at_scale_keeps_ids_writes_nothing_and_keeps_a_live_flow() {
    if !require_root("restart_at_scale_keeps_ids_writes_nothing_and_keeps_a_live_flow") {
        return;
    }
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    let node = NetNs::new();
    node.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    let (server_ns, client_ns) = (NetNs::new(), NetNs::new());
    // Endpoint 0 is the server (ingress-isolated), endpoint 1 the client; both real pods.
    let server = VethPair::named(&node, &host_name(0), &server_ns, "eth0");
    let client = VethPair::named(&node, &host_name(1), &client_ns, "eth0");
    create_veths(&node, &[0, 1]);
    for (ns, veth, i) in [(&server_ns, &server, 0), (&client_ns, &client, 1)] {
        plumb(&node, ns, veth, &ip_of(i));
    }

    // The registry as a previous run left it: 1,000 endpoints.
    let mut endpoints = serde_json::Map::new();
    for i in 0..ENDPOINTS {
        let app = match i {
            0 => "server",
            1 => "client",
            _ => "filler",
        };
        endpoints.insert(
            format!("c{i}:eth0"),
            json!({"id": i + 1, "container_id": format!("c{i}"), "ifname": "eth0", "host_ifname": host_name(i),
                   "namespace": "default", "pod": format!("p{i}"), "labels": {"app": app}, "handle": format!("wt-net.c{i}"), "ips": [ip_of(i)]}),
        );
    }
    let state = dirs.path("state");
    std::fs::create_dir_all(&state).expect("state dir");
    std::fs::write(
        state.join("endpoints.json"),
        serde_json::to_vec(&json!({"next_id": ENDPOINTS + 1, "endpoints": endpoints}))
            .expect("json"),
    )
    .expect("registry");
    // 100,000 policy entries: every endpoint admits 100 blocks on TCP 80 — and the server admits the client.
    let blocks: Vec<String> = (0..100)
        .map(|i| format!("{{ipBlock: {{cidr: 10.30.{i}.0/24}}}}"))
        .collect();
    let policies = dirs.path("policies");
    std::fs::create_dir_all(&policies).expect("policy dir");
    std::fs::write(
        policies.join("scale.yaml"),
        format!(
            "kind: NetworkPolicy\nmetadata: {{name: blocks, namespace: default}}\nspec:\n  podSelector: {{}}\n  ingress:\n  - from: [{}]\n    ports: [{{port: 80}}]\n---\nkind: NetworkPolicy\nmetadata: {{name: server, namespace: default}}\nspec:\n  podSelector: {{matchLabels: {{app: server}}}}\n  ingress:\n  - from: [{{podSelector: {{matchLabels: {{app: client}}}}}}]\n    ports: [{{port: 9000}}]\n",
            blocks.join(", ")
        ),
    )
    .expect("policy");

    let agent = AgentProcess::start(&root, &dirs, Some(&node), &[]);
    let status: Value = agent.api(Method::GET, "/v1/status", None).expect("status");
    assert_eq!(status["endpoints"], ENDPOINTS);
    let policy_writes = status["dataplane"]["maps"]
        .as_array()
        .expect("maps")
        .iter()
        .find(|m| m[0] == "policy_v1")
        .expect("policy")[1]["writes"]
        .as_u64();
    assert!(
        policy_writes >= Some(100_000),
        "the first start writes the 100,000 policy entries: {policy_writes:?}"
    );
    // Wait until every workload link carries both programs.
    let deadline = Instant::now() + Duration::from_secs(120);
    tests::hooks::wait_attached_count(
        &node,
        &root,
        ENDPOINTS,
        deadline.saturating_duration_since(Instant::now()),
    );

    // A live TCP flow client → server:9000 (server ingress-isolated: replies pass via conntrack).
    let _server = echo_server(&server_ns, 9000, 1);
    let flow = Flow::open(&client_ns, &format!("{}:9000", ip_of(0)));
    flow.assert_moving("before the restart");

    let sample: Vec<String> = (0..ENDPOINTS).step_by(50).map(host_name).collect();
    let before = ids(&node, &root, &sample);
    assert!(agent.terminate().success());
    let agent = AgentProcess::start(&root, &dirs, Some(&node), &[]);
    let after = ids(&node, &root, &sample);
    assert_eq!(
        before, after,
        "map and program ids, and the programs on every sampled link, are unchanged by the restart"
    );
    let status: Value = agent.api(Method::GET, "/v1/status", None).expect("status");
    for (name, stats) in status["dataplane"]["maps"]
        .as_array()
        .expect("maps")
        .iter()
        .map(|m| (&m[0], &m[1]))
    {
        assert_eq!(stats["writes"], 0, "{name}: a restart writes nothing");
        assert_eq!(stats["deletes"], 0, "{name}");
    }
    let attachments = &status["dataplane"]["attachments"];
    assert_eq!(
        (
            attachments["attaches"].as_u64(),
            attachments["updates"].as_u64(),
            attachments["unpins"].as_u64()
        ),
        (Some(0), Some(0), Some(0)),
        "{attachments}"
    );

    flow.assert_moving("after the restart");
    flow.finish().expect("the flow saw no reset or error");
    assert!(agent.terminate().success());
}
