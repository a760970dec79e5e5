//! `cargo xtask bench k8s`: the Kubernetes source through the test API server
//! (`tests::kube_api`) and the real `weir agent --source kubernetes` binary in a node namespace:
//! 5,000 pods in 100 namespaces (100 of them on this node, registered on real veths) and 1,000
//! NetworkPolicies (100 selecting this node's pods).
//! - `sync_programmed_s`: agent start → every initial list in, everything programmed, ready (the
//!   start report comes after the first in-sync apply);
//! - `label_event_p99_ms`: a local pod's label change, from the moment the server wrote the
//!   watch event to the moment the agent's map write counters moved (the snapshot is published
//!   after the kernel write), p99 over the rounds;
//! - `policy_event_p99_ms`: a policy edit (its port) on this node's pods, likewise;
//! - `rss_mib`: the agent's resident memory with that cache.
//!
//! Prints a table and writes the JSON given by `--out`. `--smoke`: small sizes, few rounds.

use std::{
    io::Write as _,
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, Result};
use serde_json::{Value, json};
use tests::{
    agent_proc::{AgentDirs, AgentProcess},
    bpf::PinRoot,
    kube_api::KubeApi,
    netns::NetNs,
    pod::workload_name,
};

struct Sizes {
    namespaces: usize,
    pods_per_namespace: usize,
    policies_per_namespace: usize,
    nodes: usize,
    rounds: usize,
}

fn pod(ns: usize, j: usize, node: &str, ip: &str, labels: &Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": format!("p{j}"), "namespace": format!("ns-{ns}"), "labels": labels},
           "spec": {"nodeName": node, "containers": [{"name": "c", "image": "pause",
                    "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]}]},
           "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}})
}

fn policy(sizes: &Sizes, ns: usize, k: usize, port: u16) -> Value {
    let peer_ns = (ns + 1) % sizes.namespaces;
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"name": format!("np{k}"), "namespace": format!("ns-{ns}")},
           "spec": {"podSelector": {"matchLabels": {"app": format!("app-{k}")}},
                    "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": format!("app-{}", (k + 1) % 10)}}},
                                          {"namespaceSelector": {"matchLabels": {"team": format!("ns-{peer_ns}")}}}],
                                 "ports": [{"protocol": "TCP", "port": port}]}]}})
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// Sum of every map driver's writes and deletes, from `GET /v1/status`.
fn writes(runtime: &tokio::runtime::Runtime, client: &agent::api::client::Client) -> Result<u64> {
    let status: Value = runtime.block_on(client.call::<(), Value>(
        agent::api::client::Method::GET,
        "/v1/status",
        None,
        "status",
    ))?;
    let mut n = 0;
    for m in status["dataplane"]["maps"].as_array().context("maps")? {
        n += m[1]["writes"].as_u64().unwrap_or(0) + m[1]["deletes"].as_u64().unwrap_or(0);
    }
    Ok(n)
}

/// Applies `object` on the server and measures, in ms, from the watch event's write to the map
/// counters moving; None when nothing was written within 10 s.
fn event_to_kernel(
    api: &KubeApi,
    runtime: &tokio::runtime::Runtime,
    client: &agent::api::client::Client,
    kind: &str,
    object: Value,
) -> Result<Option<f64>> {
    let before = writes(runtime, client)?;
    let rv = api.apply(object);
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if writes(runtime, client)? != before {
            let done = now_ns();
            // The event was necessarily written before the agent acted on it.
            let sent = api.sent_at(kind, rv).context("the event was sent")?;
            return Ok(Some((done.saturating_sub(sent)) as f64 / 1e6));
        }
    }
    Ok(None)
}

fn percentile(mut v: Vec<f64>, p: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
    Some(v[i])
}

