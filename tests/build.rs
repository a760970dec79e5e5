//! Builds test-only variants of the eBPF object (through the same builder as `cargo xtask
//! build-ebpf`) and tells the tests where they are.

#[path = "../xtask/src/ebpf_build.rs"]
mod ebpf_build;

use std::{env, path::PathBuf};

/// (env var naming the object, eBPF crate features): one object per test-only variant.
const VARIANTS: &[(&str, &[&str])] = &[
    ("WEIR_TEST_OBJECT_VERIFIER_REJECT", &["verifier-reject"]),
    ("WEIR_TEST_OBJECT_CT_V2", &["ct-v2"]),
    ("WEIR_TEST_OBJECT_DEBUG_LOG", &["debug-log"]),
];

fn main() {
    let manifest =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let workspace = manifest
        .parent()
        .expect("tests/ sits in the workspace root")
        .to_path_buf();
    for path in [
        "ebpf/src",
        "ebpf/Cargo.toml",
        "ebpf/rust-toolchain.toml",
        "maps-schema/src",
    ] {
        println!("cargo::rerun-if-changed={}", workspace.join(path).display());
    }
    for (var, features) in VARIANTS {
        let build = ebpf_build::EbpfBuild {
            workspace: &workspace,
            release: true,
            features,
        };
        match build.run() {
            Ok(object) => println!("cargo::rustc-env={var}={}", object.display()),
            Err(e) => panic!("cannot build the test-only eBPF variant {features:?}: {e}"),
        }
    }
}
