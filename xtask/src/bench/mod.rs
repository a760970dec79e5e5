//! `cargo xtask bench NAME [--smoke] [--only PART] [--check] [--record]` (parts: `datapath`,
//! `services`): every benchmark prints a table and writes `target/weir-bench/NAME.json`, a flat object
//! of named figures; the judge ([`judge`]) then evaluates the benchmark's declared targets, prints a
//! verdict table and writes the targets, verdicts and the run's facts into the same JSON.
//! `cargo xtask bench summary` regenerates BENCHMARKS.md's summary table ([`summary`]).

mod agent;
mod agent_proc;
mod attach;
mod cni;
mod cri;
mod datapath;
mod ipam;
pub(crate) mod judge;
mod k8s;
mod multinode;
mod policy;
mod services;
pub(crate) mod summary;

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use judge::Target;

/// The variable that adds an impossible target to the benchmark it names, so `--check` must fail.
pub(crate) const BREAK_VAR: &str = "WEIR_BENCH_BREAK_TARGET";

/// One benchmark: its name, how to run it and the targets it is judged by.
pub(crate) struct Bench {
    pub(crate) name: &'static str,
    run: fn(&Path, bool) -> Result<()>,
    pub(crate) targets: &'static [Target],
}

/// Every benchmark, by name, in the order `all` runs them.
pub(crate) const BENCHES: &[Bench] = &[
    Bench {
        name: "datapath",
        run: datapath::run,
        targets: datapath::TARGETS,
    },
    Bench {
        name: "ipam",
        run: ipam::run,
        targets: ipam::TARGETS,
    },
    Bench {
        name: "cni",
        run: cni::run,
        targets: cni::TARGETS,
    },
    Bench {
        name: "agent",
        run: agent::run,
        targets: agent::TARGETS,
    },
    Bench {
        name: "attach",
        run: attach::run,
        targets: attach::TARGETS,
    },
    Bench {
        name: "cri",
        run: cri::run,
        targets: cri::TARGETS,
    },
    Bench {
        name: "policy",
        run: policy::run,
        targets: policy::TARGETS,
    },
    Bench {
        name: "k8s",
        run: k8s::run,
        targets: k8s::TARGETS,
    },
    Bench {
        name: "multinode",
        run: multinode::run,
        targets: multinode::TARGETS,
    },
    Bench {
        name: "services",
        run: services::run,
        targets: services::TARGETS,
    },
];

/// How `cargo xtask bench` was asked to run.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Options<'a> {
    /// Tiny sizes; only the smoke targets are judged.
    pub(crate) smoke: bool,
    /// One part of a benchmark (datapath, services).
    pub(crate) only: Option<&'a str>,
    /// Fail when a target is missed or absent.
    pub(crate) check: bool,
    /// Copy the judged JSON to `docs/benchmarks/results/NAME.json` (full runs only).
    pub(crate) record: bool,
}

fn names() -> Vec<&'static str> {
    BENCHES.iter().map(|b| b.name).collect()
}

/// The benchmark `WEIR_BENCH_BREAK_TARGET` names, if it is set.
fn broken_bench() -> Result<Option<String>> {
    match std::env::var(BREAK_VAR) {
        Ok(name) if name.is_empty() => Ok(None),
        Ok(name) if BENCHES.iter().any(|b| b.name == name) => Ok(Some(name)),
        Ok(name) => bail!(
            "{BREAK_VAR}={name:?} names no benchmark; set it to one of {:?} or unset it",
            names()
        ),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(e) => bail!("{BREAK_VAR} is not valid unicode ({e}); unset it"),
    }
}

/// The targets a run of `bench` is judged by: its own, plus the impossible one when
/// `WEIR_BENCH_BREAK_TARGET` names it.
pub(crate) fn targets_for(bench: &Bench, broken: Option<&str>) -> Vec<Target> {
    let mut targets = bench.targets.to_vec();
    if broken == Some(bench.name) {
        targets.push(judge::impossible(bench.targets));
    }
    targets
}

