//! `cargo xtask bench cni [--smoke]`: ADD and DEL latency of `weir-cni` against a real agent, and
//! in the same run of Debian's `bridge` + `host-local` doing the same ADD/DEL, over 200 pods
//! (10 with `--smoke`). Every pod is a fresh network namespace; each plugin runs in a node
//! namespace of its own, exec'd exactly as a runtime does (environment + config on stdin).
//! The two plugins run interleaved, weir then bridge, over 5 rounds of 40 pods each (2 with
//! `--smoke`); `add_p50_ratio` is the median of the rounds' weir-over-bridge ADD p50 ratios, with
//! their min and max as its spread. Prints a table and writes `target/weir-bench/cni.json`.

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use super::judge::{Cmp, Target, Threshold};

/// The targets (BENCHMARKS.md, CNI): weir-cni against Debian's `bridge` + `host-local`, same run.
pub(crate) const TARGETS: &[Target] = &[
    Target::full(
        "add_p50_ratio",
        Cmp::Le,
        1.0,
        "a pod's ADD is no slower than the reference plugins' (median of the rounds' p50 ratios)",
        "BENCHMARKS.md: CNI",
    ),
    Target::new(
        "weir_add_p99_ms",
        Cmp::Le,
        Threshold::Figure {
            key: "bridge_add_p99_ms",
            factor: 2.0,
        },
        "the ADD tail stays within 2x the reference plugins'",
        "BENCHMARKS.md: CNI",
    ),
];

const DEBIAN_CNI: &str = "/usr/lib/cni";

/// Rounds of the interleaved comparison (weir, then bridge, in each).
const ROUNDS: usize = 5;

