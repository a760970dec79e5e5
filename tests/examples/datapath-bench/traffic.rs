//! Added per-packet cost on real UDP traffic between namespaces: no filtering, weir (tc programs on
//! the host-side veths, `traffic_endpoints` endpoints in the map), and the same policy as flat
//! per-endpoint iptables chains (Felix's old dispatch layout) with iptables-nft and
//! iptables-legacy. The sender is pinned to one CPU, so the forwarding path (veth, the node
//! namespace, the filter, veth) runs on it inside `sendto`: ns per packet = elapsed / packets.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    net::{Ipv4Addr, UdpSocket},
    time::Instant,
};

use anyhow::{Context as _, Result};
use aya::programs::TcAttachType;
use maps_schema::{
    EndpointInfo, PolicyKey, PolicyValue,
    endpoint::{FLAG_ISOLATED_EGRESS, FLAG_ISOLATED_INGRESS},
    policy::{EGRESS, INGRESS, VERDICT_ALLOW},
    programs::{FROM_ENDPOINT, TO_ENDPOINT},
};
use serde_json::{Value, json};
use tests::{
    bench_net::{feed, median, pin_cpu, plumb},
    bpf::{PinRoot, load, tc},
    datapath::{write_endpoint, write_identity, write_policy},
    netns::NetNs,
    packet::UDP,
};

use crate::Sizes;

const PORT: u16 = 5001;
const SENDER: usize = 0;
const RECEIVER: usize = 1;

fn pod_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 249, 0, 10 + u8::try_from(i).expect("two pods"))
}

/// ns per packet for `packets` datagrams sent from the sender pod to the receiver pod.
fn measure(tx: &UdpSocket, to: Ipv4Addr, packets: usize) -> f64 {
    let payload = [0u8; 18];
    let start = Instant::now();
    for _ in 0..packets {
        let _ = tx.send_to(&payload, (to, PORT));
    }
    start.elapsed().as_nanos() as f64 / packets as f64
}

/// The iptables-restore input: flat dispatch chains over `endpoints` interfaces (the two real
/// ones in the middle), per-endpoint chains holding the policy.
fn ruleset(endpoints: usize, host_if: &[String; 2]) -> String {
    let name = |i: usize| -> String {
        let mid = endpoints / 2;
        if i == mid {
            host_if[SENDER].clone()
        } else if i == mid + 1 {
            host_if[RECEIVER].clone()
        } else {
            format!("wtfake{i}")
        }
    };
    let mut r = String::from("*filter\n:INPUT ACCEPT\n:FORWARD ACCEPT\n:OUTPUT ACCEPT\n");
    r.push_str(":wt-from-dispatch -\n:wt-to-dispatch -\n");
    for i in 0..endpoints {
        let _ = writeln!(r, ":wt-fw-{i} -\n:wt-tw-{i} -");
    }
    r.push_str("-A FORWARD -j wt-from-dispatch\n-A FORWARD -j wt-to-dispatch\n");
    for i in 0..endpoints {
        let _ = writeln!(r, "-A wt-from-dispatch -i {} -g wt-fw-{i}", name(i));
    }
    for i in 0..endpoints {
        let _ = writeln!(r, "-A wt-to-dispatch -o {} -g wt-tw-{i}", name(i));
    }
    let (s, d) = (pod_ip(SENDER), pod_ip(RECEIVER));
    for i in 0..endpoints {
        // From-endpoint: anti-spoofing and egress policy; RETURN continues to the to-dispatch.
        let own = if name(i) == host_if[SENDER] {
            s
        } else {
            Ipv4Addr::new(10, 250, (i >> 8) as u8, i as u8)
        };
        let _ = writeln!(
            r,
            "-A wt-fw-{i} -m conntrack --ctstate ESTABLISHED,RELATED -j RETURN"
        );
        let _ = writeln!(r, "-A wt-fw-{i} ! -s {own} -j DROP");
        let _ = writeln!(r, "-A wt-fw-{i} -p udp -d {d} --dport {PORT} -j RETURN");
        let _ = writeln!(r, "-A wt-fw-{i} -j DROP");
        let _ = writeln!(
            r,
            "-A wt-tw-{i} -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT"
        );
        let _ = writeln!(r, "-A wt-tw-{i} -p udp -s {s} --dport {PORT} -j ACCEPT");
        let _ = writeln!(r, "-A wt-tw-{i} -j DROP");
    }
    r.push_str("COMMIT\n");
    r
}

fn restore(node: &NetNs, tool: &str, rules: &str) -> Result<()> {
    feed(node, tool, &[], rules)
}

const EMPTY_RULES: &str = "*filter\n:INPUT ACCEPT\n:FORWARD ACCEPT\n:OUTPUT ACCEPT\nCOMMIT\n";

