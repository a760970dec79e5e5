//! `cargo xtask bench multinode`: weir across nodes on one kernel (DESIGN.md → "Nodes and routing").
//! - IPAM at scale against a real etcd (`ipam::testing::EtcdServer`): 1,000 simulated hosts × 100
//!   allocations, hosts as concurrent clients of the IPAM library in bounded batches; duplicates, allocation
//!   p99, etcd's own WAL fsync p99 over the same run (its `/metrics`), and every address checked against its
//!   host's own blocks (affinity `host:<name>`; borrowed addresses are counted and reported).
//! - Route convergence: 50 simulated peers, each a namespace with an underlay link and its own route
//!   driver (`NodeRoutes`, native) in process holding the other peers' blocks; a new node with 4 blocks is
//!   handed to all of them at once, and the figure is the time until every peer's driver has written its
//!   routes to the kernel (checked afterwards with `ip route show proto 87` in each namespace).
//! - Throughput, one TCP stream for 5 s (this program's own sender and receiver sockets, created inside the
//!   namespaces): pod → pod across two node namespaces on an underlay bridge, with one real `weir agent` per
//!   node namespace whose programs are attached to the pods' `weir…` veths (checked with bpftool), routed by
//!   the route driver in process in native and then in vxlan mode; against the same stream between the node
//!   namespaces' underlay addresses without weir (run before and after the pod streams, the better kept).
//!
//! Prints a table and writes the JSON given by `--out`. `--smoke`: small sizes, 1 s streams.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{Read as _, Write as _},
    net::{IpAddr, Ipv4Addr, TcpListener, TcpStream},
    path::PathBuf,
    sync::mpsc,
    time::{Duration, Instant},
};

use agent::dataplane::{
    netlink_routes::NetlinkRoutes,
    netlink_vxlan::NetlinkVxlan,
    node_routes::{LocalNode, NodeRoutes, RemoteNode, RoutingMode},
    vxlan::VxlanConfig,
};
use anyhow::{Context as _, Result, bail, ensure};
use ipam::{
    AssignArgs, Ipam,
    model::{IpPool, IpUse},
    store::etcd::EtcdStore,
    testing::EtcdServer,
};
use ipnetwork::{IpNetwork, Ipv4Network};
use serde_json::{Value, json};
use tests::{
    agent_proc::{AgentDirs, AgentProcess},
    bpf::PinRoot,
    hooks::wait_attached,
    names,
    netns::NetNs,
    node_lab::NodeLab,
    pod::workload_name,
};

struct Sizes {
    hosts: usize,
    per_host: usize,
    batch: usize,
    peers: u8,
    stream: Duration,
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// etcd's `etcd_disk_wal_fsync_duration_seconds` histogram from its `/metrics`: (upper bound s, cumulative).
fn wal_fsync(url: &str) -> Result<Vec<(f64, f64)>> {
    let addr = url.trim_start_matches("http://").trim_end_matches('/');
    let mut conn = TcpStream::connect(addr)?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(conn, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut body = String::new();
    conn.read_to_string(&mut body)?;
    let mut buckets = Vec::new();
    for line in body.lines() {
        let Some(rest) = line.strip_prefix("etcd_disk_wal_fsync_duration_seconds_bucket{le=\"")
        else {
            continue;
        };
        let Some((le, count)) = rest.split_once("\"} ") else {
            continue;
        };
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse()?
        };
        buckets.push((le, count.trim().parse()?));
    }
    ensure!(
        !buckets.is_empty(),
        "etcd's /metrics has no etcd_disk_wal_fsync_duration_seconds histogram"
    );
    Ok(buckets)
}

/// The `q` quantile (seconds) of the observations between two readings of a histogram (linear inside the
/// bucket, as Prometheus' `histogram_quantile`).
fn histogram_quantile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> f64 {
    let delta: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, n)| {
            let was = before
                .iter()
                .find(|(b, _)| b == le)
                .map_or(0.0, |(_, n)| *n);
            (*le, n - was)
        })
        .collect();
    let total = delta.last().map_or(0.0, |(_, n)| *n);
    if total <= 0.0 {
        return 0.0;
    }
    let rank = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for (le, n) in delta {
        if n >= rank {
            if le.is_infinite() {
                return lower;
            }
            return lower + (le - lower) * (rank - below) / (n - below).max(f64::MIN_POSITIVE);
        }
        (lower, below) = (le, n);
    }
    lower
}

