//! A datapath lab for `BPF_PROG_TEST_RUN` suites: weir's object loaded under its own pin root,
//! three pod interfaces (veths in a namespace of their own, so each has an ifindex the
//! kernel can run a packet on), helpers to write endpoints, identities, ipcache and policy, and to
//! run packets and read back the reason counter and the conntrack entry.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use aya::{
    Ebpf,
    maps::{
        HashMap, PerCpuArray,
        lpm_trie::{Key, LpmTrie},
    },
};
use maps_schema::{
    CounterValue, Ct4Key, Ct6Key, CtEntry, EndpointInfo, IdentityInfo, PolicyKey, PolicyValue,
    PortRange, PrefilterEntry,
    counters::counter_index,
    identity::HOST,
    maps,
    policy::{MAX_PORT_RANGES, NO_RANGE},
    reason::{self, DIR_FROM_ENDPOINT, DIR_TO_ENDPOINT},
};

use crate::{
    bpf::{PinRoot, load_weir, tc, test_run_tc_out},
    names,
    netns::NetNs,
    packet,
    privileged::require_root,
};

/// `TC_ACT_OK`.
pub const TC_ACT_OK: u32 = 0;
/// `TC_ACT_SHOT`.
pub const TC_ACT_SHOT: u32 = 2;
/// `TC_ACT_REDIRECT`.
pub const TC_ACT_REDIRECT: u32 = 7;

/// The address family a suite runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fam {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

/// Someone a packet comes from or goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// Pod 0, 1 or 2 (each behind its own interface).
    Pod(usize),
    /// The node itself (host identity).
    Host,
    /// An address no map knows (world identity).
    World,
    /// An address inside the lab's CIDR block (`cidr_block`), outside its `except` part.
    InCidr,
    /// An address inside the `except` part of the CIDR block.
    InExcept,
}

/// Endpoint ids and identities of the three pods.
pub const ENDPOINT_IDS: [u32; 3] = [11, 12, 13];
/// Security identities of the three pods.
pub const IDENTITIES: [u32; 3] = [1001, 1002, 1003];

/// What a program did with a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// `TC_ACT_OK` (passed) or not.
    pub passed: bool,
    /// The one verdict reason whose counter went up.
    pub reason: u32,
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({})",
            if self.passed { "pass" } else { "drop" },
            reason::name(self.reason)
        )
    }
}

/// Asserts that a step had the outcome `reason` implies, naming the step.
#[track_caller]
pub fn expect(step: &str, got: Outcome, reason: u32) {
    assert_eq!(
        got,
        Outcome {
            passed: reason::is_pass(reason),
            reason
        },
        "{step}: got {got}, want {}",
        reason::name(reason)
    );
}

/// The lab. Everything it created goes away on drop.
pub struct Lab {
    /// The family packets are built in.
    pub fam: Fam,
    /// The loaded object.
    pub ebpf: Ebpf,
    /// The pods' interface indexes (inside `ns`).
    pub ifindex: [u32; 3],
    /// The namespace the pod interfaces live in.
    pub ns: NetNs,
    /// The pin root.
    pub root: PinRoot,
}

impl Lab {
    /// A lab, or `None` (with the reason printed) when not root outside CI.
    #[must_use]
    pub fn new(test: &str, fam: Fam) -> Option<Self> {
        if !require_root(test) {
            return None;
        }
        let root = PinRoot::new();
        let ns = NetNs::new();
        let mut ifindex = [0; 3];
        for (i, slot) in ifindex.iter_mut().enumerate() {
            // A veth pair inside the namespace (dummy links need a module this kernel may lack);
            // deleting the namespace removes it.
            let name = names::unique(&format!("p{i}"));
            let peer = names::unique(&format!("p{i}x"));
            ns.exec(&[
                "ip", "link", "add", &name, "type", "veth", "peer", "name", &peer,
            ]);
            ns.exec(&["ip", "link", "set", &name, "up"]);
            *slot = ns.ifindex(&name);
        }
        let ebpf = load_weir(&root);
        let mut lab = Self {
            fam,
            ebpf,
            ifindex,
            ns,
            root,
        };
        lab.set_identity(lab.addr(Peer::Host), HOST);
        Some(lab)
    }

