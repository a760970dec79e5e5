//! Three nodes on one kernel (DESIGN.md → "Nodes and routing"; `tests::multinode`): node namespaces on an
//! underlay bridge, a real etcd, one agent each, pods through `weir-cni` (with the conflist's MTU, as a
//! runtime passes it). One scenario, run in each routing mode (`--routing native` and `--routing vxlan`):
//!
//! - every node routes every other node's blocks (`ip route show proto 87`, computed from the blocks the
//!   agents report) and pods reach pods on every other node on TCP (a seeded sample of cross-node pairs
//!   covering every ordered node pair; the seed is printed, `WEIR_TEST_SEED` replays it); the policy matrix
//!   holds on a sample too;
//! - vxlan mode, checked from outside: the device on each node (`ip -d link`: VNI, port), one forwarding
//!   and one neighbour entry per remote node (`bridge fdb`, `ip neigh`), routes through the device, the
//!   pods' MTU the device's; native mode: no device, routes via the node addresses;
//! - `kill -9` of one agent with the policies in force: new flows to and from its pods follow the matrix
//!   while it is down; without them, an established cross-node connection keeps carrying data while it is down; it
//!   restarts writing nothing (no route event under weir's protocol and no neighbour event on the device in
//!   `ip monitor` until its status says it has reconciled; the device's ifindex, forwarding and neighbour
//!   entries, and the map, program and attached program ids (bpftool) unchanged);
//! - drift from outside on node 1, whose periodic refresh is off (`--refresh-interval 0`): one of weir's
//!   routes deleted (`ip route del`) and, in vxlan mode, one forwarding entry (`bridge fdb del`) come back
//!   from the kernel's deletion event alone, counted in `weir status` (`dataplane.repairs`);
//! - fail static: node 2's agent stopped for three times `--node-expiry`: the others keep its routes and
//!   VXLAN entries and their pods keep reaching its pods and being reached from them; it shows as `silent`
//!   with its last-seen age in `weir node list` and `/metrics`; its removal withdraws what points at it —
//!   native mode: its record deleted (its blocks then reported by `weir ipam check`, freed by
//!   `weir ipam release-node`); vxlan mode: `weir ipam release-node` alone, with no `--force`;
//! - a node added gets routes everywhere.

use std::{
    collections::BTreeSet,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use hyper::Method;
use ipam::Ipam;
use serde_json::Value;
use tests::{
    bin,
    multinode::{Cluster, Node},
    netns::NetNs,
    netpol::{Model, ModelPod, Proto, Source, labels, match_labels},
    netpol_policies::{from_both, from_namespaces, from_pods, policy, port},
    netpol_probe::Servers,
    pod_doc::{write_atomically, write_pod},
    privileged::require_root,
};

/// Pods per node.
const PODS: usize = 30;
/// Cross-node pairs probed (at least; spread over every ordered node pair).
const SAMPLE: usize = 500;
/// Concurrent probes.
const PROBERS: usize = 24;
/// The VXLAN device (the agent's default name, VNI and port).
const DEVICE: &str = agent::paths::DEFAULT_VXLAN_DEVICE;
const PORT_TCP: u16 = 8080;
/// How long a node's change may take to reach every other node's routes (listing every second; etcd on
/// this shared disk sometimes takes seconds to answer, and a request gives up after 10 s).
const CONVERGE: Duration = Duration::from_secs(45);
/// `--node-expiry` (seconds): short, so that a node's agent stopped for three times as long costs the
/// scenario seconds, not minutes (heartbeats every third of it); long enough that an etcd stall of a
/// few seconds on this shared disk does not make a live node look silent (the `release-node` refusal
/// of a live node counts on it).
const EXPIRY: u64 = 8;

/// The blocks node `node` reports for itself (`GET /v1/nodes`).
fn own_blocks(node: &Node) -> BTreeSet<String> {
    node.own_blocks()
}

/// The routes `node` must have: every other live node's blocks via that node's address.
fn expected_routes(cluster: &Cluster, node: &Node) -> BTreeSet<String> {
    cluster
        .live()
        .filter(|other| other.name != node.name)
        .flat_map(|other| {
            own_blocks(other)
                .into_iter()
                .map(move |b| format!("{b} via {}", other.address))
        })
        .collect()
}

/// `dest via next-hop` of weir's routes on `node`.
fn routes_of(node: &Node) -> BTreeSet<String> {
    node.routes()
}

fn wait_until(what: &str, bound: Duration, done: impl FnMut() -> Result<(), String>) {
    tests::wait::until_ok(what, bound, done);
}

fn routes_converge(cluster: &Cluster) {
    wait_until(
        "every node routes every other node's blocks",
        CONVERGE,
        || {
            for node in cluster.live() {
                // A node with pods has a block, and knows it (its listing follows its claim within a second).
                if !node.pods.is_empty() && own_blocks(node).is_empty() {
                    return Err(format!("{} does not list its own blocks yet", node.name));
                }
            }
            for node in cluster.live() {
                let (want, have) = (expected_routes(cluster, node), routes_of(node));
                if want.is_empty() || want != have {
                    return Err(format!("{}: want {want:?}, have {have:?}", node.name));
                }
            }
            Ok(())
        },
    );
}

/// The routing mode a scenario runs in.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Native,
    Vxlan,
}

impl Mode {
    fn flag(self) -> &'static str {
        match self {
            Self::Native => "native",
            Self::Vxlan => "vxlan",
        }
    }
}