const BLOCK_SIZE: u8 = 26;

/// IPAM at scale: `hosts` × `per_host` allocations, `batch` hosts at a time.
fn ipam_scale(sizes: &Sizes) -> Result<Value> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let server = EtcdServer::start()?;
        let ipam = Ipam::new(EtcdStore::connect(&[server.url().to_owned()]).await?);
        ipam.add_pool(IpPool {
            name: "bench".into(),
            cidr: "10.0.0.0/12".parse()?,
            block_size: BLOCK_SIZE,
            node_selector: String::new(),
            namespace_selector: String::new(),
            allowed_uses: vec![IpUse::Workload],
            disabled: false,
        })
        .await?;
        let fsync_before = wal_fsync(server.url())?;
        let start = Instant::now();
        let mut lat = Vec::with_capacity(sizes.hosts * sizes.per_host);
        let mut by_host: BTreeMap<String, Vec<IpAddr>> = BTreeMap::new();
        for first in (0..sizes.hosts).step_by(sizes.batch) {
            let mut tasks = Vec::new();
            for h in first..(first + sizes.batch).min(sizes.hosts) {
                let ipam = ipam.clone();
                let per_host = sizes.per_host;
                tasks.push(tokio::spawn(async move {
                    let host = format!("host{h:04}");
                    let mut ips = Vec::with_capacity(per_host);
                    let mut lat = Vec::with_capacity(per_host);
                    for i in 0..per_host {
                        let t = Instant::now();
                        let r = ipam
                            .auto_assign(&AssignArgs::new(&host, &format!("{host}-{i}"), 1, 0))
                            .await?;
                        lat.push(t.elapsed());
                        ips.extend(r.ips());
                    }
                    anyhow::Ok((host, ips, lat))
                }));
            }
            for t in tasks {
                let (host, ips, l) = t.await??;
                lat.extend(l);
                by_host.insert(host, ips);
            }
        }
        let secs = start.elapsed().as_secs_f64();
        let fsync_after = wal_fsync(server.url())?;
        lat.sort();
        let all: Vec<IpAddr> = by_host.values().flatten().copied().collect();
        let distinct: BTreeSet<&IpAddr> = all.iter().collect();
        // Every address in a block whose affinity is its own host, or borrowed. The affinities are read per
        // host: all blocks at once exceed etcd's 4 MiB response limit at this scale.
        let mut affinity: BTreeMap<IpNetwork, Option<String>> = BTreeMap::new();
        for host in by_host.keys() {
            for a in ipam.host_affinities(host).await? {
                affinity.insert(a.cidr, Some(format!("host:{}", a.host)));
            }
        }
        let (mut own, mut borrowed, mut outside) = (0usize, 0usize, 0usize);
        for (host, ips) in &by_host {
            let want = format!("host:{host}");
            for ip in ips {
                let IpAddr::V4(v4) = ip else {
                    outside += 1;
                    continue;
                };
                let block = IpNetwork::V4(Ipv4Network::new(
                    Ipv4Network::new(*v4, BLOCK_SIZE)?.network(),
                    BLOCK_SIZE,
                )?);
                match affinity.get(&block) {
                    Some(Some(a)) if *a == want => own += 1,
                    Some(_) => borrowed += 1,
                    None => outside += 1,
                }
            }
        }
        let expected = sizes.hosts * sizes.per_host;
        ensure!(
            all.len() == expected,
            "{} addresses handed out, {expected} asked for",
            all.len()
        );
        Ok(json!({
            "ipam_hosts": sizes.hosts,
            "ipam_allocations_per_host": sizes.per_host,
            "ipam_batch_hosts": sizes.batch,
            "ipam_allocations": all.len(),
            "ipam_duplicates": all.len() - distinct.len(),
            "ipam_allocs_per_s": (all.len() as f64 / secs).round(),
            "ipam_p50_ms": round3(percentile(&lat, 0.5)),
            "ipam_p99_ms": round3(percentile(&lat, 0.99)),
            "etcd_wal_fsync_p99_ms": round3(histogram_quantile(&fsync_before, &fsync_after, 0.99) * 1e3),
            "ipam_in_own_blocks": own,
            // The pool is far larger than 1,000 hosts' needs, so no borrowing is expected: any is reported.
            "ipam_borrowed": borrowed,
            "ipam_outside_blocks": outside,
            "ipam_blocks": affinity.len(),
        }))
    })
}

