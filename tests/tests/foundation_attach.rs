//! Real traffic through the attached programs: tc (tcx links, and clsact + `cls_bpf` filters) and
//! XDP on a veth in a test namespace.
//! Without an endpoint entry nothing passes (counted as unknown-endpoint); with one, the same
//! traffic passes (positive control). Attachments and counters are checked from outside with bpftool.

use std::{
    net::UdpSocket,
    time::{Duration, Instant},
};

use agent::attach::{AttachMode, attach_tc, attach_xdp};
use aya::{maps::HashMap, programs::TcAttachType};
use maps_schema::{
    EndpointInfo,
    counters::counter_index,
    programs::{FROM_ENDPOINT, TO_ENDPOINT, XDP_PREFILTER},
    reason::{DIR_FROM_ENDPOINT, DIR_PREFILTER, DROP_UNKNOWN_ENDPOINT, PASS},
};
use tests::{
    bpf::{PinRoot, bpftool, counter_from_bpftool, load_weir, tc, xdp},
    netns::{NetNs, VethPair},
    privileged::require_root,
};

const NODE_IP: &str = "10.201.0.1";
const POD_IP: [u8; 4] = [10, 201, 0, 2];

/// Sends datagrams from `tx` to `rx` for up to `within`, returning how many arrived.
fn exchange(tx: &UdpSocket, rx: &UdpSocket, within: Duration) -> usize {
    rx.set_read_timeout(Some(Duration::from_millis(100)))
        .expect("timeout");
    let deadline = Instant::now() + within;
    let mut received = 0;
    let mut buf = [0u8; 64];
    while Instant::now() < deadline {
        let _ = tx.send_to(b"weir", format!("{NODE_IP}:7777"));
        if rx.recv_from(&mut buf).is_ok() {
            received += 1;
            if received >= 3 {
                break;
            }
        }
    }
    received
}

/// Program ids of the tcx links bpftool lists (bpftool 7.1 prints the tcx link type as its number,
/// 11, and no interface for it).
fn tcx_prog_ids(links: &serde_json::Value) -> Vec<u64> {
    const BPF_LINK_TYPE_TCX: u64 = 11;
    links
        .as_array()
        .expect("link list")
        .iter()
        .filter(|l| l["type"] == "tcx" || l["type"].as_u64() == Some(BPF_LINK_TYPE_TCX))
        .filter_map(|l| l["prog_id"].as_u64())
        .collect()
}