    /// The address of `peer` in this lab's family.
    #[must_use]
    pub fn addr(&self, peer: Peer) -> IpAddr {
        let last: u8 = match peer {
            Peer::Pod(i) => 10 + u8::try_from(i).expect("pod index"),
            Peer::Host => 1,
            Peer::World => 7,
            Peer::InCidr => 9,
            Peer::InExcept => 200,
        };
        match (self.fam, peer) {
            (Fam::V4, Peer::Pod(_)) => Ipv4Addr::new(10, 244, 0, last).into(),
            (Fam::V4, Peer::Host) => Ipv4Addr::new(10, 0, 0, last).into(),
            (Fam::V4, Peer::World) => Ipv4Addr::new(192, 0, 2, last).into(),
            (Fam::V4, Peer::InCidr | Peer::InExcept) => Ipv4Addr::new(198, 51, 100, last).into(),
            (Fam::V6, Peer::Pod(_)) => {
                Ipv6Addr::new(0xfd00, 0x244, 0, 0, 0, 0, 0, u16::from(last)).into()
            }
            (Fam::V6, Peer::Host) => {
                Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, u16::from(last)).into()
            }
            (Fam::V6, Peer::World) => {
                Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, u16::from(last)).into()
            }
            (Fam::V6, Peer::InCidr | Peer::InExcept) => {
                Ipv6Addr::new(0x2001, 0xdb8, 0x5, 0, 0, 0, 0, u16::from(last)).into()
            }
        }
    }

    /// The CIDR block (`InCidr`) and its `except` part (`InExcept`): (block, prefix), (except, prefix).
    #[must_use]
    pub fn cidr_block(&self) -> ((IpAddr, u32), (IpAddr, u32)) {
        match self.fam {
            Fam::V4 => (
                (Ipv4Addr::new(198, 51, 100, 0).into(), 24),
                (Ipv4Addr::new(198, 51, 100, 128).into(), 25),
            ),
            Fam::V6 => (
                (Ipv6Addr::new(0x2001, 0xdb8, 0x5, 0, 0, 0, 0, 0).into(), 64),
                (
                    Ipv6Addr::new(0x2001, 0xdb8, 0x5, 0, 0, 0, 0, 0x80).into(),
                    121,
                ),
            ),
        }
    }

    /// Registers pod `i` (both families' addresses) with `flags`, and its address → identity.
    pub fn register(&mut self, i: usize, flags: u32) {
        let v4 = match with_fam(self, Fam::V4, |l| l.addr(Peer::Pod(i))) {
            IpAddr::V4(a) => a.octets(),
            IpAddr::V6(_) => unreachable!("v4 address"),
        };
        let v6 = match with_fam(self, Fam::V6, |l| l.addr(Peer::Pod(i))) {
            IpAddr::V6(a) => a.octets(),
            IpAddr::V4(_) => unreachable!("v6 address"),
        };
        let info = EndpointInfo {
            endpoint_id: ENDPOINT_IDS[i],
            identity: IDENTITIES[i],
            flags,
            _pad: 0,
            ipv4: [v4, [0; 4]],
            ipv6: [v6, [0; 16]],
        };
        write_endpoint(&mut self.ebpf, self.ifindex[i], &info);
        self.set_identity(IpAddr::V4(v4.into()), IDENTITIES[i]);
        self.set_identity(IpAddr::V6(v6.into()), IDENTITIES[i]);
    }

    /// Writes an exact address → identity entry.
    pub fn set_identity(&mut self, addr: IpAddr, identity: u32) {
        write_identity(&mut self.ebpf, addr, identity);
    }

    /// Writes an ipcache CIDR → identity entry.
    pub fn set_cidr_identity(&mut self, addr: IpAddr, prefix: u32, identity: u32) {
        let value = IdentityInfo { identity, flags: 0 };
        match addr {
            IpAddr::V4(a) => {
                let mut m: LpmTrie<_, [u8; 4], IdentityInfo> =
                    LpmTrie::try_from(self.ebpf.map_mut(maps::IPCACHE4).expect("ipcache4"))
                        .expect("lpm");
                m.insert(&Key::new(prefix, a.octets()), &value, 0)
                    .expect("insert ipcache4");
            }
            IpAddr::V6(a) => {
                let mut m: LpmTrie<_, [u8; 16], IdentityInfo> =
                    LpmTrie::try_from(self.ebpf.map_mut(maps::IPCACHE6).expect("ipcache6"))
                        .expect("lpm");
                m.insert(&Key::new(prefix, a.octets()), &value, 0)
                    .expect("insert ipcache6");
            }
        }
    }

    /// Writes a policy entry for pod `i`.
    pub fn policy(
        &mut self,
        i: usize,
        direction: u8,
        peer: u32,
        proto: u8,
        port: u16,
        value: PolicyValue,
    ) {
        let key = PolicyKey {
            endpoint_id: ENDPOINT_IDS[i],
            peer_identity: peer,
            port,
            protocol: proto,
            direction,
        };
        write_policy(&mut self.ebpf, &key, &value);
    }

    /// Runs `frame` through `from_endpoint` of pod `i` (packets leaving the pod).
    pub fn from(&mut self, i: usize, frame: &[u8]) -> Outcome {
        self.run(
            maps_schema::programs::FROM_ENDPOINT,
            DIR_FROM_ENDPOINT,
            self.ifindex[i],
            frame,
        )
    }

    /// Runs `frame` through `to_endpoint` of pod `i` (packets entering the pod).
    pub fn to(&mut self, i: usize, frame: &[u8]) -> Outcome {
        self.run(
            maps_schema::programs::TO_ENDPOINT,
            DIR_TO_ENDPOINT,
            self.ifindex[i],
            frame,
        )
    }

    /// [`Lab::from`], also returning the frame as the program left it.
    pub fn from_out(&mut self, i: usize, frame: &[u8]) -> (Outcome, Vec<u8>) {
        let ifindex = self.ifindex[i];
        self.run_out(
            maps_schema::programs::FROM_ENDPOINT,
            DIR_FROM_ENDPOINT,
            ifindex,
            frame,
        )
    }

    /// [`Lab::to`], also returning the frame as the program left it.
    pub fn to_out(&mut self, i: usize, frame: &[u8]) -> (Outcome, Vec<u8>) {
        let ifindex = self.ifindex[i];
        self.run_out(
            maps_schema::programs::TO_ENDPOINT,
            DIR_TO_ENDPOINT,
            ifindex,
            frame,
        )
    }

    /// Runs `frame` through a program on `ifindex`; the reason is the verdict counter that moved.
    pub fn run(&mut self, program: &str, direction: u32, ifindex: u32, frame: &[u8]) -> Outcome {
        self.run_out(program, direction, ifindex, frame).0
    }

    /// [`Lab::run`], also returning the frame as the program left it.
    pub fn run_out(
        &mut self,
        program: &str,
        direction: u32,
        ifindex: u32,
        frame: &[u8],
    ) -> (Outcome, Vec<u8>) {
        let (outcome, _, out) = self.run_action(program, direction, ifindex, frame);
        (outcome, out)
    }

    /// [`Lab::from_out`] with the program's return code (`TC_ACT_REDIRECT` for an answer sent
    /// back into the pod).
    pub fn from_action(&mut self, i: usize, frame: &[u8]) -> (Outcome, u32, Vec<u8>) {
        let ifindex = self.ifindex[i];
        self.run_action(
            maps_schema::programs::FROM_ENDPOINT,
            DIR_FROM_ENDPOINT,
            ifindex,
            frame,
        )
    }

    /// [`Lab::run_out`] with the program's return code.
    pub fn run_action(
        &mut self,
        program: &str,
        direction: u32,
        ifindex: u32,
        frame: &[u8],
    ) -> (Outcome, u32, Vec<u8>) {
        let before = self.verdict_counters(direction);
        let prog = tc(&mut self.ebpf, program);
        let mut out = vec![0u8; frame.len() + 256];
        let result = self
            .ns
            .run(|| test_run_tc_out(prog, frame, Some(ifindex), 1, Some(&mut out)));
        out.truncate(result.data_size_out as usize);
        let after = self.verdict_counters(direction);
        let moved: Vec<u32> = before
            .iter()
            .zip(&after)
            .filter(|(b, a)| a.1 != b.1)
            .map(|(_, a)| a.0)
            .collect();
        assert_eq!(
            moved.len(),
            1,
            "exactly one verdict counter moves per packet, these did: {:?}",
            moved.iter().map(|r| reason::name(*r)).collect::<Vec<_>>()
        );
        let outcome = Outcome {
            passed: result.return_value == TC_ACT_OK,
            reason: moved[0],
        };
        assert_eq!(
            outcome.passed,
            reason::is_pass(outcome.reason),
            "the verdict matches its reason: {outcome}"
        );
        (outcome, result.return_value, out)
    }

    /// (reason, packets) for every pass and drop reason in `direction`.
    fn verdict_counters(&self, direction: u32) -> Vec<(u32, u64)> {
        reason::ALL
            .iter()
            .filter(|r| reason::is_pass(**r) || reason::is_drop(**r))
            .map(|r| (*r, self.counter(*r, direction)))
            .collect()
    }

    /// Packets counted under `reason` in `direction` (all CPUs).
    #[must_use]
    pub fn counter(&self, reason: u32, direction: u32) -> u64 {
        let map: PerCpuArray<_, CounterValue> =
            PerCpuArray::try_from(self.ebpf.map(maps::COUNTERS).expect("counters"))
                .expect("per-CPU");
        map.get(&counter_index(reason, direction), 0)
            .expect("counter slot")
            .iter()
            .map(|v| v.packets)
            .sum()
    }

    /// The conntrack entry of a flow (either direction's tuple finds it).
    #[must_use]
    pub fn ct(&self, src: Peer, sport: u16, dst: Peer, dport: u16, proto: u8) -> Option<CtEntry> {
        match (self.addr(src), self.addr(dst)) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let (s, d) = (s.octets(), d.octets());
                let swap = (u32::from_be_bytes(s), sport) > (u32::from_be_bytes(d), dport);
                let (a, pa, b, pb) = if swap {
                    (d, dport, s, sport)
                } else {
                    (s, sport, d, dport)
                };
                let key = Ct4Key {
                    addr_a: a,
                    addr_b: b,
                    port_a: pa,
                    port_b: pb,
                    protocol: proto,
                    _pad: [0; 3],
                };
                let m: HashMap<_, Ct4Key, CtEntry> =
                    HashMap::try_from(self.ebpf.map(maps::CT4).expect("ct4")).expect("lru");
                m.get(&key, 0).ok()
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                let (s, d) = (s.octets(), d.octets());
                let swap = rank6(&s, sport) > rank6(&d, dport);
                let (a, pa, b, pb) = if swap {
                    (d, dport, s, sport)
                } else {
                    (s, sport, d, dport)
                };
                let key = Ct6Key {
                    addr_a: a,
                    addr_b: b,
                    port_a: pa,
                    port_b: pb,
                    protocol: proto,
                    _pad: [0; 3],
                };
                let m: HashMap<_, Ct6Key, CtEntry> =
                    HashMap::try_from(self.ebpf.map(maps::CT6).expect("ct6")).expect("lru");
                m.get(&key, 0).ok()
            }
            _ => unreachable!("one family per lab"),
        }
    }

    /// Entries in this family's conntrack map.
    #[must_use]
    pub fn ct_len(&self) -> usize {
        match self.fam {
            Fam::V4 => {
                let m: HashMap<_, Ct4Key, CtEntry> =
                    HashMap::try_from(self.ebpf.map(maps::CT4).expect("ct4")).expect("lru");
                m.keys().count()
            }
            Fam::V6 => {
                let m: HashMap<_, Ct6Key, CtEntry> =
                    HashMap::try_from(self.ebpf.map(maps::CT6).expect("ct6")).expect("lru");
                m.keys().count()
            }
        }
    }

    /// An IP packet (no Ethernet header) from `src` to `dst` carrying `l4` of protocol `proto`.
    #[must_use]
    pub fn ip(&self, src: Peer, dst: Peer, proto: u8, l4: &[u8]) -> Vec<u8> {
        match (self.addr(src), self.addr(dst)) {
            (IpAddr::V4(s), IpAddr::V4(d)) => packet::ipv4(s.octets(), d.octets(), proto, l4),
            (IpAddr::V6(s), IpAddr::V6(d)) => packet::ipv6(s.octets(), d.octets(), proto, l4),
            _ => unreachable!("one family per lab"),
        }
    }

    /// A frame from `src` to `dst` carrying `l4` of protocol `proto`.
    #[must_use]
    pub fn frame(&self, src: Peer, dst: Peer, proto: u8, l4: &[u8]) -> Vec<u8> {
        packet::eth(self.ethertype(), &self.ip(src, dst, proto, l4))
    }

    /// This family's ethertype.
    #[must_use]
    pub fn ethertype(&self) -> u16 {
        match self.fam {
            Fam::V4 => packet::ETH_P_IP,
            Fam::V6 => packet::ETH_P_IPV6,
        }
    }

    /// A TCP segment.
    #[must_use]
    pub fn tcp(&self, src: Peer, sport: u16, dst: Peer, dport: u16, flags: u8) -> Vec<u8> {
        self.frame(src, dst, packet::TCP, &packet::tcp(sport, dport, flags))
    }

    /// A UDP datagram.
    #[must_use]
    pub fn udp(&self, src: Peer, sport: u16, dst: Peer, dport: u16) -> Vec<u8> {
        self.frame(src, dst, packet::UDP, &packet::udp(sport, dport))
    }

    /// An SCTP packet carrying one chunk of type `chunk` (`packet::SCTP_INIT`, …).
    #[must_use]
    pub fn sctp(&self, src: Peer, sport: u16, dst: Peer, dport: u16, chunk: u8) -> Vec<u8> {
        self.frame(src, dst, packet::SCTP, &packet::sctp(sport, dport, chunk))
    }

    /// This family's ICMP protocol number.
    #[must_use]
    pub fn icmp_proto(&self) -> u8 {
        match self.fam {
            Fam::V4 => packet::ICMP,
            Fam::V6 => packet::ICMPV6,
        }
    }

    /// ICMP echo type numbers (request, reply).
    #[must_use]
    pub fn echo_types(&self) -> (u8, u8) {
        match self.fam {
            Fam::V4 => (8, 0),
            Fam::V6 => (128, 129),
        }
    }

    /// An ICMP echo request (`request`) or reply with identifier `id`.
    #[must_use]
    pub fn echo(&self, src: Peer, dst: Peer, request: bool, id: u16) -> Vec<u8> {
        let (req, rep) = self.echo_types();
        self.frame(
            src,
            dst,
            self.icmp_proto(),
            &packet::echo(if request { req } else { rep }, id),
        )
    }

    /// A "destination unreachable" error from `src` to `dst` quoting `quoted` (a frame).
    #[must_use]
    pub fn unreachable(&self, src: Peer, dst: Peer, quoted: &[u8]) -> Vec<u8> {
        let ty = match self.fam {
            Fam::V4 => 3,
            Fam::V6 => 1,
        };
        let inner = &quoted[14..quoted.len().min(14 + 68)];
        self.frame(
            src,
            dst,
            self.icmp_proto(),
            &packet::icmp(ty, 3, [0; 4], inner),
        )
    }

    /// A policy "port range" value (up to `MAX_PORT_RANGES` ranges).
    #[must_use]
    pub fn ranges(verdict: u8, rule_id: u32, ranges: &[(u16, u16)]) -> PolicyValue {
        assert!(ranges.len() <= MAX_PORT_RANGES);
        let mut value = PolicyValue::new(verdict, rule_id);
        value.flags = 0;
        value.ranges = [NO_RANGE; MAX_PORT_RANGES];
        for (slot, (first, last)) in value.ranges.iter_mut().zip(ranges) {
            *slot = PortRange {
                first: *first,
                last: *last,
            };
        }
        value
    }
}

