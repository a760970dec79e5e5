//! `cargo xtask bench ipam [--smoke]`: builds `weir` and the `ipam-bench` example in release mode, starts a
//! `weir agent` in a namespace of its own, runs the example (which measures the embedded store, etcd, 200
//! concurrent allocations through the agent's API, and `weir ipam` processes — through the agent and on a file —
//! against host-local), prints a table and writes `target/weir-bench/ipam.json`.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use super::judge::{Cmp, Target, Threshold};

/// The targets (BENCHMARKS.md, IPAM): (a) to (e) of the IPAM issue; no duplicate address, ever.
pub(crate) const TARGETS: &[Target] = &[
    Target::full(
        "embedded_allocs_per_s",
        Cmp::Ge,
        5000.0,
        "(a) the embedded store, 8 clients, every write durable",
        "BENCHMARKS.md: IPAM",
    ),
    Target::new(
        "etcd_p99_ms",
        Cmp::Le,
        Threshold::ValueOrFigure {
            value: 10.0,
            key: "etcd_wal_fsync_p99_ms",
            factor: 2.0,
        },
        "(b) etcd p99 <= 10 ms, or <= 2x etcd's own WAL fsync p99 when the disk is slower than 5 ms",
        "BENCHMARKS.md: IPAM",
    ),
    Target::new(
        "etcd8_allocs_per_s",
        Cmp::Gt,
        Threshold::Figure {
            key: "etcd1_allocs_per_s",
            factor: 1.0,
        },
        "(c) more hosts allocate more per second: 8 hosts beat 1",
        "BENCHMARKS.md: IPAM",
    ),
    Target::full(
        "etcd1_duplicates",
        Cmp::Le,
        0.0,
        "(c) no address is ever handed out twice",
        "BENCHMARKS.md: IPAM",
    )
    .always()
    .may_be_zero(),
    Target::full(
        "etcd8_duplicates",
        Cmp::Le,
        0.0,
        "(c) no address is ever handed out twice",
        "BENCHMARKS.md: IPAM",
    )
    .always()
    .may_be_zero(),
    Target::full(
        "etcd32_duplicates",
        Cmp::Le,
        0.0,
        "(c) no address is ever handed out twice",
        "BENCHMARKS.md: IPAM",
    )
    .always()
    .may_be_zero(),
    Target::full(
        "cli_over_hostlocal",
        Cmp::Ge,
        1.0,
        "(d) a `weir ipam` process through the agent is at least as fast as host-local (median of interleaved rounds)",
        "BENCHMARKS.md: IPAM",
    ),
    Target::new(
        "agent_api_allocs_per_s",
        Cmp::Ge,
        Threshold::Figure {
            key: "embedded_allocs_per_s",
            factor: 0.5,
        },
        "(e) 200 at once through the agent's API reach half the embedded store's rate",
        "BENCHMARKS.md: IPAM",
    ),
];

/// Figures the issue asks for, with the target each one is measured against.
const ROWS: &[(&str, &str)] = &[
    (
        "embedded_allocs_per_s",
        "(a) embedded, 8 clients: allocations/s (target >= 5000)",
    ),
    (
        "embedded_writes_per_commit",
        "(a) embedded, 8 clients: writes per durable commit",
    ),
    ("embedded_p50_ms", "(a) embedded, 8 clients: p50 ms"),
    ("embedded_p99_ms", "(a) embedded, 8 clients: p99 ms"),
    (
        "embedded_shared_allocs_per_s",
        "(a) embedded, shared file (multi-process): allocations/s",
    ),
    ("embedded_seq_p50_ms", "(a) embedded, 1 client: p50 ms"),
    ("embedded_seq_p99_ms", "(a) embedded, 1 client: p99 ms"),
    ("etcd_allocs_per_s", "(b) etcd, 8 clients: allocations/s"),
    ("etcd_p50_ms", "(b) etcd, 8 clients: p50 ms"),
    (
        "etcd_p99_ms",
        "(b) etcd, 8 clients: p99 ms (<= 10, or <= 2x fsync p99 > 5)",
    ),
    (
        "etcd_wal_fsync_p99_ms",
        "(b) etcd's own WAL fsync p99 ms, same run",
    ),
    (
        "etcd_write_p99_ms",
        "(b) etcd: p99 ms of one write (queue + read + CAS)",
    ),
    ("etcd_read_txn_p99_ms", "(b) etcd: read txn p99 ms"),
    ("etcd_cas_txn_p99_ms", "(b) etcd: CAS txn p99 ms"),
    ("etcd_writes_per_round", "(b) etcd: writes per round"),
    (
        "etcd_queue_ms_per_write",
        "(b) etcd: ms a write waits for its round",
    ),
    (
        "etcd_read_txn_ms_per_round",
        "(b) etcd: read txn ms per round",
    ),
    (
        "etcd_cas_txn_ms_per_round",
        "(b) etcd: CAS txn ms per round",
    ),
    (
        "etcd_cas_lost_per_round",
        "(b) etcd: lost CAS (retries) per round",
    ),
    (
        "etcd_reads_per_alloc",
        "(b) etcd: other reads per allocate+release",
    ),
    ("etcd_read_ms", "(b) etcd: ms per other read"),
    ("etcd1_allocs_per_s", "(c) etcd, 1 host: allocations/s"),
    (
        "etcd8_allocs_per_s",
        "(c) etcd, 8 hosts: allocations/s (target > 1 host)",
    ),
    ("etcd32_allocs_per_s", "(c) etcd, 32 hosts: allocations/s"),
    ("etcd1_duplicates", "(c) duplicates, 1 host (must be 0)"),
    ("etcd8_duplicates", "(c) duplicates, 8 hosts (must be 0)"),
    ("etcd32_duplicates", "(c) duplicates, 32 hosts (must be 0)"),
    (
        "agent_api_allocs_per_s",
        "(e) agent API, 200 at once: allocations/s (>= (a) / 2)",
    ),
    ("agent_api_200_ms", "(e) agent API, 200 at once: ms"),
    (
        "cli_allocs_per_s",
        "(d) weir ipam alloc+release processes/s, via the agent",
    ),
    (
        "cli_file_allocs_per_s",
        "(d) weir ipam alloc+release processes/s, on a file",
    ),
    (
        "hostlocal_allocs_per_s",
        "(d) host-local ADD+DEL processes/s",
    ),
    (
        "cli_over_hostlocal",
        "(d) via the agent over host-local, median of rounds (>= 1)",
    ),
    ("cli_over_hostlocal_min", "(d)   its lowest round"),
    ("cli_over_hostlocal_max", "(d)   its highest round"),
];