#[test]
fn attached_programs_drop_unknown_and_pass_registered_traffic() {
    if !require_root("attached_programs_drop_unknown_and_pass_registered_traffic") {
        return;
    }
    let root = PinRoot::new();
    let paths = root.paths();
    std::fs::create_dir_all(paths.links_dir()).expect("links dir");
    let node = NetNs::new();
    let pod = NetNs::new();
    let veth = VethPair::new(&node, "h", &pod, "p");
    node.exec(&[
        "ip",
        "addr",
        "add",
        &format!("{NODE_IP}/24"),
        "dev",
        &veth.a,
    ]);
    pod.exec(&["ip", "addr", "add", "10.201.0.2/24", "dev", &veth.b]);
    let host_ifindex = node.ifindex(&veth.a);

    let mut ebpf = load_weir(&root);
    node.run(|| {
        for (name, hook) in [
            (FROM_ENDPOINT, TcAttachType::Ingress),
            (TO_ENDPOINT, TcAttachType::Egress),
        ] {
            let mode = attach_tc(
                tc(&mut ebpf, name),
                name,
                &veth.a,
                hook,
                &paths.link_pin(&veth.a, name),
            )
            .unwrap_or_else(|e| panic!("attach {name}: {e}"));
            assert_eq!(mode, AttachMode::NewLink, "tcx is available on this kernel");
        }
        let mode = attach_xdp(
            xdp(&mut ebpf, XDP_PREFILTER),
            XDP_PREFILTER,
            &veth.a,
            &paths.link_pin(&veth.a, XDP_PREFILTER),
        )
        .unwrap_or_else(|e| panic!("attach xdp: {e}"));
        assert_eq!(mode, AttachMode::NewLink);
    });

    // From outside: bpftool sees both tcx links, pinned where the agent pins them, running our
    // programs; the kernel's tcx query on the veth names the same programs.
    for name in [FROM_ENDPOINT, TO_ENDPOINT] {
        let prog_id = u64::from(tc(&mut ebpf, name).info().expect("info").id());
        let pin = paths.link_pin(&veth.a, name).display().to_string();
        let pinned = bpftool(&["link", "show", "pinned", &pin]);
        assert_eq!(
            pinned["prog_id"].as_u64(),
            Some(prog_id),
            "{pin} runs {name}"
        );
        assert!(
            tcx_prog_ids(&bpftool(&["link", "show"])).contains(&prog_id),
            "{name} is on a tcx link"
        );
        let hook = if name == FROM_ENDPOINT {
            TcAttachType::Ingress
        } else {
            TcAttachType::Egress
        };
        let (_, attached) = node
            .run(|| aya::programs::SchedClassifier::query_tcx(host_ifindex, hook))
            .expect("query tcx");
        assert!(
            attached.iter().any(|p| u64::from(p.id()) == prog_id),
            "{name} is attached to the veth"
        );
    }
    let pinned = bpftool(&[
        "link",
        "show",
        "pinned",
        &paths.link_pin(&veth.a, XDP_PREFILTER).display().to_string(),
    ]);
    assert_eq!(pinned["type"], "xdp");

    let rx = node.run(|| UdpSocket::bind(format!("{NODE_IP}:7777")).expect("bind in node"));
    let tx = pod.run(|| UdpSocket::bind("10.201.0.2:0").expect("bind in pod"));
    let counters = paths.map_pin("counters_v1");

    // Unknown endpoint: nothing passes, and the drop is counted under its reason.
    let received = exchange(&tx, &rx, Duration::from_secs(2));
    assert_eq!(
        received, 0,
        "traffic from an unregistered workload veth must not pass"
    );
    let (dropped, _) = counter_from_bpftool(
        &counters,
        counter_index(DROP_UNKNOWN_ENDPOINT, DIR_FROM_ENDPOINT),
    );
    assert!(
        dropped > 0,
        "unknown-endpoint drops are counted (bpftool shows {dropped})"
    );
    let (xdp_seen, _) = counter_from_bpftool(&counters, counter_index(PASS, DIR_PREFILTER));
    assert!(xdp_seen > 0, "xdp_prefilter saw the packets");

    // Positive control: register the endpoint; the same traffic now passes.
    let mut endpoints: HashMap<_, u32, EndpointInfo> =
        HashMap::try_from(ebpf.map_mut("endpoints_v1").expect("endpoints map")).expect("hash map");
    let info = EndpointInfo {
        endpoint_id: 1,
        identity: 1000,
        ipv4: [POD_IP, [0; 4]],
        ..EndpointInfo::default()
    };
    endpoints
        .insert(&host_ifindex, &info, 0)
        .expect("insert endpoint");
    let received = exchange(&tx, &rx, Duration::from_secs(10));
    assert!(received > 0, "a registered endpoint's traffic passes");
    let (passed, bytes) = counter_from_bpftool(&counters, counter_index(PASS, DIR_FROM_ENDPOINT));
    assert!(
        passed > 0 && bytes > 0,
        "passes are counted with their bytes"
    );
}

