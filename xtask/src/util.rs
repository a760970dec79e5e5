//! Running commands and timing steps.

use std::{path::Path, process::Command, time::Instant};

use anyhow::{Context as _, Result, bail};

/// Runs a step and prints how long it took.
pub(crate) fn step<T>(name: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    println!("==> {name}");
    let started = Instant::now();
    let result = f();
    println!(
        "<== {name}: {} in {:.1} s",
        if result.is_ok() { "ok" } else { "FAILED" },
        started.elapsed().as_secs_f64()
    );
    result.with_context(|| format!("step `{name}` failed"))
}

/// Runs `cmd` (in `dir`), inheriting output; fails with the command line when it fails.
pub(crate) fn run(dir: &Path, program: &str, args: &[&str]) -> Result<()> {
    let status = Command::new(program)
        .args(args)
        .current_dir(dir)
        .status()
        .with_context(|| format!("cannot run {program}"))?;
    if !status.success() {
        bail!("`{program} {}` failed ({status})", args.join(" "));
    }
    Ok(())
}

/// Runs a command and returns its stdout, or `None` when it cannot run or fails.
pub(crate) fn output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}
