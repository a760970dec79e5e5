//! `cargo xtask`: developer and CI tasks. `setup` installs what a fresh machine lacks,
//! `build-ebpf` builds the programs, `lint`, `test` and `fuzz --smoke` are the gates, `ci` runs them all,
//! `bench NAME` runs a benchmark and judges its targets, `demo` shows the datapath to an operator.

mod bench;
mod ebpf_build;
mod fuzz;
mod image;
mod kernel_calls;
mod lanes;
mod layers;
mod lint;
mod md_lint;
mod setup;
mod test;
mod util;

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "weir's developer tasks")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what a fresh machine lacks: toolchains, rust-src, bpf-linker, Debian packages.
    Setup {
        /// Skip Debian packages.
        #[arg(long)]
        no_apt: bool,
    },
    /// Build the eBPF object (with BTF).
    BuildEbpf {
        /// Release profile (what the agent embeds).
        #[arg(long)]
        release: bool,
        /// eBPF crate features (test-only variants).
        #[arg(long, value_delimiter = ',')]
        features: Vec<String>,
        /// The opt-in debug build: every decision logged through aya-log (feature `debug-log`,
        /// its own object under `target/ebpf-debug-log/`, for `weir agent --ebpf-object`).
        #[arg(long)]
        debug_log: bool,
    },
    /// The container image: static (musl) `weir` and `weir-cni` on an empty base, as an OCI
    /// archive for `ctr images import` (target/weir-image/weir.oci.tar).
    Image {
        /// A debug build (faster to build; what the containerised-agent test uses).
        #[arg(long)]
        debug: bool,
    },
    /// fmt --check, clippy -D warnings on every crate (the eBPF crate on its BPF target).
    Lint,
    /// Every test: unit, packet, privileged, black-box; then checks nothing was left behind.
    Test,
    /// What CI runs: setup, lint, test, `fuzz --smoke` and `bench all --smoke --check` (every
    /// benchmark, judged).
    Ci,
    /// Build the cargo-fuzz targets of `fuzz/` (nightly) and run each from its seed corpus; prints
    /// and writes target/weir-fuzz/fuzz.json (executions, exec/s, cov, ft, corpus, findings) and
    /// fails on any finding (docs/fuzzing.md).
    Fuzz {
        /// CI's short run: 15 s per target, a fixed seed, written to fuzz-smoke.json.
        #[arg(long)]
        smoke: bool,
        /// Seconds per target (default 15 with --smoke, else 300).
        #[arg(long)]
        seconds: Option<u64>,
        /// Only these targets (default: every one).
        targets: Vec<String>,
    },
    /// A real agent, three pods, a sample policy, a denied flow, counters and a trace (root; builds
    /// the debug `weir` it runs first).
    Demo,
    /// Run a benchmark: prints its figures and a verdict per declared target, and writes both to
    /// target/weir-bench/NAME.json. `summary` regenerates BENCHMARKS.md's summary table.
    Bench {
        /// Benchmark name (`all` for every one in turn, `summary` for the table).
        name: String,
        /// A quick run with tiny counts, so benchmarks never rot. Judges only the smoke targets:
        /// each real target's figure present and sane; the real thresholds apply to full runs.
        #[arg(long)]
        smoke: bool,
        /// Only one part of a benchmark (datapath: `testrun` or `traffic`; services: `testrun`,
        /// `traffic`, `update`, `socket` or `sweep`).
        #[arg(long)]
        only: Option<String>,
        /// Exit non-zero, naming each one, when a target is missed or its figure absent.
        /// WEIR_BENCH_BREAK_TARGET=NAME adds an impossible target to benchmark NAME, so that
        /// --check must fail (the proof that it can).
        #[arg(long)]
        check: bool,
        /// Copy the judged JSON of a full run to docs/benchmarks/results/NAME.json (what the
        /// summary table is made from); with `all`, regenerate the summary afterwards.
        #[arg(long)]
        record: bool,
    },
}

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the workspace")
        .to_path_buf()
}

