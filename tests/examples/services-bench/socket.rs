//! Socket LB (`--socket-lb-cgroup`) on real TCP connections: a real `weir agent` (the `WEIR_BIN`
//! binary, its source's directory holding `update_services` filler Services and the measured one,
//! whose one backend is a pod), a client pod per variant whose connections are made by
//! `wt-sockclient` processes (each connection opened, read to the server's close, closed), three
//! variants interleaved run by run:
//! - `direct`: to the backend's address (no translation anywhere);
//! - `socket`: to the ClusterIP from a process in the socket LB cgroup (placed at `connect`);
//! - `packet`: to the ClusterIP from a process outside it (translated per packet by
//!   `from_endpoint`, reversed by `to_endpoint`).
//!
//! - `udp_direct`, `udp_socket`, `udp_packet`: the same three ways for UDP, each exchange a new
//!   unconnected socket sending one datagram with `sendto` and reading the answer with
//!   `recvfrom` (as musl's resolver asks DNS); `udp_socket` is placed at `sendmsg`.
//!
//! Figures per variant (medians over runs): ns per connection (wall clock, the whole exchange)
//! and, from the kernel's own run-time statistics (`BPF_ENABLE_STATS`, held only while this
//! part runs), the average ns per run of `from_endpoint` and `to_endpoint` over every packet of
//! the run (both directions of each connection) and of `sock_connect4` per `connect`,
//! `sock_sendmsg4` per `sendto` and `sock_recvmsg4` per `recvfrom`.

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, TcpListener},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use aya::programs::ProgramInfo;
use maps_schema::{
    Svc4Key,
    programs::{FROM_ENDPOINT, SOCK_CONNECT4, SOCK_RECVMSG4, SOCK_SENDMSG4, TO_ENDPOINT},
    service::SVC4,
};
use serde_json::{Value, json};
use tests::{
    agent_pod::pod,
    agent_proc::{AgentDirs, AgentProcess},
    bench_net::median,
    bpf::PinRoot,
    cgroup::TestCgroup,
    netns::NetNs,
    packet::TCP,
};

use crate::{PORT, Sizes, TARGET, update};

/// Connections per run and runs per variant.
fn counts(s: Sizes) -> (u32, usize) {
    if s.traffic_runs > 2 {
        (2_000, 5)
    } else {
        (100, 2)
    }
}

const VARIANTS: [&str; 6] = [
    "direct",
    "socket",
    "packet",
    "udp_direct",
    "udp_socket",
    "udp_packet",
];

