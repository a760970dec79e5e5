//! `cargo xtask image`: the container image the DaemonSet runs — `weir` and `weir-cni` as static
//! musl binaries (the eBPF object is embedded in `weir` by `agent/build.rs`) on an empty base,
//! built offline with buildah (`from scratch`, vfs storage under `target/weir-image/`, nothing
//! pulled), written as an OCI archive that `ctr images import` takes.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::util;

/// The musl target of the static binaries.
pub(crate) const MUSL_TARGET: &str = "x86_64-unknown-linux-musl";
/// The image name the manifests in `deploy/` run (version: the workspace's).
pub(crate) const IMAGE: &str = concat!("localhost/weir:", env!("CARGO_PKG_VERSION"));

/// Builds the image; returns the OCI archive's path.
pub(crate) fn run(ws: &Path, release: bool) -> Result<PathBuf> {
    let mut args = vec![
        "build",
        "--target",
        MUSL_TARGET,
        "-p",
        "agent",
        "-p",
        "cni",
        "--bins",
    ];
    if release {
        args.push("--release");
    }
    util::run(ws, "cargo", &args).with_context(|| {
        format!("building the static binaries failed; `cargo xtask setup` installs the {MUSL_TARGET} target and musl-tools")
    })?;
    let bin_dir =
        ws.join("target")
            .join(MUSL_TARGET)
            .join(if release { "release" } else { "debug" });
    let out = ws.join("target/weir-image");
    std::fs::create_dir_all(&out)?;
    let bins: Vec<PathBuf> = ["weir", "weir-cni"]
        .iter()
        .map(|name| bin_dir.join(name))
        .collect();
    for bin in &bins {
        if has_interpreter(bin)? {
            bail!(
                "{} is dynamically linked: an empty base has no loader",
                bin.display()
            );
        }
    }
    let storage = out.join("buildah");
    let _ = std::fs::remove_dir_all(&storage);
    let buildah = |args: &[&str]| -> Result<String> {
        let output = Command::new("buildah")
            .arg("--root")
            .arg(storage.join("root"))
            .arg("--runroot")
            .arg(storage.join("runroot"))
            .args(["--storage-driver", "vfs"])
            .args(args)
            .output()
            .context("cannot run buildah: `cargo xtask setup` installs it")?;
        if !output.status.success() {
            bail!(
                "buildah {args:?} failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    };
    let container = buildah(&["from", "scratch"])?;
    for bin in &bins {
        let name = bin.file_name().unwrap_or_default().to_string_lossy();
        buildah(&[
            "copy",
            "--chmod",
            "0755",
            &container,
            &bin.display().to_string(),
            &format!("/{name}"),
        ])?;
    }
    buildah(&[
        "config",
        // No entrypoint: a pod's `command` (and `ctr run IMAGE ID CMD…`) names the whole command.
        "--cmd",
        r#"["/weir", "agent"]"#,
        "--label",
        "org.opencontainers.image.title=weir",
        "--label",
        concat!(
            "org.opencontainers.image.version=",
            env!("CARGO_PKG_VERSION")
        ),
        &container,
    ])?;
    buildah(&["commit", "--quiet", "--rm", &container, IMAGE])?;
    let archive = out.join("weir.oci.tar");
    let _ = std::fs::remove_file(&archive);
    buildah(&[
        "push",
        "--quiet",
        IMAGE,
        &format!("oci-archive:{}:{IMAGE}", archive.display()),
    ])?;
    // The vfs layers are plain copies; nothing of them is needed past the archive.
    let _ = std::fs::remove_dir_all(&storage);
    Ok(archive)
}

/// True when the ELF file at `path` names a program interpreter (`PT_INTERP`): it is dynamic.
fn has_interpreter(path: &Path) -> Result<bool> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let u16_at = |o: usize| {
        bytes
            .get(o..o + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u64_at = |o: usize| {
        bytes
            .get(o..o + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
    };
    if bytes.get(..5) != Some(b"\x7fELF\x02".as_slice()) {
        bail!("{} is not a 64-bit ELF file", path.display());
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        bail!("{} has a truncated ELF header", path.display());
    };
    let phoff = usize::try_from(phoff)?;
    Ok((0..usize::from(phnum)).any(|i| {
        let at = phoff + i * usize::from(phentsize);
        bytes
            .get(at..at + 4)
            .is_some_and(|t| u32::from_le_bytes([t[0], t[1], t[2], t[3]]) == 3)
    }))
}
