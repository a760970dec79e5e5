//! The differential test's pieces: random map states and packets (valid, truncated, hostile),
//! the kernel side (weir's object loaded, its maps written and read back, `BPF_PROG_TEST_RUN`),
//! the comparison with [`crate::dpmodel`], the shrinking of a failing case, and a run of many
//! cases counted by class ([`run_cases`]: the test and `cargo xtask bench datapath` run it;
//! [docs/differential.md](../../docs/differential.md)).

use std::{
    collections::{BTreeMap, HashMap as Map},
    fmt::Write as _,
    hash::Hash,
};

use aya::{
    Ebpf, Pod,
    maps::{
        HashMap, PerCpuArray,
        lpm_trie::{Key, LpmTrie},
    },
    programs::{SchedClassifier, TestRun as _, TestRunOptions},
};
use maps_schema::{
    Backend4, CounterValue, Ct4Key, Ct6Key, CtEntry, EndpointInfo, IdentityInfo, PolicyKey,
    PolicyValue, PortRange, RevNat4, SlotKey, SlotValue, Svc4Key, Svc4Value, SvcCt4Entry,
    SvcCt4Key,
    counters::counter_index,
    identity::{ANY, HOST},
    maps,
    policy::{ANY_PORT, ANY_PROTO, MAX_PORT_RANGES, NO_RANGE, VERDICT_ALLOW, VERDICT_DENY},
    reason::{self, DIR_FROM_ENDPOINT, DIR_TO_ENDPOINT},
    rules::rule_slot,
    service::{
        Affinity4, Affinity4Key, BACKEND_FLAG_TERMINATING, HAIRPIN4, MemberKey, MemberValue,
        NODEPORT_ANY, SCOPE_ALL, SCOPE_PODS, SVC_FLAG_AFFINITY, SVC_FLAG_EXTERNAL_LOCAL,
    },
    service_ct::{DIR_ORIGINAL, DIR_REPLY},
};

use crate::dpmodel::{self, CtKey, Maps, Prog, Run, Writes};

/// A small deterministic generator (SplitMix64).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn bits(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number below `n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.bits() % n as u64) as usize
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.bits() % 100 < percent
    }

    /// One of `items`.
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }

    fn byte(&mut self) -> u8 {
        self.bits() as u8
    }

    fn u16(&mut self) -> u16 {
        self.bits() as u16
    }
}

/// How many workload interfaces a state has (plus loopback, which is never an endpoint).
pub const PODS: usize = 3;

/// The lab's IPv4 addresses: pods (own, second), remote pods, the node, world, a CIDR's,
/// Service frontends, the hairpin address and zero.
const POD4: [[u8; 4]; PODS] = [[10, 244, 0, 10], [10, 244, 0, 11], [10, 244, 0, 12]];
const POD4_2: [[u8; 4]; PODS] = [[10, 244, 0, 20], [10, 244, 0, 21], [10, 244, 0, 22]];
const REMOTE4: [[u8; 4]; 2] = [[10, 244, 1, 5], [10, 244, 1, 6]];
const NODE4: [u8; 4] = [10, 0, 0, 1];
const WORLD4: [u8; 4] = [192, 0, 2, 7];
const CIDR4: [[u8; 4]; 2] = [[198, 51, 100, 9], [198, 51, 100, 200]];
const VIP4: [[u8; 4]; 2] = [[10, 96, 0, 10], [10, 96, 0, 11]];
const ADDRS4: [[u8; 4]; 17] = [
    POD4[0], POD4[1], POD4[2], POD4_2[0], POD4_2[1], REMOTE4[0], REMOTE4[1], NODE4, WORLD4,
    CIDR4[0], CIDR4[1], VIP4[0], VIP4[1], HAIRPIN4, [0; 4], VIP4[0], NODE4,
];
const PORTS: [u16; 10] = [80, 443, 53, 8080, 40000, 40001, 30080, 0, 65535, 9];
const NODEPORT: u16 = 30080;

fn v6(last: u16, net: u16) -> [u8; 16] {
    let mut a = [0u8; 16];
    a[0..2].copy_from_slice(&0xfd00u16.to_be_bytes());
    a[2..4].copy_from_slice(&net.to_be_bytes());
    a[14..16].copy_from_slice(&last.to_be_bytes());
    a
}

fn pod6(i: usize) -> [u8; 16] {
    v6(10 + i as u16, 0x244)
}

fn addrs6() -> Vec<[u8; 16]> {
    let mut out: Vec<[u8; 16]> = (0..PODS).map(pod6).collect();
    out.extend([
        v6(20, 0x244),
        v6(5, 0x245),
        v6(6, 0x245),
        v6(1, 0),
        // An address in the upper half of the word order (`ct_key` compares little-endian words).
        [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7],
        [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x99],
        [0; 16],
    ]);
    out
}

/// One packet of a case: which program, which interface slot (`PODS` is loopback: no
/// endpoint), the frame, and what the generator made of it (for the class counts).
#[derive(Clone, Debug)]
pub struct Packet {
    /// The program.
    pub prog: Prog,
    /// The interface slot.
    pub slot: usize,
    /// The frame.
    pub frame: Vec<u8>,
    /// What the generator did.
    pub kind: Kind,
}

/// What a generated packet is.
#[derive(Clone, Copy, Debug, Default)]
pub struct Kind {
    /// Cut short.
    pub truncated: bool,
    /// Bytes overwritten at random.
    pub hostile: bool,
    /// Built from an earlier packet (delivered, answered or quoted in an ICMP error).
    pub follows: bool,
}

/// A map state and its "now".
#[derive(Clone, Debug)]
pub struct State {
    /// The maps.
    pub maps: Maps,
    /// The state's clock.
    pub now: u64,
}

/// `CLOCK_MONOTONIC_COARSE` now (the programs' clock), in nanoseconds.
#[must_use]
pub fn coarse_now() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC_COARSE)
        .expect("CLOCK_MONOTONIC_COARSE");
    u64::try_from(t.tv_sec()).expect("seconds") * 1_000_000_000
        + u64::try_from(t.tv_nsec()).expect("nanoseconds")
}

