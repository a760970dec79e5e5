//! `cargo xtask fuzz`: builds the cargo-fuzz targets of `fuzz/` (libFuzzer, the eBPF nightly) and
//! runs each for a while from its seed corpus (`fuzz/corpus/NAME`). `--smoke` is CI's short run
//! (fixed seed; fails on any finding); without it, a long run of `--seconds` per target whose
//! figures (executions, exec/s, libFuzzer's `cov:`/`ft:`, corpus, findings) are printed and written
//! to `target/weir-fuzz/fuzz.json`. docs/fuzzing.md says how a finding becomes a regression test.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use crate::{ebpf_build::EbpfBuild, util};

/// The targets, in the order they run (`fuzz/Cargo.toml`'s binaries; `fuzz::TARGETS`).
pub(crate) const TARGETS: &[&str] = &[
    "cni_config",
    "cni_env",
    "manifest",
    "api_bodies",
    "ipam_records",
    "drop_event",
];

/// Seconds per target of a smoke run (six targets: under two minutes of fuzzing).
const SMOKE_SECONDS: u64 = 15;
/// Seconds per target of a long run, unless `--seconds` says otherwise.
const LONG_SECONDS: u64 = 300;
/// The libFuzzer seed of smoke runs, so that CI's run is the same each time.
const SMOKE_SEED: u32 = 1;
/// One input may take this long before it counts as a finding (a hang).
const INPUT_TIMEOUT_SECS: u64 = 10;
/// The cargo-fuzz version `cargo xtask setup` installs.
pub(crate) const CARGO_FUZZ_VERSION: &str = "0.13.2";

/// What to run.
pub(crate) struct Options<'a> {
    /// CI's short run.
    pub smoke: bool,
    /// Seconds per target (default: 15 with `--smoke`, else 300).
    pub seconds: Option<u64>,
    /// Only these targets (default: all).
    pub only: &'a [String],
}

/// One target's run, as libFuzzer reported it.
#[derive(Debug, Default, PartialEq)]
struct Figures {
    executions: u64,
    exec_per_sec: u64,
    cov: u64,
    ft: u64,
    corpus_units: u64,
    new_units: u64,
    peak_rss_mb: u64,
}

pub(crate) fn run(ws: &Path, opts: &Options<'_>) -> Result<()> {
    let targets: Vec<&str> = if opts.only.is_empty() {
        TARGETS.to_vec()
    } else {
        for t in opts.only {
            if !TARGETS.contains(&t.as_str()) {
                bail!("no fuzz target {t:?}; the targets are {TARGETS:?}");
            }
        }
        opts.only.iter().map(String::as_str).collect()
    };
    let seconds = opts.seconds.unwrap_or(if opts.smoke {
        SMOKE_SECONDS
    } else {
        LONG_SECONDS
    });
    let nightly = EbpfBuild::nightly(ws).map_err(anyhow::Error::msg)?;
    let bins = util::step("fuzz: build the targets", || {
        build(ws, &nightly, opts.smoke)
    })?;
    let out = ws.join("target/weir-fuzz");
    let mut results = serde_json::Map::new();
    let mut failed = Vec::new();
    for target in &targets {
        let (figures, findings, elapsed) =
            run_target(ws, &bins, &out, target, seconds, opts.smoke)?;
        println!(
            "fuzz {target}: {} executions in {elapsed:.0} s ({} exec/s), cov {} ft {}, corpus {} (+{} new), {} finding(s){}",
            figures.executions,
            figures.exec_per_sec,
            figures.cov,
            figures.ft,
            figures.corpus_units,
            figures.new_units,
            findings.len(),
            findings
                .iter()
                .map(|f| format!("\n  {}", f.display()))
                .collect::<String>()
        );
        if !findings.is_empty() {
            failed.push(*target);
        }
        results.insert(
            (*target).to_owned(),
            json!({
                "executions": figures.executions,
                "exec_per_sec": figures.exec_per_sec,
                "cov": figures.cov,
                "ft": figures.ft,
                "corpus_units": figures.corpus_units,
                "new_units": figures.new_units,
                "peak_rss_mb": figures.peak_rss_mb,
                "seconds": elapsed.round(),
                "findings": findings.len(),
                "artifacts": findings.iter().map(|f| f.display().to_string()).collect::<Vec<_>>(),
            }),
        );
    }
    let report = json!({
        "mode": if opts.smoke { "smoke" } else { "long" },
        "seconds_per_target": seconds,
        "sanitizer": "none",
        "toolchain": nightly,
        "targets": Value::Object(results),
    });
    let file = out.join(if opts.smoke {
        "fuzz-smoke.json"
    } else {
        "fuzz.json"
    });
    std::fs::write(&file, serde_json::to_string_pretty(&report)? + "\n")
        .with_context(|| format!("cannot write {}", file.display()))?;
    println!("fuzz: wrote {}", file.display());
    if !failed.is_empty() {
        bail!(
            "fuzz targets {failed:?} found inputs that crash or hang (the artifacts above); reproduce one with \
             `target/x86_64-unknown-linux-gnu/release (debug after --smoke)/TARGET ARTIFACT` and make it a regression test (docs/fuzzing.md)"
        );
    }
    Ok(())
}