/// One simulated peer: a namespace with an underlay link, and a thread in it running a route driver
/// that applies every node view it is sent and answers with the instant its apply finished.
struct Peer {
    ns: NetNs,
    tx: mpsc::Sender<Vec<RemoteNode>>,
    done: mpsc::Receiver<Result<Instant, String>>,
}

fn peer_addr(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(192, 0, 2, i + 1)
}

fn peer_block(i: u8) -> IpNetwork {
    IpNetwork::V4(Ipv4Network::new(Ipv4Addr::new(10, 96, i, 0), 26).expect("block"))
}

fn start_peer(i: u8) -> Result<Peer> {
    let ns = NetNs::new();
    // An underlay link with the peer's address (a veth pair inside the namespace: no dummy module here).
    let (dev, other) = (names::unique("ul"), names::unique("ur"));
    ns.exec(&[
        "ip", "link", "add", &dev, "type", "veth", "peer", "name", &other,
    ]);
    ns.exec(&[
        "ip",
        "addr",
        "add",
        &format!("{}/24", peer_addr(i)),
        "dev",
        &dev,
    ]);
    ns.exec(&["ip", "link", "set", &other, "up"]);
    ns.exec(&["ip", "link", "set", &dev, "up"]);
    let (tx, rx) = mpsc::channel::<Vec<RemoteNode>>();
    let (done_tx, done) = mpsc::channel();
    let path = format!("/run/netns/{}", ns.name());
    std::thread::spawn(move || {
        let setup = std::fs::File::open(&path)
            .map_err(|e| e.to_string())
            .and_then(|f| {
                nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(|e| e.to_string())
            });
        if let Err(e) = setup {
            let _ = done_tx.send(Err(e));
            return;
        }
        let mut driver = match (NetlinkRoutes::open(), NetlinkVxlan::open()) {
            (Ok(r), Ok(v)) => NodeRoutes::new(
                RoutingMode::Native,
                Box::new(r),
                Box::new(v),
                Some(names::unique("vx")),
            ),
            (Err(e), _) => {
                let _ = done_tx.send(Err(e.to_string()));
                return;
            }
            (_, Err(e)) => {
                let _ = done_tx.send(Err(e.to_string()));
                return;
            }
        };
        let local = LocalNode {
            name: format!("peer{i}"),
            address: IpAddr::V4(peer_addr(i)),
            vtep: None,
        };
        for remotes in rx {
            driver.set_nodes(local.clone(), remotes);
            let r = driver
                .apply()
                .map(|()| Instant::now())
                .map_err(|e| e.to_string());
            if done_tx.send(r).is_err() {
                return;
            }
        }
    });
    Ok(Peer { ns, tx, done })
}

fn remote(i: u8, blocks: Vec<IpNetwork>) -> RemoteNode {
    RemoteNode {
        name: format!("peer{i}"),
        address: IpAddr::V4(peer_addr(i)),
        vtep: None,
        blocks,
    }
}

/// Route convergence on `peers` simulated peers: seconds from handing every driver the new node to the
/// last driver's routes being in its kernel.
fn route_convergence(peers: u8) -> Result<Value> {
    let all: Vec<Peer> = (0..peers).map(start_peer).collect::<Result<_>>()?;
    let view = |me: u8, with_new: bool| {
        let mut v: Vec<RemoteNode> = (0..peers)
            .filter(|j| *j != me)
            .map(|j| remote(j, vec![peer_block(j)]))
            .collect();
        if with_new {
            v.push(remote(
                200,
                (0..4)
                    .map(|k| {
                        IpNetwork::V4(
                            Ipv4Network::new(Ipv4Addr::new(10, 97, k, 0), 26).expect("block"),
                        )
                    })
                    .collect(),
            ));
        }
        v
    };
    for (i, p) in all.iter().enumerate() {
        p.tx.send(view(i as u8, false)).context("peer gone")?;
    }
    for p in &all {
        p.done
            .recv_timeout(Duration::from_secs(30))
            .context("a peer did not apply")?
            .map_err(anyhow::Error::msg)?;
    }
    let views: Vec<_> = (0..peers).map(|i| view(i, true)).collect();
    let t0 = Instant::now();
    for (p, v) in all.iter().zip(views) {
        p.tx.send(v).context("peer gone")?;
    }
    let mut last = t0;
    for p in &all {
        let at = p
            .done
            .recv_timeout(Duration::from_secs(30))
            .context("a peer did not converge")?
            .map_err(anyhow::Error::msg)?;
        last = last.max(at);
    }
    let converge = last.duration_since(t0).as_secs_f64();
    // Checked from outside: every peer routes the new node's 4 blocks and the other peers' blocks.
    for p in &all {
        let out = p.ns.exec(&["ip", "route", "show", "proto", "87"]);
        let n = String::from_utf8_lossy(&out.stdout).lines().count();
        ensure!(
            n == usize::from(peers) - 1 + 4,
            "a peer has {n} weir routes, not {}",
            usize::from(peers) + 3
        );
    }
    drop(all);
    Ok(json!({"route_peers": peers, "route_new_blocks": 4, "route_converge_s": round3(converge)}))
}

