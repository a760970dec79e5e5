//! Per-packet cost of `from_endpoint` through `BPF_PROG_TEST_RUN`: translated against plain
//! flows, established and new, at each Service count.
//!
//! Every figure is the median kernel-reported duration of single runs (`repeat` 1), each on a
//! fresh copy of the packet: with `repeat` > 1 the kernel runs the program again on the packet as
//! the previous run left it, so after the first run a translated packet is already addressed to
//! its backend and the repeats would measure the plain path. Plain and translated figures are
//! measured the same way, so their ratios compare like with like.

use std::{collections::BTreeMap, net::Ipv4Addr};

use anyhow::{Result, ensure};
use aya::Ebpf;
use maps_schema::{
    Backend4, Ct4Key, CtEntry, EndpointInfo, PolicyKey, PolicyValue, RevNat4, SlotKey, SlotValue,
    Svc4Key, Svc4Value, SvcCt4Entry, SvcCt4Key,
    endpoint::FLAG_ISOLATED_EGRESS,
    maps,
    policy::{EGRESS, VERDICT_ALLOW},
    programs::FROM_ENDPOINT,
    service::{MemberKey, MemberValue, SVC_BACKENDS4, SVC_MEMBERS, SVC_REVNAT4, SVC_SLOTS, SVC4},
    service_ct::SVC_CT4,
};
use serde_json::{Value, json};
use tests::{
    bench_net::median,
    bpf::{PinRoot, load, tc, test_run_tc, test_run_tc_out},
    csum,
    datapath::{write_endpoint, write_identity, write_policy},
    netns::NetNs,
    packet::{self, ACK, PSH, SYN, TCP},
    svc_maps::{Frontend, clear, write_service},
};

use crate::{PORT, Sizes, TARGET, filler_backend, vip};

const TC_ACT_OK: u32 = 0;
/// The client sits on the namespace's loopback (ifindex 1: no ctx needed).
const LOOPBACK: u32 = 1;
const CLIENT_ID: u32 = 1;
const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 1);
const BACKENDS: [Ipv4Addr; 2] = [Ipv4Addr::new(10, 2, 0, 1), Ipv4Addr::new(10, 2, 0, 2)];
const BACKEND_IDENTITY: u32 = 777;
/// The measured Service (the same one at every size; the others fill the maps).
const MEASURED_VIP: Ipv4Addr = Ipv4Addr::new(10, 95, 0, 10);
const MEASURED_ID: u32 = 1;
/// Client ports: the two established flows, then the plain and the translated new flows (apart,
/// so no translated flow lands on a plain flow's tuple).
const EST_PLAIN_PORT: u16 = 999;
const EST_SVC_PORT: u16 = 998;
const NEW_PLAIN_BASE: u16 = 10_000;
const NEW_SVC_BASE: u16 = 30_000;

fn frame(sport: u16, dst: Ipv4Addr, dport: u16, flags: u8) -> Vec<u8> {
    csum::with_checksums(packet::eth(
        packet::ETH_P_IP,
        &packet::ipv4(
            CLIENT.octets(),
            dst.octets(),
            TCP,
            &packet::tcp(sport, dport, flags),
        ),
    ))
}

/// Median kernel-reported ns of one run of each of `frames`.
fn singles(ebpf: &mut Ebpf, frames: &[Vec<u8>]) -> Result<f64> {
    let prog = tc(ebpf, FROM_ENDPOINT);
    let mut samples = Vec::with_capacity(frames.len());
    for f in frames {
        let r = test_run_tc(prog, f, None, 1);
        ensure!(
            r.return_value == TC_ACT_OK,
            "from_endpoint dropped a measured packet (verdict {})",
            r.return_value
        );
        samples.push(r.duration.as_nanos() as f64);
    }
    Ok(median(&mut samples))
}

/// Runs `f` once and returns the destination the program left in it.
fn destination(ebpf: &mut Ebpf, f: &[u8]) -> Result<(Ipv4Addr, u16)> {
    let prog = tc(ebpf, FROM_ENDPOINT);
    let mut out = vec![0u8; f.len() + 256];
    let r = test_run_tc_out(prog, f, None, 1, Some(&mut out));
    ensure!(r.return_value == TC_ACT_OK, "from_endpoint dropped {f:?}");
    let addr: [u8; 4] = out[30..34].try_into()?;
    Ok((addr.into(), u16::from_be_bytes([out[36], out[37]])))
}

fn measured_backends() -> Vec<(u32, Ipv4Addr, u16)> {
    vec![(1, BACKENDS[0], TARGET), (2, BACKENDS[1], TARGET)]
}

/// Exactly `count` Services: the measured one and `count - 1` fillers with two backends each.
fn set_services(ebpf: &mut Ebpf, count: u32) {
    clear::<Svc4Key, Svc4Value>(ebpf, SVC4);
    clear::<SlotKey, SlotValue>(ebpf, SVC_SLOTS);
    clear::<MemberKey, MemberValue>(ebpf, SVC_MEMBERS);
    clear::<u32, Backend4>(ebpf, SVC_BACKENDS4);
    clear::<u32, RevNat4>(ebpf, SVC_REVNAT4);
    let backends = measured_backends();
    write_service(
        ebpf,
        &Frontend {
            id: MEASURED_ID,
            vip: MEASURED_VIP,
            port: PORT,
            protocol: TCP,
            backends: &backends,
        },
    );
    for i in 0..count.saturating_sub(1) {
        let backends = [
            (10 + 2 * i, filler_backend(i, 0), TARGET),
            (11 + 2 * i, filler_backend(i, 1), TARGET),
        ];
        write_service(
            ebpf,
            &Frontend {
                id: 2 + i,
                vip: vip(i),
                port: PORT,
                protocol: TCP,
                backends: &backends,
            },
        );
    }
}