pub(crate) fn run(ws: &Path, name: &str, opts: Options<'_>) -> Result<()> {
    if name == "summary" {
        return summary::write(ws);
    }
    if opts.record && opts.smoke {
        bail!("smoke runs are never recorded: drop --record, or --smoke for a full run");
    }
    if opts.only.is_some() && (opts.check || opts.record) {
        bail!("--check and --record judge a whole benchmark: drop --only");
    }
    let broken = broken_bench()?;
    let selected: Vec<&Bench> = if name == "all" {
        if opts.only.is_some() {
            bail!("--only selects a part of one benchmark, not of `all`");
        }
        BENCHES.iter().collect()
    } else {
        match BENCHES.iter().find(|b| b.name == name) {
            Some(bench) => vec![bench],
            None => bail!(
                "unknown benchmark {name:?}; choose one of {:?}, `all` or `summary`",
                names()
            ),
        }
    };
    let mut missed = Vec::new();
    let mut failed = Vec::new();
    for bench in selected {
        let label = format!(
            "bench {}{}",
            bench.name,
            if opts.smoke { " --smoke" } else { "" }
        );
        let result = crate::util::step(&label, || {
            missed.extend(run_one(ws, bench, opts, broken.as_deref())?);
            Ok(())
        });
        match result {
            Ok(()) => {}
            // `all` goes on to the next benchmark and reports every failure at the end.
            Err(e) if name == "all" => failed.push(format!("{}: {e:#}", bench.name)),
            Err(e) => return Err(e),
        }
    }
    if name == "all" && opts.record {
        summary::write(ws)?;
    }
    if !failed.is_empty() {
        bail!(
            "{} benchmark(s) failed to run:\n  {}",
            failed.len(),
            failed.join("\n  ")
        );
    }
    if opts.check && !missed.is_empty() {
        bail!(
            "--check: {} target(s) missed or absent:\n  {}",
            missed.len(),
            missed.join("\n  ")
        );
    }
    Ok(())
}

/// Where a benchmark's JSON goes.
fn json_path(ws: &Path, name: &str) -> PathBuf {
    ws.join("target")
        .join("weir-bench")
        .join(format!("{name}.json"))
}

/// Where a full run's judged JSON is recorded for the summary.
pub(crate) fn recorded_path(ws: &Path, name: &str) -> PathBuf {
    ws.join(summary::RESULTS_DIR).join(format!("{name}.json"))
}

/// Runs one benchmark, judges its JSON and returns the targets it did not meet.
fn run_one(
    ws: &Path,
    bench: &Bench,
    opts: Options<'_>,
    broken: Option<&str>,
) -> Result<Vec<String>> {
    let path = json_path(ws, bench.name);
    // Never judge an earlier run's figures.
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot remove {}", path.display())),
    }
    let load_before = judge::loadavg();
    match (bench.name, opts.only) {
        (_, None) => (bench.run)(ws, opts.smoke)?,
        ("datapath", Some(part)) => datapath::run_part(ws, opts.smoke, Some(part))?,
        ("services", Some(part)) => services::run_part(ws, opts.smoke, Some(part))?,
        (name, Some(_)) => bail!(
            "--only selects a part of the datapath or services benchmark; {name:?} has no parts"
        ),
    }
    let load_after = judge::loadavg();
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("the {} benchmark wrote no {}", bench.name, path.display()))?;
    let mut figures: Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not valid JSON", path.display()))?;
    let judged = judge::judge(&targets_for(bench, broken), &figures, opts.smoke);
    print!("{}", judge::table(bench.name, &judged, opts.smoke));
    let info = judge::RunInfo {
        smoke: opts.smoke,
        load_before,
        load_after,
        commit: judge::commit(ws),
        date: judge::now(),
    };
    judge::annotate(&mut figures, &judged, &info);
    let pretty = serde_json::to_string_pretty(&figures)?;
    std::fs::write(&path, &pretty).with_context(|| format!("cannot write {}", path.display()))?;
    if opts.record {
        let recorded = recorded_path(ws, bench.name);
        if let Some(dir) = recorded.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        std::fs::write(&recorded, pretty + "\n")
            .with_context(|| format!("cannot write {}", recorded.display()))?;
        println!("recorded {}", recorded.display());
    }
    Ok(judge::failures(bench.name, &judged))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_benchmark_declares_well_formed_targets() {
        for bench in BENCHES {
            assert!(
                !bench.targets.is_empty(),
                "{} declares no target",
                bench.name
            );
            for t in bench.targets {
                assert!(!t.figure.is_empty() && !t.why.is_empty() && !t.source.is_empty());
                match t.threshold {
                    judge::Threshold::Value(v) => assert!(v.is_finite(), "{}", t.rule()),
                    judge::Threshold::Figure { key, factor }
                    | judge::Threshold::ValueOrFigure { key, factor, .. } => {
                        assert!(key != t.figure && factor > 0.0, "{}", t.rule());
                    }
                }
            }
        }
        let mut names = names();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), BENCHES.len(), "a benchmark name repeats");
    }

    #[test]
    fn the_break_target_is_added_to_the_named_benchmark_only() {
        let attach = BENCHES.iter().find(|b| b.name == "attach").unwrap();
        assert_eq!(targets_for(attach, None).len(), attach.targets.len());
        assert_eq!(targets_for(attach, Some("cni")).len(), attach.targets.len());
        let broken = targets_for(attach, Some("attach"));
        assert_eq!(broken.len(), attach.targets.len() + 1);
        assert_eq!(broken.last().unwrap().source, "WEIR_BENCH_BREAK_TARGET");
    }
}
