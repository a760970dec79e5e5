//! Paths of the workspace's binaries for black-box tests (built by `cargo build --bins`, which the
//! test runner does first).

use std::path::PathBuf;

/// The `weir` binary (override with `WEIR_BIN`).
#[must_use]
pub fn weir() -> PathBuf {
    binary("weir", "WEIR_BIN")
}

/// The `weir-cni` binary (override with `WEIR_CNI_BIN`).
#[must_use]
pub fn weir_cni() -> PathBuf {
    binary("weir-cni", "WEIR_CNI_BIN")
}

/// The socket LB tests' client (`tests/src/bin/wt-sockclient.rs`; override with
/// `WT_SOCKCLIENT_BIN`).
#[must_use]
pub fn wt_sockclient() -> PathBuf {
    binary("wt-sockclient", "WT_SOCKCLIENT_BIN")
}

fn binary(name: &str, var: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(var) {
        return PathBuf::from(path);
    }
    // Test executables live in target/<profile>/deps; binaries in target/<profile>.
    let exe = std::env::current_exe().expect("the test knows its own path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test binary sits in target/<profile>/deps");
    let path = profile_dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: run `cargo build --bins` first (or set {var})",
        path.display()
    );
    path
}
