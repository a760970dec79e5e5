//! Per-packet cost through `BPF_PROG_TEST_RUN`, endpoints isolated both ways so the policy lookups
//! run, against the empty tc program built beside the real ones.

use std::{collections::BTreeMap, net::Ipv4Addr};

use anyhow::Result;
use aya::{
    Ebpf,
    maps::{HashMap, MapData},
};
use maps_schema::{
    Ct4Key, CtEntry, EndpointInfo, PolicyKey, PolicyValue,
    endpoint::{FLAG_ISOLATED_EGRESS, FLAG_ISOLATED_INGRESS},
    maps,
    policy::{EGRESS, INGRESS, VERDICT_ALLOW},
    programs::FROM_ENDPOINT,
};
use serde_json::{Value, json};
use tests::{
    bpf::{PinRoot, load, tc, test_run_tc},
    datapath::{write_endpoint, write_identity, write_policy},
    netns::NetNs,
    packet::{self, ACK, PSH, SYN, TCP},
};

use tests::bench_net::median;

use crate::Sizes;

/// The empty tc program of the `bench` variant.
const EMPTY: &str = "wt_empty";
const TC_ACT_OK: u32 = 0;
const TC_ACT_SHOT: u32 = 2;
/// The measured endpoint sits on the namespace's loopback (ifindex 1: no ctx needed).
const LOOPBACK: u32 = 1;
const EP_ID: u32 = 1;
const EP_ADDR: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 1);
const PEER_IDENTITY: u32 = 777;
const ALLOWED_PORT: u16 = 80;
const DENIED_PORT: u16 = 81;

fn peer(n: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 2, 0, 1 + u8::try_from(n).expect("few peers"))
}

fn frame(flow: usize, dport: u16, flags: u8) -> Vec<u8> {
    let sport = 1024 + u16::try_from(flow % 60_000).expect("fits");
    packet::eth(
        packet::ETH_P_IP,
        &packet::ipv4(
            EP_ADDR.octets(),
            peer(flow / 60_000).octets(),
            TCP,
            &packet::tcp(sport, dport, flags),
        ),
    )
}

fn ns(d: std::time::Duration) -> f64 {
    d.as_nanos() as f64
}

/// Median per-run ns of `runs` runs of `repeat` repeats.
fn repeated(
    ebpf: &mut Ebpf,
    program: &str,
    data: &[u8],
    repeat: u32,
    runs: usize,
    expect: u32,
) -> f64 {
    let prog = tc(ebpf, program);
    let mut samples: Vec<f64> = (0..runs)
        .map(|_| {
            let r = test_run_tc(prog, data, None, repeat);
            assert_eq!(r.return_value, expect, "{program}: unexpected verdict");
            ns(r.duration)
        })
        .collect();
    median(&mut samples)
}

/// Median kernel-reported ns over distinct packets, each run once.
fn distinct(ebpf: &mut Ebpf, program: &str, frames: &[Vec<u8>], expect: u32) -> f64 {
    let prog = tc(ebpf, program);
    let mut samples: Vec<f64> = frames
        .iter()
        .map(|f| {
            let r = test_run_tc(prog, f, None, 1);
            assert_eq!(r.return_value, expect, "{program}: unexpected verdict");
            ns(r.duration)
        })
        .collect();
    median(&mut samples)
}

fn fill_conntrack(ebpf: &mut Ebpf, entries: u32) {
    let mut ct: HashMap<&mut MapData, Ct4Key, CtEntry> =
        HashMap::try_from(ebpf.map_mut(maps::CT4).expect("ct4")).expect("lru");
    for i in 0..entries {
        let key = Ct4Key {
            addr_a: [10, 9, (i >> 8) as u8, i as u8],
            addr_b: [10, 10, 0, 1],
            port_a: (i >> 16) as u16 + 1,
            port_b: 443,
            protocol: TCP,
            _pad: [0; 3],
        };
        ct.insert(&key, &CtEntry::default(), 0)
            .expect("fill conntrack");
    }
}

/// Forgets the allowed new flows a configuration recorded, so every configuration runs with the
/// same conntrack occupancy (the 100,000 entries the method asks for, plus its own flows): without
/// this, later configurations walk fuller hash chains and flatness measures run order, not scale.
fn forget_flows(ebpf: &mut Ebpf, flows: std::ops::Range<usize>) {
    let mut ct: HashMap<&mut MapData, Ct4Key, CtEntry> =
        HashMap::try_from(ebpf.map_mut(maps::CT4).expect("ct4")).expect("lru");
    for f in flows {
        // The endpoint's address sorts below every peer's: it is the key's `a` end.
        let key = Ct4Key {
            addr_a: EP_ADDR.octets(),
            addr_b: peer(f / 60_000).octets(),
            port_a: 1024 + u16::try_from(f % 60_000).expect("fits"),
            port_b: ALLOWED_PORT,
            protocol: TCP,
            _pad: [0; 3],
        };
        ct.remove(&key).expect("a recorded new flow");
    }
}

/// Endpoints `0..count`: the measured one on loopback plus others on interfaces that do not exist.
fn add_endpoints(ebpf: &mut Ebpf, from: u32, count: u32) {
    for i in from..count {
        let (ifindex, addr) = if i == 0 {
            (LOOPBACK, EP_ADDR)
        } else {
            (100_000 + i, Ipv4Addr::new(10, 3, (i >> 8) as u8, i as u8))
        };
        let info = EndpointInfo {
            endpoint_id: EP_ID + i,
            identity: 10_000 + i,
            flags: FLAG_ISOLATED_INGRESS | FLAG_ISOLATED_EGRESS,
            ipv4: [addr.octets(), [0; 4]],
            ..EndpointInfo::default()
        };
        write_endpoint(ebpf, ifindex, &info);
        write_identity(ebpf, addr.into(), 10_000 + i);
    }
}

