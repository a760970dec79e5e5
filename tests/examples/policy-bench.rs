//! `cargo xtask bench policy`: the calculation and the dataplane loop on the real kernel maps,
//! in process (issue 10's benchmark; `tests::bench_node`). The maps are the agent's own, created and
//! pinned by its loader under a `wt*` pin root of the benchmark's (removed at the end); there are no
//! veths (the attachment driver sees every link in place), so what is measured is sources →
//! calculation → map drivers → kernel maps.
//! - full compute: 1,000 endpoints in 50 namespaces and 500 NetworkPolicies (selectors over pod
//!   and namespace labels, ports and ranges, CIDRs with exceptions), from the registry and policy
//!   files on disk to every entry in the kernel maps, from empty maps;
//! - one pod's label change (the API's endpoint command) until its generation is in the kernel:
//!   latency, and the writes it caused against those a fresh full compile before and after calls
//!   for;
//! - one policy edit, from the moment the edited file is renamed into the policy directory (an
//!   operator's atomic save landing) until its generation is in the kernel: through the agent's own
//!   policy-directory source (`sources::policy_dir`: its inotify wake and parse), the loop and
//!   the map drivers; with its writes against the reference compile as above. Separately, before
//!   that source runs, the compute-only part: the directory parsed outside the clock, then from the
//!   source's command (`Command::Policies`) to the kernel (`policy_compute_*`), and the parse alone
//!   (`policy_reload_parse_p50_ms`);
//! - `GET /v1/status` over the real unix socket while the loop converges 10,000 endpoints.
//!
//! The drift refresh's cost over the same kind of node is `cargo xtask bench datapath`'s.
//!
//! Prints a table and writes the JSON given by `--out`. `--smoke`: small sizes, few rounds.

use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use agent::{
    api::{
        client::{Client, Method},
        server::{self, Api},
        types::Status,
    },
    calc::{ipam_service::IpamService, reference},
    control::applier::{Command, LoopHandle},
    paths::Paths,
    sources::policy_dir,
    synthetic::{self, Sizes},
};
use anyhow::{Context as _, Result};
use serde_json::json;
use tests::{
    agent_proc::AgentDirs,
    bench_node::{feed_links, links, open, wait},
    bpf::PinRoot,
};

/// Kernel writes and deletes of every map driver so far.
fn writes(handle: &LoopHandle) -> u64 {
    writes_in(&handle.snapshot())
}