/// A random map state over `ifindex` (the pods' interfaces).
#[must_use]
pub fn gen_state(rng: &mut Rng, ifindex: &[u32; PODS], now: u64) -> State {
    let mut m = Maps::default();
    let a6 = addrs6();
    let identities = [1001u32, 1002, 1003, 2000, 2001, 3000, 3001, HOST, 2, 4];
    for (i, ifx) in ifindex.iter().enumerate() {
        if rng.chance(92) {
            let ep = EndpointInfo {
                endpoint_id: 11 + i as u32,
                identity: if rng.chance(85) {
                    1001 + i as u32
                } else {
                    1001
                },
                flags: rng.below(4) as u32,
                _pad: 0,
                ipv4: [
                    if rng.chance(95) { POD4[i] } else { [0; 4] },
                    if rng.chance(30) { POD4_2[i] } else { [0; 4] },
                ],
                ipv6: [
                    if rng.chance(90) { pod6(i) } else { [0; 16] },
                    if rng.chance(20) {
                        v6(20, 0x244)
                    } else {
                        [0; 16]
                    },
                ],
            };
            m.endpoints.insert(*ifx, ep);
        }
    }
    for (i, pod) in POD4.iter().enumerate() {
        if rng.chance(85) {
            m.ident4.insert(*pod, 1001 + i as u32);
            m.ident6.insert(pod6(i), 1001 + i as u32);
        }
    }
    for (i, a) in REMOTE4.iter().enumerate() {
        if rng.chance(80) {
            m.ident4.insert(*a, 2000 + i as u32);
            m.ident6.insert(a6[4 + i], 2000 + i as u32);
        }
    }
    if rng.chance(90) {
        m.ident4.insert(NODE4, HOST);
        m.ident6.insert(a6[6], HOST);
    }
    for (prefix, len, id) in [
        ([198, 51, 100, 0], 24, 3000),
        ([198, 51, 100, 128], 25, 3001),
        ([10, 244, 0, 0], 16, 3002),
        ([0, 0, 0, 0], 0, 3003),
    ] {
        if rng.chance(40) {
            m.ipcache4.push((prefix, len, id));
        }
    }
    for (prefix, len, id) in [
        (v6(0, 0x244), 32, 3002),
        (a6[7], 64, 3000),
        ([0; 16], 0, 3003),
    ] {
        if rng.chance(40) {
            m.ipcache6.push((prefix, len, id));
        }
    }
    for i in 0..PODS {
        if !rng.chance(80) {
            continue;
        }
        for _ in 0..rng.below(9) {
            let key = PolicyKey {
                endpoint_id: 11 + i as u32,
                peer_identity: if rng.chance(30) {
                    ANY
                } else {
                    rng.pick(&identities)
                },
                port: if rng.chance(35) {
                    ANY_PORT
                } else {
                    rng.pick(&[80, 443, 53, 8080, 8, 0, 128, 129, 40000])
                },
                protocol: rng.pick(&[6, 6, 17, 17, 1, 58, 132, ANY_PROTO, 47]),
                direction: rng.below(2) as u8,
            };
            let mut value = PolicyValue::new(
                if rng.chance(75) {
                    VERDICT_ALLOW
                } else {
                    VERDICT_DENY
                },
                1 + rng.below(40) as u32,
            );
            if key.port == ANY_PORT && rng.chance(40) {
                value.flags = 0;
                value.ranges = [NO_RANGE; MAX_PORT_RANGES];
                for r in value.ranges.iter_mut().take(rng.below(MAX_PORT_RANGES + 1)) {
                    let first = rng.pick(&[1, 50, 80, 443, 8000, 30000]);
                    *r = PortRange {
                        first,
                        last: first.saturating_add(rng.pick(&[0, 10, 1000])),
                    };
                }
            } else if rng.chance(5) {
                value.flags = 0;
            }
            m.policy.insert(key, value);
        }
    }
    let backend_addrs = [POD4[0], POD4[1], POD4[2], REMOTE4[0], REMOTE4[1], NODE4];
    let backend_ids: Vec<u32> = (100..107).collect();
    for id in &backend_ids {
        if rng.chance(90) {
            let b = Backend4 {
                addr: rng.pick(&backend_addrs),
                port: rng.pick(&[8080, 80, 53, 9]),
                protocol: 0,
                flags: if rng.chance(15) {
                    BACKEND_FLAG_TERMINATING
                } else {
                    0
                },
            };
            m.backends4.insert(*id, b);
        }
    }
    for sid in 1..=rng.below(5) as u32 {
        let nodeport = rng.chance(20);
        let addr = if nodeport {
            NODEPORT_ANY
        } else if rng.chance(15) {
            NODE4
        } else {
            rng.pick(&VIP4)
        };
        let port = if nodeport || rng.chance(10) {
            NODEPORT
        } else {
            rng.pick(&[80, 53, 443])
        };
        let count = rng.below(4) as u16;
        let mut flags = 0;
        if rng.chance(30) {
            flags |= SVC_FLAG_AFFINITY;
        }
        if rng.chance(20) {
            flags |= SVC_FLAG_EXTERNAL_LOCAL;
        }
        let value = Svc4Value {
            service_id: sid,
            backend_count: count,
            flags,
            affinity_timeout_secs: rng.pick(&[10, 10_800]),
            pad: 0,
        };
        for proto in [6u8, 17] {
            if rng.chance(70) {
                let key = Svc4Key {
                    addr,
                    port,
                    protocol: proto,
                    scope: SCOPE_ALL,
                };
                m.svc4.insert(key, value);
                if flags & SVC_FLAG_EXTERNAL_LOCAL != 0 && rng.chance(60) {
                    let pods = Svc4Value {
                        backend_count: rng.below(4) as u16,
                        ..value
                    };
                    m.svc4.insert(
                        Svc4Key {
                            scope: SCOPE_PODS,
                            ..key
                        },
                        pods,
                    );
                }
            }
        }
        for slot in 0..4u16 {
            if rng.chance(85) {
                let id = rng.pick(&backend_ids);
                m.slots.insert(
                    SlotKey {
                        service_id: sid,
                        slot,
                        pad: 0,
                    },
                    id,
                );
                if rng.chance(50) {
                    let moved = if rng.chance(70) {
                        slot
                    } else {
                        rng.below(4) as u16
                    };
                    m.members.insert(
                        MemberKey {
                            service_id: sid,
                            backend_id: id,
                        },
                        moved,
                    );
                }
            }
        }
        if rng.chance(90) {
            m.revnat4.insert(sid, RevNat4 { addr, port, pad: 0 });
        }
        for client in POD4 {
            if flags & SVC_FLAG_AFFINITY != 0 && rng.chance(40) {
                let timeout = u64::from(value.affinity_timeout_secs) * 1_000_000_000;
                let last = if rng.chance(70) {
                    now.saturating_sub(1_000_000_000)
                } else {
                    now.saturating_sub(timeout + 10_000_000_000)
                };
                m.affinity4.insert(
                    Affinity4Key {
                        service_id: sid,
                        client,
                    },
                    Affinity4 {
                        backend_id: rng.pick(&backend_ids),
                        slot: rng.below(4) as u16,
                        _pad: 0,
                        last_used_ns: last,
                    },
                );
            }
        }
    }
    let old = |rng: &mut Rng| {
        if rng.chance(80) {
            now.saturating_sub(5_000_000_000)
        } else {
            now + 1_000_000_000_000_000
        }
    };
    let sids: Vec<u32> = (0..=4).collect();
    // Flows between a pod and a backend, as a Service's translated tuple would be (another
    // frontend's or none: the tuple is taken).
    let backends: Vec<Backend4> = m.backends4.values().copied().collect();
    if !backends.is_empty() {
        for _ in 0..rng.below(6) {
            let b = rng.pick(&backends);
            let proto = rng.pick(&[6, 17]);
            let key = Ct4Key::of(proto, (rng.pick(&POD4), rng.pick(&PORTS)), (b.addr, b.port));
            let entry = CtEntry {
                last_seen_ns: now.saturating_sub(1_000_000_000),
                flags: rng.pick(&[0x12, 0x32, 0x3a, 0x13a, 0x2, 0xa]),
                _reserved: 0,
                created_ns: now.saturating_sub(2_000_000_000),
                rev_nat: rng.pick(&sids),
                _pad: 0,
            };
            m.ct4.insert(key, entry);
        }
    }
    for _ in 0..rng.below(12) {
        let proto = rng.pick(&[6, 17, 1, 132]);
        let (a, b) = (rng.pick(&ADDRS4), rng.pick(&ADDRS4));
        let key = Ct4Key::of(proto, (a, rng.pick(&PORTS)), (b, rng.pick(&PORTS)));
        let entry = CtEntry {
            last_seen_ns: old(rng),
            flags: rng.below(0x200) as u32,
            _reserved: 0,
            created_ns: now.saturating_sub(9_000_000_000),
            rev_nat: if rng.chance(50) { 0 } else { rng.pick(&sids) },
            _pad: 0,
        };
        m.ct4.insert(key, entry);
    }
    for _ in 0..rng.below(8) {
        let proto = rng.pick(&[6, 17, 58, 132]);
        let (a, b) = (rng.pick(&a6), rng.pick(&a6));
        let (pa, pb) = (rng.pick(&PORTS), rng.pick(&PORTS));
        let key = Ct6Key {
            addr_a: a,
            addr_b: b,
            port_a: pa,
            port_b: pb,
            protocol: proto,
            _pad: [0; 3],
        };
        let entry = CtEntry {
            last_seen_ns: old(rng),
            flags: rng.below(0x200) as u32,
            _reserved: 0,
            created_ns: now.saturating_sub(9_000_000_000),
            rev_nat: 0,
            _pad: 0,
        };
        m.ct6.insert(key, entry);
    }
    for _ in 0..rng.below(6) {
        let nodeport = rng.chance(25);
        let key = SvcCt4Key {
            saddr: if nodeport {
                rng.pick(&backend_addrs)
            } else {
                rng.pick(&POD4)
            },
            daddr: if nodeport {
                rng.pick(&POD4)
            } else {
                rng.pick(&[VIP4[0], VIP4[1], NODE4])
            },
            sport: rng.pick(&PORTS),
            dport: rng.pick(&PORTS),
            protocol: rng.pick(&[6, 17]),
            direction: if nodeport { DIR_REPLY } else { DIR_ORIGINAL },
            _pad: [0; 2],
        };
        let entry = SvcCt4Entry {
            addr: rng.pick(&backend_addrs),
            port: rng.pick(&[8080, 80, 53, 30080]),
            _pad: 0,
            service_id: rng.pick(&sids),
            backend_id: rng.pick(&backend_ids),
            last_seen_ns: old(rng),
        };
        m.svc_ct4.insert(key, entry);
    }
    State { maps: m, now }
}

