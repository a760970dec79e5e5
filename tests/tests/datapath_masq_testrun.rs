//! `masq_egress` / `masq_ingress` by `BPF_PROG_TEST_RUN`: a pod's packet to outside the pools
//! leaves with the node address and the NAT port `maps_schema::nat::port_candidate` predicts,
//! with valid checksums; its reply is translated back; a taken port makes the program try the
//! next candidate; a pool destination, the node's own traffic and an interface with no
//! masquerade entry pass untouched; no free port drops under its own reason.

use std::net::Ipv4Addr;

use aya::{
    Ebpf,
    maps::{HashMap, LpmTrie, PerCpuArray, lpm_trie::Key},
    programs::{SchedClassifier, TestRun as _, TestRunOptions},
};
use maps_schema::{
    CounterValue, MasqCidr, MasqInterface, Nat4Entry, Nat4Key,
    counters::counter_index,
    maps,
    nat::{DIR_EGRESS, DIR_INGRESS, PORT_RETRIES, port_candidate},
    programs::{MASQ_EGRESS, MASQ_INGRESS},
    reason::{
        DIR_MASQUERADE, DROP_NAT_PORT_EXHAUSTED, NOTE_NAT_PORT_COLLISION, PASS, PASS_MASQUERADED,
        PASS_REVERSE_NAT,
    },
};
use tests::{
    bpf::{PinRoot, load_weir, tc},
    csum,
    netns::NetNs,
    packet::{ACK, ICMP, SYN, TCP, UDP, dst_of, eth, ipv4, src_of, tcp, udp},
    privileged::require_root,
};

const TC_ACT_OK: u32 = 0;
const TC_ACT_SHOT: u32 = 2;
/// Test runs without a device run on loopback, ifindex 1 in the test's namespace.
const LO: u32 = 1;
const NODE: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 2);
const POD: Ipv4Addr = Ipv4Addr::new(10, 246, 3, 5);
const OTHER_POD: Ipv4Addr = Ipv4Addr::new(10, 246, 9, 7);
const REMOTE: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);

/// A frame with valid IPv4 and L4 checksums.
fn frame(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, l4: &[u8]) -> Vec<u8> {
    csum::with_checksums(eth(0x0800, &ipv4(src.octets(), dst.octets(), proto, l4)))
}

fn icmp_echo(ty: u8, id: u16) -> Vec<u8> {
    let mut h = vec![ty, 0, 0, 0, 0, 0, 0, 1, b'w', b'e', b'i', b'r'];
    h[4..6].copy_from_slice(&id.to_be_bytes());
    h
}

struct Lab {
    ns: NetNs,
    ebpf: Ebpf,
    _root: PinRoot,
}

impl Lab {
    fn new() -> Self {
        let root = PinRoot::new();
        let mut ebpf = load_weir(&root);
        {
            let mut m: HashMap<_, u32, MasqInterface> =
                HashMap::try_from(ebpf.map_mut(maps::MASQ_IF).expect("masq_if")).expect("hash");
            let value = MasqInterface {
                addr: NODE.octets(),
                flags: 0,
            };
            m.insert(&LO, &value, 0).expect("insert masq_if");
        }
        {
            let mut m: LpmTrie<_, [u8; 4], MasqCidr> =
                LpmTrie::try_from(ebpf.map_mut(maps::MASQ_CIDR4).expect("masq_cidr4"))
                    .expect("lpm");
            m.insert(&Key::new(16, [10, 246, 0, 0]), &MasqCidr::default(), 0)
                .expect("insert pool");
        }
        Self {
            ns: NetNs::new(),
            ebpf,
            _root: root,
        }
    }

