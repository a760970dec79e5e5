//! `cargo xtask bench attach`: tcx links vs clsact + `cls_bpf` direct-action filters for weir's
//! two endpoint programs, in one run, on fresh (down) veths in a test namespace, at 1 and 200
//! veths:
//! - attach: both programs onto each veth (tcx: two `BPF_LINK_CREATE` + pins; filter: the clsact
//!   qdisc + two `RTM_NEWTFILTER`), through the helper the agent and weir-cni use;
//! - replace: both programs swapped for a second load of the object (tcx: `bpf_link_update`
//!   through the pin; filter: `RTM_NEWTFILTER` on the same priority and handle);
//! - delete: `RTM_DELLINK` of each veth, beside veths with nothing attached (the baseline).
//!
//! Per veth p50 and the total for the batch; prints a table and writes the JSON given by `--out`.

use std::{
    collections::BTreeMap,
    os::fd::{AsFd as _, AsRawFd as _},
    time::Instant,
};

use agent::attach::{Mechanism, filter::Tc};
use anyhow::{Context as _, Result, bail};
use aya::{
    Ebpf,
    programs::{SchedClassifier, TcAttachType},
};
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::{RouteNetlinkMessage, link::LinkMessage};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};
use tests::{
    bpf::{PinRoot, load_weir, tc},
    netns::NetNs,
};

const HOOKS: [(&str, TcAttachType); 2] = [
    (maps_schema::programs::FROM_ENDPOINT, TcAttachType::Ingress),
    (maps_schema::programs::TO_ENDPOINT, TcAttachType::Egress),
];

fn veth_name(i: usize) -> String {
    format!("wtb{:04x}h{i:03}", std::process::id() & 0xffff)
}

/// Creates `n` down veth pairs in `node` (both ends there); returns (name, ifindex).
fn create_veths(node: &NetNs, n: usize) -> Vec<(String, u32)> {
    let batch: String = (0..n)
        .map(|i| {
            let h = veth_name(i);
            format!(
                "link add {h} type veth peer name {}\n",
                h.replacen('h', "p", 1)
            )
        })
        .collect();
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), batch).expect("write batch");
    let out = node.exec(&["ip", "-batch", &file.path().display().to_string()]);
    assert!(
        out.status.success(),
        "ip -batch: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (0..n)
        .map(|i| {
            let name = veth_name(i);
            let idx = node.ifindex(&name);
            (name, idx)
        })
        .collect()
}

fn delete_link(sock: &Socket, ifindex: u32) -> Result<()> {
    let mut msg = LinkMessage::default();
    msg.header.index = ifindex;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_ACK;
    let mut packet = NetlinkMessage::new(
        header,
        NetlinkPayload::from(RouteNetlinkMessage::DelLink(msg)),
    );
    packet.finalize();
    let mut buf = vec![0; packet.buffer_len()];
    packet.serialize(&mut buf);
    sock.send(&buf, 0)?;
    loop {
        let (data, _) = sock.recv_from_full()?;
        let answer = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&data)?;
        if let NetlinkPayload::Error(e) = answer.payload {
            return match e.code {
                None => Ok(()),
                Some(code) => bail!("deleting link {ifindex}: errno {}", -code.get()),
            };
        }
    }
}

fn route_socket() -> Result<Socket> {
    let mut sock = Socket::new(NETLINK_ROUTE)?;
    sock.bind_auto()?;
    sock.connect(&SocketAddr::new(0, 0))?;
    sock.set_cap_ack(true)?;
    Ok(sock)
}

/// Per-veth durations in ms.
#[derive(Default)]
struct Lap(Vec<f64>);

impl Lap {
    fn time<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let v = f();
        self.0.push(start.elapsed().as_secs_f64() * 1e3);
        v
    }
    fn p50(&self) -> f64 {
        let mut v = self.0.clone();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    }
    fn total(&self) -> f64 {
        self.0.iter().sum()
    }
}

fn attach(
    mechanism: Mechanism,
    ebpf: &mut Ebpf,
    paths: &agent::paths::Paths,
    nl: &mut Tc,
    (ifname, ifindex): &(String, u32),
) -> Result<()> {
    match mechanism {
        Mechanism::Filter => {
            nl.add_clsact(*ifindex)?;
            for (name, hook) in HOOKS {
                let fd = tc(ebpf, name).fd()?.as_fd().as_raw_fd();
                nl.set_filter(*ifindex, hook, fd, name)?;
            }
        }
        Mechanism::Tcx => {
            for (name, hook) in HOOKS {
                agent::attach::attach_tc(
                    tc(ebpf, name),
                    name,
                    ifname,
                    hook,
                    &paths.link_pin(ifname, name),
                )?;
            }
        }
    }
    Ok(())
}