fn main() -> Result<()> {
    let ws = workspace();
    match Cli::parse().command {
        Task::Setup { no_apt } => setup::run(&ws, !no_apt),
        Task::BuildEbpf {
            release,
            features,
            debug_log,
        } => {
            let mut features: Vec<&str> = features.iter().map(String::as_str).collect();
            if debug_log {
                features.push("debug-log");
            }
            let build = ebpf_build::EbpfBuild {
                workspace: &ws,
                release,
                features: &features,
            };
            let object = build.run().map_err(anyhow::Error::msg)?;
            println!("{}", object.display());
            Ok(())
        }
        Task::Image { debug } => {
            let archive = image::run(&ws, !debug)?;
            println!("{} {}", image::IMAGE, archive.display());
            Ok(())
        }
        Task::Lint => lint::run(&ws),
        Task::Test => test::run(&ws),
        Task::Ci => {
            let started = std::time::Instant::now();
            util::step("setup", || setup::run(&ws, true))?;
            util::step("lint", || lint::run(&ws))?;
            util::step("test", || test::run(&ws))?;
            util::step("fuzz --smoke", || {
                fuzz::run(
                    &ws,
                    &fuzz::Options {
                        smoke: true,
                        seconds: None,
                        only: &[],
                    },
                )
            })?;
            util::step("bench all --smoke --check", || {
                let opts = bench::Options {
                    smoke: true,
                    check: true,
                    ..bench::Options::default()
                };
                bench::run(&ws, "all", opts)
            })?;
            println!(
                "xtask ci: all steps passed in {:.0} s",
                started.elapsed().as_secs_f64()
            );
            Ok(())
        }
        Task::Fuzz {
            smoke,
            seconds,
            targets,
        } => fuzz::run(
            &ws,
            &fuzz::Options {
                smoke,
                seconds,
                only: &targets,
            },
        ),
        Task::Demo => demo(&ws),
        Task::Bench {
            name,
            smoke,
            only,
            check,
            record,
        } => {
            let opts = bench::Options {
                smoke,
                only: only.as_deref(),
                check,
                record,
            };
            bench::run(&ws, &name, opts)
        }
    }
}

/// `cargo xtask demo`: checks root first, builds what the demo runs (the debug `weir` and the `demo`
/// example of the tests crate), then runs the example with that `weir` (`tests::demo`).
/// `WEIR_DEMO_BIN_DIR=DIR`: copy the `weir` it built into DIR and run it from there.
fn demo(ws: &std::path::Path) -> Result<()> {
    if util::output("id", &["-u"]).is_none_or(|uid| uid.trim() != "0") {
        anyhow::bail!(
            "cargo xtask demo needs root: it loads BPF programs and creates network namespaces; run it as root"
        );
    }
    let built = cargo_build(ws, &["-p", "agent", "--bin", "weir"])?;
    let mut weir = built
        .get("weir")
        .context("cargo built no `weir` executable")?
        .clone();
    if let Some(dir) = std::env::var_os("WEIR_DEMO_BIN_DIR") {
        let dir = PathBuf::from(dir);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create WEIR_DEMO_BIN_DIR {}", dir.display()))?;
        let copy = dir.join("weir");
        std::fs::copy(&weir, &copy)
            .with_context(|| format!("cannot copy {} to {}", weir.display(), copy.display()))?;
        weir = copy;
    }
    let example = cargo_build(ws, &["-p", "tests", "--example", "demo"])?;
    let example = example
        .get("demo")
        .context("cargo built no `demo` example")?;
    println!("demo: {} with {}", example.display(), weir.display());
    let status = std::process::Command::new(example)
        .env("WEIR_BIN", &weir)
        .current_dir(ws)
        .status()
        .with_context(|| format!("cannot run {}", example.display()))?;
    if !status.success() {
        anyhow::bail!("the demo failed ({status}): the step it names above did not happen");
    }
    Ok(())
}

/// `cargo build ARGS` (dev profile); the executables it produced, by target name.
fn cargo_build(
    ws: &std::path::Path,
    args: &[&str],
) -> Result<std::collections::BTreeMap<String, PathBuf>> {
    let out = std::process::Command::new("cargo")
        .arg("build")
        .args(args)
        .arg("--message-format=json-render-diagnostics")
        .current_dir(ws)
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("cannot run cargo")?;
    if !out.status.success() {
        anyhow::bail!("`cargo build {}` failed ({})", args.join(" "), out.status);
    }
    let mut built = std::collections::BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if let (Some(name), Some(exe)) =
            (msg["target"]["name"].as_str(), msg["executable"].as_str())
        {
            built.insert(name.to_owned(), PathBuf::from(exe));
        }
    }
    Ok(built)
}
