//! `cargo xtask bench datapath [--smoke] [--only testrun|traffic|refresh|differential]`: builds the `bench`
//! variant of the eBPF object (with the empty `wt_empty` tc program, the floor), runs the `datapath-bench`
//! example of the tests crate (root: it loads programs and builds namespaces), prints a table and writes
//! `target/weir-bench/datapath.json`. Besides the per-packet cost: the drift refresh's cost over the
//! agent's real maps (`refresh_*`) and the datapath against its model (`differential_*`, issue 39).

use std::{path::Path, process::Command};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use crate::ebpf_build::EbpfBuild;

use super::judge::{Cmp, Target};

/// The targets (BENCHMARKS.md, Datapath): the datapath's cost over the empty program's floor, flat
/// in the configuration's size, and far below iptables'.
pub(crate) const TARGETS: &[Target] = &[
    Target::full(
        "established_ratio",
        Cmp::Le,
        3.0,
        "an established flow costs at most 3x the empty tc program (the floor)",
        "BENCHMARKS.md: Datapath",
    ),
    Target::full(
        "new_flow_ratio",
        Cmp::Le,
        12.0,
        "a new allowed flow costs at most 12x its floor (distinct packets)",
        "BENCHMARKS.md: Datapath",
    ),
    Target::full(
        "flatness_ratio",
        Cmp::Le,
        1.15,
        "the cost stays flat from the smallest to the largest configuration",
        "BENCHMARKS.md: Datapath",
    ),
    Target::full(
        "iptables_nft_over_weir_per_run",
        Cmp::Ge,
        100.0,
        "on real traffic iptables-nft adds at least 100x what weir adds (median of the interleaved runs' ratios)",
        "BENCHMARKS.md: Datapath",
    )
    .any_sign(),
    Target::full(
        "refresh_cpu_pct",
        Cmp::Le,
        1.0,
        "the drift refresh over 10,000 endpoints and 100,000 policy entries takes at most 1% of one core at \
         the default 10 s interval",
        "issue 39: Benchmark",
    ),
    Target::full(
        "refresh_control_repairs",
        Cmp::Ge,
        1.0,
        "the refresh reads the maps back: a policy entry deleted from outside is repaired (positive control)",
        "issue 39: Drift repair",
    )
    .always(),
    Target::full(
        "differential_mismatches",
        Cmp::Le,
        0.0,
        "the datapath and its model agree on every seeded case",
        "issue 39: The datapath against its model",
    )
    .always(),
    Target::full(
        "differential_cases",
        Cmp::Ge,
        1_000_000.0,
        "a full run compares at least 1,000,000 cases",
        "issue 39: Benchmark",
    ),
    Target::full(
        "differential_control_caught",
        Cmp::Ge,
        1.0,
        "a model without the kernel's endpoints is caught disagreeing (positive control)",
        "docs/differential.md",
    )
    .always(),
    Target::full(
        "differential_classes_missing",
        Cmp::Le,
        0.0,
        "the generator produced every class of case (at full size: smoke runs are too short for the rarest)",
        "docs/differential.md",
    )
    .may_be_zero(),
];

/// Figures printed, with the target each one is measured against.
const ROWS: &[(&str, &str)] = &[
    ("floor_ns", "floor: empty tc program, ns/packet"),
    ("established_ns", "established, largest config, ns/packet"),
    ("established_ratio", "  over the floor (target <= 3)"),
    (
        "new_flow_floor_ns",
        "new-flow floor (repeat 1, distinct packets), ns",
    ),
    ("new_flow_ns", "new allowed flow, largest config, ns"),
    ("new_flow_ratio", "  over its floor (target <= 12)"),
    ("denied_ns", "new denied flow, largest config, ns"),
    (
        "flatness_ratio",
        "flatness: largest over smallest (target <= 1.15)",
    ),
    (
        "established_ns_rule_hits_off",
        "established, rule hit counters compiled out, ns",
    ),
    (
        "new_flow_ns_rule_hits_off",
        "new allowed flow, rule hit counters compiled out, ns",
    ),
    (
        "denied_ns_rule_hits_off",
        "new denied flow, rule hit counters compiled out, ns",
    ),
    (
        "traffic_none_ns",
        "UDP traffic, no filtering, ns/packet (median)",
    ),
    (
        "weir_added_ns",
        "weir added, ns/packet (at least the floor)",
    ),
    ("iptables_nft_added_ns", "iptables-nft added, ns/packet"),
    (
        "iptables_legacy_added_ns",
        "iptables-legacy added, ns/packet",
    ),
    (
        "iptables_nft_over_weir",
        "  iptables-nft over weir (medians)",
    ),
    (
        "iptables_nft_over_weir_per_run",
        "  the same, median of the runs' ratios (target >= 100)",
    ),
    ("iptables_nft_over_weir_per_run_min", "    its lowest run"),
    ("iptables_nft_over_weir_per_run_max", "    its highest run"),
    ("refresh_endpoints", "refresh: endpoints"),
    ("refresh_policy_entries", "refresh: policy_v1 entries"),
    ("refresh_full_ms", "refresh: CPU per full refresh, ms"),
    (
        "refresh_cpu_pct",
        "  % of one core at the 10 s default (target <= 1)",
    ),
    (
        "refresh_control_repairs",
        "  control: deleted entry repaired",
    ),
    ("differential_cases", "differential: cases"),
    (
        "differential_mismatches",
        "  states with a mismatch (target 0)",
    ),
    (
        "differential_control_caught",
        "  control: packets caught of 100",
    ),
    ("differential_s", "  seconds"),
];

