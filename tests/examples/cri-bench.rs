//! `cargo xtask bench cri`: the pod start a user waits for, through containerd's CRI as kubelet
//! calls it — weir (the agent's own conflist, weir-cni) vs Debian's `bridge` + `host-local`
//! through the same containerd build, in one run, each on a node namespace and containerd of its
//! own (`tests::cri`). Latency: `RunPodSandbox`, then `StopPodSandbox` + `RemovePodSandbox`, over
//! N sandboxes one at a time (they stay up until all have started). Churn: W parallel loops of
//! run + stop + remove for S seconds; cycles per second, errors, and what was left behind. The two
//! run interleaved over R rounds (5; 3 with `--smoke`), weir then bridge in each, with N / R
//! sandboxes and S / R seconds of churn per round; `run_p50_ratio` and `churn_ratio` are the
//! medians of the rounds' weir-over-bridge ratios, with their min and max as the spread.
//!
//! Usage: `cri-bench --out FILE [--smoke]` (`WEIR_BIN`, `WEIR_CNI_BIN` name the binaries).

use std::{
    path::PathBuf,
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use serde_json::{Value, json};
use tests::{
    bin,
    cni::CniNode,
    cri::{Cri, CriSetup, PodSpec},
    netns::NetNs,
};

const DEBIAN_CNI: &str = "/usr/lib/cni";
/// weir-cni's default log, as containerd's mount namespace sees it.
const CNI_LOG: &str = "/var/log/weir/cni.log";

/// p50 of each phase of weir-cni's ADD (its `timings=phase=…ms` log lines).
fn add_phases(log: &str) -> Vec<(String, f64)> {
    let mut phases: Vec<(String, Vec<f64>)> = Vec::new();
    for line in log.lines() {
        let Some(at) = line.find("timings=") else {
            continue;
        };
        for token in line[at + "timings=".len()..].split_whitespace() {
            let Some((name, value)) = token.split_once('=') else {
                break;
            };
            let Some(ms) = value.strip_suffix("ms").and_then(|v| v.parse::<f64>().ok()) else {
                break;
            };
            match phases.iter_mut().find(|(n, _)| n == name) {
                Some((_, v)) => v.push(ms),
                None => phases.push((name.to_owned(), vec![ms])),
            }
        }
    }
    phases
        .into_iter()
        .map(|(name, samples)| (name, percentile(&samples, 50.0)))
        .collect()
}

#[derive(Clone, Copy)]
struct Sizes {
    /// Interleaved rounds (weir, then bridge, in each).
    rounds: usize,
    /// Sandboxes per plugin over all rounds.
    sandboxes: usize,
    workers: usize,
    churn: Duration,
}

fn percentile(samples: &[f64], p: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        return 0.0;
    }
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "a rank within a small sample"
    )]
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    (sorted[rank] * 1000.0).round() / 1000.0
}

/// The median of per-round ratios, with their min and max (the spread), rounded to 3 decimals.
fn spread(ratios: &[f64]) -> (f64, f64, f64) {
    let round = |v: f64| (v * 1000.0).round() / 1000.0;
    let mut sorted: Vec<f64> = ratios.iter().copied().filter(|r| r.is_finite()).collect();
    if sorted.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let median = if n % 2 == 1 {
        sorted[n / 2]
    } else {
        f64::midpoint(sorted[n / 2 - 1], sorted[n / 2])
    };
    (round(median), round(sorted[0]), round(sorted[n - 1]))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Latency of N sandboxes: run times, then stop+remove times (ms).
fn latency(cri: &Cri, n: usize, tag: &str) -> Result<(Vec<f64>, Vec<f64>)> {
    let mut runs = Vec::with_capacity(n);
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let spec = PodSpec::new("bench", &format!("{tag}-lat-{i}"));
        let start = Instant::now();
        let id = cri
            .run_pod(&spec)
            .map_err(|e| anyhow::anyhow!("RunPodSandbox {}: {e}", spec.name))?;
        runs.push(ms(start.elapsed()));
        ids.push(id);
    }
    let mut removes = Vec::with_capacity(n);
    for id in &ids {
        let start = Instant::now();
        cri.stop(id)
            .map_err(|e| anyhow::anyhow!("StopPodSandbox: {e}"))?;
        cri.remove(id)
            .map_err(|e| anyhow::anyhow!("RemovePodSandbox: {e}"))?;
        removes.push(ms(start.elapsed()));
    }
    Ok((runs, removes))
}

