//! `xdp_prefilter` on a veth in a test namespace: traffic from a deny CIDR drops before the stack
//! sees it, traffic from other sources passes (positive control); counted, checked with `bpftool`.

use std::{
    net::{Ipv4Addr, UdpSocket},
    time::Duration,
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
    tests::prefilter::received_from(sender, src, TARGET, rx, wait)
}

#[test]
fn prefilter_drops_deny_cidr_and_passes_the_rest() {
    if !require_root("prefilter_drops_deny_cidr_and_passes_the_rest") {
        return;
    }
    let root = PinRoot::new();
    let (sender, receiver) = (NetNs::new(), NetNs::new());
    let veth = VethPair::new(&sender, "s", &receiver, "r");
    tests::prefilter::plumb(
        &sender,
        &veth.a,
        &[DENIED, ALLOWED],
        &receiver,
        &veth.b,
        TARGET,
        "10.246.0.0/15",
    );
    let mut ebpf = load_weir(&root);
    write_prefilter(&mut ebpf, "10.246.0.0".parse().expect("addr"), 24);
    let pin = root.path().join("xdp_link");
    let prog = xdp(&mut ebpf, XDP_PREFILTER);
    receiver
        .run(|| agent::attach::attach_xdp(prog, XDP_PREFILTER, &veth.b, &pin))
        .unwrap_or_else(|e| panic!("attach xdp: {e}"));
    let rx = tests::prefilter::receiver_socket(&receiver, TARGET);

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
