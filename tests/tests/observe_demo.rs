//! `cargo xtask demo` as a test: the demo checks every step itself; here its transcript must also
//! show the operator's view (rule hits, the denied flow by reason, both traces).

use tests::privileged::require_root;

#[test]
fn the_demo_runs_and_shows_the_denied_flow_counters_and_a_trace() {
    if !require_root("the_demo_runs_and_shows_the_denied_flow_counters_and_a_trace") {
        return;
    }
    let mut transcript = String::new();
    tests::demo::run(&mut |line| {
        transcript.push_str(line);
        transcript.push('\n');
    });
    for expected in [
        "pod web",
        "weir monitor: {",
        "default/web",
        "weir_drop_count_total{reason=\"policy-denied\"",
        "weir_policy_rule_packets_total{policy=\"default/web\"",
        "kernel (the loaded programs",
        "rule default/web ingress[0]",
    ] {
        assert!(
            transcript.contains(expected),
            "no {expected:?} in:\n{transcript}"
        );
    }
}

/// `cargo xtask demo` as an operator runs it: it builds the `weir` it needs (here copied into an
/// empty directory through `WEIR_DEMO_BIN_DIR`, so no binary the tests built is used) and runs it.
#[test]
fn cargo_xtask_demo_builds_the_weir_it_runs() {
    if !require_root("cargo_xtask_demo_builds_the_weir_it_runs") {
        return;
    }
    let bin_dir = tempfile::tempdir().expect("tmp");
    let weir = bin_dir.path().join("weir");
    assert!(!weir.exists(), "the bin dir starts empty");
    let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the workspace");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["xtask", "demo"])
        .current_dir(workspace)
        .env("WEIR_DEMO_BIN_DIR", bin_dir.path())
        .env_remove("WEIR_BIN")
        .output()
        .expect("run cargo xtask demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "cargo xtask demo failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        weir.is_file(),
        "the demo put no weir in {}",
        bin_dir.path().display()
    );
    assert!(
        stdout.contains(&format!("with {}", weir.display())),
        "the demo did not run the weir it built:\n{stdout}"
    );
    for expected in [
        "weir monitor: {",
        "weir_drop_count_total{reason=\"policy-denied\"",
        "weir_policy_rule_packets_total{policy=\"default/web\"",
        "rule default/web ingress[0]",
    ] {
        assert!(stdout.contains(expected), "no {expected:?} in:\n{stdout}");
    }
}
