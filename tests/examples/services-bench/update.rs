//! Update cost at `update_services` Services, through each source of a real `weir agent` (the
//! `WEIR_BIN` binary, in a namespace of its own, pins under a `wt*` root):
//!
//! - the Kubernetes source (`--source kubernetes` against the test API server, `tests::kube_api`,
//!   whose first lists hold that many Services and EndpointSlices): one more Service's slice,
//!   then the Service, applied on the server; the clock runs from the Service's watch event
//!   being written to the agent's stream (the source event) until its frontend, with both
//!   backends, is in the pinned `svc4_v1`, polled with the bpf syscall every 0.2 ms;
//! - the standalone directory: the same Services in one file; one more Service (and its slice)
//!   added as a new file (written aside, renamed in: the source event), until its frontend is in
//!   the map. This source polls the directory every 50 ms and re-reads it whole.
//!
//! Against it: `iptables-nft-restore --noflush` of kube-proxy's whole iptables-mode table with
//! that one Service more, over the table without it (what kube-proxy's sync does).

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    net::Ipv4Addr,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use aya::maps::{HashMap, Map, MapData};
use maps_schema::{Svc4Key, Svc4Value, service::SVC4};
use serde_json::{Value, json};
use tests::{
    agent_proc::{AgentDirs, AgentProcess},
    bench_net::{feed, median},
    bpf::PinRoot,
    kube_api::KubeApi,
    netns::NetNs,
    packet::TCP,
};

use crate::{PORT, Sizes, TARGET, filler_backend, rules, vip};

const POLL: Duration = Duration::from_micros(200);
const SYNC_LIMIT: Duration = Duration::from_secs(300);
const UPDATE_LIMIT: Duration = Duration::from_secs(30);

/// Service `i` and its EndpointSlice (two ready endpoints) as YAML documents.
pub(crate) fn documents(i: u32, out: &mut String) {
    let (a, b) = (filler_backend(i, 0), filler_backend(i, 1));
    let _ = write!(
        out,
        "---\nkind: Service\nmetadata: {{name: svc-{i}, namespace: bench}}\n\
         spec: {{clusterIP: {}, ports: [{{name: p, port: {PORT}, targetPort: {TARGET}}}]}}\n\
         ---\nkind: EndpointSlice\napiVersion: discovery.k8s.io/v1\n\
         metadata: {{name: svc-{i}-1, namespace: bench, labels: {{kubernetes.io/service-name: svc-{i}}}}}\n\
         addressType: IPv4\nports: [{{name: p, port: {TARGET}}}]\n\
         endpoints:\n- {{addresses: [{a}], conditions: {{ready: true}}}}\n- {{addresses: [{b}], conditions: {{ready: true}}}}\n",
        vip(i)
    );
}

fn key(i: u32) -> Svc4Key {
    Svc4Key {
        addr: vip(i).octets(),
        port: PORT,
        protocol: TCP,
        scope: 0,
    }
}

pub(crate) fn open_svc4(pin: &Path) -> Result<HashMap<MapData, Svc4Key, Svc4Value>> {
    let data = MapData::from_pin(pin).with_context(|| format!("opening {}", pin.display()))?;
    Ok(HashMap::try_from(Map::from_map_data(data)?)?)
}

/// Writes `name` into `dir` atomically (aside, then renamed in).
fn put(dir: &Path, name: &str, text: &str) -> Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, dir.join(name))?;
    Ok(())
}