pub(crate) fn run(workspace: &Path, smoke: bool) -> Result<()> {
    let pods = if smoke { 10 } else { 200 };
    let target: PathBuf =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| workspace.join("target"), Into::into);
    // WEIR_BIN and WEIR_CNI_BIN point at prebuilt binaries (as in the tests); otherwise build.
    let (weir, plugin) = match (
        std::env::var_os("WEIR_BIN"),
        std::env::var_os("WEIR_CNI_BIN"),
    ) {
        (Some(weir), Some(plugin)) => (PathBuf::from(weir), PathBuf::from(plugin)),
        _ => {
            // The smoke run (in CI) reuses the dev build the tests made; the real run is release.
            let (flags, dir): (&[&str], &str) = if smoke {
                (&[], "debug")
            } else {
                (&["--release"], "release")
            };
            let mut args = vec!["build", "-p", "agent", "-p", "cni", "--bins"];
            args.extend(flags);
            crate::util::run(workspace, "cargo", &args)?;
            (
                target.join(dir).join("weir"),
                target.join(dir).join("weir-cni"),
            )
        }
    };
    if !Path::new(DEBIAN_CNI).join("bridge").is_file() {
        bail!("{DEBIAN_CNI}/bridge is missing: apt-get install containernetworking-plugins");
    }

    let lab = Lab::new()?;
    let weir_node = lab.netns("wn")?;
    let bridge_node = lab.netns("bn")?;
    let agent = lab.start_agent(&weir, &weir_node)?;
    let weir_conf = json!({
        "cniVersion": "1.0.0", "name": "wt-bench", "type": "weir-cni",
        "agentSocket": lab.dir.join("weir.sock"), "bpfRoot": lab.pin_root,
        // info: every ADD logs where its time went (`timings=phase=ms … total=ms`).
        "logFile": lab.dir.join("weir-cni.log"), "logLevel": "info",
    });
    wait_status(&plugin, &weir_node, &weir_conf)?;
    let bridge_conf = json!({
        "cniVersion": "1.0.0", "name": "wt-bench-br", "type": "bridge",
        "bridge": format!("wtbr{}", std::process::id() % 100_000), "isGateway": true,
        "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.250.0.0/16"}]],
                 "dataDir": lab.dir.join("host-local")},
    });
    let bridge = Path::new(DEBIAN_CNI).join("bridge");

    // Interleaved, A B A B: each round measures weir then bridge on `pods / rounds` fresh pods, so
    // a change of load during the run hits both; the ratios are per round.
    let per_round = pods / ROUNDS;
    let (mut weir_times, mut bridge_times) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
    let (mut add_p50_ratios, mut del_p50_ratios) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let w = measure(
            &lab,
            &plugin,
            &weir_node,
            &weir_conf,
            per_round,
            &format!("w{round}-"),
        )?;
        let b = measure(
            &lab,
            &bridge,
            &bridge_node,
            &bridge_conf,
            per_round,
            &format!("b{round}-"),
        )?;
        add_p50_ratios.push(percentile(&w.0, 50.0) / percentile(&b.0, 50.0));
        del_p50_ratios.push(percentile(&w.1, 50.0) / percentile(&b.1, 50.0));
        weir_times.0.extend(w.0);
        weir_times.1.extend(w.1);
        bridge_times.0.extend(b.0);
        bridge_times.1.extend(b.1);
    }
    drop(agent);
    let phases = add_phases(&lab.dir.join("weir-cni.log"), &weir_times.0);
    let (add_ratio, add_min, add_max) = spread(&add_p50_ratios);
    let (del_ratio, del_min, del_max) = spread(&del_p50_ratios);

    let figures = json!({
        "pods": ROUNDS * per_round,
        "rounds": ROUNDS,
        "add_p50_ratio": add_ratio,
        "add_p50_ratio_min": add_min,
        "add_p50_ratio_max": add_max,
        "del_p50_ratio": del_ratio,
        "del_p50_ratio_min": del_min,
        "del_p50_ratio_max": del_max,
        "weir_add_p50_ms": percentile(&weir_times.0, 50.0),
        "weir_add_p99_ms": percentile(&weir_times.0, 99.0),
        "weir_del_p50_ms": percentile(&weir_times.1, 50.0),
        "weir_del_p99_ms": percentile(&weir_times.1, 99.0),
        "bridge_add_p50_ms": percentile(&bridge_times.0, 50.0),
        "bridge_add_p99_ms": percentile(&bridge_times.0, 99.0),
        "bridge_del_p50_ms": percentile(&bridge_times.1, 50.0),
        "bridge_del_p99_ms": percentile(&bridge_times.1, 99.0),
        "weir_add_phases_ms": phases,
    });
    print_table(&figures, smoke);
    print_phases(&figures["weir_add_phases_ms"]);
    let dir = workspace.join("target").join("weir-bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let path = dir.join("cni.json");
    std::fs::write(&path, serde_json::to_string_pretty(&figures)?)
        .with_context(|| format!("cannot write {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

fn print_table(figures: &Value, smoke: bool) {
    let f = |k: &str| figures[k].as_f64().unwrap_or(f64::NAN);
    println!(
        "{:<34} {:>10} {:>10}   ({} pods{})",
        "cni benchmark (ms)",
        "p50",
        "p99",
        figures["pods"],
        if smoke { ", smoke" } else { "" }
    );
    for (label, p50, p99) in [
        ("weir-cni ADD", "weir_add_p50_ms", "weir_add_p99_ms"),
        (
            "bridge + host-local ADD",
            "bridge_add_p50_ms",
            "bridge_add_p99_ms",
        ),
        ("weir-cni DEL", "weir_del_p50_ms", "weir_del_p99_ms"),
        (
            "bridge + host-local DEL",
            "bridge_del_p50_ms",
            "bridge_del_p99_ms",
        ),
    ] {
        println!("{label:<34} {:>10.2} {:>10.2}", f(p50), f(p99));
    }
    println!(
        "weir over bridge, per-round p50 ({} rounds, interleaved): ADD {} ({}–{}), DEL {} ({}–{})",
        figures["rounds"],
        figures["add_p50_ratio"],
        figures["add_p50_ratio_min"],
        figures["add_p50_ratio_max"],
        figures["del_p50_ratio"],
        figures["del_p50_ratio_min"],
        figures["del_p50_ratio_max"],
    );
}

/// Where weir's ADD time went, from the plugin's `timings=` log lines: p50/p99 of each phase,
/// and `outside`, the wall time the runtime saw minus the plugin's own total (process start,
/// config, logging and runtime set-up, exit).
fn add_phases(log: &Path, wall: &[f64]) -> Value {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut phases: Vec<(String, Vec<f64>)> = Vec::new();
    let mut totals = Vec::new();
    for line in text.lines() {
        let Some(at) = line.find("netlink-open=") else {
            continue;
        };
        for token in line[at..].split_whitespace() {
            let Some((name, value)) = token.split_once('=') else {
                break;
            };
            let Some(ms) = value
                .trim_end_matches("ms")
                .parse::<f64>()
                .ok()
                .filter(|_| value.ends_with("ms"))
            else {
                break;
            };
            if name == "total" {
                totals.push(ms);
            }
            match phases.iter_mut().find(|(n, _)| n == name) {
                Some((_, v)) => v.push(ms),
                None => phases.push((name.to_owned(), vec![ms])),
            }
        }
    }
    let mut out = serde_json::Map::new();
    for (name, samples) in &phases {
        out.insert(
            name.clone(),
            json!({"p50": percentile(samples, 50.0), "p99": percentile(samples, 99.0)}),
        );
    }
    if totals.len() == wall.len() {
        let outside: Vec<f64> = wall.iter().zip(&totals).map(|(w, t)| w - t).collect();
        out.insert(
            "outside".to_owned(),
            json!({"p50": percentile(&outside, 50.0), "p99": percentile(&outside, 99.0)}),
        );
    }
    Value::Object(out)
}

fn print_phases(phases: &Value) {
    let Some(phases) = phases.as_object().filter(|p| !p.is_empty()) else {
        return;
    };
    println!("weir-cni ADD by phase (ms)");
    for (name, v) in phases {
        let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
        println!("  {name:<32} {:>10.2} {:>10.2}", f("p50"), f("p99"));
    }
}

/// ADD then DEL of `pods` fresh pods; returns (ADD ms, DEL ms).
fn measure(
    lab: &Lab,
    plugin: &Path,
    node: &str,
    conf: &Value,
    pods: usize,
    tag: &str,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let names: Vec<String> = (0..pods)
        .map(|i| lab.netns(&format!("{tag}{i}")))
        .collect::<Result<_>>()?;
    let mut adds = Vec::with_capacity(pods);
    let mut results = Vec::with_capacity(pods);
    for (i, ns) in names.iter().enumerate() {
        let id = format!("wt-bench-{tag}-{i}");
        let start = Instant::now();
        let out = exec(plugin, node, "ADD", &id, ns, conf)?;
        adds.push(start.elapsed().as_secs_f64() * 1e3);
        results.push(out);
    }
    let mut dels = Vec::with_capacity(pods);
    for (i, (ns, prev)) in names.iter().zip(&results).enumerate() {
        let id = format!("wt-bench-{tag}-{i}");
        let mut conf = conf.clone();
        conf["prevResult"] = prev.clone();
        let start = Instant::now();
        exec(plugin, node, "DEL", &id, ns, &conf)?;
        dels.push(start.elapsed().as_secs_f64() * 1e3);
    }
    Ok((adds, dels))
}

fn exec(
    plugin: &Path,
    node: &str,
    command: &str,
    id: &str,
    ns: &str,
    conf: &Value,
) -> Result<Value> {
    let mut child = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{node}"))
        .arg("--")
        .arg(plugin)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", id)
        .env("CNI_NETNS", format!("/run/netns/{ns}"))
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", DEBIAN_CNI)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {}", plugin.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(conf.to_string().as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "{} {command} failed: {}{}",
            plugin.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(serde_json::from_slice(&out.stdout).unwrap_or(Value::Null))
}

fn wait_status(plugin: &Path, node: &str, conf: &Value) -> Result<()> {
    // STATUS is a CNI 1.1.0 verb: ask it at 1.1.0 whatever version the measured calls use.
    let mut conf = conf.clone();
    conf["cniVersion"] = json!("1.1.0");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if exec(plugin, node, "STATUS", "wt-status", "none", &conf).is_ok() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the agent did not turn ready within 30 s");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
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

fn percentile(samples: &[f64], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = (p / 100.0 * (sorted.len() - 1) as f64).round() as usize;
    (sorted[rank.min(sorted.len() - 1)] * 1000.0).round() / 1000.0
}

/// Namespaces, a pin root and a directory, all `wt…`, removed on drop.
struct Lab {
    prefix: String,
    dir: PathBuf,
    pin_root: PathBuf,
    namespaces: std::cell::RefCell<Vec<String>>,
}

impl Lab {
    fn new() -> Result<Self> {
        let prefix = format!("wtb{:05x}", std::process::id() & 0xf_ffff);
        let dir = std::env::temp_dir().join(format!("{prefix}-cni"));
        std::fs::create_dir_all(&dir)?;
        Ok(Self {
            pin_root: PathBuf::from("/sys/fs/bpf").join(&prefix),
            dir,
            prefix,
            namespaces: std::cell::RefCell::new(Vec::new()),
        })
    }

    fn netns(&self, suffix: &str) -> Result<String> {
        let name = format!("{}{suffix}", self.prefix);
        crate::util::run(Path::new("/"), "ip", &["netns", "add", &name])?;
        self.namespaces.borrow_mut().push(name.clone());
        crate::util::run(
            Path::new("/"),
            "ip",
            &["netns", "exec", &name, "ip", "link", "set", "lo", "up"],
        )?;
        Ok(name)
    }

    fn start_agent(&self, weir: &Path, node: &str) -> Result<super::agent_proc::AgentGuard> {
        crate::util::run(
            Path::new("/"),
            "ip",
            &[
                "netns",
                "exec",
                node,
                "sysctl",
                "-qw",
                "net.ipv4.ip_forward=1",
            ],
        )?;
        super::agent_proc::start(weir, node, &self.dir, &self.pin_root)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for ns in self.namespaces.borrow().iter() {
            let _ = Command::new("ip").args(["netns", "delete", ns]).output();
        }
        let _ = std::fs::remove_dir_all(&self.pin_root);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn spread_is_the_median_with_min_and_max() {
        assert_eq!(super::spread(&[1.2, 0.8, 1.0]), (1.0, 0.8, 1.2));
        assert_eq!(super::spread(&[2.0, 1.0, 4.0, 3.0]), (2.5, 1.0, 4.0));
        assert!(super::spread(&[f64::NAN]).0.is_nan());
    }
}
