//! `BPF_PROG_TEST_RUN` on crafted packets: an unknown interface drops with its counted reason; a
//! registered endpoint passes (positive control); a spoofed source drops.

use aya::maps::{HashMap, PerCpuArray};
use maps_schema::{
    CounterValue, EndpointInfo,
    counters::counter_index,
    reason::{
        DIR_FROM_ENDPOINT, DIR_TO_ENDPOINT, DROP_SPOOFED_SOURCE, DROP_UNKNOWN_ENDPOINT, PASS,
    },
};
use tests::{
    bpf::{PinRoot, load_weir, tc, test_run_tc},
    netns::{NetNs, VethPair},
    privileged::require_root,
};

const TC_ACT_OK: u32 = 0;
const TC_ACT_SHOT: u32 = 2;

/// An Ethernet + IPv4 + UDP frame from `src` to `dst`.
fn udp4(src: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
    let mut f = vec![0u8; 14 + 20 + 8 + 4];
    f[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 1]);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 2]);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip = &mut f[14..34];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&32u16.to_be_bytes());
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&src);
    ip[16..20].copy_from_slice(&dst);
    let udp = &mut f[34..42];
    udp[0..2].copy_from_slice(&40000u16.to_be_bytes());
    udp[2..4].copy_from_slice(&53u16.to_be_bytes());
    udp[4..6].copy_from_slice(&12u16.to_be_bytes());
    f
}

fn counter(ebpf: &aya::Ebpf, reason: u32, direction: u32) -> u64 {
    let map: PerCpuArray<_, CounterValue> =
        PerCpuArray::try_from(ebpf.map("counters_v1").expect("counters map"))
            .expect("per-CPU array");
    let values = map
        .get(&counter_index(reason, direction), 0)
        .expect("counter slot");
    values.iter().map(|v| v.packets).sum()
}

#[test]
fn crafted_packets_get_their_verdicts() {
    if !require_root("crafted_packets_get_their_verdicts") {
        return;
    }
    let root = PinRoot::new();
    let ns = NetNs::new();
    // A device for the kernel to run the packets on (BPF_PROG_TEST_RUN looks the ifindex up).
    let veth = VethPair::new(&ns, "a", &ns, "b");
    let ifindex = ns.ifindex(&veth.a);
    let mut ebpf = load_weir(&root);
    let pod = [10, 200, 0, 2];
    let packet = udp4(pod, [10, 200, 0, 1]);

    // Unknown interface: both directions drop, counted as unknown-endpoint.
    ns.run(|| {
        let from = test_run_tc(tc(&mut ebpf, "from_endpoint"), &packet, Some(ifindex), 1);
        assert_eq!(from.return_value, TC_ACT_SHOT);
        let to = test_run_tc(tc(&mut ebpf, "to_endpoint"), &packet, Some(ifindex), 1);
        assert_eq!(to.return_value, TC_ACT_SHOT);
    });
    assert_eq!(counter(&ebpf, DROP_UNKNOWN_ENDPOINT, DIR_FROM_ENDPOINT), 1);
    assert_eq!(counter(&ebpf, DROP_UNKNOWN_ENDPOINT, DIR_TO_ENDPOINT), 1);

    // Positive control: register the endpoint; its own traffic passes both ways.
    {
        let mut endpoints: HashMap<_, u32, EndpointInfo> =
            HashMap::try_from(ebpf.map_mut("endpoints_v1").expect("endpoints map"))
                .expect("hash map");
        let info = EndpointInfo {
            endpoint_id: 7,
            identity: 1000,
            ipv4: [pod, [0; 4]],
            ..EndpointInfo::default()
        };
        endpoints
            .insert(&ifindex, &info, 0)
            .expect("insert endpoint");
    }
    ns.run(|| {
        let from = test_run_tc(tc(&mut ebpf, "from_endpoint"), &packet, Some(ifindex), 1);
        assert_eq!(
            from.return_value, TC_ACT_OK,
            "a registered endpoint's own packet passes"
        );
        let to = test_run_tc(tc(&mut ebpf, "to_endpoint"), &packet, Some(ifindex), 1);
        assert_eq!(to.return_value, TC_ACT_OK);
        // Anti-spoofing: a source that is not the endpoint's own drops.
        let spoofed = udp4([10, 200, 0, 99], [10, 200, 0, 1]);
        let from = test_run_tc(tc(&mut ebpf, "from_endpoint"), &spoofed, Some(ifindex), 1);
        assert_eq!(from.return_value, TC_ACT_SHOT, "a spoofed source drops");
    });
    assert_eq!(counter(&ebpf, PASS, DIR_FROM_ENDPOINT), 1);
    assert_eq!(counter(&ebpf, PASS, DIR_TO_ENDPOINT), 1);
    assert_eq!(counter(&ebpf, DROP_SPOOFED_SOURCE, DIR_FROM_ENDPOINT), 1);
    assert_eq!(
        counter(&ebpf, DROP_UNKNOWN_ENDPOINT, DIR_FROM_ENDPOINT),
        1,
        "unchanged"
    );
}