pub(crate) fn run(workspace: &Path, smoke: bool) -> Result<()> {
    run_part(workspace, smoke, None)
}

/// The benchmark, or only one of its parts (`testrun`, `traffic`; the other part's rows print `-`).
pub(crate) fn run_part(workspace: &Path, smoke: bool, only: Option<&str>) -> Result<()> {
    let build = EbpfBuild {
        workspace,
        release: true,
        features: &["bench"],
    };
    let object = build
        .run()
        .map_err(|e| anyhow::anyhow!("building the bench eBPF variant: {e}"))?;
    let dir = workspace.join("target").join("weir-bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let path = dir.join("datapath.json");
    let object_s = object.to_string_lossy().into_owned();
    let path_s = path.to_string_lossy().into_owned();
    example(workspace, smoke, &object_s, &path_s, only)?;
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let mut figures: Value = serde_json::from_str(&text).context("malformed datapath.json")?;
    if matches!(only, None | Some("testrun")) {
        // The same packet-level figures with the per-rule hit counters compiled out, in this run.
        let off = EbpfBuild {
            workspace,
            release: true,
            features: &["bench", "no-rule-hits"],
        }
        .run()
        .map_err(|e| anyhow::anyhow!("building the bench eBPF variant without rule hits: {e}"))?;
        let off_path = dir.join("datapath-rule-hits-off.json");
        let off_s = off.to_string_lossy().into_owned();
        example(
            workspace,
            smoke,
            &off_s,
            &off_path.to_string_lossy(),
            Some("testrun"),
        )?;
        let off_text = std::fs::read_to_string(&off_path)
            .with_context(|| format!("cannot read {}", off_path.display()))?;
        let off_figures: Value =
            serde_json::from_str(&off_text).context("malformed datapath-rule-hits-off.json")?;
        if let (Some(all), Some(off)) = (figures.as_object_mut(), off_figures.as_object()) {
            for key in ["established_ns", "new_flow_ns", "denied_ns"] {
                if let Some(v) = off.get(key) {
                    all.insert(format!("{key}_rule_hits_off"), v.clone());
                }
            }
        }
        std::fs::write(&path, serde_json::to_string_pretty(&figures)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    println!(
        "{:<52} {:>12}",
        "datapath benchmark",
        if smoke { "smoke" } else { "value" }
    );
    for (key, label) in ROWS {
        let v = figures
            .get(key)
            .and_then(Value::as_f64)
            .map_or_else(|| "-".to_owned(), |f| format!("{f:.2}"));
        println!("{label:<52} {v:>12}");
    }
    println!("wrote {}", path.display());
    Ok(())
}

/// Runs the `datapath-bench` example on `object` (release unless `smoke`).
fn example(
    workspace: &Path,
    smoke: bool,
    object: &str,
    out: &str,
    only: Option<&str>,
) -> Result<()> {
    // The smoke run (in CI) reuses the dev build the tests made; real runs are release.
    let mut args = vec!["run", "--quiet"];
    if !smoke {
        args.push("--release");
    }
    args.extend([
        "-p",
        "tests",
        "--example",
        "datapath-bench",
        "--",
        "--object",
        object,
        "--out",
        out,
    ]);
    if smoke {
        args.push("--smoke");
    }
    if let Some(part) = only {
        args.extend(["--only", part]);
    }
    let status = Command::new("cargo")
        .args(&args)
        .current_dir(workspace)
        .status()
        .context("cannot run cargo")?;
    if !status.success() {
        bail!("the datapath benchmark failed ({status})");
    }
    Ok(())
}