/// The packet builder's description of one IP packet before it is serialised.
struct Spec {
    v6: bool,
    src: [u8; 16],
    dst: [u8; 16],
    proto: u8,
    l4: Vec<u8>,
}

fn a4(a: [u8; 4]) -> [u8; 16] {
    let mut out = [0; 16];
    out[..4].copy_from_slice(&a);
    out
}

fn l4_header(rng: &mut Rng, proto: u8, v6: bool, sport: u16, dport: u16) -> Vec<u8> {
    let mut h = Vec::new();
    h.extend_from_slice(&sport.to_be_bytes());
    h.extend_from_slice(&dport.to_be_bytes());
    match proto {
        6 => {
            h.extend_from_slice(&rng.bits().to_be_bytes()[..8]);
            let doff: u8 = if rng.chance(92) {
                5
            } else {
                rng.below(16) as u8
            };
            let flags = if rng.chance(90) {
                rng.pick(&[0x02, 0x12, 0x10, 0x11, 0x04, 0x14, 0x18, 0x02, 0x10])
            } else {
                rng.byte()
            };
            h.push(doff << 4);
            h.push(flags);
            h.extend_from_slice(&rng.u16().to_be_bytes());
            h.extend_from_slice(&rng.u16().to_be_bytes());
            h.extend_from_slice(&[0, 0]);
            let extra = if doff > 5 && rng.chance(70) {
                (usize::from(doff) - 5) * 4
            } else {
                0
            };
            h.extend((0..extra + rng.below(8)).map(|_| 1));
        }
        17 => {
            h.extend_from_slice(&[0, 12]);
            let check = if rng.chance(20) { 0 } else { rng.u16() };
            h.extend_from_slice(&check.to_be_bytes());
            h.extend((0..rng.below(12)).map(|_| 0xab));
        }
        132 => {
            h.extend_from_slice(&rng.bits().to_be_bytes());
            h.extend_from_slice(&[1, 0, 0, 20]);
            h.extend((0..16).map(|_| 0x5e));
        }
        _ => {
            let _ = v6;
            h.extend((0..rng.below(20)).map(|_| 0x42));
        }
    }
    h
}

fn icmp_msg(ty: u8, code: u8, id: u16, payload: &[u8]) -> Vec<u8> {
    let mut h = vec![ty, code, 0x12, 0x34];
    h.extend_from_slice(&id.to_be_bytes());
    h.extend_from_slice(&[0, 1]);
    h.extend_from_slice(payload);
    h
}

