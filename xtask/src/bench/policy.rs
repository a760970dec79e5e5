//! `cargo xtask bench policy [--smoke]`: runs the `policy-bench` example of the `tests` crate (the
//! agent's calculation and dataplane loop in process on the real kernel maps, pinned under a `wt*`
//! pin root of its own; policy edits land as files renamed into the directory and go through the
//! agent's policy-directory source), which prints a table and writes
//! `target/weir-bench/policy.json`. Release build; `--smoke` uses the dev build and small sizes.

use std::path::Path;

use anyhow::{Context as _, Result};

use super::judge::{Cmp, Target, Threshold};

/// The targets (BENCHMARKS.md, Policy): the calculation and dataplane loop on the real kernel maps.
pub(crate) const TARGETS: &[Target] = &[
    Target::full(
        "full_compute_s",
        Cmp::Le,
        1.0,
        "a full compute in at most 1 s",
        "BENCHMARKS.md: Policy",
    ),
    Target::full(
        "label_change_p99_ms",
        Cmp::Le,
        5.0,
        "one pod's label change reaches the kernel within 5 ms (p99)",
        "BENCHMARKS.md: Policy",
    ),
    Target::full(
        "policy_change_p99_ms",
        Cmp::Le,
        5.0,
        "a policy edit reaches the kernel within 5 ms (p99) of its file's rename into the directory",
        "BENCHMARKS.md: Policy",
    ),
    Target::new(
        "label_change_writes",
        Cmp::Le,
        Threshold::Figure {
            key: "label_change_expected_writes",
            factor: 1.0,
        },
        "a label change writes exactly the entries it changes (no more)",
        "BENCHMARKS.md: Policy",
    )
    .always(),
    Target::new(
        "label_change_writes",
        Cmp::Ge,
        Threshold::Figure {
            key: "label_change_expected_writes",
            factor: 1.0,
        },
        "a label change writes exactly the entries it changes (no fewer)",
        "BENCHMARKS.md: Policy",
    )
    .always(),
    Target::new(
        "policy_change_writes",
        Cmp::Le,
        Threshold::Figure {
            key: "policy_change_expected_writes",
            factor: 1.0,
        },
        "a policy edit writes exactly the entries it changes (no more)",
        "BENCHMARKS.md: Policy",
    )
    .always(),
    Target::new(
        "policy_change_writes",
        Cmp::Ge,
        Threshold::Figure {
            key: "policy_change_expected_writes",
            factor: 1.0,
        },
        "a policy edit writes exactly the entries it changes (no fewer)",
        "BENCHMARKS.md: Policy",
    )
    .always(),
    Target::full(
        "status_p99_ms_during_converge",
        Cmp::Le,
        50.0,
        "the status API answers within 50 ms while a converge runs",
        "BENCHMARKS.md: Policy",
    ),
];

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
