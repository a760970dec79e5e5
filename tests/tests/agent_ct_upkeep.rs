//! Conntrack upkeep through the agent's flags: a new `--ct-max-entries` resizes the pinned maps
//! at the next start through `<name>_old` with every entry kept and live flows carrying data; a
//! size too small for what conntrack holds keeps the map's size, evicting nothing; and
//! LRU evictions of a full map are counted in `/metrics` (zero while the map has room).

use std::{
    net::UdpSocket,
    os::fd::AsFd as _,
    time::{Duration, Instant},
};

use aya::maps::MapData;
use maps_schema::{
    Ct4Key, CtEntry,
    conntrack::{FLAG_SRC_EGRESS_APPROVED, FLAG_TCP_SYN, FLAG_TCP_SYN_ACK},
};
use tests::{
    agent_proc::{AgentDirs, AgentProcess, metrics_get},
    bpf::PinRoot,
    ct::{
        Flow, ISOLATE_ALL_ADMIT_CLIENT, TwoPods, ct_keys, ct_pins, echo_server, map_show,
        wait_for_links, with_two_pods,
    },
    netns::NetNs,
    privileged::require_root,
};

/// The kernel ids of the endpoint programs' pins (bpftool).
fn program_ids(root: &PinRoot) -> std::collections::BTreeMap<&'static str, u64> {
    ["from_endpoint", "to_endpoint"]
        .into_iter()
        .map(|p| (p, tests::bpf::pinned_prog_id(&root.paths().prog_pin(p))))
        .collect()
}

fn max_entries(root: &PinRoot, name: &str) -> u64 {
    map_show(root, name)["max_entries"]
        .as_u64()
        .expect("max_entries")
}

#[test]
fn a_new_ct_size_resizes_through_old_keeping_every_entry_and_live_flows() {
    if !require_root("a_new_ct_size_resizes_through_old_keeping_every_entry_and_live_flows") {
        return;
    }
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    with_two_pods('u', 45, |pods| resize(&root, &dirs, pods));
}

fn resize(root: &PinRoot, dirs: &AgentDirs, pods: &TwoPods<'_>) {
    let node = pods.node;
    pods.write_state(dirs, Some(ISOLATE_ALL_ADMIT_CLIENT));

    let agent = AgentProcess::start(root, dirs, Some(node), &["--ct-max-entries", "8192"]);
    assert_eq!(max_entries(root, "ct4_v3"), 8192);
    wait_for_links(node, root, 4);
    let _server = echo_server(pods.server, 9000, 2);
    let flows: Vec<Flow> = (0..2)
        .map(|_| Flow::open(pods.client, &pods.server_addr(9000)))
        .collect();
    for f in &flows {
        f.assert_moving("before the resize");
    }
    // 5,000 established entries: too many for 4,096 slots with headroom.
    let now = agent::kernel::real::ct::now_ns();
    let flags = FLAG_SRC_EGRESS_APPROVED | FLAG_TCP_SYN | FLAG_TCP_SYN_ACK;
    let entries: Vec<(Ct4Key, CtEntry)> = (0..5000u32)
        .map(|i| {
            let [_, _, a, b] = i.to_be_bytes();
            let key = Ct4Key {
                addr_a: [10, 97, a, b],
                addr_b: [10, 96, 0, 1],
                port_a: 50_000,
                port_b: 80,
                protocol: 6,
                _pad: [0; 3],
            };
            (key, CtEntry::new(now, flags))
        })
        .collect();
    let ct4 = MapData::from_pin(root.paths().map_pin("ct4_v3")).expect("ct4_v3");
    agent::kernel::real::batch::update(ct4.fd().as_fd(), &entries).expect("fill ct4_v3");
    drop(ct4);
    let before = ct_keys(root, 3);
    assert_eq!(
        before.len(),
        5002,
        "the flows' entries and the 5,000 filled"
    );
    let programs_before = program_ids(root);
    assert!(agent.terminate().success());

    // Too small for what ct4 holds: ct4 keeps its size (nothing evicted), ct6 (empty) shrinks.
    let agent = AgentProcess::start(root, dirs, Some(node), &["--ct-max-entries", "4096"]);
    assert_eq!(
        max_entries(root, "ct4_v3"),
        8192,
        "ct4 is not shrunk below its entries"
    );
    assert_eq!(max_entries(root, "ct6_v3"), 4096, "ct6 has room: resized");
    assert_eq!(ct_keys(root, 3), before, "nothing is evicted");
    let steps = agent.started["migration"]["steps"].to_string();
    assert!(steps.contains("\"keep\""), "{steps}");
    for f in &flows {
        f.assert_moving("after a start with a size too small");
    }
    assert!(agent.terminate().success());

    // Larger: copied through ct4_v3_old, programs replaced to use the new map.
    let agent = AgentProcess::start(root, dirs, Some(node), &["--ct-max-entries", "16384"]);
    assert_eq!(max_entries(root, "ct4_v3"), 16384);
    assert_eq!(max_entries(root, "ct6_v3"), 16384);
    assert_eq!(
        ct_pins(root),
        ["ct4_v3", "ct6_v3"].map(str::to_owned).into(),
        "the _old pins are gone"
    );
    assert_eq!(
        ct_keys(root, 3),
        before,
        "every conntrack key survives the resize"
    );
    let programs_after = program_ids(root);
    for program in ["from_endpoint", "to_endpoint"] {
        assert_ne!(
            programs_after[program], programs_before[program],
            "{program} was reloaded against the new maps (bpftool)"
        );
    }
    let steps = agent.started["migration"]["steps"].to_string();
    assert!(
        steps.contains("\"resize\"") && steps.contains("ct4_v3_old"),
        "{steps}"
    );
    for f in &flows {
        f.assert_moving("after the resize");
    }
    // A restart at the same size changes nothing.
    assert!(agent.terminate().success());
    let agent = AgentProcess::start(root, dirs, Some(node), &["--ct-max-entries", "16384"]);
    assert_eq!(agent.started["migration"]["steps"], serde_json::json!([]));
    assert!(agent.terminate().success());
    for f in flows {
        f.finish().expect("the flows carried data with no reset");
    }
}

