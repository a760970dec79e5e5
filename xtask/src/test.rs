//! `cargo xtask test`: every test tier, then a check that nothing was left behind.
//!
//! Unit tests run in parallel; the `tests` crate's binaries (packet, privileged and black-box
//! tests) each run one test at a time, two binaries side by side (`lanes`).

use std::path::Path;

use anyhow::{Result, bail};

use crate::util;

pub(crate) fn run(ws: &Path) -> Result<()> {
    mount_bpffs()?;
    util::run(
        ws,
        "cargo",
        // The fuzz targets link libFuzzer and build with cargo-fuzz (`cargo xtask fuzz`); their
        // library and its corpus replay are unit tests below.
        &[
            "build",
            "--workspace",
            "--exclude",
            "ebpf",
            "--exclude",
            "fuzz",
            "--bins",
        ],
    )?;
    let unit = util::run(
        ws,
        "cargo",
        &[
            "test",
            "--workspace",
            "--exclude",
            "ebpf",
            "--exclude",
            "tests",
        ],
    );
    // The container image, once, before the tests that run it (`deploy_container.rs`).
    let image = crate::image::run(ws, false)?;
    let spec = format!("{}={}", crate::image::IMAGE, image.display());
    let integration = crate::lanes::run(ws, &[("WEIR_IMAGE_ARCHIVE", spec.as_str())]);
    let leftovers = leftovers();
    unit?;
    integration?;
    if !leftovers.is_empty() {
        bail!("the test suite left resources behind (now removed): {leftovers:?}");
    }
    Ok(())
}

fn mount_bpffs() -> Result<()> {
    let mounted = util::output("stat", &["-f", "-c", "%T", "/sys/fs/bpf"])
        .is_some_and(|t| t.trim() == "bpf_fs");
    if !mounted {
        util::run(
            Path::new("."),
            "mount",
            &["-t", "bpf", "bpf", "/sys/fs/bpf"],
        )?;
    }
    Ok(())
}

/// Finds (and removes) namespaces, links and pin roots named `wt…`.
fn leftovers() -> Vec<String> {
    let mut found = Vec::new();
    for line in util::output("ip", &["netns", "list"])
        .unwrap_or_default()
        .lines()
    {
        if let Some(name) = line
            .split_whitespace()
            .next()
            .filter(|n| n.starts_with("wt"))
        {
            found.push(format!("netns {name}"));
            let _ = util::output("ip", &["netns", "delete", name]);
        }
    }
    for line in util::output("ip", &["-o", "link", "show"])
        .unwrap_or_default()
        .lines()
    {
        if let Some(name) = line
            .split(": ")
            .nth(1)
            .map(|n| n.split('@').next().unwrap_or(n))
            .filter(|n| n.starts_with("wt"))
        {
            found.push(format!("link {name}"));
            let _ = util::output("ip", &["link", "delete", name]);
        }
    }
    if let Ok(entries) = std::fs::read_dir("/sys/fs/bpf") {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("wt") {
                found.push(format!("pin {name}"));
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    found
}
