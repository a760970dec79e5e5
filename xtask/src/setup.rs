//! `cargo xtask setup`: installs, idempotently, what a fresh machine lacks. When everything is
//! present it only checks (a few seconds).

use std::{path::Path, process::Command};

use anyhow::{Context as _, Result, bail};

use crate::{ebpf_build::EbpfBuild, util};

/// Debian packages the build and the tests use.
const APT_PACKAGES: &[&str] = &[
    "bpftool",                     // checking kernel state from outside
    "iproute2",                    // namespaces, veths
    "iptables",                    // datapath benchmark baseline (inside test namespaces only)
    "nftables",                    // `nft list ruleset`: no_netfilter checks weir writes no rule
    "etcd-server",                 // the multi-node IPAM datastore, started by the tests
    "protobuf-compiler",           // etcd-client's build script
    "libprotobuf-dev",             // ... and the well-known types it needs
    "containernetworking-plugins", // host-local / bridge baselines and chained plugins
    "containerd",                  // the real-runtime CNI test (ctr run --cni)
    "runc",                        // ... the OCI runtime it starts the container with
    "busybox-static",              // ... and the static busybox of that container
    "buildah",                     // the CRI tier's pause image, built offline from scratch
    "libc6-dev",                   // ... whose static pause binary links libc.a
    "musl-tools",                  // `cargo xtask image`: musl-gcc for the C parts of ring and psm
    "prometheus", // `promtool check metrics` on the agent's /metrics (its server is disabled)
];

/// The bpf-linker version the eBPF build uses.
const BPF_LINKER_VERSION: &str = "0.13.0";

pub(crate) fn run(ws: &Path, apt: bool) -> Result<()> {
    let nightly = EbpfBuild::nightly(ws).map_err(anyhow::Error::msg)?;
    ensure_toolchain(&nightly, &["rust-src", "clippy", "rustfmt"])?;
    ensure_bpf_linker(&nightly)?;
    ensure_cargo_fuzz(&nightly)?;
    ensure_target(&user_toolchain(ws)?, crate::image::MUSL_TARGET)?;
    if apt {
        ensure_apt(APT_PACKAGES)?;
        disable_prometheus_server();
    }
    println!(
        "setup: toolchains, bpf-linker {BPF_LINKER_VERSION}, cargo-fuzz{} present",
        if apt { " and Debian packages" } else { "" }
    );
    Ok(())
}

fn ensure_toolchain(toolchain: &str, components: &[&str]) -> Result<()> {
    let installed = util::output("rustup", &["toolchain", "list"]).unwrap_or_default();
    let have_toolchain = installed.lines().any(|l| l.starts_with(toolchain));
    let have_components = have_toolchain && {
        let list = util::output(
            "rustup",
            &["component", "list", "--installed", "--toolchain", toolchain],
        )
        .unwrap_or_default();
        components
            .iter()
            .all(|c| list.lines().any(|l| l.starts_with(c)))
    };
    if have_components {
        return Ok(());
    }
    println!("setup: installing toolchain {toolchain} with {components:?}");
    let mut args = vec!["toolchain", "install", toolchain, "--profile", "minimal"];
    for c in components {
        args.extend(["--component", c]);
    }
    util::run(Path::new("."), "rustup", &args)
}

/// The user-space toolchain pinned in `rust-toolchain.toml`.
fn user_toolchain(ws: &Path) -> Result<String> {
    let text = std::fs::read_to_string(ws.join("rust-toolchain.toml"))
        .context("cannot read rust-toolchain.toml")?;
    text.lines()
        .find_map(|l| {
            let v = l.trim().strip_prefix("channel")?.trim().strip_prefix('=')?;
            Some(v.trim().trim_matches('"').to_owned())
        })
        .context("rust-toolchain.toml names no channel")
}

/// A standard library for `target` (the image's static binaries).
fn ensure_target(toolchain: &str, target: &str) -> Result<()> {
    let installed = util::output(
        "rustup",
        &["target", "list", "--installed", "--toolchain", toolchain],
    )
    .unwrap_or_default();
    if installed.lines().any(|l| l.trim() == target) {
        return Ok(());
    }
    println!("setup: adding target {target} to {toolchain}");
    util::run(
        Path::new("."),
        "rustup",
        &["target", "add", target, "--toolchain", toolchain],
    )
}