fn serialise(rng: &mut Rng, s: &Spec, options: bool, frag: bool) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 0x01, 0x02, 0, 0, 0, 0, 0x02];
    if s.v6 {
        f.extend_from_slice(&0x86DDu16.to_be_bytes());
        let mut chain = Vec::new();
        let mut kinds = Vec::new();
        if options {
            for _ in 0..1 + rng.below(5) {
                kinds.push(rng.pick(&[0u8, 60, 60, 43, 51, 0]));
            }
        }
        if frag {
            let at = rng.below(kinds.len() + 1);
            kinds.insert(at, 44);
        }
        for (i, kind) in kinds.iter().enumerate() {
            let next = kinds.get(i + 1).copied().unwrap_or(s.proto);
            match kind {
                43 => chain.extend_from_slice(&[
                    next,
                    0,
                    4,
                    if rng.chance(70) { 0 } else { 1 },
                    0,
                    0,
                    0,
                    0,
                ]),
                51 => chain.extend_from_slice(&[next, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
                44 => {
                    chain.extend_from_slice(&[
                        next,
                        0,
                        0,
                        8 | u8::from(rng.chance(50)),
                        0,
                        0,
                        0,
                        1,
                    ]);
                }
                _ => chain.extend_from_slice(&[next, 0, 1, 4, 0, 0, 0, 0]),
            }
        }
        let first = kinds.first().copied().unwrap_or(s.proto);
        let plen = (chain.len() + s.l4.len()) as u16;
        f.extend_from_slice(&[0x60, 0, 0, 0]);
        f.extend_from_slice(&plen.to_be_bytes());
        f.push(first);
        f.push(64);
        f.extend_from_slice(&s.src);
        f.extend_from_slice(&s.dst);
        f.extend_from_slice(&chain);
    } else {
        f.extend_from_slice(&0x0800u16.to_be_bytes());
        let opts = if options { 4 * (1 + rng.below(10)) } else { 0 };
        let hlen = 20 + opts;
        let total = (hlen + s.l4.len()) as u16;
        let fragfield: u16 = if frag {
            rng.pick(&[0x2000, 0x0001, 0x2010, 0x1fff, 0x3fff])
        } else if rng.chance(30) {
            0x4000
        } else {
            0
        };
        f.push(0x40 | (hlen / 4) as u8);
        f.push(0);
        f.extend_from_slice(&total.to_be_bytes());
        f.extend_from_slice(&rng.u16().to_be_bytes());
        f.extend_from_slice(&fragfield.to_be_bytes());
        f.push(64);
        f.push(s.proto);
        f.extend_from_slice(&rng.u16().to_be_bytes());
        f.extend_from_slice(&s.src[..4]);
        f.extend_from_slice(&s.dst[..4]);
        f.extend((0..opts).map(|i| if i + 1 == opts { 0 } else { 1 }));
    }
    f.extend_from_slice(&s.l4);
    f
}

/// Where an endpoint's packet comes from or goes to: its own address mostly.
fn own_or_any(
    rng: &mut Rng,
    m: &Maps,
    ifindex: Option<u32>,
    v6: bool,
    a6: &[[u8; 16]],
) -> [u8; 16] {
    if let Some(ep) = ifindex.and_then(|i| m.endpoints.get(&i))
        && rng.chance(85)
    {
        return if v6 {
            ep.ipv6[usize::from(rng.chance(10))]
        } else {
            a4(ep.ipv4[usize::from(rng.chance(10))])
        };
    }
    if v6 {
        rng.pick(a6)
    } else {
        a4(rng.pick(&ADDRS4))
    }
}

/// A random packet for `state`; `history` holds earlier packets' outputs (to follow flows).
pub fn gen_packet(
    rng: &mut Rng,
    state: &State,
    ifindex: &[u32; PODS],
    history: &[(Packet, Vec<u8>)],
) -> Packet {
    let prog = if rng.chance(50) { Prog::From } else { Prog::To };
    let slot = if rng.chance(3) { PODS } else { rng.below(PODS) };
    let mut kind = Kind::default();
    let mut frame = if !history.is_empty() && rng.chance(40) {
        kind.follows = true;
        follow(rng, state, ifindex, history)
    } else {
        fresh(rng, state, prog, ifindex.get(slot).copied())
    };
    let (prog, slot) = if kind.follows {
        place(rng, state, ifindex, &frame).unwrap_or((prog, slot))
    } else {
        (prog, slot)
    };
    let base = match u16::from_be_bytes([frame[12], frame[13]]) {
        0x0800 => 34,
        0x86DD => 54,
        _ => 14,
    };
    if rng.chance(8) && frame.len() > base {
        kind.truncated = true;
        let cut = base + rng.below(frame.len() - base);
        frame.truncate(cut);
    }
    if rng.chance(8) {
        kind.hostile = true;
        for _ in 0..1 + rng.below(3) {
            let at = 14 + rng.below(frame.len().saturating_sub(14).clamp(1, 80));
            if at < frame.len() {
                frame[at] = rng.byte();
            }
        }
    }
    Packet {
        prog,
        slot,
        frame,
        kind,
    }
}

fn fresh(rng: &mut Rng, state: &State, prog: Prog, ifindex: Option<u32>) -> Vec<u8> {
    let m = &state.maps;
    let a6 = addrs6();
    let roll = rng.below(100);
    if roll < 3 {
        let mut f = vec![0xff; 6];
        f.extend_from_slice(&[2, 0, 0, 0, 0, 2]);
        f.extend_from_slice(&rng.pick(&[0x0806u16, 0x88cc, 0x8100, 0x0027]).to_be_bytes());
        f.extend((0..28 + rng.below(20)).map(|_| 7));
        return f;
    }
    let v6 = rng.chance(38);
    let (src, mut dst) = match prog {
        Prog::From => (own_or_any(rng, m, ifindex, v6, &a6), pick_dst(rng, v6, &a6)),
        Prog::To => (pick_dst(rng, v6, &a6), own_or_any(rng, m, ifindex, v6, &a6)),
    };
    let icmp = if v6 { 58 } else { 1 };
    let mut proto = rng.pick(&[6, 6, 6, 17, 17, 17, icmp, icmp, 132, 47]);
    let (sport, mut dport) = (pick_port(rng), pick_port(rng));
    // A pod's packet to one of the state's frontends (a NodePort: on the node's address).
    if prog == Prog::From && !v6 && !m.svc4.is_empty() && rng.chance(75) {
        let mut keys: Vec<&Svc4Key> = m.svc4.keys().collect();
        keys.sort();
        let fe = *keys[rng.below(keys.len())];
        dst = a4(if fe.addr == NODEPORT_ANY {
            NODE4
        } else {
            fe.addr
        });
        (dport, proto) = (fe.port, fe.protocol);
    }
    let l4 = if proto == icmp {
        let ty = if v6 {
            rng.pick(&[128, 129, 128, 1, 2, 3, 4, 133, 135, 136, 143, 130, 200, 137])
        } else {
            rng.pick(&[8, 0, 8, 3, 11, 12, 5, 13, 40])
        };
        let error = if v6 {
            (1..=4).contains(&ty)
        } else {
            [3, 11, 12].contains(&ty)
        };
        let payload = if error {
            // Quoting a made-up packet between the pool's addresses.
            let inner = Spec {
                v6,
                src: dst,
                dst: if v6 {
                    rng.pick(&a6)
                } else {
                    a4(rng.pick(&ADDRS4))
                },
                proto: rng.pick(&[6, 17, icmp, 132]),
                l4: vec![],
            };
            let mut inner = inner;
            inner.l4 = if inner.proto == icmp {
                icmp_msg(if v6 { 128 } else { 8 }, 0, rng.u16(), &[])
            } else {
                let (sport, dport) = (pick_port(rng), pick_port(rng));
                l4_header(rng, inner.proto, v6, sport, dport)
            };
            serialise(rng, &inner, false, false)[14..].to_vec()
        } else {
            vec![0xab; 8]
        };
        icmp_msg(ty, rng.below(4) as u8, rng.pick(&[1, 2, 777]), &payload)
    } else {
        l4_header(rng, proto, v6, sport, dport)
    };
    let spec = Spec {
        v6,
        src,
        dst,
        proto,
        l4,
    };
    let options = rng.chance(10);
    let frag = rng.chance(5);
    serialise(rng, &spec, options, frag)
}

fn pick_dst(rng: &mut Rng, v6: bool, a6: &[[u8; 16]]) -> [u8; 16] {
    if v6 {
        rng.pick(a6)
    } else if rng.chance(35) {
        a4(rng.pick(&[VIP4[0], VIP4[1], NODE4]))
    } else {
        a4(rng.pick(&ADDRS4))
    }
}

fn pick_port(rng: &mut Rng) -> u16 {
    if rng.chance(85) {
        rng.pick(&PORTS)
    } else {
        rng.u16()
    }
}

/// A packet following an earlier one: the same bytes delivered, its reply, or an ICMP error
/// quoting it.
fn follow(
    rng: &mut Rng,
    state: &State,
    ifindex: &[u32; PODS],
    history: &[(Packet, Vec<u8>)],
) -> Vec<u8> {
    let _ = (state, ifindex);
    let (earlier, out) = &history[history.len() - 1 - rng.below(history.len().min(12))];
    if rng.chance(20) {
        // The same packet again (the flow's next packet: an ACK for TCP).
        let mut again = earlier.frame.clone();
        if again.len() >= 54 && again[12..14] == [0x08, 0x00] && again[23] == 6 && again[14] == 0x45
        {
            again[47] = rng.pick(&[0x10, 0x18, 0x02, 0x11]);
        }
        return again;
    }
    let out = out.clone();
    if out.len() < 14 {
        return out;
    }
    let et = u16::from_be_bytes([out[12], out[13]]);
    let (l3, alen, v6) = match et {
        0x0800 if out.len() >= 34 => (14, 4, false),
        0x86DD if out.len() >= 54 => (14, 16, true),
        _ => return out,
    };
    let roll = rng.below(100);
    if roll < 30 {
        return out;
    }
    let (saddr, daddr) = if v6 {
        (l3 + 8, l3 + 24)
    } else {
        (l3 + 12, l3 + 16)
    };
    let src: Vec<u8> = out[saddr..saddr + alen].to_vec();
    let dst: Vec<u8> = out[daddr..daddr + alen].to_vec();
    if roll < 80 {
        // The reply: addresses and ports swapped, an echo request answered, TCP flags of an
        // answer.
        let mut r = out.clone();
        r[saddr..saddr + alen].copy_from_slice(&dst);
        r[daddr..daddr + alen].copy_from_slice(&src);
        let (proto, l4) = if v6 {
            (r[l3 + 6], l3 + 40)
        } else {
            (r[l3 + 9], l3 + usize::from(r[l3] & 0x0f) * 4)
        };
        if l4 + 4 <= r.len() {
            match proto {
                6 | 17 | 132 => {
                    let (a, b) = (r[l4..l4 + 2].to_vec(), r[l4 + 2..l4 + 4].to_vec());
                    r[l4..l4 + 2].copy_from_slice(&b);
                    r[l4 + 2..l4 + 4].copy_from_slice(&a);
                    if proto == 6 && l4 + 14 <= r.len() {
                        r[l4 + 13] = rng.pick(&[0x12, 0x10, 0x11, 0x14, 0x04, 0x18]);
                    }
                }
                1 => r[l4] = if r[l4] == 8 { 0 } else { 8 },
                58 => r[l4] = if r[l4] == 128 { 129 } else { 128 },
                _ => {}
            }
        }
        return r;
    }
    // An ICMP error from the packet's destination back to its source, quoting it.
    let quote_len = (out.len() - 14).min(if v6 { 48 } else { 28 + rng.below(20) });
    let quote = out[14..14 + quote_len].to_vec();
    let ty = if v6 {
        rng.pick(&[1, 2, 3, 4])
    } else {
        rng.pick(&[3, 11, 12])
    };
    let mut s = [0u8; 16];
    let mut d = [0u8; 16];
    s[..alen].copy_from_slice(&dst);
    d[..alen].copy_from_slice(&src);
    let spec = Spec {
        v6,
        src: s,
        dst: d,
        proto: if v6 { 58 } else { 1 },
        l4: icmp_msg(ty, 3, 0, &quote),
    };
    serialise(rng, &spec, false, false)
}

/// Where a followed packet goes: `to_endpoint` of the pod owning its destination, or
/// `from_endpoint` of the pod owning its source.
fn place(
    rng: &mut Rng,
    state: &State,
    ifindex: &[u32; PODS],
    frame: &[u8],
) -> Option<(Prog, usize)> {
    if frame.len() < 34 {
        return None;
    }
    let et = u16::from_be_bytes([frame[12], frame[13]]);
    let (src, dst): (Vec<u8>, Vec<u8>) = match et {
        0x0800 => (frame[26..30].to_vec(), frame[30..34].to_vec()),
        0x86DD if frame.len() >= 54 => (frame[22..38].to_vec(), frame[38..54].to_vec()),
        _ => return None,
    };
    let owner = |addr: &[u8]| {
        ifindex.iter().position(|i| {
            state.maps.endpoints.get(i).is_some_and(|ep| {
                ep.ipv4.iter().any(|a| a[..] == *addr) || ep.ipv6.iter().any(|a| a[..] == *addr)
            })
        })
    };
    let to = owner(&dst).map(|s| (Prog::To, s));
    let from = owner(&src).map(|s| (Prog::From, s));
    match (to, from) {
        (Some(t), Some(f)) => Some(if rng.chance(50) { t } else { f }),
        (t, f) => t.or(f),
    }
}

/// Weir's object loaded with its maps, and the pods' interfaces.
pub struct Kernel<'a> {
    /// The loaded object.
    pub ebpf: &'a mut Ebpf,
    /// The pods' interfaces; loopback (1) is the unknown one.
    pub ifindex: [u32; PODS],
}

