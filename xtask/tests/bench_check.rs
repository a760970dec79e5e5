//! `cargo xtask bench attach --smoke --check` for real (root: the benchmark builds namespaces and
//! loads programs): it passes and writes its verdicts, and with `WEIR_BENCH_BREAK_TARGET=attach` it
//! exits non-zero naming the impossible target. Under `CI=true` it fails rather than skips without
//! root.

use std::{path::PathBuf, process::Command};

use serde_json::Value;

fn is_root() -> bool {
    let out = Command::new("id")
        .arg("-u")
        .output()
        .expect("cannot run id");
    String::from_utf8_lossy(&out.stdout).trim() == "0"
}

fn bench(break_target: Option<&str>) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_xtask"));
    cmd.args(["bench", "attach", "--smoke", "--check"]);
    cmd.env_remove("WEIR_BENCH_BREAK_TARGET");
    if let Some(name) = break_target {
        cmd.env("WEIR_BENCH_BREAK_TARGET", name);
    }
    cmd.output().expect("cannot run xtask")
}

fn json() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/weir-bench/attach.json");
    let text = std::fs::read_to_string(&path).expect("attach.json written");
    serde_json::from_str(&text).expect("attach.json is JSON")
}

#[test]
fn check_passes_a_sane_smoke_run_and_fails_a_broken_target() {
    if !is_root() {
        assert!(
            std::env::var_os("CI").is_none(),
            "bench_check: needs root, and CI is set: run the suite as root"
        );
        eprintln!("skipping bench_check - needs root (set CI=true to make this a failure)");
        return;
    }
    // The positive control: the same benchmark meets its smoke targets.
    let ok = bench(None);
    assert!(
        ok.status.success(),
        "bench attach --smoke --check failed:\n{}\n{}",
        String::from_utf8_lossy(&ok.stdout),
        String::from_utf8_lossy(&ok.stderr)
    );
    let figures = json();
    let targets = figures["targets"].as_array().expect("targets in the JSON");
    assert!(!targets.is_empty());
    assert!(targets.iter().all(|t| t["verdict"] == "met"), "{targets:?}");
    assert_eq!(figures["smoke"], true);
    assert!(figures["load_before"].is_array() && figures["load_after"].is_array());
    assert!(figures["commit"].is_string() && figures["date"].is_string());

    let broken = bench(Some("attach"));
    let stderr = String::from_utf8_lossy(&broken.stderr);
    assert!(
        !broken.status.success(),
        "--check passed an impossible target"
    );
    assert!(
        stderr.contains("target(s) missed or absent")
            && stderr.contains("attach: filter_attach_max_total_ms < −∞ MISSED"),
        "the failure names the impossible target:\n{stderr}"
    );
    // The benchmark itself ran: its real target is still met in the broken run's JSON.
    let verdicts: Vec<String> = json()["targets"]
        .as_array()
        .expect("targets")
        .iter()
        .map(|t| t["verdict"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(verdicts, ["met", "MISSED"]);
}

#[test]
fn an_unknown_break_target_is_refused_before_anything_runs() {
    let out = bench(Some("no-such-bench"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("WEIR_BENCH_BREAK_TARGET=\"no-such-bench\" names no benchmark"),
        "{stderr}"
    );
}
