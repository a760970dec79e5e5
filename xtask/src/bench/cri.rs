//! `cargo xtask bench cri [--smoke]`: runs the `cri-bench` example of the `tests` crate — pod
//! sandboxes through containerd's CRI as kubelet creates them, weir vs Debian's `bridge` +
//! `host-local` through the same containerd, in one run — which prints a table and writes
//! `target/weir-bench/cri.json`. Release build; `--smoke` uses the dev build and small counts.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

use super::judge::{Cmp, Target, Threshold};

/// The targets (BENCHMARKS.md, CRI): pod sandboxes through containerd, weir against `bridge` +
/// `host-local` through the same containerd.
pub(crate) const TARGETS: &[Target] = &[
    Target::full(
        "run_p50_ratio",
        Cmp::Le,
        1.0,
        "RunPodSandbox is no slower with weir than with bridge (median of the rounds' p50 ratios)",
        "BENCHMARKS.md: CRI",
    ),
    Target::new(
        "weir_run_p99_ms",
        Cmp::Le,
        Threshold::Figure {
            key: "bridge_run_p99_ms",
            factor: 2.0,
        },
        "the RunPodSandbox tail stays within 2x bridge's",
        "BENCHMARKS.md: CRI",
    ),
    Target::full(
        "churn_ratio",
        Cmp::Ge,
        1.0,
        "create/delete churn at least at bridge's rate (median of the rounds' ratios)",
        "BENCHMARKS.md: CRI",
    ),
    Target::full(
        "weir_churn_errors",
        Cmp::Le,
        0.0,
        "churn never fails a sandbox",
        "BENCHMARKS.md: CRI",
    )
    .always()
    .may_be_zero(),
    Target::full(
        "leftovers",
        Cmp::Le,
        0.0,
        "nothing left behind: no sandbox, endpoint, address, veth or lease",
        "BENCHMARKS.md: CRI",
    )
    .always()
    .may_be_zero(),
];

pub(crate) fn run(workspace: &Path, smoke: bool) -> Result<()> {
    let out = workspace.join("target/weir-bench");
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let json = out.join("cri.json");
    let profile: &[&str] = if smoke { &[] } else { &["--release"] };
    let mut build = vec!["build", "-p", "agent", "-p", "cni", "--bins"];
    build.extend(profile);
    crate::util::run(workspace, "cargo", &build)?;
    let target: PathBuf =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| workspace.join("target"), Into::into);
    let dir = target.join(if smoke { "debug" } else { "release" });
    let json_arg = json.display().to_string();
    let mut args: Vec<&str> = vec!["run", "-q", "-p", "tests", "--example", "cri-bench"];
    args.extend(profile);
    args.extend(["--", "--out", &json_arg]);
    if smoke {
        args.push("--smoke");
    }
    let status = std::process::Command::new("cargo")
        .args(&args)
        .current_dir(workspace)
        .env("WEIR_BIN", dir.join("weir"))
        .env("WEIR_CNI_BIN", dir.join("weir-cni"))
        .status()
        .context("cannot run cargo")?;
    anyhow::ensure!(status.success(), "the CRI benchmark failed ({status})");
    println!("wrote {}", json.display());
    Ok(())
}