pub fn run(object: &[u8], s: Sizes, figures: &mut BTreeMap<String, Value>) -> Result<()> {
    let root = PinRoot::new();
    let node = NetNs::new();
    let pods = [NetNs::new(), NetNs::new()];
    node.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    let links: Vec<(String, String)> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| plumb(&node, p, i, pod_ip(i)))
        .collect();
    let host_if = [links[SENDER].0.clone(), links[RECEIVER].0.clone()];
    let to = pod_ip(RECEIVER);
    let _rx = pods[RECEIVER].run(move || UdpSocket::bind((to, PORT)).expect("bind receiver"));
    let tx = pods[SENDER].run(|| UdpSocket::bind("0.0.0.0:0").expect("bind sender"));
    pin_cpu();
    // Warm up the path (neighbours, routes) before measuring.
    measure(&tx, to, 1_000);

    let mut ebpf = load(object, &root);
    let ids = [1u32, 2];
    for i in 0..s.traffic_endpoints as u32 {
        let (ifindex, addr, id) = if (i as usize) < 2 {
            (
                node.ifindex(&host_if[i as usize]),
                pod_ip(i as usize),
                ids[i as usize],
            )
        } else {
            (
                200_000 + i,
                Ipv4Addr::new(10, 250, (i >> 8) as u8, i as u8),
                100 + i,
            )
        };
        let info = EndpointInfo {
            endpoint_id: id,
            identity: 5_000 + id,
            flags: FLAG_ISOLATED_INGRESS | FLAG_ISOLATED_EGRESS,
            ipv4: [addr.octets(), [0; 4]],
            ..EndpointInfo::default()
        };
        write_endpoint(&mut ebpf, ifindex, &info);
        write_identity(&mut ebpf, addr.into(), 5_000 + id);
    }
    let allow = PolicyValue::new(VERDICT_ALLOW, 1);
    let rule = |endpoint_id, peer, direction| PolicyKey {
        endpoint_id,
        peer_identity: 5_000 + peer,
        port: PORT,
        protocol: UDP,
        direction,
    };
    write_policy(&mut ebpf, &rule(ids[0], ids[1], EGRESS), &allow);
    write_policy(&mut ebpf, &rule(ids[1], ids[0], INGRESS), &allow);

    // Variants are interleaved run by run, so drift of the machine spreads over all of them.
    let mut variants: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let packets = s.traffic_packets;
    let pins = root.path().join("links");
    let rules = ruleset(s.traffic_endpoints, &host_if);
    for run in 0..s.traffic_runs {
        eprintln!("datapath-bench: traffic run {}/{}", run + 1, s.traffic_runs);
        measure(&tx, to, 1_000);
        variants
            .entry("none")
            .or_default()
            .push(measure(&tx, to, packets));

        std::fs::create_dir_all(&pins)?;
        for (hook, program) in [
            (TcAttachType::Ingress, FROM_ENDPOINT),
            (TcAttachType::Egress, TO_ENDPOINT),
        ] {
            let prog = tc(&mut ebpf, program);
            for ifname in &host_if {
                let pin = pins.join(format!("{ifname}_{program}"));
                node.run(|| agent::attach::attach_tc(prog, program, ifname, hook, &pin))
                    .with_context(|| format!("attach {program} to {ifname}"))?;
            }
        }
        measure(&tx, to, 1_000);
        variants
            .entry("weir")
            .or_default()
            .push(measure(&tx, to, packets));
        // Unpinning the links detaches the programs.
        std::fs::remove_dir_all(&pins)?;

        for (variant, tool) in [
            ("iptables_nft", "iptables-nft-restore"),
            ("iptables_legacy", "iptables-legacy-restore"),
        ] {
            restore(&node, tool, &rules)?;
            measure(&tx, to, 1_000);
            variants
                .entry(variant)
                .or_default()
                .push(measure(&tx, to, packets));
            restore(&node, tool, EMPTY_RULES)?;
        }
    }

    let none = median(&mut variants["none"].clone());
    let floor = figures
        .get("floor_ns")
        .and_then(Value::as_f64)
        .unwrap_or(0.0);
    for (variant, samples) in &variants {
        let mut sorted = samples.clone();
        let m = median(&mut sorted);
        figures.insert(format!("traffic_{variant}_ns"), json!(m));
        figures.insert(format!("traffic_{variant}_min_ns"), json!(sorted[0]));
        figures.insert(
            format!("traffic_{variant}_max_ns"),
            json!(sorted[sorted.len() - 1]),
        );
        if *variant != "none" {
            let mut added = m - none;
            if *variant == "weir" {
                // Below the floor is below what this method can see.
                added = added.max(floor);
            }
            figures.insert(format!("{variant}_added_ns"), json!(added));
        }
    }
    let weir = figures["weir_added_ns"].as_f64().unwrap_or(1.0);
    let nft = figures["iptables_nft_added_ns"].as_f64().unwrap_or(0.0);
    figures.insert("iptables_nft_over_weir".into(), json!(nft / weir));
    // The same ratio run by run (each run measured every variant in turn): its median and spread.
    let mut per_run: Vec<f64> = (0..s.traffic_runs)
        .map(|r| {
            let none = variants["none"][r];
            let weir = (variants["weir"][r] - none).max(floor);
            (variants["iptables_nft"][r] - none) / weir
        })
        .collect();
    per_run.sort_by(f64::total_cmp);
    if let (Some(min), Some(max)) = (per_run.first().copied(), per_run.last().copied()) {
        figures.insert(
            "iptables_nft_over_weir_per_run".into(),
            json!(median(&mut per_run)),
        );
        figures.insert("iptables_nft_over_weir_per_run_min".into(), json!(min));
        figures.insert("iptables_nft_over_weir_per_run_max".into(), json!(max));
    }
    figures.insert("traffic_endpoints".into(), json!(s.traffic_endpoints));
    figures.insert("traffic_packets_per_run".into(), json!(packets));
    figures.insert("traffic_runs".into(), json!(s.traffic_runs));
    Ok(())
}
