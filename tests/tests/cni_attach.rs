//! The attachment weir-cni makes (clsact + `cls_bpf` filters by default) keeps both promises:
//! - a link weir-cni created drops everything, both ways, until its endpoint exists (the ADD
//!   paused just before it registers the endpoint), counted as `unknown-endpoint`; the same
//!   traffic passes once the ADD completes (positive control);
//! - an agent upgrade (the previous release's object, `ct-v2`, replaced by the current one)
//!   swaps the programs on the live link in place: a 1 ms-interval UDP flow each way loses no
//!   datagram, and bpftool shows the new programs in the same filters;
//! - the `tcx` option pins a link per program; an agent switched to filters keeps a live link's
//!   tcx links (losing nothing of a 1 ms flow each way) and gives new pods filters, weir-cni
//!   following the agent's answer over a conflist that still says `tcx`.

use std::{
    net::UdpSocket,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use maps_schema::{
    counters::counter_index,
    reason::{DIR_FROM_ENDPOINT, DIR_TO_ENDPOINT, DROP_UNKNOWN_ENDPOINT},
};
use serde_json::{Value, json};
use tests::{
    bin,
    bpf::{bpftool, counter_from_bpftool},
    cni::{CniNode, Pod, exec_plugin_env},
    hooks,
    netns::NetNs,
    privileged::require_root,
};

const PREVIOUS_OBJECT: &str = env!("WEIR_TEST_OBJECT_CT_V2");
/// An address of the node (on its loopback) that pods send to through their default route.
const NODE_IP: &str = "10.250.0.1";

fn node_address(node: &CniNode) {
    node.ns
        .exec(&["ip", "addr", "add", &format!("{NODE_IP}/32"), "dev", "lo"]);
}

/// The one workload veth in the node.
fn host_veth(ns: &NetNs) -> Option<String> {
    let out = ns.exec(&["ip", "-o", "link", "show"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap_or(n).to_owned())
        .find(|n| n.starts_with("weir"))
}

fn pod_ip(pod: &Pod) -> Option<String> {
    let out = pod
        .ns
        .exec(&["ip", "-4", "-o", "addr", "show", "dev", "eth0"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let addr = text
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)?;
    Some(addr.split('/').next()?.to_owned())
}

/// Datagrams each way that arrive within `within`: (pod → node, node → pod).
fn delivered(node: &CniNode, pod: &Pod, ip: &str, port: u16, within: Duration) -> (usize, usize) {
    let at_node = node
        .ns
        .run(|| UdpSocket::bind((NODE_IP, port)).expect("bind in node"));
    let at_pod = pod
        .ns
        .run(|| UdpSocket::bind((ip, port)).expect("bind in pod"));
    for s in [&at_node, &at_pod] {
        s.set_read_timeout(Some(Duration::from_millis(50)))
            .expect("timeout");
    }
    let deadline = Instant::now() + within;
    let (mut up, mut down, mut buf) = (0, 0, [0u8; 16]);
    while Instant::now() < deadline && (up < 3 || down < 3) {
        let _ = at_pod.send_to(b"up", (NODE_IP, port));
        let _ = at_node.send_to(b"down", (ip, port));
        if at_node.recv_from(&mut buf).is_ok() {
            up += 1;
        }
        if at_pod.recv_from(&mut buf).is_ok() {
            down += 1;
        }
    }
    (up, down)
}

use tests::wait::until_some as wait_until;

/// No link pins: the attachment is the filter, seen by bpftool in the node.
fn assert_filters(node: &CniNode, host: &str) -> [u64; 2] {
    let links = node.root.paths().links_dir();
    let pins: Vec<_> = std::fs::read_dir(&links)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(pins.is_empty(), "no tcx link pins with filters: {pins:?}");
    let ids = hooks::programs_on(&node.ns, &node.root, host);
    ids.map(|id| id.unwrap_or_else(|| panic!("{host}: a hook without its filter: {ids:?}")))
}

fn pinned_program(node: &CniNode, program: &str) -> u64 {
    let pin = node.root.paths().prog_pin(program);
    bpftool(&["prog", "show", "pinned", &pin.display().to_string()])["id"]
        .as_u64()
        .expect("program id")
}

#[test]
fn a_link_weir_cni_made_drops_everything_until_its_endpoint_exists() {
    if !require_root("a_link_weir_cni_made_drops_everything_until_its_endpoint_exists") {
        return;
    }
    let node = CniNode::start(&[]);
    node_address(&node);
    let conf = node.conf(&json!({}));
    let pod = Pod::new();
    // The ADD pauses just before it registers the endpoint: addresses, routes and the link are
    // up, the programs attached, no endpoint entry yet.
    let result: Value = std::thread::scope(|s| {
        let adding = s.spawn(|| {
            exec_plugin_env(
                Some(&node.ns),
                &bin::weir_cni(),
                &pod.call("ADD"),
                conf.to_string().as_bytes(),
                &[("WEIR_CNI_FAILPOINT", "pause-before-endpoint=8")],
            )
        });
        let host = wait_until("the host veth", Duration::from_secs(10), || {
            host_veth(&node.ns)
        });
        let ip = wait_until("the pod's address", Duration::from_secs(10), || {
            pod_ip(&pod)
        });
        // Routes are configured after the address: wait for the host route too.
        wait_until("the host route", Duration::from_secs(10), || {
            let routes = node.ns.exec(&["ip", "-4", "route"]);
            String::from_utf8_lossy(&routes.stdout)
                .contains(&format!("{ip} dev {host}"))
                .then_some(())
        });
        assert!(
            node.api_get("/v1/endpoints")
                .as_array()
                .is_some_and(Vec::is_empty),
            "the endpoint does not exist yet"
        );
        let ids = assert_filters(&node, &host);
        assert_eq!(
            ids,
            [
                pinned_program(&node, hooks::PROGRAMS[0]),
                pinned_program(&node, hooks::PROGRAMS[1])
            ],
            "the agent's programs are on the link"
        );
        let counters = node.root.paths().map_pin("counters_v1");
        let unknown =
            |dir| counter_from_bpftool(&counters, counter_index(DROP_UNKNOWN_ENDPOINT, dir)).0;
        let before = (unknown(DIR_FROM_ENDPOINT), unknown(DIR_TO_ENDPOINT));
        assert_eq!(
            delivered(&node, &pod, &ip, 7101, Duration::from_secs(2)),
            (0, 0),
            "nothing passes either way before the endpoint exists"
        );
        assert!(
            unknown(DIR_FROM_ENDPOINT) > before.0 && unknown(DIR_TO_ENDPOINT) > before.1,
            "both programs dropped the traffic as unknown-endpoint"
        );
        let out = adding.join().expect("ADD thread");
        let result = out.ok("ADD after the pause").clone();
        // Positive control: the same traffic passes once the endpoint exists.
        let (up, down) = delivered(&node, &pod, &ip, 7102, Duration::from_secs(10));
        assert!(
            up > 0 && down > 0,
            "a registered pod passes both ways ({up}, {down})"
        );
        result
    });
    node.del(&pod, &conf, Some(&result));
}

/// A flow of numbered datagrams every millisecond from `tx` to `to`, counted at `rx`.
struct Flow {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    received: Arc<AtomicU64>,
    threads: Vec<JoinHandle<()>>,
}

impl Flow {
    fn start(tx: UdpSocket, rx: UdpSocket, to: (String, u16)) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (sent, received) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        rx.set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        let sender = {
            let (stop, sent) = (Arc::clone(&stop), Arc::clone(&sent));
            std::thread::spawn(move || {
                let mut next = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    let n = sent.load(Ordering::Relaxed);
                    tx.send_to(&n.to_be_bytes(), (to.0.as_str(), to.1))
                        .expect("send");
                    sent.fetch_add(1, Ordering::Relaxed);
                    next += Duration::from_millis(1);
                    std::thread::sleep(next.saturating_duration_since(Instant::now()));
                }
            })
        };
        let receiver = {
            let (stop, sent, received) =
                (Arc::clone(&stop), Arc::clone(&sent), Arc::clone(&received));
            std::thread::spawn(move || {
                let mut buf = [0u8; 8];
                loop {
                    match rx.recv_from(&mut buf) {
                        Ok(_) => {
                            received.fetch_add(1, Ordering::Relaxed);
                        }
                        // Stopped, and a quiet 200 ms after the last datagram: done.
                        Err(_) if stop.load(Ordering::Relaxed) => break,
                        Err(_) => {}
                    }
                    if stop.load(Ordering::Relaxed)
                        && received.load(Ordering::Relaxed) >= sent.load(Ordering::Relaxed)
                    {
                        break;
                    }
                }
            })
        };
        Self {
            stop,
            sent,
            received,
            threads: vec![sender, receiver],
        }
    }

    fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// Stops and returns (sent, received).
    fn finish(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().expect("flow thread");
        }
        (
            self.sent.load(Ordering::Relaxed),
            self.received.load(Ordering::Relaxed),
        )
    }
}