fn rss_mib(pid: u32) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("VmRSS")?;
    Ok(kb / 1024.0)
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
    let sizes = if smoke {
        Sizes {
            namespaces: 4,
            pods_per_namespace: 10,
            policies_per_namespace: 3,
            nodes: 5,
            rounds: 5,
        }
    } else {
        Sizes {
            namespaces: 100,
            pods_per_namespace: 50,
            policies_per_namespace: 10,
            nodes: 50,
            rounds: 100,
        }
    };
    anyhow::ensure!(
        nix::unistd::geteuid().is_root(),
        "the k8s benchmark needs root (network namespaces, bpffs)"
    );
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    let node = NetNs::new();
    let api = KubeApi::start(Some(&node));

    // The cluster: namespaces, nodes, pods (pod 0 of each namespace on this node), policies.
    for n in 0..sizes.nodes {
        let name = if n == 0 {
            "wt-node".to_owned()
        } else {
            format!("node-{n}")
        };
        api.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"zone": "a"}},
                          "status": {"addresses": [{"type": "InternalIP", "address": format!("192.0.2.{}", n + 1)}]}}));
    }
    let mut local = Vec::new();
    let mut registry = serde_json::Map::new();
    let mut script = String::new();
    for ns in 0..sizes.namespaces {
        api.apply(json!({"apiVersion": "v1", "kind": "Namespace",
                          "metadata": {"name": format!("ns-{ns}"), "labels": {"team": format!("ns-{ns}")}}}));
        for j in 0..sizes.pods_per_namespace {
            let g = ns * sizes.pods_per_namespace + j;
            let (node_name, ip) = if j == 0 {
                (
                    "wt-node".to_owned(),
                    format!("10.150.{}.{}", ns / 250, ns % 250 + 1),
                )
            } else {
                (
                    format!("node-{}", 1 + g % (sizes.nodes - 1)),
                    format!("10.200.{}.{}", g / 250, g % 250 + 1),
                )
            };
            let labels = json!({"app": format!("app-{}", j % 10)});
            api.apply(pod(ns, j, &node_name, &ip, &labels));
            if j == 0 {
                let host = workload_name();
                script.push_str(&format!(
                    "link add {host} type veth peer name wtk{:05x}{ns:04x}\nlink set {host} up\n",
                    std::process::id() & 0xf_ffff
                ));
                registry.insert(
                    format!("k{ns}:eth0"),
                    json!({"id": ns + 1, "container_id": format!("k{ns}"), "ifname": "eth0",
                           "host_ifname": host, "namespace": format!("ns-{ns}"), "pod": "p0",
                           "labels": {"app": "app-0"}, "handle": format!("h{ns}"), "ips": [ip]}),
                );
                local.push((ns, ip));
            }
        }
        for k in 0..sizes.policies_per_namespace {
            api.apply(policy(&sizes, ns, k, 8000));
        }
    }
    let mut child = Command::new("ip")
        .args(["netns", "exec", node.name(), "ip", "-batch", "-"])
        .stdin(Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(script.as_bytes())?;
    anyhow::ensure!(child.wait()?.success(), "ip -batch failed");
    std::fs::create_dir_all(dirs.path("state"))?;
    std::fs::write(
        dirs.path("state").join("endpoints.json"),
        serde_json::to_vec(&json!({"next_id": sizes.namespaces + 1, "endpoints": registry}))?,
    )?;

    // 1. Start → in sync and programmed.
    let kubeconfig = api.kubeconfig().display().to_string();
    let t = Instant::now();
    let agent = AgentProcess::start(
        &root,
        &dirs,
        Some(&node),
        &["--source", "kubernetes", "--kubeconfig", &kubeconfig],
    );
    let sync_programmed_s = t.elapsed().as_secs_f64();

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let client = agent::api::client::Client::new(&agent.socket, Duration::from_secs(30));

    // 2. A local pod's label change → kernel.
    let mut label_ms = Vec::new();
    let mut label_missed = 0;
    for r in 0..sizes.rounds {
        let (ns, ip) = &local[r % local.len()];
        let labels = json!({"app": "app-0", "rev": format!("r{r}")});
        match event_to_kernel(
            &api,
            &runtime,
            &client,
            "Pod",
            pod(*ns, 0, "wt-node", ip, &labels),
        )? {
            Some(ms) => label_ms.push(ms),
            None => label_missed += 1,
        }
        if label_missed >= 3 {
            // Nothing reaches the kernel: no use waiting 10 s for each of the other rounds.
            break;
        }
    }
    // 3. A policy edit on this node's pods → kernel.
    let mut policy_ms = Vec::new();
    let mut policy_missed = 0;
    for r in 0..sizes.rounds {
        let ns = r % sizes.namespaces;
        let port = 8001 + u16::try_from(r).unwrap_or(0);
        match event_to_kernel(
            &api,
            &runtime,
            &client,
            "NetworkPolicy",
            policy(&sizes, ns, 0, port),
        )? {
            Some(ms) => policy_ms.push(ms),
            None => policy_missed += 1,
        }
        if policy_missed >= 3 {
            // Nothing reaches the kernel: no use waiting 10 s for each of the other rounds.
            break;
        }
    }
    let rss = rss_mib(agent.pid())?;
    let load = std::fs::read_to_string("/proc/loadavg")?;
    let pods = sizes.namespaces * sizes.pods_per_namespace;
    let policies = sizes.namespaces * sizes.policies_per_namespace;
    let figures = json!({
        "pods": pods, "namespaces": sizes.namespaces, "policies": policies,
        "local_pods": local.len(), "rounds": sizes.rounds,
        "sync_programmed_s": sync_programmed_s,
        "label_event_p50_ms": percentile(label_ms.clone(), 0.5),
        "label_event_p99_ms": percentile(label_ms.clone(), 0.99),
        "label_events_without_write": label_missed,
        "policy_event_p50_ms": percentile(policy_ms.clone(), 0.5),
        "policy_event_p99_ms": percentile(policy_ms.clone(), 0.99),
        "policy_events_without_write": policy_missed,
        "rss_mib": rss,
        "loadavg": load.trim(),
    });
    let show = |v: &Value| {
        v.as_f64()
            .map_or_else(|| "n/a".to_owned(), |f| format!("{f:.2}"))
    };
    println!(
        "k8s source: {pods} pods in {} namespaces, {policies} policies, {} on this node",
        sizes.namespaces,
        local.len()
    );
    println!(
        "  start → in sync and programmed   {} s (target ≤ 5)",
        show(&figures["sync_programmed_s"])
    );
    println!(
        "  pod label event → kernel         p50 {} ms, p99 {} ms (target ≤ 20); {label_missed} without a write",
        show(&figures["label_event_p50_ms"]),
        show(&figures["label_event_p99_ms"])
    );
    println!(
        "  policy event → kernel            p50 {} ms, p99 {} ms (target ≤ 20); {policy_missed} without a write",
        show(&figures["policy_event_p50_ms"]),
        show(&figures["policy_event_p99_ms"])
    );
    println!("  agent RSS                        {rss:.1} MiB (target < 250)");
    println!("  load average                     {}", load.trim());
    std::fs::write(&out, serde_json::to_vec_pretty(&figures)?)?;
    drop(agent);
    Ok(())
}