/// W loops of run + stop + remove for the churn duration: (cycles per second, errors).
fn churn(cri: &Cri, sizes: &Sizes, tag: &str) -> (f64, u64, Vec<String>) {
    let cycles = AtomicU64::new(0);
    let errors = AtomicU64::new(0);
    let first_errors = std::sync::Mutex::new(Vec::new());
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    std::thread::scope(|scope| {
        for w in 0..sizes.workers {
            let (cycles, errors, first_errors, stop) = (&cycles, &errors, &first_errors, &stop);
            scope.spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) && start.elapsed() < sizes.churn {
                    let spec = PodSpec::new("churn", &format!("{tag}-w{w}-{i}"));
                    i += 1;
                    let result = cri.run_pod(&spec).and_then(|id| {
                        cri.stop(&id)?;
                        cri.remove(&id)
                    });
                    match result {
                        Ok(()) => {
                            cycles.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            if let Ok(mut first) = first_errors.lock()
                                && first.len() < 5
                            {
                                first.push(e.message().to_owned());
                            }
                        }
                    }
                }
            });
        }
    });
    stop.store(true, Ordering::Relaxed);
    let elapsed = start.elapsed().as_secs_f64();
    #[expect(clippy::cast_precision_loss, reason = "a count of cycles")]
    let rate = cycles.load(Ordering::Relaxed) as f64 / elapsed;
    (
        (rate * 10.0).round() / 10.0,
        errors.load(Ordering::Relaxed),
        first_errors.into_inner().unwrap_or_default(),
    )
}

