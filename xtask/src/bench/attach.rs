//! `cargo xtask bench attach [--smoke]`: runs the `attach-bench` example of the `tests` crate
//! (tcx links vs clsact + `cls_bpf` filters: attach, replace and veth deletion at 1 and 200
//! veths, in one run), which prints a table and writes `target/weir-bench/attach.json`. Release
//! build; `--smoke` uses the dev build and 1 and 3 veths.

use std::path::Path;

use anyhow::{Context as _, Result};

use super::judge::{Cmp, Target, Threshold};

/// The targets (BENCHMARKS.md, Attachment): why `filter` is the default attach mechanism. The
/// figures are those of the larger size (`_max_`, 200 veths; 3 with `--smoke`).
pub(crate) const TARGETS: &[Target] = &[Target::new(
    "filter_attach_max_total_ms",
    Cmp::Le,
    Threshold::Figure {
        key: "tcx_attach_max_total_ms",
        factor: 1.0,
    },
    "filters are the default because attaching a batch of veths is cheaper than with tcx links",
    "BENCHMARKS.md: Attachment",
)];

pub(crate) fn run(workspace: &Path, smoke: bool) -> Result<()> {
    let out = workspace.join("target/weir-bench");
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let json = out.join("attach.json");
    let json_arg = json.display().to_string();
    let mut args: Vec<&str> = vec!["run", "-q", "-p", "tests", "--example", "attach-bench"];
    if !smoke {
        args.push("--release");
    }
    args.extend(["--", "--out", &json_arg]);
    if smoke {
        args.push("--smoke");
    }
    let status = std::process::Command::new("cargo")
        .args(&args)
        .current_dir(workspace)
        .status()
        .context("cannot run cargo")?;
    anyhow::ensure!(status.success(), "the attach benchmark failed ({status})");
    let text = std::fs::read_to_string(&json)
        .with_context(|| format!("cannot read {}", json.display()))?;
    let mut figures: serde_json::Value =
        serde_json::from_str(&text).context("malformed attach.json")?;
    alias_largest(&mut figures);
    std::fs::write(&json, serde_json::to_string_pretty(&figures)?)
        .with_context(|| format!("cannot write {}", json.display()))?;
    println!("wrote {}", json.display());
    Ok(())
}

/// Copies the figures of the largest veth count (`tcx_attach_200_total_ms`) under size-free names
/// (`tcx_attach_max_total_ms`, with `veths_max`), so a smoke run (3 veths) and a full run (200)
/// carry the figures the targets name.
fn alias_largest(figures: &mut serde_json::Value) {
    let Some(map) = figures.as_object_mut() else {
        return;
    };
    let size = |key: &str| key.split('_').nth(2).and_then(|n| n.parse::<u64>().ok());
    let Some(max) = map.keys().filter_map(|k| size(k)).max() else {
        return;
    };
    let aliases: Vec<(String, serde_json::Value)> = map
        .iter()
        .filter(|(k, _)| size(k) == Some(max))
        .map(|(k, v)| {
            let mut parts: Vec<&str> = k.split('_').collect();
            parts[2] = "max";
            (parts.join("_"), v.clone())
        })
        .collect();
    map.extend(aliases);
    map.insert("veths_max".into(), max.into());
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_largest_size_gets_size_free_names() {
        let mut figures = serde_json::json!({
            "tcx_attach_1_p50_ms": 1.0, "tcx_attach_3_total_ms": 9.0, "filter_attach_3_total_ms": 2.0,
        });
        super::alias_largest(&mut figures);
        assert_eq!(figures["tcx_attach_max_total_ms"], 9.0);
        assert_eq!(figures["filter_attach_max_total_ms"], 2.0);
        assert_eq!(figures["veths_max"], 3);
        assert!(figures.get("tcx_attach_max_p50_ms").is_none());
    }
}