pub(crate) fn run(workspace: &Path, smoke: bool) -> Result<()> {
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| workspace.join("target"), Into::into);
    // The smoke run (in CI) reuses the dev build the tests made; real runs are release.
    let (profile, dir): (&[&str], &str) = if smoke {
        (&[], "debug")
    } else {
        (&["--release"], "release")
    };
    let mut build = vec!["build", "-p", "agent", "--bin", "weir"];
    build.extend(profile);
    crate::util::run(workspace, "cargo", &build)?;
    let weir = target.join(dir).join("weir");
    let mut args = vec!["run", "--quiet"];
    args.extend(profile);
    args.extend(["-p", "ipam", "--example", "ipam-bench", "--"]);
    if smoke {
        args.push("--smoke");
    }
    let weir_s = weir.to_string_lossy().into_owned();
    args.extend(["--weir", weir_s.as_str()]);
    let lab = Lab::new()?;
    let agent = lab.start_agent(&weir)?;
    let (socket, datastore) = (
        lab.dir.join("weir.sock").display().to_string(),
        lab.dir
            .join("state")
            .join("ipam.redb")
            .display()
            .to_string(),
    );
    args.extend([
        "--agent-socket",
        socket.as_str(),
        "--agent-datastore",
        datastore.as_str(),
    ]);
    let out = Command::new("cargo")
        .args(&args)
        .current_dir(workspace)
        .output()
        .context("cannot run cargo")?;
    drop(agent);
    drop(lab);
    if !out.status.success() {
        bail!(
            "the ipam benchmark failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .context("the ipam benchmark printed no figures")?;
    let figures: Value =
        serde_json::from_str(line).context("the ipam benchmark printed malformed JSON")?;
    println!(
        "{:<58} {:>12}",
        "ipam benchmark",
        if smoke { "smoke" } else { "value" }
    );
    for (key, label) in ROWS {
        let v = figures.get(key).map_or_else(
            || "-".to_owned(),
            |v| match v.as_f64() {
                Some(f) if f.fract() != 0.0 => format!("{f:.3}"),
                _ => v.to_string(),
            },
        );
        println!("{label:<58} {v:>12}");
    }
    let dir = workspace.join("target").join("weir-bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let path = dir.join("ipam.json");
    std::fs::write(&path, serde_json::to_string_pretty(&figures)?)
        .with_context(|| format!("cannot write {}", path.display()))?;
    println!("wrote {}", path.display());
    for key in ["etcd1_duplicates", "etcd8_duplicates", "etcd32_duplicates"] {
        if figures.get(key).and_then(Value::as_u64).unwrap_or(0) > 0 {
            bail!("{key} is not 0: duplicate addresses were handed out");
        }
    }
    Ok(())
}

/// A network namespace, a pin root and a directory for the agent, all `wt…`, removed on drop.
struct Lab {
    netns: String,
    dir: PathBuf,
    pin_root: PathBuf,
}

impl Lab {
    fn new() -> Result<Self> {
        let name = format!("wtbi{:05x}", std::process::id() & 0xf_ffff);
        let dir = std::env::temp_dir().join(format!("{name}-ipam"));
        std::fs::create_dir_all(&dir)?;
        crate::util::run(Path::new("/"), "ip", &["netns", "add", &name])?;
        let lab = Self {
            pin_root: PathBuf::from("/sys/fs/bpf").join(&name),
            dir,
            netns: name,
        };
        crate::util::run(
            Path::new("/"),
            "ip",
            &["netns", "exec", &lab.netns, "ip", "link", "set", "lo", "up"],
        )?;
        Ok(lab)
    }

    /// `weir agent` inside the namespace (nsenter: the network namespace only, so its pins stay visible), with
    /// the default embedded datastore under its state directory; returns once it reports `started`.
    fn start_agent(&self, weir: &Path) -> Result<super::agent_proc::AgentGuard> {
        super::agent_proc::start(weir, &self.netns, &self.dir, &self.pin_root)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.netns])
            .output();
        let _ = std::fs::remove_dir_all(&self.pin_root);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