    /// Runs `program` on `frame`: (return value, the frame as the program left it).
    fn run(&mut self, program: &str, frame: &[u8]) -> (u32, Vec<u8>) {
        let prog: &SchedClassifier = tc(&mut self.ebpf, program);
        let mut out = vec![0u8; frame.len() + 256];
        let result = self.ns.run(|| {
            prog.test_run(TestRunOptions {
                data_in: Some(frame),
                data_out: Some(&mut out),
                repeat: 1,
                ..TestRunOptions::default()
            })
            .unwrap_or_else(|e| panic!("BPF_PROG_TEST_RUN: {e}"))
        });
        out.truncate(result.data_size_out as usize);
        (result.return_value, out)
    }

    fn counter(&self, reason: u32) -> u64 {
        let map: PerCpuArray<_, CounterValue> =
            PerCpuArray::try_from(self.ebpf.map(maps::COUNTERS).expect("counters"))
                .expect("per-CPU");
        map.get(&counter_index(reason, DIR_MASQUERADE), 0)
            .expect("slot")
            .iter()
            .map(|v| v.packets)
            .sum()
    }

    fn nat(&self) -> HashMap<&aya::maps::MapData, Nat4Key, Nat4Entry> {
        HashMap::try_from(self.ebpf.map(maps::NAT4).expect("nat4")).expect("hash")
    }

    fn nat_len(&self) -> usize {
        self.nat().keys().count()
    }

    fn hold(&mut self, key: Nat4Key) {
        let mut m: HashMap<_, Nat4Key, Nat4Entry> =
            HashMap::try_from(self.ebpf.map_mut(maps::NAT4).expect("nat4")).expect("hash");
        m.insert(&key, &Nat4Entry::default(), 0)
            .expect("hold a port");
    }
}

fn key(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, proto: u8, dir: u8) -> Nat4Key {
    Nat4Key {
        saddr: src.octets(),
        daddr: dst.octets(),
        sport,
        dport,
        protocol: proto,
        direction: dir,
        _pad: [0; 2],
    }
}

/// The reverse key a translated flow's reply carries.
fn reply_key(dport: u16, nat_port: u16, proto: u8) -> Nat4Key {
    key(REMOTE, NODE, dport, nat_port, proto, DIR_INGRESS)
}

#[test]
fn masquerade_translates_and_reverses_tcp_udp_and_echo() {
    if !require_root("masquerade_translates_and_reverses_tcp_udp_and_echo") {
        return;
    }
    let mut lab = Lab::new();
    for (proto, l4, reply) in [
        (TCP, tcp(40_000, 80, SYN), tcp(80, 0, SYN | ACK)),
        (UDP, udp(40_000, 53), udp(53, 0)),
    ] {
        let dport = u16::from_be_bytes([l4[2], l4[3]]);
        let expected = port_candidate(POD.octets(), REMOTE.octets(), 40_000, dport, proto, 0);
        let before = lab.counter(PASS_MASQUERADED);
        let (rc, out) = lab.run(MASQ_EGRESS, &frame(POD, REMOTE, proto, &l4));
        assert_eq!(rc, TC_ACT_OK);
        assert_eq!(
            src_of(&out),
            (NODE, expected),
            "proto {proto}: source translated"
        );
        assert_eq!(dst_of(&out), (REMOTE, dport), "destination unchanged");
        csum::assert_valid("translated", &out);
        assert_eq!(lab.counter(PASS_MASQUERADED), before + 1);
        let fwd = lab
            .nat()
            .get(&key(POD, REMOTE, 40_000, dport, proto, DIR_EGRESS), 0)
            .expect("egress entry");
        assert_eq!((Ipv4Addr::from(fwd.addr), fwd.port), (NODE, expected));
        let rev = lab
            .nat()
            .get(&reply_key(dport, expected, proto), 0)
            .expect("ingress entry");
        assert_eq!((Ipv4Addr::from(rev.addr), rev.port), (POD, 40_000));
        assert!(rev.created_ns > 0 && rev.last_seen_ns >= rev.created_ns);

        // The same flow again: the same port, no new entries.
        let len = lab.nat_len();
        let (_, again) = lab.run(MASQ_EGRESS, &frame(POD, REMOTE, proto, &l4));
        assert_eq!(src_of(&again), (NODE, expected));
        assert_eq!(lab.nat_len(), len);

        // The reply, to the node address and NAT port, goes back to the pod.
        let mut reply = reply.clone();
        reply[2..4].copy_from_slice(&expected.to_be_bytes());
        let before = lab.counter(PASS_REVERSE_NAT);
        let (rc, back) = lab.run(MASQ_INGRESS, &frame(REMOTE, NODE, proto, &reply));
        assert_eq!(rc, TC_ACT_OK);
        assert_eq!(
            dst_of(&back),
            (POD, 40_000),
            "proto {proto}: reply reversed"
        );
        assert_eq!(src_of(&back), (REMOTE, dport));
        csum::assert_valid("reversed", &back);
        assert_eq!(lab.counter(PASS_REVERSE_NAT), before + 1);
    }

    // ICMP echo: the identifier is the port.
    let expected = port_candidate(POD.octets(), REMOTE.octets(), 77, 0, ICMP, 0);
    let (_, out) = lab.run(MASQ_EGRESS, &frame(POD, REMOTE, ICMP, &icmp_echo(8, 77)));
    assert_eq!(src_of(&out).0, NODE);
    assert_eq!(u16::from_be_bytes([out[38], out[39]]), expected, "echo id");
    csum::assert_valid("translated", &out);
    let (_, back) = lab.run(
        MASQ_INGRESS,
        &frame(REMOTE, NODE, ICMP, &icmp_echo(0, expected)),
    );
    assert_eq!(dst_of(&back).0, POD);
    assert_eq!(
        u16::from_be_bytes([back[38], back[39]]),
        77,
        "echo id reversed"
    );
    csum::assert_valid("reversed", &back);
}