/// The client namespace's count of retransmitted SYNs (`TcpExt: TCPSynRetrans`).
fn syn_retrans(ns: &NetNs) -> Result<u64> {
    let out = ns.exec(&["cat", "/proc/net/netstat"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
        bail!("no TcpExt lines in /proc/net/netstat");
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "TCPSynRetrans")
        .and_then(|(_, v)| v.parse().ok())
        .context("no TCPSynRetrans in /proc/net/netstat")
}

/// (run time, run count) of a pinned program.
fn stats(root: &PinRoot, program: &str) -> Result<(u128, u64)> {
    let pin = root.paths().prog_pin(program);
    let info = ProgramInfo::from_pin(&pin).with_context(|| format!("reading {}", pin.display()))?;
    Ok((info.run_time().as_nanos(), info.run_count()))
}

pub fn run(s: Sizes, figures: &mut BTreeMap<String, Value>) -> Result<()> {
    let (per_run, runs) = counts(s);
    let n = s.update_services;
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    let cgroup = TestCgroup::new();
    let node = NetNs::new();
    node.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    let policies = dirs.path("policies");
    std::fs::create_dir_all(&policies)?;
    let mut all = String::new();
    for i in 0..n {
        update::documents(i, &mut all);
    }
    std::fs::write(policies.join("fillers.yaml"), &all)?;
    let cg = cgroup.path().display().to_string();
    eprintln!("services-bench: socket LB, weir agent with {n} Services");
    let agent = AgentProcess::start(&root, &dirs, Some(&node), &["--socket-lb-cgroup", &cg]);
    let backend = pod(&node, &agent, "backend", "web");
    // A client pod per variant: one pod's connections to the ClusterIP and to the backend would
    // meet on the same translated tuples, and the backend's `TIME_WAIT` refuses (until the SYN is
    // sent again, a second later) a SYN whose sequence number and timestamp were chosen for
    // another destination. That is the kernel's, not the datapath's; it is kept out of this
    // comparison. Each pod's connections take ports of their own for the whole part.
    let clients: Vec<_> = VARIANTS
        .iter()
        .map(|v| {
            let c = pod(&node, &agent, &format!("client-{v}"), "client");
            c.ns.exec(&["sysctl", "-qw", "net.ipv4.ip_local_port_range=1024 65535"]);
            c
        })
        .collect();
    let listener = backend
        .ns
        .run(|| TcpListener::bind(("0.0.0.0", TARGET)))
        .context("listening in the backend pod")?;
    std::thread::spawn(move || {
        // Each connection is closed by the server at once (its FIN ends the client's read).
        for conn in listener.incoming() {
            drop(conn);
        }
    });
    let udp = backend
        .ns
        .run(|| std::net::UdpSocket::bind(("0.0.0.0", TARGET)))
        .context("binding UDP in the backend pod")?;
    std::thread::spawn(move || {
        // Each datagram answered at once.
        let mut buf = [0u8; 64];
        while let Ok((len, from)) = udp.recv_from(&mut buf) {
            let _ = udp.send_to(&buf[..len], from);
        }
    });
    let vip = Ipv4Addr::from(u32::from(crate::vip(n)) + 1);
    let doc = format!(
        "---\nkind: Service\nmetadata: {{name: measured, namespace: bench}}\n\
         spec: {{clusterIP: {vip}, ports: [{{name: p, port: {PORT}, targetPort: {TARGET}}}, \
         {{name: u, port: {PORT}, protocol: UDP, targetPort: {TARGET}}}]}}\n\
         ---\nkind: EndpointSlice\napiVersion: discovery.k8s.io/v1\n\
         metadata: {{name: measured-1, namespace: bench, labels: {{kubernetes.io/service-name: measured}}}}\n\
         addressType: IPv4\nports: [{{name: p, port: {TARGET}}}, {{name: u, port: {TARGET}, protocol: UDP}}]\n\
         endpoints:\n- {{addresses: [{}], conditions: {{ready: true}}}}\n",
        backend.ip
    );
    std::fs::write(policies.join("measured.yaml"), doc)?;
    let svc4 = update::open_svc4(&root.paths().map_pin(SVC4))?;
    let key = Svc4Key {
        addr: vip.octets(),
        port: PORT,
        protocol: TCP,
        scope: 0,
    };
    let deadline = Instant::now() + Duration::from_secs(300);
    while !svc4.get(&key, 0).is_ok_and(|v| v.backend_count == 1) {
        if Instant::now() > deadline {
            bail!("the measured Service did not reach svc4_v1 within 300 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let client_bin = tests::bin::wt_sockclient();
    let stats_fd = aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .context("BPF_ENABLE_STATS (kernel 5.8+)")?;
    let mut per_conn: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut per_run_ns: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut syn_retransmits: BTreeMap<&str, u64> = BTreeMap::new();
    for run in 0..runs {
        for (variant, client) in VARIANTS.into_iter().zip(&clients) {
            let netns = format!("/var/run/netns/{}", client.ns.name());
            let (cg_arg, to) = match variant {
                "direct" | "udp_direct" => ("-".to_owned(), format!("{}:{TARGET}", backend.ip)),
                "socket" | "udp_socket" => (cg.clone(), format!("{vip}:{PORT}")),
                _ => ("-".to_owned(), format!("{vip}:{PORT}")),
            };
            let kind = if variant.starts_with("udp") {
                "udp-time"
            } else {
                "tcp-time"
            };
            let programs = [
                FROM_ENDPOINT,
                TO_ENDPOINT,
                SOCK_CONNECT4,
                SOCK_SENDMSG4,
                SOCK_RECVMSG4,
            ];
            let before: Vec<(u128, u64)> = programs
                .iter()
                .map(|p| stats(&root, p))
                .collect::<Result<_>>()?;
            let retrans = syn_retrans(&client.ns)?;
            let out = std::process::Command::new(&client_bin)
                .args([&cg_arg, &netns, kind, &per_run.to_string(), &to])
                .output()
                .context("running wt-sockclient")?;
            let after: Vec<(u128, u64)> = programs
                .iter()
                .map(|p| stats(&root, p))
                .collect::<Result<_>>()?;
            let text = String::from_utf8_lossy(&out.stdout);
            let fields: Vec<&str> = text.split_whitespace().collect();
            let (Some(elapsed), Some(failed)) = (
                fields.get(1).and_then(|v| v.parse::<f64>().ok()),
                fields.get(3).and_then(|v| v.parse::<u32>().ok()),
            ) else {
                bail!(
                    "wt-sockclient printed {text:?} ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                );
            };
            if failed > 0 {
                bail!("{failed} of {per_run} exchanges failed in variant {variant}");
            }
            let ns = elapsed / f64::from(per_run);
            let retrans = syn_retrans(&client.ns)? - retrans;
            eprintln!(
                "services-bench: socket LB run {run} {variant}: {ns:.0} ns/exchange, {retrans} SYNs retransmitted"
            );
            *syn_retransmits.entry(variant).or_default() += retrans;
            per_conn.entry(variant).or_default().push(ns);
            for (i, program) in programs.iter().enumerate() {
                let (time, count) = (after[i].0 - before[i].0, after[i].1 - before[i].1);
                if count > 0 {
                    per_run_ns
                        .entry(format!("{program}:{variant}"))
                        .or_default()
                        .push(time as f64 / count as f64);
                }
            }
        }
    }
    drop(stats_fd);
    drop(agent);
    for (variant, mut v) in per_conn {
        figures.insert(format!("conn_{variant}_ns"), json!(median(&mut v)));
    }
    for (key, mut v) in per_run_ns {
        let (program, variant) = key.split_once(':').unwrap_or((&key, ""));
        figures.insert(format!("run_{program}_{variant}_ns"), json!(median(&mut v)));
    }
    for (variant, n) in syn_retransmits {
        figures.insert(format!("conn_{variant}_syn_retransmits"), json!(n));
    }
    figures.insert("conn_services".into(), json!(n));
    figures.insert("conn_per_run".into(), json!(per_run));
    Ok(())
}
