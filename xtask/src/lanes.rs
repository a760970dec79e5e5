//! The `tests` crate's test binaries run in lanes: each binary runs its tests one at a time
//! (`--test-threads=1`: a binary's tests may share its fixtures), and independent binaries run
//! side by side, one per lane. They share no kernel state: every test makes its own namespaces,
//! `wt…` links, pin roots, cgroups, containerd and etcd (tests/README.md), so two binaries at once
//! only share the CPUs. `WEIR_TEST_LANES` sets the number of lanes (default 2, this machine's
//! cores; 1 runs them one after another as `cargo test` would).
//!
//! The binaries are taken from a queue, the slowest first (the order below, from CI's timings),
//! so the lanes end close together. Each binary's output is kept and printed whole when it ends,
//! so lanes do not interleave; a failure does not stop the other binaries, and all failures are
//! listed at the end, each with its failure report again (libtest's `failures:` section and the
//! end of its log), so the tail of a CI log names what went wrong.

use std::{
    collections::VecDeque,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::Instant,
};

use anyhow::{Context as _, Result, bail};

/// Binaries known to take longest (CI, 2026-12-06), started first; the rest follow by name.
const SLOWEST_FIRST: &[&str] = &[
    "netpol_conformance",
    "multinode",
    "services",
    "kube_source",
    "netpol_conformance_api",
    "cri_pods",
    "agent_ct_migrate",
    "agent_endpoints",
];

/// Lanes when `WEIR_TEST_LANES` is not set.
const DEFAULT_LANES: usize = 2;

/// One test binary: its target name and executable.
struct Binary {
    name: String,
    path: PathBuf,
}

/// Builds the `tests` crate's test binaries and returns them (cargo's JSON messages).
fn build(ws: &Path) -> Result<Vec<Binary>> {
    let out = Command::new("cargo")
        .args([
            "test",
            "-p",
            "tests",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .current_dir(ws)
        .stderr(Stdio::inherit())
        .output()
        .context("cannot run cargo")?;
    if !out.status.success() {
        bail!("building the tests crate's tests failed ({})", out.status);
    }
    let mut binaries = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let is_test = msg["reason"] == "compiler-artifact" && msg["profile"]["test"] == true;
        if let (true, Some(path)) = (is_test, msg["executable"].as_str()) {
            let name = msg["target"]["name"].as_str().unwrap_or("?").to_owned();
            binaries.push(Binary {
                name,
                path: PathBuf::from(path),
            });
        }
    }
    if binaries.is_empty() {
        bail!("cargo listed no test binary of the tests crate");
    }
    binaries.sort_by_key(|b| {
        let rank = SLOWEST_FIRST
            .iter()
            .position(|n| *n == b.name)
            .unwrap_or(SLOWEST_FIRST.len());
        (rank, b.name.clone())
    });
    Ok(binaries)
}

/// The number of lanes (`WEIR_TEST_LANES`).
fn lanes() -> Result<usize> {
    match std::env::var("WEIR_TEST_LANES") {
        Err(_) => Ok(DEFAULT_LANES),
        Ok(v) => match v.parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => bail!(
                "WEIR_TEST_LANES={v:?} is not a positive number of lanes; set 1 to run the test binaries one after another"
            ),
        },
    }
}

/// Runs every test binary of the `tests` crate with `env`, in lanes; fails naming each binary
/// that failed.
pub(crate) fn run(ws: &Path, env: &[(&str, &str)]) -> Result<()> {
    let lanes = lanes()?;
    let queue = Arc::new(Mutex::new(build(ws)?.into_iter().collect::<VecDeque<_>>()));
    let failed = Arc::new(Mutex::new(Vec::new()));
    let crate_dir = ws.join("tests");
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let started = Instant::now();
    std::thread::scope(|scope| {
        for lane in 0..lanes {
            let (queue, failed, crate_dir, env) = (&queue, &failed, &crate_dir, &env);
            scope.spawn(move || {
                loop {
                    let next = queue.lock().map(|mut q| q.pop_front()).unwrap_or(None);
                    let Some(binary) = next else { break };
                    if let Err(e) = run_one(&binary, lane, crate_dir, env) {
                        // The whole report comes again at the end; here only its first line.
                        println!("{}", format!("{e:#}").lines().next().unwrap_or_default());
                        if let Ok(mut f) = failed.lock() {
                            f.push((binary.name, format!("{e:#}")));
                        }
                    }
                }
            });
        }
    });
    println!(
        "tests crate: all binaries ran in {:.0} s over {lanes} lanes",
        started.elapsed().as_secs_f64()
    );
    let failed = failed.lock().map(|f| f.clone()).unwrap_or_default();
    if !failed.is_empty() {
        for (name, report) in &failed {
            println!("==== failed: tests/{name}.rs ====\n{report}");
        }
        let names: Vec<&str> = failed.iter().map(|(n, _)| n.as_str()).collect();
        bail!("test binaries failed: {}", names.join(", "));
    }
    Ok(())
}

/// Runs one binary as `cargo test` would (from the crate's directory, one test at a time), then
/// prints its output whole.
fn run_one(binary: &Binary, lane: usize, crate_dir: &Path, env: &[(String, String)]) -> Result<()> {
    let started = Instant::now();
    let out = Command::new(&binary.path)
        .arg("--test-threads=1")
        .current_dir(crate_dir)
        .env("CARGO_MANIFEST_DIR", crate_dir)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}", binary.path.display()))?;
    let took = started.elapsed().as_secs_f64();
    println!(
        "---- tests/{}.rs (lane {lane}, {took:.1} s, {}) ----\n{}{}",
        binary.name,
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        bail!(
            "tests/{}.rs failed ({})\n{}",
            binary.name,
            out.status,
            failure_report(
                &String::from_utf8_lossy(&out.stdout),
                &String::from_utf8_lossy(&out.stderr)
            )
        );
    }
    Ok(())
}

/// Lines of a failed binary's log kept for the report at the end.
const REPORT_TAIL_LINES: usize = 40;

/// What a failed binary's report repeats at the end: libtest's `failures:` section (each failed
/// test's panic and captured output) and the last lines of its log.
fn failure_report(stdout: &str, stderr: &str) -> String {
    let failures = stdout
        .find("\nfailures:\n")
        .map(|at| stdout[at + 1..].to_owned())
        .unwrap_or_default();
    let lines: Vec<&str> = stderr.lines().collect();
    let tail = lines[lines.len().saturating_sub(REPORT_TAIL_LINES)..].join("\n");
    format!("{failures}\n-- the last {REPORT_TAIL_LINES} lines of its log --\n{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_keeps_the_failures_section_and_the_logs_end() {
        let stdout = "running 2 tests\ntest a ... ok\ntest b ... FAILED\n\nfailures:\n\n---- b stdout ----\nboom\n";
        let stderr: String = (0..100).map(|i| format!("log {i}\n")).collect();
        let report = failure_report(stdout, &stderr);
        assert!(report.starts_with("failures:\n"), "{report}");
        assert!(report.contains("boom"));
        assert!(report.contains("log 99") && report.contains("log 60"));
        assert!(!report.contains("log 59\n"), "{report}");
    }
}
