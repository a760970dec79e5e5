//! The `weir` binary as a shell sees it: a reader that goes away (`weir … | head`) ends the
//! command quietly instead of a panic and code 101, and `--dump-config` prints only a fully
//! validated configuration, with durations in the seconds its flags take.

use std::process::{Command, Stdio};

fn weir() -> Command {
    Command::new(env!("CARGO_BIN_EXE_weir"))
}

#[test]
fn a_closed_stdout_ends_the_command_without_a_panic() {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let out = weir()
        .args(["agent", "--node", "n1", "--dump-config"])
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("run weir");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_ne!(out.status.code(), Some(101), "{stderr}");
    assert!(!out.status.success(), "nothing could be written");
}

#[test]
fn dump_config_validates_everything_and_prints_seconds() {
    let out = weir()
        .args([
            "agent",
            "--node",
            "n1",
            "--pool",
            "notacidr",
            "--dump-config",
        ])
        .output()
        .expect("run weir");
    assert!(
        !out.status.success(),
        "a bad pool is refused before the dump"
    );
    assert!(out.stdout.is_empty(), "nothing is dumped");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--pool") && stderr.contains("notacidr"),
        "{stderr}"
    );

    let out = weir()
        .args([
            "agent",
            "--node",
            "n1",
            "--allocation-expiry",
            "90",
            "--dump-config",
        ])
        .output()
        .expect("run weir");
    assert!(out.status.success());
    let dumped: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(dumped["allocation_expiry"], 90, "{dumped}");
    assert_eq!(dumped["ct_sweep_interval"], 10, "{dumped}");
}
