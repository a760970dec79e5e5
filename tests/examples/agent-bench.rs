//! `cargo xtask bench agent`: the agent's control-plane figures (issue 5's benchmark), measured on
//! the real kernel with the agent's own code:
//! - converge: from empty maps to N endpoints (map entries; 100 of them on real veths with both
//!   programs attached) and 10 × N policy entries, in process, through the dataplane loop as the
//!   agent runs it (`control::applier`): from the policy files' read until the loop publishes a
//!   ready snapshot after the link watcher's dump (every link, then `Synced`, as commands), so its
//!   batching is included. The links past the first 100 have made-up indexes and no veth: the
//!   attachment driver takes them as already attached (no kernel work), the real ones go through
//!   `TcLinks`;
//! - resync: the same over the now-populated kernel (a restart): time and kernel writes;
//! - RSS of this process after converging;
//! - with a real `weir agent`: new `weir*` link → both programs attached; policy file written →
//!   its entry in the kernel map; the longest gap in a live flow while the agent restarts;
//! - conntrack migration: 1,000,000 layout-1 entries (last seen over the past minute) in a pinned
//!   `ct4_v1`, converted to layout 2 by the agent's `migrate::prepare` (copy under the temporary
//!   pin, rename) and `migrate::finish` (delta merge, old pin removed); entries lost = source −
//!   target, counted in the kernel.
//!
//! Prints a table and writes the JSON given by `--out`.