fn hash_map<'m, K: Pod, V: Pod>(
    ebpf: &'m mut Ebpf,
    name: &str,
) -> HashMap<&'m mut aya::maps::MapData, K, V> {
    HashMap::try_from(
        ebpf.map_mut(name)
            .unwrap_or_else(|| panic!("no map {name}")),
    )
    .unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn clear<K: Pod, V: Pod>(ebpf: &mut Ebpf, name: &str) {
    let mut m = hash_map::<K, V>(ebpf, name);
    let keys: Vec<K> = m.keys().filter_map(Result::ok).collect();
    for k in keys {
        let _ = m.remove(&k);
    }
}

fn put<K: Pod, V: Pod>(ebpf: &mut Ebpf, name: &str, entries: impl IntoIterator<Item = (K, V)>) {
    let mut m = hash_map::<K, V>(ebpf, name);
    for (k, v) in entries {
        m.insert(&k, &v, 0)
            .unwrap_or_else(|e| panic!("insert {name}: {e}"));
    }
}

fn dump<K: Pod + Eq + Hash, V: Pod>(ebpf: &Ebpf, name: &str) -> Map<K, V> {
    let m: HashMap<_, K, V> =
        HashMap::try_from(ebpf.map(name).unwrap_or_else(|| panic!("no map {name}")))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    m.iter().filter_map(Result::ok).collect()
}

fn get<K: Pod, V: Pod>(ebpf: &Ebpf, name: &str, key: &K) -> Option<V> {
    let m: HashMap<_, K, V> =
        HashMap::try_from(ebpf.map(name).unwrap_or_else(|| panic!("no map {name}")))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    m.get(key, 0).ok()
}

fn clear_lpm<K: Pod>(ebpf: &mut Ebpf, name: &str) {
    let mut m: LpmTrie<_, K, IdentityInfo> = LpmTrie::try_from(ebpf.map_mut(name).expect("lpm"))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let keys: Vec<Key<K>> = m.keys().filter_map(Result::ok).collect();
    for k in keys {
        let _ = m.remove(&k);
    }
}

fn put_lpm<K: Pod>(ebpf: &mut Ebpf, name: &str, entries: &[(K, u32, u32)]) {
    let mut m: LpmTrie<_, K, IdentityInfo> = LpmTrie::try_from(ebpf.map_mut(name).expect("lpm"))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    for (prefix, len, identity) in entries {
        let value = IdentityInfo {
            identity: *identity,
            flags: 0,
        };
        m.insert(&Key::new(*len, *prefix), &value, 0)
            .unwrap_or_else(|e| panic!("insert {name}: {e}"));
    }
}

/// A kernel result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelRun {
    /// The program's return code.
    pub action: i32,
    /// The packet as the program left it.
    pub out: Vec<u8>,
}

impl Kernel<'_> {
    /// Empties every map the programs read or write and writes `maps`.
    pub fn reset(&mut self, maps: &Maps) {
        let e = &mut *self.ebpf;
        clear::<u32, EndpointInfo>(e, maps::ENDPOINTS);
        clear::<[u8; 4], IdentityInfo>(e, maps::IDENT4);
        clear::<[u8; 16], IdentityInfo>(e, maps::IDENT6);
        clear_lpm::<[u8; 4]>(e, maps::IPCACHE4);
        clear_lpm::<[u8; 16]>(e, maps::IPCACHE6);
        clear::<PolicyKey, PolicyValue>(e, maps::POLICY);
        clear::<Svc4Key, Svc4Value>(e, maps_schema::service::SVC4);
        clear::<SlotKey, SlotValue>(e, maps_schema::service::SVC_SLOTS);
        clear::<MemberKey, MemberValue>(e, maps_schema::service::SVC_MEMBERS);
        clear::<u32, Backend4>(e, maps_schema::service::SVC_BACKENDS4);
        clear::<u32, RevNat4>(e, maps_schema::service::SVC_REVNAT4);
        clear::<Affinity4Key, Affinity4>(e, maps_schema::service::SVC_AFFINITY4);
        clear::<Ct4Key, CtEntry>(e, maps::CT4);
        clear::<Ct6Key, CtEntry>(e, maps::CT6);
        clear::<SvcCt4Key, SvcCt4Entry>(e, maps_schema::service_ct::SVC_CT4);
        put(
            e,
            maps::ENDPOINTS,
            maps.endpoints.iter().map(|(k, v)| (*k, *v)),
        );
        let ident = |id: u32| IdentityInfo {
            identity: id,
            flags: 0,
        };
        put(
            e,
            maps::IDENT4,
            maps.ident4.iter().map(|(k, v)| (*k, ident(*v))),
        );
        put(
            e,
            maps::IDENT6,
            maps.ident6.iter().map(|(k, v)| (*k, ident(*v))),
        );
        put_lpm(e, maps::IPCACHE4, &maps.ipcache4);
        put_lpm(e, maps::IPCACHE6, &maps.ipcache6);
        put(e, maps::POLICY, maps.policy.iter().map(|(k, v)| (*k, *v)));
        put(
            e,
            maps_schema::service::SVC4,
            maps.svc4.iter().map(|(k, v)| (*k, *v)),
        );
        put(
            e,
            maps_schema::service::SVC_SLOTS,
            maps.slots
                .iter()
                .map(|(k, v)| (*k, SlotValue { backend_id: *v })),
        );
        put(
            e,
            maps_schema::service::SVC_MEMBERS,
            maps.members
                .iter()
                .map(|(k, v)| (*k, MemberValue { slot: *v, pad: 0 })),
        );
        put(
            e,
            maps_schema::service::SVC_BACKENDS4,
            maps.backends4.iter().map(|(k, v)| (*k, *v)),
        );
        put(
            e,
            maps_schema::service::SVC_REVNAT4,
            maps.revnat4.iter().map(|(k, v)| (*k, *v)),
        );
        put(
            e,
            maps_schema::service::SVC_AFFINITY4,
            maps.affinity4.iter().map(|(k, v)| (*k, *v)),
        );
        put(e, maps::CT4, maps.ct4.iter().map(|(k, v)| (*k, *v)));
        put(e, maps::CT6, maps.ct6.iter().map(|(k, v)| (*k, *v)));
        put(
            e,
            maps_schema::service_ct::SVC_CT4,
            maps.svc_ct4.iter().map(|(k, v)| (*k, *v)),
        );
    }

    /// The interface of `slot` (`PODS`: loopback, no endpoint).
    #[must_use]
    pub fn ifindex(&self, slot: usize) -> u32 {
        self.ifindex.get(slot).copied().unwrap_or(1)
    }

    /// Runs `frame` through `prog` on `slot`'s interface (`Err`: the kernel refused the run).
    pub fn run(&mut self, prog: Prog, slot: usize, frame: &[u8]) -> Result<KernelRun, String> {
        let ifindex = self.ifindex(slot);
        let name = match prog {
            Prog::From => maps_schema::programs::FROM_ENDPOINT,
            Prog::To => maps_schema::programs::TO_ENDPOINT,
        };
        let program: &mut SchedClassifier = self
            .ebpf
            .program_mut(name)
            .expect("program")
            .try_into()
            .expect("tc program");
        let mut ctx = [0u8; 192];
        ctx[40..44].copy_from_slice(&ifindex.to_ne_bytes());
        let mut out = vec![0u8; frame.len() + 256];
        let opts = TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            ctx_in: Some(&ctx),
            repeat: 1,
            ..TestRunOptions::default()
        };
        let result = program.test_run(opts).map_err(|e| e.to_string())?;
        out.truncate(result.data_size_out as usize);
        Ok(KernelRun {
            action: result.return_value as i32,
            out,
        })
    }

    /// Packets counted under `reason` in `direction`, all CPUs.
    #[must_use]
    pub fn counter(&self, index: u32, name: &str) -> u64 {
        let m: PerCpuArray<_, CounterValue> =
            PerCpuArray::try_from(self.ebpf.map(name).expect("per-CPU map")).expect("per-CPU");
        m.get(&index, 0)
            .map(|v| v.iter().map(|c| c.packets).sum())
            .unwrap_or(0)
    }

    /// Every verdict and note counter of both endpoint directions.
    #[must_use]
    pub fn counters(&self) -> Map<(u32, u32), u64> {
        let mut out = Map::new();
        for r in reason::ALL {
            for d in [DIR_FROM_ENDPOINT, DIR_TO_ENDPOINT] {
                out.insert((*r, d), self.counter(counter_index(*r, d), maps::COUNTERS));
            }
        }
        out
    }

    /// Hits of the rules 1..=64 (the generator's rule ids).
    #[must_use]
    pub fn rule_hits(&self) -> Map<u32, u64> {
        (1..=64)
            .map(|r| (r, self.counter(rule_slot(r), maps::RULE_HITS)))
            .collect()
    }
}