/// One TCP stream from `from` to `to:port` (listening in `server`) for `secs`: bits per second received.
fn stream(from: &NetNs, server: &NetNs, to: Ipv4Addr, port: u16, secs: Duration) -> Result<f64> {
    let listener = server.run(|| TcpListener::bind((to, port)))?;
    let reader = std::thread::spawn(move || -> std::io::Result<(u64, Duration)> {
        let (mut conn, _) = listener.accept()?;
        let mut buf = vec![0u8; 1 << 17];
        let (mut total, start) = (0u64, Instant::now());
        loop {
            let n = conn.read(&mut buf)?;
            if n == 0 {
                return Ok((total, start.elapsed()));
            }
            total += n as u64;
        }
    });
    let mut conn = from
        .run(|| TcpStream::connect_timeout(&(to, port).into(), Duration::from_secs(3)))
        .with_context(|| format!("cannot connect to {to}:{port}"))?;
    let buf = vec![0x5au8; 1 << 17];
    let start = Instant::now();
    while start.elapsed() < secs {
        conn.write_all(&buf)?;
    }
    drop(conn);
    let (bytes, elapsed) = reader
        .join()
        .map_err(|_| anyhow::anyhow!("the receiver panicked"))??;
    Ok(bytes as f64 * 8.0 / elapsed.as_secs_f64())
}

fn apply_routes(lab: &NodeLab, mode: &dyn Fn(usize) -> RoutingMode, device: &str) -> Result<()> {
    for (i, node) in lab.nodes.iter().enumerate() {
        let remotes: Vec<RemoteNode> = lab
            .remotes_of(i)
            .into_iter()
            .enumerate()
            .map(|(j, (address, vtep, blocks))| RemoteNode {
                name: format!("n{j}"),
                address,
                vtep: Some(vtep),
                blocks,
            })
            .collect();
        let local = LocalNode {
            name: format!("n{i}"),
            address: IpAddr::V4(node.address),
            vtep: Some(node.vtep),
        };
        let (mode, device) = (mode(i), device.to_owned());
        node.ns.run(move || -> Result<()> {
            let mut d = NodeRoutes::new(
                mode,
                Box::new(NetlinkRoutes::open()?),
                Box::new(NetlinkVxlan::open()?),
                Some(device),
            );
            d.set_nodes(local, remotes);
            d.apply()?;
            Ok(())
        })?;
    }
    Ok(())
}

