//! `cargo xtask bench multinode`: weir across nodes on one kernel (DESIGN.md → "Nodes and routing").
//! - IPAM at scale against a real etcd (`ipam::testing::EtcdServer`): 1,000 simulated hosts × 100
//!   allocations, hosts as concurrent clients of the IPAM library (each its own client, as agents
//!   have; all through one shared client with `--ipam-client-shared`) in bounded batches;
//!   duplicates, allocation p99, etcd's own WAL fsync p99 over the same run (its `/metrics`), every
//!   address checked against its host's own blocks (affinity `host:<name>`; borrowed addresses are
//!   counted and reported), and where the time went (rounds, lost CAS txns, queueing, mean read and
//!   CAS txn times). `--ipam-shared-extra` runs it a second time on a fresh etcd through one shared
//!   client and adds that run's figures as `ipam_shared_client_*` (for comparison only).
//! - Route convergence: 50 simulated peers, each a namespace with an underlay link and its own route
//!   driver (`NodeRoutes`, native) in process holding the other peers' blocks; a new node with 4 blocks is
//!   handed to all of them at once, and the figure is the time until every peer's driver has written its
//!   routes to the kernel (checked afterwards with `ip route show proto 87` in each namespace).
//! - Throughput, one TCP stream for 5 s (this program's own sender and receiver sockets, created inside the
//!   namespaces), each against the same stream between its node namespaces' underlay addresses without weir
//!   (each stream run twice, alternating underlay and pod, the better run of each kept). Native: two real
//!   `weir agent`s on an etcd datastore with node records (`tests::multinode::Cluster`), pods through
//!   `weir-cni`, routes written by the agents' loops. VXLAN: the same with `--routing vxlan` (routes `onlink`
//!   through each agent's VXLAN device, whose `tx_packets` must move by the stream). The agents run with
//!   their default `--host-routing bpf` (`ebpf/src/host_fwd.rs`).
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

use agent::{
    dataplane::node_routes::{LocalNode, NodeRoutes, RemoteNode, RoutingMode},
    kernel::real::{netlink_routes::NetlinkRoutes, netlink_vxlan::NetlinkVxlan},
};
use anyhow::{Context as _, Result, bail, ensure};
use ipam::{
    AssignArgs, Ipam,
    model::{IpPool, IpUse},
    store::etcd::{EtcdStats, EtcdStore},
    testing::EtcdServer,
};
use ipnetwork::{IpNetwork, Ipv4Network};
use serde_json::{Value, json};
use tests::{multinode::Cluster, names, netns::NetNs};