/// Every configuration starts with no flow recorded.
fn forget_flows(ebpf: &mut Ebpf) {
    clear::<Ct4Key, CtEntry>(ebpf, maps::CT4);
    clear::<SvcCt4Key, SvcCt4Entry>(ebpf, SVC_CT4);
}

/// (services, established plain, established translated, new plain, new translated).
type Row = (u32, f64, f64, f64, f64);

fn measure(ebpf: &mut Ebpf, s: Sizes, services: u32) -> Result<Row> {
    set_services(ebpf, services);
    forget_flows(ebpf);
    let flows = u16::try_from(s.flows)?;
    // The established flows: a SYN records each (and the translated one's backend).
    let plain_syn = frame(EST_PLAIN_PORT, BACKENDS[0], TARGET, SYN);
    ensure!(destination(ebpf, &plain_syn)? == (BACKENDS[0], TARGET));
    let svc_syn = frame(EST_SVC_PORT, MEASURED_VIP, PORT, SYN);
    let to = destination(ebpf, &svc_syn)?;
    ensure!(
        BACKENDS.contains(&to.0) && to.1 == TARGET,
        "a ClusterIP SYN left for {to:?}, not a backend: no translation"
    );
    let est_plain = vec![frame(EST_PLAIN_PORT, BACKENDS[0], TARGET, ACK | PSH); s.samples];
    let est_svc = vec![frame(EST_SVC_PORT, MEASURED_VIP, PORT, ACK | PSH); s.samples];
    ensure!(
        destination(ebpf, &est_svc[0])? == to,
        "an established translated flow changed backend"
    );
    let established = singles(ebpf, &est_plain)?;
    let translated_established = singles(ebpf, &est_svc)?;
    let new_plain: Vec<Vec<u8>> = (0..flows)
        .map(|f| frame(NEW_PLAIN_BASE + f, BACKENDS[0], TARGET, SYN))
        .collect();
    let new_svc: Vec<Vec<u8>> = (0..flows)
        .map(|f| frame(NEW_SVC_BASE + f, MEASURED_VIP, PORT, SYN))
        .collect();
    let new = singles(ebpf, &new_plain)?;
    let translated_new = singles(ebpf, &new_svc)?;
    Ok((
        services,
        established,
        translated_established,
        new,
        translated_new,
    ))
}

pub fn run(object: &[u8], s: Sizes, figures: &mut BTreeMap<String, Value>) -> Result<()> {
    let root = PinRoot::new();
    let netns = NetNs::new();
    let mut ebpf = load(object, &root);
    let info = EndpointInfo {
        endpoint_id: CLIENT_ID,
        identity: 10_000,
        flags: FLAG_ISOLATED_EGRESS,
        ipv4: [CLIENT.octets(), [0; 4]],
        ..EndpointInfo::default()
    };
    write_endpoint(&mut ebpf, LOOPBACK, &info);
    write_identity(&mut ebpf, CLIENT.into(), 10_000);
    for b in BACKENDS {
        write_identity(&mut ebpf, b.into(), BACKEND_IDENTITY);
    }
    // Egress policy judges the backend: both kinds of flow pass the same rule.
    let rule = PolicyKey {
        endpoint_id: CLIENT_ID,
        peer_identity: BACKEND_IDENTITY,
        port: TARGET,
        protocol: TCP,
        direction: EGRESS,
    };
    write_policy(&mut ebpf, &rule, &PolicyValue::new(VERDICT_ALLOW, 1));
    let mut rows = Vec::new();
    for &services in s.services {
        eprintln!("services-bench: testrun at {services} Services");
        rows.push(netns.run(|| measure(&mut ebpf, s, services))?);
    }
    for (n, est, tr_est, new, tr_new) in &rows {
        figures.insert(format!("established_ns_s{n}"), json!(est));
        figures.insert(format!("translated_established_ns_s{n}"), json!(tr_est));
        figures.insert(format!("new_ns_s{n}"), json!(new));
        figures.insert(format!("translated_new_ns_s{n}"), json!(tr_new));
    }
    let (Some(small), Some(large)) = (rows.first(), rows.last()) else {
        anyhow::bail!("no Service count to measure");
    };
    figures.insert("established_ns".into(), json!(large.1));
    figures.insert("translated_established_ns".into(), json!(large.2));
    figures.insert("new_ns".into(), json!(large.3));
    figures.insert("translated_new_ns".into(), json!(large.4));
    figures.insert("established_ratio".into(), json!(large.2 / large.1));
    figures.insert("new_ratio".into(), json!(large.4 / large.3));
    let flatness = (large.2 / small.2).max(large.4 / small.4);
    figures.insert("flatness_ratio".into(), json!(flatness));
    figures.insert("testrun_services_small".into(), json!(small.0));
    figures.insert("testrun_services_large".into(), json!(large.0));
    figures.insert("testrun_samples".into(), json!(s.samples));
    figures.insert("testrun_flows".into(), json!(s.flows));
    Ok(())
}