/// The stamp check: a value the model wrote "now" is the kernel's clock during the state's run.
fn stamp_ok(model: u64, kernel: u64, now: u64, window: (u64, u64)) -> bool {
    if model == now {
        kernel >= window.0 && kernel <= window.1
    } else {
        model == kernel
    }
}

fn ct_same(m: &CtEntry, k: &CtEntry, now: u64, window: (u64, u64)) -> bool {
    m.flags == k.flags
        && m.rev_nat == k.rev_nat
        && m._reserved == k._reserved
        && m._pad == k._pad
        && stamp_ok(m.last_seen_ns, k.last_seen_ns, now, window)
        && stamp_ok(m.created_ns, k.created_ns, now, window)
}

fn svc_same(m: &SvcCt4Entry, k: &SvcCt4Entry, now: u64, window: (u64, u64)) -> bool {
    SvcCt4Entry {
        last_seen_ns: 0,
        ..*m
    } == SvcCt4Entry {
        last_seen_ns: 0,
        ..*k
    } && stamp_ok(m.last_seen_ns, k.last_seen_ns, now, window)
}

fn aff_same(m: &Affinity4, k: &Affinity4, now: u64, window: (u64, u64)) -> bool {
    (m.backend_id, m.slot, m._pad) == (k.backend_id, k.slot, k._pad)
        && stamp_ok(m.last_used_ns, k.last_used_ns, now, window)
}

/// The clock window of a state's run: "now" stamps fall in it.
#[must_use]
pub fn window(start: u64) -> (u64, u64) {
    (
        start.saturating_sub(100_000_000),
        coarse_now() + 100_000_000,
    )
}

/// Checks the entries a run wrote (the model's `writes`) against the kernel's.
pub fn check_writes(
    k: &Kernel<'_>,
    model: &Maps,
    writes: &Writes,
    now: u64,
    start: u64,
) -> Vec<String> {
    let win = window(start);
    let mut out = Vec::new();
    for key in &writes.ct {
        match key {
            CtKey::V4(key) => {
                let want = model.ct4.get(key);
                let got: Option<CtEntry> = get(k.ebpf, maps::CT4, key);
                if !matches!((want, &got), (Some(w), Some(g)) if ct_same(w, g, now, win)) {
                    out.push(format!("ct4 {key:?}: model {want:?}, kernel {got:?}"));
                }
            }
            CtKey::V6(key) => {
                let want = model.ct6.get(key);
                let got: Option<CtEntry> = get(k.ebpf, maps::CT6, key);
                if !matches!((want, &got), (Some(w), Some(g)) if ct_same(w, g, now, win)) {
                    out.push(format!("ct6 {key:?}: model {want:?}, kernel {got:?}"));
                }
            }
        }
    }
    for key in &writes.svc_ct {
        let want = model.svc_ct4.get(key);
        let got: Option<SvcCt4Entry> = get(k.ebpf, maps_schema::service_ct::SVC_CT4, key);
        if !matches!((want, &got), (Some(w), Some(g)) if svc_same(w, g, now, win)) {
            out.push(format!("svc_ct4 {key:?}: model {want:?}, kernel {got:?}"));
        }
    }
    for key in &writes.affinity {
        let want = model.affinity4.get(key);
        let got: Option<Affinity4> = get(k.ebpf, maps_schema::service::SVC_AFFINITY4, key);
        if !matches!((want, &got), (Some(w), Some(g)) if aff_same(w, g, now, win)) {
            out.push(format!(
                "svc_affin4 {key:?}: model {want:?}, kernel {got:?}"
            ));
        }
    }
    out
}

fn compare_maps<K: Pod + Eq + Hash + std::fmt::Debug, V: Pod + std::fmt::Debug>(
    what: &str,
    model: &std::collections::HashMap<K, V>,
    kernel: &Map<K, V>,
    same: impl Fn(&V, &V) -> bool,
    out: &mut Vec<String>,
) {
    for (k, v) in model {
        match kernel.get(k) {
            Some(g) if same(v, g) => {}
            got => out.push(format!("{what} {k:?}: model {v:?}, kernel {got:?}")),
        }
    }
    for (k, v) in kernel {
        if !model.contains_key(k) {
            out.push(format!(
                "{what} {k:?}: kernel wrote {v:?}, the model has none"
            ));
        }
    }
}

/// Every entry of the maps the programs write, model against kernel.
pub fn check_all(k: &Kernel<'_>, model: &Maps, now: u64, start: u64) -> Vec<String> {
    let win = window(start);
    let mut out = Vec::new();
    let ct4: Map<Ct4Key, CtEntry> = dump(k.ebpf, maps::CT4);
    compare_maps(
        "ct4",
        &model.ct4,
        &ct4,
        |m, g| ct_same(m, g, now, win),
        &mut out,
    );
    let ct6: Map<Ct6Key, CtEntry> = dump(k.ebpf, maps::CT6);
    compare_maps(
        "ct6",
        &model.ct6,
        &ct6,
        |m, g| ct_same(m, g, now, win),
        &mut out,
    );
    let svc: Map<SvcCt4Key, SvcCt4Entry> = dump(k.ebpf, maps_schema::service_ct::SVC_CT4);
    compare_maps(
        "svc_ct4",
        &model.svc_ct4,
        &svc,
        |m, g| svc_same(m, g, now, win),
        &mut out,
    );
    let aff: Map<Affinity4Key, Affinity4> = dump(k.ebpf, maps_schema::service::SVC_AFFINITY4);
    compare_maps(
        "svc_affin4",
        &model.affinity4,
        &aff,
        |m, g| aff_same(m, g, now, win),
        &mut out,
    );
    out
}

/// Compares one run's visible result: action, reason, bytes.
pub fn compare_run(model: &Run, kernel: &KernelRun, reason: Option<u32>) -> Vec<String> {
    let mut out = Vec::new();
    if model.action != kernel.action {
        out.push(format!(
            "action: model {}, kernel {}",
            model.action, kernel.action
        ));
    }
    if reason != Some(model.reason) {
        out.push(format!(
            "reason: model {}, kernel {}",
            reason::name(model.reason),
            reason.map_or("none or several", reason::name)
        ));
    }
    if model.out != kernel.out {
        out.push(format!(
            "bytes: model {}, kernel {}",
            hex(&model.out),
            hex(&kernel.out)
        ));
    }
    out
}

/// A frame in hex.
#[must_use]
pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// One packet through both sides: the mismatches (empty when they agree), the model's run.
/// `counters` holds the kernel's verdict counters as last read and is kept up to date.
pub fn step(
    k: &mut Kernel<'_>,
    state: &mut State,
    start: u64,
    p: &Packet,
    counters: &mut Map<(u32, u32), u64>,
) -> Result<(Vec<String>, Run), String> {
    let kr = k.run(p.prog, p.slot, &p.frame)?;
    let ifindex = k.ifindex(p.slot);
    let (mr, writes) = dpmodel::run(&mut state.maps, state.now, p.prog, ifindex, &p.frame);
    let dir = p.prog.direction();
    let want = (mr.reason, dir);
    let now_count = k.counter(counter_index(mr.reason, dir), maps::COUNTERS);
    let reason = if now_count == counters.get(&want).copied().unwrap_or(0) + 1 {
        counters.insert(want, now_count);
        Some(mr.reason)
    } else {
        // Not the model's reason: find the one that moved.
        let all = k.counters();
        let moved: Vec<u32> = reason::ALL
            .iter()
            .copied()
            .filter(|r| reason::is_pass(*r) || reason::is_drop(*r))
            .filter(|r| all.get(&(*r, dir)) != counters.get(&(*r, dir)))
            .collect();
        *counters = all;
        (moved.len() == 1).then(|| moved[0])
    };
    if let Some(note) = mr.note {
        *counters.entry((note, dir)).or_insert(0) += 1;
    }
    let mut mismatches = compare_run(&mr, &kr, reason);
    mismatches.extend(check_writes(k, &state.maps, &writes, state.now, start));
    Ok((mismatches, mr))
}

