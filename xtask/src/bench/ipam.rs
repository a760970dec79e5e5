//! `cargo xtask bench ipam [--smoke]`: builds `weir` and the `ipam-bench` example in release mode, runs the
//! example (which measures the embedded store, etcd, and `weir ipam` processes against host-local), prints a
//! table and writes `target/weir-bench/ipam.json`.

use std::{path::Path, process::Command};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

/// Figures the issue asks for, with the target each one is measured against.
const ROWS: &[(&str, &str)] = &[
    (
        "embedded_allocs_per_s",
        "(a) embedded, 8 clients: allocations/s (target >= 5000)",
    ),
    ("embedded_p50_ms", "(a) embedded, 8 clients: p50 ms"),
    ("embedded_p99_ms", "(a) embedded, 8 clients: p99 ms"),
    ("embedded_seq_p50_ms", "(a) embedded, 1 client: p50 ms"),
    ("embedded_seq_p99_ms", "(a) embedded, 1 client: p99 ms"),
    ("etcd_allocs_per_s", "(b) etcd, 8 clients: allocations/s"),
    ("etcd_p50_ms", "(b) etcd, 8 clients: p50 ms"),
    ("etcd_p99_ms", "(b) etcd, 8 clients: p99 ms (target <= 10)"),
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
        "cli_allocs_per_s",
        "(d) weir ipam allocate+release processes/s",
    ),
    (
        "hostlocal_allocs_per_s",
        "(d) host-local ADD+DEL processes/s (target <= weir)",
    ),
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
    let out = Command::new("cargo")
        .args(&args)
        .current_dir(workspace)
        .output()
        .context("cannot run cargo")?;
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
