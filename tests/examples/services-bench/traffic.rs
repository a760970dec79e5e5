//! Added per-packet cost of Service translation on real UDP traffic between namespaces: a sender
//! pod sends to a middle Service's ClusterIP (so kube-proxy's iptables chain walk is the average
//! one), each packet a new flow (its own source port: established flows skip kube-proxy's nat
//! chains, and a new flow is where the layouts differ); the baseline is the same packets sent
//! straight to the backend with no translation and no rules. Variants, interleaved run by run:
//! - weir: `from_endpoint` and `to_endpoint` on the pods' host-side veths, the Services in its
//!   maps, its flows forgotten before each run;
//! - kube-proxy's iptables-mode layout (`iptables-nft-restore`) and its nftables-mode layout
//!   (`nft -f`), each loaded into the node namespace and removed again (`nft flush ruleset` there)
//!   after its run; conntrack's UDP timeout is 1 s in that namespace and each run waits it out, so
//!   every run's flows are new to the kernel too.
//!
//! - weir straight to the backend: the same programs and maps, the packets of the baseline (what
//!   weir's own datapath costs a new flow without a Service).
//!
//! Two figures for weir: its whole datapath's added cost (weir over the baseline: both programs,
//! conntrack and policy besides the translation, `weir_added_*`), and the Service's alone (weir to
//! the ClusterIP over weir straight to the backend, `weir_service_added_*`), which is what
//! kube-proxy's layouts add on top of a node's CNI.
//!
//! weir's added cost is at least its program's test-run cost for a new translated flow (below it
//! is below what this method resolves; the raw figure is kept). The sender is pinned to one CPU
//! and sends from a raw socket (the packets are built before the clock starts), so the forwarding
//! path runs on it inside `sendto`: ns/packet = elapsed/packets.

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, UdpSocket},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use aya::{Ebpf, programs::TcAttachType};
use maps_schema::{
    Backend4, Ct4Key, CtEntry, EndpointInfo, RevNat4, SlotKey, SlotValue, Svc4Key, Svc4Value,
    SvcCt4Entry, SvcCt4Key, maps,
    programs::{FROM_ENDPOINT, TO_ENDPOINT},
    service::{MemberKey, MemberValue, SVC_BACKENDS4, SVC_MEMBERS, SVC_REVNAT4, SVC_SLOTS, SVC4},
    service_ct::SVC_CT4,
};
use serde_json::{Value, json};
use tests::{
    bench_net::{feed, median, pin_cpu, plumb},
    bpf::{PinRoot, load, tc},
    csum,
    datapath::{write_endpoint, write_identity},
    netns::NetNs,
    packet::{self, UDP},
    svc_maps::{Frontend, clear, write_service},
};

use crate::{PORT, Sizes, TARGET, filler_backend, rules, vip};

const SENDER: usize = 0;
const RECEIVER: usize = 1;
/// Source ports of the warm-up packets and of the measured ones.
const WARM_BASE: u16 = 1_000;
const WARM: u16 = 1_000;
const MEASURED_BASE: u16 = 10_000;
/// conntrack's UDP timeout in the node namespace, and the wait that outlasts it.
const CT_UDP_TIMEOUT: &str = "1";
const CT_WAIT: Duration = Duration::from_millis(1_500);

fn pod_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 249, 0, 10 + u8::try_from(i).expect("two pods"))
}

/// IPv4/UDP packets from the sender, one per source port `base..base + count`.
fn packets(base: u16, count: u16, dst: Ipv4Addr, dport: u16) -> Vec<Vec<u8>> {
    (0..count)
        .map(|i| {
            let f = csum::with_checksums(packet::eth(
                packet::ETH_P_IP,
                &packet::ipv4(
                    pod_ip(SENDER).octets(),
                    dst.octets(),
                    UDP,
                    &packet::udp(base + i, dport),
                ),
            ));
            f[14..].to_vec()
        })
        .collect()
}

