//! The datapath against its model as the benchmark's figures: the differential harness
//! (`tests::differential`, [docs/differential.md](../../../docs/differential.md)) for a number of seeded
//! cases through weir's own object (the one the agent embeds, not the bench variant) and the model;
//! then its positive control. `WEIR_TEST_SEED` picks the seed (as for the test); otherwise it is drawn
//! and written into the JSON, and `WEIR_TEST_SEED=<seed> WEIR_DIFF_CASES=<cases>` replays the run with
//! `cargo test -p tests --test datapath_differential`.

use std::{collections::BTreeMap, time::Instant};

use anyhow::{Context as _, Result};
use serde_json::{Value, json};
use tests::{
    datapath::{Fam, Lab},
    differential::{Kernel, coarse_now, control, run_cases},
};

use crate::Sizes;

/// Runs `sizes.differential_cases` cases and adds their figures.
pub fn run(sizes: Sizes, figures: &mut BTreeMap<String, Value>) -> Result<()> {
    let seed = match std::env::var("WEIR_TEST_SEED") {
        Ok(s) => s.parse().with_context(|| {
            format!(
                "WEIR_TEST_SEED={s:?} is not a number: set it to a seed a run printed, or unset it"
            )
        })?,
        Err(_) => coarse_now() ^ u64::from(std::process::id()),
    };
    let want = sizes.differential_cases;
    println!("differential: seed {seed} (WEIR_TEST_SEED={seed} replays it), {want} cases");
    let mut lab = Lab::new("datapath-bench differential", Fam::V4)
        .context("the differential cases need root")?;
    let ifindex = lab.ifindex;
    let Lab { ebpf, ns, .. } = &mut lab;
    let began = Instant::now();
    let (report, caught) = ns.run(|| {
        let mut k = Kernel { ebpf, ifindex };
        let report = run_cases(&mut k, seed, want);
        (report, control(&mut k, seed))
    });
    let seconds = began.elapsed().as_secs_f64();
    for f in &report.failures {
        eprintln!("MISMATCH {f}");
    }
    let missing = report.missing_classes();
    if !missing.is_empty() {
        eprintln!("differential: the generator made no case of {missing:?} (seed {seed})");
    }
    figures.insert("differential_seed".into(), json!(seed));
    figures.insert("differential_cases".into(), json!(report.cases));
    figures.insert("differential_mismatches".into(), json!(report.mismatches));
    figures.insert("differential_states".into(), json!(report.states));
    figures.insert("differential_refused".into(), json!(report.refused));
    figures.insert("differential_classes_missing".into(), json!(missing.len()));
    figures.insert("differential_control_caught".into(), json!(caught));
    figures.insert("differential_s".into(), json!(seconds));
    Ok(())
}