fn metric(node: &NetNs, name: &str) -> Option<u64> {
    let body = node.run(|| metrics_get("/metrics"));
    body.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

fn wait_metric(node: &NetNs, name: &str, ok: impl Fn(u64) -> bool) -> u64 {
    tests::wait::until_ok(name, Duration::from_secs(30), || match metric(node, name) {
        Some(v) if ok(v) => Ok(v),
        value => Err(format!("it is {value:?}")),
    })
}

#[test]
fn lru_evictions_of_a_full_conntrack_map_are_counted() {
    if !require_root("lru_evictions_of_a_full_conntrack_map_are_counted") {
        return;
    }
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    with_two_pods('e', 46, |pods| evictions(&root, &dirs, pods));
}

fn evictions(root: &PinRoot, dirs: &AgentDirs, pods: &TwoPods<'_>) {
    let node = pods.node;
    pods.write_state(dirs, None);
    let agent = AgentProcess::start(
        root,
        dirs,
        Some(node),
        &["--ct-max-entries", "1024", "--ct-sweep-interval", "1"],
    );
    wait_for_links(node, root, 4);
    let server_ip: std::net::Ipv4Addr = pods.ips[0].parse().expect("ip");
    let send = |ports: std::ops::Range<u16>| {
        pods.client.run(|| {
            let socket = UdpSocket::bind("0.0.0.0:0").expect("udp");
            for port in ports {
                socket.send_to(b"x", (server_ip, port)).expect("send");
            }
        });
    };
    let created = "weir_conntrack_created_total{family=\"ipv4\"}";
    let evicted = "weir_conntrack_evicted_total{family=\"ipv4\"}";
    // Positive control: 100 flows fit; a sweep counts them created and nothing evicted.
    send(20_000..20_100);
    wait_metric(node, created, |v| v >= 100);
    // Two more sweeps have run over those flows (no hoping a sleep was long enough).
    let sweeps = || -> u64 {
        agent
            .api::<serde_json::Value>(hyper::Method::GET, "/v1/status", None)
            .expect("status")["conntrack"]["sweeps"]
            .as_u64()
            .expect("the status counts sweeps")
    };
    let seen = sweeps();
    let deadline = Instant::now() + Duration::from_secs(30);
    while sweeps() < seen + 2 {
        assert!(
            Instant::now() < deadline,
            "the sweep did not run twice in 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        metric(node, evicted),
        Some(0),
        "nothing is evicted while the map has room"
    );
    // 3,000 more flows through a 1,024-entry map: the kernel evicts about 2,000.
    send(30_000..33_000);
    wait_metric(node, created, |v| v >= 3100);
    let n = wait_metric(node, evicted, |v| v >= 1500);
    assert!(n <= 3100, "no more evictions than entries created: {n}");
    assert!(agent.terminate().success());
}
