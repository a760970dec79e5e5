//! `cargo xtask bench k8s [--smoke]`: builds `weir` and runs the `k8s-bench` example of the
//! `tests` crate with it (the real `weir agent --source kubernetes` against the test API server in
//! a `wt*` node namespace: 5,000 pods, 100 namespaces, 1,000 policies), which prints a table and
//! writes `target/weir-bench/k8s.json`. Release build; `--smoke` uses the dev build and small sizes.

use std::path::Path;

use anyhow::{Context as _, Result};

pub(crate) fn run(workspace: &Path, smoke: bool) -> Result<()> {
    let out = workspace.join("target/weir-bench");
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let json = out.join("k8s.json");
    let profile: &[&str] = if smoke { &[] } else { &["--release"] };
    let build: Vec<&str> = ["build", "-p", "agent", "--bin", "weir"]
        .iter()
        .copied()
        .chain(profile.iter().copied())
        .collect();
    crate::util::run(workspace, "cargo", &build)?;
    let target: std::path::PathBuf =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| workspace.join("target"), Into::into);
    let weir = target
        .join(if smoke { "debug" } else { "release" })
        .join("weir");
    let json_arg = json.display().to_string();
    let mut args: Vec<&str> = vec!["run", "-q", "-p", "tests", "--example", "k8s-bench"];
    args.extend(profile);
    args.extend(["--", "--out", &json_arg]);
    if smoke {
        args.push("--smoke");
    }
    let status = std::process::Command::new("cargo")
        .args(&args)
        .current_dir(workspace)
        .env("WEIR_BIN", &weir)
        .status()
        .context("cannot run cargo")?;
    anyhow::ensure!(status.success(), "the k8s benchmark failed ({status})");
    println!("wrote {}", json.display());
    Ok(())
}