/// A case to replay: a state and its packets.
#[derive(Clone, Debug)]
pub struct Case {
    /// The map state.
    pub state: State,
    /// The packets, in order.
    pub packets: Vec<Packet>,
}

/// Replays `case` from a fresh write of its maps, checking everything after every packet;
/// the first mismatch (its packet index and what differed).
pub fn replay(k: &mut Kernel<'_>, case: &Case) -> Option<(usize, Vec<String>)> {
    let start = coarse_now();
    let mut state = State {
        now: start,
        ..case.state.clone()
    };
    k.reset(&state.maps);
    let mut counters = k.counters();
    let rules = k.rule_hits();
    let mut want_rules = rules;
    for (i, p) in case.packets.iter().enumerate() {
        let Ok((mut bad, mr)) = step(k, &mut state, start, p, &mut counters) else {
            continue;
        };
        if mr.rule != 0 {
            *want_rules.entry(mr.rule).or_insert(0) += 1;
        }
        bad.extend(check_all(k, &state.maps, state.now, start));
        let got = k.counters();
        for (key, v) in &got {
            if counters.get(key) != Some(v) {
                bad.push(format!(
                    "counter {} ({}): model {:?}, kernel {v}",
                    reason::name(key.0),
                    reason::direction_name(key.1),
                    counters.get(key)
                ));
            }
        }
        counters = got;
        if k.rule_hits() != want_rules {
            bad.push("rule hits differ".to_owned());
            want_rules = k.rule_hits();
        }
        if !bad.is_empty() {
            return Some((i, bad));
        }
    }
    None
}

/// Every entry of a state, named by its map and its key (stable across removals).
fn entry_ids(m: &Maps) -> Vec<(&'static str, String)> {
    let mut ids = Vec::new();
    macro_rules! ids {
        ($($field:ident),+) => {
            $(ids.extend(m.$field.keys().map(|k| (stringify!($field), format!("{k:?}"))));)+
        };
    }
    ids!(
        endpoints, ident4, ident6, policy, svc4, slots, members, backends4, revnat4, affinity4,
        ct4, ct6, svc_ct4
    );
    ids.extend(m.ipcache4.iter().map(|e| ("ipcache4", format!("{e:?}"))));
    ids.extend(m.ipcache6.iter().map(|e| ("ipcache6", format!("{e:?}"))));
    ids.sort();
    ids
}

/// `m` without the entry `id` names.
fn drop_entry(m: &Maps, (map, key): &(&'static str, String)) -> Maps {
    let mut out = m.clone();
    macro_rules! drop_in {
        ($($field:ident),+) => {
            $(if *map == stringify!($field) {
                out.$field.retain(|k, _| format!("{k:?}") != *key);
            })+
        };
    }
    drop_in!(
        endpoints, ident4, ident6, policy, svc4, slots, members, backends4, revnat4, affinity4,
        ct4, ct6, svc_ct4
    );
    out.ipcache4
        .retain(|e| *map != "ipcache4" || format!("{e:?}") != *key);
    out.ipcache6
        .retain(|e| *map != "ipcache6" || format!("{e:?}") != *key);
    out
}

/// Shrinks a failing case: later packets cut, earlier packets and map entries dropped one at
/// a time, the last packet's tail cut, while it still fails. Bounded by `budget` replays.
pub fn shrink(k: &mut Kernel<'_>, mut case: Case, budget: usize) -> (Case, Vec<String>) {
    let mut tries = 0;
    let Some((at, mut why)) = replay(k, &case) else {
        return (
            case,
            vec!["the case did not fail again on replay".to_owned()],
        );
    };
    case.packets.truncate(at + 1);
    let mut i = 0;
    while i + 1 < case.packets.len() && tries < budget {
        let mut c = case.clone();
        c.packets.remove(i);
        tries += 1;
        match replay(k, &c) {
            Some((at, w)) => {
                c.packets.truncate(at + 1);
                case = c;
                why = w;
            }
            None => i += 1,
        }
    }
    for id in entry_ids(&case.state.maps) {
        if tries >= budget {
            break;
        }
        let mut c = case.clone();
        c.state.maps = drop_entry(&case.state.maps, &id);
        tries += 1;
        if let Some((at, w)) = replay(k, &c) {
            c.packets.truncate(at + 1);
            case = c;
            why = w;
        }
    }
    while tries < budget {
        let Some(last) = case.packets.last() else {
            break;
        };
        if last.frame.len() <= 14 {
            break;
        }
        let mut c = case.clone();
        c.packets.last_mut().expect("a packet").frame.pop();
        tries += 1;
        match replay(k, &c) {
            Some((at, w)) if at + 1 == c.packets.len() => {
                case = c;
                why = w;
            }
            _ => break,
        }
    }
    (case, why)
}

/// A case as text: its maps and packets.
#[must_use]
pub fn describe(case: &Case, ifindex: &[u32; PODS]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "interfaces (slot → ifindex): {ifindex:?}, slot {PODS} is loopback"
    );
    let m = &case.state.maps;
    let mut line = |what: &str, entry: String| {
        let _ = writeln!(s, "  {what} {entry}");
    };
    m.endpoints
        .iter()
        .for_each(|(k, v)| line("endpoint", format!("{k}: {v:?}")));
    m.ident4
        .iter()
        .for_each(|(k, v)| line("ident4", format!("{k:?}: {v}")));
    m.ident6
        .iter()
        .for_each(|(k, v)| line("ident6", format!("{k:?}: {v}")));
    m.ipcache4
        .iter()
        .for_each(|e| line("ipcache4", format!("{e:?}")));
    m.ipcache6
        .iter()
        .for_each(|e| line("ipcache6", format!("{e:?}")));
    m.policy
        .iter()
        .for_each(|(k, v)| line("policy", format!("{k:?}: {v:?}")));
    m.svc4
        .iter()
        .for_each(|(k, v)| line("svc4", format!("{k:?}: {v:?}")));
    m.slots
        .iter()
        .for_each(|(k, v)| line("slot", format!("{k:?}: {v}")));
    m.members
        .iter()
        .for_each(|(k, v)| line("member", format!("{k:?}: {v}")));
    m.backends4
        .iter()
        .for_each(|(k, v)| line("backend4", format!("{k}: {v:?}")));
    m.revnat4
        .iter()
        .for_each(|(k, v)| line("revnat4", format!("{k}: {v:?}")));
    m.affinity4
        .iter()
        .for_each(|(k, v)| line("affin4", format!("{k:?}: {v:?}")));
    m.ct4
        .iter()
        .for_each(|(k, v)| line("ct4", format!("{k:?}: {v:?}")));
    m.ct6
        .iter()
        .for_each(|(k, v)| line("ct6", format!("{k:?}: {v:?}")));
    m.svc_ct4
        .iter()
        .for_each(|(k, v)| line("svc_ct4", format!("{k:?}: {v:?}")));
    let _ = writeln!(s, "  (state clock {})", case.state.now);
    for (i, p) in case.packets.iter().enumerate() {
        let _ = writeln!(
            s,
            "packet {i}: {:?} slot {} {:?}: {}",
            p.prog,
            p.slot,
            p.kind,
            hex(&p.frame)
        );
    }
    s
}

/// Packets per map state: the state's flows build up (replies, deliveries, ICMP errors).
pub const PER_STATE: usize = 200;