/// Links left in `ns` other than loopback and the bridge itself.
fn leftover_links(ns: &NetNs, keep: &[&str]) -> Vec<String> {
    let out = ns.exec(&["ip", "-o", "link", "show"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap_or(n).to_owned())
        .filter(|n| n != "lo" && !keep.contains(&n.as_str()))
        .collect()
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let out = args
        .iter()
        .position(|a| a == "--out")
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from)
        .context("usage: cri-bench --out FILE [--smoke]")?;
    let smoke = args.iter().any(|a| a == "--smoke");
    let sizes = if smoke {
        Sizes {
            rounds: 3,
            sandboxes: 6,
            workers: 2,
            churn: Duration::from_secs(3),
        }
    } else {
        Sizes {
            rounds: 5,
            sandboxes: 100,
            workers: 8,
            churn: Duration::from_secs(60),
        }
    };
    let bridge_bin = PathBuf::from(DEBIAN_CNI).join("bridge");
    let host_local = PathBuf::from(DEBIAN_CNI).join("host-local");
    if !bridge_bin.is_file() || !host_local.is_file() {
        bail!(
            "{DEBIAN_CNI}/bridge or host-local is missing: apt-get install containernetworking-plugins"
        );
    }

    // weir: the agent's conflist as written, weir-cni as the only plugin.
    let node = CniNode::start(&["--pool", "10.244.0.0/16"]);
    let weir = Cri::start(
        &node.ns,
        &CriSetup {
            conf_dir: node.dirs.path("net.d"),
            plugins: vec![("weir-cni".into(), bin::weir_cni())],
        },
    );
    // bridge + host-local through a containerd of its own.
    let bridge_ns = NetNs::new();
    let bridge_dir = tempfile::Builder::new().prefix("wt-crib").tempdir()?;
    let bridge_name = format!("wtbr{}", std::process::id() % 100_000);
    std::fs::write(
        bridge_dir.path().join("10-bridge.conflist"),
        json!({
            "cniVersion": "1.0.0", "name": "wt-bench-br",
            "plugins": [{"type": "bridge", "bridge": bridge_name, "isGateway": true,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.250.0.0/16"}]],
                         "dataDir": bridge_dir.path().join("host-local")}}],
        })
        .to_string(),
    )?;
    let bridge = Cri::start(
        &bridge_ns,
        &CriSetup {
            conf_dir: bridge_dir.path().to_owned(),
            plugins: vec![
                ("bridge".into(), bridge_bin),
                ("host-local".into(), host_local),
            ],
        },
    );

    // Warm both (image unpack, first CNI load), then measure interleaved, A B A B: each round
    // runs weir's latency, bridge's, weir's churn, bridge's, so a change of load hits both.
    for (cri, tag) in [(&weir, "w"), (&bridge, "b")] {
        latency(cri, 2, &format!("{tag}warm"))?;
    }
    let per_round = sizes.sandboxes / sizes.rounds;
    let round_sizes = Sizes {
        churn: sizes.churn / u32::try_from(sizes.rounds)?,
        ..sizes
    };
    let (mut weir_run, mut weir_remove, mut bridge_run, mut bridge_remove) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut weir_log, mut run_ratios, mut churn_ratios) = (String::new(), Vec::new(), Vec::new());
    let (mut weir_cycles, mut bridge_cycles) = (0.0, 0.0);
    let (mut weir_errors, mut bridge_errors) = (0, 0);
    let (mut weir_first, mut bridge_first) = (Vec::new(), Vec::new());
    for round in 0..sizes.rounds {
        let log_start = weir.read_inside(CNI_LOG).len();
        let (w_run, w_remove) = latency(&weir, per_round, &format!("w{round}"))?;
        weir_log.push_str(
            weir.read_inside(CNI_LOG)
                .get(log_start..)
                .unwrap_or_default(),
        );
        let (b_run, b_remove) = latency(&bridge, per_round, &format!("b{round}"))?;
        run_ratios.push(percentile(&w_run, 50.0) / percentile(&b_run, 50.0));
        let (w_churn, w_errors, w_first) = churn(&weir, &round_sizes, &format!("w{round}"));
        let (b_churn, b_errors, b_first) = churn(&bridge, &round_sizes, &format!("b{round}"));
        churn_ratios.push(w_churn / b_churn);
        weir_run.extend(w_run);
        weir_remove.extend(w_remove);
        bridge_run.extend(b_run);
        bridge_remove.extend(b_remove);
        weir_cycles += w_churn;
        bridge_cycles += b_churn;
        weir_errors += w_errors;
        bridge_errors += b_errors;
        weir_first.extend(w_first);
        bridge_first.extend(b_first);
    }
    #[expect(clippy::cast_precision_loss, reason = "a count of rounds")]
    let (weir_churn, bridge_churn) = (
        (weir_cycles / sizes.rounds as f64 * 10.0).round() / 10.0,
        (bridge_cycles / sizes.rounds as f64 * 10.0).round() / 10.0,
    );
    let phases = add_phases(&weir_log);
    let (run_ratio, run_ratio_min, run_ratio_max) = spread(&run_ratios);
    let (churn_ratio, churn_ratio_min, churn_ratio_max) = spread(&churn_ratios);

    // Nothing left behind: no sandbox, endpoint, address or veth.
    let endpoints = node.api_get("/v1/endpoints");
    let weir_left = leftover_links(&node.ns, &[]);
    let bridge_left = leftover_links(&bridge_ns, &[bridge_name.as_str()]);
    let weir_addresses = node.addresses_in_use();
    let host_local_left = std::fs::read_dir(bridge_dir.path().join("host-local/wt-bench-br"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with("10."))
                .count()
        })
        .unwrap_or(0);
    let leftovers = endpoints.as_array().map_or(0, Vec::len)
        + weir_left.len()
        + bridge_left.len()
        + weir.sandboxes().len()
        + bridge.sandboxes().len()
        + host_local_left
        + usize::try_from(weir_addresses).unwrap_or(usize::MAX);

    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut figures = json!({
        "sandboxes": per_round * sizes.rounds,
        "rounds": sizes.rounds,
        "run_p50_ratio": run_ratio,
        "run_p50_ratio_min": run_ratio_min,
        "run_p50_ratio_max": run_ratio_max,
        "churn_ratio": churn_ratio,
        "churn_ratio_min": churn_ratio_min,
        "churn_ratio_max": churn_ratio_max,
        "churn_workers": sizes.workers,
        "churn_seconds": sizes.churn.as_secs(),
        "weir_run_p50_ms": percentile(&weir_run, 50.0),
        "weir_run_p99_ms": percentile(&weir_run, 99.0),
        "bridge_run_p50_ms": percentile(&bridge_run, 50.0),
        "bridge_run_p99_ms": percentile(&bridge_run, 99.0),
        "weir_remove_p50_ms": percentile(&weir_remove, 50.0),
        "weir_remove_p99_ms": percentile(&weir_remove, 99.0),
        "bridge_remove_p50_ms": percentile(&bridge_remove, 50.0),
        "bridge_remove_p99_ms": percentile(&bridge_remove, 99.0),
        "weir_churn_per_s": weir_churn,
        "bridge_churn_per_s": bridge_churn,
        "churn_errors": weir_errors + bridge_errors,
        "weir_churn_errors": weir_errors,
        "bridge_churn_errors": bridge_errors,
        "leftovers": leftovers,
        "loadavg": load.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
    });
    for (name, p50) in &phases {
        figures[format!("weir_add_{}_p50_ms", name.replace('-', "_"))] = json!(p50);
    }
    print_table(&figures);
    println!(
        "weir-cni ADD phases, p50 ms: {}",
        phases
            .iter()
            .map(|(n, v)| format!("{n} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if !weir_first.is_empty() || !bridge_first.is_empty() {
        println!("first churn errors: weir {weir_first:?}, bridge {bridge_first:?}");
    }
    if leftovers > 0 {
        println!(
            "left behind: endpoints {endpoints}, weir links {weir_left:?}, bridge links {bridge_left:?}, weir addresses in use {weir_addresses}, host-local files {host_local_left}"
        );
    }
    std::fs::write(&out, serde_json::to_string(&figures)?)?;
    ensure!(
        weir_errors == 0 && bridge_errors == 0,
        "churn had errors: weir {weir_first:?}, bridge {bridge_first:?}"
    );
    ensure!(
        leftovers == 0,
        "the benchmark left {leftovers} things behind"
    );
    Ok(())
}

fn print_table(f: &Value) {
    println!(
        "CRI pod sandboxes through containerd ({} one at a time; churn: {} loops × {} s)",
        f["sandboxes"], f["churn_workers"], f["churn_seconds"]
    );
    println!("| figure | weir | bridge + host-local |");
    println!("|---|---|---|");
    for (name, w, b) in [
        (
            "RunPodSandbox p50 (ms)",
            "weir_run_p50_ms",
            "bridge_run_p50_ms",
        ),
        (
            "RunPodSandbox p99 (ms)",
            "weir_run_p99_ms",
            "bridge_run_p99_ms",
        ),
        (
            "Stop+RemovePodSandbox p50 (ms)",
            "weir_remove_p50_ms",
            "bridge_remove_p50_ms",
        ),
        (
            "Stop+RemovePodSandbox p99 (ms)",
            "weir_remove_p99_ms",
            "bridge_remove_p99_ms",
        ),
        ("churn cycles/s", "weir_churn_per_s", "bridge_churn_per_s"),
        ("churn errors", "weir_churn_errors", "bridge_churn_errors"),
    ] {
        println!("| {name} | {} | {} |", f[w], f[b]);
    }
    println!(
        "weir over bridge per round ({} rounds, interleaved): RunPodSandbox p50 {} ({}–{}), churn {} ({}–{})",
        f["rounds"],
        f["run_p50_ratio"],
        f["run_p50_ratio_min"],
        f["run_p50_ratio_max"],
        f["churn_ratio"],
        f["churn_ratio_min"],
        f["churn_ratio_max"]
    );
    println!(
        "left behind: {}; load average {}",
        f["leftovers"], f["loadavg"]
    );
}
