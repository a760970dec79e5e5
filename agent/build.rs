//! Builds the eBPF object (through the same builder as `cargo xtask build-ebpf`) and places it in
//! `OUT_DIR` for `include_bytes_aligned!`. `WEIR_EBPF_OBJECT=PATH` embeds a prebuilt object instead.

#[path = "../xtask/src/ebpf_build.rs"]
mod ebpf_build;

use std::{env, fs, path::PathBuf};

fn main() {
    let manifest =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let workspace = manifest
        .parent()
        .expect("agent/ sits in the workspace root")
        .to_path_buf();
    let out =
        PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("weir-ebpf.o");
    println!("cargo::rerun-if-env-changed=WEIR_EBPF_OBJECT");
    let object = if let Some(prebuilt) = env::var_os("WEIR_EBPF_OBJECT") {
        PathBuf::from(prebuilt)
    } else {
        for path in [
            "ebpf/src",
            "ebpf/Cargo.toml",
            "ebpf/rust-toolchain.toml",
            "maps-schema/src",
            "maps-schema/Cargo.toml",
        ] {
            println!("cargo::rerun-if-changed={}", workspace.join(path).display());
        }
        let build = ebpf_build::EbpfBuild {
            workspace: &workspace,
            release: true,
            features: &[],
        };
        match build.run() {
            Ok(object) => object,
            Err(e) => panic!("cannot build the eBPF programs the agent embeds: {e}"),
        }
    };
    println!("cargo::rerun-if-changed={}", object.display());
    if let Err(e) = fs::copy(&object, &out) {
        panic!("cannot copy {} to {}: {e}", object.display(), out.display());
    }
}