/// Classes each run must have produced (a generator that stops making one fails the test).
/// `svc-tuple-taken` is reported only: about 5 in 100,000 cases, too rare to require.
pub const CLASSES: &[&str] = &[
    "ipv4",
    "ipv6",
    "other-ethertype",
    "tcp",
    "udp",
    "icmp",
    "sctp",
    "other-protocol",
    "fragment",
    "ip-options",
    "truncated",
    "hostile",
    "follows",
    "icmp-error",
    "translated",
    "reply-translated",
    "related-translated",
    "hairpin",
    "no-backend-answer",
    "plain-pass",
    "drop",
    "ct-created",
    "ct-established",
    "unknown-endpoint",
    "svc-kept-backend",
    "svc-affinity",
    "svc-pod-nodeport",
    "csum-state-unknown",
];

fn classify(p: &Packet, run: &Run, counts: &mut BTreeMap<&'static str, u64>) {
    let mut bump = |c: &'static str| *counts.entry(c).or_insert(0) += 1;
    let f = &p.frame;
    let et = u16::from_be_bytes([f[12], f[13]]);
    let (proto, fragment, options) = match et {
        0x0800 if f.len() >= 34 => {
            bump("ipv4");
            let frag = u16::from_be_bytes([f[20], f[21]]) & 0x3fff != 0;
            (f[23], frag, f[14] & 0x0f > 5)
        }
        0x86DD if f.len() >= 54 => {
            bump("ipv6");
            let (mut next, mut off, mut seen, mut frag) = (f[20], 54, false, false);
            while matches!(next, 0 | 43 | 44 | 51 | 60) && off + 2 <= f.len() {
                seen = true;
                frag |= next == 44;
                let len = if next == 51 {
                    (usize::from(f[off + 1]) + 2) * 4
                } else if next == 44 {
                    8
                } else {
                    (usize::from(f[off + 1]) + 1) * 8
                };
                next = f[off];
                off += len;
            }
            (next, frag, seen)
        }
        _ => {
            bump("other-ethertype");
            (255, false, false)
        }
    };
    match proto {
        6 => bump("tcp"),
        17 => bump("udp"),
        1 | 58 => bump("icmp"),
        132 => bump("sctp"),
        255 => {}
        _ => bump("other-protocol"),
    }
    if matches!(proto, 1 | 58) {
        let l4 = if et == 0x0800 {
            14 + usize::from(f[14] & 0x0f) * 4
        } else {
            54
        };
        if f.get(l4)
            .is_some_and(|t| matches!((proto, t), (1, 3 | 11 | 12) | (58, 1..=4)))
        {
            bump("icmp-error");
        }
    }
    if fragment {
        bump("fragment");
    }
    if options {
        bump("ip-options");
    }
    for (on, c) in [
        (p.kind.truncated, "truncated"),
        (p.kind.hostile, "hostile"),
        (p.kind.follows, "follows"),
        (run.trail.translated, "translated"),
        (run.trail.reply_translated, "reply-translated"),
        (run.trail.related_translated, "related-translated"),
        (run.trail.hairpin, "hairpin"),
        (run.trail.unreachable, "no-backend-answer"),
        (run.trail.ct_created, "ct-created"),
        (run.trail.ct_hit, "ct-established"),
        (run.trail.kept_backend, "svc-kept-backend"),
        (run.trail.affinity, "svc-affinity"),
        (run.trail.taken, "svc-tuple-taken"),
        (run.trail.node_port, "svc-pod-nodeport"),
        (run.trail.csum_unknown, "csum-state-unknown"),
        (
            run.reason == reason::DROP_UNKNOWN_ENDPOINT,
            "unknown-endpoint",
        ),
        (!reason::is_pass(run.reason), "drop"),
        (
            run.action == dpmodel::TC_ACT_OK
                && !run.trail.translated
                && !run.trail.reply_translated,
            "plain-pass",
        ),
    ] {
        if on {
            bump(c);
        }
    }
}

/// What a run of [`run_cases`] found.
pub struct Report {
    /// Packets run through both sides.
    pub cases: u64,
    /// Map states whose kernel and model disagreed (each stops at its first mismatch).
    pub mismatches: u64,
    /// Runs the kernel refused (a frame without a whole base IP header): not cases.
    pub refused: u64,
    /// Map states generated.
    pub states: u64,
    /// Cases by class ([`CLASSES`], and `svc-tuple-taken`).
    pub counts: BTreeMap<&'static str, u64>,
    /// The first three failing states, shrunk and described, with their seed.
    pub failures: Vec<String>,
}

impl Report {
    /// The required [`CLASSES`] the run produced no case of.
    #[must_use]
    pub fn missing_classes(&self) -> Vec<&'static str> {
        CLASSES
            .iter()
            .copied()
            .filter(|c| self.counts.get(c).copied().unwrap_or(0) == 0)
            .collect()
    }
}

fn state_seed(seed: u64, state: u64) -> u64 {
    Rng::new(seed ^ state.wrapping_mul(0x9e37_79b9_7f4a_7c15)).bits()
}

/// At least `want` cases from `seed`: map states of [`PER_STATE`] packets each, every packet through both
/// sides, every state's maps, counters and rule hits compared at its end.
pub fn run_cases(k: &mut Kernel<'_>, seed: u64, want: u64) -> Report {
    let mut r = Report {
        cases: 0,
        mismatches: 0,
        refused: 0,
        states: 0,
        counts: BTreeMap::new(),
        failures: Vec::new(),
    };
    while r.cases < want {
        let state_no = r.states;
        r.states += 1;
        let mut rng = Rng::new(state_seed(seed, state_no));
        let start = coarse_now();
        let initial = gen_state(&mut rng, &k.ifindex, start);
        let mut state = State {
            maps: initial.maps.clone(),
            now: start,
        };
        k.reset(&state.maps);
        let mut counters = k.counters();
        let mut rules = k.rule_hits();
        let mut history: Vec<(Packet, Vec<u8>)> = Vec::new();
        let mut sent = Vec::new();
        let mut bad = Vec::new();
        for _ in 0..PER_STATE {
            let p = gen_packet(&mut rng, &state, &k.ifindex, &history);
            match step(k, &mut state, start, &p, &mut counters) {
                Err(_) => r.refused += 1,
                Ok((mismatch, run)) => {
                    r.cases += 1;
                    classify(&p, &run, &mut r.counts);
                    if run.rule != 0 {
                        *rules.entry(run.rule).or_insert(0) += 1;
                    }
                    sent.push(p.clone());
                    if !mismatch.is_empty() {
                        bad = mismatch;
                        break;
                    }
                    history.push((p, run.out));
                }
            }
        }
        if bad.is_empty() {
            bad = check_all(k, &state.maps, state.now, start);
            let got = k.counters();
            if got != counters {
                bad.push("verdict or note counters differ at the state's end".to_owned());
            }
            if k.rule_hits() != rules {
                bad.push("rule hits differ at the state's end".to_owned());
            }
        }
        if bad.is_empty() {
            continue;
        }
        r.mismatches += 1;
        if r.failures.len() < 3 {
            let case = Case {
                state: initial,
                packets: sent,
            };
            let (small, why) = shrink(k, case, 600);
            r.failures.push(format!(
                "seed {seed} state {state_no}: {}\nshrunk to: {}\n{}",
                bad.join("\n  "),
                why.join("\n  "),
                describe(&small, &k.ifindex)
            ));
        }
    }
    r
}

/// The positive control: a model that lacks the kernel's endpoints must be caught disagreeing; returns
/// how many of 100 packets were caught.
pub fn control(k: &mut Kernel<'_>, seed: u64) -> usize {
    let mut rng = Rng::new(seed);
    let start = coarse_now();
    let state = loop {
        let s = gen_state(&mut rng, &k.ifindex, start);
        if !s.maps.endpoints.is_empty() {
            break s;
        }
    };
    k.reset(&state.maps);
    let mut model = State {
        maps: Maps {
            endpoints: Map::new(),
            ..state.maps.clone()
        },
        now: start,
    };
    let mut counters = k.counters();
    let mut caught = 0;
    for _ in 0..100 {
        let p = gen_packet(&mut rng, &state, &k.ifindex, &[]);
        if let Ok((bad, _)) = step(k, &mut model, start, &p, &mut counters)
            && !bad.is_empty()
        {
            caught += 1;
        }
    }
    caught
}