fn ensure_bpf_linker(nightly: &str) -> Result<()> {
    // bpf-linker loads the nightly's libLLVM at run time; `rustup run` puts it on the library path
    // (as it does when cargo invokes the linker), so check it the same way.
    if util::output("rustup", &["run", nightly, "bpf-linker", "--version"])
        .is_some_and(|v| v.contains(BPF_LINKER_VERSION))
    {
        return Ok(());
    }
    // bpf-linker must link against an LLVM of the nightly's major version; the nightly ships one.
    println!("setup: building bpf-linker {BPF_LINKER_VERSION} against {nightly}'s LLVM");
    let sysroot = util::output("rustc", &[&format!("+{nightly}"), "--print", "sysroot"])
        .context("rustc --print sysroot")?;
    let lib = Path::new(sysroot.trim()).join("lib");
    let llvm = std::fs::read_dir(&lib)
        .with_context(|| format!("cannot list {}", lib.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libLLVM.so."))
        })
        .with_context(|| format!("{nightly} ships no libLLVM.so.* in {}", lib.display()))?;
    let home = std::env::var("HOME").context("HOME is not set")?;
    let prefix = Path::new(&home).join(".cache/weir-llvm");
    std::fs::create_dir_all(prefix.join("lib"))?;
    let link = prefix.join("lib/libLLVM.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&llvm, &link)
        .with_context(|| format!("cannot link {}", link.display()))?;
    let status = Command::new("cargo")
        .args([
            &format!("+{nightly}"),
            "install",
            "bpf-linker",
            "--version",
            BPF_LINKER_VERSION,
            "--locked",
            "--force",
        ])
        .env("LLVM_PREFIX", &prefix)
        .env_remove("RUSTUP_TOOLCHAIN")
        .status()
        .context("cannot run cargo install")?;
    if !status.success() {
        bail!("building bpf-linker failed ({status}); see TOOLCHAIN.md for the manual steps");
    }
    Ok(())
}

/// cargo-fuzz, which `cargo xtask fuzz` runs on the eBPF nightly (libFuzzer's flags need one).
fn ensure_cargo_fuzz(nightly: &str) -> Result<()> {
    let version = crate::fuzz::CARGO_FUZZ_VERSION;
    if util::output("rustup", &["run", nightly, "cargo", "fuzz", "--version"])
        .is_some_and(|v| v.contains(version))
    {
        return Ok(());
    }
    println!("setup: installing cargo-fuzz {version}");
    util::run(
        Path::new("."),
        "cargo",
        &["install", "cargo-fuzz", "--version", version, "--locked"],
    )
}

/// Debian's `prometheus` (installed for `promtool`) enables a server listening on every address
/// (:9090); only the tool is wanted, so the service is stopped and disabled where systemd has it.
fn disable_prometheus_server() {
    let state = |what: &str| util::output("systemctl", &[what, "prometheus"]).unwrap_or_default();
    // `disable` works without a running systemd (it removes the unit's links); `stop` needs one.
    for (now, wanted, verb) in [
        ("is-enabled", "enabled", "disable"),
        ("is-active", "active", "stop"),
    ] {
        if state(now).trim() == wanted {
            println!("setup: `systemctl {verb} prometheus` (only promtool is used)");
            if util::output("systemctl", &[verb, "prometheus"]).is_none() {
                println!("setup: `systemctl {verb} prometheus` failed; do it by hand");
            }
        }
    }
}

fn ensure_apt(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| {
            util::output("dpkg-query", &["-W", "-f=${Status}", p])
                .is_none_or(|s| !s.contains("install ok installed"))
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    println!("setup: installing Debian packages {missing:?}");
    util::run(Path::new("."), "apt-get", &["update", "-q"])?;
    let mut args = vec!["install", "-y", "-q", "--no-install-recommends"];
    args.extend(&missing);
    let status = Command::new("apt-get")
        .args(&args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .context("cannot run apt-get")?;
    if !status.success() {
        bail!("apt-get install {missing:?} failed ({status}); run it by hand as root to see why");
    }
    Ok(())
}