/// The same with the agent's default mechanism: clsact + `cls_bpf` filters in weir's slot, seen
/// by bpftool in the namespace; a second load replaces both programs in the same filters and the
/// registered endpoint keeps passing.
#[test]
fn filters_drop_unknown_pass_registered_and_are_replaced_in_place() {
    use std::os::fd::{AsFd as _, AsRawFd as _};

    use agent::attach::filter::Tc;
    if !require_root("filters_drop_unknown_pass_registered_and_are_replaced_in_place") {
        return;
    }
    let root = PinRoot::new();
    let paths = root.paths();
    let node = NetNs::new();
    let pod = NetNs::new();
    let veth = VethPair::new(&node, "h", &pod, "p");
    node.exec(&[
        "ip",
        "addr",
        "add",
        &format!("{NODE_IP}/24"),
        "dev",
        &veth.a,
    ]);
    pod.exec(&["ip", "addr", "add", "10.201.0.2/24", "dev", &veth.b]);
    let host_ifindex = node.ifindex(&veth.a);
    let hooks = [
        (FROM_ENDPOINT, TcAttachType::Ingress),
        (TO_ENDPOINT, TcAttachType::Egress),
    ];
    let attach = |ebpf: &mut aya::Ebpf| {
        node.run(|| {
            let mut nl = Tc::open().expect("netlink");
            nl.add_clsact(host_ifindex).expect("clsact");
            for (name, hook) in hooks {
                let fd = tc(ebpf, name).fd().expect("fd").as_fd().as_raw_fd();
                nl.set_filter(host_ifindex, hook, fd, name)
                    .unwrap_or_else(|e| panic!("attach {name}: {e}"));
            }
        });
        [FROM_ENDPOINT, TO_ENDPOINT].map(|n| u64::from(tc(ebpf, n).info().expect("info").id()))
    };
    let mut ebpf = load_weir(&root);
    let ids = attach(&mut ebpf);
    assert_eq!(
        tests::hooks::programs_on(&node, &root, &veth.a),
        ids.map(Some),
        "bpftool shows both filters running our programs"
    );

    let rx = node.run(|| UdpSocket::bind(format!("{NODE_IP}:7778")).expect("bind in node"));
    let tx = pod.run(|| UdpSocket::bind("10.201.0.2:0").expect("bind in pod"));
    let exchange = |within| {
        rx.set_read_timeout(Some(Duration::from_millis(100)))
            .expect("timeout");
        let deadline = Instant::now() + within;
        let (mut received, mut buf) = (0, [0u8; 64]);
        while Instant::now() < deadline && received < 3 {
            let _ = tx.send_to(b"weir", format!("{NODE_IP}:7778"));
            if rx.recv_from(&mut buf).is_ok() {
                received += 1;
            }
        }
        received
    };
    let counters = paths.map_pin("counters_v1");
    assert_eq!(
        exchange(Duration::from_secs(2)),
        0,
        "an unregistered veth passes nothing"
    );
    let (dropped, _) = counter_from_bpftool(
        &counters,
        counter_index(DROP_UNKNOWN_ENDPOINT, DIR_FROM_ENDPOINT),
    );
    assert!(
        dropped > 0,
        "unknown-endpoint drops are counted ({dropped})"
    );

    let mut endpoints: HashMap<_, u32, EndpointInfo> =
        HashMap::try_from(ebpf.map_mut("endpoints_v1").expect("endpoints map")).expect("hash map");
    let info = EndpointInfo {
        endpoint_id: 1,
        identity: 1000,
        ipv4: [POD_IP, [0; 4]],
        ..EndpointInfo::default()
    };
    endpoints
        .insert(&host_ifindex, &info, 0)
        .expect("insert endpoint");
    assert!(
        exchange(Duration::from_secs(10)) > 0,
        "a registered endpoint passes"
    );

    // Replacement: a second load (new program ids, same pinned maps) into the same slots.
    let mut second = load_weir(&root);
    let new_ids = attach(&mut second);
    assert_ne!(new_ids, ids, "the second load has its own programs");
    assert_eq!(
        tests::hooks::programs_on(&node, &root, &veth.a),
        new_ids.map(Some),
        "the filters now run the new programs"
    );
    let filters = node.run(|| {
        Tc::open()
            .expect("netlink")
            .bpf_filters(host_ifindex, TcAttachType::Ingress)
            .expect("dump")
    });
    assert_eq!(
        filters.len(),
        1,
        "replaced in place, not added: {filters:?}"
    );
    assert!(
        exchange(Duration::from_secs(10)) > 0,
        "the endpoint still passes"
    );
}
