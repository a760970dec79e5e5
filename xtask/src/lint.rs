//! `cargo xtask lint`: the kernel-call check (`kernel_calls`), the layer check (`layers`), the Markdown
//! checks (`md_lint`), rustfmt, BENCHMARKS.md's summary against the recorded results (`bench::summary`),
//! and clippy with `-D warnings` on every crate — the host crates for the host, the eBPF crate (and each
//! test-only variant) for its BPF target.

use std::{path::Path, process::Command};

use anyhow::{Context as _, Result, bail};

use crate::{ebpf_build::EbpfBuild, util};

/// eBPF feature sets linted besides the default build (test-only variants).
const EBPF_VARIANTS: &[&[&str]] = &[
    &[],
    &["verifier-reject"],
    &["ct-v2"],
    &["debug-log"],
    &["bench"],
];

pub(crate) fn run(ws: &Path) -> Result<()> {
    crate::kernel_calls::run(ws)?;
    crate::layers::run(ws)?;
    crate::md_lint::run(ws).context("the Markdown lint failed")?;
    util::run(ws, "cargo", &["fmt", "--all", "--check"])
        .context("formatting differs: run `cargo fmt --all`")?;
    crate::bench::summary::check(ws)?;
    util::run(
        ws,
        "cargo",
        &[
            "clippy",
            "--workspace",
            "--exclude",
            "ebpf",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    let nightly = EbpfBuild::nightly(ws).map_err(anyhow::Error::msg)?;
    for features in EBPF_VARIANTS {
        let build = EbpfBuild {
            workspace: ws,
            release: true,
            features,
        };
        let mut cmd = Command::new("rustup");
        cmd.current_dir(ws.join("ebpf"))
            .args([
                "run",
                &nightly,
                "cargo",
                "clippy",
                "--package",
                "ebpf",
                "--release",
            ])
            .args([
                "--target",
                crate::ebpf_build::TARGET,
                "-Z",
                "build-std=core",
                "--target-dir",
            ])
            .arg(build.target_dir())
            .env_remove("RUSTUP_TOOLCHAIN")
            .env(
                "CARGO_ENCODED_RUSTFLAGS",
                crate::ebpf_build::RUSTFLAGS.join("\x1f"),
            );
        if !features.is_empty() {
            cmd.arg("--features").arg(features.join(","));
        }
        cmd.args(["--", "-D", "warnings"]);
        let status = cmd
            .status()
            .context("cannot run clippy for the eBPF crate")?;
        if !status.success() {
            bail!("clippy on the eBPF crate (features {features:?}) failed");
        }
    }
    Ok(())
}