/// Writes an endpoints entry.
pub fn write_endpoint(ebpf: &mut Ebpf, ifindex: u32, info: &EndpointInfo) {
    let mut m: HashMap<_, u32, EndpointInfo> =
        HashMap::try_from(ebpf.map_mut(maps::ENDPOINTS).expect("endpoints")).expect("hash");
    m.insert(&ifindex, info, 0).expect("insert endpoint");
}

/// Writes an exact address → identity entry.
pub fn write_identity(ebpf: &mut Ebpf, addr: IpAddr, identity: u32) {
    let value = IdentityInfo { identity, flags: 0 };
    match addr {
        IpAddr::V4(a) => {
            let mut m: HashMap<_, [u8; 4], IdentityInfo> =
                HashMap::try_from(ebpf.map_mut(maps::IDENT4).expect("ident4")).expect("hash");
            m.insert(&a.octets(), &value, 0).expect("insert ident4");
        }
        IpAddr::V6(a) => {
            let mut m: HashMap<_, [u8; 16], IdentityInfo> =
                HashMap::try_from(ebpf.map_mut(maps::IDENT6).expect("ident6")).expect("hash");
            m.insert(&a.octets(), &value, 0).expect("insert ident6");
        }
    }
}

/// Writes a policy entry.
pub fn write_policy(ebpf: &mut Ebpf, key: &PolicyKey, value: &PolicyValue) {
    let mut m: HashMap<_, PolicyKey, PolicyValue> =
        HashMap::try_from(ebpf.map_mut(maps::POLICY).expect("policy")).expect("hash");
    m.insert(key, value, 0).expect("insert policy");
}