/// `cargo fuzz build` on the eBPF nightly: every target, no sanitizer (the code under test is
/// safe Rust: a panic is the finding, and AddressSanitizer would halve the executions), 16
/// codegen units (cargo-fuzz's default of one makes the agent's dependencies build for many
/// minutes). A smoke run's build is the dev profile (`--dev`: no optimisation, so a fresh clone
/// in CI builds in a fraction of the release build's time; fewer executions in its short run).
/// The directory of the built targets.
fn build(ws: &Path, nightly: &str, dev: bool) -> Result<PathBuf> {
    let version = util::output("rustup", &["run", nightly, "cargo", "fuzz", "--version"])
        .context("cargo-fuzz is not installed: run `cargo xtask setup` (or `cargo install --locked cargo-fuzz`)")?;
    if !version.contains(CARGO_FUZZ_VERSION) {
        println!(
            "fuzz: {} (setup installs {CARGO_FUZZ_VERSION})",
            version.trim()
        );
    }
    let status = Command::new("rustup")
        .args(["run", nightly, "cargo", "fuzz", "build"])
        .args(["--sanitizer", "none", "--codegen-units", "16"])
        .args(dev.then_some("--dev"))
        .current_dir(ws)
        .env_remove("RUSTUP_TOOLCHAIN")
        .status()
        .context("cannot run cargo fuzz")?;
    if !status.success() {
        bail!("`cargo fuzz build` failed ({status})");
    }
    let profile = if dev { "debug" } else { "release" };
    Ok(ws.join("target/x86_64-unknown-linux-gnu").join(profile))
}