/// Exactly `count` policy entries over `endpoints` endpoints; one allows the measured flow.
fn set_policy(ebpf: &mut Ebpf, endpoints: u32, count: u32) {
    {
        let mut m: HashMap<&mut MapData, PolicyKey, PolicyValue> =
            HashMap::try_from(ebpf.map_mut(maps::POLICY).expect("policy")).expect("hash");
        let keys: Vec<PolicyKey> = m.keys().filter_map(Result::ok).collect();
        for key in keys {
            m.remove(&key).expect("clear policy");
        }
    }
    let allow = PolicyValue::new(VERDICT_ALLOW, 1);
    let measured = PolicyKey {
        endpoint_id: EP_ID,
        peer_identity: PEER_IDENTITY,
        port: ALLOWED_PORT,
        protocol: TCP,
        direction: EGRESS,
    };
    write_policy(ebpf, &measured, &allow);
    for k in 1..count {
        let key = PolicyKey {
            endpoint_id: EP_ID + k % endpoints,
            peer_identity: 20_000 + k / 1_000,
            port: 1_000 + (k % 1_000) as u16,
            protocol: TCP,
            direction: if k % 2 == 0 { EGRESS } else { INGRESS },
        };
        write_policy(ebpf, &key, &allow);
    }
}

pub fn run(object: &[u8], s: Sizes, figures: &mut BTreeMap<String, Value>) -> Result<()> {
    let root = PinRoot::new();
    let netns = NetNs::new();
    let mut ebpf = load(object, &root);
    for n in 0..=s.flows * s.endpoints.len() * s.policies.len() * 2 / 60_000 {
        write_identity(&mut ebpf, peer(n).into(), PEER_IDENTITY);
    }
    eprintln!(
        "datapath-bench: filling conntrack with {} entries",
        s.ct_entries
    );
    fill_conntrack(&mut ebpf, s.ct_entries);
    let mut next_flow = 0usize;
    let results = netns.run(|| {
        // An established flow (its first run records it in conntrack; the median ignores that).
        let established = packet::eth(
            packet::ETH_P_IP,
            &packet::ipv4(
                EP_ADDR.octets(),
                peer(0).octets(),
                TCP,
                &packet::tcp(999, ALLOWED_PORT, ACK | PSH),
            ),
        );
        let floor = repeated(&mut ebpf, EMPTY, &established, s.repeat, s.runs, TC_ACT_OK);
        let floor_frames: Vec<Vec<u8>> =
            (0..s.flows).map(|f| frame(f, ALLOWED_PORT, SYN)).collect();
        let new_flow_floor = distinct(&mut ebpf, EMPTY, &floor_frames, TC_ACT_OK);
        let mut rows = Vec::new();
        let mut have = 0;
        for &endpoints in s.endpoints {
            add_endpoints(&mut ebpf, have, endpoints);
            have = endpoints;
            for &policies in s.policies {
                eprintln!("datapath-bench: {endpoints} endpoints, {policies} policy entries");
                set_policy(&mut ebpf, endpoints, policies);
                let est = repeated(
                    &mut ebpf,
                    FROM_ENDPOINT,
                    &established,
                    s.repeat,
                    s.runs,
                    TC_ACT_OK,
                );
                let new: Vec<Vec<u8>> = (next_flow..next_flow + s.flows)
                    .map(|f| frame(f, ALLOWED_PORT, SYN))
                    .collect();
                next_flow += s.flows;
                let new_ns = distinct(&mut ebpf, FROM_ENDPOINT, &new, TC_ACT_OK);
                forget_flows(&mut ebpf, next_flow - s.flows..next_flow);
                let denied: Vec<Vec<u8>> = (next_flow..next_flow + s.flows)
                    .map(|f| frame(f, DENIED_PORT, SYN))
                    .collect();
                next_flow += s.flows;
                let denied_ns = distinct(&mut ebpf, FROM_ENDPOINT, &denied, TC_ACT_SHOT);
                rows.push((endpoints, policies, est, new_ns, denied_ns));
            }
        }
        (floor, new_flow_floor, rows)
    });
    let (floor, new_flow_floor, rows) = results;
    figures.insert("floor_ns".into(), json!(floor));
    figures.insert("new_flow_floor_ns".into(), json!(new_flow_floor));
    for (e, p, est, new, denied) in &rows {
        figures.insert(format!("established_ns_e{e}_p{p}"), json!(est));
        figures.insert(format!("new_flow_ns_e{e}_p{p}"), json!(new));
        figures.insert(format!("denied_ns_e{e}_p{p}"), json!(denied));
    }
    let (small, large) = (rows.first().expect("rows"), rows.last().expect("rows"));
    figures.insert("established_ns".into(), json!(large.2));
    figures.insert("new_flow_ns".into(), json!(large.3));
    figures.insert("denied_ns".into(), json!(large.4));
    figures.insert("established_ratio".into(), json!(large.2 / floor));
    figures.insert("new_flow_ratio".into(), json!(large.3 / new_flow_floor));
    let flatness = (large.2 / small.2).max(large.3 / small.3);
    figures.insert("flatness_ratio".into(), json!(flatness));
    figures.insert("ct_entries".into(), json!(s.ct_entries));
    Ok(())
}
