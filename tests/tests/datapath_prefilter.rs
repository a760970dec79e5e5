//! `xdp_prefilter` on a veth in a test namespace: traffic from a deny CIDR drops before the stack
//! sees it, traffic from other sources passes (positive control); counted, checked with `bpftool`.

use std::{
    net::{Ipv4Addr, UdpSocket},
    time::{Duration, Instant},
};

use maps_schema::{
    counters::counter_index,
    maps,
    programs::XDP_PREFILTER,
    reason::{DIR_PREFILTER, DROP_PREFILTER_DENY, PASS},
};
use tests::{
    bpf::{PinRoot, counter_from_bpftool, load_weir, xdp},
    datapath::write_prefilter,
    netns::{NetNs, VethPair},
    privileged::require_root,
};

const DENIED: Ipv4Addr = Ipv4Addr::new(10, 246, 0, 1);
const ALLOWED: Ipv4Addr = Ipv4Addr::new(10, 247, 0, 1);
const TARGET: Ipv4Addr = Ipv4Addr::new(10, 248, 0, 1);

/// Datagrams from `src` that reach the receiver within `wait`.
fn received_from(sender: &NetNs, src: Ipv4Addr, rx: &UdpSocket, wait: Duration) -> usize {
    let tx = sender.run(move || UdpSocket::bind((src, 0)).expect("bind sender"));
    let port = rx.local_addr().expect("addr").port();
    let deadline = Instant::now() + wait;
    let (mut got, mut buf) = (0, [0u8; 16]);
    while Instant::now() < deadline && got < 3 {
        tx.send_to(b"weir", (TARGET, port)).expect("send");
        if let Ok((_, from)) = rx.recv_from(&mut buf) {
            got += usize::from(from.ip() == src);
        }
    }
    got
}

#[test]
fn prefilter_drops_deny_cidr_and_passes_the_rest() {
    if !require_root("prefilter_drops_deny_cidr_and_passes_the_rest") {
        return;
    }
    let root = PinRoot::new();
    let (sender, receiver) = (NetNs::new(), NetNs::new());
    let veth = VethPair::new(&sender, "s", &receiver, "r");
    for src in [DENIED, ALLOWED] {
        sender.exec(&["ip", "addr", "add", &format!("{src}/32"), "dev", &veth.a]);
    }
    sender.exec(&[
        "ip",
        "route",
        "add",
        &format!("{TARGET}/32"),
        "dev",
        &veth.a,
    ]);
    receiver.exec(&["ip", "addr", "add", &format!("{TARGET}/32"), "dev", &veth.b]);
    receiver.exec(&["ip", "route", "add", "10.246.0.0/15", "dev", &veth.b]);
    let mut ebpf = load_weir(&root);
    write_prefilter(&mut ebpf, "10.246.0.0".parse().expect("addr"), 24);
    let pin = root.path().join("xdp_link");
    let prog = xdp(&mut ebpf, XDP_PREFILTER);
    receiver
        .run(|| agent::attach::attach_xdp(prog, XDP_PREFILTER, &veth.b, &pin))
        .unwrap_or_else(|e| panic!("attach xdp: {e}"));
    let rx = receiver.run(|| UdpSocket::bind((TARGET, 0)).expect("bind receiver"));
    rx.set_read_timeout(Some(Duration::from_millis(100)))
        .expect("timeout");

    assert!(
        received_from(&sender, ALLOWED, &rx, Duration::from_secs(10)) > 0,
        "traffic from outside the deny CIDR passes"
    );
    assert_eq!(
        received_from(&sender, DENIED, &rx, Duration::from_millis(1500)),
        0,
        "traffic from the deny CIDR drops"
    );
    let counters = root.paths().map_pin(maps::COUNTERS);
    let (denied, _) =
        counter_from_bpftool(&counters, counter_index(DROP_PREFILTER_DENY, DIR_PREFILTER));
    let (passed, _) = counter_from_bpftool(&counters, counter_index(PASS, DIR_PREFILTER));
    assert!(denied > 0, "prefilter drops are counted ({denied})");
    assert!(passed > 0, "prefilter passes are counted ({passed})");
}