struct Sizes {
    /// Every simulated host allocates through its own client (the default; off with
    /// `--ipam-client-shared`).
    per_host_client: bool,
    /// A second IPAM run through one shared client, its figures as `ipam_shared_client_*`.
    shared_extra: bool,
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

/// IPAM at scale: `hosts` × `per_host` allocations, `batch` hosts at a time, each host through its
/// own client when `per_host_client`, else all through one.
fn ipam_scale(sizes: &Sizes, per_host_client: bool) -> Result<Value> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let server = EtcdServer::start()?;
        let url = server.url().to_owned();
        let ipam = Ipam::new(EtcdStore::connect(std::slice::from_ref(&url)).await?);
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
        // Each host has its own client, as every agent has its own. A shared client (one connection,
        // one group committer: the hosts' writes share rounds, up to etcd's 128 operations a txn) is
        // faster on this machine (etcd on the same two shared cores), but no deployment allocates so.
        let mut sum = EtcdStats::default();
        for first in (0..sizes.hosts).step_by(sizes.batch) {
            let mut clients = Vec::new();
            for _ in first..(first + sizes.batch).min(sizes.hosts) {
                clients.push(if per_host_client {
                    Ipam::new(EtcdStore::connect(std::slice::from_ref(&url)).await?)
                } else {
                    ipam.clone()
                });
            }
            // Every client's settings cache synced before the clock runs, as in a running agent.
            for c in &clients {
                let live = Instant::now();
                while !c.store().settings_cache_live() {
                    ensure!(live.elapsed() < Duration::from_secs(10), "a client's settings cache is not live after 10 s");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            let mut tasks = Vec::new();
            for (h, ipam) in (first..).zip(clients) {
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
                    anyhow::Ok((host, ips, lat, ipam.store().stats()))
                }));
            }
            for t in tasks {
                let (host, ips, l, stats) = t.await??;
                lat.extend(l);
                by_host.insert(host, ips);
                if per_host_client {
                    sum = EtcdStats {
                        jobs: sum.jobs + stats.jobs,
                        rounds: sum.rounds + stats.rounds,
                        cas_txns: sum.cas_txns + stats.cas_txns,
                        lost: sum.lost + stats.lost,
                        queued_ns: sum.queued_ns + stats.queued_ns,
                        read_ns: sum.read_ns + stats.read_ns,
                        cas_ns: sum.cas_ns + stats.cas_ns,
                        reads: sum.reads + stats.reads,
                        reads_ns: sum.reads_ns + stats.reads_ns,
                    };
                }
            }
        }
        if !per_host_client {
            sum = ipam.store().stats();
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
            "ipam_clients": if per_host_client { "one per host" } else { "one shared" },
            // Where the time went: group-commit rounds, writes per round, CAS txns lost to another writer, and
            // the mean wait of a write for its round.
            "ipam_etcd_rounds": sum.rounds,
            "ipam_etcd_writes_per_round": round3(sum.jobs as f64 / sum.rounds.max(1) as f64),
            "ipam_etcd_cas_lost": sum.lost,
            "ipam_etcd_queue_mean_ms": round3(sum.queued_ns as f64 / 1e6 / sum.jobs.max(1) as f64),
            "ipam_etcd_read_txn_mean_ms": round3(sum.read_ns as f64 / 1e6 / sum.rounds.max(1) as f64),
            "ipam_etcd_cas_mean_ms": round3(sum.cas_ns as f64 / 1e6 / sum.rounds.max(1) as f64),
            "ipam_etcd_plain_read_mean_ms": round3(sum.reads_ns as f64 / 1e6 / sum.reads.max(1) as f64),
            "ipam_etcd_reads_per_alloc": round3(sum.reads as f64 / expected.max(1) as f64),
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

/// How long the agents' routes may take to appear (a node record and its blocks reach the other agent's loop
/// through its etcd watch).
const ROUTES_BOUND: Duration = Duration::from_secs(30);

/// Native mode through node records: two real `weir agent`s (`tests::multinode::Cluster`: node namespaces on
/// an underlay bridge, etcd in the infra namespace, `--datastore etcd:…`), one pod each through `weir-cni`,
/// the routes to the other node's block written by each agent's own loop from the node records. Returns
/// (underlay bit/s, the better of two runs between the node namespaces; pod → pod bit/s, the better of two
/// runs). The runs alternate (underlay, pod, underlay, pod), so both sides get the same chance against load
/// from elsewhere on the machine.
///
/// `extra` are the agents' routing flags (`--routing vxlan` for the tunnel).
fn through_agents(secs: Duration, extra: &[&str]) -> Result<(f64, f64)> {
    let mut flags = vec!["--node-expiry", "30"];
    flags.extend_from_slice(extra);
    let mut cluster = Cluster::new(&flags);
    cluster.add_node().add_pod("default", "bench-a");
    let b_ip: Ipv4Addr = cluster.add_node().add_pod("default", "bench-b").parse()?;
    // Each node routes the other's block, from its agent (weir's routes, protocol 87), and nothing else does.
    for (me, other) in [(0, 1), (1, 0)] {
        let via = cluster.node(other).address.clone();
        let deadline = Instant::now() + ROUTES_BOUND;
        while !cluster
            .node(me)
            .weir_routes()
            .iter()
            .any(|r| r.contains(&format!("via {via}")))
        {
            ensure!(
                Instant::now() < deadline,
                "node {me} has no weir route via node {other} ({via}) after {ROUTES_BOUND:?}: {:?}",
                cluster.node(me).weir_routes()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let (a, b) = (cluster.node(0), cluster.node(1));
    let b_addr: Ipv4Addr = b.address.parse()?;
    let underlay_before = stream(&a.cni.ns, &b.cni.ns, b_addr, 5211, secs)?;
    let vxlan = extra.contains(&"vxlan");
    let device = agent::paths::DEFAULT_VXLAN_DEVICE;
    let tx_before = if vxlan {
        tx_packets(&a.cni.ns, device)?
    } else {
        0
    };
    let pod_first = stream(&a.pods[0].0.ns, &b.pods[0].0.ns, b_ip, 5212, secs)?;
    if vxlan {
        ensure!(
            tx_packets(&a.cni.ns, device)? > tx_before + 1000,
            "the vxlan stream did not go through {device}"
        );
    }
    let underlay = underlay_before.max(stream(&a.cni.ns, &b.cni.ns, b_addr, 5213, secs)?);
    let pod = pod_first.max(stream(&a.pods[0].0.ns, &b.pods[0].0.ns, b_ip, 5214, secs)?);
    Ok((underlay, pod))
}

/// Throughput pod → pod across the nodes in both modes, through node records and the agents' routes, each
/// against the bare underlay of its own lab. Each is measured twice, alternating, and the better run of each
/// kept, so load from elsewhere on the machine during one run does not decide a ratio.
fn throughput(secs: Duration) -> Result<Value> {
    let (native_underlay, native) = through_agents(secs, &[])?;
    let (vxlan_underlay, vxlan) = through_agents(secs, &["--routing", "vxlan"])?;
    Ok(json!({
        "stream_s": secs.as_secs_f64(),
        "underlay_gbps": round3(native_underlay / 1e9),
        "native_gbps": round3(native / 1e9),
        "native_routes": "weir agents, etcd node records",
        "host_routing": "bpf",
        "vxlan_underlay_gbps": round3(vxlan_underlay / 1e9),
        "vxlan_gbps": round3(vxlan / 1e9),
        "vxlan_routes": "weir agents, etcd node records, --routing vxlan",
        "native_throughput_ratio": round3(native / native_underlay),
        "vxlan_throughput_ratio": round3(vxlan / vxlan_underlay),
    }))
}

fn tx_packets(ns: &NetNs, dev: &str) -> Result<u64> {
    let out = ns.exec(&[
        "cat",
        &format!("/sys/class/net/{dev}/statistics/tx_packets"),
    ]);
    Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
}

/// The shared-client run's headline figures, renamed `ipam_shared_client_*` so they sit beside the
/// per-host run's without replacing them.
fn shared_extra_figures(run: Value) -> Value {
    let mut out = serde_json::Map::new();
    for key in [
        "ipam_duplicates",
        "ipam_allocs_per_s",
        "ipam_p50_ms",
        "ipam_p99_ms",
        "etcd_wal_fsync_p99_ms",
        "ipam_etcd_writes_per_round",
    ] {
        if let Some(v) = run.get(key) {
            let name = key.strip_prefix("ipam_").unwrap_or(key);
            out.insert(format!("ipam_shared_client_{name}"), v.clone());
        }
    }
    Value::Object(out)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let smoke = args.iter().any(|a| a == "--smoke");
    let per_host_client = !args.iter().any(|a| a == "--ipam-client-shared");
    let shared_extra = args.iter().any(|a| a == "--ipam-shared-extra");
    // Only the IPAM part (no namespaces, no root needed): for measuring it on its own.
    let ipam_only = args.iter().any(|a| a == "--ipam-only");
    // Only the throughput part: for measuring the datapath on its own.
    let throughput_only = args.iter().any(|a| a == "--throughput-only");
    let out = args
        .iter()
        .position(|a| a == "--out")
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from)
        .context(
            "usage: multinode-bench --out FILE [--smoke] [--ipam-only | --throughput-only] \
             [--ipam-client-shared] [--ipam-shared-extra]",
        )?;
    let sizes = if smoke {
        Sizes {
            per_host_client,
            shared_extra,
            hosts: 20,
            per_host: 10,
            batch: 10,
            peers: 5,
            stream: Duration::from_secs(1),
        }
    } else {
        Sizes {
            per_host_client,
            shared_extra,
            hosts: 1000,
            per_host: 100,
            batch: 50,
            peers: 50,
            stream: Duration::from_secs(5),
        }
    };
    let mut figures = serde_json::Map::new();
    let ipam = |sizes: &Sizes| -> Result<Vec<Value>> {
        let mut parts = vec![ipam_scale(sizes, sizes.per_host_client)?];
        if sizes.shared_extra && sizes.per_host_client {
            parts.push(shared_extra_figures(ipam_scale(sizes, false)?));
        }
        Ok(parts)
    };
    let parts = if ipam_only {
        ipam(&sizes)?
    } else if throughput_only {
        vec![throughput(sizes.stream)?]
    } else {
        let mut parts = vec![throughput(sizes.stream)?, route_convergence(sizes.peers)?];
        parts.extend(ipam(&sizes)?);
        parts
    };
    for part in parts {
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
        ("ipam_clients", "IPAM: clients"),
        ("ipam_p50_ms", "IPAM: allocation p50 ms"),
        (
            "ipam_shared_client_p99_ms",
            "IPAM, one shared client (comparison): p99 ms",
        ),
        (
            "ipam_shared_client_p50_ms",
            "IPAM, one shared client (comparison): p50 ms",
        ),
        (
            "ipam_etcd_writes_per_round",
            "IPAM: writes per group-commit round",
        ),
        (
            "ipam_etcd_cas_lost",
            "IPAM: CAS txns lost to another writer",
        ),
        ("ipam_etcd_queue_mean_ms", "IPAM: mean wait for a round, ms"),
        (
            "ipam_etcd_reads_per_alloc",
            "IPAM: plain etcd reads per allocation",
        ),
        ("ipam_etcd_plain_read_mean_ms", "IPAM: plain read mean ms"),
        (
            "ipam_etcd_read_txn_mean_ms",
            "IPAM: round's read txn mean ms",
        ),
        ("ipam_etcd_cas_mean_ms", "IPAM: round's CAS txn mean ms"),
        (
            "ipam_borrowed",
            "IPAM: addresses outside their host's blocks",
        ),
        (
            "route_converge_s",
            "routes: new node routed on every peer, s (<= 1)",
        ),
        ("underlay_gbps", "throughput: underlay (native lab), Gbit/s"),
        (
            "native_gbps",
            "throughput: native pod->pod via agents' routes, Gbit/s",
        ),
        (
            "vxlan_underlay_gbps",
            "throughput: underlay (vxlan lab), Gbit/s",
        ),
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
    if !throughput_only && figures.get("ipam_duplicates").and_then(Value::as_u64) != Some(0) {
        bail!("duplicate addresses were handed out");
    }
    if figures
        .get("ipam_shared_client_duplicates")
        .and_then(Value::as_u64)
        .is_some_and(|d| d != 0)
    {
        bail!("duplicate addresses were handed out through the shared client");
    }
    Ok(())
}