/// Throughput pod → pod across the nodes (native, vxlan) against the bare underlay.
fn throughput(secs: Duration) -> Result<Value> {
    let lab = NodeLab::new(2, |_| Some(workload_name()));
    let device = names::unique("vx");
    // One agent per node, its registry naming the node's pod so its programs go on the pod's veth.
    let mut agents = Vec::new();
    for (i, node) in lab.nodes.iter().enumerate() {
        let (root, dirs) = (PinRoot::new(), AgentDirs::new());
        std::fs::create_dir_all(dirs.path("state"))?;
        let endpoint = json!({"id": 1, "container_id": format!("mn{i}"), "ifname": "eth0",
            "host_ifname": node.pod_link, "namespace": "default", "pod": format!("pod{i}"),
            "labels": {"app": "bench"}, "handle": format!("mn{i}"), "ips": [node.pod_ip.to_string()]});
        std::fs::write(
            dirs.path("state").join("endpoints.json"),
            serde_json::to_vec(
                &json!({"next_id": 2, "endpoints": {format!("mn{i}:eth0"): endpoint}}),
            )?,
        )?;
        let agent = AgentProcess::start(
            &root,
            &dirs,
            Some(&node.ns),
            &["--node", &format!("wt-n{i}")],
        );
        wait_attached(
            &node.ns,
            &root,
            &[node.pod_link.as_str()],
            Duration::from_secs(30),
        );
        agents.push((agent, root, dirs));
    }
    let (a, b) = (&lab.nodes[0], &lab.nodes[1]);
    // The underlay is measured before and after the pod streams and the better run kept, so load from
    // elsewhere on the machine during one run does not flatter the ratios.
    let underlay_before = stream(&a.ns, &b.ns, b.address, 5201, secs)?;
    apply_routes(&lab, &|_| RoutingMode::Native, &device)?;
    let native = stream(&a.pod, &b.pod, b.pod_ip, 5202, secs)?;
    apply_routes(
        &lab,
        &|i| {
            RoutingMode::Vxlan(VxlanConfig {
                device: device.clone(),
                vni: 87,
                port: 4789,
                underlay: lab.nodes[i].underlay.clone(),
            })
        },
        &device,
    )?;
    let tx_before = tx_packets(&a.ns, &device)?;
    let vxlan = stream(&a.pod, &b.pod, b.pod_ip, 5203, secs)?;
    ensure!(
        tx_packets(&a.ns, &device)? > tx_before + 1000,
        "the vxlan stream did not go through {device}"
    );
    let underlay = underlay_before.max(stream(&a.ns, &b.ns, b.address, 5204, secs)?);
    drop(agents);
    Ok(json!({
        "stream_s": secs.as_secs_f64(),
        "underlay_gbps": round3(underlay / 1e9),
        "native_gbps": round3(native / 1e9),
        "vxlan_gbps": round3(vxlan / 1e9),
        "native_throughput_ratio": round3(native / underlay),
        "vxlan_throughput_ratio": round3(vxlan / underlay),
    }))
}

fn tx_packets(ns: &NetNs, dev: &str) -> Result<u64> {
    let out = ns.exec(&[
        "cat",
        &format!("/sys/class/net/{dev}/statistics/tx_packets"),
    ]);
    Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let smoke = args.iter().any(|a| a == "--smoke");
    let out = args
        .iter()
        .position(|a| a == "--out")
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from)
        .context("usage: multinode-bench --out FILE [--smoke]")?;
    let sizes = if smoke {
        Sizes {
            hosts: 20,
            per_host: 10,
            batch: 10,
            peers: 5,
            stream: Duration::from_secs(1),
        }
    } else {
        Sizes {
            hosts: 1000,
            per_host: 100,
            batch: 50,
            peers: 50,
            stream: Duration::from_secs(5),
        }
    };
    let mut figures = serde_json::Map::new();
    for part in [
        throughput(sizes.stream)?,
        route_convergence(sizes.peers)?,
        ipam_scale(&sizes)?,
    ] {
        if let Value::Object(m) = part {
            figures.extend(m);
        }
    }
    let rows = [
        ("ipam_hosts", "IPAM: simulated hosts"),
        ("ipam_allocations", "IPAM: allocations"),
        ("ipam_duplicates", "IPAM: duplicates (must be 0)"),
        (
            "ipam_p99_ms",
            "IPAM: allocation p99 ms (<= 20, or <= 3x fsync p99 > 7)",
        ),
        (
            "etcd_wal_fsync_p99_ms",
            "etcd's own WAL fsync p99 ms, same run",
        ),
        (
            "ipam_borrowed",
            "IPAM: addresses outside their host's blocks",
        ),
        (
            "route_converge_s",
            "routes: new node routed on every peer, s (<= 1)",
        ),
        ("underlay_gbps", "throughput: underlay, Gbit/s"),
        (
            "native_throughput_ratio",
            "throughput: native pod->pod / underlay (>= 0.9)",
        ),
        (
            "vxlan_throughput_ratio",
            "throughput: vxlan pod->pod / underlay (>= 0.7)",
        ),
    ];
    println!(
        "{:<60} {:>10}",
        "multinode benchmark",
        if smoke { "smoke" } else { "value" }
    );
    for (key, label) in rows {
        println!(
            "{label:<60} {:>10}",
            figures
                .get(key)
                .map_or_else(|| "-".into(), Value::to_string)
        );
    }
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(
        &out,
        serde_json::to_vec_pretty(&Value::Object(figures.clone()))?,
    )?;
    if figures.get("ipam_duplicates").and_then(Value::as_u64) != Some(0) {
        bail!("duplicate addresses were handed out");
    }
    Ok(())
}
