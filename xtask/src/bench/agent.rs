//! `cargo xtask bench agent [--smoke]`: runs the `agent-bench` example of the `tests` crate (the
//! agent's own code on the real kernel, plus a real `weir agent`), which prints a table and writes
//! `target/weir-bench/agent.json`. Release build; `--smoke` uses the dev build and small counts.

use std::path::Path;

use anyhow::{Context as _, Result};

pub(crate) fn run(workspace: &Path, smoke: bool) -> Result<()> {
    run_example_with_weir(workspace, smoke, "agent-bench", "agent")
}

/// Builds `weir` (release; dev with `--smoke`), then runs the `tests` crate's `example` with it in
/// `WEIR_BIN`, writing `target/weir-bench/<name>.json`. Shared with `bench k8s`.
pub(super) fn run_example_with_weir(
    workspace: &Path,
    smoke: bool,
    example: &str,
    name: &str,
) -> Result<()> {
    run_example_with_weir_args(workspace, smoke, example, name, &[])
}

/// [`run_example_with_weir`], passing `extra` arguments to the example too (`bench services`).
pub(super) fn run_example_with_weir_args(
    workspace: &Path,
    smoke: bool,
    example: &str,
    name: &str,
    extra: &[&str],
) -> Result<()> {
    let out = workspace.join("target/weir-bench");
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let json = out.join(format!("{name}.json"));
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
    let mut args: Vec<&str> = vec!["run", "-q", "-p", "tests", "--example", example];
    args.extend(profile);
    args.extend(["--", "--out", &json_arg]);
    if smoke {
        args.push("--smoke");
    }
    args.extend(extra);
    let status = std::process::Command::new("cargo")
        .args(&args)
        .current_dir(workspace)
        .env("WEIR_BIN", &weir)
        .status()
        .context("cannot run cargo")?;
    anyhow::ensure!(status.success(), "the {name} benchmark failed ({status})");
    println!("wrote {}", json.display());
    Ok(())
}
