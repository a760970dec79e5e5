//! Builds the eBPF object. Shared, std only: `cargo xtask build-ebpf` uses it, and so do the build
//! scripts of `agent` (which embeds the object) and `tests` (test-only variants), through `#[path]`.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

/// The BPF target the programs are built for.
pub const TARGET: &str = "bpfel-unknown-none";

/// Rust flags of every eBPF build: BTF for maps and programs (bpf-linker emits it with `--btf`)
/// and full debug info, as DESIGN asks. Code generation (bpf-linker does it): BPF ISA v3 (32-bit
/// ALU and jumps, kernel 5.1+; tcx already needs 6.6) and misaligned access, which the verifier
/// allows for packet and map-value pointers on x86-64 and arm64 (efficient unaligned access), so a
/// packet's `u32`/`u64` field is one load instead of byte loads and shifts. Stack accesses must
/// stay aligned (the verifier demands it): the programs keep stack values 8-aligned.
pub const RUSTFLAGS: &[&str] = &[
    "-Cdebuginfo=2",
    "-Clink-arg=--btf",
    "--cfg=bpf_target_arch=\"x86_64\"",
    "-Ctarget-cpu=v3",
    "-Clink-arg=--cpu-features=+allows-misaligned-mem-access",
];

/// One build of the eBPF crate.
pub struct EbpfBuild<'a> {
    /// The workspace root.
    pub workspace: &'a Path,
    /// `--release` (the agent always embeds a release build).
    pub release: bool,
    /// Cargo features of the `ebpf` crate (test-only variants).
    pub features: &'a [&'a str],
}

impl EbpfBuild<'_> {
    /// The pinned eBPF nightly, read from `ebpf/rust-toolchain.toml` (the one place it is pinned).
    pub fn nightly(workspace: &Path) -> Result<String, String> {
        let path = workspace.join("ebpf/rust-toolchain.toml");
        let text = fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        text.lines()
            .filter_map(|line| line.trim().strip_prefix("channel"))
            .filter_map(|rest| rest.trim().strip_prefix('='))
            .map(|value| value.trim().trim_matches('"').to_owned())
            .next()
            .ok_or_else(|| format!("{} has no `channel = \"...\"` line", path.display()))
    }

    /// Where this variant's cargo target directory lives (separate from the host build, so a build
    /// script can run it without waiting on the outer cargo's lock).
    #[must_use]
    pub fn target_dir(&self) -> PathBuf {
        let mut name = String::from("ebpf");
        for feature in self.features {
            name.push('-');
            name.push_str(feature);
        }
        self.workspace.join("target").join(name)
    }

    /// The object this build produces.
    #[must_use]
    pub fn object(&self) -> PathBuf {
        let profile = if self.release { "release" } else { "debug" };
        self.target_dir()
            .join(TARGET)
            .join(profile)
            .join("weir-ebpf")
    }

    /// Runs the build and returns the object's path.
    pub fn run(&self) -> Result<PathBuf, String> {
        let nightly = Self::nightly(self.workspace)?;
        let mut cmd = Command::new("rustup");
        cmd.current_dir(self.workspace.join("ebpf"))
            .args([
                "run",
                &nightly,
                "cargo",
                "build",
                "--package",
                "ebpf",
                "--bin",
                "weir-ebpf",
            ])
            .args(["--target", TARGET, "-Z", "build-std=core", "--target-dir"])
            .arg(self.target_dir());
        if self.release {
            cmd.arg("--release");
        }
        if !self.features.is_empty() {
            cmd.arg("--features").arg(self.features.join(","));
        }
        // The outer cargo (when this runs from a build script) must not leak its toolchain or flags.
        for var in [
            "RUSTC",
            "RUSTC_WRAPPER",
            "RUSTC_WORKSPACE_WRAPPER",
            "RUSTFLAGS",
            "RUSTDOCFLAGS",
            "RUSTUP_TOOLCHAIN",
            "CARGO",
            "CARGO_TARGET_DIR",
            "CARGO_BUILD_TARGET",
            "CARGO_ENCODED_RUSTFLAGS",
        ] {
            cmd.env_remove(var);
        }
        cmd.env("CARGO_ENCODED_RUSTFLAGS", RUSTFLAGS.join("\x1f"));
        let status = cmd.status().map_err(|e| {
            format!(
                "cannot run rustup to build the eBPF crate ({e}); run `cargo xtask setup` first"
            )
        })?;
        if !status.success() {
            return Err(format!(
                "building the eBPF crate with {nightly} failed ({status}); if the toolchain or \
                 bpf-linker is missing, run `cargo xtask setup`"
            ));
        }
        let object = self.object();
        if !object.is_file() {
            return Err(format!(
                "the eBPF build succeeded but {} is missing",
                object.display()
            ));
        }
        Ok(object)
    }
}