#[test]
fn an_agent_upgrade_replaces_the_programs_on_a_live_link_without_losing_a_packet() {
    if !require_root(
        "an_agent_upgrade_replaces_the_programs_on_a_live_link_without_losing_a_packet",
    ) {
        return;
    }
    assert!(
        std::path::Path::new(PREVIOUS_OBJECT).is_file(),
        "the ct-v2 object was built"
    );
    // The previous release: the layout-1 object.
    let mut node = CniNode::start(&[
        "--ebpf-object",
        PREVIOUS_OBJECT,
        "--ct-max-entries",
        "65536",
    ]);
    node_address(&node);
    let conf = node.conf(&json!({}));
    let pod = Pod::new();
    let result = node.add(&pod, &conf);
    let ip = Pod::ipv4(&result);
    let host = host_veth(&node.ns).expect("host veth");
    let old = assert_filters(&node, &host);

    // One flow each way, a datagram per millisecond.
    let port = 7201;
    let up = Flow::start(
        pod.ns
            .run(|| UdpSocket::bind((ip.as_str(), 0)).expect("bind in pod")),
        node.ns
            .run(|| UdpSocket::bind((NODE_IP, port)).expect("bind in node")),
        (NODE_IP.to_owned(), port),
    );
    let down = Flow::start(
        node.ns
            .run(|| UdpSocket::bind((NODE_IP, 0)).expect("bind in node")),
        pod.ns
            .run(|| UdpSocket::bind((ip.as_str(), port)).expect("bind in pod")),
        (ip.clone(), port),
    );
    wait_until("both flows to arrive", Duration::from_secs(10), || {
        (up.received() > 100 && down.received() > 100).then_some(())
    });

    // The upgrade: the current release's object (layout 2; conntrack migrates).
    node.restart_agent_with(&["--ct-max-entries", "65536"]);
    let new = [
        pinned_program(&node, hooks::PROGRAMS[0]),
        pinned_program(&node, hooks::PROGRAMS[1]),
    ];
    assert!(
        new.iter().zip(old).all(|(n, o)| *n != o),
        "the upgrade loaded new programs: {old:?} → {new:?}"
    );
    wait_until(
        "the link to run the new programs",
        Duration::from_secs(20),
        || (assert_filters(&node, &host) == new).then_some(()),
    );
    // A while on the new programs, then count.
    let settled = (up.received(), down.received());
    wait_until("both flows to go on", Duration::from_secs(10), || {
        (up.received() > settled.0 + 200 && down.received() > settled.1 + 200).then_some(())
    });
    let (up_sent, up_received) = up.finish();
    let (down_sent, down_received) = down.finish();
    assert_eq!(
        up_received, up_sent,
        "pod → node: every datagram across the upgrade arrived"
    );
    assert_eq!(
        down_received, down_sent,
        "node → pod: every datagram across the upgrade arrived"
    );
    eprintln!("across the upgrade: {up_sent} datagrams up, {down_sent} down, none lost");
    node.del(&pod, &conf, Some(&result));
}