/// The device as the kernel shows it on `node` (`ip -d link`), `None` when absent.
fn device_details(node: &Node) -> Option<String> {
    let out = node
        .cni
        .ns
        .try_exec(&["ip", "-d", "-o", "link", "show", "dev", DEVICE])
        .expect("ip");
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The MTU in an `ip -o link` line.
fn mtu_of(line: &str) -> u64 {
    let words: Vec<&str> = line.split_whitespace().collect();
    words
        .iter()
        .position(|w| *w == "mtu")
        .and_then(|i| words.get(i + 1)?.parse().ok())
        .unwrap_or_else(|| panic!("no mtu in {line:?}"))
}

/// The device's forwarding entries with a destination and its neighbour entries on `node`, sorted lines.
fn vxlan_entries(node: &Node) -> (Vec<String>, Vec<String>) {
    let lines = |out: std::process::Output| {
        let mut l: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .filter(|l| !l.is_empty())
            .collect();
        l.sort();
        l
    };
    let fdb = lines(node.cni.ns.exec(&["bridge", "fdb", "show", "dev", DEVICE]))
        .into_iter()
        .filter(|l| l.contains(" dst "))
        .collect();
    let neigh = lines(node.cni.ns.exec(&["ip", "neigh", "show", "dev", DEVICE]));
    (fdb, neigh)
}

/// What the kernel shows of the routing mode on every live node, from outside: vxlan — the device with the
/// agent's VNI and port, one permanent forwarding entry to and one permanent neighbour entry for each other
/// live node's address, every weir route through the device `onlink`; native — no device, no route through
/// one.
fn mode_holds(cluster: &Cluster, mode: Mode) -> Result<(), String> {
    for node in cluster.live() {
        let details = device_details(node);
        let routes = node.weir_routes();
        if mode == Mode::Native {
            if details.is_some() || routes.iter().any(|r| r.contains(DEVICE)) {
                return Err(format!(
                    "{}: a VXLAN device in native mode: {details:?}",
                    node.name
                ));
            }
            continue;
        }
        let details = details.ok_or_else(|| format!("{}: no {DEVICE}", node.name))?;
        let (vni, port) = (
            agent::paths::DEFAULT_VXLAN_VNI,
            agent::paths::DEFAULT_VXLAN_PORT,
        );
        if !details.contains(&format!("vxlan id {vni} "))
            || !details.contains(&format!("dstport {port} "))
        {
            return Err(format!(
                "{}: not VNI {vni} port {port}: {details}",
                node.name
            ));
        }
        let remotes: BTreeSet<String> = cluster
            .live()
            .filter(|o| o.name != node.name)
            .map(|o| o.address.clone())
            .collect();
        let (fdb, neigh) = vxlan_entries(node);
        let fdb_dst: BTreeSet<String> = fdb
            .iter()
            .filter(|l| l.contains("permanent"))
            .filter_map(|l| {
                l.split(" dst ")
                    .nth(1)?
                    .split(' ')
                    .next()
                    .map(str::to_owned)
            })
            .collect();
        let neigh_ip: BTreeSet<String> = neigh
            .iter()
            .filter(|l| l.contains("PERMANENT"))
            .filter_map(|l| l.split(' ').next().map(str::to_owned))
            .collect();
        if fdb.len() != remotes.len() || fdb_dst != remotes {
            return Err(format!(
                "{}: forwarding entries {fdb:?}, want one to each of {remotes:?}",
                node.name
            ));
        }
        if neigh.len() != remotes.len() || neigh_ip != remotes {
            return Err(format!(
                "{}: neighbour entries {neigh:?}, want one for each of {remotes:?}",
                node.name
            ));
        }
        if let Some(bad) = routes
            .iter()
            .find(|r| !r.contains(&format!("dev {DEVICE}")) || !r.contains("onlink"))
        {
            return Err(format!(
                "{}: a route not through {DEVICE}: {bad}",
                node.name
            ));
        }
    }
    Ok(())
}

/// vxlan mode: the conflist's MTU is the device's, which is the underlay's less VXLAN's 50 bytes, and the
/// pods have it; native mode: the conflist has none (weir-cni's default).
fn mtus_hold(cluster: &Cluster, mode: Mode) {
    for node in cluster.live() {
        let conflist = node.conflist_mtu();
        if mode == Mode::Native {
            assert_eq!(conflist, None, "{}: an MTU in native mode", node.name);
            continue;
        }
        let underlay = node.ip(&["-o", "addr", "show", "to", &node.address]);
        let underlay = underlay
            .split_whitespace()
            .nth(1)
            .unwrap_or_else(|| panic!("no device holds {}", node.address));
        let underlay_mtu = mtu_of(&node.ip(&["-o", "link", "show", "dev", underlay]));
        let device_mtu = mtu_of(&device_details(node).expect("the device"));
        assert_eq!(
            device_mtu,
            underlay_mtu - 50,
            "{}: the device's MTU",
            node.name
        );
        assert_eq!(
            conflist,
            Some(device_mtu),
            "{}: the conflist's MTU",
            node.name
        );
        for (pod, _) in &node.pods {
            let out = pod.ns.exec(&["ip", "-o", "link", "show", "dev", "eth0"]);
            let line = String::from_utf8_lossy(&out.stdout);
            assert_eq!(mtu_of(&line), device_mtu, "{}: a pod's MTU", node.name);
        }
    }
}

/// A small seeded generator (SplitMix64): the sample is replayable from the printed seed.
struct Rng(u64);

impl Rng {
    fn seeded() -> Self {
        let seed = std::env::var("WEIR_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
            });
        eprintln!("multinode: pair sample seed {seed} (WEIR_TEST_SEED={seed} replays it)");
        Self(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A probed pair: (from node, from pod, to node, to pod), indexes into `cluster.nodes` and their pods.
type Pair = (usize, usize, usize, usize);

/// At least [`SAMPLE`] distinct cross-node pairs of the live nodes, the same number for every ordered node
/// pair (all of a node pair's pod pairs when it has fewer).
fn sample_pairs(cluster: &Cluster, rng: &mut Rng) -> Vec<Pair> {
    let live: Vec<(usize, usize)> = cluster
        .nodes
        .iter()
        .enumerate()
        .filter_map(|(i, n)| n.as_ref().map(|n| (i, n.pods.len())))
        .collect();
    let node_pairs = live.len() * live.len().saturating_sub(1);
    let per = SAMPLE.div_ceil(node_pairs.max(1));
    let mut pairs = Vec::new();
    for &(a, na) in &live {
        for &(b, nb) in live.iter().filter(|(b, _)| *b != a) {
            // A partial Fisher-Yates shuffle of the node pair's na × nb pod pairs.
            let mut all: Vec<usize> = (0..na * nb).collect();
            let take = per.min(all.len());
            for k in 0..take {
                let j = k + rng.below(all.len() - k);
                all.swap(k, j);
            }
            pairs.extend(all[..take].iter().map(|x| (a, x / nb, b, x % nb)));
        }
    }
    pairs
}

/// Runs `probe` on every pair with at most [`PROBERS`] at once; the results in order.
fn probe_all<T: Send>(pairs: &[Pair], probe: impl Fn(&Pair) -> T + Sync) -> Vec<T> {
    let chunk = pairs.len().div_ceil(PROBERS).max(1);
    std::thread::scope(|scope| {
        let threads: Vec<_> = pairs
            .chunks(chunk)
            .map(|c| {
                let probe = &probe;
                scope.spawn(move || c.iter().map(probe).collect::<Vec<T>>())
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().expect("probe thread"))
            .collect()
    })
}

fn connects(from: &NetNs, to: &str) -> bool {
    let addr: SocketAddr = format!("{to}:{PORT_TCP}").parse().expect("addr");
    from.run(|| TcpStream::connect_timeout(&addr, Duration::from_millis(1500)).is_ok())
}

/// Every sampled pod reaches its sampled pod on another node; the pairs probed.
fn sampled_cross_node_pairs_connect(cluster: &Cluster, rng: &mut Rng) -> Vec<Pair> {
    let pairs = sample_pairs(cluster, rng);
    let node = |i: usize| cluster.nodes[i].as_ref().expect("live");
    let failed: Vec<String> = probe_all(&pairs, |&(a, p, b, q)| {
        let to = tests::cni::Pod::ipv4(&node(b).pods[q].1);
        (!connects(&node(a).pods[p].0.ns, &to)).then(|| {
            format!(
                "pod {p} of {} cannot reach {to} (pod {q}) on {}",
                node(a).name,
                node(b).name
            )
        })
    })
    .into_iter()
    .flatten()
    .collect();
    assert!(
        failed.is_empty(),
        "{} of {} pairs fail: {failed:?}\n{}",
        failed.len(),
        pairs.len(),
        cluster
            .live()
            .map(|n| format!("{}: {}", n.name, n.ip(&["route"])))
            .collect::<Vec<_>>()
            .join("\n")
    );
    pairs
}

/// `weir ipam check -o json` on the cluster's etcd, run inside `ns` (a node).
fn ipam_check(ns: &NetNs) -> Value {
    let out = ns.exec(&[
        bin::weir().to_str().expect("utf-8 path"),
        "ipam",
        "--datastore",
        &Cluster::datastore(),
        "-o",
        "json",
        "check",
    ]);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "weir ipam check: {e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn weir_ipam(ns: &NetNs, args: &[&str]) -> std::process::Output {
    let weir = bin::weir();
    let datastore = Cluster::datastore();
    let mut all = vec![
        weir.to_str().expect("utf-8 path"),
        "ipam",
        "--datastore",
        &datastore,
    ];
    all.extend_from_slice(args);
    ns.try_exec(&all).expect("run weir ipam")
}

fn delete_record(infra: &NetNs, name: &str) {
    tests::etcd_netns::with_store(infra, |store| async move {
        assert!(
            Ipam::new(store).delete_node(name).await.expect("delete"),
            "{name} had a record"
        );
    });
}

#[test]
fn three_nodes_route_pods_natively_survive_an_agent_kill_and_follow_nodes_leaving_and_joining() {
    if require_root(
        "three_nodes_route_pods_natively_survive_an_agent_kill_and_follow_nodes_leaving_and_joining",
    ) {
        scenario(Mode::Native);
    }
}

#[test]
fn three_nodes_route_pods_through_vxlan_survive_an_agent_kill_and_follow_nodes_leaving_and_joining()
{
    if require_root(
        "three_nodes_route_pods_through_vxlan_survive_an_agent_kill_and_follow_nodes_leaving_and_joining",
    ) {
        scenario(Mode::Vxlan);
    }
}

/// Both modes' scenario: pods across nodes, policy, an agent's kill, a node leaving and one joining.
fn scenario(mode: Mode) {
    let started = Instant::now();
    let mut rng = Rng::seeded();
    let expiry = EXPIRY.to_string();
    let mut cluster = Cluster::new(&["--node-expiry", &expiry, "--routing", mode.flag()]);
    let mut servers = Vec::new();
    for i in 0..3 {
        // Node 1 repairs drift only from the kernel's deletion events (its periodic refresh is off).
        let node = if i == 1 {
            cluster.add_node_with(|_, _| vec!["--refresh-interval".into(), "0".into()])
        } else {
            cluster.add_node()
        };
        for p in 0..PODS {
            let (namespace, name) = pod_name(i, p);
            // Its labels reach its own node only: the others learn them from its endpoint record.
            write_pod(
                &node.cni.dirs.path("policies"),
                &namespace,
                &name,
                &[("app", APPS[(i + p) % APPS.len()])],
                &[],
            );
            node.add_pod(&namespace, &name);
        }
        for (pod, _) in &node.pods {
            servers.push(Servers::start(&pod.ns, &[PORT_TCP], &[]));
        }
    }
    eprintln!(
        "multinode {mode:?}: 3 × {} pods in {:?}",
        PODS,
        started.elapsed()
    );
    routes_converge(&cluster);
    wait_until("the routing mode shows in the kernel", CONVERGE, || {
        mode_holds(&cluster, mode)
    });
    mtus_hold(&cluster, mode);
    let pairs = sampled_cross_node_pairs_connect(&cluster, &mut rng);
    assert!(
        pairs.len() >= SAMPLE.min(3 * 2 * PODS * PODS),
        "{} pairs",
        pairs.len()
    );
    let node_pairs: BTreeSet<(usize, usize)> = pairs.iter().map(|&(a, _, b, _)| (a, b)).collect();
    eprintln!(
        "multinode {mode:?}: {} cross-node pairs connect",
        pairs.len()
    );
    assert_eq!(node_pairs.len(), 6, "every ordered node pair is sampled");
    drift_is_repaired_from_events(&cluster, mode);

    // The policy matrix: pods of other nodes are judged by their identities (from their endpoint records).
    let mut pod_labels: Vec<Vec<&str>> = (0..3)
        .map(|i| (0..PODS).map(|p| APPS[(i + p) % APPS.len()]).collect())
        .collect();
    write_policies(&cluster);
    let model = model();
    assert!(
        matrix_holds(&cluster, &model, &pod_labels, &pairs),
        "the policy matrix does not hold across nodes"
    );
    // A label change on node 0's pod changes what the other nodes' pods may reach.
    let (namespace, name) = pod_name(0, 0);
    let relabelled = if pod_labels[0][0] == "db" {
        "api"
    } else {
        "db"
    };
    write_pod(
        &cluster.node(0).cni.dirs.path("policies"),
        &namespace,
        &name,
        &[("app", relabelled)],
        &[],
    );
    pod_labels[0][0] = relabelled;
    assert!(
        matrix_holds(&cluster, &model, &pod_labels, &pairs),
        "the policy matrix does not follow a label change on node 0"
    );
    // Identity agreement: every node knows every other node's pods by the identities their node gives
    // them (`weir status --all-addresses`, the operator's view).
    identities_agree(&cluster);
    // `kill -9` of node 0's agent with the policies in force: new flows to and from its pods still follow
    // them (programs and maps stay pinned), allowed and denied alike.
    cluster.node_mut(0).cni.kill_agent();
    let wrong = matrix_holds_once(&cluster, &model, &pod_labels, &pairs);
    let admitted: Vec<_> = wrong.iter().filter(|(_, _, want)| !want).collect();
    assert!(
        admitted.is_empty(),
        "with node 0's agent down, denied pairs connect: {admitted:?}"
    );
    // An allowed pair that missed the short probe (a loaded CI machine) is tried again with time to
    // spare: it must still connect with the agent down.
    for (from, to, _) in wrong.iter().filter(|(_, _, want)| *want) {
        let (a, p, b, q) = *pairs
            .iter()
            .find(|&&(a, p, b, q)| pod_name(a, p).1 == *from && pod_name(b, q).1 == *to)
            .expect("a probed pair");
        let ip = tests::cni::Pod::ipv4(&cluster.node(b).pods[q].1);
        let ns = &cluster.node(a).pods[p].0.ns;
        assert!(
            (0..3).any(|_| connects(ns, &ip)),
            "with node 0's agent down, the allowed pair {from} -> {to} does not connect"
        );
    }
    cluster.node_mut(0).cni.restart_agent();
    // The rest runs without policies.
    for node in cluster.live() {
        write_atomically(&node.cni.dirs.path("policies"), "policies.yaml", "");
    }
    wait_until("every pair connects again", CONVERGE, || {
        if matrix_holds_once(&cluster, &Model::default(), &pod_labels, &pairs).is_empty() {
            Ok(())
        } else {
            Err("some pairs are still denied".into())
        }
    });

    // An established connection from a pod on node 1 to a pod on node 0, across node 0's agent's kill -9.
    let target = tests::cni::Pod::ipv4(&cluster.node(0).pods[0].1);
    let echo_ns = &cluster.node(0).pods[0].0.ns;
    let _echo = EchoServer::start(echo_ns, 9090);
    let addr: SocketAddr = format!("{target}:9090").parse().expect("addr");
    let mut conn = cluster.node(1).pods[0]
        .0
        .ns
        .run(|| TcpStream::connect_timeout(&addr, Duration::from_secs(2)))
        .expect("connect to the echo server");
    conn.set_read_timeout(Some(Duration::from_secs(3)))
        .expect("timeout");
    let echo = |conn: &mut TcpStream, what: &str| {
        conn.write_all(what.as_bytes()).expect("send");
        let mut buf = vec![0u8; what.len()];
        conn.read_exact(&mut buf).expect("the echo comes back");
        assert_eq!(buf, what.as_bytes());
    };
    echo(&mut conn, "before");
    let ids_before = ids(cluster.node(0));
    let routes_before = cluster.node(0).weir_routes();
    let device_before = device_details(cluster.node(0));
    let entries_before = vxlan_entries_if_any(cluster.node(0));
    // Every route event in node 0 while its agent is away and back.
    let monitor = RouteMonitor::start(&cluster.node(0).cni.ns);
    cluster.node_mut(0).cni.kill_agent();
    echo(&mut conn, "while the agent is down");
    assert!(
        connects(&cluster.node(2).pods[0].0.ns, &target),
        "a new connection while the agent is down"
    );
    cluster.node_mut(0).cni.restart_agent();
    // The restarted agent's reconcile done (its status says so) before anything is compared.
    reconciled(&cluster, 0);
    echo(&mut conn, "after");
    let events = monitor.stop();
    let written: Vec<&String> = events.iter().filter(|e| weir_could_write(e)).collect();
    assert!(
        written.is_empty(),
        "the restart wrote routes or VXLAN entries: {written:?}"
    );
    assert_eq!(cluster.node(0).weir_routes(), routes_before);
    assert_eq!(
        device_details(cluster.node(0)),
        device_before,
        "the device (its ifindex and settings) is unchanged"
    );
    assert_eq!(vxlan_entries_if_any(cluster.node(0)), entries_before);
    if mode == Mode::Vxlan {
        assert!(
            device_before.is_some() && !entries_before.0.is_empty(),
            "nothing to compare"
        );
    }
    assert_eq!(
        ids(cluster.node(0)),
        ids_before,
        "the restart kept every pinned map and program and every tc attachment (bpftool)"
    );
    drop(conn);

    // Node 2 falls silent: its agent stops for three times the expiry. Its pods' datapath keeps running
    // and the others keep routing to it (fail static); they show it as silent.
    let gone = cluster.node(2).name.clone();
    let gone_blocks = own_blocks(cluster.node(2));
    assert!(!gone_blocks.is_empty());
    let routes_with_it: Vec<BTreeSet<String>> = [0, 1].map(|i| routes_of(cluster.node(i))).to_vec();
    for (i, routes) in routes_with_it.iter().enumerate() {
        assert!(
            gone_blocks
                .iter()
                .all(|b| routes.iter().any(|r| r.starts_with(&format!("{b} ")))),
            "node {i} routes {gone}'s blocks before it falls silent: {routes:?}"
        );
    }
    let entries_with_it = [0, 1].map(|i| vxlan_entries_if_any(cluster.node(i)));
    cluster.node_mut(2).cni.stop_agent();
    wait_until(
        &format!("{gone} silent for three times its expiry"),
        CONVERGE + Duration::from_secs(3 * EXPIRY),
        || silent_for(cluster.node(0), &gone, 3 * EXPIRY),
    );
    silent_for(cluster.node(1), &gone, 3 * EXPIRY).expect("node 1 sees it silent too");
    for i in [0, 1] {
        assert_eq!(
            routes_of(cluster.node(i)),
            routes_with_it[i],
            "node {i} keeps the silent node's routes"
        );
        assert_eq!(
            vxlan_entries_if_any(cluster.node(i)),
            entries_with_it[i],
            "node {i} keeps the silent node's forwarding and neighbour entries"
        );
    }
    if mode == Mode::Vxlan {
        assert!(!entries_with_it[0].0.is_empty(), "nothing to compare");
    }
    silent_node_is_reached(&cluster, 2);
    cluster.node(0).shows_silent(&gone);

    // Then it is removed, and the others withdraw its routes and VXLAN entries. Native mode: its record is
    // deleted (and `weir ipam check` reports its blocks until `weir ipam release-node` frees them); vxlan
    // mode: `weir ipam release-node` alone (a silent node needs no --force).
    let node2 = cluster.nodes[2].take().expect("node 2");
    let release = |cluster: &Cluster| {
        let released = weir_ipam(
            &cluster.node(0).cni.ns,
            &["-o", "json", "release-node", &gone],
        );
        assert!(
            released.status.success(),
            "release-node: {}",
            String::from_utf8_lossy(&released.stderr)
        );
        let report: Value = serde_json::from_slice(&released.stdout).expect("json");
        assert_eq!(
            report["blocks"].as_array().map(Vec::len),
            Some(gone_blocks.len())
        );
    };
    match mode {
        Mode::Native => delete_record(&cluster.infra, &gone),
        Mode::Vxlan => release(&cluster),
    }
    routes_converge(&cluster);
    wait_until("the others sweep its VXLAN entries", CONVERGE, || {
        mode_holds(&cluster, mode)
    });
    for node in cluster.live() {
        let have = routes_of(node);
        assert!(
            gone_blocks
                .iter()
                .all(|b| !have.iter().any(|r| r.starts_with(&format!("{b} ")))),
            "{} still routes {gone}'s blocks: {have:?}",
            node.name
        );
        assert!(
            node.nodes().iter().all(|n| n["name"] != gone.as_str()),
            "{} still lists {gone}",
            node.name
        );
    }
    if mode == Mode::Native {
        let check = ipam_check(&cluster.node(0).cni.ns);
        let leaks: Vec<String> = check["leaks"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|l| l.as_str().map(str::to_owned))
            .collect();
        for block in &gone_blocks {
            assert!(
                leaks
                    .iter()
                    .any(|l| l.contains(block.as_str()) && l.contains(&gone)),
                "weir ipam check does not report {gone}'s block {block}: {leaks:?}"
            );
        }
        assert!(
            leaks
                .iter()
                .all(|l| !l.contains("wt-node-0") && !l.contains("wt-node-1")),
            "a live node's block reported: {leaks:?}"
        );
        release(&cluster);
    }
    // A live node is refused without --force (positive control: it has blocks to release).
    let live = weir_ipam(&cluster.node(0).cni.ns, &["release-node", "wt-node-1"]);
    assert!(!live.status.success(), "a live node's blocks were released");
    assert!(String::from_utf8_lossy(&live.stderr).contains("is live"));
    drop(node2);

    // A node joins: every node routes its blocks, and its pod reaches the others' and is reached.
    let node3 = cluster.add_node();
    node3.add_pod("wt-ns0", "pod-3-0");
    servers.push(Servers::start(&node3.pods[0].0.ns, &[PORT_TCP], &[]));
    routes_converge(&cluster);
    wait_until("the joined node's tunnel everywhere", CONVERGE, || {
        mode_holds(&cluster, mode)
    });
    sampled_cross_node_pairs_connect(&cluster, &mut rng);
    eprintln!("multinode {mode:?}: done in {:?}", started.elapsed());
}

/// `weir status`'s repairs of `driver` on `node` (`dataplane.repairs`).
fn repairs(node: &Node, driver: &str) -> u64 {
    node.cni.agent.as_ref().expect("running").repairs(driver)
}

/// Node 1 (no periodic refresh) repairs, from the kernel's deletion events alone, one of its routes deleted
/// from outside and, in vxlan mode, one of its forwarding entries; each repair is counted.
fn drift_is_repaired_from_events(cluster: &Cluster, mode: Mode) {
    let node = cluster.node(1);
    let want = routes_of(node);
    let victim = node
        .weir_routes()
        .first()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .expect("a weir route to delete");
    let before = repairs(node, "routes");
    node.cni
        .ns
        .exec(&["ip", "route", "del", &victim, "proto", "87"]);
    wait_until(
        "node 1 puts its deleted route back (an event; no periodic refresh)",
        CONVERGE,
        || {
            let (have, fixed) = (routes_of(node), repairs(node, "routes"));
            if have == want && fixed > before {
                Ok(())
            } else {
                Err(format!(
                    "routes {have:?}, repairs {fixed} (before {before})"
                ))
            }
        },
    );
    if mode == Mode::Native {
        return;
    }
    let entries = vxlan_entries(node);
    let fdb = entries
        .0
        .first()
        .expect("a forwarding entry to delete")
        .clone();
    let (mac, dst) = (
        fdb.split(' ').next().expect("a MAC").to_owned(),
        fdb.split(" dst ")
            .nth(1)
            .and_then(|d| d.split(' ').next())
            .expect("a destination")
            .to_owned(),
    );
    let before = repairs(node, "vxlan");
    node.cni
        .ns
        .exec(&["bridge", "fdb", "del", &mac, "dev", DEVICE, "dst", &dst]);
    wait_until(
        "node 1 puts its deleted forwarding entry back (an event; no periodic refresh)",
        CONVERGE,
        || {
            let (have, fixed) = (vxlan_entries(node), repairs(node, "vxlan"));
            if have == entries && fixed > before {
                Ok(())
            } else {
                Err(format!(
                    "entries {have:?}, repairs {fixed} (before {before})"
                ))
            }
        },
    );
}

/// `node` lists `name` as silent, last seen at least `secs` ago (`weir node list -o json`).
fn silent_for(node: &Node, name: &str, secs: u64) -> Result<(), String> {
    let socket = node.cni.socket();
    let out = node.cni.ns.exec(&[
        bin::weir().to_str().expect("utf-8 path"),
        "node",
        "list",
        "-o",
        "json",
        "--api-socket",
        socket.to_str().expect("utf-8 path"),
    ]);
    let nodes: Vec<Value> = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    let listed = nodes
        .iter()
        .find(|n| n["name"] == name)
        .ok_or_else(|| format!("{} does not list {name}: {nodes:?}", node.name))?;
    if listed["health"] == "silent" && listed["last_seen_secs"].as_u64() >= Some(secs) {
        Ok(())
    } else {
        Err(format!("{} lists {listed}", node.name))
    }
}

/// Pods of the other nodes reach every pod of the silent node `silent`, and its pods reach theirs.
fn silent_node_is_reached(cluster: &Cluster, silent: usize) {
    let others: Vec<usize> = (0..cluster.nodes.len())
        .filter(|&i| i != silent && cluster.nodes[i].is_some())
        .collect();
    let pods = cluster.node(silent).pods.len();
    let pairs: Vec<Pair> = (0..pods)
        .flat_map(|p| {
            others.iter().enumerate().flat_map(move |(k, &o)| {
                let q = (p + k) % pods;
                [(o, q, silent, p), (silent, p, o, q)]
            })
        })
        .collect();
    let node = |i: usize| cluster.node(i);
    let failed: Vec<String> = probe_all(&pairs, |&(a, p, b, q)| {
        let to = tests::cni::Pod::ipv4(&node(b).pods[q].1);
        // A pair that missed a short probe on a loaded machine is tried again before it counts.
        (!(0..3).any(|_| connects(&node(a).pods[p].0.ns, &to))).then(|| {
            format!(
                "pod {p} of {} -> {to} (pod {q} of {})",
                node(a).name,
                node(b).name
            )
        })
    })
    .into_iter()
    .flatten()
    .collect();
    assert!(
        failed.is_empty(),
        "with {} silent, {} of {} pairs fail: {failed:?}",
        node(silent).name,
        failed.len(),
        pairs.len()
    );
    eprintln!(
        "{} silent: {} pairs to and from its pods connect",
        node(silent).name,
        pairs.len()
    );
}

/// [`vxlan_entries`] when the device exists (native mode: none).
fn vxlan_entries_if_any(node: &Node) -> (Vec<String>, Vec<String>) {
    if device_details(node).is_some() {
        vxlan_entries(node)
    } else {
        (Vec::new(), Vec::new())
    }
}

/// Every node knows every other node's pods by the identities their own node gives them.
fn identities_agree(cluster: &Cluster) {
    let nodes: Vec<&Node> = cluster.live().collect();
    assert_eq!(nodes.len(), 3, "every node is compared");
    for a in &nodes {
        for b in nodes.iter().filter(|b| b.name != a.name) {
            wait_until(
                &format!("{} knows {}'s pods by their identities", b.name, a.name),
                CONVERGE,
                || identities_seen(a, b),
            );
        }
    }
}

/// `b`'s view (`weir status --all-addresses`, the operator's view) of `a`'s pods is `a`'s own.
fn identities_seen(a: &Node, b: &Node) -> Result<(), String> {
    let own: Vec<Value> = a
        .cni
        .agent
        .as_ref()
        .expect("running")
        .api(Method::GET, "/v1/endpoints", None)
        .expect("endpoints");
    let own: std::collections::BTreeMap<String, u64> = own
        .iter()
        .flat_map(|e| {
            let id = e["identity"].as_u64().expect("an identity");
            e["ips"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter_map(move |ip| ip.as_str().map(|ip| (ip.to_owned(), id)))
        })
        .collect();
    assert_eq!(own.len(), PODS, "{}'s own endpoints", a.name);
    let socket = b.cni.socket();
    let out = b.cni.ns.exec(&[
        bin::weir().to_str().expect("utf-8 path"),
        "status",
        "--all-addresses",
        "-o",
        "json",
        "--api-socket",
        socket.to_str().expect("utf-8 path"),
    ]);
    let listed: Vec<Value> = serde_json::from_slice(&out.stdout).expect("json");
    // Pod addresses (node addresses are listed too, with their reserved identities).
    let (pods, node_addresses): (Vec<&Value>, Vec<&Value>) = listed
        .iter()
        .partition(|x| x["pod"].as_str().is_some_and(|p| !p.is_empty()));
    if !node_addresses.iter().any(|x| {
        x["node"] == a.name.as_str()
            && x["ip"] == a.address.as_str()
            && x["identity"] == u64::from(maps_schema::identity::REMOTE_NODE)
    }) {
        return Err(format!(
            "{} does not know {}'s address as remote-node: {node_addresses:?}",
            b.name, a.name
        ));
    }
    let seen: std::collections::BTreeMap<String, u64> = pods
        .iter()
        .filter(|x| x["node"] == a.name.as_str())
        .filter_map(|x| Some((x["ip"].as_str()?.to_owned(), x["identity"].as_u64()?)))
        .collect();
    if seen != own {
        return Err(format!(
            "{}'s view of {}'s pods {seen:?} is not their own {own:?}",
            b.name, a.name
        ));
    }
    if !listed.iter().any(|x| x["node"] == b.name.as_str()) {
        return Err(format!("{} does not list its own pods", b.name));
    }
    Ok(())
}

const APPS: [&str; 3] = ["web", "db", "api"];

fn pod_name(node: usize, pod: usize) -> (String, String) {
    (format!("wt-ns{}", pod % 2), format!("pod-{node}-{pod}"))
}

fn namespaces() -> Vec<(&'static str, Vec<(&'static str, &'static str)>)> {
    vec![
        ("wt-ns0", vec![("team", "a")]),
        ("wt-ns1", vec![("team", "b")]),
    ]
}

/// Five policies with selectors across namespaces (and so across nodes: every namespace has pods on
/// every node).
fn policies() -> Vec<k8s_openapi::api::networking::v1::NetworkPolicy> {
    let app = |a: &str| match_labels(&[("app", a)]);
    let team = |t: &str| match_labels(&[("team", t)]);
    vec![
        // db in wt-ns0 takes api of its own namespace only.
        policy("wt-ns0", "db-from-api", app("db"))
            .ingress(vec![from_pods(app("api"))], vec![port(Proto::Tcp, 8080)])
            .build(),
        // web in wt-ns1 takes anything from team a's namespaces.
        policy("wt-ns1", "web-from-team-a", app("web"))
            .ingress(vec![from_namespaces(team("a"))], vec![])
            .build(),
        // db in wt-ns1 takes api of team a only.
        policy("wt-ns1", "db-from-a-api", app("db"))
            .ingress(vec![from_both(team("a"), app("api"))], vec![])
            .build(),
        // api in wt-ns0 may only reach db and web pods (any namespace of team b, or its own).
        policy("wt-ns0", "api-egress", app("api"))
            .types(&["Egress"])
            .egress(vec![from_pods(app("db"))], vec![])
            .egress(vec![from_both(team("b"), app("web"))], vec![])
            .build(),
        // web in wt-ns0 takes web pods of any namespace.
        policy("wt-ns0", "web-from-web", app("web"))
            .ingress(vec![from_both(match_labels(&[]), app("web"))], vec![])
            .build(),
    ]
}

fn model() -> Model {
    Model {
        namespaces: namespaces()
            .into_iter()
            .map(|(n, l)| (n.to_owned(), labels(&l)))
            .collect(),
        policies: policies(),
        named_ports: Default::default(),
    }
}

/// The same namespaces and policies on every node (each node's own directory).
fn write_policies(cluster: &Cluster) {
    let text = model().manifest();
    for node in cluster.live() {
        write_atomically(&node.cni.dirs.path("policies"), "policies.yaml", &text);
    }
}

/// Every ordered pair of pods whose TCP result differs from the model: (from, to, expected).
fn matrix_holds_once(
    cluster: &Cluster,
    model: &Model,
    pod_labels: &[Vec<&str>],
    pairs: &[Pair],
) -> Vec<(String, String, bool)> {
    let pod = |i: usize, p: usize| {
        let (namespace, name) = pod_name(i, p);
        let app = pod_labels
            .get(i)
            .and_then(|l| l.get(p))
            .copied()
            .unwrap_or("none");
        (
            name,
            ModelPod {
                namespace,
                labels: labels(&[("app", app)]),
            },
        )
    };
    probe_all(pairs, |&(a, p, b, q)| {
        let ((from, from_model), (to, to_model)) = (pod(a, p), pod(b, q));
        let want = model.allows(Source::Pod(&from_model), &to_model, PORT_TCP);
        let node = |i: usize| cluster.nodes[i].as_ref().expect("live");
        let ip = tests::cni::Pod::ipv4(&node(b).pods[q].1);
        let addr: SocketAddr = format!("{ip}:{PORT_TCP}").parse().expect("addr");
        let got = node(a).pods[p]
            .0
            .ns
            .run(|| TcpStream::connect_timeout(&addr, Duration::from_millis(400)).is_ok());
        (got != want).then_some((from, to, want))
    })
    .into_iter()
    .flatten()
    .collect()
}

/// The matrix holds within the convergence bound (policies hot-reload, endpoint records every second).
fn matrix_holds(
    cluster: &Cluster,
    model: &Model,
    pod_labels: &[Vec<&str>],
    pairs: &[Pair],
) -> bool {
    let deadline = Instant::now() + CONVERGE;
    let mut allowed_and_denied = (false, false);
    loop {
        let wrong = matrix_holds_once(cluster, model, pod_labels, pairs);
        if wrong.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            eprintln!("pairs that differ from the model (from, to, expected): {wrong:?}");
            return false;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    // The sampled matrix must have both outcomes, or it proves nothing.
    let model_pod = |i: usize, p: usize| ModelPod {
        namespace: pod_name(i, p).0,
        labels: labels(&[("app", pod_labels[i][p])]),
    };
    for &(a, p, b, q) in pairs {
        if model.allows(Source::Pod(&model_pod(a, p)), &model_pod(b, q), PORT_TCP) {
            allowed_and_denied.0 = true;
        } else {
            allowed_and_denied.1 = true;
        }
    }
    assert!(
        allowed_and_denied == (true, true),
        "the model allows or denies everything"
    );
    true
}

/// A node's pinned maps and programs with their kernel ids, and the programs its tc attachments run
/// (device, hook, program id), all read with bpftool from outside the agent.
type Ids = (Vec<(String, u64)>, Vec<tests::bpf::TcAttachment>);

fn ids(node: &Node) -> Ids {
    let pinned = tests::bpf::pinned_ids(&node.cni.root.paths());
    let mut attached = tests::bpf::tc_attachments(&node.cni.ns);
    attached.sort();
    // What is compared is there: the agent's maps and programs, and its programs on every pod's veth.
    assert!(
        pinned.iter().any(|(pin, _)| pin.starts_with("map ")),
        "bpftool shows the agent's pinned maps: {pinned:?}"
    );
    for program in ["/from_endpoint", "/to_endpoint"] {
        let id = pinned
            .iter()
            .find(|(pin, _)| pin.starts_with("prog ") && pin.ends_with(program))
            .unwrap_or_else(|| panic!("no pinned {program}: {pinned:?}"))
            .1;
        assert_eq!(
            attached.iter().filter(|a| a.prog_id == id).count(),
            node.pods.len(),
            "{program} runs on every pod's veth: {attached:?}"
        );
    }
    (pinned, attached)
}

/// Waits (bounded) until node `i`'s agent says in its status that it has reconciled: ready (an apply after
/// its sources' first in-sync succeeded), no route error, and every other live node listed alive with the
/// routes it wants (the loop writes routes in the apply that publishes the nodes it has listed).
fn reconciled(cluster: &Cluster, i: usize) {
    let node = cluster.node(i);
    let others: BTreeSet<String> = cluster
        .live()
        .filter(|n| n.name != node.name)
        .map(|n| n.name.clone())
        .collect();
    assert!(!others.is_empty(), "other nodes to list");
    let agent = node.cni.agent.as_ref().expect("running");
    wait_until("the restarted agent reconciles", CONVERGE, || {
        let status: Value = agent
            .api(Method::GET, "/v1/status", None)
            .map_err(|e| e.to_string())?;
        let applied = &status["applied"];
        if applied["ready"] != true || !applied["routes_error"].is_null() {
            return Err(format!("not ready: {applied}"));
        }
        let listed: BTreeSet<String> = status["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|n| n["health"] == "alive" && n["routes"].as_u64() > Some(0))
            .filter_map(|n| n["name"].as_str().map(str::to_owned))
            .collect();
        if listed == others {
            Ok(())
        } else {
            Err(format!(
                "nodes listed alive with routes: {listed:?}, want {others:?}"
            ))
        }
    });
}

/// `ip -o monitor route neigh` inside a namespace, collected until stopped.
/// True when a line of `ip monitor route neigh` is something weir writes: a route of its protocol
/// (87), or a route or neighbour entry on the VXLAN device that the kernel did not make itself. The
/// kernel adds and garbage-collects its own neighbour entries whenever it likes: multicast mappings
/// (`NOARP`, e.g. `ff02::16`) and entries it learned (`STALE`, `REACHABLE`, …); weir's are `PERMANENT`.
fn weir_could_write(event: &str) -> bool {
    if event.contains("proto 87") {
        return true;
    }
    if !event.contains(&format!("dev {DEVICE} ")) {
        return false;
    }
    let kernel_own = [
        "NOARP",
        "STALE",
        "REACHABLE",
        "DELAY",
        "PROBE",
        "FAILED",
        "INCOMPLETE",
    ]
    .iter()
    .any(|state| event.contains(state));
    event.contains("PERMANENT") || !kernel_own
}

#[test]
fn the_restart_check_tells_weir_s_entries_from_the_kernel_s() {
    let dev = DEVICE;
    assert!(weir_could_write(
        "10.244.1.0/26 via 10.99.0.2 dev wt0 proto 87 onlink "
    ));
    assert!(weir_could_write(&format!(
        "10.244.1.0 dev {dev} lladdr 02:00:00:00:00:01 PERMANENT "
    )));
    assert!(weir_could_write(&format!(
        "Deleted 10.244.1.0 dev {dev} lladdr 02:00:00:00:00:01 PERMANENT "
    )));
    assert!(!weir_could_write(&format!(
        "Deleted ff02::16 dev {dev} lladdr 33:33:00:00:00:16 NOARP "
    )));
    assert!(!weir_could_write(&format!(
        "Deleted fe80::1 dev {dev} lladdr 02:00:0a:63:00:01 STALE "
    )));
    assert!(!weir_could_write(
        "Deleted ff02::16 dev weir3f1244e62f3 lladdr 33:33:00:00:00:16 NOARP "
    ));
}

struct RouteMonitor {
    child: std::process::Child,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

/// A route the monitor must see before it counts (its positive control): a blackhole in the
/// test's own node namespace, added and removed at once.
const MARKER: &str = "198.51.100.250";

impl RouteMonitor {
    fn start(ns: &NetNs) -> Self {
        let mut child = Command::new("ip")
            .args([
                "netns",
                "exec",
                ns.name(),
                "ip",
                "-o",
                "monitor",
                "route",
                "neigh",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("ip monitor");
        let stdout = child.stdout.take().expect("stdout piped");
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = std::sync::Arc::clone(&lines);
        let reader = std::thread::spawn(move || {
            use std::io::BufRead as _;
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                sink.lock().expect("lines").push(line);
            }
        });
        let monitor = Self {
            child,
            lines,
            reader: Some(reader),
        };
        // Listening before anything happens: it shows a route added and removed after it started.
        // `ip monitor` subscribes a moment after it is spawned, so an add it missed is taken back
        // and made again until the monitor shows one (bounded); the removal is then seen for sure.
        let marker = format!("{MARKER}/32");
        let shows = |seen: &str| {
            monitor
                .lines
                .lock()
                .expect("lines")
                .iter()
                .any(|l| l.contains(MARKER) && l.starts_with(seen))
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            ns.exec(&["ip", "route", "add", "blackhole", &marker]);
            let tried = std::time::Instant::now();
            while !shows("blackhole") && tried.elapsed() < Duration::from_secs(2) {
                std::thread::sleep(Duration::from_millis(20));
            }
            if shows("blackhole") {
                break;
            }
            ns.exec(&["ip", "route", "del", "blackhole", &marker]);
            assert!(
                std::time::Instant::now() < deadline,
                "ip monitor never showed the marker route's add within 30 s: {:?}",
                monitor.lines.lock().expect("lines")
            );
        }
        ns.exec(&["ip", "route", "del", "blackhole", &marker]);
        wait_until(
            "ip monitor shows the marker route's removal",
            Duration::from_secs(10),
            || {
                if shows("Deleted") {
                    Ok(())
                } else {
                    Err(format!("{:?}", monitor.lines.lock().expect("lines")))
                }
            },
        );
        monitor
    }

    /// Every event after the marker's.
    fn stop(mut self) -> Vec<String> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        let lines = self.lines.lock().expect("lines");
        let after = lines
            .iter()
            .rposition(|l| l.contains(MARKER))
            .map_or(0, |i| i + 1);
        lines[after..].to_vec()
    }
}

impl Drop for RouteMonitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TCP echo server in a namespace (one connection at a time), stopped with the test.
struct EchoServer;

impl EchoServer {
    fn start(ns: &NetNs, port: u16) -> Self {
        let listener = ns.run(|| std::net::TcpListener::bind(("0.0.0.0", port)).expect("listen"));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { break };
                std::thread::spawn(move || {
                    let mut buf = [0u8; 256];
                    while let Ok(n) = conn.read(&mut buf) {
                        if n == 0 || conn.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        Self
    }
}