/// A raw IPv4 socket (the packets carry their own headers), opened in the calling thread's
/// namespace.
fn raw_socket() -> Result<OwnedFd> {
    // SAFETY: plain socket(2); the descriptor is owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
    if fd < 0 {
        bail!("raw socket: {}", std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// ns per packet for sending `packets` to `dst` from `fd`.
fn send(fd: &OwnedFd, dst: Ipv4Addr, packets: &[Vec<u8>]) -> f64 {
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(dst.octets()),
        },
        sin_zero: [0; 8],
    };
    let start = Instant::now();
    for p in packets {
        // SAFETY: `p` and `addr` outlive the call; a failed send is only a lost packet.
        unsafe {
            libc::sendto(
                fd.as_raw_fd(),
                p.as_ptr().cast(),
                p.len(),
                0,
                (&raw const addr).cast(),
                size_of::<libc::sockaddr_in>() as libc::socklen_t,
            );
        }
    }
    start.elapsed().as_nanos() as f64 / packets.len() as f64
}

/// How many datagrams the receiver got since the last call (its buffer holds a few hundred).
fn delivered(rx: &UdpSocket) -> usize {
    let mut buf = [0u8; 64];
    let mut n = 0;
    while rx.recv(&mut buf).is_ok() {
        n += 1;
    }
    n
}

/// The pods' traffic and the node namespace the variants are loaded into.
struct Lab {
    node: NetNs,
    _pods: [NetNs; 2],
    host_if: [String; 2],
    tx: OwnedFd,
    rx: UdpSocket,
}

impl Lab {
    fn new() -> Result<Self> {
        let node = NetNs::new();
        let pods = [NetNs::new(), NetNs::new()];
        node.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        let links: Vec<(String, String)> = pods
            .iter()
            .enumerate()
            .map(|(i, p)| plumb(&node, p, i, pod_ip(i)))
            .collect();
        let host_if = [links[SENDER].0.clone(), links[RECEIVER].0.clone()];
        let backend = pod_ip(RECEIVER);
        let rx = pods[RECEIVER].run(move || UdpSocket::bind((backend, TARGET)))?;
        rx.set_nonblocking(true)?;
        let tx = pods[SENDER].run(raw_socket)?;
        // kube-proxy's rules need conntrack; new flows only, run after run.
        node.exec(&[
            "sysctl",
            "-qw",
            &format!("net.netfilter.nf_conntrack_udp_timeout={CT_UDP_TIMEOUT}"),
        ]);
        Ok(Self {
            node,
            _pods: pods,
            host_if,
            tx,
            rx,
        })
    }

    /// Warm-up, then the measured packets; fails when none reached the backend.
    fn measure(
        &self,
        variant: &str,
        dst: Ipv4Addr,
        warm: &[Vec<u8>],
        measured: &[Vec<u8>],
    ) -> Result<f64> {
        send(&self.tx, dst, warm);
        delivered(&self.rx);
        let ns = send(&self.tx, dst, measured);
        ensure!(
            delivered(&self.rx) > 0,
            "{variant}: no packet reached the backend"
        );
        Ok(ns)
    }
}

/// The pods as weir endpoints (not isolated: kube-proxy applies no policy either).
fn register(ebpf: &mut Ebpf, lab: &Lab) {
    for (i, ifname) in lab.host_if.iter().enumerate() {
        let id = 1 + u32::try_from(i).expect("two pods");
        let info = EndpointInfo {
            endpoint_id: id,
            identity: 5_000 + id,
            ipv4: [pod_ip(i).octets(), [0; 4]],
            ..EndpointInfo::default()
        };
        write_endpoint(ebpf, lab.node.ifindex(ifname), &info);
        write_identity(ebpf, pod_ip(i).into(), 5_000 + id);
    }
}

/// Exactly `count` UDP Services in weir's maps; Service `measured` has the receiver as its one
/// backend, the others two backends no pod has.
fn set_services(ebpf: &mut Ebpf, count: u32, measured: u32) {
    clear::<Svc4Key, Svc4Value>(ebpf, SVC4);
    clear::<SlotKey, SlotValue>(ebpf, SVC_SLOTS);
    clear::<MemberKey, MemberValue>(ebpf, SVC_MEMBERS);
    clear::<u32, Backend4>(ebpf, SVC_BACKENDS4);
    clear::<u32, RevNat4>(ebpf, SVC_REVNAT4);
    for i in 0..count {
        let backends = if i == measured {
            vec![(1, pod_ip(RECEIVER), TARGET)]
        } else {
            vec![
                (10 + 2 * i, filler_backend(i, 0), TARGET),
                (11 + 2 * i, filler_backend(i, 1), TARGET),
            ]
        };
        write_service(
            ebpf,
            &Frontend {
                id: 1 + i,
                vip: vip(i),
                port: PORT,
                protocol: UDP,
                backends: &backends,
            },
        );
    }
}

fn forget_flows(ebpf: &mut Ebpf) {
    clear::<Ct4Key, CtEntry>(ebpf, maps::CT4);
    clear::<SvcCt4Key, SvcCt4Entry>(ebpf, SVC_CT4);
}

/// One weir run: attach, measure, detach (unpinning the links detaches the programs).
fn weir_run(
    ebpf: &mut Ebpf,
    lab: &Lab,
    root: &PinRoot,
    dst: Ipv4Addr,
    warm: &[Vec<u8>],
    measured: &[Vec<u8>],
) -> Result<f64> {
    let pins = root.path().join("links");
    std::fs::create_dir_all(&pins)?;
    for (hook, program, ifname) in [
        (TcAttachType::Ingress, FROM_ENDPOINT, &lab.host_if[SENDER]),
        (TcAttachType::Egress, TO_ENDPOINT, &lab.host_if[RECEIVER]),
    ] {
        let prog = tc(ebpf, program);
        let pin = pins.join(format!("{ifname}_{program}"));
        lab.node
            .run(|| agent::attach::attach_tc(prog, program, ifname, hook, &pin))
            .with_context(|| format!("attach {program} to {ifname}"))?;
    }
    forget_flows(ebpf);
    send(&lab.tx, dst, warm);
    forget_flows(ebpf);
    delivered(&lab.rx);
    let ns = send(&lab.tx, dst, measured);
    let got = delivered(&lab.rx);
    std::fs::remove_dir_all(&pins)?;
    ensure!(got > 0, "weir: no packet reached the backend");
    Ok(ns)
}

/// One kube-proxy run: load the layout with `tool`, measure, remove every table again.
fn kube_proxy_run(
    lab: &Lab,
    variant: &str,
    load: impl Fn(&NetNs) -> Result<()>,
    dst: Ipv4Addr,
    warm: &[Vec<u8>],
    measured: &[Vec<u8>],
) -> Result<f64> {
    load(&lab.node).with_context(|| format!("loading the {variant} layout"))?;
    let ns = lab.measure(variant, dst, warm, measured);
    lab.node.exec(&["nft", "flush", "ruleset"]);
    // The flows of this run expire before the next one that uses conntrack.
    std::thread::sleep(CT_WAIT);
    ns
}

pub fn run(object: &[u8], s: Sizes, figures: &mut BTreeMap<String, Value>) -> Result<()> {
    let root = PinRoot::new();
    let lab = Lab::new()?;
    pin_cpu();
    let mut ebpf = load(object, &root);
    register(&mut ebpf, &lab);
    let count = u16::try_from(s.traffic_packets)?;
    ensure!(
        u32::from(MEASURED_BASE) + u32::from(count) <= 65_535,
        "at most {} packets per run (one source port each)",
        65_535 - MEASURED_BASE
    );
    let backend = pod_ip(RECEIVER);
    let direct_warm = packets(WARM_BASE, WARM, backend, TARGET);
    let direct = packets(MEASURED_BASE, count, backend, TARGET);
    let mut sizes = Vec::new();
    for &n in s.traffic_services {
        let measured = n / 2;
        let to = vip(measured);
        eprintln!("services-bench: traffic at {n} Services (measured: {to}, Service {measured})");
        set_services(&mut ebpf, n, measured);
        let ipt = rules::iptables(n, measured, backend);
        let nft = rules::nft(n, measured, backend);
        let warm = packets(WARM_BASE, WARM, to, PORT);
        let svc = packets(MEASURED_BASE, count, to, PORT);
        let mut variants: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        for run in 0..s.traffic_runs {
            eprintln!("services-bench: traffic run {}/{}", run + 1, s.traffic_runs);
            let none = lab.measure("none", backend, &direct_warm, &direct)?;
            variants.entry("none").or_default().push(none);
            let weir_direct = weir_run(&mut ebpf, &lab, &root, backend, &direct_warm, &direct)?;
            variants.entry("weir_direct").or_default().push(weir_direct);
            let weir = weir_run(&mut ebpf, &lab, &root, to, &warm, &svc)?;
            variants.entry("weir").or_default().push(weir);
            let iptables = kube_proxy_run(
                &lab,
                "iptables",
                |ns| feed(ns, "iptables-nft-restore", &[], &ipt),
                to,
                &warm,
                &svc,
            )?;
            variants.entry("iptables").or_default().push(iptables);
            let nft_ns = kube_proxy_run(
                &lab,
                "nft",
                |ns| feed(ns, "nft", &["-f", "-"], &nft),
                to,
                &warm,
                &svc,
            )?;
            variants.entry("nft").or_default().push(nft_ns);
        }
        let none = median(&mut variants["none"].clone());
        for (variant, samples) in &variants {
            let mut sorted = samples.clone();
            let m = median(&mut sorted);
            figures.insert(format!("traffic_{variant}_ns_s{n}"), json!(m));
            figures.insert(format!("traffic_{variant}_min_ns_s{n}"), json!(sorted[0]));
            figures.insert(
                format!("traffic_{variant}_max_ns_s{n}"),
                json!(sorted[sorted.len() - 1]),
            );
            if *variant == "weir" {
                // Below the program's own kernel-measured cost (a new translated flow, from the
                // testrun part) is below what this method can see: that cost stands in.
                figures.insert(format!("weir_added_raw_ns_s{n}"), json!(m - none));
                let floor = figures
                    .get("translated_new_ns")
                    .and_then(Value::as_f64)
                    .unwrap_or(f64::MIN);
                figures.insert(format!("weir_added_ns_s{n}"), json!((m - none).max(floor)));
            } else if *variant != "none" {
                figures.insert(format!("{variant}_added_ns_s{n}"), json!(m - none));
            }
        }
        // The ratios run by run (each run measured every variant in turn): median, min, max.
        let weir_floor = figures
            .get("translated_new_ns")
            .and_then(Value::as_f64)
            .unwrap_or(f64::MIN);
        for peer in ["iptables", "nft"] {
            let mut per_run: Vec<f64> = (0..s.traffic_runs)
                .map(|r| {
                    let none = variants["none"][r];
                    (variants[peer][r] - none) / (variants["weir"][r] - none).max(weir_floor)
                })
                .collect();
            per_run.sort_by(f64::total_cmp);
            if let (Some(&min), Some(&max)) = (per_run.first(), per_run.last()) {
                let key = format!("{peer}_over_weir_per_run");
                figures.insert(format!("{key}_s{n}"), json!(median(&mut per_run)));
                figures.insert(format!("{key}_min_s{n}"), json!(min));
                figures.insert(format!("{key}_max_s{n}"), json!(max));
            }
        }
        // What the Service costs weir over its own datapath: the same flows through the same
        // programs, to the ClusterIP against straight to the backend. Its floor is the test-run
        // difference of a new translated flow over a new plain one.
        let weir_direct = median(&mut variants["weir_direct"].clone());
        let weir = median(&mut variants["weir"].clone());
        figures.insert(
            format!("weir_service_added_raw_ns_s{n}"),
            json!(weir - weir_direct),
        );
        let get = |k: &str| figures.get(k).and_then(Value::as_f64);
        let floor = match (get("translated_new_ns"), get("new_ns")) {
            (Some(t), Some(p)) => t - p,
            _ => f64::MIN,
        };
        figures.insert(
            format!("weir_service_added_ns_s{n}"),
            json!((weir - weir_direct).max(floor)),
        );
        sizes.push(n);
    }
    let (Some(small), Some(large)) = (sizes.first(), sizes.last()) else {
        bail!("no Service count for traffic");
    };
    // The names: the smaller size as `_1k`, the larger as `_10k` (smoke sizes are smaller;
    // `traffic_services_*` says which).
    for (suffix, n) in [("1k", small), ("10k", large)] {
        for key in [
            "weir_added",
            "weir_added_raw",
            "weir_direct_added",
            "weir_service_added",
            "weir_service_added_raw",
            "iptables_added",
            "nft_added",
        ] {
            if let Some(v) = figures.get(&format!("{key}_ns_s{n}")).cloned() {
                figures.insert(format!("{key}_ns_{suffix}"), v);
            }
        }
    }
    for key in ["iptables_over_weir_per_run", "nft_over_weir_per_run"] {
        for stat in ["", "_min", "_max"] {
            if let Some(v) = figures.get(&format!("{key}{stat}_s{large}")).cloned() {
                figures.insert(format!("{key}{stat}_10k"), v);
            }
        }
    }
    figures.insert("traffic_services_1k".into(), json!(small));
    figures.insert("traffic_services_10k".into(), json!(large));
    for (weir, suffix) in [
        ("weir_added_ns_10k", ""),
        ("weir_service_added_ns_10k", "_service"),
    ] {
        let get = |k: &str| figures.get(k).and_then(Value::as_f64);
        if let (Some(w), Some(i), Some(n)) = (
            get(weir),
            get("iptables_added_ns_10k"),
            get("nft_added_ns_10k"),
        ) {
            figures.insert(format!("iptables_over_weir{suffix}_10k"), json!(i / w));
            figures.insert(format!("nft_over_weir{suffix}_10k"), json!(n / w));
        }
    }
    figures.insert("traffic_packets_per_run".into(), json!(s.traffic_packets));
    figures.insert("traffic_runs".into(), json!(s.traffic_runs));
    Ok(())
}