use std::{
    collections::{HashMap, HashSet},
    io::Write as _,
    net::UdpSocket,
    path::PathBuf,
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use agent::{
    control::{
        applier::{self, Command as LoopCommand},
        node::Node,
    },
    dataplane::{
        attachments::{AttachDriver, Attacher, Hook},
        endpoints::EndpointsManager,
        map_driver::MapDriver,
        plane::Dataplane,
    },
    kernel::{
        KernelError, LinkEvent, PinnedHash, PinnedLpm,
        real::{programs::Programs, tc_links::TcLinks},
    },
};
use anyhow::{Context as _, Result};
use aya::programs::TcAttachType;
use serde_json::json;
use tests::{
    agent_proc::{AgentDirs, AgentProcess},
    bpf::PinRoot,
    netns::NetNs,
    pod::{GATEWAY, plumb, workload_name},
};

const REAL_VETHS: usize = 100;

/// The real attacher (`TcLinks`) for the real veths; every other link (a made-up index, no veth) is
/// taken as already running the current programs, so the driver does no kernel work for it.
struct RealVethsOnly {
    tc: TcLinks,
    real: HashSet<String>,
}

impl Attacher for RealVethsOnly {
    fn pinned(&self) -> Result<Vec<(String, String)>, KernelError> {
        self.tc.pinned()
    }
    fn has_pin(&self, ifname: &str, program: &str) -> bool {
        self.real.contains(ifname) && self.tc.has_pin(ifname, program)
    }
    fn hook(
        &mut self,
        ifname: &str,
        ifindex: u32,
        program: &str,
        hook: TcAttachType,
    ) -> Result<Hook, KernelError> {
        if self.real.contains(ifname) {
            return self.tc.hook(ifname, ifindex, program, hook);
        }
        Ok(Hook {
            ours: Some(self.tc.current(program)),
            leftovers: false,
        })
    }
    fn current(&self, program: &str) -> u32 {
        self.tc.current(program)
    }
    fn link_exists(&self, ifname: &str, ifindex: u32) -> bool {
        !self.real.contains(ifname) || self.tc.link_exists(ifname, ifindex)
    }
    fn attach(
        &mut self,
        ifname: &str,
        ifindex: u32,
        program: &str,
        hook: TcAttachType,
    ) -> Result<(), KernelError> {
        if self.real.contains(ifname) {
            return self.tc.attach(ifname, ifindex, program, hook);
        }
        Ok(())
    }
    fn update(
        &mut self,
        ifname: &str,
        ifindex: u32,
        program: &str,
        hook: TcAttachType,
    ) -> Result<(), KernelError> {
        if self.real.contains(ifname) {
            return self.tc.update(ifname, ifindex, program, hook);
        }
        Ok(())
    }
    fn sweep(
        &mut self,
        ifname: &str,
        ifindex: u32,
        program: &str,
        hook: TcAttachType,
    ) -> Result<u64, KernelError> {
        if self.real.contains(ifname) {
            return self.tc.sweep(ifname, ifindex, program, hook);
        }
        Ok(0)
    }
    fn unpin(&mut self, ifname: &str, program: &str) -> Result<(), KernelError> {
        if self.real.contains(ifname) {
            return self.tc.unpin(ifname, program);
        }
        Ok(())
    }
}

fn dataplane(paths: &agent::paths::Paths, real: HashSet<String>) -> Result<Dataplane> {
    use maps_schema::maps::{ENDPOINTS, IDENT4, IDENT6, IPCACHE4, IPCACHE6, POLICY};
    let programs = Programs::load(paths, agent::EBPF_OBJECT, &[])?;
    let pin = |n: &str| paths.map_pin(n);
    Ok(Dataplane {
        attachments: AttachDriver::new(Box::new(RealVethsOnly {
            tc: TcLinks::new(paths.clone(), programs, agent::attach::Mechanism::default())?,
            real,
        })),
        endpoints: MapDriver::new(Box::new(PinnedHash::open(ENDPOINTS, &pin(ENDPOINTS))?)),
        endpoints_manager: EndpointsManager::new(),
        ident4: MapDriver::new(Box::new(PinnedHash::open(IDENT4, &pin(IDENT4))?)),
        ident6: MapDriver::new(Box::new(PinnedHash::open(IDENT6, &pin(IDENT6))?)),
        ipcache4: MapDriver::new(Box::new(PinnedLpm::open(IPCACHE4, &pin(IPCACHE4))?)),
        ipcache6: MapDriver::new(Box::new(PinnedLpm::open(IPCACHE6, &pin(IPCACHE6))?)),
        policy: MapDriver::new(Box::new(PinnedHash::open(POLICY, &pin(POLICY))?)),
        services: agent::dataplane::services::ServiceMaps::open(paths)?,
    })
}

fn host_name(i: usize) -> String {
    format!("weir{:05x}{i:06x}", std::process::id() & 0xf_ffff)
}

/// Opens the node, starts the dataplane loop on it as the agent does, sends it every link (the real
/// veths' indexes, made-up ones for the rest) and `Synced` as the link watcher's first dump does,
/// and waits for the loop to publish a ready snapshot. Returns (seconds from the policy files'
/// read, kernel writes, the loop's handle and thread: stopping it drops the node).
fn converge(
    paths: &agent::paths::Paths,
    real: &[(String, u32)],
    endpoints: usize,
) -> Result<(f64, u64, applier::LoopHandle, std::thread::JoinHandle<()>)> {
    let started = Instant::now();
    let (policies, errors) = agent::calc::policy::load::load_dir(&paths.policy_dir);
    anyhow::ensure!(errors.is_empty(), "bench policy refused: {errors:?}");
    let dataplane = dataplane(paths, real.iter().map(|(n, _)| n.clone()).collect())?;
    eprintln!(
        "converge: policy files read, programs loaded: {:?}",
        started.elapsed()
    );
    let node = Node::open(paths, dataplane, policies, Vec::new())?;
    eprintln!("converge: node open: {:?}", started.elapsed());
    let (handle, thread) = applier::spawn(node)?;
    let made_up = (REAL_VETHS..endpoints)
        .map(|i| Ok((host_name(i), 1_000_000 + u32::try_from(i)?)))
        .collect::<Result<Vec<_>>>()?;
    for (ifname, ifindex) in real.iter().cloned().chain(made_up) {
        handle.send(LoopCommand::Link(LinkEvent::Up {
            ifname,
            ifindex,
            up: true,
        }))?;
    }
    handle.send(LoopCommand::Link(LinkEvent::Synced))?;
    eprintln!("converge: links sent: {:?}", started.elapsed());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()?;
    let mut rx = handle.subscribe();
    let ready = runtime.block_on(async {
        tokio::time::timeout(Duration::from_secs(300), rx.wait_for(|s| s.applied.ready)).await
    });
    let snapshot = match ready {
        Ok(Ok(s)) => std::sync::Arc::clone(&s),
        Ok(Err(_)) => anyhow::bail!("converge: the dataplane loop stopped"),
        Err(_) => anyhow::bail!(
            "converge: not ready within 300 s; the loop reports {:?}",
            handle.snapshot().applied
        ),
    };
    let seconds = started.elapsed().as_secs_f64();
    eprintln!("converge: applied, ready: {:?}", started.elapsed());
    let stats = &snapshot.stats;
    let writes = stats
        .maps
        .iter()
        .map(|(_, s)| s.writes + s.deletes)
        .sum::<u64>()
        + stats.attachments.attaches
        + stats.attachments.updates
        + stats.attachments.unpins;
    let (endpoints_in, links_in) = (snapshot.summary.endpoints, snapshot.summary.workload_links);
    anyhow::ensure!(
        endpoints_in == endpoints && links_in == endpoints,
        "converge: the loop's snapshot has {endpoints_in} endpoints and {links_in} links, \
         {endpoints} of each sent"
    );
    Ok((seconds, writes, handle, thread))
}

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// Migrates `n` layout-1 IPv4 conntrack entries to layout 2; returns (seconds, lost).
fn ct_migrate(n: u32) -> Result<(f64, u64)> {
    use std::os::fd::AsFd as _;

    use agent::kernel::real::batch;
    use aya_obj::generated::bpf_map_type;
    use maps_schema::{Ct4Key, CtEntry, CtEntryV2, conntrack::FLAG_TCP_SYN_ACK};
    let root = PinRoot::new();
    let dir = root.paths().maps_dir();
    agent::kernel::real::bpffs::ensure_pin_dir(&root.paths().bpf_root)?;
    agent::kernel::real::bpffs::ensure_pin_dir(&dir)?;
    let capacity = n / 4 * 5;
    let obj = aya_obj::Map::new_from_params(
        bpf_map_type::BPF_MAP_TYPE_LRU_HASH as u32,
        16,
        24,
        capacity,
        0,
    );
    let previous = aya::maps::MapData::create(obj, "ct4_v2", None)?;
    previous.pin(dir.join("ct4_v2"))?;
    let now = agent::kernel::real::ct::now_ns();
    let entries: Vec<(Ct4Key, CtEntryV2)> = (0..n)
        .map(|i| {
            let [a, b, c, d] = i.to_be_bytes();
            let key = Ct4Key {
                addr_a: [10, a, b, c],
                addr_b: [10, 200, d, 1],
                port_a: 40_000 + u16::from(d),
                port_b: 443,
                protocol: 6,
                _pad: [0; 3],
            };
            let seen = now.saturating_sub(u64::from(i % 60) * 1_000_000_000);
            (key, CtEntryV2::new(seen, FLAG_TCP_SYN_ACK))
        })
        .collect();
    batch::update(previous.fd().as_fd(), &entries)?;
    let source = batch::count::<Ct4Key, CtEntryV2>(previous.fd().as_fd())?;
    drop((previous, entries));
    let started = Instant::now();
    let mut pending = agent::kernel::migrate::prepare(&dir, 3, capacity)?;
    let finished = agent::kernel::migrate::finish(&mut pending)?;
    let seconds = started.elapsed().as_secs_f64();
    for step in pending.report.steps.iter().chain(&finished.steps) {
        eprintln!(
            "ct migration: {} {} -> {}: {} entries in {:.3} s",
            step.action, step.from, step.to, step.entries, step.seconds
        );
    }
    anyhow::ensure!(!dir.join("ct4_v2").exists(), "the v2 pin is removed");
    let current = aya::maps::MapData::from_pin(dir.join("ct4_v3"))?;
    let target = batch::count::<Ct4Key, CtEntry>(current.fd().as_fd())?;
    Ok((seconds, u64::try_from(source.saturating_sub(target))?))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let smoke = args.iter().any(|a| a == "--smoke");
    let out = args
        .iter()
        .position(|a| a == "--out")
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from)
        .context("--out PATH")?;
    let endpoints = if smoke { 200 } else { 10_000 };
    let blocks = 10;

    // 1. In process: converge, resync, RSS.
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    let mut paths = root.paths();
    paths.state_dir = dirs.path("state");
    paths.policy_dir = dirs.path("policies");
    std::fs::create_dir_all(&paths.state_dir)?;
    std::fs::create_dir_all(&paths.policy_dir)?;
    let mut registry = serde_json::Map::new();
    for i in 0..endpoints {
        registry.insert(
            format!("c{i}:eth0"),
            json!({"id": i + 1, "container_id": format!("c{i}"), "ifname": "eth0", "host_ifname": host_name(i),
                   "namespace": "default", "pod": format!("p{i}"), "labels": {"app": format!("a{}", i % 50)},
                   "handle": format!("h{i}"), "ips": [format!("10.{}.{}.{}", 100 + i / 65_536, (i / 256) % 256, i % 256)]}),
        );
    }
    std::fs::write(
        paths.registry(),
        serde_json::to_vec(&json!({"next_id": endpoints + 1, "endpoints": registry}))?,
    )?;
    let peers: Vec<String> = (0..blocks)
        .map(|b| format!("{{ipBlock: {{cidr: 10.40.{b}.0/24}}}}"))
        .collect();
    std::fs::write(
        paths.policy_dir.join("bench.yaml"),
        format!(
            "kind: NetworkPolicy\nmetadata: {{name: bench, namespace: default}}\nspec:\n  podSelector: {{}}\n  ingress:\n  - from: [{}]\n    ports: [{{port: 80}}]\n",
            peers.join(", ")
        ),
    )?;
    let node_ns = NetNs::new();
    let mut script = String::new();
    for i in 0..REAL_VETHS {
        script.push_str(&format!(
            "link add {} type veth peer name wtb{i:05x}{:05x}\n",
            host_name(i),
            std::process::id() & 0xf_ffff
        ));
        script.push_str(&format!("link set {} up\n", host_name(i)));
    }
    let mut child = Command::new("ip")
        .args(["netns", "exec", node_ns.name(), "ip", "-batch", "-"])
        .stdin(Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(script.as_bytes())?;
    anyhow::ensure!(child.wait()?.success(), "ip -batch failed");
    let real: Vec<(String, u32)> = (0..REAL_VETHS)
        .map(|i| (host_name(i), node_ns.ifindex(&host_name(i))))
        .collect();
    let (converge_s, converge_writes, rss, resync_s, resync_writes) =
        node_ns.run(|| -> Result<_> {
            let (converge_s, converge_writes, handle, thread) = converge(&paths, &real, endpoints)?;
            let rss = rss_mib();
            eprintln!("converge: RSS after converging: {rss:.1} MiB");
            // A restart: the loop ends and drops its node (its maps and pins stay).
            handle.stop();
            anyhow::ensure!(thread.join().is_ok(), "the dataplane loop panicked");
            let (resync_s, resync_writes, handle, thread) = converge(&paths, &real, endpoints)?;
            handle.stop();
            anyhow::ensure!(thread.join().is_ok(), "the dataplane loop panicked");
            Ok((converge_s, converge_writes, rss, resync_s, resync_writes))
        })?;
    drop(node_ns);
    drop(root);

    // 2. A real agent: link attach latency, policy apply latency, restart gap.
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    let policy_dir = dirs.path("policies");
    std::fs::create_dir_all(&policy_dir)?;
    let node = NetNs::new();
    let pod = NetNs::new();
    let agent = AgentProcess::start(&root, &dirs, Some(&node), &[]);
    let paths = root.paths();
    let mut attach_ms = Vec::new();
    for _ in 0..if smoke { 3 } else { 20 } {
        let name = workload_name();
        node.exec(&[
            "ip",
            "link",
            "add",
            &name,
            "type",
            "veth",
            "peer",
            "name",
            &format!("wtq{}", &name[8..]),
        ]);
        // The agent attaches to a workload link once it is up (the CNI attaches before that).
        let t = Instant::now();
        node.exec(&["ip", "link", "set", &name, "up"]);
        // Polled over netlink inside the node (tcx query and filter dump), whichever mechanism.
        let attached = node.run(|| -> Result<bool> {
            use agent::attach::endpoint::{ENDPOINT_PROGRAMS, hook_state};
            let mut tc = agent::attach::filter::Tc::open()?;
            while t.elapsed() < Duration::from_secs(10) {
                let ifindex = nix::net::if_::if_nametoindex(name.as_str()).unwrap_or(0);
                if ENDPOINT_PROGRAMS.iter().all(|(p, hook)| {
                    hook_state(&mut tc, ifindex, *hook, p)
                        .is_ok_and(|s| s.filter_program().is_some() || !s.tcx.is_empty())
                }) {
                    return Ok(true);
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            Ok(false)
        })?;
        if !attached {
            let links =
                String::from_utf8_lossy(&node.exec(&["ip", "-br", "link"]).stdout).into_owned();
            anyhow::bail!("no attachment to {name} within 10 s; links:\n{links}");
        }
        attach_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let ipcache = paths.map_pin(maps_schema::maps::IPCACHE4);
    let mut policy_ms = Vec::new();
    for i in 0..if smoke { 3 } else { 20 } {
        let t = Instant::now();
        std::fs::write(
            policy_dir.join("p.yaml"),
            format!(
                "kind: NetworkPolicy\nmetadata: {{name: p, namespace: default}}\nspec:\n  podSelector: {{}}\n  ingress: [{{from: [{{ipBlock: {{cidr: 10.77.{i}.0/24}}}}]}}]\n"
            ),
        )?;
        let want = format!("10.77.{i}.0");
        loop {
            let out = Command::new("bpftool")
                .args(["-j", "map", "dump", "pinned"])
                .arg(&ipcache)
                .output()?;
            let dump: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            let found = dump.as_array().into_iter().flatten().any(|e| {
                let data: Vec<String> = e["formatted"]["key"]["data"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(ToString::to_string)
                    .collect();
                data.join(".") == want
            });
            if found {
                break;
            }
            anyhow::ensure!(
                t.elapsed() < Duration::from_secs(10),
                "policy not applied within 10 s"
            );
        }
        policy_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    // A flow at one datagram per millisecond, pod → node, across an agent restart.
    let host = workload_name();
    let veth = tests::netns::VethPair::named(&node, &host, &pod, "eth0");
    let alloc: serde_json::Value = agent.api(
        hyper::Method::POST,
        "/v1/ipam/allocate",
        Some(&json!({"handle": "wt-bench", "ipv4": 1})),
    )?;
    let ip = alloc["ips"][0].as_str().context("address")?.to_owned();
    plumb(&node, &pod, &veth, &ip);
    let body = json!({"container_id": "bench", "ifname": "eth0", "host_ifname": host, "handle": "wt-bench", "ips": [ip]});
    let _: serde_json::Value =
        agent.api(hyper::Method::PUT, "/v1/endpoints/bench:eth0", Some(&body))?;
    let rx = node.run(|| UdpSocket::bind(("0.0.0.0", 7300)))?;
    rx.set_read_timeout(Some(Duration::from_millis(50)))?;
    let tx = pod.run(|| UdpSocket::bind((ip.as_str(), 0)))?;
    let stop = Arc::new(AtomicBool::new(false));
    let max_gap_us = Arc::new(AtomicU64::new(0));
    let receiver = {
        let (stop, max_gap_us) = (Arc::clone(&stop), Arc::clone(&max_gap_us));
        std::thread::spawn(move || {
            let mut last: Option<Instant> = None;
            let mut buf = [0u8; 8];
            while !stop.load(Ordering::Relaxed) {
                if rx.recv_from(&mut buf).is_ok() {
                    let now = Instant::now();
                    if let Some(l) = last {
                        max_gap_us.fetch_max(
                            u64::try_from((now - l).as_micros()).unwrap_or(u64::MAX),
                            Ordering::Relaxed,
                        );
                    }
                    last = Some(now);
                }
            }
        })
    };
    let sender = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let _ = tx.send_to(b"gap", (GATEWAY, 7300));
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    max_gap_us.store(0, Ordering::Relaxed);
    anyhow::ensure!(agent.terminate().success(), "agent exit");
    let agent = AgentProcess::start(&root, &dirs, Some(&node), &[]);
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let _ = (sender.join(), receiver.join());
    let restart_max_gap_ms = max_gap_us.load(Ordering::Relaxed) as f64 / 1e3;
    drop(agent);

    let ct_entries = if smoke { 10_000 } else { 1_000_000 };
    let (ct_migrate_s, ct_lost) = ct_migrate(ct_entries)?;

    let figures: HashMap<&str, serde_json::Value> = HashMap::from([
        ("smoke", json!(smoke)),
        ("endpoints", json!(endpoints)),
        ("policy_entries", json!(endpoints * blocks)),
        ("converge_s", json!(converge_s)),
        ("converge_writes", json!(converge_writes)),
        ("resync_s", json!(resync_s)),
        ("resync_writes", json!(resync_writes)),
        ("rss_mib", json!(rss)),
        ("link_attach_ms", json!(median(attach_ms))),
        ("policy_apply_ms", json!(median(policy_ms))),
        ("restart_max_gap_ms", json!(restart_max_gap_ms)),
        ("ct_migrate_entries", json!(ct_entries)),
        ("ct_migrate_1m_s", json!(ct_migrate_s)),
        ("ct_migrate_lost", json!(ct_lost)),
    ]);
    println!("{:<44} {:>14}", "figure", "value");
    for key in [
        "endpoints",
        "policy_entries",
        "converge_s",
        "converge_writes",
        "resync_s",
        "resync_writes",
        "rss_mib",
        "link_attach_ms",
        "policy_apply_ms",
        "restart_max_gap_ms",
        "ct_migrate_entries",
        "ct_migrate_1m_s",
        "ct_migrate_lost",
    ] {
        println!("{key:<44} {:>14}", figures[key].to_string());
    }
    std::fs::write(&out, serde_json::to_vec_pretty(&figures)?)?;
    Ok(())
}