/// The `cls_bpf` filters on `ifname` that bpftool shows in `ns` (kind, program id).
fn filters(ns: &NetNs, ifname: &str) -> Vec<(String, u64)> {
    let out = ns.exec(&["bpftool", "-j", "net", "show", "dev", ifname]);
    let json: Value = serde_json::from_slice(&out.stdout).expect("bpftool net show prints JSON");
    json.as_array()
        .into_iter()
        .flatten()
        .flat_map(|d| d["tc"].as_array().cloned().unwrap_or_default())
        .filter_map(|f| {
            let id = f["prog_id"].as_u64().or_else(|| f["id"].as_u64())?;
            Some((f["kind"].as_str()?.to_owned(), id))
        })
        .collect()
}

#[test]
fn the_tcx_option_pins_links_and_an_agent_switched_to_filters_keeps_live_links_losslessly() {
    if !require_root(
        "the_tcx_option_pins_links_and_an_agent_switched_to_filters_keeps_live_links_losslessly",
    ) {
        return;
    }
    let mut node = CniNode::start(&["--tc-attach", "tcx"]);
    node_address(&node);
    let written: Value = serde_json::from_slice(
        &std::fs::read(node.dirs.path("net.d").join("04-weir.conflist")).expect("conflist"),
    )
    .expect("json");
    assert_eq!(
        written["plugins"][0]["tcAttach"], "tcx",
        "the agent tells weir-cni its mechanism"
    );
    let conf = node.conf(&json!({"tcAttach": "tcx"}));
    let pod = Pod::new();
    let result = node.add(&pod, &conf);
    let ip = Pod::ipv4(&result);
    let host = host_veth(&node.ns).expect("host veth");
    let programs = [
        pinned_program(&node, hooks::PROGRAMS[0]),
        pinned_program(&node, hooks::PROGRAMS[1]),
    ];
    let tcx_links = |node: &CniNode| {
        hooks::PROGRAMS.map(|program| {
            let pin = node.root.paths().link_pin(&host, program);
            let link = bpftool(&["link", "show", "pinned", &pin.display().to_string()]);
            (link["id"].as_u64(), link["prog_id"].as_u64())
        })
    };
    // tcx: a pinned link per program, running the agent's program; no filter.
    let links = tcx_links(&node);
    assert_eq!(links.map(|(_, p)| p), programs.map(Some), "{links:?}");
    assert!(filters(&node.ns, &host).is_empty(), "no filter with tcx");
    let (up, down) = delivered(&node, &pod, &ip, 7301, Duration::from_secs(10));
    assert!(
        up > 0 && down > 0,
        "a tcx-attached pod passes ({up}, {down})"
    );

    // The agent switched to filters: the live link keeps its tcx links (a clsact qdisc added to
    // an up device would drop packets), a 1 ms flow each way loses nothing.
    let port = 7302;
    let upf = Flow::start(
        pod.ns
            .run(|| UdpSocket::bind((ip.as_str(), 0)).expect("bind in pod")),
        node.ns
            .run(|| UdpSocket::bind((NODE_IP, port)).expect("bind in node")),
        (NODE_IP.to_owned(), port),
    );
    let downf = Flow::start(
        node.ns
            .run(|| UdpSocket::bind((NODE_IP, 0)).expect("bind in node")),
        pod.ns
            .run(|| UdpSocket::bind((ip.as_str(), port)).expect("bind in pod")),
        (ip.clone(), port),
    );
    wait_until("both flows to arrive", Duration::from_secs(10), || {
        (upf.received() > 100 && downf.received() > 100).then_some(())
    });
    node.restart_agent_with(&["--tc-attach", "filter"]);
    let settled = (upf.received(), downf.received());
    wait_until("both flows to go on", Duration::from_secs(10), || {
        (upf.received() > settled.0 + 300 && downf.received() > settled.1 + 300).then_some(())
    });
    let (up_sent, up_received) = upf.finish();
    let (down_sent, down_received) = downf.finish();
    assert_eq!(up_received, up_sent, "pod → node: nothing lost");
    assert_eq!(down_received, down_sent, "node → pod: nothing lost");
    assert_eq!(tcx_links(&node), links, "the live link keeps its tcx links");
    assert!(filters(&node.ns, &host).is_empty(), "and gets no filter");
    let status = node.api_get("/v1/status");
    let attachments = &status["dataplane"]["attachments"];
    assert_eq!(attachments["attaches"], 0, "{status}");
    assert_eq!(attachments["unpins"], 0, "{status}");

    // A new pod under the filter agent gets filters, even through a conflist still saying tcx:
    // weir-cni follows the agent's allocate answer.
    let pod2 = Pod::new();
    let result2 = node.add(&pod2, &conf);
    let host2 = node
        .api_get("/v1/endpoints")
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["host_ifname"].as_str().map(str::to_owned))
        .find(|h| *h != host)
        .expect("second host veth");
    let on2: Vec<u64> = filters(&node.ns, &host2)
        .into_iter()
        .map(|(_, id)| id)
        .collect();
    assert_eq!(on2, programs.to_vec(), "filters on the new pod's veth");
    assert!(
        !node
            .root
            .paths()
            .link_pin(&host2, hooks::PROGRAMS[0])
            .exists(),
        "and no link pin"
    );
    let ip2 = Pod::ipv4(&result2);
    let (up, down) = delivered(&node, &pod2, &ip2, 7303, Duration::from_secs(10));
    assert!(
        up > 0 && down > 0,
        "the filter-attached pod passes ({up}, {down})"
    );
    node.del(&pod2, &conf, Some(&result2));
    node.del(&pod, &conf, Some(&result));
}