#[test]
fn a_taken_port_makes_the_next_candidate_and_no_free_port_drops() {
    if !require_root("a_taken_port_makes_the_next_candidate_and_no_free_port_drops") {
        return;
    }
    let mut lab = Lab::new();
    let candidate =
        |sport, attempt| port_candidate(POD.octets(), REMOTE.octets(), sport, 443, TCP, attempt);
    // Another flow holds the first candidate of 41000 → 443.
    lab.hold(reply_key(443, candidate(41_000, 0), TCP));
    let notes = lab.counter(NOTE_NAT_PORT_COLLISION);
    let (rc, out) = lab.run(
        MASQ_EGRESS,
        &frame(POD, REMOTE, TCP, &tcp(41_000, 443, SYN)),
    );
    assert_eq!(rc, TC_ACT_OK);
    assert_eq!(
        src_of(&out),
        (NODE, candidate(41_000, 1)),
        "the next candidate"
    );
    assert_eq!(lab.counter(NOTE_NAT_PORT_COLLISION), notes + 1);
    let held = lab
        .nat()
        .get(&reply_key(443, candidate(41_000, 0), TCP), 0)
        .expect("held");
    assert_eq!(
        held,
        Nat4Entry::default(),
        "the other flow's entry is untouched"
    );

    // Every candidate of 42000 → 443 taken: refused, counted, nothing left behind.
    for attempt in 0..PORT_RETRIES {
        lab.hold(reply_key(443, candidate(42_000, attempt), TCP));
    }
    let len = lab.nat_len();
    let drops = lab.counter(DROP_NAT_PORT_EXHAUSTED);
    let (rc, _) = lab.run(
        MASQ_EGRESS,
        &frame(POD, REMOTE, TCP, &tcp(42_000, 443, SYN)),
    );
    assert_eq!(rc, TC_ACT_SHOT);
    assert_eq!(lab.counter(DROP_NAT_PORT_EXHAUSTED), drops + 1);
    assert_eq!(lab.nat_len(), len);
}