/// ms from `start` (before the agent was started) until all `n` frontends are in its map; the map.
fn initial_sync(
    start: Instant,
    pin: &Path,
    n: u32,
) -> Result<(f64, HashMap<MapData, Svc4Key, Svc4Value>)> {
    while start.elapsed() < SYNC_LIMIT {
        if let Ok(map) = open_svc4(pin)
            && map.keys().count() >= n as usize
        {
            return Ok((start.elapsed().as_secs_f64() * 1e3, map));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("the agent did not write {n} frontends within {SYNC_LIMIT:?}")
}

fn weir_update(s: Sizes, figures: &mut BTreeMap<String, Value>) -> Result<()> {
    let n = s.update_services;
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    let netns = NetNs::new();
    let policies = dirs.path("policies");
    std::fs::create_dir_all(&policies)?;
    let mut all = String::new();
    for i in 0..n {
        documents(i, &mut all);
    }
    put(&policies, "services.yaml", &all)?;
    eprintln!("services-bench: starting weir agent with {n} Services");
    let spawned = Instant::now();
    let agent = AgentProcess::start(&root, &dirs, Some(&netns), &[]);
    let pin = root.paths().map_pin(SVC4);
    let (sync_ms, map) = initial_sync(spawned, &pin, n)?;
    let mut samples = Vec::new();
    for r in 0..s.update_rounds {
        let i = n + u32::try_from(r)?;
        let mut doc = String::new();
        documents(i, &mut doc);
        let start = Instant::now();
        put(&policies, &format!("new-{r}.yaml"), &doc)?;
        loop {
            if map.get(&key(i), 0).is_ok() {
                break;
            }
            if start.elapsed() > UPDATE_LIMIT {
                bail!("Service {i} did not reach svc4_v1 within {UPDATE_LIMIT:?}");
            }
            std::thread::sleep(POLL);
        }
        let ms = start.elapsed().as_secs_f64() * 1e3;
        eprintln!("services-bench: one Service added at {i} Services: {ms:.2} ms");
        samples.push(ms);
    }
    drop(agent);
    figures.insert("dir_service_update_ms".into(), json!(median(&mut samples)));
    figures.insert(
        "dir_service_update_max_ms".into(),
        json!(samples.iter().copied().fold(0.0, f64::max)),
    );
    figures.insert("dir_service_full_sync_ms".into(), json!(sync_ms));
    figures.insert("update_services".into(), json!(n));
    figures.insert("update_rounds".into(), json!(s.update_rounds));
    Ok(())
}

/// Service `i` and its EndpointSlice as API objects.
fn objects(i: u32) -> (Value, Value) {
    let (a, b) = (filler_backend(i, 0), filler_backend(i, 1));
    let service = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": format!("svc-{i}"), "namespace": "bench"},
        "spec": {"clusterIP": vip(i).to_string(),
                 "ports": [{"name": "p", "port": PORT, "targetPort": TARGET}]}});
    let slice = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("svc-{i}-1"), "namespace": "bench",
                     "labels": {"kubernetes.io/service-name": format!("svc-{i}")}},
        "addressType": "IPv4",
        "ports": [{"name": "p", "port": TARGET, "protocol": "TCP"}],
        "endpoints": [{"addresses": [a.to_string()], "conditions": {"ready": true}},
                      {"addresses": [b.to_string()], "conditions": {"ready": true}}]});
    (service, slice)
}

fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn kube_update(s: Sizes, figures: &mut BTreeMap<String, Value>) -> Result<()> {
    let n = s.update_services;
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    let netns = NetNs::new();
    netns.exec(&["ip", "link", "set", "lo", "up"]);
    let api = KubeApi::start(Some(&netns));
    for i in 0..n {
        let (service, slice) = objects(i);
        api.apply(slice);
        api.apply(service);
    }
    eprintln!("services-bench: starting weir agent --source kubernetes with {n} Services");
    let spawned = Instant::now();
    let kubeconfig = api.kubeconfig().display().to_string();
    let agent = AgentProcess::start(
        &root,
        &dirs,
        Some(&netns),
        &["--source", "kubernetes", "--kubeconfig", &kubeconfig],
    );
    let pin = root.paths().map_pin(SVC4);
    let (sync_ms, map) = initial_sync(spawned, &pin, n)?;
    let mut samples = Vec::new();
    for r in 0..s.update_rounds {
        let i = n + u32::try_from(r)?;
        let (service, slice) = objects(i);
        api.apply(slice);
        let rv = api.apply(service);
        let deadline = Instant::now() + UPDATE_LIMIT;
        loop {
            if map.get(&key(i), 0).is_ok_and(|v| v.backend_count == 2) {
                break;
            }
            if Instant::now() > deadline {
                bail!("Service {i} did not reach svc4_v1 within {UPDATE_LIMIT:?}");
            }
            std::thread::sleep(POLL);
        }
        let done = now_ns();
        let sent = api
            .sent_at("Service", rv)
            .context("the Service's watch event was sent")?;
        let ms = done.saturating_sub(sent) as f64 / 1e6;
        eprintln!(
            "services-bench: one Service added at {i} Services (Kubernetes source): {ms:.2} ms"
        );
        samples.push(ms);
    }
    drop(agent);
    figures.insert("service_update_ms".into(), json!(median(&mut samples)));
    figures.insert(
        "service_update_max_ms".into(),
        json!(samples.iter().copied().fold(0.0, f64::max)),
    );
    figures.insert("service_full_sync_ms".into(), json!(sync_ms));
    Ok(())
}

fn iptables_update(s: Sizes, figures: &mut BTreeMap<String, Value>) -> Result<()> {
    let n = s.update_services;
    let backend = Ipv4Addr::new(10, 249, 0, 11);
    let before = rules::iptables(n, n / 2, backend);
    let after = rules::iptables(n + 1, n / 2, backend);
    let mut samples = Vec::new();
    for _ in 0..s.update_rounds {
        let ns = NetNs::new();
        feed(&ns, "iptables-nft-restore", &[], &before)?;
        let start = Instant::now();
        feed(&ns, "iptables-nft-restore", &["--noflush"], &after)?;
        samples.push(start.elapsed().as_secs_f64() * 1e3);
    }
    figures.insert(
        "iptables_restore_ms_10k".into(),
        json!(median(&mut samples)),
    );
    Ok(())
}

pub fn run(s: Sizes, figures: &mut BTreeMap<String, Value>) -> Result<()> {
    kube_update(s, figures)?;
    weir_update(s, figures)?;
    iptables_update(s, figures)
}