fn attached(
    mechanism: Mechanism,
    nl: &mut Tc,
    paths: &agent::paths::Paths,
    (ifname, ifindex): &(String, u32),
    hook: TcAttachType,
    name: &str,
) -> Result<u32> {
    Ok(match mechanism {
        Mechanism::Filter => nl
            .bpf_filters(*ifindex, hook)?
            .into_iter()
            .find(agent::attach::filter::BpfFilter::is_weir_slot)
            .map(|f| f.program_id)
            .context("no filter")?,
        Mechanism::Tcx => {
            let id = agent::attach::pinned_link_program(&paths.link_pin(ifname, name))
                .context("no link")?;
            anyhow::ensure!(
                agent::attach::tcx::tcx_programs(*ifindex, hook).contains(&id),
                "link not live"
            );
            id
        }
    })
}

fn program_id(p: &SchedClassifier) -> Result<u32> {
    Ok(p.info()?.id())
}

fn run_one(
    mechanism: Option<Mechanism>,
    n: usize,
    node: &NetNs,
    figures: &mut BTreeMap<String, f64>,
) -> Result<()> {
    let root = PinRoot::new();
    let paths = root.paths();
    std::fs::create_dir_all(paths.links_dir())?;
    let mut first = load_weir(&root);
    let mut second = load_weir(&root);
    let veths = create_veths(node, n);
    let label = mechanism.map_or("none", Mechanism::as_str);
    let (mut attach_lap, mut replace_lap, mut delete_lap) =
        (Lap::default(), Lap::default(), Lap::default());
    node.run(|| -> Result<()> {
        let mut nl = Tc::open()?;
        if let Some(m) = mechanism {
            for v in &veths {
                attach_lap.time(|| attach(m, &mut first, &paths, &mut nl, v))?;
            }
            for v in &veths {
                replace_lap.time(|| attach(m, &mut second, &paths, &mut nl, v))?;
            }
            // The replacement took: every hook runs the second load's program.
            for v in &veths {
                for (name, hook) in HOOKS {
                    let id = attached(m, &mut nl, &paths, v, hook, name)?;
                    anyhow::ensure!(
                        id == program_id(tc(&mut second, name))?,
                        "{name} on {} was not replaced",
                        v.0
                    );
                }
            }
        }
        let sock = route_socket()?;
        for (_, ifindex) in &veths {
            delete_lap.time(|| delete_link(&sock, *ifindex))?;
        }
        Ok(())
    })?;
    let key = |what: &str, stat: &str| format!("{label}_{what}_{n}_{stat}_ms");
    for (what, lap) in [
        ("attach", &attach_lap),
        ("replace", &replace_lap),
        ("delete", &delete_lap),
    ] {
        if lap.0.is_empty() {
            continue;
        }
        figures.insert(key(what, "p50"), round(lap.p50()));
        figures.insert(key(what, "total"), round(lap.total()));
    }
    Ok(())
}

fn round(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let out = args
        .iter()
        .position(|a| a == "--out")
        .and_then(|i| args.get(i + 1))
        .context("--out PATH is required")?;
    let smoke = args.iter().any(|a| a == "--smoke");
    let sizes: &[usize] = if smoke { &[1, 3] } else { &[1, 200] };
    let node = NetNs::new();
    let mut figures = BTreeMap::new();
    for &n in sizes {
        for mechanism in [Some(Mechanism::Filter), Some(Mechanism::Tcx), None] {
            run_one(mechanism, n, &node, &mut figures)?;
        }
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "attach benchmark (load average {})",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "{:<10} {:>6} {:>22} {:>22} {:>22}",
        "mechanism",
        "veths",
        "attach p50 / total ms",
        "replace p50 / total ms",
        "delete p50 / total ms"
    );
    for &n in sizes {
        for label in ["filter", "tcx", "none"] {
            let cell = |what: &str| {
                let p = figures.get(&format!("{label}_{what}_{n}_p50_ms"));
                let t = figures.get(&format!("{label}_{what}_{n}_total_ms"));
                match (p, t) {
                    (Some(p), Some(t)) => format!("{p:.2} / {t:.1}"),
                    _ => "-".to_owned(),
                }
            };
            println!(
                "{label:<10} {n:>6} {:>22} {:>22} {:>22}",
                cell("attach"),
                cell("replace"),
                cell("delete")
            );
        }
    }
    std::fs::write(out, serde_json::to_string(&figures)?)?;
    Ok(())
}