/// Kernel writes and deletes of every map driver up to `snapshot`.
fn writes_in(snapshot: &agent::control::snapshot::Snapshot) -> u64 {
    snapshot
        .stats
        .maps
        .iter()
        .map(|(_, s)| s.writes + s.deletes)
        .sum()
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let at = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[at.min(v.len() - 1)]
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

struct Changes {
    label_ms: Vec<f64>,
    label_writes: u64,
    label_expected: usize,
    /// Compute-only: from `Command::Policies` (parsed outside the clock) to the kernel.
    compute_ms: Vec<f64>,
    compute_writes: u64,
    compute_expected: usize,
    parse_ms: Vec<f64>,
}

/// Where an edit of the policy file is staged before it is renamed into the directory: beside the
/// directory, on the same filesystem, so the source never sees it half-written.
fn staging(paths: &Paths) -> PathBuf {
    paths.policy_dir.with_file_name("synthetic.yaml.edit")
}

/// Stages an edit of `pol3`'s first port (83 to 93 or back) in [`staging`]; renaming it into the
/// directory ([`land_edit`]) is the edit.
fn stage_edit(paths: &Paths) -> Result<()> {
    let file = paths.policy_dir.join("synthetic.yaml");
    let text = std::fs::read_to_string(&file)?;
    let at = text.find("name: pol3, namespace").context("pol3")?;
    // Only within pol3's own document: a later policy may have either port too.
    let doc = &text[at..text[at..].find("\n---").map_or(text.len(), |end| at + end)];
    let (offset, from, to) = match doc.find("port: 83}") {
        Some(o) => (o + at, "port: 83}", "port: 93}"),
        None => (
            doc.find("port: 93}").context("pol3's port")? + at,
            "port: 93}",
            "port: 83}",
        ),
    };
    std::fs::write(
        staging(paths),
        format!("{}{to}{}", &text[..offset], &text[offset + from.len()..]),
    )?;
    Ok(())
}

/// Renames the staged edit into the policy directory, as an editor's atomic save does.
fn land_edit(paths: &Paths) -> Result<()> {
    std::fs::rename(staging(paths), paths.policy_dir.join("synthetic.yaml"))?;
    Ok(())
}

async fn changes(
    paths: &Paths,
    handle: &LoopHandle,
    links: &BTreeMap<String, u32>,
    rounds: usize,
) -> Result<Changes> {
    let mut out = Changes {
        label_ms: Vec::new(),
        label_writes: 0,
        label_expected: 0,
        compute_ms: Vec::new(),
        compute_writes: 0,
        compute_expected: 0,
        parse_ms: Vec::new(),
    };
    for round in 0..rounds {
        // The first two rounds (one each way) are checked against the reference compile.
        let check = round < 2;
        let before = if check {
            Some(reference::compile(paths, links)?)
        } else {
            None
        };
        let mut endpoint = handle
            .snapshot()
            .endpoint("c1:eth0")
            .context("endpoint c1")?
            .endpoint
            .clone();
        let app = if round.is_multiple_of(2) { "a21" } else { "a1" };
        endpoint.labels.insert("app".into(), app.into());
        let w = writes(handle);
        let t = Instant::now();
        handle
            .upsert_endpoint(endpoint, Duration::from_secs(60))
            .await?
            .applied()
            .await?;
        out.label_ms.push(t.elapsed().as_secs_f64() * 1e3);
        if let Some(before) = before {
            let after = reference::compile(paths, links)?;
            out.label_writes = out.label_writes.max(writes(handle) - w);
            out.label_expected = out.label_expected.max(before.diff(&after).len());
            anyhow::ensure!(
                writes(handle) - w == before.diff(&after).len() as u64,
                "label change round {round}: {} writes, {} expected",
                writes(handle) - w,
                before.diff(&after).len()
            );
        }

        let before = if check {
            Some(reference::compile(paths, links)?)
        } else {
            None
        };
        stage_edit(paths)?;
        land_edit(paths)?;
        let t = Instant::now();
        let (set, errors) = agent::calc::policy::load::load_dir(&paths.policy_dir);
        out.parse_ms.push(t.elapsed().as_secs_f64() * 1e3);
        anyhow::ensure!(errors.is_empty(), "edited policy refused: {errors:?}");
        let generation = handle.snapshot().summary.generation;
        let w = writes(handle);
        let t = Instant::now();
        handle.send(Command::Policies { set, errors })?;
        wait(handle, "policy edit", |s| s.applied.generation > generation).await?;
        out.compute_ms.push(t.elapsed().as_secs_f64() * 1e3);
        if let Some(before) = before {
            let after = reference::compile(paths, links)?;
            let expected = before.diff(&after).len();
            out.compute_writes = out.compute_writes.max(writes(handle) - w);
            out.compute_expected = out.compute_expected.max(expected);
            anyhow::ensure!(
                writes(handle) - w == expected as u64,
                "policy compute round {round}: {} writes, {expected} expected",
                writes(handle) - w
            );
        }
    }
    Ok(out)
}

/// Policy edits as an operator makes them: each staged beside the directory, then renamed into it
/// with the clock started just before the rename, through the agent's policy-directory source
/// (started here from the directory's current state, as the agent starts it) until the loop has
/// applied a generation after it. Returns the latencies (ms), the most writes of a checked round
/// and the most that round's reference diff called for.
async fn edits_through_source(
    paths: &Paths,
    handle: &LoopHandle,
    links: &BTreeMap<String, u32>,
    rounds: usize,
) -> Result<(Vec<f64>, u64, usize)> {
    let source = tokio::spawn(policy_dir::run(
        handle.clone(),
        paths.policy_dir.clone(),
        policy_dir::first_read(&paths.policy_dir),
    ));
    let (mut ms, mut most_writes, mut most_expected) = (Vec::new(), 0, 0);
    for round in 0..rounds {
        // The first two rounds (one each way) are checked against the reference compile.
        let before = if round < 2 {
            Some(reference::compile(paths, links)?)
        } else {
            None
        };
        stage_edit(paths)?;
        let generation = handle.snapshot().summary.generation;
        let w = writes(handle);
        let t = Instant::now();
        land_edit(paths)?;
        // Applied, and its writes in the kernel maps (every edit changes entries; checked below).
        wait(handle, "policy edit through the source", |s| {
            s.applied.generation > generation && writes_in(s) > w
        })
        .await?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        if let Some(before) = before {
            let after = reference::compile(paths, links)?;
            let expected = before.diff(&after).len();
            anyhow::ensure!(
                expected > 0,
                "policy edit round {round}: the edit changes no entry"
            );
            most_writes = most_writes.max(writes(handle) - w);
            most_expected = most_expected.max(expected);
            anyhow::ensure!(
                writes(handle) - w == expected as u64,
                "policy edit round {round}: {} writes, {expected} expected",
                writes(handle) - w
            );
        }
    }
    source.abort();
    Ok((ms, most_writes, most_expected))
}

/// `GET /v1/status` latencies over the real socket while the loop converges `sizes`.
async fn status_during_converge(sizes: Sizes) -> Result<(Vec<f64>, f64, usize)> {
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    let mut paths = root.paths();
    paths.state_dir = dirs.path("state");
    paths.policy_dir = dirs.path("policies");
    paths.api_socket = dirs.path("weir.sock");
    synthetic::write(&paths, sizes)?;
    let links = links(sizes);
    let (handle, thread, _) = open(&paths, None)?;
    let ipam = IpamService::open(
        &format!("embedded:{}", dirs.path("ipam.redb").display()),
        "wt-bench",
        BTreeMap::new(),
        &[],
        (26, 122),
        Duration::from_secs(600),
        &paths.state_dir,
    )
    .await?;
    let api = Arc::new(Api {
        dataplane: handle.clone(),
        ipam: Arc::new(ipam),
        node: "wt-bench".into(),
        paths: paths.clone(),
        ct: Arc::default(),
        ct_ops: Arc::default(),
        ct_layout: 2,
        tc_attach: agent::attach::Mechanism::default(),
        kernel: Arc::new(agent::kernel::real::inspect::PinnedInspect::new(&paths)),
        monitor: agent::observe::monitor::Monitor::default(),
        pod_wait: None,
        socket_lb: None,
        socket_lb_scope: None,
        nat: std::sync::Arc::default(),
    });
    let socket = paths.api_socket.clone();
    let server = tokio::spawn(async move { server::serve(&socket, api).await });
    let done = Arc::new(AtomicBool::new(false));
    let mut pollers = Vec::new();
    while !paths.api_socket.exists() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    for _ in 0..2 {
        let (socket, done) = (paths.api_socket.clone(), Arc::clone(&done));
        pollers.push(tokio::spawn(async move {
            let mut ms = Vec::new();
            while !done.load(Ordering::Relaxed) {
                let t = Instant::now();
                match Client::new(&socket, Duration::from_secs(60))
                    .call::<(), Status>(Method::GET, "/v1/status", None, "status")
                    .await
                {
                    Ok(_) => ms.push(t.elapsed().as_secs_f64() * 1e3),
                    // The socket is bound a moment after the loop starts.
                    Err(_) if ms.is_empty() => tokio::time::sleep(Duration::from_millis(1)).await,
                    Err(e) => return Err(anyhow::anyhow!("status failed: {e}")),
                }
            }
            Ok(ms)
        }));
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let t = Instant::now();
    feed_links(&handle, &links)?;
    wait(&handle, "converge", |s| s.applied.ready).await?;
    let converge_s = t.elapsed().as_secs_f64();
    done.store(true, Ordering::Relaxed);
    let mut ms = Vec::new();
    for p in pollers {
        ms.extend(p.await??);
    }
    let entries = handle
        .snapshot()
        .stats
        .maps
        .iter()
        .map(|(_, s)| s.writes)
        .sum::<u64>();
    server.abort();
    handle.stop();
    let _joined = thread.join();
    Ok((ms, converge_s, usize::try_from(entries)?))
}

async fn run(smoke: bool) -> Result<HashMap<&'static str, serde_json::Value>> {
    let sizes = if smoke {
        Sizes {
            endpoints: 100,
            namespaces: 10,
            policies: 50,
        }
    } else {
        Sizes {
            endpoints: 1000,
            namespaces: 50,
            policies: 500,
        }
    };
    let rounds = if smoke { 4 } else { 100 };
    let load_start = loadavg();

    // 1. Full compute and write from empty.
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    let mut paths = root.paths();
    paths.state_dir = dirs.path("state");
    paths.policy_dir = dirs.path("policies");
    synthetic::write(&paths, sizes)?;
    let links = links(sizes);
    let t = Instant::now();
    let (handle, thread, load_s) = open(&paths, None)?;
    feed_links(&handle, &links)?;
    wait(&handle, "full compute", |s| s.applied.ready).await?;
    let full_s = t.elapsed().as_secs_f64() - load_s;
    let expected = reference::compile(&paths, &links)?;
    let full_writes = writes(&handle);
    anyhow::ensure!(
        full_writes == expected.entries() as u64,
        "from empty: {full_writes} writes, {} entries expected",
        expected.entries()
    );

    // 2. Label and policy changes.
    let changes = changes(&paths, &handle, &links, rounds).await?;
    let (policy_ms, policy_writes, policy_expected) =
        edits_through_source(&paths, &handle, &links, rounds).await?;
    handle.stop();
    let _joined = thread.join();
    drop(root);

    // 3. Status while converging 10,000 endpoints.
    let big = if smoke {
        Sizes {
            endpoints: 1000,
            namespaces: 50,
            policies: 50,
        }
    } else {
        Sizes {
            endpoints: 10_000,
            namespaces: 50,
            policies: 50,
        }
    };
    let (status_ms, converge_s, converge_entries) = status_during_converge(big).await?;

    Ok(HashMap::from([
        ("smoke", json!(smoke)),
        ("endpoints", json!(sizes.endpoints)),
        ("namespaces", json!(sizes.namespaces)),
        ("policies", json!(sizes.policies)),
        ("entries", json!(expected.entries())),
        ("policy_entries", json!(expected.policy.len())),
        ("full_compute_s", json!(full_s)),
        ("program_load_s", json!(load_s)),
        (
            "label_change_p50_ms",
            json!(percentile(changes.label_ms.clone(), 0.5)),
        ),
        (
            "label_change_p99_ms",
            json!(percentile(changes.label_ms, 0.99)),
        ),
        ("label_change_writes", json!(changes.label_writes)),
        (
            "label_change_expected_writes",
            json!(changes.label_expected),
        ),
        (
            "policy_change_p50_ms",
            json!(percentile(policy_ms.clone(), 0.5)),
        ),
        ("policy_change_p99_ms", json!(percentile(policy_ms, 0.99))),
        ("policy_change_writes", json!(policy_writes)),
        ("policy_change_expected_writes", json!(policy_expected)),
        (
            "policy_compute_p50_ms",
            json!(percentile(changes.compute_ms.clone(), 0.5)),
        ),
        (
            "policy_compute_p99_ms",
            json!(percentile(changes.compute_ms, 0.99)),
        ),
        ("policy_compute_writes", json!(changes.compute_writes)),
        (
            "policy_compute_expected_writes",
            json!(changes.compute_expected),
        ),
        (
            "policy_reload_parse_p50_ms",
            json!(percentile(changes.parse_ms, 0.5)),
        ),
        ("converge_endpoints", json!(big.endpoints)),
        ("converge_entries", json!(converge_entries)),
        ("converge_s", json!(converge_s)),
        ("status_samples_during_converge", json!(status_ms.len())),
        (
            "status_p50_ms_during_converge",
            json!(percentile(status_ms.clone(), 0.5)),
        ),
        (
            "status_p99_ms_during_converge",
            json!(percentile(status_ms, 0.99)),
        ),
        ("loadavg_start", json!(load_start)),
        ("loadavg_end", json!(loadavg())),
    ]))
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
    anyhow::ensure!(
        tests::privileged::require_root("policy-bench"),
        "the policy benchmark needs root (its maps are pinned on bpffs)"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let figures = runtime.block_on(run(smoke))?;
    println!("{:<36} {:>16}  target", "figure", "value");
    for (key, target) in [
        ("endpoints", ""),
        ("namespaces", ""),
        ("policies", ""),
        ("entries", ""),
        ("policy_entries", ""),
        ("full_compute_s", "<= 1 s"),
        ("label_change_p50_ms", ""),
        ("label_change_p99_ms", "<= 5 ms"),
        ("label_change_writes", "= expected"),
        ("label_change_expected_writes", ""),
        ("policy_change_p50_ms", ""),
        ("policy_change_p99_ms", "<= 5 ms"),
        ("policy_change_writes", "= expected"),
        ("policy_change_expected_writes", ""),
        ("policy_compute_p50_ms", ""),
        ("policy_compute_p99_ms", ""),
        ("policy_compute_writes", "= expected"),
        ("policy_compute_expected_writes", ""),
        ("policy_reload_parse_p50_ms", ""),
        ("converge_endpoints", ""),
        ("converge_entries", ""),
        ("converge_s", ""),
        ("status_samples_during_converge", ""),
        ("status_p50_ms_during_converge", ""),
        ("status_p99_ms_during_converge", "<= 50 ms"),
        ("loadavg_start", ""),
        ("loadavg_end", ""),
    ] {
        println!("{key:<36} {:>16}  {target}", figures[key].to_string());
    }
    std::fs::write(&out, serde_json::to_vec_pretty(&figures)?)?;
    Ok(())
}
