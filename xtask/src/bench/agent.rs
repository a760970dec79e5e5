//! `cargo xtask bench agent [--smoke]`: runs the `agent-bench` example of the `tests` crate (the
//! agent's own code on the real kernel, converging through its dataplane loop, plus a real
//! `weir agent`), which prints a table and writes `target/weir-bench/agent.json`. Release build;
//! `--smoke` uses the dev build and small counts.

use std::path::Path;

use anyhow::{Context as _, Result};

use super::judge::{Cmp, Target};

/// The targets (BENCHMARKS.md, Agent): converge, restart, memory, reaction times, conntrack
/// migration at 10,000 endpoints and 1,000,000 conntrack entries.
pub(crate) const TARGETS: &[Target] = &[
    Target::full(
        "converge_s",
        Cmp::Lt,
        2.0,
        "converge from empty in under 2 s",
        "BENCHMARKS.md: Agent",
    ),
    Target::full(
        "resync_s",
        Cmp::Lt,
        1.0,
        "a restart resyncs in under 1 s",
        "BENCHMARKS.md: Agent",
    ),
    Target::full(
        "resync_writes",
        Cmp::Le,
        0.0,
        "a restart rewrites nothing in the kernel",
        "BENCHMARKS.md: Agent",
    )
    .always()
    .may_be_zero(),
    Target::full(
        "rss_mib",
        Cmp::Lt,
        150.0,
        "RSS after converging under 150 MiB",
        "BENCHMARKS.md: Agent",
    ),
    Target::full(
        "link_attach_ms",
        Cmp::Le,
        100.0,
        "a new weir* link has both programs within 100 ms",
        "BENCHMARKS.md: Agent",
    ),
    Target::full(
        "policy_apply_ms",
        Cmp::Le,
        100.0,
        "a policy file written reaches the kernel map within 100 ms",
        "BENCHMARKS.md: Agent",
    ),
    Target::full(
        "restart_max_gap_ms",
        Cmp::Le,
        200.0,
        "a live flow pauses at most 200 ms across an agent restart",
        "BENCHMARKS.md: Agent",
    ),
    Target::full(
        "ct_migrate_1m_s",
        Cmp::Lt,
        3.0,
        "conntrack migration of 1,000,000 entries in under 3 s",
        "BENCHMARKS.md: Agent",
    ),
    Target::full(
        "ct_migrate_lost",
        Cmp::Le,
        0.0,
        "the migration loses no entry",
        "BENCHMARKS.md: Agent",
    )
    .always()
    .may_be_zero(),
];

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
