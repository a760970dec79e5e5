//! `cargo xtask bench policy [--smoke]`: runs the `policy-bench` example of the `tests` crate
//! (the agent's calculation and dataplane loop in process on the real kernel maps, pinned under a
//! `wt*` pin root of its own), which prints a table and writes `target/weir-bench/policy.json`.
//! Release build; `--smoke` uses the dev build and small sizes.

use std::path::Path;

use anyhow::{Context as _, Result};

pub(crate) fn run(workspace: &Path, smoke: bool) -> Result<()> {
    let out = workspace.join("target/weir-bench");
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let json = out.join("policy.json");
    let json_arg = json.display().to_string();
    let mut args: Vec<&str> = vec!["run", "-q", "-p", "tests", "--example", "policy-bench"];
    if !smoke {
        args.push("--release");
    }
    args.extend(["--", "--out", &json_arg]);
    if smoke {
        args.push("--smoke");
    }
    let status = std::process::Command::new("cargo")
        .args(&args)
        .current_dir(workspace)
        .status()
        .context("cannot run cargo")?;
    anyhow::ensure!(status.success(), "the policy benchmark failed ({status})");
    println!("wrote {}", json.display());
    Ok(())
}
