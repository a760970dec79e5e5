//! The datapath against its model: random map states and random packets (valid, truncated,
//! hostile) through `from_endpoint`/`to_endpoint` with `BPF_PROG_TEST_RUN` and through
//! `tests::dpmodel`; verdict, reason, rewritten bytes, rule hits and the conntrack, Service-flow
//! and affinity entries written must agree ([docs/differential.md](../../docs/differential.md)).
//!
//! Seeded: `WEIR_TEST_SEED` replays a run (the seed is printed); `WEIR_DIFF_CASES` sets how many
//! packets (default 100,000). A mismatch prints its seed, its state and a shrunk case.

use tests::{
    datapath::{Fam, Lab},
    differential::{Kernel, coarse_now, control, run_cases},
};

#[test]
fn the_datapath_matches_its_model() {
    let Some(mut lab) = Lab::new("the_datapath_matches_its_model", Fam::V4) else {
        return;
    };
    let seed = std::env::var("WEIR_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| coarse_now() ^ u64::from(std::process::id()));
    let want: u64 = std::env::var("WEIR_DIFF_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    println!("differential: seed {seed} (WEIR_TEST_SEED={seed} replays it), {want} cases");
    let began = std::time::Instant::now();
    let ifindex = lab.ifindex;
    let Lab { ebpf, ns, .. } = &mut lab;
    let report = ns.run(|| {
        let mut k = Kernel { ebpf, ifindex };
        let report = run_cases(&mut k, seed, want);
        (report, control(&mut k, seed))
    });
    let (report, caught) = report;
    println!(
        "differential_cases={} differential_mismatches={} (states {}, runs the kernel refused {}, {:.1} s)",
        report.cases,
        report.mismatches,
        report.states,
        report.refused,
        began.elapsed().as_secs_f64()
    );
    for (class, n) in &report.counts {
        println!("  {class}: {n}");
    }
    for f in &report.failures {
        println!("MISMATCH {f}");
    }
    assert!(
        caught > 0,
        "control: a model without the kernel's endpoints was never caught disagreeing"
    );
    println!("control: {caught} of 100 packets caught against a model without endpoints");
    assert!(report.cases >= want, "ran {} of {want} cases", report.cases);
    let missing = report.missing_classes();
    assert!(
        missing.is_empty(),
        "the generator made no case of {missing:?} (seed {seed})"
    );
    assert_eq!(
        report.mismatches, 0,
        "the datapath and its model disagree (seed {seed}); cases above"
    );
}
