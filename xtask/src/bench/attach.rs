//! `cargo xtask bench attach [--smoke]`: runs the `attach-bench` example of the `tests` crate
//! (tcx links vs clsact + `cls_bpf` filters: attach, replace and veth deletion at 1 and 200
//! veths, in one run), which prints a table and writes `target/weir-bench/attach.json`. Release
//! build; `--smoke` uses the dev build and 1 and 3 veths.

use std::path::Path;

use anyhow::{Context as _, Result};

pub(crate) fn run(workspace: &Path, smoke: bool) -> Result<()> {
    let out = workspace.join("target/weir-bench");
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let json = out.join("attach.json");
    let json_arg = json.display().to_string();
    let mut args: Vec<&str> = vec!["run", "-q", "-p", "tests", "--example", "attach-bench"];
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
    anyhow::ensure!(status.success(), "the attach benchmark failed ({status})");
    println!("wrote {}", json.display());
    Ok(())
}