/// Writes a prefilter deny CIDR.
pub fn write_prefilter(ebpf: &mut Ebpf, addr: IpAddr, prefix: u32) {
    let value = PrefilterEntry { rule_id: 1 };
    match addr {
        IpAddr::V4(a) => {
            let mut m: LpmTrie<_, [u8; 4], PrefilterEntry> =
                LpmTrie::try_from(ebpf.map_mut(maps::PREFILTER4).expect("prefilter4"))
                    .expect("lpm");
            m.insert(&Key::new(prefix, a.octets()), &value, 0)
                .expect("insert prefilter4");
        }
        IpAddr::V6(a) => {
            let mut m: LpmTrie<_, [u8; 16], PrefilterEntry> =
                LpmTrie::try_from(ebpf.map_mut(maps::PREFILTER6).expect("prefilter6"))
                    .expect("lpm");
            m.insert(&Key::new(prefix, a.octets()), &value, 0)
                .expect("insert prefilter6");
        }
    }
}

fn rank6(addr: &[u8; 16], port: u16) -> (u64, u64, u16) {
    let hi = u64::from_ne_bytes(addr[..8].try_into().expect("8 bytes"));
    let lo = u64::from_ne_bytes(addr[8..].try_into().expect("8 bytes"));
    (hi, lo, port)
}

fn with_fam<T>(lab: &mut Lab, fam: Fam, f: impl FnOnce(&Lab) -> T) -> T {
    let saved = lab.fam;
    lab.fam = fam;
    let value = f(lab);
    lab.fam = saved;
    value
}