/// Runs one target for `seconds` from its seeds; its figures, its findings (crash, timeout and
/// out-of-memory artifacts) and how long it ran.
fn run_target(
    ws: &Path,
    bins: &Path,
    out: &Path,
    target: &str,
    seconds: u64,
    smoke: bool,
) -> Result<(Figures, Vec<PathBuf>, f64)> {
    let seeds = ws.join("fuzz/corpus").join(target);
    // What the runs add to the corpus stays under target/: a smoke run starts afresh each time, a
    // long run goes on from the previous long run's corpus.
    let corpus = out
        .join(if smoke { "smoke-corpus" } else { "corpus" })
        .join(target);
    if smoke {
        let _ = std::fs::remove_dir_all(&corpus);
    }
    let artifacts = out.join("artifacts").join(target);
    for dir in [&corpus, &artifacts] {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let before = artifact_files(&artifacts)?;
    let mut cmd = Command::new(bins.join(target));
    cmd.arg(format!("-max_total_time={seconds}"))
        .arg(format!("-timeout={INPUT_TIMEOUT_SECS}"))
        .arg("-rss_limit_mb=2048")
        .arg("-print_final_stats=1")
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .arg(&corpus)
        .arg(&seeds)
        .current_dir(ws)
        .stdout(Stdio::null());
    if smoke {
        cmd.arg(format!("-seed={SMOKE_SEED}"));
    }
    let started = Instant::now();
    let output = cmd
        .output()
        .with_context(|| format!("cannot run fuzz target {}", bins.join(target).display()))?;
    let elapsed = started.elapsed().as_secs_f64();
    let log = String::from_utf8_lossy(&output.stderr);
    let log_file = out.join(format!("{target}.log"));
    std::fs::write(&log_file, log.as_bytes())
        .with_context(|| format!("cannot write {}", log_file.display()))?;
    let findings: Vec<PathBuf> = artifact_files(&artifacts)?
        .into_iter()
        .filter(|f| !before.contains(f))
        .collect();
    if !output.status.success() && findings.is_empty() {
        bail!(
            "fuzz target {target} failed ({}) without an artifact; its log is {}",
            output.status,
            log_file.display()
        );
    }
    Ok((parse_stats(&log), findings, elapsed))
}

fn artifact_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    files.sort();
    Ok(files)
}

/// The figures of libFuzzer's log: its final stats (`-print_final_stats=1`) and its last status
/// line (`#N ... cov: C ft: F corp: U/SIZE ...`).
fn parse_stats(log: &str) -> Figures {
    let stat = |name: &str| {
        log.lines()
            .find_map(|l| l.strip_prefix(&format!("stat::{name}:")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let status = log
        .lines()
        .rev()
        .find(|l| l.starts_with('#') && l.contains(" cov: "))
        .unwrap_or_default();
    let field = |name: &str| {
        status
            .split_whitespace()
            .skip_while(|w| *w != name)
            .nth(1)
            .and_then(|v| v.split('/').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Figures {
        executions: stat("number_of_executed_units"),
        exec_per_sec: stat("average_exec_per_sec"),
        cov: field("cov:"),
        ft: field("ft:"),
        corpus_units: field("corp:"),
        new_units: stat("new_units_added"),
        peak_rss_mb: stat("peak_rss_mb"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libfuzzer_figures_are_read() {
        let log = "INFO: Seed: 1\n#2\tINITED cov: 10 ft: 11 corp: 3/120b exec/s: 0 rss: 30Mb\n\
                   #4096\tpulse  cov: 40 ft: 90 corp: 9/1Kb lim: 40 exec/s: 2048 rss: 40Mb\n\
                   #5000\tDONE   cov: 42 ft: 95 corp: 10/1Kb lim: 40 exec/s: 2500 rss: 41Mb\n\
                   Done 5000 runs in 2 second(s)\n\
                   stat::number_of_executed_units: 5000\nstat::average_exec_per_sec:     2500\n\
                   stat::new_units_added:          7\nstat::slowest_unit_time_sec:    0\n\
                   stat::peak_rss_mb:              41\n";
        assert_eq!(
            parse_stats(log),
            Figures {
                executions: 5000,
                exec_per_sec: 2500,
                cov: 42,
                ft: 95,
                corpus_units: 10,
                new_units: 7,
                peak_rss_mb: 41,
            }
        );
        assert_eq!(parse_stats("no stats"), Figures::default());
    }

    #[test]
    fn targets_match_the_fuzz_crate() {
        let manifest = std::fs::read_to_string(crate::workspace().join("fuzz/Cargo.toml"))
            .expect("fuzz/Cargo.toml");
        let bins: Vec<&str> = manifest
            .lines()
            .filter_map(|l| l.strip_prefix("name = \""))
            .filter_map(|l| l.strip_suffix('"'))
            .filter(|n| *n != "fuzz")
            .collect();
        assert_eq!(
            bins, TARGETS,
            "fuzz/Cargo.toml's binaries against xtask's TARGETS"
        );
    }
}