#[test]
fn pool_destinations_node_traffic_and_strangers_pass_untouched() {
    if !require_root("pool_destinations_node_traffic_and_strangers_pass_untouched") {
        return;
    }
    let mut lab = Lab::new();
    let untouched = [
        // Pod to pod (the pools are never masqueraded to).
        frame(POD, OTHER_POD, TCP, &tcp(40_000, 80, SYN)),
        // The node's own traffic.
        frame(NODE, REMOTE, TCP, &tcp(40_000, 80, SYN)),
        // A source outside the pools.
        frame(Ipv4Addr::new(172, 16, 0, 1), REMOTE, UDP, &udp(5000, 53)),
        // An echo reply a pod sends (only requests open a masqueraded flow).
        frame(POD, REMOTE, ICMP, &icmp_echo(0, 9)),
    ];
    for f in &untouched {
        let before = lab.counter(PASS);
        let (rc, out) = lab.run(MASQ_EGRESS, f);
        assert_eq!(rc, TC_ACT_OK);
        assert_eq!(&out, f, "passed untouched");
        assert_eq!(lab.counter(PASS), before + 1);
    }
    assert_eq!(
        lab.nat_len(),
        0,
        "no NAT entry for traffic that is not masqueraded"
    );
    // A reply with no NAT entry (the node's own flow) passes untouched.
    let f = frame(REMOTE, NODE, TCP, &tcp(80, 61_234, SYN | ACK));
    let (rc, out) = lab.run(MASQ_INGRESS, &f);
    assert_eq!((rc, &out), (TC_ACT_OK, &f));
    // Positive control: the same pod packet to the outside is translated.
    let (_, out) = lab.run(MASQ_EGRESS, &frame(POD, REMOTE, TCP, &tcp(40_000, 80, SYN)));
    assert_eq!(src_of(&out).0, NODE);
    // An interface with no masquerade entry: nothing is translated or counted.
    {
        let mut m: HashMap<_, u32, MasqInterface> =
            HashMap::try_from(lab.ebpf.map_mut(maps::MASQ_IF).expect("masq_if")).expect("hash");
        m.remove(&LO).expect("remove");
    }
    let f = frame(POD, REMOTE, TCP, &tcp(40_001, 80, SYN));
    let before = lab.counter(PASS);
    let (rc, out) = lab.run(MASQ_EGRESS, &f);
    assert_eq!((rc, &out), (TC_ACT_OK, &f));
    assert_eq!(lab.counter(PASS), before);
}

#[test]
fn the_agents_sweep_keeps_fresh_pairs_and_removes_idle_ones_from_the_real_map() {
    use agent::{
        dataplane::masquerade::{list_nat, sweep_nat},
        kernel::{PinnedHash, real::ct::now_ns},
    };
    use maps_schema::nat::TIMEOUT_UDP_SECS;
    if !require_root("the_agents_sweep_keeps_fresh_pairs_and_removes_idle_ones_from_the_real_map") {
        return;
    }
    let mut lab = Lab::new();
    let (_, out) = lab.run(MASQ_EGRESS, &frame(POD, REMOTE, UDP, &udp(40_000, 53)));
    assert_eq!(src_of(&out).0, NODE);
    assert_eq!(lab.nat_len(), 2, "the pair the program wrote");
    let pin = lab._root.paths().map_pin(maps::NAT4);
    let mut nat: PinnedHash<Nat4Key, Nat4Entry> =
        PinnedHash::open(maps::NAT4, &pin).expect("open the pinned nat map");
    let listed = list_nat(&nat, now_ns()).expect("list");
    assert_eq!(listed.len(), 1);
    assert!(listed[0].reverse && listed[0].idle_secs < 5, "{listed:?}");
    // Now: the programs' clock and the agent's agree, the pair is fresh.
    let kept = sweep_nat(&mut nat, now_ns()).expect("sweep");
    assert_eq!((kept.entries, kept.deleted), (2, 0));
    // Past the UDP timeout: both entries go.
    let later = now_ns() + (TIMEOUT_UDP_SECS + 1) * 1_000_000_000;
    let swept = sweep_nat(&mut nat, later).expect("sweep");
    assert_eq!((swept.entries, swept.deleted), (2, 2));
    assert_eq!(lab.nat_len(), 0);
}
